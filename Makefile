# Every target that runs code depends on .venv, which is (re)built when pyproject.toml changes.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DEMO := demo-data

.PHONY: venv install demo test test-all lint bench clean

venv: $(STAMP)
install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[cpu,dev,ray,s3]'
	touch $(STAMP)

demo: $(STAMP)
	test -d $(DEMO)/images || $(BIN)/python scripts/make_demo_data.py $(DEMO)/images
	$(BIN)/packer build $(DEMO)/images $(DEMO)/sample.lmdb --overwrite
	$(BIN)/packer verify --deep $(DEMO)/sample.lmdb
	$(BIN)/packer info $(DEMO)/sample.lmdb
	$(BIN)/python scripts/demo_read.py $(DEMO)/sample.lmdb $(DEMO)/images

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
		$(BIN)/python "$$script" --out bench-results || exit 1; \
	done

clean:
	rm -rf $(DEMO) bench-results build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache
