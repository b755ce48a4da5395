"""Find identical images within and across packed datasets (``packer dupes``), and near copies.

The exact pass never compares pairs: the index's ``(nbytes, crc32)`` of every sample of every
dataset is sorted once as one 64-bit key (numpy), runs of equal keys are the candidates, and
only candidates are read and hashed with BLAKE2b, so a CRC-32 collision never makes a group.
The near pass (``near=True``) decodes every image once (JPEGs at a reduced DCT scale) and
hashes it (`packer.nearhash`); hashes within a few bits are only candidates. The images of the
candidate pairs are decoded again as colour thumbnails and luma views, each pair is confirmed
by a matching aspect ratio, a pixel check on thumbnails (`packer.nearhash.similar`) and one
at the smaller image's size (`packer.nearhash.fine_difference`; two lossless images of one
size must match to within a few levels); an image goes only with the picture it matches
best, and with none when two distinct pictures match it about as well (a ratio test); a group
holds only images that are confirmed pairwise, closest pairs first
(`packer.nearhash.cliques`): distinct images never share a group through a chain of
look-alikes. Identical images (the exact groups) are compared once.
Groups that cross datasets (leakage between splits) and groups whose labels disagree come
first.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from packer.engines import progress_bar
from packer.errors import PackerError
from packer.metadata import class_names
from packer.nearhash import (
    DEFAULT_HASH,
    DEFAULT_RADIUS,
    HASHES,
    MAX_FINE_DIFF,
    MAX_LOSSLESS_DIFF,
    MIN_SIDE,
    THUMB_SIDE,
    cliques,
    coarse_view,
    compared_side,
    fine_difference,
    fine_view,
    flatten,
    maybe_similar,
    near_pairs,
    similar,
    thumbnail,
)
from packer.terminal import shown
from readers.formats.layout import META_NAME
from readers.index import DatasetIndex, load_index

MIN_DRAFT_SIDE = (
    128  # a JPEG is decoded at 1/2, 1/4 or 1/8 scale while its short side stays >= this
)
LOSSLESS_FORMATS = frozenset({"png", "raw", "bmp", "tiff"})
AMBIGUOUS_RATIO = 0.8  # a row's best match must be this much closer than a distinct picture
ASPECT_TOLERANCE = 0.03  # copies keep their aspect ratio to within this (and a pixel's rounding)


class NotPackedError(PackerError):
    """``packer dupes`` was given something that is not a packed dataset."""

    def __init__(self, path: Path) -> None:
        super().__init__(
            f"{path}: no {META_NAME}; packer dupes compares packed datasets (their index holds "
            "each image's CRC-32 and size); pack or convert it first (packer build / convert)"
        )


@dataclass
class Source:
    """One dataset being compared: its path as given, its index, and a reader made on demand."""

    name: str
    index: DatasetIndex
    classes: list[str] | None
    _dataset: Any = None

    def dataset(self) -> Any:
        """The dataset opened for stored bytes (only when bytes are needed)."""
        if self._dataset is None:
            from readers._paddle import open_for_bytes  # with or without paddle installed

            self._dataset = open_for_bytes(self.index.root)
        return self._dataset

    def member(self, i: int) -> dict[str, Any]:
        """Sample `i` as a group member: dataset, id, path, label (and class name)."""
        label = self.index.labels[i]
        out: dict[str, Any] = {
            "dataset": self.name,
            "id": i,
            "path": str(self.index.extra["path"][i].as_py()),
            "label": label,
        }
        name = self.class_name(label)
        if name is not None:
            out["class"] = name
        return out

    def class_name(self, label: Any) -> str | None:
        """The class name of an int label, when meta.json names the classes."""
        if self.classes and isinstance(label, int) and 0 <= label < len(self.classes):
            return self.classes[label]
        return None


@dataclass
class DupeGroup:
    """Samples with the same content (``exact``) or nearly the same look (``near``)."""

    kind: str
    members: list[dict[str, Any]]
    nbytes: int | None = None
    blake2b: str | None = None

    @property
    def cross_dataset(self) -> bool:
        """Whether the members come from more than one dataset (leakage between splits)."""
        return len({m["dataset"] for m in self.members}) > 1

    @property
    def conflicting_labels(self) -> bool:
        """Whether two members carry different labels (class names compared across datasets)."""
        keys = {_label_key(m) for m in self.members if m["label"] is not None}
        return len(keys) > 1

    def as_json(self) -> dict[str, Any]:
        """The group as ``--json`` prints it."""
        out: dict[str, Any] = {
            "kind": self.kind,
            "cross_dataset": self.cross_dataset,
            "conflicting_labels": self.conflicting_labels,
        }
        if self.nbytes is not None:
            out["nbytes"] = self.nbytes
            out["blake2b"] = self.blake2b
        out["members"] = self.members
        return out


def _label_key(member: dict[str, Any]) -> str:
    # ids mean different classes in different datasets: compare names when there are names
    if "class" in member:
        return "class:" + str(member["class"])
    return json.dumps(member["label"], sort_keys=True)


@dataclass
class DupesReport:
    """The groups found over `datasets`, most urgent first."""

    datasets: list[str]
    groups: list[DupeGroup] = field(default_factory=list)
    near: bool = False
    threshold: int | None = None
    hash: str | None = None
    unhashed: list[dict[str, Any]] = field(default_factory=list)
    too_small: int = 0

    def summary(self) -> dict[str, int]:
        """Counts: groups (exact, near), extra copies, across datasets, with label conflicts."""
        exact = [g for g in self.groups if g.kind == "exact"]
        return {
            "groups": len(self.groups),
            "exact_groups": len(exact),
            "near_groups": len(self.groups) - len(exact),
            "extra_copies": sum(len(g.members) - 1 for g in exact),
            "cross_dataset": sum(g.cross_dataset for g in self.groups),
            "conflicting_labels": sum(g.conflicting_labels for g in self.groups),
        }

    def as_json(self) -> dict[str, Any]:
        """The report as ``--json`` prints it."""
        out: dict[str, Any] = {
            "datasets": self.datasets,
            "summary": self.summary(),
            "groups": [g.as_json() for g in self.groups],
        }
        if self.near:
            out["near"] = {
                "hash": self.hash,
                "threshold": self.threshold,
                "min_side": MIN_SIDE,
                "too_small": self.too_small,
            }
            out["unhashed"] = self.unhashed
        return out

    def text(self) -> str:
        """The report for a terminal (labels, class names and paths `shown` escaped)."""
        s = self.summary()
        head = (
            f"{s['exact_groups']} group{'s' if s['exact_groups'] != 1 else ''} of identical "
            f"images ({s['extra_copies']} extra copies)"
        )
        if self.near:
            head += (
                f", {s['near_groups']} of near copies ({self.hash} <= {self.threshold} bits, "
                f"confirmed pairwise; {self.too_small} images under {MIN_SIDE} px not compared)"
            )
        head += (
            f"; {s['cross_dataset']} across datasets, {s['conflicting_labels']} with conflicting "
            f"labels, in {', '.join(shown(d) for d in self.datasets)}"
        )
        lines = [head]
        for g in self.groups:
            tags = [g.kind]
            if g.cross_dataset:
                tags.append("across datasets")
            if g.conflicting_labels:
                tags.append("labels disagree")
            size = f", {g.nbytes} bytes" if g.nbytes is not None else ""
            lines.append(f"[{', '.join(tags)}] {len(g.members)} images{size}")
            for m in g.members:
                label = shown(m.get("class", json.dumps(m["label"], ensure_ascii=False)))
                lines.append(
                    f"  {shown(m['dataset'])}  #{m['id']}  {shown(m['path'])}  label {label}"
                )
        for u in self.unhashed:
            lines.append(
                f"not compared (near): {shown(u['dataset'])} #{u['id']} {shown(u['path'])}: "
                f"{shown(u['reason'])}"
            )
        return "\n".join(lines)


def load_sources(paths: Sequence[str | Path]) -> list[Source]:
    """The index (crc32, nbytes, labels, path, width, height, format) of each dataset.

    Raises:
        NotPackedError: a path has no meta.json.
        ReaderError: an index does not load.
    """
    sources = []
    for path in paths:
        root = Path(path)
        if not (root / META_NAME).is_file():
            raise NotPackedError(root)
        index = load_index(root, extra=("path", "width", "height", "format"))
        sources.append(Source(str(path), index, class_names(index.meta)))
    return sources


def exact_candidates(crc32: np.ndarray, nbytes: np.ndarray) -> list[np.ndarray]:
    """Runs of rows with equal ``(nbytes, crc32)``: each run a sorted array of >= 2 rows.

    One sort of a 64-bit key; no per-pair work. Runs come in order of their first row.
    """
    key = (np.asarray(nbytes, dtype=np.uint64) << np.uint64(32)) | np.asarray(
        crc32, dtype=np.uint64
    )
    order = np.argsort(key, kind="stable")  # stable: rows stay sorted within a run
    ordered = key[order]
    cuts = np.flatnonzero(ordered[1:] != ordered[:-1]) + 1
    starts = np.concatenate(([0], cuts))
    ends = np.concatenate((cuts, [len(ordered)]))
    long = ends - starts >= 2
    runs = [order[s:e] for s, e in zip(starts[long], ends[long], strict=True)]
    runs.sort(key=lambda r: int(r[0]))
    return runs


def confirm_candidates(
    runs: list[np.ndarray], read: Callable[[int], bytes]
) -> list[tuple[np.ndarray, str]]:
    """Split each candidate run by the BLAKE2b of the bytes `read(row)` returns.

    Candidates are read once each, in row order (sequential in the shards). Returns the
    groups of >= 2 rows with their hex digest, in order of their first row.
    """
    if not runs:
        return []
    digests: dict[int, str] = {}
    for row in np.sort(np.concatenate(runs)).tolist():
        digests[row] = hashlib.blake2b(read(row), digest_size=16).hexdigest()
    groups: list[tuple[np.ndarray, str]] = []
    for run in runs:
        by_digest: dict[str, list[int]] = {}
        for row in run.tolist():
            by_digest.setdefault(digests[row], []).append(row)
        groups.extend((np.array(rows), d) for d, rows in by_digest.items() if len(rows) >= 2)
    groups.sort(key=lambda g: int(g[0][0]))
    return groups


class _Rows:
    """All samples of all sources as one row space: row = the source's offset + id."""

    def __init__(self, sources: list[Source]) -> None:
        self.sources = sources
        sizes = [len(s.index) for s in sources]
        self.offsets = np.concatenate(([0], np.cumsum(sizes))).astype(np.int64)
        self.crc32 = np.concatenate([s.index.crc32 for s in sources])
        self.nbytes = np.concatenate([s.index.nbytes for s in sources])

    def locate(self, row: int) -> tuple[Source, int]:
        k = int(np.searchsorted(self.offsets, row, side="right")) - 1
        return self.sources[k], row - int(self.offsets[k])

    def read(self, row: int) -> bytes:
        source, i = self.locate(row)
        return bytes(source.dataset().read_bytes(i))

    def member(self, row: int) -> dict[str, Any]:
        source, i = self.locate(row)
        return source.member(i)


def _view(source: Source, i: int) -> np.ndarray:
    """Sample `i` as 8-bit BGR, a transparent image flattened over black.

    A JPEG is decoded at the smallest DCT scale that keeps `MIN_DRAFT_SIDE` pixels; the
    scaled image then covers exactly the stored one (its last row and column, part padding,
    are cut at sub-pixel precision), so that it lines up with a copy decoded at full size.
    """
    index, ds = source.index, source.dataset()
    data = ds.read_bytes(i)
    if index.extra["format"][i].as_py() == "jpeg":
        width, height = int(index.extra["width"][i]), int(index.extra["height"][i])
        for factor, flag in (
            (8, cv2.IMREAD_REDUCED_COLOR_8),
            (4, cv2.IMREAD_REDUCED_COLOR_4),
            (2, cv2.IMREAD_REDUCED_COLOR_2),
        ):
            if min(width, height) // factor >= MIN_DRAFT_SIDE:
                image = cv2.imdecode(np.frombuffer(data, np.uint8), flag)
                if image is None:
                    break
                h, w = image.shape[:2]
                if (w * factor, h * factor) != (width, height):  # 8x finer, then cut exactly
                    image = cv2.resize(image, (w * 8, h * 8), interpolation=cv2.INTER_LINEAR)
                    image = image[: round(height * 8 / factor), : round(width * 8 / factor)]
                return image
    image = np.asarray(ds.decode_stored(data, i, "unchanged"))
    if index.extra["format"][i].as_py() == "raw" and image.ndim == 3 and image.shape[2] >= 3:
        image = image[:, :, [2, 1, 0, 3][: image.shape[2]]]  # raw pixels are stored RGB(A)
    return flatten(image)


class _NearPass:
    """The near pass over the distinct contents of `rows`: hash, candidates, checks, groups."""

    def __init__(
        self,
        rows: _Rows,
        exact: list[np.ndarray],
        report: DupesReport,
        progress: bool | None = None,
    ) -> None:
        self.rows, self.report, self.progress = rows, report, progress
        n = len(rows.crc32)
        self.copies: dict[int, list[int]] = {}  # first row of an exact group -> its rows
        distinct = np.ones(n, dtype=bool)
        for members in exact:
            self.copies[int(members[0])] = members.tolist()
            distinct[members[1:]] = False
        width, height = self._column("width"), self._column("height")
        self.short = np.minimum(width, height)
        self.size = list(zip(width.tolist(), height.tolist(), strict=True))
        formats = [str(f) for s in rows.sources for f in s.index.extra["format"].to_pylist()]
        self.lossless = [f in LOSSLESS_FORMATS for f in formats]
        self.aspect = np.log(np.maximum(width, 1) / np.maximum(height, 1))
        small = distinct & (self.short < MIN_SIDE)
        report.too_small = sum(len(self.copies.get(r, [r])) for r in np.flatnonzero(small).tolist())
        self.candidates = np.flatnonzero(distinct & ~small)
        self.thumbs: dict[tuple[int, int], np.ndarray] = {}
        self.fines: dict[int, np.ndarray] = {}  # row -> its `fine_view`
        self.differences: dict[tuple[int, int], float] = {}

    def _column(self, name: str) -> np.ndarray:
        return np.concatenate(
            [np.asarray(s.index.extra[name], dtype=np.float64) for s in self.rows.sources]
        )

    def _decode(self, row: int) -> np.ndarray:
        source, i = self.rows.locate(row)
        return _view(source, i)

    def hashes(self, hash_name: str) -> tuple[np.ndarray, np.ndarray]:
        """The rows that decode and their hashes."""
        hash_image = HASHES[hash_name]
        kept, hashes = [], []
        total = len(self.candidates)
        with progress_bar(total, self.progress if total else False, desc="hashing") as bar:
            for row in self.candidates.tolist():
                try:
                    image = self._decode(row)
                    hashes.append(hash_image(cv2.cvtColor(image, cv2.COLOR_BGR2GRAY)))
                    kept.append(row)
                except (ValueError, cv2.error) as exc:
                    member = self.rows.member(row)
                    self.report.unhashed.append({**member, "reason": f"does not decode ({exc})"})
                bar.update(1)
        return np.array(kept, dtype=np.int64), np.array(hashes, dtype=np.uint64)

    def confirmed(self, a: int, b: int) -> bool:
        """Whether rows `a` and `b` show the same picture: aspect ratio, thumbnails, full size."""
        return self.difference(a, b) <= MAX_FINE_DIFF

    def difference(self, a: int, b: int) -> float:
        """`fine_difference` of rows `a` and `b`; infinite when a coarser check already fails."""
        key = (min(a, b), max(a, b))
        if key not in self.differences:
            self.differences[key] = self._difference(a, b)
        return self.differences[key]

    def _difference(self, a: int, b: int) -> float:
        short = int(min(self.short[a], self.short[b]))
        if abs(self.aspect[a] - self.aspect[b]) > ASPECT_TOLERANCE + 2 / short:
            return float("inf")
        side = compared_side(short)
        if not similar(self.thumb(a, side), self.thumb(b, side), short):
            return float("inf")
        diff = fine_difference(self.fines[a], self.fines[b])
        if self.lossless[a] and self.lossless[b] and self.size[a] == self.size[b]:
            # two lossless images of one size: no resampling or re-encoding explains a difference
            return diff if diff <= MAX_LOSSLESS_DIFF else float("inf")
        return diff

    def thumb(self, row: int, side: int = THUMB_SIDE) -> np.ndarray:
        """Row `row`'s thumbnail at `side` pixels (decoded once, each size made once)."""
        key = (row, side)
        if key not in self.thumbs:
            if side == THUMB_SIDE:
                image = self._decode(row)
                self.thumbs[key] = thumbnail(image)
                self.fines[row] = fine_view(image)
            else:
                full = self.thumb(row)
                self.thumbs[key] = cv2.resize(full, (side, side), interpolation=cv2.INTER_AREA)
        return self.thumbs[key]

    def unambiguous(self, good: list[tuple[int, int]]) -> list[tuple[int, int]]:
        """The confirmed pairs `good`, less those that join a row to a second picture.

        A row goes with the picture it matches best: a pair with a partner that its best
        match is not confirmed with (another picture) is dropped, and when that other
        picture is about as close (within `AMBIGUOUS_RATIO`), the row is too small or too
        blurred to tell the two apart and is left out of every near group, rather than given
        to the closer by a hair (a ratio test).
        """
        partners: dict[int, list[int]] = {}
        for a, b in good:
            partners.setdefault(a, []).append(b)
            partners.setdefault(b, []).append(a)
        ambiguous, dropped = set(), set()
        for row, others in partners.items():
            best, *rest = sorted(others, key=lambda o: self.difference(row, o))
            for other in rest:
                if not self.confirmed(best, other):
                    dropped.add((min(row, other), max(row, other)))
                    if self.difference(row, best) >= AMBIGUOUS_RATIO * self.difference(row, other):
                        ambiguous.add(row)
        return [
            (a, b)
            for a, b in good
            if a not in ambiguous and b not in ambiguous and (min(a, b), max(a, b)) not in dropped
        ]

    def groups(self, threshold: int, hash_name: str) -> list[list[int]]:
        """Groups of rows (with their exact copies), each confirmed pairwise, closest first."""
        kept, hashes = self.hashes(hash_name)
        pairs = kept[near_pairs(hashes, threshold)]
        rows = np.unique(pairs)
        for row in rows.tolist():  # decoded again, in row order (sequential reads)
            self.thumb(row)
        if len(pairs):  # a cheap test that only drops pairs the checks would reject
            views = np.stack([coarse_view(self.thumb(row)) for row in rows.tolist()])
            at = np.searchsorted(rows, pairs)
            pairs = pairs[maybe_similar(views, at[:, 0], at[:, 1])]
        good = [(a, b) for a, b in pairs.tolist() if self.confirmed(a, b)]
        good = self.unambiguous(good)
        scores = [self.difference(a, b) for a, b in good]
        found = cliques(np.array(good, dtype=np.int64).reshape(-1, 2), self.confirmed, scores)
        return [sorted(r for row in g for r in self.copies.get(row, [row])) for g in found]


def find_dupes(
    paths: Sequence[str | Path],
    *,
    near: bool = False,
    threshold: int = DEFAULT_RADIUS,
    hash_name: str = DEFAULT_HASH,
    progress: bool | None = None,
) -> DupesReport:
    """Groups of identical (and with `near`, near-identical) images in the datasets at `paths`.

    `progress`: bars over the candidates read and the images hashed (None: on a terminal).

    Raises:
        NotPackedError: a path is not a packed dataset.
        ReaderError: a dataset does not load or a record does not read.
    """
    rows = _Rows(load_sources(paths))
    report = DupesReport([str(p) for p in paths], near=near)
    runs = exact_candidates(rows.crc32, rows.nbytes)
    candidates = sum(len(r) for r in runs)
    with progress_bar(candidates, progress if candidates else False, desc="comparing") as bar:

        def read(row: int) -> bytes:
            bar.update(1)
            return rows.read(row)

        exact = confirm_candidates(runs, read)
    for members, digest in exact:
        report.groups.append(
            DupeGroup(
                "exact",
                [rows.member(r) for r in members.tolist()],
                nbytes=int(rows.nbytes[members[0]]),
                blake2b=digest,
            )
        )
    if near:
        report.threshold, report.hash = threshold, hash_name
        near_pass = _NearPass(rows, [members for members, _ in exact], report, progress)
        for group in near_pass.groups(threshold, hash_name):
            report.groups.append(DupeGroup("near", [rows.member(r) for r in group]))
    report.groups.sort(
        key=lambda g: (
            not g.cross_dataset,
            not g.conflicting_labels,
            g.kind != "exact",
            -len(g.members),
        )
    )  # stable: otherwise in order of the first member
    return report
