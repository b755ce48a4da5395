"""``packer.Writer``: a dataset written sample by sample from Python, published when it closes.

Each sample is encoded image bytes (checked as a build checks a file: `packer.prepare`'s
`prepare_bytes`) or a uint8 ``HxW[xC]`` array (RGB/RGBA order, as readers return them;
encoded as ``encode=`` says: ``keep`` and ``png`` -> PNG, ``jpeg``, ``raw`` with
``compress=``). Samples go through the build's own pieces: the registered shard writer in a
`ShardPart` per shard (a new shard past ``shard_size`` stored bytes), `merge_parts` for the
index, `make_meta`, and `finish_output`, which writes meta.json last into the hidden sibling
``.OUT.partial`` and renames it to OUT. Until then nothing is under OUT: an exception inside
the ``with`` block, or a killed process, leaves no dataset (and OUT as it was). The build's
lock is held from `Writer.open` to the end, so a build of the same OUT cannot mix in.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import sys
from collections import deque
from collections.abc import Callable, Iterable
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np

from packer import __version__
from packer import problems as P
from packer.api import BuildOptions
from packer.build import finish_output, prepare_build_dir, temp_dir_for
from packer.config import cap_workers
from packer.errors import (
    ConfigError,
    InputError,
    OutputExistsError,
    PackerError,
    SampleTypeError,
    WriterStateError,
)
from packer.formats import DEFAULT_FORMAT, FORMATS
from packer.labels.common import nonfinite_label
from packer.output import build_lock, check_output_apart, prepare_parent
from packer.prepare import _with_data, prepare_bytes
from packer.problems import Problem
from packer.records import Record
from packer.repack import RepackConfig
from packer.transform import DEFAULT_MAX_PIXELS, Transform, apply_transform, compress_pixels
from packer.writers.merge import merge_parts
from packer.writers.part import IndexRow, ShardPart, make_index_row, start_part
from readers.durable import write_durably
from readers.fastzlib import crc32
from readers.formats.layout import ERRORS_NAME, INDEX_NAME, WARNINGS_NAME
from readers.index import fingerprint
from readers.meta import make_meta

Sample = tuple[str, Any, Any]
"""A sample to prepare: its index path, its image (bytes or an array), its label."""

_CHUNK = 64  # samples per task sent to a pool process
_IN_FLIGHT = 4  # chunks queued per process: each kept busy, memory bounded


def _plain_label(label: Any) -> Any:
    """`label` with numpy values made Python ones (np.int64 -> int, arrays -> lists)."""
    if isinstance(label, np.generic):
        return label.item()
    if isinstance(label, np.ndarray):
        return label.tolist()
    if isinstance(label, (list, tuple)):
        return [_plain_label(v) for v in label]
    if isinstance(label, dict):
        return {k: _plain_label(v) for k, v in label.items()}
    return label


def check_image(image: Any) -> bytes | np.ndarray:
    """`image` as bytes or as a uint8 ``HxW[xC]`` array, or a `SampleTypeError`.

    Raises:
        SampleTypeError: any other object, dtype or shape.
    """
    if isinstance(image, (bytes, bytearray, memoryview)):
        return bytes(image)
    if not isinstance(image, np.ndarray):
        raise SampleTypeError(
            f"add(): the image is a {type(image).__name__}; expected encoded image bytes or "
            "a uint8 HxW[xC] numpy array"
        )
    if image.dtype != np.uint8:
        raise SampleTypeError(
            f"add(): the array's dtype is {image.dtype}; expected uint8 (convert it with "
            "np.clip(a, 0, 255).astype(np.uint8))"
        )
    shaped = image.ndim == 2 or (image.ndim == 3 and image.shape[2] in (1, 3, 4))
    if not shaped or image.shape[0] == 0 or image.shape[1] == 0:
        raise SampleTypeError(
            f"add(): the array's shape is {image.shape}; expected HxW (gray) or HxWxC with "
            "C = 1, 3 (RGB) or 4 (RGBA), H and W at least 1"
        )
    return image


def prepare_array(rel: str, array: np.ndarray, label: Any, t: Transform) -> Record | Problem:
    """A uint8 ``HxW[xC]`` RGB(A) array, encoded as `t` says (``keep``: PNG)."""
    height, width = array.shape[:2]
    if t.max_pixels is not None and width * height > t.max_pixels:
        return Problem(
            rel,
            P.TOO_MANY_PIXELS,
            f"the array is {width}x{height} = {width * height} pixels, above --max-pixels "
            f"{t.max_pixels}",
        )
    pixels = array[:, :, 0] if array.ndim == 3 and array.shape[2] == 1 else array
    if t.encode == "raw" and t.short is None and t.fit is None:  # stored as given
        data = np.ascontiguousarray(pixels).tobytes()
        if t.compression is not None:
            data = compress_pixels(data, t.compression)
        stored, fmt = data, "raw"
    else:
        import cv2

        if pixels.ndim == 3:  # OpenCV's order, which apply_transform expects
            code = cv2.COLOR_RGB2BGR if pixels.shape[2] == 3 else cv2.COLOR_RGBA2BGRA
            pixels = cv2.cvtColor(pixels, code)
        stored, fmt, pixels = apply_transform(pixels, "png", t)
    channels = 1 if pixels.ndim == 2 else int(pixels.shape[2])
    compression = t.compression if fmt == "raw" else None
    return Record(
        rel,
        label,
        stored,
        fmt,
        int(pixels.shape[1]),
        int(pixels.shape[0]),
        channels,
        crc32(stored),
        (),
        compression,
    )


def prepare_sample(
    sample: Sample, transform: Transform, decode_check: bool
) -> tuple[Record | Problem, IndexRow | None]:
    """One sample prepared (`prepare_bytes` or `prepare_array`), with its index row."""
    rel, image, label = sample
    if isinstance(image, bytes):
        item = prepare_bytes(rel, image, label, decode_check=decode_check, transform=transform)
    else:
        item = prepare_array(rel, image, label, transform)
    return item, make_index_row(item) if isinstance(item, Record) else None


def _prepare_chunk(
    chunk: list[Sample], transform: Transform, decode_check: bool
) -> list[tuple[Record | Problem, IndexRow | None]]:
    """A chunk of samples prepared in a pool process; bytes stored as given are not sent back."""
    results = []
    for sample in chunk:
        item, row = prepare_sample(sample, transform, decode_check)
        if isinstance(item, Record) and item.data is sample[1]:
            item = _with_data(item, b"")
        results.append((item, row))
    return results


class Writer:
    """Write a packer dataset sample by sample; it appears at `out` when the writer closes.

    Use it as a context manager: the dataset is published when the ``with`` block ends
    without an exception; with one (or a killed process) nothing appears at `out`::

        with packer.Writer("digits.lmdb") as w:
            for image, label in samples:
                w.add(image, label)

    Args:
        out: the dataset directory to write (``str`` or ``os.PathLike``).
        format: a registered format (``lmdb``, ``recordio``).
        shard_size: start a new shard past this many stored bytes (``"1GiB"`` or bytes).
        encode: ``keep`` (bytes as given, arrays as PNG), ``jpeg``, ``png`` or ``raw``.
        quality: JPEG quality with ``encode="jpeg"``.
        compress: ``none``, ``lz4`` or ``zstd`` (raw pixels only, with ``encode="raw"``).
        overwrite: replace `out` if it is a packer dataset (or an empty directory).
        classes: class names (index = class id), recorded in meta.json; labels are then
            class ids or class names (stored as their id).
        on_error: ``skip`` (a rejected sample goes to errors.jsonl; `add` returns None) or
            ``fail`` (`add` raises `InputError`, and nothing is published).
        decode_check: prove encoded bytes decodable by decoding them (else headers only).
        max_pixels: refuse images with more pixels (0 or None: no limit but OpenCV's).
        workers: processes that `add_many` prepares samples in (0: every usable core).
        log: where messages go (default: stderr).

    Raises:
        ConfigError: an invalid option (the command line's message).
    """

    def __init__(
        self,
        out: str | os.PathLike[str],
        *,
        format: str = DEFAULT_FORMAT,
        shard_size: str | int = "1GiB",
        encode: str = "keep",
        quality: int = 95,
        compress: str = "none",
        overwrite: bool = False,
        classes: Iterable[str] | None = None,
        on_error: str = "skip",
        decode_check: bool = True,
        max_pixels: int | None = DEFAULT_MAX_PIXELS,
        workers: int = 1,
        log: Callable[[str], None] | None = None,
    ) -> None:
        options = BuildOptions.from_keywords(
            {
                "format": format,
                "shard_size": shard_size,
                "encode": encode,
                "quality": quality,
                "compress": compress,
                "overwrite": overwrite,
                "on_error": on_error,
                "decode_check": decode_check,
                "max_pixels": max_pixels,
                "workers": workers,
            }
        )
        size = options.shard_bytes()
        self.out = _local_path(out)
        self.config = RepackConfig(self.out, format, size, on_error, overwrite)  # validates
        self.transform = options.transform()
        self.decode_check = decode_check
        self.classes = _check_classes(classes)
        self.workers = cap_workers(options.worker_count())
        self._say = log or (lambda msg: print(msg, file=sys.stderr))
        self._shard_cls = FORMATS[format].writer
        self._tmp = temp_dir_for(self.out)
        self._state = "new"  # new -> open -> closed | aborted
        self._stack = contextlib.ExitStack()
        self._part: ShardPart | None = None
        self._numbers: list[int] = []  # the shards finished
        self._problems: list[Problem] = []
        self._calls = 0  # samples given (the default path of each)
        self._count = 0  # samples stored (the next id)
        self._pool: Any = None

    # --- the life of a writer ---

    def __enter__(self) -> Writer:
        return self.open()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is None:
            self.close()
        else:
            self.abort()

    def open(self) -> Writer:
        """Check OUT, take its build lock and start the hidden build directory.

        `add` opens the writer when it is not open yet.

        Raises:
            OutputExistsError: OUT exists and ``overwrite`` was not given.
            UnsafeOutputError, NotADatasetError, OutputParentError, BuildLockedError: see
                `packer.output`.
        """
        if self._state != "new":
            raise WriterStateError(f"the writer of {self.out} is {self._state}; make a new one")
        check_output_apart(self.out, [], build_dir=self._tmp, overwrite=self.config.overwrite)
        if (self.out.exists() or self.out.is_symlink()) and not self.config.overwrite:
            raise OutputExistsError(str(self.out))
        prepare_parent(self.out)
        self._stack.enter_context(build_lock(self.out))
        try:
            prepare_build_dir(self._tmp, "", self._say, resume=False)
        except BaseException:
            self._stack.close()
            raise
        self._state = "open"
        return self

    def close(self) -> None:
        """Finish the last shard, write the index and meta.json, and publish OUT.

        Raises:
            PackerError: no sample was stored (nothing is published).
        """
        if self._state in ("closed", "aborted"):
            return
        if self._state == "new":
            self.open()
        try:
            self._finish_part()
            if self._count == 0:
                shown = "; ".join(f"{p.path}: {p.reason}" for p in self._problems[:5])
                raise PackerError(
                    f"no sample was stored in {self.out} ({len(self._problems)} rejected"
                    + (f": {shown}" if shown else "")
                    + "); nothing was published"
                )
            publish_samples(self, self._numbers, self._problems)
        except BaseException:
            self.abort()
            raise
        self._state = "closed"
        self._release()

    def abort(self) -> None:
        """Drop everything written: nothing appears at OUT (an old OUT stays as it was)."""
        if self._state in ("closed", "aborted"):
            return
        if self._part is not None:
            self._part.abort()
            self._part = None
        if self._pool is not None:
            from packer.engines.local import kill_pool

            kill_pool(self._pool)
            self._pool = None
        if self._state == "open":
            shutil.rmtree(self._tmp, ignore_errors=True)
        self._state = "aborted"
        self._release()

    def _release(self) -> None:
        if self._pool is not None:
            from packer.engines.local import stop_pool

            stop_pool(self._pool)
            self._pool = None
        self._stack.close()

    # --- samples ---

    @property
    def count(self) -> int:
        """The samples stored so far (the next sample's id)."""
        return self._count

    def add(self, image: Any, label: Any = None, *, path: str | None = None) -> int | None:
        """Store one sample; return its id, or None when it is rejected (see errors.jsonl).

        Args:
            image: encoded image bytes (JPEG, PNG, ... as a build takes files), or a uint8
                ``HxW``, ``HxWx1``, ``HxWx3`` (RGB) or ``HxWx4`` (RGBA) numpy array.
            label: None, an int (a class id), a str, or JSON (lists, dicts); numpy values
                are taken as the Python ones. With ``classes``, a class name or id.
            path: the index's ``path`` of the sample (default: its number among the samples
                given, ``000000000``, ``000000001``, ...).

        Raises:
            SampleTypeError: the image or label is of a kind that cannot be stored.
            InputError: the sample is rejected and ``on_error="fail"``.
        """
        sample = self._sample(image, label, path)
        if isinstance(sample, Problem):
            return self._store(sample, None)
        return self._store(*prepare_sample(sample, self.transform, self.decode_check))

    def add_many(self, samples: Iterable[Any]) -> list[int | None]:
        """`add` each of `samples`: an image, ``(image, label)`` or ``(image, label, path)``.

        With ``workers`` above 1 the samples are checked and encoded in that many processes,
        a few chunks ahead of the writing; the dataset is the same as with `add` one by one.

        Returns:
            Each sample's id, or None where it was rejected.
        """
        if self.workers <= 1:
            return [
                self.add(image, label, path=path) for image, label, path in map(_unpack, samples)
            ]
        if self._pool is None:
            from packer.engines.local import start_pool

            self._pool = start_pool(self.workers)
        ids: list[int | None] = []
        pending: deque[tuple[Any, list[Sample | Problem]]] = deque()
        chunk: list[Sample | Problem] = []

        def send() -> None:
            todo = [s for s in chunk if not isinstance(s, Problem)]
            args = (todo, self.transform, self.decode_check)
            pending.append((self._pool.processes.apply_async(_prepare_chunk, args), chunk))

        def collect() -> None:
            result, given = pending.popleft()
            prepared = iter(result.get())
            for sample in given:
                if isinstance(sample, Problem):
                    ids.append(self._store(sample, None))
                    continue
                item, row = next(prepared)
                if isinstance(item, Record) and not item.data:  # bytes stored as given
                    item = _with_data(item, sample[1])
                ids.append(self._store(item, row))

        for given in samples:
            chunk.append(self._sample(*_unpack(given)))
            if len(chunk) == _CHUNK:
                send()
                chunk = []
                if len(pending) >= self.workers * _IN_FLIGHT:
                    collect()
        if chunk:
            send()
        while pending:
            collect()
        return ids

    def _sample(self, image: Any, label: Any, path: str | None) -> Sample | Problem:
        """The sample to prepare, or the problem of its label; opens the writer if needed."""
        if self._state == "new":
            self.open()
        elif self._state != "open":
            raise WriterStateError(f"the writer of {self.out} is {self._state}; make a new one")
        rel = f"{self._calls:09d}" if path is None else path
        if not isinstance(rel, str):
            raise SampleTypeError(f"add(): path {rel!r} is a {type(rel).__name__}; expected str")
        self._calls += 1
        checked = check_image(image)
        label = check_label(rel, label, self.classes)
        if isinstance(label, Problem):
            return label
        return rel, checked, label

    def _store(self, item: Record | Problem, row: IndexRow | None) -> int | None:
        """Write `item` into the current shard (a new one past shard_size); return its id."""
        if isinstance(item, Record):
            item = self._shard_cls.check(item) or item
        if isinstance(item, Problem):
            if self.config.on_error == "fail":
                raise InputError(item.path, item.reason, item.message)
            self._problems.append(item)
            return None
        part = self._part
        if part is not None and part.count and part.bytes + len(item.data) > self.config.shard_size:
            self._finish_part()
            part = None
        if part is None:
            number = len(self._numbers)
            part = self._part = start_part(self._tmp, number, self._shard_cls, first_id=self._count)
        part.add(item, row)
        self._count += 1
        return self._count - 1

    def _finish_part(self) -> None:
        if self._part is not None:
            self._part.finish([])
            self._numbers.append(self._part.number)
            self._part = None


def _unpack(sample: Any) -> tuple[Any, Any, str | None]:
    """An `add_many` sample as (image, label, path)."""
    if isinstance(sample, tuple):
        if not 1 <= len(sample) <= 3:
            raise SampleTypeError(
                f"add_many(): a sample of {len(sample)} values; expected an image, "
                "(image, label) or (image, label, path)"
            )
        image, label, path = (*sample, None, None)[:3]
        return image, label, path
    return sample, None, None


def _check_classes(classes: Iterable[str] | None) -> list[str] | None:
    """The class names as a list, or a `ConfigError` (not text, or repeated)."""
    if classes is None:
        return None
    if isinstance(classes, str):
        raise ConfigError(f"classes={classes!r}: expected a list of class names, not one str")
    names = list(classes)
    odd = [n for n in names if not isinstance(n, str)]
    if odd:
        raise ConfigError(f"classes: {odd[0]!r} is not a str; class names are text")
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ConfigError(f"classes: {repeated[0]!r} is given twice; class names are unique")
    return names


def check_label(rel: str, label: Any, classes: list[str] | None) -> Any:
    """`label` as stored (numpy values made Python ones, class names made ids), or a Problem.

    A NaN or infinite number, or with `classes` a label that is no class, is a ``bad_label``
    `Problem` (the sample is rejected, as a build rejects it).

    Raises:
        SampleTypeError: the label is not JSON (None, int, float, str, lists, dicts).
    """
    label = _plain_label(label)
    try:
        json.dumps(label, allow_nan=True)
    except (TypeError, ValueError):
        raise SampleTypeError(
            f"add(): the label {label!r} is a {type(label).__name__}; expected None, an "
            "int, a str or JSON (lists, dicts of those)"
        ) from None
    bad = nonfinite_label(label)
    if bad is not None:
        return Problem(rel, P.BAD_LABEL, bad)
    if classes is None or label is None:
        return label
    if isinstance(label, str) and label in classes:
        return classes.index(label)
    if isinstance(label, int) and not isinstance(label, bool) and 0 <= label < len(classes):
        return label
    return Problem(
        rel,
        P.BAD_LABEL,
        f"the label {label!r} is not one of the {len(classes)} classes (a class name or an id "
        f"0..{len(classes) - 1})",
    )


def publish_samples(writer: Writer, numbers: list[int], found: list[Problem]) -> None:
    """Merge the finished shards `numbers` of `writer`, write its files and rename it to OUT.

    `found` are the rejected samples (errors.jsonl); meta.json is written last
    (`finish_output`), then the build directory is renamed to OUT.
    """
    tmp, cfg, shard_cls = (
        temp_dir_for(writer.out),
        writer.config,
        FORMATS[writer.config.format].writer,
    )
    merged = merge_parts(
        tmp, numbers, shard_cls=shard_cls, compressed=writer.transform.compression is not None
    )
    write_durably(tmp / ERRORS_NAME, [_line(p.as_json()) for p in found])
    notes = sorted(merged.notes, key=lambda n: (n["path"], n["reason"]))
    write_durably(tmp / WARNINGS_NAME, [_line(n) for n in notes])
    options = {
        "format": cfg.format,
        "shard_size": cfg.shard_size,
        "decode_check": writer.decode_check,
        "on_error": cfg.on_error,
        **writer.transform.options(),
    }
    digest = hashlib.sha256(
        json.dumps([options, merged.index_sha256], sort_keys=True).encode()
    ).hexdigest()
    meta = make_meta(
        format=cfg.format,
        num_samples=merged.num_samples,
        shards=merged.shards,
        classes=writer.classes,
        label_source="python",
        class_map=None,
        label_kind=merged.label_kind,
        source="packer.Writer",
        options=options,
        tool_version=__version__,
        payload_bytes=merged.payload_bytes,
        num_errors=len(found),
        num_warnings=len(notes),
        index_sha256=merged.index_sha256,
        index_fingerprint=fingerprint(tmp / INDEX_NAME),
        writer=shard_cls.describe(),
        plan_digest=digest,
    )
    finish_output(tmp, writer.out, meta, overwrite=cfg.overwrite)


def _line(obj: dict[str, Any]) -> str:
    """One line of errors.jsonl or warnings.jsonl, as a build writes it."""
    return json.dumps(obj, ensure_ascii=False) + "\n"


def _local_path(out: Any) -> Path:
    """OUT as a local `Path`, or a `ConfigError` (not a path, or a URL)."""
    if not isinstance(out, (str, os.PathLike)):
        raise ConfigError(f"OUT {out!r}: expected a path (str or Path)")
    from readers.remote import is_url

    if is_url(os.fspath(out)):
        raise ConfigError(
            f"OUT {os.fspath(out)}: a Writer writes a local dataset; give a local path "
            "(only packer.build publishes to object storage)"
        )
    return Path(out)
