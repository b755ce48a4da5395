"""A format is registered once: only its own modules and the two registries name it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from packer.formats import FORMATS as PACK_FORMATS
from readers.formats import REGISTRY

ROOT = Path(__file__).resolve().parents[1]
NAMES = tuple(REGISTRY)

# the registries, and the public import tables that map LmdbDataset & co. (readers) and every
# PackerError (packer.errors, RecordTooLargeForShardError among them) to their modules
REGISTRIES = {
    "readers/formats/__init__.py",
    "packer/formats.py",
    "readers/__init__.py",
    "packer/errors.py",
}


def _own_folder(fmt: str) -> str:
    """The folder that holds everything that knows the bytes of `fmt`."""
    return f"readers/formats/{fmt}/"


def _own_modules(fmt: str) -> set[str]:
    """The modules outside its folder that may name `fmt`: its writer, its verify checks and
    its paddle dataset."""
    return {
        f"readers/datasets/{fmt}.py",
        f"packer/writers/{fmt}.py",
        f"packer/verify/{fmt}.py",
    }


def _allowed(rel: str) -> bool:
    if rel in REGISTRIES:
        return True
    return any(rel in _own_modules(fmt) or rel.startswith(_own_folder(fmt)) for fmt in NAMES)


def _modules() -> list[Path]:
    return sorted(p for pkg in ("packer", "readers") for p in (ROOT / pkg).rglob("*.py"))


def _mentions(tree: ast.AST) -> list[str]:
    """Places where `tree` names a registered format: a string equal to the name, an import of
    a module called after it (the `lmdb` package, ``readers.formats.lmdb``, ...)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if node.value.strip().lower() in NAMES:
                found.append(f"line {node.lineno}: string {node.value!r}")
        elif isinstance(node, ast.Import | ast.ImportFrom):
            modules = [a.name for a in node.names]
            if isinstance(node, ast.ImportFrom):
                modules = [f"{node.module or ''}.{a.name}" for a in node.names]
            for module in modules:
                if set(module.lower().split(".")) & set(NAMES):
                    found.append(f"line {node.lineno}: import {module}")
    return found


def test_registries_agree_and_every_format_has_each_part() -> None:
    assert list(PACK_FORMATS) == list(REGISTRY)
    assert len(NAMES) >= 2
    for name, fmt in PACK_FORMATS.items():
        for rel in _own_modules(name):
            assert (ROOT / rel).is_file(), rel
        folder = ROOT / _own_folder(name)
        assert (folder / "__init__.py").is_file(), f"{folder} is not a package"
        assert (folder / "README.md").is_file(), f"{folder} has no README.md"
        assert not (ROOT / f"readers/formats/{name}.py").exists(), "a format is one folder"
        assert fmt.writer.__module__ == f"packer.writers.{name}"
        assert fmt.checks().__name__ == f"packer.verify.{name}"
        assert REGISTRY[name].name == name


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_other_module_names_a_format(path: Path) -> None:
    rel = path.relative_to(ROOT).as_posix()
    if _allowed(rel):
        return
    found = _mentions(ast.parse(path.read_text(), filename=rel))
    assert not found, f"{rel} names a format (use the registry's format objects): {found}"


def test_the_check_can_see_a_format_name() -> None:
    bad = ast.parse(
        "import lmdb\nfrom readers.formats import recordio\nif fmt == 'RecordIO':\n    pass\n"
    )
    assert len(_mentions(bad)) == 3
    assert not _mentions(ast.parse("x = 'lmdb-like'\n'''An LMDB docstring.'''\n"))


def test_the_check_knows_whose_modules_may_name_a_format() -> None:
    assert _allowed("readers/formats/lmdb/pages.py")
    assert _allowed("readers/formats/recordio/ids.py")
    assert _allowed("packer/writers/recordio.py")
    assert _allowed("packer/verify/lmdb.py")
    assert not _allowed("readers/formats/lmdb.py")  # a format is its folder, not a module
    assert not _allowed("readers/formats/layout.py")
    assert not _allowed("readers/formats/lmdbx/keys.py")
    assert not _allowed("packer/writers/merge.py")
    assert not _allowed("packer/build.py")
