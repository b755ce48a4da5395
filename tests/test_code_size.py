"""Modules stay small enough to read: no module over 600 lines (split where a concept splits,
not at a line count), no class over 300."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAX_MODULE_LINES = 600
MAX_CLASS_LINES = 300

SOURCES = sorted(p for d in ("packer", "readers", "scripts") for p in (ROOT / d).rglob("*.py"))


def _long_classes(tree: ast.AST) -> list[str]:
    return [
        f"{node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef)
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 > MAX_CLASS_LINES
    ]


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_module_and_class_sizes(path: Path) -> None:
    text = path.read_text()
    lines = len(text.splitlines())
    assert lines <= MAX_MODULE_LINES, f"{path.name}: {lines} lines"
    assert not _long_classes(ast.parse(text)), _long_classes(ast.parse(text))


def test_the_class_check_sees_a_long_class() -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_CLASS_LINES))
    assert _long_classes(ast.parse(f"class Big:\n{body}\n")) == [
        f"Big ({MAX_CLASS_LINES + 1} lines)"
    ]
    assert not _long_classes(ast.parse("class Small:\n    pass\n"))
