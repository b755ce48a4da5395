"""The benchmarks page is written by the benchmark scripts (scripts/benchdocs.py)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import benchdocs  # noqa: E402


def test_publish_replaces_only_its_own_section(tmp_path: Path) -> None:
    page = tmp_path / "benchmarks.md"
    page.write_text(
        "# Benchmarks\n\nprose before\n\n<!-- bench:bench_a begin -->\nold a\n"
        "<!-- bench:bench_a end -->\n\nprose between\n\n<!-- bench:bench_b begin -->\nold b\n"
        "<!-- bench:bench_b end -->\n\nprose after\n"
    )
    benchdocs.publish(
        page, "bench_a", "| x | y |\n|---|---|\n| 1 | 2 |\n", ["bench_a.py", "--runs", "3"]
    )
    text = page.read_text()
    assert "old a" not in text
    assert "old b" in text
    assert "prose before" in text
    assert "prose between" in text
    assert "prose after" in text
    section = text.split("<!-- bench:bench_a begin -->")[1].split("<!-- bench:bench_a end -->")[0]
    assert "| 1 | 2 |" in section
    stamp = section.strip().splitlines()[0]
    assert re.search(r"Measured \d{4}-\d{2}-\d{2} on \d+ cores", stamp), stamp
    assert "`scripts/bench_a.py --runs 3`" in stamp
    assert " RAM, Linux " in stamp


def test_a_page_without_the_section_is_an_error(tmp_path: Path) -> None:
    page = tmp_path / "benchmarks.md"
    page.write_text("# Benchmarks\n")
    with pytest.raises(SystemExit, match="no section for bench_c"):
        benchdocs.publish(page, "bench_c", "table", ["bench_c.py"])
    assert page.read_text() == "# Benchmarks\n"


def test_every_benchmark_script_has_its_section_on_the_page() -> None:
    page = (ROOT / "docs" / "benchmarks.md").read_text()
    for script in sorted((ROOT / "scripts").glob("bench_*.py")):
        source = script.read_text()
        assert "benchlib.add_output_arguments(parser" in source, script.name
        names = set(re.findall(r'"(bench_\w+)"', source)) & set(
            re.findall(r"<!-- bench:(\w+) begin -->", page)
        )
        assert script.stem in names or f"{script.stem}_coldwarm" in names, script.name
        for name in names:
            begin, end = benchdocs.markers(name)
            assert page.count(begin) == 1, name
            assert page.count(end) == 1, name
