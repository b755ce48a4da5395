"""Every ```python block of the docs runs, in order, on small generated data.

Each Markdown file's blocks run one after the other in one fresh Python process (one namespace
per file, so a later block uses what an earlier one defined), with the working directory a
copy of what the docs refer to (`DOC_FILES`):

    imgs/         class folders cat/, dog/, eel/ of mixed-size PNG and JPEG images (some gray)
    labels.txt    a PaddleOCR list of imgs/ (``cat/img_000.png<TAB>word 0``; paths under imgs/)
    out.lmdb      ``packer build imgs out.lmdb``
    out.rec       ``packer build imgs out.rec --format recordio``
    ocr.lmdb      ``packer build imgs ocr.lmdb --labels labels.txt`` (text labels)

A block whose first line is a mark changes how it runs:

    # doc: skip-run REASON   compiled (its syntax is checked) but not run
    # doc: needs s3          run with the AWS variables pointing at a local moto S3 server,
                             with out.lmdb and out.rec published as s3://bucket/out.lmdb and
                             s3://bucket/out.rec (skipped without moto/s3fs)
    # doc: needs ray         skipped when ray is not installed

Keep marks to the few blocks that need them. Tracebacks name the Markdown file and line.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import pytest

from tests.conftest import build_packed, write_tree

try:  # the moto S3 server of tests/s3, for blocks marked "needs s3" (a fixture of this module)
    from tests.s3.conftest import s3_endpoint  # noqa: F401
except (ImportError, pytest.skip.Exception):
    HAVE_S3 = False
else:
    HAVE_S3 = True

ROOT = Path(__file__).resolve().parents[1]
DOC_GLOBS = ("README.md", "docs/**/*.md")
EXCLUDE: set[str] = set()  # Markdown files whose blocks are not run (none)
MARK = re.compile(r"#\s*doc:\s*(skip-run|needs\s+s3|needs\s+ray)\b\s*(.*)")
TIMEOUT_S = 120
"""A file's blocks run in seconds; a block that hangs (a DataLoader worker's error) fails."""
DOC_FILES = ("imgs", "labels.txt", "out.lmdb", "out.rec", "ocr.lmdb")

RUNNER = """\
import json, sys
blocks = json.load(open(sys.argv[1]))
# compile every block first: a syntax error fails the file even in a block that does not run
codes = [compile("\\n" * (b["line"] - 1) + b["source"], b["file"], "exec") for b in blocks]
namespace = {"__name__": "__main__"}
for block, code in zip(blocks, codes):
    if block["mark"] != "skip-run":
        print(f"--- {block['file']}:{block['line']}", flush=True)
        exec(code, namespace)
"""


@dataclass(frozen=True)
class Block:
    """One ```python block: its file, the line of its first source line, source, mark."""

    file: str
    line: int
    source: str
    mark: str  # "", "skip-run", "needs s3", "needs ray"


def doc_files() -> list[Path]:
    """The Markdown files of `DOC_GLOBS`, less `EXCLUDE`."""
    found = {p for pattern in DOC_GLOBS for p in ROOT.glob(pattern) if p.is_file()}
    return sorted(p for p in found if p.relative_to(ROOT).as_posix() not in EXCLUDE)


def python_blocks(path: Path) -> list[Block]:
    """The ```python blocks of `path`, in order."""
    blocks: list[Block] = []
    lines = path.read_text(encoding="utf-8").splitlines()
    start: int | None = None
    for number, line in enumerate(lines, start=1):
        stripped = line.strip()
        if start is None and stripped in ("```python", "```py"):
            start = number + 1
        elif start is not None and stripped == "```":
            source = "\n".join(lines[start - 1 : number - 1]) + "\n"
            first = source.lstrip().splitlines()[0] if source.strip() else ""
            found = MARK.match(first)
            mark = " ".join(found.group(1).split()) if found else ""
            blocks.append(Block(str(path), start, source, mark))
            start = None
    if start is not None:
        raise AssertionError(f"{path}:{start - 1}: a ```python block is never closed")
    return blocks


@pytest.fixture(scope="module")
def doc_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The files the docs refer to (see the module docstring), built once."""
    root = tmp_path_factory.mktemp("docdata")
    files = write_tree(root / "imgs", {"cat": 6, "dog": 6, "eel": 4})
    names = sorted(files)
    (root / "labels.txt").write_text(
        "".join(f"{name}\tword {n}\n" for n, name in enumerate(names)), encoding="utf-8"
    )
    build_packed(root / "imgs", root / "out.lmdb", "lmdb")
    build_packed(root / "imgs", root / "out.rec", "recordio")
    build_packed(root / "imgs", root / "ocr.lmdb", "lmdb", labels=str(root / "labels.txt"))
    return root


def publish_to_s3(request: pytest.FixtureRequest, data: Path) -> None:
    """Start the moto server (tests/s3) and publish out.lmdb and out.rec in s3://bucket."""
    if not HAVE_S3:
        pytest.skip("moto[server] and s3fs are needed for blocks marked 'needs s3'")
    import s3fs

    endpoint = request.getfixturevalue("s3_endpoint")
    fs = s3fs.S3FileSystem(client_kwargs={"endpoint_url": endpoint}, skip_instance_cache=True)
    if not fs.exists("bucket"):
        fs.mkdir("bucket")
    for name, fmt in (("out.lmdb", "lmdb"), ("out.rec", "recordio")):
        subprocess.run(
            [sys.executable, "-m", "packer.cli", "build", str(data / "imgs"),
             f"s3://bucket/{name}", "--format", fmt, "--overwrite"],
            check=True, capture_output=True, env={**os.environ, "PYTHONPATH": str(ROOT)},
        )  # fmt: skip


@pytest.mark.parametrize(
    "doc",
    [d for d in doc_files() if python_blocks(d)],
    ids=lambda p: p.relative_to(ROOT).as_posix(),
)
def test_python_blocks_run(
    doc: Path, doc_data: Path, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    blocks = python_blocks(doc)
    marks = {b.mark for b in blocks}
    if "needs ray" in marks:
        pytest.importorskip("ray")
    if "needs s3" in marks:
        publish_to_s3(request, doc_data)
    work = tmp_path / "work"
    work.mkdir()
    for name in DOC_FILES:
        source = doc_data / name
        if source.is_dir():
            shutil.copytree(source, work / name)
        else:
            shutil.copy2(source, work / name)
    (work / "blocks.json").write_text(json.dumps([asdict(b) for b in blocks]))
    (work / "run_blocks.py").write_text(RUNNER)
    try:
        result = subprocess.run(
            [sys.executable, "run_blocks.py", "blocks.json"],
            cwd=work,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
        )
    except subprocess.TimeoutExpired as exc:  # paddle's DataLoader hangs on a worker's error
        started = (exc.stdout or b"").decode() if isinstance(exc.stdout, bytes) else exc.stdout
        pytest.fail(f"{doc}: still running after {TIMEOUT_S} s; blocks started:\n{started}")
    assert result.returncode == 0, (
        f"{doc}: a block failed\n{result.stdout[-3000:]}\n" + (result.stderr[-6000:])
    )


def test_blocks_and_marks_are_found(tmp_path: Path) -> None:
    doc = tmp_path / "guide.md"
    doc.write_text(
        "text\n```python\nx = 1\n```\n```bash\nls\n```\n"
        "```python\n# doc: skip-run needs a GPU\nimport nothing_here\n```\n"
        "```python\n# doc: needs  s3\ny = 2\n```\n"
    )
    blocks = python_blocks(doc)
    assert [(b.line, b.mark) for b in blocks] == [(3, ""), (9, "skip-run"), (13, "needs s3")]
    assert blocks[0].source == "x = 1\n"
    doc.write_text("```python\nx = 1\n")
    with pytest.raises(AssertionError, match=r"guide\.md:1: a ```python block is never closed"):
        python_blocks(doc)


def test_the_runner_skips_marked_blocks_and_names_the_failing_line(tmp_path: Path) -> None:
    doc = tmp_path / "guide.md"
    doc.write_text(
        "```python\nx = 41\n```\n```python\n# doc: skip-run demo\nimport nothing_here\n```\n"
        "```python\nx += 1\nassert x == 41, 'x is ' + str(x)\n```\n"
    )
    (tmp_path / "blocks.json").write_text(json.dumps([asdict(b) for b in python_blocks(doc)]))
    (tmp_path / "run.py").write_text(RUNNER)
    result = subprocess.run(
        [sys.executable, "run.py", "blocks.json"], cwd=tmp_path, capture_output=True, text=True
    )
    assert result.returncode == 1
    assert f'File "{doc}", line 10' in result.stderr
    assert "AssertionError: x is 42" in result.stderr
    assert "nothing_here" not in result.stderr
