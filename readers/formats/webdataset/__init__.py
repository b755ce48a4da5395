"""WebDataset tar shards, read-only: a directory of ``.tar`` files (or one ``.tar``).

Each sample is the group of consecutive tar members that share a key (the member name up to
the first dot of its file name, as the ``webdataset`` package groups them): its image is the
first member with an image extension (``jpg``, ``jpeg``, ``png``, ``webp``, ...), its label
the ``cls`` member (an int), else ``txt`` (text), else ``json`` (JSON without NaN or
infinities). Members are found from the tar headers, so the image bytes are never read to open
the shards. Nothing is dropped unsaid: a damaged header does not end the shard (the members
after it are found, as GNU tar skips to the next header, and the stretch skipped is reported
``damaged``); a tar cut short, or without the zero blocks that end it, is ``truncated``; links
are followed inside the tar (``broken_link``, ``outside_src`` otherwise); every member beside a
sample's image and label is ``extra_member``; a sample without an image is ``not_image``.
packer reads these tars (``open_dataset``, ``packer convert``) and writes them (``packer convert
--to webdataset``), but never packs into them: the format is registered as bare-only, outside
``readers.formats.REGISTRY``.
"""

from __future__ import annotations

import json
import math
import os
import posixpath
import tarfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from readers.formats.base import ShardFormat, StoredItem, StoredProblem, StoredRecords
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
    offset: int  # of the image bytes in the tar file (a link's: its target's)
    size: int
    label: Any
    problem: str = ""  # why the sample cannot be used ('' when it can)
    reason: str = ""  # the problem's reason code (errors.jsonl)
    labelled: bool = True  # False: the sample has no label member (its label is None)


@dataclass
class TarScan:
    """What the member headers of tar shards hold: the samples, and what is no sample's part.

    `problems` name every member that is not a sample's image or label (a second image, a
    label member beside the one used, a link to nothing), every stretch of a tar that does not
    parse (a damaged header: the members there are lost) and a tar that ends early.
    """

    samples: list[TarSample] = field(default_factory=list)
    problems: list[StoredProblem] = field(default_factory=list)


def split_key(name: str) -> tuple[str, str]:
    """``dir/abc.seg.png`` -> ``('dir/abc', 'seg.png')``: the key and the extension."""
    head, sep, base = name.rpartition("/")
    stem, _, ext = base.partition(".")
    return head + sep + stem, ext


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a finite number (JSON has no {name})")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} is not a finite number")
    return value


def parse_label(ext: str, data: bytes) -> Any:
    """The label a ``cls``, ``txt`` or ``json`` member holds.

    Raises:
        ValueError: the member does not hold what its extension says (a ``json`` label with
            NaN or an infinity included: no JSON holds them).
    """
    text = data.decode("utf-8")
    if ext == "cls":
        return int(text.strip())
    if ext == "txt":
        return text
    return json.loads(text, parse_constant=_refuse_constant, parse_float=_finite)


def find_tars(path: Path) -> list[Path] | None:
    """The ``.tar`` shards `path` names (a ``.tar`` file, or a directory of them), or None."""
    if path.is_file() and path.suffix == TAR_SUFFIX:
        return [path]
    if path.is_dir() and not (path / META_NAME).exists():
        tars = sorted(p for p in path.iterdir() if p.suffix == TAR_SUFFIX and p.is_file())
        return tars or None
    return None


def _zero(f: Any, start: int, stop: int) -> int | None:
    """Where the first byte that is not zero lies in ``start..stop`` of `f`, or None."""
    f.seek(start)
    at = start
    while at < stop:
        chunk = f.read(min(1 << 20, stop - at))
        if not chunk:
            return None
        stripped = chunk.lstrip(b"\0")
        if stripped:
            return at + len(chunk) - len(stripped)
        at += len(chunk)
    return None


def _damaged(name: str, start: int, stop: int) -> StoredProblem:
    return StoredProblem(
        "damaged",
        f"bytes {start}..{stop} ({stop - start} bytes) are not tar headers: a damaged header "
        "(GNU tar: 'Skipping to next header'); the member stored there is lost",
        name,
    )


def _walk(path: Path, f: Any, tar: tarfile.TarFile, found: TarScan) -> list[tarfile.TarInfo]:
    """Every member of the open `tar` (ignore_zeros), with the stretches skipped reported."""
    name = path.name
    members: list[tarfile.TarInfo] = []
    expected = 0
    try:
        for member in tar:
            if member.offset > expected:
                bad = _zero(f, expected, member.offset)
                if bad is not None:  # zero blocks between members: concatenated tars
                    found.problems.append(_damaged(name, bad, member.offset))
            members.append(member)
            expected = tar.offset
    except tarfile.ReadError as exc:
        last = f" after {members[-1].name}" if members else ""
        found.problems.append(
            StoredProblem(
                "truncated" if "end of data" in str(exc) else "damaged",
                f"cannot be read past byte {expected}{last} ({exc}): the tar is cut short "
                "or damaged there, what followed is lost",
                name,
            )
        )
        return members
    size = os.fstat(f.fileno()).st_size
    bad = _zero(f, expected, size)
    if bad is not None:
        found.problems.append(_damaged(name, bad, size))
    elif size - expected < 2 * tarfile.BLOCKSIZE:
        last = f" after {members[-1].name}" if members else ""
        found.problems.append(
            StoredProblem(
                "truncated",
                f"ends at byte {size}{last} without the two zero blocks that end a tar: "
                "cut short? (members after that point would be lost)",
                name,
            )
        )
    return members


def scan_tar(path: Path, number: int) -> TarScan:
    """The samples of the tar at `path` (shard `number`), from its member headers.

    A damaged header does not end the scan: the members after it are found (as GNU tar
    skips to the next header) and the stretch skipped is a ``damaged`` problem; a tar that
    cannot be read to its end, or lacks the zero blocks that end it, is ``truncated``.
    """
    found = TarScan()
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size == 0:
                found.problems.append(StoredProblem("empty", "an empty file", path.name))
                return found
            with tarfile.open(fileobj=f, mode="r:", ignore_zeros=True) as tar:
                members = _walk(path, f, tar, found)
                _group(tar, (number, path.name, size), members, found)
    except (tarfile.TarError, OSError) as exc:
        found.problems.append(
            StoredProblem("unreadable", f"not a readable tar file ({exc})", path.name)
        )
    return found


def _target(
    member: tarfile.TarInfo, files: dict[str, tarfile.TarInfo]
) -> tarfile.TarInfo | tuple[str, str]:
    """The regular member a link member leads to, or ``(reason, message)`` why none."""
    seen = 0
    while member.islnk() or member.issym():
        link = member.linkname
        base = "" if member.islnk() else posixpath.dirname(member.name)
        target = posixpath.normpath(posixpath.join(base, link))
        if link.startswith("/") or target == ".." or target.startswith("../"):
            return "outside_src", f"a link to {link!r}, outside the tar"
        nxt = files.get(target)
        seen += 1
        if nxt is None or seen > 32:
            return "broken_link", f"a link to {link!r}, which is no file of the tar"
        member = nxt
    return member


def _group(
    tar: tarfile.TarFile,
    where: tuple[int, str, int],
    members: list[tarfile.TarInfo],
    found: TarScan,
) -> None:
    """Group `members` into samples (consecutive members sharing a key) into `found`.

    `where`: the shard's number, name and size in bytes.
    """
    name = where[1]
    files = {posixpath.normpath(m.name): m for m in members if m.isfile() or m.issym()}
    files.update({posixpath.normpath(m.name): m for m in members if m.islnk()})
    groups: list[tuple[str, list[tarfile.TarInfo]]] = []
    for member in members:
        if member.isdir():
            continue
        if not (member.isfile() or member.islnk() or member.issym()):
            found.problems.append(
                StoredProblem(
                    "not_regular", "not a regular file, nor a link", f"{name}/{member.name}"
                )
            )
            continue
        key = split_key(member.name)[0]
        if not groups or groups[-1][0] != key:
            groups.append((key, []))
        groups[-1][1].append(member)
    for key, group in groups:
        sample = _sample(tar, where, key, group, files, found.problems)
        found.samples.append(sample)


def _ext(member: tarfile.TarInfo) -> str:
    return split_key(member.name)[1].lower()


def _sample(
    tar: tarfile.TarFile,
    where: tuple[int, str, int],
    key: str,
    members: list[tarfile.TarInfo],
    files: dict[str, tarfile.TarInfo],
    problems: list[StoredProblem],
) -> TarSample:
    """The sample of one key (`where`: the shard's number, name and size in bytes).

    The members it does not use go to `problems`.
    """
    number, name, end = where
    labels = [m for m in members if _ext(m) in LABEL_EXTENSIONS]
    label_member = min(labels, key=lambda m: LABEL_EXTENSIONS.index(_ext(m)), default=None)
    image_member = image = None
    reported: set[int] = set()
    for member in members:
        if _ext(member) not in IMAGE_EXTENSIONS:
            continue
        target = _target(member, files)
        if isinstance(target, tuple):
            problems.append(StoredProblem(target[0], target[1], f"{name}/{member.name}"))
            reported.add(id(member))
            continue
        image_member, image = member, target
        break
    used = [m.name for m in (image_member, label_member) if m is not None]
    for member in members:
        if member is image_member or member is label_member or id(member) in reported:
            continue
        what = "a second image" if _ext(member) in IMAGE_EXTENSIONS else f"a .{_ext(member)} member"
        problems.append(
            StoredProblem(
                "extra_member",
                f"{what} of sample {key}, not packed (a sample packs one image and one label "
                f"member, cls before txt before json: here {', '.join(used) or 'none'})",
                f"{name}/{member.name}",
            )
        )
    label: Any = None
    problem = reason = ""
    if label_member is not None:
        target = _target(label_member, files)
        if isinstance(target, tuple):
            reason, problem = target[0], f"its label member {label_member.name}: {target[1]}"
        else:
            f = tar.extractfile(target)
            data = b"" if f is None else f.read()
            try:
                label = parse_label(_ext(label_member), data)
            except (ValueError, UnicodeDecodeError) as exc:
                ext = _ext(label_member)
                reason = "bad_label"
                problem = f"its .{ext} member {label_member.name} is not a {ext} label ({exc})"
    labelled = label_member is not None
    if image is None or image_member is None:
        exts = ", ".join(sorted(_ext(m) for m in members))
        return TarSample(
            number, key, "", 0, 0, label, f"no image member (members: {exts})", "not_image"
        )
    if not problem and image.offset_data + image.size > end:
        reason, problem = "truncated", f"the member {image.name} is cut short (the tar ends first)"
    offset, size = image.offset_data, image.size
    return TarSample(number, key, image_member.name, offset, size, label, problem, reason, labelled)


def scan_tars(tars: Sequence[Path]) -> TarScan:
    """The samples of every tar, in shard order, and every tar's problems."""
    found = TarScan()
    for number, path in enumerate(tars):
        one = scan_tar(path, number)
        found.samples += one.samples
        found.problems += one.problems
    return found


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
    """The samples of `tars` as stored, for conversion.

    A sample without a label member is a ``no_label`` problem when other samples have one;
    when none has, every label is None (the label source ``none``).
    """
    scan = scan_tars(tars)
    samples = scan.samples
    has_labels = any(s.labelled for s in samples)

    def read(start: int, stop: int) -> Iterator[StoredItem]:
        fds: dict[int, int] = {}
        try:
            for s in samples[start:stop]:
                if s.problem:
                    yield StoredProblem(s.reason or "unreadable", s.problem)
                    continue
                if has_labels and not s.labelled:
                    yield StoredProblem(
                        "no_label", "no cls, txt or json member (other samples have one)"
                    )
                    continue
                if s.tar not in fds:
                    fds[s.tar] = os.open(tars[s.tar], os.O_RDONLY)
                data = os.pread(fds[s.tar], s.size, s.offset)
                if len(data) != s.size:
                    yield StoredProblem("truncated", f"the member {s.member} is cut short")
                    continue
                yield data, s.label
        finally:
            for fd in fds.values():
                os.close(fd)

    names = [f"{tars[s.tar].name}/{s.member or s.key}" for s in samples]
    sizes = [0 if s.problem else s.size for s in samples]
    return StoredRecords(
        list(tars),
        names,
        sizes,
        read,
        label_source="tar" if has_labels else "none",
        problems=scan.problems,
    )


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
    "TarScan",
    "WebDatasetFormat",
    "find_tars",
    "parse_label",
    "read_at",
    "scan_tar",
    "scan_tars",
    "split_key",
    "stored_records",
]
