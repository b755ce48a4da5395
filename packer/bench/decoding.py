"""Decode cost per sample, and what raw+lz4 storage or a JPEG draft would save.

What decoding costs per sample, measured on a fixed sample of a dataset, and what storing raw
pixels compressed (``--encode raw --compress lz4``) or decoding JPEGs at a reduced DCT scale
(``draft=``) would save, so that ``packer bench`` can say which pays and at what size.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from readers.decode import decode_sample, decompress

DEFAULT_SAMPLES = 256
DEFAULT_DRAFT = 256
LOW_SHARE = 0.2
"""Below this share of a sample's time, decoding is not worth storing differently for."""
WORTH = 0.25
"""An option is recommended when it saves at least this share of the decoding time."""
MAX_GROWTH = 3.0
"""Raw pixels that grow the stored bytes more than this give way to another useful option
(``draft=`` keeps the bytes as they are)."""
ROUND_S = 0.5
"""A timing round over the sample longer than this is not repeated (large images)."""
RAW_OPTION = "--encode raw --compress lz4"
_REDUCED = {
    "color": {
        2: "IMREAD_REDUCED_COLOR_2",
        4: "IMREAD_REDUCED_COLOR_4",
        8: "IMREAD_REDUCED_COLOR_8",
    },
    "gray": {
        2: "IMREAD_REDUCED_GRAYSCALE_2",
        4: "IMREAD_REDUCED_GRAYSCALE_4",
        8: "IMREAD_REDUCED_GRAYSCALE_8",
    },
}


@dataclass(frozen=True)
class FormatCost:
    """The measured decode costs of one stored format in the sample (microseconds per sample)."""

    stored: str
    samples: int
    share: float  # of the dataset's samples
    mean_bytes: float
    decode_us: float
    raw_lz4_us: float | None = None  # lz4-decompress + raw read; None: not applicable
    raw_lz4_bytes: float | None = None  # mean compressed size
    draft_us: float | None = None  # JPEG only, with the draft size asked for
    draft_reduced: float = 0.0  # share of this format's samples decoded at a reduced scale


@dataclass(frozen=True)
class DecodeOption:
    """One way of storing or reading the dataset, costed for the whole dataset."""

    name: str  # "--encode raw --compress lz4" or "draft=256"
    decode_us: float  # the dataset's mean decode time per sample with it
    size_ratio: float  # stored bytes with it / stored bytes now


@dataclass
class DecodeReport:
    """The decode section of ``packer bench``: per format costs, options, recommendation."""

    samples: int
    of: int
    mode: str
    draft: int
    formats: list[FormatCost] = field(default_factory=list)
    options: list[DecodeOption] = field(default_factory=list)
    decode_us: float = 0.0  # the dataset's mean decode time per sample now
    sample_us: float | None = None  # CPU time per sample through the loader
    recommendation: str = ""
    note: str = ""

    def as_dict(self) -> dict[str, Any]:
        """Return the section as a JSON-ready dict, with its decode share."""
        out = asdict(self)
        out["decode_share"] = decode_share(self.decode_us, self.sample_us)
        return out

    def text(self) -> str:
        """The section as a small table and the one-line recommendation."""
        head = (
            f"decoding: {self.samples:,} of {self.of:,} samples, decode {self.mode}, "
            "microseconds per sample"
        )
        if not self.formats:
            return "\n".join([head, self.note or "nothing to measure"])
        draft = f"draft={self.draft}"
        table = [["stored", "share", "bytes", "decode", "raw+lz4 (size)", draft]]
        for f in self.formats:
            raw = "-"
            if f.raw_lz4_us is not None and f.raw_lz4_bytes is not None:
                raw = f"{f.raw_lz4_us:,.0f} ({f.raw_lz4_bytes / max(1.0, f.mean_bytes):.2f}x)"
            table.append(
                [
                    f.stored,
                    f"{f.share:.0%}",
                    _size(f.mean_bytes),
                    f"{f.decode_us:,.0f}",
                    raw,
                    "-"
                    if f.draft_us is None
                    else f"{f.draft_us:,.0f} ({f.draft_reduced:.0%} reduced)",
                ]
            )
        widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
        lines = [head]
        for row in table:
            cells = [
                c.ljust(w) if i == 0 else c.rjust(w)
                for i, (c, w) in enumerate(zip(row, widths, strict=True))
            ]
            lines.append("  ".join(cells).rstrip())
        if self.note:
            lines.append(f"note: {self.note}")
        lines.append(self.recommendation)
        return "\n".join(lines)


def _size(nbytes: float) -> str:
    return f"{nbytes / 1e3:,.1f} kB" if nbytes < 1e6 else f"{nbytes / 1e6:,.1f} MB"


def decode_share(decode_us: float, sample_us: float | None) -> float | None:
    """Decoding's share of a sample's time, or None when the sample's time is unknown."""
    if sample_us is None or sample_us <= 0:
        return None
    return min(1.0, decode_us / sample_us)


def advise(options: Sequence[DecodeOption], *, decode_us: float, sample_us: float | None) -> str:
    """The one-line recommendation for the measured costs (pure).

    The option that saves the most decoding time is named, with the time before and after and
    the stored size it costs, when decoding is at least `LOW_SHARE` of a sample's time and the
    option saves at least `WORTH` of the decoding; otherwise the line says why none is. Raw
    pixels that would grow the stored bytes over `MAX_GROWTH` times give way to another
    useful option.
    """
    share = decode_share(decode_us, sample_us)
    lead = (
        f"decoding is {share:.0%} of a sample's time"
        if share is not None
        else f"decoding takes {decode_us:,.0f} us per sample"
    )
    if share is not None and share < LOW_SHARE:
        return f"{lead}: storing or decoding differently would save little"
    useful = [o for o in options if decode_us - o.decode_us >= WORTH * decode_us]
    if not useful:
        return f"{lead}; neither {RAW_OPTION} nor draft= would cut it by {WORTH:.0%}"
    lean = [o for o in useful if o.name != RAW_OPTION or o.size_ratio <= MAX_GROWTH]
    best = min(lean or useful, key=lambda o: o.decode_us)
    if best.name == RAW_OPTION:
        cost = f"at {best.size_ratio:.2f}x the stored size"
    else:
        cost = "with the stored bytes unchanged (JPEGs decoded at a reduced DCT scale)"
    return (
        f"{lead}; {best.name} would cut it from {decode_us:,.0f} us to "
        f"{best.decode_us:,.0f} us per sample {cost}"
    )


def draft_scale(width: int, height: int, draft: int) -> int:
    """Return the DCT scale (1, 2, 4 or 8) the readers' ``draft=`` picks for such a JPEG."""
    from readers.draft import draft_scale as readers_draft_scale

    return readers_draft_scale(int(height), int(width), int(draft))


def _time_per_sample(work: Callable[[int], Any], count: int) -> float:
    """Return the CPU microseconds per call of ``work(k)``, best of up to 3 rounds.

    CPU microseconds per call of ``work(k)`` for k in range(count): the best of up to 3
    rounds (one when a round takes over `ROUND_S`). CPU time, like the loader's per-sample
    figure it is compared with, so that other processes on the machine do not count.
    """
    best = math.inf
    for _ in range(3):
        start = time.process_time()
        for k in range(count):
            work(k)
        took = time.process_time() - start
        best = min(best, took)
        if took > ROUND_S:
            break
    return 1e6 * best / max(1, count)


def _as_stored_raw(image: np.ndarray) -> np.ndarray | None:
    """Return the pixels ``--encode raw`` would store for an image, or None.

    The pixels ``--encode raw`` would store for an image decoded unchanged (OpenCV order):
    uint8, RGB / RGBA / gray; None for depths it does not take as they are (float).
    """
    import cv2

    if image.dtype == np.uint16:
        image = (image >> 8).astype(np.uint8)
    if image.dtype != np.uint8:
        return None
    if image.ndim == 3 and image.shape[2] == 3:
        image = cv2.cvtColor(image, cv2.COLOR_BGR2RGB)
    elif image.ndim == 3 and image.shape[2] == 4:
        image = cv2.cvtColor(image, cv2.COLOR_BGRA2RGBA)
    return np.ascontiguousarray(image if image.ndim == 3 else image[:, :, np.newaxis])


def _raw_lz4(blobs: list[bytes], mode: str) -> tuple[float, float] | None:
    """Time reading back samples stored as lz4-compressed raw pixels.

    (us per sample to read them back, mean compressed bytes) of the samples stored as
    lz4-compressed raw pixels, read the way the datasets read such records.
    """
    import pyarrow as pa

    codec = pa.Codec("lz4")
    stored: list[tuple[bytes, int, int, int]] = []
    for data in blobs:
        pixels = _as_stored_raw(decode_sample(data, "unchanged"))
        if pixels is None:
            return None
        h, w, c = pixels.shape
        stored.append((codec.compress(pixels.tobytes(), asbytes=True), h, w, c))

    def read(k: int) -> Any:
        data, h, w, c = stored[k]
        raw = decompress(data, "lz4", h * w * c)
        return decode_sample(raw, mode, stored="raw", height=h, width=w, channels=c)

    return _time_per_sample(read, len(stored)), float(np.mean([len(s[0]) for s in stored]))


def _draft(
    blobs: list[bytes], dims: list[tuple[int, int]], mode: str, draft: int
) -> tuple[float, float] | None:
    """Time decoding JPEGs at the reduced scale ``draft=`` picks.

    (us per sample, share decoded smaller) of JPEGs decoded with OpenCV's reduced-scale
    flags at the scale ``draft=`` picks; None for a mode without such flags.
    """
    import cv2

    kind = {"rgb": "color", "bgr": "color", "gray": "gray"}.get(mode)
    if kind is None:
        return None
    scales = [draft_scale(w, h, draft) for w, h in dims]
    buffers = [np.frombuffer(b, dtype=np.uint8) for b in blobs]

    def read(k: int) -> Any:
        s = scales[k]
        if s == 1:
            return decode_sample(blobs[k], mode)
        image = cv2.imdecode(buffers[k], getattr(cv2, _REDUCED[kind][s]))
        if image is None:
            raise ValueError("OpenCV could not decode the bytes at a reduced scale")
        if mode == "rgb":
            image = cv2.cvtColor(image, cv2.COLOR_BGR2RGB)
        return image

    return _time_per_sample(read, len(blobs)), float(np.mean([s > 1 for s in scales]))


def sample_ids(n: int, count: int, seed: int = 0) -> np.ndarray:
    """`count` ids of a dataset of `n`, drawn without replacement for `seed`, sorted."""
    rng = np.random.default_rng(seed)
    return np.sort(rng.choice(n, size=min(n, count), replace=False))


def measure_decoding(
    dataset: Any,
    index: Any,
    *,
    samples: int = DEFAULT_SAMPLES,
    draft: int = DEFAULT_DRAFT,
    seed: int = 0,
) -> DecodeReport:
    """Time decoding on `samples` samples of `dataset`, per stored format, and the options.

    Args:
        dataset: an open packed dataset (``read_bytes``, ``decode_stored``, ``decode``).
        index: its index loaded with the ``format``, ``width`` and ``height`` columns.
        samples: how many samples to measure (a fixed draw for `seed`).
        draft: the shorter side ``draft=`` is costed at.
        seed: the draw.
    """
    mode = str(dataset.decode)
    n = len(dataset)
    report = DecodeReport(samples=0, of=n, mode=mode, draft=draft)
    if mode == "bytes":
        report.note = "decode bytes: the loader decodes nothing"
        return report
    stored = [str(x) for x in index.extra["format"].to_pylist()]
    ids = sample_ids(n, samples, seed)
    report.samples = int(ids.size)
    width, height = index.extra["width"], index.extra["height"]
    counts: dict[str, int] = {}
    for name in stored:
        counts[name] = counts.get(name, 0) + 1
    groups: dict[str, list[int]] = {}
    for i in ids.tolist():
        groups.setdefault(stored[i], []).append(i)
    for name, members in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        blobs = [dataset.read_bytes(i) for i in members]

        def decode(k: int, b: list[bytes] = blobs, m: list[int] = members) -> Any:
            return dataset.decode_stored(b[k], m[k])

        decode_us = _time_per_sample(decode, len(members))
        raw = None if name == "raw" else _raw_lz4(blobs, mode)
        drafted = None
        if name == "jpeg":
            dims = [(int(width[i]), int(height[i])) for i in members]
            drafted = _draft(blobs, dims, mode, draft)
        report.formats.append(
            FormatCost(
                stored=name,
                samples=len(members),
                share=counts[name] / n,
                mean_bytes=float(np.mean([len(b) for b in blobs])),
                decode_us=decode_us,
                raw_lz4_us=None if raw is None else raw[0],
                raw_lz4_bytes=None if raw is None else raw[1],
                draft_us=None if drafted is None else drafted[0],
                draft_reduced=0.0 if drafted is None else drafted[1],
            )
        )
    report.decode_us, report.options = cost_options(report.formats, draft=draft)
    return report


def cost_options(formats: Sequence[FormatCost], *, draft: int) -> tuple[float, list[DecodeOption]]:
    """Return the dataset's mean decode time now and with each option.

    The dataset's mean decode time now, and with each option (weighted by the formats'
    shares of the dataset); an option that applies to no format is left out.
    """
    total = sum(f.share for f in formats) or 1.0
    now = sum(f.share * f.decode_us for f in formats) / total
    options = []
    if any(f.raw_lz4_us is not None for f in formats):
        us = sum(f.share * (f.decode_us if f.raw_lz4_us is None else f.raw_lz4_us) for f in formats)
        before = sum(f.share * f.mean_bytes for f in formats)
        after = sum(
            f.share * (f.mean_bytes if f.raw_lz4_bytes is None else f.raw_lz4_bytes)
            for f in formats
        )
        options.append(DecodeOption(RAW_OPTION, us / total, after / max(1e-9, before)))
    if any(f.draft_us is not None and f.draft_reduced > 0 for f in formats):
        us = sum(f.share * (f.decode_us if f.draft_us is None else f.draft_us) for f in formats)
        options.append(DecodeOption(f"draft={draft}", us / total, 1.0))
    return now, options
