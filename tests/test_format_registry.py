"""A format is registered once: only its own modules and the two registries name it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from packer.formats import FORMATS as PACK_FORMATS
from readers.formats import REGISTRY

ROOT = Path(__file__).resolve().parents[1]
NAMES = tuple(REGISTRY)

# the registries, and the public import table that maps LmdbDataset & co. to their modules
REGISTRIES = {"readers/formats/__init__.py", "packer/formats.py", "readers/__init__.py"}


def _own_modules(fmt: str) -> set[str]:
    return {
        f"readers/formats/{fmt}.py",
        f"readers/datasets/{fmt}.py",
        f"packer/writers/{fmt}.py",
        f"packer/verify/{fmt}.py",
    }


def _allowed(rel: str) -> bool:
    if rel in REGISTRIES:
        return True
    return any(
        rel in _own_modules(fmt) or rel.startswith(f"readers/formats/{fmt}/") for fmt in NAMES
    )


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
            assert (ROOT / rel).is_file() or (ROOT / rel.removesuffix(".py")).is_dir(), rel
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
