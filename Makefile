# Every target that runs code depends on .venv, which is (re)built when pyproject.toml changes.
# `make install` / `make test`: everything the tests need ('.[cpu,dev,ray,s3]'); `make demo`: only
# what the demo runs (the cpu extra, its own stamp); a venv with the full install has it already.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DEMO_STAMP := $(VENV)/.installed-demo
DEMO := demo-data
# `make dist DIST_FLAGS=--no-build-isolation`: build with the venv's setuptools, offline
DIST_FLAGS ?=

.PHONY: venv install demo test test-all lint bench dist clean

venv: $(STAMP)
install: $(STAMP)

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[cpu,dev,ray,s3]'
	touch $(STAMP)

$(DEMO_STAMP): pyproject.toml | $(BIN)/python
	if [ -f $(STAMP) ] && [ ! pyproject.toml -nt $(STAMP) ]; then \
		echo "$(VENV) has the full install (make install): nothing to add for the demo"; \
	else \
		$(BIN)/python -m pip install --quiet -e '.[cpu]'; \
	fi
	touch $(DEMO_STAMP)

demo: $(DEMO_STAMP)
	test -d $(DEMO)/images || $(BIN)/python scripts/make_demo_data.py $(DEMO)/images
	$(BIN)/packer build $(DEMO)/images $(DEMO)/sample.lmdb --overwrite
	$(BIN)/packer verify --deep $(DEMO)/sample.lmdb
	$(BIN)/packer info $(DEMO)/sample.lmdb
	$(BIN)/python scripts/demo_read.py $(DEMO)/sample.lmdb $(DEMO)/images

# A wheel in dist/ (paddle_packer-VERSION-py3-none-any.whl): pip install 'dist/<it>[cpu]'.
# build/ goes first: setuptools would pack what an earlier build left in build/lib.
dist: | $(BIN)/python
	rm -rf build dist/paddle_packer-*.whl
	$(BIN)/python -m pip wheel --quiet --no-deps $(DIST_FLAGS) --wheel-dir dist .
	ls dist/paddle_packer-*.whl

test: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow"

test-all: $(STAMP)
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check packer readers tests scripts
	$(BIN)/ruff format --check packer readers tests scripts
	$(BIN)/mypy

bench: $(STAMP)
	mkdir -p bench-results
	for script in scripts/bench_*.py; do \
		[ -e "$$script" ] || continue; \
		$(BIN)/python "$$script" --out bench-results --docs docs/benchmarks.md || exit 1; \
	done

clean:
	rm -rf $(DEMO) bench-results build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache
