"""WebDataset tar shards, read-only: a directory of ``.tar`` files (or one ``.tar``).

Each sample is the group of consecutive tar members that share a key (the member name up to
the first dot of its file name, as the ``webdataset`` package groups them): its image is the
first member with an image extension (``jpg``, ``jpeg``, ``png``, ``webp``, ...), its label
the ``cls`` member (an int), else ``txt`` (text), else ``json`` (any JSON). Members are found
from the tar headers, so the image bytes are never read to open the shards; a sample without
an image member is listed with the reason instead. packer reads these tars (``open_dataset``,
``packer convert``) and writes them (``packer convert --to webdataset``), but never packs
into them: the format is registered as bare-only, outside ``readers.formats.REGISTRY``.
"""

from __future__ import annotations

import json
import os
import tarfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from readers.errors import DatasetFormatError
from readers.formats.base import ShardFormat, StoredRecords
from readers.formats.layout import META_NAME

TAR_SUFFIX = ".tar"
IMAGE_EXTENSIONS = ("jpg", "jpeg", "png", "webp", "bmp", "tif", "tiff", "ppm", "pgm", "pbm")
LABEL_EXTENSIONS = ("cls", "txt", "json")
"""The label members, in the order one is preferred to another."""


@dataclass(frozen=True)
class TarSample:
    """One sample of a tar shard: where its image bytes lie, and its label."""

    tar: int  # its shard: index into the tar list
    key: str
    member: str  # the image member's name ('' when the sample has none)
    offset: int  # of the image bytes in the tar file
    size: int
    label: Any
    problem: str = ""  # why the sample cannot be used ('' when it can)


def split_key(name: str) -> tuple[str, str]:
    """``dir/abc.seg.png`` -> ``('dir/abc', 'seg.png')``: the key and the extension."""
    head, sep, base = name.rpartition("/")
    stem, _, ext = base.partition(".")
    return head + sep + stem, ext


def parse_label(ext: str, data: bytes) -> Any:
    """The label a ``cls``, ``txt`` or ``json`` member holds.

    Raises:
        ValueError: the member does not hold what its extension says.
    """
    text = data.decode("utf-8")
    if ext == "cls":
        return int(text.strip())
    if ext == "txt":
        return text
    return json.loads(text)


def find_tars(path: Path) -> list[Path] | None:
    """The ``.tar`` shards `path` names (a ``.tar`` file, or a directory of them), or None."""
    if path.is_file() and path.suffix == TAR_SUFFIX:
        return [path]
    if path.is_dir() and not (path / META_NAME).exists():
        tars = sorted(p for p in path.iterdir() if p.suffix == TAR_SUFFIX and p.is_file())
        return tars or None
    return None


def scan_tar(path: Path, number: int) -> list[TarSample]:
    """The samples of the tar at `path` (shard `number`), from its member headers.

    Raises:
        DatasetFormatError: the file is not a readable tar.
    """
    samples: list[TarSample] = []
    try:
        with tarfile.open(path, "r:") as tar:
            groups: list[tuple[str, list[tarfile.TarInfo]]] = []
            for member in tar:
                if not member.isfile():
                    continue
                key = split_key(member.name)[0]
                if not groups or groups[-1][0] != key:
                    groups.append((key, []))
                groups[-1][1].append(member)
            for key, members in groups:
                samples.append(_sample(tar, number, key, members))
    except (tarfile.TarError, OSError) as exc:
        raise DatasetFormatError(f"{path}: not a readable tar file ({exc})") from exc
    return samples


def _sample(
    tar: tarfile.TarFile, number: int, key: str, members: list[tarfile.TarInfo]
) -> TarSample:
    by_ext = {split_key(m.name)[1].lower(): m for m in members}
    label: Any = None
    problem = ""
    for ext in LABEL_EXTENSIONS:
        if ext in by_ext:
            f = tar.extractfile(by_ext[ext])
            data = b"" if f is None else f.read()
            try:
                label = parse_label(ext, data)
            except (ValueError, UnicodeDecodeError) as exc:
                problem = f"its .{ext} member {by_ext[ext].name} is not a {ext} label ({exc})"
            break
    image = next((m for m in members if split_key(m.name)[1].lower() in IMAGE_EXTENSIONS), None)
    if image is None:
        exts = ", ".join(sorted(by_ext))
        return TarSample(number, key, "", 0, 0, label, f"no image member (members: {exts})")
    return TarSample(number, key, image.name, image.offset_data, image.size, label, problem)


def scan_tars(tars: Sequence[Path]) -> list[TarSample]:
    """The samples of every tar, in shard order."""
    return [s for number, path in enumerate(tars) for s in scan_tar(path, number)]


def read_at(path: Path, offset: int, size: int) -> bytes:
    """`size` bytes of the file at `path` from `offset`.

    Raises:
        OSError: the file is shorter.
    """
    fd = os.open(path, os.O_RDONLY)
    try:
        data = os.pread(fd, size, offset)
    finally:
        os.close(fd)
    if len(data) != size:
        raise OSError(f"{path}: {size} bytes at {offset} expected, the file ends first")
    return data


def stored_records(tars: list[Path]) -> StoredRecords:
    """The samples of `tars` as stored, for conversion."""
    samples = scan_tars(tars)

    def read(start: int, stop: int) -> Iterator[tuple[bytes, Any] | str]:
        fds: dict[int, int] = {}
        try:
            for s in samples[start:stop]:
                if s.problem:
                    yield s.problem
                    continue
                if s.tar not in fds:
                    fds[s.tar] = os.open(tars[s.tar], os.O_RDONLY)
                data = os.pread(fds[s.tar], s.size, s.offset)
                if len(data) != s.size:
                    yield f"the member {s.member} is cut short"
                    continue
                yield data, s.label
        finally:
            for fd in fds.values():
                os.close(fd)

    names = [f"{tars[s.tar].name}/{s.member or s.key}" for s in samples]
    return StoredRecords(list(tars), names, [s.size for s in samples], read, label_source="tar")


class WebDatasetFormat(ShardFormat):
    """A directory of WebDataset ``.tar`` shards (read-only: nothing is packed into it)."""

    name = "webdataset"
    title = "WebDataset"
    summary = "WebDataset .tar shards (image members with cls/txt/json labels)"
    bare_hint = f"WebDataset shards (a directory of {TAR_SUFFIX} files)"
    dataset = "readers.datasets.webdataset:WebDatasetDataset"

    def find_bare(self, path: Path) -> list[Path] | None:
        """Return the tar shards `path` names, or None."""
        return find_tars(path)

    def stored_records(self, found: list[Path]) -> StoredRecords:
        """Return the samples of the tars `found`, as stored."""
        return stored_records(found)


FORMAT = WebDatasetFormat()

__all__ = [
    "FORMAT",
    "IMAGE_EXTENSIONS",
    "LABEL_EXTENSIONS",
    "TAR_SUFFIX",
    "TarSample",
    "WebDatasetFormat",
    "find_tars",
    "parse_label",
    "read_at",
    "scan_tar",
    "scan_tars",
    "split_key",
    "stored_records",
]
