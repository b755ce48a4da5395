"""The ``--cold-vs-warm`` mode of bench_read.py: its rows (each pass cold, then warm), making the
data warm, and its table with the issue-17 target (cold >= 0.9x warm, paired within each run).

Per format, a plain shuffle=False pass and a chunked-sampler pass run twice each: cold (data
evicted) and warm (the data's files read into the page cache just before), each in a fresh
DataLoader with fresh workers, rows alternating. ``--no-fast-disk`` leaves out the machine's own
disk; ``--disk-mibps`` and ``--disk-iops`` set the emulated disk.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

import benchlib
import pagecache

WARM = ", warm"
"""The suffix of an order read with the data in the page cache (``--cold-vs-warm``)."""
COLD_VS_WARM = ("shuffle=False", "chunked sampler")


def paired(cold: dict[str, Any], warm: dict[str, Any]) -> float | None:
    """The median over runs of cold / warm within the same run (the rows alternate)."""
    ratios = [a / b for a, b in zip(cold["all"], warm["all"], strict=False) if b]
    return benchlib.median(ratios) if ratios else None


def make_warm(paths: list[str]) -> float:
    """Read the files whole so that their pages are in the page cache; the fraction cached."""
    size = sum(os.path.getsize(p) for p in paths) or 1
    for path in paths:
        with open(path, "rb", buffering=0) as f:
            while f.read(8 << 20):
                pass
    return min(1.0, pagecache.resident_bytes(paths) / size)  # the last page may overhang


def cold_vs_warm_table(
    storage: str, s: dict[tuple[str, str], dict[str, Any]], note: str
) -> tuple[str, list[str]]:
    """The table of ``--cold-vs-warm`` on `storage`, and its target lines (cold >= 0.9x warm)."""
    lines = [
        f"#### {storage}: cold vs warm, fresh workers",
        "",
        "| dataset | order | cold samples/s | warm samples/s | cold / warm | mean cold request "
        "| cold runs | warm runs |",
        "|---|---|---:|---:|---:|---:|---|---|",
    ]
    met = []
    for (name, order), cold in s.items():
        warm = s.get((name, order + WARM))
        if order.endswith(WARM) or warm is None:
            continue
        vs = paired(cold, warm)
        lines.append(
            f"| {name} | {order} | {cold['rate']:,.0f} | {warm['rate']:,.0f} | "
            f"{benchlib.ratio(vs)} | {cold['request_kb']:.0f} KB | "
            + ", ".join(f"{x:,.0f}" for x in cold["all"])
            + " | "
            + ", ".join(f"{x:,.0f}" for x in warm["all"])
            + " |"
        )
        if vs is not None:
            met.append(
                f"| {storage}: {name} {order}, cold >= 0.9x warm | {vs:.2f}x | "
                f"{'yes' if vs >= 0.9 else 'NO'} |"
            )
    cached = max((r.get("cached", 0.0) for r in s.values()), default=0.0)
    warm_least = min((r["warm"] for r in s.values() if r.get("warm") is not None), default=1.0)
    note += (
        f" Data still cached when a cold row started: at most {cached:.2%} of its bytes; "
        f"cached when a warm row started: at least {warm_least:.2%}."
    )
    return "\n".join([*lines, "", note]), met


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """bench_read.py's options for this mode and the emulated disk."""
    parser.add_argument("--no-fast-disk", action="store_true", help="only the emulated disk")
    parser.add_argument(
        "--disk-mibps", type=int, default=benchlib.SLOW_BPS >> 20, help="emulated disk MiB/s"
    )
    parser.add_argument("--disk-iops", type=int, default=benchlib.SLOW_IOPS, help="and IOPS")
    parser.add_argument(
        "--cold-vs-warm",
        action="store_true",
        help="shuffle=False and chunked passes, cold vs warm, instead of every row",
    )


def rows(packed: dict[str, Any]) -> list[tuple[str, str]]:
    """(format, order) of every row, each order cold and then warm."""
    return [(f, o + w) for f in packed for o in COLD_VS_WARM for w in ("", WARM)]


def text(header: str, res: dict[str, Any], notes: dict[str, str]) -> str:
    """The report: a table per storage, then the targets."""
    tables = [cold_vs_warm_table(s, res[s], notes[s]) for s in res]
    met = ["| target | result | met |", "|---|---:|---|"] + [m for _, t in tables for m in t]
    return "\n\n".join([header, *[t for t, _ in tables], "#### Targets", "\n".join(met)])


def start_row(
    order: str, packed_files: list[str], data_files: list[str]
) -> tuple[str, dict[str, Any]]:
    """Make the data warm (an order ending in `WARM`: the packed files read whole) or cold (every
    data file evicted); the order to time and the row's result so far."""
    if order.endswith(WARM):
        packed = [f for f in packed_files if not f.endswith((".json", ".jsonl"))]
        return order.removesuffix(WARM), {"warm": make_warm(packed), "cached": 0.0}
    return order, {"cached": pagecache.make_cold(data_files)}
