"""The module graph: readers never imports packer, and no module-level import cycle."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _graph() -> dict[str, set[str]]:
    """Module -> the project modules it imports at module level (not inside functions)."""
    files = {_module_name(p): p for d in ("packer", "readers") for p in (ROOT / d).rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        deps: set[str] = set()
        for node in ast.parse(path.read_text()).body:
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                # `from pkg import sub` needs the submodule; `from pkg import name`, the package
                for alias in node.names:
                    sub = f"{node.module}.{alias.name}"
                    targets.append(sub if sub in files else node.module)
            deps |= {t for t in targets if t in files and t != name}
        graph[name] = deps
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == 1:
                return [*stack[stack.index(dep) :], dep]
            if dep not in state and (found := visit(dep)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_no_module_level_import_cycle() -> None:
    assert _cycle(_graph()) is None, " -> ".join(_cycle(_graph()) or [])


def test_readers_never_imports_packer() -> None:
    graph = _graph()
    bad = {
        m: d
        for m, d in graph.items()
        if m.startswith("readers") and any(x.startswith("packer") for x in d)
    }
    assert not bad


def test_the_engines_and_the_shard_task_do_not_import_the_build() -> None:
    graph = _graph()
    for module in ("packer.task", "packer.engines.local", "packer.engines.ray"):
        assert "packer.build" not in graph[module], module


def test_the_config_and_the_shard_task_import_only_what_they_use() -> None:
    graph = _graph()
    assert not {
        d for d in graph["packer.config"] if d.startswith(("packer.engines", "packer.prepare"))
    }
    assert not {d for d in graph["packer.task"] if d.startswith("packer.labels")}
    assert "packer.encode" not in graph  # renamed after what it does: packer.prepare


@pytest.mark.parametrize(
    ("graph", "cycle"),
    [({"a": {"b"}, "b": {"a"}}, ["a", "b", "a"]), ({"a": {"b"}, "b": set()}, None)],
)
def test_the_cycle_check_finds_a_cycle(graph: dict[str, set[str]], cycle: list[str] | None) -> None:
    assert _cycle(graph) == cycle
