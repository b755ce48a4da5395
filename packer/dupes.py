"""Find identical images within and across packed datasets (``packer dupes``), and near copies.

The exact pass never compares pairs: the index's ``(nbytes, crc32)`` of every sample of every
dataset is sorted once as one 64-bit key (numpy), runs of equal keys are the candidates, and
only candidates are read and hashed with BLAKE2b, so a CRC-32 collision never makes a group.
The near pass (``near=True``) decodes every image once, as a small gray image (JPEGs at a
reduced DCT scale), hashes it (`packer.nearhash`) and groups hashes within a few bits.
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
from packer.nearhash import DEFAULT_HASH, DEFAULT_THRESHOLD, HASHES, group_near
from packer.terminal import shown
from readers.formats.layout import META_NAME
from readers.index import DatasetIndex, load_index

MIN_DRAFT_SIDE = 32  # a JPEG is decoded at 1/2, 1/4 or 1/8 scale while its short side stays >= this


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
            out["near"] = {"hash": self.hash, "threshold": self.threshold}
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
            head += f", {s['near_groups']} of near copies ({self.hash}, <= {self.threshold} bits)"
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


def _gray(source: Source, i: int) -> np.ndarray:
    """Sample `i` decoded as a gray image, JPEGs at the smallest scale that keeps 32 px."""
    index, ds = source.index, source.dataset()
    data = ds.read_bytes(i)
    if index.extra["format"][i].as_py() == "jpeg":
        short = min(int(index.extra["width"][i]), int(index.extra["height"][i]))
        for factor, flag in (
            (8, cv2.IMREAD_REDUCED_GRAYSCALE_8),
            (4, cv2.IMREAD_REDUCED_GRAYSCALE_4),
            (2, cv2.IMREAD_REDUCED_GRAYSCALE_2),
        ):
            if short // factor >= MIN_DRAFT_SIDE:
                image = cv2.imdecode(np.frombuffer(data, np.uint8), flag)
                if image is not None:
                    return image
                break
    return np.asarray(ds.decode_stored(data, i, "gray"))


def _near_groups(
    rows: _Rows, threshold: int, hash_name: str, unhashed: list[dict[str, Any]], bar: Any = None
) -> list[np.ndarray]:
    hash_image = HASHES[hash_name]
    hashes = np.zeros(len(rows.crc32), dtype=np.uint64)
    ok = np.zeros(len(rows.crc32), dtype=bool)
    for k, source in enumerate(rows.sources):
        first = int(rows.offsets[k])
        for i in range(len(source.index)):
            try:
                hashes[first + i] = hash_image(_gray(source, i))
                ok[first + i] = True
            except (ValueError, cv2.error) as exc:
                unhashed.append({**source.member(i), "reason": f"does not decode ({exc})"})
            if bar is not None:
                bar.update(1)
    kept = np.flatnonzero(ok)
    return [kept[g] for g in group_near(hashes[kept], threshold)]


def find_dupes(
    paths: Sequence[str | Path],
    *,
    near: bool = False,
    threshold: int = DEFAULT_THRESHOLD,
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
    exact_sets = set()
    for members, digest in exact:
        exact_sets.add(tuple(members.tolist()))
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
        with progress_bar(len(rows.crc32), progress, desc="hashing") as bar:
            near_groups = _near_groups(rows, threshold, hash_name, report.unhashed, bar)
        for members in near_groups:
            if tuple(members.tolist()) not in exact_sets:  # already reported as identical
                report.groups.append(DupeGroup("near", [rows.member(r) for r in members.tolist()]))
    report.groups.sort(
        key=lambda g: (
            not g.cross_dataset,
            not g.conflicting_labels,
            g.kind != "exact",
            -len(g.members),
        )
    )  # stable: otherwise in order of the first member
    return report
