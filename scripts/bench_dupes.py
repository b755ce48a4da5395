"""Benchmark of ``packer dupes``: the exact pass at 10^6 index rows, and near-copy recall.

Exact pass: a synthetic 1,000,000-row index (the crc32 and nbytes columns as `load_index`
gives them) with 10,000 planted groups of 2-3 identical records and 1,000 planted decoys
(rows with the same size and CRC-32 as another but other bytes). Timed: the candidate search
(`exact_candidates`: one sort of a 64-bit key) and the confirmation (`confirm_candidates`:
BLAKE2b of each candidate's bytes, served from memory here, so the time is the hashing and
the bookkeeping, not a disk). Checked: every planted group is found, no decoy is grouped.
Also timed: `load_index` of a 10^6-row index.parquet with the columns dupes loads, and the
near pass's grouping of 10^6 hashes (the decoding, per image, is in the near table).

Near copies: real photos-like images are the oxygen icons (256x256 PNG, Debian's
oxygen-icon-theme) on white, else smooth synthetic images. Each original gets planted copies
(half size; 0.7 size re-encoded as JPEG q75; JPEG q90 at full size; a quarter size); recall is
the share of (original, copy) pairs put in one group, false groups are groups among the
distinct originals alone. Measured for dHash and pHash at thresholds 0..3.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import cv2
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

import benchlib

from packer.dupes import confirm_candidates, exact_candidates
from packer.nearhash import HASHES, MAX_THRESHOLD, MIN_SIDE, flatten, group_near

ICONS = Path("/usr/share/icons/oxygen/base/256x256")


def synthetic_index(n: int, groups: int, decoys: int) -> tuple[np.ndarray, np.ndarray, dict]:
    """crc32, nbytes and the planted structure: {row: content id} for the rows that share."""
    rng = np.random.default_rng(0)
    crc = rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32)
    nbytes = rng.integers(2000, 60000, n).astype(np.uint32)
    rows = rng.permutation(n)
    content: dict[int, int] = {}
    at = 0
    for g in range(groups):
        size = 2 + g % 2
        members = rows[at : at + size]
        at += size
        crc[members], nbytes[members] = crc[members[0]], nbytes[members[0]]
        for r in members.tolist():
            content[r] = g
    for d in range(decoys):  # same key as a random row, other bytes
        a, b = rows[at], rows[at + 1]
        at += 2
        crc[b], nbytes[b] = crc[a], nbytes[a]
        content[int(a)], content[int(b)] = groups + 2 * d, groups + 2 * d + 1
    return crc, nbytes, content


def bench_exact(n: int, groups: int, decoys: int) -> list[str]:
    crc, nbytes, content = synthetic_index(n, groups, decoys)
    blobs: dict[int, bytes] = {}
    rng = np.random.default_rng(1)

    def read(row: int) -> bytes:
        c = content[row]
        if c not in blobs:
            blobs[c] = rng.bytes(int(nbytes[row]))
        return blobs[c]

    for r in content:  # make the bytes before the clock starts: reading is not what is timed
        read(r)
    t = time.perf_counter()
    runs = exact_candidates(crc, nbytes)
    t_candidates = time.perf_counter() - t
    t = time.perf_counter()
    found = confirm_candidates(runs, read)
    t_confirm = time.perf_counter() - t
    assert len(found) == groups, (len(found), groups)
    assert all(len({content[int(r)] for r in g}) == 1 for g, _ in found)
    hashed = sum(len(r) for r in runs)
    mb = sum(int(nbytes[r]) for run in runs for r in run.tolist()) / 1e6
    return [
        f"| candidate search ({n:,} rows) | {t_candidates:.2f} s | {len(runs):,} runs |",
        f"| confirm: BLAKE2b of {hashed:,} candidates ({mb:.0f} MB) | {t_confirm:.2f} s | "
        f"{len(found):,} groups, {decoys:,} decoys rejected |",
    ]


def bench_load(n: int) -> str:
    from bench_index import write_synthetic

    from readers.index import load_index

    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_TMP")) as tmp:
        root = Path(tmp) / "synthetic.lmdb"
        write_synthetic(root, n)
        t = time.perf_counter()
        index = load_index(root, extra=("path", "width", "height", "format"))
        took = time.perf_counter() - t
        assert len(index) == n
    return f"| load_index with path, width, height, format ({n:,} rows) | {took:.2f} s | |"


def bench_group_near(n: int) -> str:
    """`group_near` on `n` random hashes with 1,000 planted pairs 2 bits apart."""
    rng = np.random.default_rng(0)
    hashes = rng.integers(0, 2**63, n, dtype=np.uint64) * np.uint64(2)
    hashes[:1000] = hashes[1000:2000] ^ np.uint64(0b101)
    t = time.perf_counter()
    groups = group_near(hashes, 2)
    took = time.perf_counter() - t
    what = f"near grouping (group_near, {n:,} hashes, threshold 2)"
    return f"| {what} | {took:.2f} s | {len(groups):,} groups |"


def originals(limit: int) -> tuple[list[np.ndarray], str]:
    # the theme holds one picture under several names (links): each picture once
    icons = sorted({p.resolve() for p in ICONS.rglob("*.png")}) if ICONS.is_dir() else []
    images = []
    for path in icons[:limit]:
        image = cv2.imread(str(path), cv2.IMREAD_UNCHANGED)
        if image is None or image.ndim != 3 or image.shape[2] != 4:
            continue
        alpha = image[:, :, 3:4].astype(np.float32) / 255
        images.append((image[:, :, :3] * alpha + 255 * (1 - alpha)).astype(np.uint8))
    if images:
        return images, f"{len(images)} oxygen icons 256x256 on white"
    return smooth(limit), f"{limit} smooth synthetic images 256x256"


def smooth(n: int) -> list[np.ndarray]:
    """`n` distinct images: random 6x6 colours blown up to 256x256 (bicubic)."""
    rng = np.random.default_rng(0)
    images = []
    for _ in range(n):
        low = rng.integers(0, 256, (6, 6, 3), dtype=np.uint8)
        images.append(cv2.resize(low, (256, 256), interpolation=cv2.INTER_CUBIC))
    return images


def _jpeg(image: np.ndarray, quality: int) -> np.ndarray:
    ok, buf = cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, quality])
    assert ok
    return cv2.imdecode(buf, cv2.IMREAD_COLOR)


COPIES = {
    "half size": lambda im: cv2.resize(im, None, fx=0.5, fy=0.5, interpolation=cv2.INTER_AREA),
    "0.7 size, JPEG q75": lambda im: _jpeg(
        cv2.resize(im, None, fx=0.7, fy=0.7, interpolation=cv2.INTER_AREA), 75
    ),
    "JPEG q90": lambda im: _jpeg(im, 90),
    "quarter size": lambda im: cv2.resize(im, None, fx=0.25, fy=0.25, interpolation=cv2.INTER_AREA),
}


def bench_near(limit: int) -> list[str]:
    images, what = originals(limit)
    n = len(images)
    gray = [cv2.cvtColor(im, cv2.COLOR_BGR2GRAY) for im in images]
    copies = {
        name: [cv2.cvtColor(f(im), cv2.COLOR_BGR2GRAY) for im in images]
        for name, f in COPIES.items()
    }
    lines = [
        f"Near copies: {what}; {len(COPIES)} planted copies of each ({', '.join(COPIES)}).",
        "",
        "| hash | threshold | recall (pairs found) | "
        + " | ".join(f"recall: {c}" for c in COPIES)
        + " | groups among the originals | groups among 2,000 distinct smooth images"
        + " | hash time per image |",
        "|---|---|---|" + "---|" * len(COPIES) + "---|---|---|",
    ]
    for name, fn in HASHES.items():
        t = time.perf_counter()
        base = np.array([fn(g) for g in gray], dtype=np.uint64)
        per_image = (time.perf_counter() - t) / n
        distinct = np.array(
            [fn(cv2.cvtColor(im, cv2.COLOR_BGR2GRAY)) for im in smooth(2000)], dtype=np.uint64
        )
        planted = {c: np.array([fn(g) for g in ims], dtype=np.uint64) for c, ims in copies.items()}
        for threshold in range(MAX_THRESHOLD + 1):
            hashes = np.concatenate([base, *planted.values()])
            group_of = np.full(len(hashes), -1)
            for k, g in enumerate(group_near(hashes, threshold)):
                group_of[g] = k
            per_copy = []
            for c in range(len(COPIES)):
                rows = np.arange(n) + n * (c + 1)
                per_copy.append(
                    float(np.mean((group_of[:n] >= 0) & (group_of[:n] == group_of[rows])))
                )
            false = len(group_near(base, threshold))
            lines.append(
                f"| {name} | {threshold} | {np.mean(per_copy):.1%} | "
                + " | ".join(f"{r:.1%}" for r in per_copy)
                + f" | {false} | {len(group_near(distinct, threshold))}"
                + f" | {per_image * 1e6:.0f} us |"
            )
    return lines


# ----------------------------------------------------------------- planted copies in a real theme

THEMES = {
    "oxygen": Path("/usr/share/icons/oxygen/base"),  # apt-get install oxygen-icon-theme
    "mate": Path("/usr/share/backgrounds/mate"),  # apt-get install mate-backgrounds
}
IMAGE_EXT = (".png", ".jpg", ".jpeg")


# Icons the theme draws as one picture under two names, although their pixels differ by more
# than 8 levels somewhere (re-rendered, shifted by a pixel). Each pair was judged by eye on a
# contact sheet of both at every size they share, with their difference magnified; look-alikes
# that differ by a detail (a caption, an emblem, binder holes, a faint mark, a flag's pole:
# flag-blue and services) are not listed and stay two pictures.
SAME_PICTURE = {
    "oxygen": [
        ("preferences-desktop-color", "color-management"),  # the paint pot before the dots
        ("applications-toys", "applications-education-preschool"),  # the beach ball
        ("applications-education", "applications-education-school"),  # the slate "2+2=4"
        ("applications-science", "applications-education-science"),  # the flask
        ("format-line-spacing-double", "format-line-spacing-triple"),  # 5 pixels differ
        ("document-sign", "application-pgp-signature"),  # the pen, one pixel to the side
    ],
}


def picture_key(theme: str, rel: str) -> str:
    """The rule for 'the same picture' inside a theme, before links and planted copies.

    oxygen: the icon's file name, whatever its size folder and category
    (``48x48/apps/kate.png`` and ``256x256/apps/kate.png`` are one icon drawn at two sizes;
    ``32x32/apps/x.png`` and ``32x32/categories/x.png`` one icon filed twice). mate: the file
    name minus a ``_WxH`` size suffix (``Elephants_3840x2160.jpg`` is ``Elephants.jpg`` at
    another size).
    """
    path = Path(rel)
    if theme == "oxygen":
        return path.stem
    return str(path.parent / re.sub(r"_\d+x\d+$", "", path.stem))


def _copy_image(original: Path, kind: str, rng: random.Random) -> tuple[bytes, str]:
    """A planted copy of `original`: its bytes and a name tail (kind, parameters, extension).

    kinds: ``jpeg`` (re-encoded as JPEG q70-90 at full size: PNG -> JPEG for a PNG),
    ``resized`` (50-90 %, same format; a PNG keeps its alpha), ``resized-swap`` (50-90 % and
    the other format: PNG -> JPEG q70-90, JPEG -> PNG). A JPEG copy of a PNG with alpha is the
    PNG flattened over black (what ``packer dupes --near`` compares).
    """
    is_png = original.suffix.lower() == ".png"
    image = cv2.imread(str(original), cv2.IMREAD_UNCHANGED if is_png else cv2.IMREAD_COLOR)
    assert image is not None, original
    tail = kind
    if kind != "jpeg":
        scale = rng.uniform(0.5, 0.9)
        h, w = image.shape[:2]
        size = (max(1, round(w * scale)), max(1, round(h * scale)))
        image = cv2.resize(image, size, interpolation=cv2.INTER_AREA)
        tail += f"-{scale:.2f}"
    to_png = is_png if kind != "resized-swap" else not is_png
    if kind == "jpeg":
        to_png = False
    if to_png:
        ok, buf = cv2.imencode(".png", image)
        return buf.tobytes(), f"{tail}.png"
    if image.dtype != np.uint8:
        image = (image >> 8).astype(np.uint8)
    if image.ndim == 3 and image.shape[2] == 4:  # flattened over black, as dupes compares
        image = (image[:, :, :3] * (image[:, :, 3:] / 255)).round().astype(np.uint8)
    quality = rng.randint(70, 90)
    ok, buf = cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, quality])
    assert ok
    return buf.tobytes(), f"{tail}-q{quality}.jpg"


def plant(theme: str, src: Path, sample: int, seed: int) -> tuple[dict[str, str], dict[str, str]]:
    """Copy the theme to `src` and plant 3 copies of `sample` random pictures under planted/.

    Returns {copy: original} and {link: target} (the theme's symlinks, same bytes), as paths
    relative to `src`.
    """
    root = THEMES[theme]
    shutil.copytree(root, src, symlinks=True)
    links, files = {}, []
    for path in sorted(src.rglob("*")):
        if path.suffix.lower() not in IMAGE_EXT:
            continue
        rel = path.relative_to(src).as_posix()
        if path.is_symlink():
            links[rel] = path.resolve().relative_to(src.resolve()).as_posix()
        elif path.is_file():
            files.append(rel)
    # originals >= 64 px, so that copies at 50 % keep the 32 px the near pass compares
    files = [f for f in files if min(_size(src / f)) >= 2 * MIN_SIDE]
    rng = random.Random(seed)
    planted: dict[str, str] = {}
    (src / "planted").mkdir()
    for k, rel in enumerate(rng.sample(files, min(sample, len(files) // 2))):
        for kind in ("jpeg", "resized", "resized-swap"):
            data, tail = _copy_image(src / rel, kind, rng)
            name = f"planted/{k:04d}-{Path(rel).stem}-{tail}"
            (src / name).write_bytes(data)
            planted[name] = rel
    return planted, links


def _size(path: Path) -> tuple[int, int]:
    image = cv2.imread(str(path), cv2.IMREAD_UNCHANGED)
    return (0, 0) if image is None else (image.shape[1], image.shape[0])


_FLAT: dict[Path, np.ndarray | None] = {}


def _flat(path: Path) -> np.ndarray | None:
    if path not in _FLAT:  # read once: a group of n members makes n * n / 2 pairs
        image = cv2.imread(str(path), cv2.IMREAD_UNCHANGED)
        _FLAT[path] = None if image is None else flatten(image).astype(np.int16)
    return _FLAT[path]


def _same_pixels(a: Path, b: Path) -> bool:
    """Two theme files of one size whose pixels (over black) differ by <= 8 levels anywhere."""
    x, y = _flat(a), _flat(b)
    if x is None or y is None or x.shape != y.shape:
        return False
    return int(np.abs(x - y).max()) <= 8


class _Classes:
    """Union-find over paths: which paths show the same picture."""

    def __init__(self) -> None:
        self.parent: dict[str, str] = {}

    def find(self, x: str) -> str:
        self.parent.setdefault(x, x)
        while self.parent[x] != x:
            self.parent[x] = self.parent[self.parent[x]]
            x = self.parent[x]
        return x

    def union(self, a: str, b: str) -> None:
        self.parent[self.find(a)] = self.find(b)


def _run_packer(*args: str) -> tuple[float, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-c", "from packer.cli import main; main()", *args]
    t = time.perf_counter()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    took = time.perf_counter() - t
    if done.returncode != 0:
        raise SystemExit(f"packer {' '.join(args)}: exit {done.returncode}\n{done.stderr}")
    return took, done.stdout


def score(
    theme: str,
    report: dict,
    planted: dict[str, str],
    links: dict[str, str],
    src: Path | None = None,
) -> dict[str, Any]:
    """Precision and recall of `report` (dupes --json) against the planted copies.

    Same picture: the rule of `picture_key`, a symlink and its target, a planted copy and its
    original, identical bytes (an exact group), two theme files of one size whose pixels
    differ by at most 8 levels (`_same_pixels`: the theme files one picture under two
    names), and the names `SAME_PICTURE` lists (judged by eye). A group is true when all its
    members show one picture; a false pair is two members of a group that do not.
    """
    classes = _Classes()
    paths = {m["path"] for g in report["groups"] for m in g["members"]}
    for rel in paths | set(links) | set(links.values()) | set(planted.values()):
        if not rel.startswith("planted/"):
            classes.union(rel, "key:" + picture_key(theme, rel))
    for a, b in [*links.items(), *planted.items()]:
        classes.union(a, b)
    for a, b in SAME_PICTURE.get(theme, []):
        classes.union("key:" + a, "key:" + b)
    for g in report["groups"]:
        if g["kind"] == "exact":
            for m in g["members"][1:]:
                classes.union(m["path"], g["members"][0]["path"])
    aliases = 0  # one picture under two names in the theme: same size, same pixels
    if src is not None:
        for g in report["groups"]:
            members = [m["path"] for m in g["members"] if not m["path"].startswith("planted/")]
            for i, a in enumerate(members):
                for b in members[i + 1 :]:
                    if classes.find(a) != classes.find(b) and _same_pixels(src / a, src / b):
                        classes.union(a, b)
                        aliases += 1
    near = [g for g in report["groups"] if g["kind"] == "near"]
    false_groups, false_pairs, pairs, found = [], 0, 0, 0
    group_of: dict[str, int] = {}
    for k, g in enumerate(near):
        members = [m["path"] for m in g["members"]]
        for p in members:
            group_of[p] = k
        roots = [classes.find(p) for p in members]
        n = len(roots)
        pairs += n * (n - 1) // 2
        bad = sum(1 for i in range(n) for j in range(i + 1, n) if roots[i] != roots[j])
        false_pairs += bad
        if bad:
            false_groups.append(members)
    for copy, original in planted.items():
        if copy in group_of and group_of[copy] == group_of.get(original):
            found += 1
    with_planted = sum(any(m["path"] in planted for m in g["members"]) for g in near)
    return {
        "near_groups": len(near),
        "with_planted": with_planted,
        "false_groups": false_groups,
        "pairs": pairs,
        "false_pairs": false_pairs,
        "recall": found / max(1, len(planted)),
        "found": found,
        "largest": max((len(g["members"]) for g in near), default=0),
        "aliases": aliases,
    }


def bench_planted(theme: str, sample: int, seed: int) -> list[str]:
    """Plant copies in `theme`, pack it, run ``packer dupes --near --json`` and score it."""
    if not THEMES[theme].is_dir():
        return [f"{theme}: not installed ({THEMES[theme]}); skipped", ""]
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_TMP")) as tmp:
        src, out = Path(tmp) / "src", Path(tmp) / f"{theme}.lmdb"
        planted, links = plant(theme, src, sample, seed)
        t_build, _ = _run_packer("build", str(src), str(out))
        t_exact, _ = _run_packer("dupes", str(out), "--json")
        t_near, text = _run_packer("dupes", str(out), "--near", "--json")
        report = json.loads(text)
        n = report["summary"]
        images = sum(1 for _ in open(out / "index.jsonl"))  # noqa: SIM115
        s = score(theme, report, planted, links, src)
    originals = len(set(planted.values()))
    lines = [
        f"#### {theme}: {images:,} images, {originals} originals with 3 planted copies each "
        f"(seed {seed})",
        "",
        "| measure | value |",
        "|---|---|",
        f"| near groups | {s['near_groups']:,} ({s['with_planted']:,} hold planted copies; "
        f"largest {s['largest']} images) |",
        f"| false groups (two pictures in one group) | {len(s['false_groups'])} |",
        f"| precision (true groups / groups) | "
        f"{1 - len(s['false_groups']) / max(1, s['near_groups']):.1%} |",
        f"| false pairs / pairs in groups | {s['false_pairs']:,} / {s['pairs']:,} |",
        f"| recall (planted copies in their original's group) | {s['recall']:.1%} "
        f"({s['found']:,} of {len(planted):,}) |",
        f"| exact groups | {n['exact_groups']:,} |",
        f"| pairs of theme files that are one picture under two names | {s['aliases']:,} |",
        f"| images under {MIN_SIDE} px (not compared for near copies) | "
        f"{report['near']['too_small']:,} |",
        f"| packer build | {t_build:.1f} s |",
        f"| packer dupes (exact only) | {t_exact:.1f} s |",
        f"| packer dupes --near | {t_near:.1f} s |",
        "",
    ]
    for members in s["false_groups"][:10]:
        lines.append(
            "false group: " + ", ".join(members[:6]) + (" ..." if len(members) > 6 else "")
        )
    missed = [
        c
        for c, o in planted.items()
        if c not in {m["path"] for g in report["groups"] for m in g["members"]}
    ]
    for copy in missed[:20]:
        lines.append(f"missed: {copy} (copy of {planted[copy]})")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--groups", type=int, default=10_000)
    parser.add_argument("--decoys", type=int, default=1_000)
    parser.add_argument("--icons", type=int, default=600)
    parser.add_argument(
        "--planted",
        default="oxygen,mate",
        help="themes to plant copies in and score (comma-separated; 'none' to skip); "
        "with --only-planted, nothing else is measured",
    )
    parser.add_argument("--only-planted", action="store_true")
    parser.add_argument(
        "--sample", type=int, default=400, help="originals per theme (at most half)"
    )
    parser.add_argument("--seed", type=int, default=0)
    benchlib.add_output_arguments(parser, "bench_dupes")
    args = parser.parse_args()
    lines = []
    if not args.only_planted:
        lines += [
            f"### packer dupes: exact pass on {args.rows:,} index rows",
            "",
            "| step | time | result |",
            "|---|---|---|",
            *bench_exact(args.rows, args.groups, args.decoys),
            bench_load(args.rows),
            bench_group_near(args.rows),
            "",
            *bench_near(args.icons),
            "",
        ]
    themes = [t for t in args.planted.split(",") if t and t != "none"]
    if themes:
        lines += ["### packer dupes --near on real themes with planted copies", ""]
    for theme in themes:
        lines += bench_planted(theme, args.sample, args.seed)
    text = "\n".join(lines)
    print(text)
    benchlib.save_results(args, "bench_dupes", text + "\n")


if __name__ == "__main__":
    main()
