"""bench_read.py's report: medians per row, ratios paired within each run, the tables and the
issue-10 targets."""

from __future__ import annotations

from typing import Any

import benchlib

BATCH = 64
LOOSE = "loose files"
BOUND = "decode bound"
ORDERS = ("shuffle=False", "shuffle=True", "chunked sampler", "staged")
FAST, SLOW = "cold fast disk", "emulated hard disk"
# --------------------------------------------------------------------------- child: measure


def summary(rows: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    """Medians per (name, order)."""
    med = benchlib.median
    out = {}
    for row in rows:
        runs = row["runs"]
        if runs and isinstance(runs[0], float):
            out[(row["name"], row["order"])] = {"rate": med(runs), "all": runs}
            continue
        rates = [r["samples_per_s"] for r in runs]
        out[(row["name"], row["order"])] = {
            "rate": med(rates),
            "all": rates,
            "request_kb": med([r["bytes"] / max(1, r["requests"]) / 1024 for r in runs]),
            "copy_s": med([r["copy_s"] for r in runs]) if "copy_s" in runs[0] else None,
            "subset": runs[0]["subset"],
            "cached": max(r["cached"] for r in runs),
            "warm": min((r["warm"] for r in runs if "warm" in r), default=None),
        }
        if "bound" in runs[0]:
            out[(row["name"], row["order"])]["bound_all"] = [r["bound"] for r in runs]
    return out


def paired(r: dict[str, Any] | None, base: dict[str, Any] | None, limit: float = 0) -> float | None:
    """The median over runs of ``r``'s rate / ``base``'s rate in the same run (rows alternate
    within a run, so a slow moment of the shared machine hits both), `base` capped at `limit`."""
    if not r or not base:
        return None
    cap = limit or float("inf")
    return benchlib.median([a / min(b, cap) for a, b in zip(r["all"], base["all"], strict=False)])


def storage_table(storage: str, s: dict[tuple[str, str], dict[str, Any]], note: str) -> str:
    lines = [
        f"#### {storage}",
        "",
        "| dataset | order | samples/s | vs loose files (same order) | mean request | runs |",
        "|---|---|---:|---:|---:|---|",
    ]
    for (name, order), r in s.items():
        base = s.get((LOOSE, "shuffle=False" if order == "shuffle=False" else "shuffle=True"))
        vs = paired(r, base) if name not in (LOOSE, BOUND) else None
        what = order
        if r.get("subset"):
            what += f" ({r['subset'] * BATCH:,} random samples)"
        if r.get("copy_s") is not None:
            what += f", shuffle=True (copy {r['copy_s']:.1f} s)"
        req = f"{r['request_kb']:.0f} KB" if "request_kb" in r else ""
        runs = ", ".join(f"{x:,.0f}" for x in r["all"])
        lines.append(
            f"| {name} | {what} | {r['rate']:,.0f} | {benchlib.ratio(vs)} | {req} | {runs} |"
        )
    cached = max((r.get("cached", 0.0) for r in s.values()), default=0.0)
    note += f" Data still cached when a row started: at most {cached:.2%} of its bytes."
    return "\n".join([*lines, "", note])


def targets(res: dict[str, dict[tuple[str, str], dict[str, Any]]], spec: dict[str, Any]) -> str:
    lines = ["| target | result | met |", "|---|---:|---|"]

    def check(what: str, value: float | None, need: float, pct: bool = False) -> None:
        if value is not None:
            shown = f"{value:.1%}" if pct else f"{value:.1f}x"
            lines.append(f"| {what} | {shown} | {'yes' if value >= need else 'NO'} |")

    def row(storage: str, name: str, order: str) -> dict[str, Any] | None:
        return res.get(storage, {}).get((name, order))

    for fmt, record in spec["record_bytes"].items():
        for storage, need in ((SLOW, 10.0), (FAST, 1.6)):  # paddle's default: shuffle=False
            value = paired(row(storage, fmt, "shuffle=False"), row(storage, LOOSE, "shuffle=False"))
            check(f"{storage}: {fmt} plain DataLoader >= {need:g}x loose files", value, need)
        chunked = row(SLOW, fmt, "chunked sampler")
        value = paired(chunked, row(SLOW, LOOSE, "shuffle=True"))
        check(f"{SLOW}: {fmt} chunked sampler >= 20x loose files (shuffled)", value, 20)
        bps = spec.get("disk_bps", benchlib.SLOW_BPS)
        disk = bps / record
        if chunked and chunked.get("bound_all"):
            bound = {"all": chunked["bound_all"]}  # timed just after each chunked row
            check(
                f"{SLOW}: {fmt} chunked >= 0.8 x min(decode bound, paired per run: median "
                f"{benchlib.median(bound['all']):,.0f}/s, {bps >> 20} MiB/s / "
                f"{record / 1e3:.1f} kB = {disk:,.0f}/s)",
                paired(chunked, bound, disk),
                0.8,
                pct=True,
            )
        for order in ("shuffle=False", "chunked sampler"):
            r = row(SLOW, fmt, order)
            if r is not None:
                kb = r["request_kb"]
                lines.append(
                    f"| {SLOW}: {fmt} {order} mean cold request >= 400 KB | {kb:.0f} KB | "
                    f"{'yes' if kb >= 400 else 'NO'} |"
                )
    return "\n".join(lines)
