"""``packer info OUT --html FILE``: one self-contained HTML page about a dataset.

Nothing on the page is fetched: styles are inline, histograms are inline SVG, thumbnails are
JPEG ``data:`` URIs. The cost is bounded for any size of dataset: the histograms come from the
index columns (numpy), the thumbnails from a fixed number of samples per class (spread evenly
over the class's ids, so the same dataset always gives the same page) and a capped number of
classes, and the error and warning tables from one streaming pass with capped rows.

The page never costs a dataset: `write_html` refuses a FILE inside the dataset it describes or
inside any other packer dataset (a directory with packer's ``meta.json``), a FILE that is not
a regular file or is named as a dataset's file is (``data.mdb``, ``*.rec``, ...), and a FILE
with more than one hard link (``merge`` links shards between
datasets); it writes a temporary file beside FILE and renames it over FILE.
"""

from __future__ import annotations

import base64
import html
import json
import os
import secrets
import stat
from collections import Counter
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from packer.errors import PackerError
from packer.info import describe
from packer.metadata import shard_disk_bytes
from readers.durable import fsync_path, write_new_file
from readers.errors import RecordError
from readers.formats import FORMATS
from readers.formats.layout import ERRORS_NAME, INDEX_NAME, META_NAME, WARNINGS_NAME
from readers.index import DatasetIndex, load_index

THUMBS_PER_CLASS = 8
MAX_THUMB_CLASSES = 60
THUMB_SIDE = 96
MAX_LABEL_BARS = 60
MAX_PROBLEM_ROWS = 50
BINS = 30

_CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0;
background:#f4f5f7;color:#1d2330}
header{background:#1d2330;color:#fff;padding:20px 32px}
header h1{margin:0 0 4px;font-size:22px}header p{margin:0;color:#b8c0d0}
main{padding:12px 32px 40px;max-width:1180px}
section{background:#fff;border-radius:10px;padding:16px 20px;margin:16px 0;
box-shadow:0 1px 3px rgba(0,0,0,.08)}
h2{margin:0 0 12px;font-size:17px}h3{margin:14px 0 6px;font-size:14px;color:#445}
.cards{display:flex;flex-wrap:wrap;gap:12px}
.card{background:#f4f5f7;border-radius:8px;padding:10px 14px;min-width:120px}
.card b{display:block;font-size:20px}.card span{color:#667;font-size:12px}
.hists{display:flex;flex-wrap:wrap;gap:18px}
.thumbs{display:flex;flex-wrap:wrap;gap:6px;margin-bottom:8px}
.thumbs figure{margin:0;width:96px;text-align:center}
.thumbs img{width:96px;height:96px;object-fit:contain;background:#eef0f3;border-radius:4px}
.thumbs figcaption{font-size:10px;color:#667;overflow:hidden;white-space:nowrap;
text-overflow:ellipsis}
table{border-collapse:collapse;width:100%;font-size:13px}
th,td{text-align:left;padding:4px 8px;border-bottom:1px solid #e4e7ec;vertical-align:top}
table.narrow{width:auto;min-width:260px;margin-bottom:8px}th{background:#f4f5f7}td.n{text-align:right;font-variant-numeric:tabular-nums}
.note{color:#667}.bad{color:#b42318}.warn{color:#a15c07}
"""


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _bars_svg(labels: list[str], counts: list[int], *, width: int = 1060) -> str:
    """A horizontal bar chart: one row per label."""
    row, left = 18, min(260, 12 + 7 * max((len(s) for s in labels), default=4))
    top = max(counts, default=0) or 1
    parts = [f'<svg width="{width}" height="{row * len(labels) + 4}" role="img">']
    for k, (name, count) in enumerate(zip(labels, counts, strict=True)):
        y = k * row + 2
        w = max(1.0, (width - left - 90) * count / top)
        parts.append(
            f'<text x="{left - 6}" y="{y + 13}" text-anchor="end" font-size="12">{_e(name[:36])}'
            f'</text><rect x="{left}" y="{y + 2}" width="{w:.1f}" height="{row - 5}" rx="2" '
            f'fill="#3b6fd8"/><text x="{left + w + 5:.1f}" y="{y + 13}" font-size="12" '
            f'fill="#445">{count:,}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)


def _num(x: float) -> str:
    """A histogram edge as a person reads it: 1,280 rather than 1.28e+03, 1.33 for an aspect."""
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"


def _hist_svg(title: str, values: np.ndarray, *, log: bool = False) -> str:
    """A column histogram of `values` (log-spaced bins when `log`), with its range below."""
    w, h, pad = 340, 170, 28
    values = values[np.isfinite(values)]
    if values.size == 0:
        return f"<div><h3>{_e(title)}</h3><p class=note>no values</p></div>"
    lo, hi = float(values.min()), float(values.max())
    if hi <= lo:
        hi = lo + 1
    edges = np.geomspace(lo, hi, BINS + 1) if log and lo > 0 else np.linspace(lo, hi, BINS + 1)
    counts, _ = np.histogram(values, bins=edges)
    top = int(counts.max()) or 1
    bw = (w - 2) / BINS
    parts = [
        f"<div><h3>{_e(title)}</h3>"
        f'<svg width="{w}" height="{h + pad}" role="img">'
        f'<line x1="0" y1="{h}" x2="{w}" y2="{h}" stroke="#99a"/>'
    ]
    for k, c in enumerate(counts.tolist()):
        bh = (h - 8) * c / top
        parts.append(
            f'<rect x="{1 + k * bw:.1f}" y="{h - bh:.1f}" width="{bw - 1:.1f}" height="{bh:.1f}" '
            f'fill="#2f9e77"><title>{_num(edges[k])}..{_num(edges[k + 1])}: {c:,}</title></rect>'
        )
    parts.append(
        f'<text x="0" y="{h + 16}" font-size="11" fill="#556">{_num(lo)}</text>'
        f'<text x="{w}" y="{h + 16}" font-size="11" fill="#556" text-anchor="end">{_num(hi)}</text>'
        f'<text x="{w / 2}" y="{h + 16}" font-size="11" fill="#556" text-anchor="middle">'
        f"tallest bar {top:,}</text></svg></div>"
    )
    return "".join(parts)


def pick_thumbnails(index: DatasetIndex, classes: list[str] | None) -> list[tuple[str, np.ndarray]]:
    """Per class (or one group when labels are not class ids): the sample ids to show.

    At most `THUMBS_PER_CLASS` ids spread evenly over the class's ids, for the first
    `MAX_THUMB_CLASSES` classes by id: the same dataset always gives the same choice.
    """
    ints = index.labels.as_ints()
    if ints is None or len(ints) == 0:
        n = len(index)
        return [("all samples", _spread(np.arange(n)))] if n else []
    order = np.argsort(ints, kind="stable")
    ordered = ints[order]
    cuts = np.flatnonzero(ordered[1:] != ordered[:-1]) + 1
    picked = []
    for ids in np.split(order, cuts)[:MAX_THUMB_CLASSES]:
        value = int(ints[ids[0]])
        name = classes[value] if classes and 0 <= value < len(classes) else str(value)
        picked.append((f"{name} ({len(ids):,})", _spread(ids)))
    return picked


def _spread(ids: np.ndarray) -> np.ndarray:
    if len(ids) <= THUMBS_PER_CLASS:
        return ids
    picked: np.ndarray = ids[np.linspace(0, len(ids) - 1, THUMBS_PER_CLASS).round().astype(int)]
    return picked


def thumbnail_uri(ds: Any, i: int) -> str:
    """Sample `i` of the dataset `ds` (opened with ``decode="bytes"``) as a JPEG data URI.

    Raises:
        ValueError: the record does not decode.
    """
    data = ds.read_bytes(i)
    image = np.asarray(ds.decode_stored(data, i, "bgr"))
    full = np.asarray(ds.decode_stored(data, i, "unchanged"))
    if full.ndim == 3 and full.shape[2] == 4 and full.shape[:2] == image.shape[:2]:
        # on a light background, as a viewer shows it: BGR alone is often black there
        alpha = full[:, :, 3:4].astype(np.float32) / np.float32(np.iinfo(full.dtype).max)
        image = (image * alpha + 255 * (1 - alpha)).astype(np.uint8)
    h, w = image.shape[:2]
    scale = THUMB_SIDE / max(h, w)
    if scale < 1:
        size = (max(1, round(w * scale)), max(1, round(h * scale)))
        image = cv2.resize(image, size, interpolation=cv2.INTER_AREA)
    ok, buf = cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, 85])
    if not ok:
        raise ValueError("OpenCV could not encode the thumbnail")
    return "data:image/jpeg;base64," + base64.b64encode(buf.tobytes()).decode("ascii")


def _read_problems(path: Path) -> tuple[Counter[str], list[dict[str, Any]], int]:
    """Counts by reason, the first rows, and the number of lines of a problems JSONL file."""
    reasons: Counter[str] = Counter()
    rows: list[dict[str, Any]] = []
    total = 0
    if not path.is_file():
        return reasons, rows, total
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            try:
                obj = json.loads(line)
            except ValueError:
                obj = {"path": "?", "reason": "unparsable line", "message": line.strip()[:200]}
            if not isinstance(obj, dict):
                continue
            total += 1
            reasons[str(obj.get("reason"))] += 1
            if len(rows) < MAX_PROBLEM_ROWS:
                rows.append(obj)
    return reasons, rows, total


def _problems_html(title: str, path: Path, css: str) -> str:
    reasons, rows, total = _read_problems(path)
    if not total:
        return f"<h3>{_e(title)}</h3><p class=note>none ({_e(path.name)} is empty)</p>"
    out = [
        f"<h3 class={css}>{_e(title)}: {total:,}</h3>"
        "<table class=narrow><tr><th>reason</th><th>count</th>"
    ]
    out += [f"<tr><td>{_e(r)}</td><td class=n>{c:,}</td></tr>" for r, c in reasons.most_common()]
    out.append("</table><table><tr><th>path</th><th>reason</th><th>message</th></tr>")
    out += [
        f"<tr><td>{_e(r.get('path'))}</td><td>{_e(r.get('reason'))}</td>"
        f"<td>{_e(r.get('message', ''))}</td></tr>"
        for r in rows
    ]
    out.append("</table>")
    if total > len(rows):
        out.append(f"<p class=note>first {len(rows)} of {total:,}; all in {_e(path.name)}</p>")
    return "".join(out)


def _ids(shard: dict[str, Any]) -> str:
    first, count = shard.get("first"), shard.get("count")
    if isinstance(first, int) and isinstance(count, int):
        return f"{first:,}..{first + count - 1:,}"
    return _e(first)


def render_html(path: str | Path) -> str:
    """The page for the dataset at `path`.

    Raises:
        ReaderError: the dataset cannot be opened.
    """
    root = Path(path)
    s = describe(root)
    index = load_index(root, extra=("width", "height", "path"))
    n = len(index)
    cards = [
        ("samples", f"{n:,}"),
        ("shards", f"{s['num_shards']:,}"),
        ("classes", f"{len(s['classes']):,}" if s["classes"] else "-"),
        ("images", f"{s['payload_bytes'] / 1e6:,.1f} MB"),
        ("skipped inputs", f"{s['num_errors'] if s['num_errors'] is not None else '?'}"),
        ("format", str(s["format"])),
    ]
    body = [
        "<section id=summary><h2>Summary</h2><div class=cards>",
        *[f"<div class=card><b>{_e(v)}</b><span>{_e(k)}</span></div>" for k, v in cards],
        "</div>",
    ]
    if n:
        body.append(
            f"<p>width {s['width'][0]}..{s['width'][1]} px, height {s['height'][0]}.."
            f"{s['height'][1]} px; channels "
            + ", ".join(f"{k}: {v:,}" for k, v in s["channels"].items())
            + "; stored as "
            + ", ".join(f"{_e(k)} {v:,}" for k, v in s["image_formats"].items())
            + f"; labels from {_e(s['label_source'])}</p>"
        )
    body.append("</section><section id=labels><h2>Labels</h2>")
    labels = s["labels"]
    if "kind" in labels:
        body.append(f"<p class=note>{_e(labels['kind'])} labels (not class ids): no histogram</p>")
    else:
        names, counts = list(labels)[:MAX_LABEL_BARS], list(labels.values())[:MAX_LABEL_BARS]
        body.append(_bars_svg(names, counts))
        if len(labels) > MAX_LABEL_BARS:
            body.append(f"<p class=note>first {MAX_LABEL_BARS} of {len(labels):,} classes</p>")
    body.append("</section><section id=sizes><h2>Image sizes</h2><div class=hists>")
    if n:
        width = index.extra["width"].astype(np.float64)
        height = index.extra["height"].astype(np.float64)
        with np.errstate(divide="ignore", invalid="ignore"):
            aspect = width / height
        body += [
            _hist_svg("width (px)", width),
            _hist_svg("height (px)", height),
            _hist_svg("aspect (width / height, log bins)", aspect, log=True),
        ]
    else:
        body.append("<p class=note>no samples</p>")
    body.append("</div></section>")
    body.append(_thumbnails_html(index, s["classes"]))
    body.append("<section id=problems><h2>Errors and warnings</h2>")
    body.append(_problems_html("Skipped inputs (errors)", root / ERRORS_NAME, "bad"))
    body.append(_problems_html("Packed with a caveat (warnings)", root / WARNINGS_NAME, "warn"))
    body.append("</section><section id=shards><h2>Shards</h2><table><tr><th>shard</th>")
    body.append("<th>ids</th><th>samples</th><th>size</th></tr>")
    for shard in s["shards"]:
        disk = shard_disk_bytes(shard)
        body.append(
            f"<tr><td>{_e(shard.get('name'))}</td><td>{_ids(shard)}</td>"
            f"<td class=n>{_e(shard.get('count'))}</td><td class=n>"
            f"{'?' if disk is None else f'{disk / 1e6:,.1f} MB'}</td></tr>"
        )
    body.append("</table></section>")
    title = f"{root.name}: packer dataset"
    return (
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{_e(title)}</title>'
        f"<style>{_CSS}</style></head><body><header><h1>{_e(root.name)}</h1>"
        f"<p>{_e(s['path'])} &middot; {_e(s['format'])} &middot; created {_e(s['created'])}"
        f"</p></header><main>{''.join(body)}</main></body></html>\n"
    )


def _thumbnails_html(index: DatasetIndex, classes: list[str] | None) -> str:
    picked = pick_thumbnails(index, classes)
    out = [
        "<section id=thumbnails><h2>Samples per class</h2>"
        f"<p class=note>up to {THUMBS_PER_CLASS} per class, spread evenly over its ids</p>"
    ]
    if not picked:
        out.append("<p class=note>no samples</p>")
    ds = None
    if picked:
        from readers._paddle import open_for_bytes  # with or without paddle installed

        ds = open_for_bytes(index.root)
    for name, ids in picked:
        out.append(f"<h3>{_e(name)}</h3><div class=thumbs>")
        for i in ids.tolist():
            path = index.extra["path"][i].as_py()
            try:
                uri = thumbnail_uri(ds, i)
            except (ValueError, RecordError) as exc:  # a bad record is shown, not fatal
                out.append(f"<figure class=bad>#{i}: cannot show ({_e(exc)})</figure>")
                continue
            out.append(
                f'<figure><img src="{uri}" alt="{_e(path)}" title="#{i} {_e(path)}">'
                f"<figcaption>#{i} {_e(Path(str(path)).name)}</figcaption></figure>"
            )
        out.append("</div>")
    ints = index.labels.as_ints()
    if ints is not None and len(np.unique(ints)) > MAX_THUMB_CLASSES:
        out.append(f"<p class=note>the first {MAX_THUMB_CLASSES} classes by id</p>")
    out.append("</section>")
    return "".join(out)


# names of the files a dataset is made of (ours, a bare LMDB, RecordIO or WebDataset shards)
_DATASET_FILES = frozenset({META_NAME, INDEX_NAME, "index.parquet", ERRORS_NAME, WARNINGS_NAME})
_DATASET_SUFFIXES = frozenset({".mdb", ".rec", ".idx", ".tar", ".parquet"})


class HtmlTargetError(PackerError):
    """``--html FILE`` names a file that writing the page would cost (a dataset's file)."""

    def __init__(self, file: Path, problem: str) -> None:
        super().__init__(
            f"--html {file}: {problem}; nothing was written. Choose a new file outside every "
            "dataset directory, such as report.html in the current directory"
        )


def _is_dataset_dir(directory: str) -> bool:
    """Whether `directory` holds a packer dataset: packer's meta.json, or one beside an index."""
    meta = os.path.join(directory, META_NAME)
    if not os.path.isfile(meta):
        return False
    if os.path.exists(os.path.join(directory, INDEX_NAME)):
        return True
    try:
        with open(meta, "rb") as f:
            obj = json.loads(f.read().decode("utf-8"))
    except (OSError, ValueError, RecursionError):
        return False
    return isinstance(obj, dict) and obj.get("format") in FORMATS


def check_html_target(file: Path, dataset: Path) -> None:
    """Refuse an `file` that writing the page of `dataset` would destroy.

    Raises:
        HtmlTargetError: `file` lies inside `dataset` or inside any packer dataset (its real
            parent directory or one above it holds packer's meta.json), is not a regular file,
            exists and is named as a dataset's file is (``data.mdb``, ``*.rec``, ...), or has
            more than one hard link.
    """
    parent = os.path.realpath(file.parent)
    inside = os.path.realpath(dataset)
    if parent == inside or parent.startswith(inside.rstrip(os.sep) + os.sep):
        raise HtmlTargetError(file, f"lies inside the dataset {dataset} it describes")
    directory = parent
    while True:
        if _is_dataset_dir(directory):
            raise HtmlTargetError(file, f"lies inside the packer dataset {directory}")
        up = os.path.dirname(directory)
        if up == directory:
            break
        directory = up
    try:
        st = os.lstat(file)
    except FileNotFoundError:
        st = None
    if st is not None and not stat.S_ISREG(st.st_mode) and not stat.S_ISLNK(st.st_mode):
        raise HtmlTargetError(file, "exists and is not a regular file")
    if st is not None and (file.name in _DATASET_FILES or file.suffix in _DATASET_SUFFIXES):
        raise HtmlTargetError(file, "exists and is named as a dataset's file is")
    if st is not None and st.st_nlink > 1:
        raise HtmlTargetError(
            file,
            f"has {st.st_nlink} hard links (a shard that packer merge linked into two "
            "datasets looks like this), so writing it would change another file too",
        )


def write_html(path: str | Path, file: str | Path) -> Path:
    """Write the page for the dataset at `path` to `file` (UTF-8); return `file`.

    The page goes to a new temporary file beside `file`, which is fsynced and renamed over
    `file`: a reader of `file` sees the old page or the new one.

    Raises:
        HtmlTargetError: see `check_html_target` (checked before the dataset is read).
        ReaderError: the dataset cannot be opened.
        OSError: `file` cannot be written.
    """
    file = Path(file)
    check_html_target(file, Path(path))
    data = render_html(path).encode("utf-8")
    tmp = file.parent / f".{file.name}.{secrets.token_hex(4)}.tmp"
    try:
        write_new_file(tmp, data)
        check_html_target(file, Path(path))  # again: the page took a while to render
        os.replace(tmp, file)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_path(file.parent)
    return file
