"""The benchmarks page is written by the benchmarks: each script replaces its own section.

docs/benchmarks.md holds one section per script between two markers,
``<!-- bench:NAME begin -->`` and ``<!-- bench:NAME end -->``; the prose around them (what a
figure means, why a target is missed) is written by hand and stays. `publish` replaces what
lies between the markers with the script's tables under one line that says when, where and how
they were measured: the date, this machine (cores, processor, memory, kernel, Python) and the
command as it was run. A page without the markers is an error, so a script never adds tables
where nobody reads them.
"""

from __future__ import annotations

import os
import platform
import shlex
import sys
import time
from pathlib import Path

PAGE = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"


def markers(name: str) -> tuple[str, str]:
    """The begin and end markers of script `name`'s section."""
    return f"<!-- bench:{name} begin -->", f"<!-- bench:{name} end -->"


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _memory_gib() -> str:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return f"{int(line.split()[1]) / 2**20:.0f} GiB"
    except OSError:
        pass
    return "? GiB"


def machine() -> str:
    """This machine in one line: usable cores, processor, memory, kernel, Python."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return (
        f"{cores} cores ({_cpu_model()}), {_memory_gib()} RAM, Linux {platform.release()}, "
        f"Python {platform.python_version()}"
    )


def stamp(argv: list[str]) -> str:
    """The line above a section's tables: date, machine and command."""
    script = Path(argv[0])
    command = shlex.join([f"scripts/{script.name}", *argv[1:]])
    date = time.strftime("%Y-%m-%d", time.gmtime())
    return f"Measured {date} on {machine()}, with `{command}`."


def publish(page: Path, name: str, text: str, argv: list[str] | None = None) -> None:
    """Replace script `name`'s section of `page` with `text` under a `stamp` line."""
    begin, end = markers(name)
    old = page.read_text()
    start, stop = old.find(begin), old.find(end)
    if start < 0 or stop < start:
        raise SystemExit(f"{page}: no section for {name} (add the lines {begin!r} and {end!r})")
    body = f"{begin}\n{stamp(argv or sys.argv)}\n\n{text.strip()}\n{end}"
    new = old[:start] + body + old[stop + len(end) :]
    tmp = page.with_name(f".{page.name}.tmp")
    tmp.write_text(new)
    tmp.replace(page)
