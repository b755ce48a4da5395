"""Label sources: class folders by depth, list files, .lst, manifests, sidecars, class maps."""

from __future__ import annotations

import csv
import io
import json
import tempfile
import tracemalloc
from pathlib import Path

import lmdb
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from packer import problems as P
from packer.build import build
from packer.cli import app
from packer.config import BuildConfig
from packer.errors import ConfigError, LabelSourceError
from packer.labels import (
    UNKNOWN_CLASS,
    csv_rows_arrow,
    csv_rows_python,
    plan_labels,
)
from packer.labels.common import MAX_LINE_BYTES, LongLine, numbered_lines
from readers.formats.lmdb import label_key
from tests.conftest import encode, make_image

REASONS = {
    v for k, v in vars(P).items() if k.isupper() and isinstance(v, str) and not k.startswith("_")
} | {UNKNOWN_CLASS}


def put_images(src: Path, *rels: str, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    for n, rel in enumerate(rels):
        path = src / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        ext = ".jpg" if rel.endswith(".jpg") else ".png"
        path.write_bytes(encode(make_image(rng, 8 + n, 6), ext))


def index_rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "index.jsonl").read_text().splitlines()]


def labels_of(out: Path) -> dict[str, object]:
    return {r["path"]: r["label"] for r in index_rows(out)}


def errors_of(out: Path) -> dict[str, str]:
    lines = (out / "errors.jsonl").read_text().splitlines()
    return {e["path"]: e["reason"] for e in map(json.loads, lines)}


def meta_of(out: Path) -> dict:
    return json.loads((out / "meta.json").read_text())


def plan_reasons(plan) -> dict[str, str]:
    return {p.path: p.reason for p in plan.problems}


def plan_labelled(plan) -> dict[str, object]:
    return {e.file.rel: e.label for e in plan.entries if e.labelled}


# --------------------------------------------------------------------------- dirname


def test_label_depth_names_classes_by_nested_folders(tmp_path):
    src = tmp_path / "src"
    put_images(
        src,
        "animals/cat/a.png",
        "animals/cat/deeper/b.png",
        "animals/dog/c.jpg",
        "animals/stray.png",
        "plants/fern/d.png",
        "top.png",
    )
    (src / "plants" / "moss").mkdir()  # empty: still a class, so ids do not depend on content
    (src / "plants" / ".hidden").mkdir()
    out = tmp_path / "out"
    build(BuildConfig(src=src, out=out, labels="dirname", label_depth=2))
    classes = ["animals/cat", "animals/dog", "plants/fern", "plants/moss"]
    meta = meta_of(out)
    assert meta["classes"] == classes
    assert meta["class_map"] == "auto"
    assert meta["label_source"] == "dirname"
    assert meta["options"]["label_depth"] == 2
    assert labels_of(out) == {
        "animals/cat/a.png": 0,
        "animals/cat/deeper/b.png": 0,
        "animals/dog/c.jpg": 1,
        "plants/fern/d.png": 2,
    }
    assert errors_of(out) == {"animals/stray.png": "no_label", "top.png": "no_label"}


def test_label_depth_notes_and_not_image_before_no_label(tmp_path):
    src = tmp_path / "src"
    put_images(src, "a/b/x.png", "a/y.png")
    (src / "a" / "junk.bin").write_bytes(b"not an image")
    plan = plan_labels(src, "auto", depth=2)
    unlabelled = {e.file.rel: e.note for e in plan.entries if not e.labelled}
    assert set(unlabelled) == {"a/junk.bin", "a/y.png"}
    assert "--label-depth 2" in unlabelled["a/y.png"]
    out = tmp_path / "out"
    build(BuildConfig(src=src, out=out, label_depth=2))
    assert errors_of(out) == {"a/junk.bin": "not_image", "a/y.png": "no_label"}


def test_label_depth_deeper_than_the_tree_is_refused(tmp_path):
    src = tmp_path / "src"
    put_images(src, "a/x.png", "b/y.png")
    with pytest.raises(LabelSourceError, match=r"no folders 2 levels under .*\['a', 'b'\]"):
        plan_labels(src, "dirname", depth=2)
    with pytest.raises(LabelSourceError, match="has no class folders"):
        plan_labels(tmp_path / "src" / "a", "dirname")


def test_label_depth_and_label_options_are_validated(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    with pytest.raises(ConfigError, match="--label-depth 0: must be at least 1"):
        BuildConfig(src=src, out=tmp_path / "o", label_depth=0)
    with pytest.raises(ConfigError, match="--label-depth 2 applies to class folders"):
        BuildConfig(src=src, out=tmp_path / "o", labels="list.txt", label_depth=2)
    with pytest.raises(ConfigError, match="--labels sidecar cannot be combined"):
        BuildConfig(src=src, out=tmp_path / "o", labels=("sidecar", "a.txt"))
    with pytest.raises(ConfigError, match="no labels to map"):
        BuildConfig(src=src, out=tmp_path / "o", labels="none", class_map="auto")
    with pytest.raises(LabelSourceError, match="--labels dirname cannot be combined"):
        plan_labels(src, ["a.txt", "dirname"])
    cfg = BuildConfig(src=src, out=tmp_path / "o", labels=["a.txt"])
    assert cfg.labels == "a.txt"
    assert cfg.label_specs == ("a.txt",)
    cfg = BuildConfig(src=src, out=tmp_path / "o", labels=["a.txt", "b.csv"], class_map="auto")
    assert cfg.options()["labels"] == ["a.txt", "b.csv"]
    assert cfg.options()["class_map"] == "auto"


# --------------------------------------------------------------------------- list files


def test_several_paddleocr_lists_merge_and_report_duplicates(tmp_path):
    src = tmp_path / "src"
    put_images(src, "img/1.png", "img/2.png", "img/3.png", "img/4.png")
    a, b = tmp_path / "train_a.txt", tmp_path / "train_b.txt"
    a.write_text("img/1.png\tHELLO\nimg/2.png\twörld 12\n")
    b.write_text("./img/3.png\t007\nimg/1.png\tagain\nimg/4.png\t42\nimg/5.png\tgone\n")
    out = tmp_path / "out"
    build(BuildConfig(src=src, out=out, labels=(str(a), str(b))))
    assert labels_of(out) == {
        "img/1.png": "HELLO",
        "img/2.png": "wörld 12",
        "img/3.png": "007",  # not canonical: kept as text, never altered to 7
        "img/4.png": 42,
    }
    assert errors_of(out) == {"img/1.png": "duplicate", "img/5.png": "missing"}
    errors = [json.loads(x) for x in (out / "errors.jsonl").read_text().splitlines()]
    dup = next(e for e in errors if e["reason"] == "duplicate")
    assert dup["message"] == (
        "listed again at train_b.txt:2 (first at train_a.txt:1); the first entry is packed"
    )
    missing = next(e for e in errors if e["reason"] == "missing")
    assert missing["message"].endswith("(train_b.txt:4)")
    meta = meta_of(out)
    assert meta["label_source"] == f"list:{a}, list:{b}"
    assert meta["classes"] is None
    assert meta["class_map"] is None
    assert meta["options"]["labels"] == [str(a), str(b)]


def test_list_lines_split_only_on_newline(tmp_path):
    src = tmp_path / "src"
    put_images(src, "a.png", "b.png")
    listing = src / "l.txt"  # found relative to SRC too
    listing.write_bytes("a.png\tone\u2028two\x0cthree\r\nb.png\t\n".encode())
    plan = plan_labels(src, "l.txt")
    assert plan_labelled(plan) == {"a.png": "one\u2028two\x0cthree"}
    unlabelled = [e for e in plan.entries if not e.labelled]
    assert [(e.file.rel, e.note) for e in unlabelled] == [("b.png", "an empty label at l.txt:2")]


def test_paddleclas_lists_single_and_multi_label(tmp_path):
    src = tmp_path / "src"
    put_images(src, "a.png", "b.png", "c.png", "d.png")
    single = tmp_path / "single.txt"
    single.write_text("a.png 3\nb.png 0\n# a comment\n\nc.png 11\n")
    assert plan_labelled(plan_labels(src, str(single))) == {"a.png": 3, "b.png": 0, "c.png": 11}
    multi = tmp_path / "multi.txt"
    multi.write_text("a.png\t1,4,7\nb.png\t0,0,1,0\nc.png\t3\nd.png\t2, 5\n")
    plan = plan_labels(src, str(multi))
    assert plan_labelled(plan) == {
        "a.png": [1, 4, 7],
        "b.png": [0, 0, 1, 0],
        "c.png": [3],
        "d.png": [2, 5],
    }
    assert plan.extra["kinds"] == ["multilabel"]
    assert plan.source == f"list:{multi}"
    # OCR text that merely looks numeric stays text when the file is not all int lists
    ocr = tmp_path / "ocr.txt"
    ocr.write_text("a.png\t1,000\nb.png\tTOTAL\nc.png\t12\n")
    assert plan_labelled(plan_labels(src, str(ocr))) == {
        "a.png": "1,000",
        "b.png": "TOTAL",
        "c.png": 12,
    }


def test_paddleocr_detection_labels_are_structured(tmp_path):
    src = tmp_path / "src"
    put_images(src, "det/a.jpg", "det/b.jpg", "det/c.jpg", "det/d.jpg")
    boxes = [{"transcription": "SALE", "points": [[1, 2], [30, 2], [30, 9], [1, 9]]}]
    det = tmp_path / "det_gt.txt"
    det.write_text(
        f"det/a.jpg\t{json.dumps(boxes)}\n"
        "det/b.jpg\t[]\n"
        'det/c.jpg\t[{"transcription": "x", "points": [[1, 2]\n'
        "det/d.jpg\tplain text\n"
    )
    out = tmp_path / "out"
    build(BuildConfig(src=src, out=out, labels=str(det)))
    assert labels_of(out) == {"det/a.jpg": boxes, "det/b.jpg": []}
    lines = (out / "errors.jsonl").read_text().splitlines()
    errors = {e["path"]: e for e in map(json.loads, lines)}
    assert {k: v["reason"] for k, v in errors.items()} == {
        "det_gt.txt:3": "bad_line",
        "det_gt.txt:4": "bad_line",
    }
    assert errors["det_gt.txt:3"]["message"].startswith(
        f"{det}:3: a PaddleOCR detection label that is not valid JSON"
    )
    assert "expected a JSON list of regions" in errors["det_gt.txt:4"]["message"]
    env = lmdb.open(str(out / "shard-00000"), readonly=True, lock=False)
    with env.begin() as txn:
        assert json.loads(txn.get(label_key(1))) == boxes
    env.close()
    assert meta_of(out)["label_kind"] == "json"


def test_im2rec_lst(tmp_path):
    src = tmp_path / "src"
    put_images(src, "a.png", "b.png", "c.png", "d.png")
    lst = tmp_path / "train.lst"
    lst.write_text(
        "0\t3.000000\ta.png\n"
        "1\t1.000000\t2.500000\tb.png\n"
        "2\t1\t2\tc.png\n"
        "3\tnan\td.png\n"
        "x\t1\td.png\n"
        "4\td.png\n"
    )
    plan = plan_labels(src, str(lst))
    assert plan_labelled(plan) == {"a.png": 3, "b.png": [1.0, 2.5], "c.png": [1, 2]}
    assert plan.source == f"lst:{lst}"
    bad = {p.path: p.message for p in plan.problems}
    assert set(bad) == {"train.lst:4", "train.lst:5", "train.lst:6"}
    assert all(p.reason == "bad_line" for p in plan.problems)
    assert bad["train.lst:6"].startswith(f"{lst}:6: expected 'index<TAB>label<TAB>...<TAB>path'")
    # the same lines in a .txt are recognised as im2rec by their content
    txt = tmp_path / "train.txt"
    txt.write_text("0\t3.000000\ta.png\n1\t4\tb.png\n")
    plan = plan_labels(src, str(txt))
    assert plan_labelled(plan) == {"a.png": 3, "b.png": 4}
    assert plan.source == f"lst:{txt}"


def test_lst_labels_go_into_recordio_headers(tmp_path):
    from readers.formats.recordio import read_record_at, unpack_image_record

    src = tmp_path / "src"
    put_images(src, "a.png", "b.png")
    lst = tmp_path / "x.lst"
    lst.write_text("0\t5\ta.png\n1\t1\t0.5\tb.png\n")
    out = tmp_path / "out.rec"
    build(BuildConfig(src=src, out=out, labels=str(lst), format="recordio"))
    assert labels_of(out) == {"a.png": 5, "b.png": [1.0, 0.5]}
    data = (out / "shard-00000.rec").read_bytes()
    stored = []
    for row in index_rows(out):
        payload, _ = read_record_at(data, row["offset"])
        header, label, _ = unpack_image_record(payload)
        stored.append((header.flag, np.atleast_1d(label).tolist()))
    assert stored == [(0, [5.0]), (2, [1.0, 0.5])]


# --------------------------------------------------------------------------- manifests


def test_jsonl_manifest_keeps_any_json_label(tmp_path):
    src = tmp_path / "src"
    put_images(src, "a.png", "b.png", "c.png", "d.png", "e.png", "f.png")
    boxes = [{"bbox": [1, 2, 3, 4], "category": "cat"}, {"bbox": [0.5, 1, 2, 2]}]
    manifest = tmp_path / "m.jsonl"
    manifest.write_text(
        "\n".join(
            [
                json.dumps({"path": "a.png", "label": 3, "extra": "ignored"}),
                json.dumps({"path": "b.png", "label": "a caption"}),
                json.dumps({"path": "c.png", "label": boxes}),
                json.dumps({"path": "d.png", "label": None}),
                '{"path": "e.png", "label": NaN}',
                '{"path": "e.png", "label": ',
                "[1, 2]",
                json.dumps({"label": 1}),
                json.dumps({"path": "f.png", "label": {"w": 1.5}}),
            ]
        )
        + "\n"
    )
    out = tmp_path / "out"
    build(BuildConfig(src=src, out=out, labels=str(manifest)))
    assert labels_of(out) == {"a.png": 3, "b.png": "a caption", "c.png": boxes, "f.png": {"w": 1.5}}
    errors = [json.loads(x) for x in (out / "errors.jsonl").read_text().splitlines()]
    got = {e["path"]: (e["reason"], e["message"]) for e in errors}
    assert got["d.png"][0] == "no_label"
    assert "e.png" not in got
    assert got["m.jsonl:5"] == (
        "bad_line",
        f"{manifest}:5: not valid JSON (NaN is not a JSON number)",
    )
    assert got["m.jsonl:6"][1].startswith(f"{manifest}:6: not valid JSON (Expecting value")
    assert got["m.jsonl:7"][1] == (
        f"{manifest}:7: expected a JSON object with 'path' and 'label', got '[1, 2]'"
    )
    assert got["m.jsonl:8"][1] == f"{manifest}:8: 'path' must be a non-empty string, got 'null'"
    assert meta_of(out)["label_source"] == f"jsonl:{manifest}"
    # the no_label reason is the manifest's, kept on the entry
    plan = plan_labels(src, str(manifest))
    assert [e.note for e in plan.entries if not e.labelled] == ["no label at m.jsonl:4"]


def test_jsonl_without_path_and_label_keys_is_unusable(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    manifest = tmp_path / "m.jsonl"
    manifest.write_text('{"file": "a.png", "text": "x"}\n')
    with pytest.raises(
        LabelSourceError,
        match=r"line 1 has the keys \['file', 'text'\]; expected a JSON Lines manifest whose "
        "objects have 'path' and 'label' keys",
    ):
        plan_labels(src, str(manifest))
    # recognised by content whatever the extension
    other = tmp_path / "m.txt"
    other.write_text('{"path": "a.png", "label": 1}\n')
    assert plan_labels(src, str(other)).source == f"jsonl:{other}"


def test_csv_manifest_labels(tmp_path):
    src = tmp_path / "src"
    put_images(src, "a.png", "b, c.png", "d.png", "e.png", "f.png", "g.png", "h.png")
    manifest = tmp_path / "m.csv"
    manifest.write_bytes(
        "\ufeffid,Path , label\n"
        '1,a.png,"[1,2]"\n'
        '2,"b, c.png","{""a"": 1}"\n'
        "3,d.png,7\n"
        "4,e.png,007\n"
        "5,f.png,a cat\n"
        "6,g.png,\n"
        "7,h.png,[not json\n".encode()
    )
    plan = plan_labels(src, str(manifest))
    assert plan_labelled(plan) == {
        "a.png": [1, 2],
        "b, c.png": {"a": 1},
        "d.png": 7,
        "e.png": "007",
        "f.png": "a cat",
        "h.png": "[not json",
    }
    assert [(e.file.rel, e.note) for e in plan.entries if not e.labelled] == [
        ("g.png", "an empty label cell at m.csv:7")
    ]
    assert plan.problems == []
    assert plan.source == f"csv:{manifest}"


def test_csv_bad_rows_are_reported_by_line(tmp_path):
    src = tmp_path / "src"
    put_images(src, "a.png", "b.png", "c.png", "d.png")
    manifest = tmp_path / "m.csv"
    manifest.write_bytes(
        b'path,label\na.png,1\n\nb.png,"two\nlines"\nc.png,3,extra\nd.png,\xff\xfe\n,5\na.png,9\n'
    )
    plan = plan_labels(src, str(manifest))
    assert plan_labelled(plan) == {"a.png": 1, "b.png": "two\nlines"}
    got = {p.path: (p.reason, p.message) for p in plan.problems}
    assert got == {
        "m.csv:6": (
            "bad_line",
            f"{manifest}:6: expected 2 fields as in the header, got 3: 'c.png,3,extra'",
        ),
        "m.csv:7": ("bad_line", f"{manifest}:7: not UTF-8 text"),
        "m.csv:8": ("bad_line", f"{manifest}:8: an empty path cell"),
        "a.png": (
            "duplicate",
            "listed again at m.csv:9 (first at m.csv:2); the first entry is packed",
        ),
    }


def test_csv_without_path_and_label_columns_is_unusable(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    manifest = tmp_path / "m.csv"
    manifest.write_text("file,class\na.png,1\n")
    with pytest.raises(
        LabelSourceError,
        match=r"found the columns \['file', 'class'\]; expected a CSV manifest whose header "
        "row has one 'path' and one 'label' column",
    ):
        plan_labels(src, str(manifest))


csv_cells = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=12
)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(csv_cells, csv_cells, csv_cells), min_size=1, max_size=8))
def test_csv_arrow_and_python_readers_agree(rows):
    buf = io.StringIO(newline="")
    writer = csv.writer(buf)  # "\r\n" lines: then cells with "\r" are quoted too
    writer.writerow(["path", "x", "label"])
    writer.writerows(rows)
    text = buf.getvalue()
    fast = csv_rows_arrow(text.encode(), ["path", "x", "label"], 0, 2)
    slow, bad, _ = csv_rows_python(text, "m.csv", 0, 2)
    assert bad == []
    one_line_rows = not any("\n" in c or "\r" in c for row in rows for c in row)
    if one_line_rows:
        assert fast is not None  # clean files take the pyarrow path
    if fast is not None:  # it declines files whose rows are not one line each
        assert fast == slow


# --------------------------------------------------------------------------- sidecar


def test_sidecar_labels(tmp_path):
    src = tmp_path / "src"
    put_images(src, "a.jpg", "b.png", "c.png", "d.png", "sub/e.png", "f.png", "g.png", "h.png")
    (src / "a.txt").write_text("Hello, world\n")
    (src / "b.json").write_text('{"boxes": [[1, 2, 3, 4]], "text": "hi"}')
    (src / "c.json").write_text("[1, 2]")
    (src / "c.txt").write_text("ignored: .json wins")
    (src / "sub" / "e.txt").write_bytes(b"line one\r\nline two\r\n")
    (src / "f.json").write_text('{"broken": ')
    (src / "g.txt").write_text("")
    (src / "h.txt").write_bytes(b"\xff\xfe")
    (src / "notes.bin").write_bytes(b"nope")
    out = tmp_path / "out"
    build(BuildConfig(src=src, out=out, labels="sidecar"))
    assert labels_of(out) == {
        "a.jpg": "Hello, world",
        "b.png": {"boxes": [[1, 2, 3, 4]], "text": "hi"},
        "c.png": [1, 2],
        "sub/e.png": "line one\r\nline two",
    }
    assert errors_of(out) == {
        "d.png": "no_label",
        "f.png": "bad_line",
        "g.png": "no_label",
        "h.png": "bad_line",
        "notes.bin": "not_image",
    }
    plan = plan_labels(src, "sidecar")
    assert plan.extra["sidecar_both"] == 1
    assert plan.source == "sidecar"
    notes = {e.file.rel: e.note for e in plan.entries if not e.labelled}
    assert notes["d.png"] == "no d.json or d.txt beside it (labels from sidecar)"
    assert notes["g.png"] == "the sidecar g.txt is empty or null (labels from sidecar)"
    msg = {p.path: p.message for p in plan.problems}
    assert msg["f.png"].startswith("the sidecar f.json is not valid JSON (Expecting value")
    assert msg["h.png"].startswith("the sidecar h.txt is not UTF-8")
    assert meta_of(out)["label_source"] == "sidecar"


# --------------------------------------------------------------------------- class maps


def test_class_map_auto_on_text_labels(tmp_path):
    src = tmp_path / "src"
    put_images(src, "1.png", "2.png", "3.png", "4.png")
    listing = tmp_path / "l.txt"
    listing.write_text("1.png dog\n2.png cat\n3.png 7\n4.png dog\n5.png zebra\n")
    out = tmp_path / "out"
    build(BuildConfig(src=src, out=out, labels=str(listing), class_map="auto"))
    meta = meta_of(out)
    # every class named in the list counts, also for a missing file: ids stay stable
    assert meta["classes"] == ["7", "cat", "dog", "zebra"]
    assert meta["class_map"] == "auto"
    assert meta["label_kind"] == "int"
    assert labels_of(out) == {"1.png": 2, "2.png": 1, "3.png": 0, "4.png": 2}
    assert errors_of(out) == {"5.png": "missing"}


def test_class_map_file_and_unknown_classes(tmp_path):
    src = tmp_path / "src"
    put_images(src, "1.png", "2.png", "3.png", "4.png")
    manifest = tmp_path / "m.jsonl"
    manifest.write_text(
        '{"path": "1.png", "label": "dog"}\n{"path": "2.png", "label": ["cat", "dog"]}\n'
        '{"path": "3.png", "label": "cow"}\n{"path": "4.png", "label": 3}\n'
    )
    names = tmp_path / "classes.txt"
    names.write_text("dog\ncat\nbird\n")
    out = tmp_path / "out"
    build(BuildConfig(src=src, out=out, labels=str(manifest), class_map=str(names)))
    meta = meta_of(out)
    assert meta["classes"] == ["dog", "cat", "bird"]
    assert meta["class_map"] == f"file:{names}"
    assert meta["options"]["class_map"] == str(names)
    assert labels_of(out) == {"1.png": 0, "2.png": [1, 0]}
    errors = {
        e["path"]: e for e in map(json.loads, (out / "errors.jsonl").read_text().splitlines())
    }
    assert {k: e["reason"] for k, e in errors.items()} == {
        "3.png": "unknown_class",
        "4.png": "unknown_class",
    }
    assert errors["3.png"]["message"] == "the class 'cow' is not in the class map (m.jsonl:3)"
    assert errors["4.png"]["message"].startswith("the label '3' is not a class name")


@pytest.mark.parametrize(
    ("name", "content", "classes"),
    [
        ("c.json", '["b", "a"]', ["b", "a"]),
        ("c.json", '{"a": 1, "b": 0}', ["b", "a"]),
        ("c.txt", "b\r\na\n\n", ["b", "a"]),
    ],
)
def test_class_map_file_forms_remap_class_folders(tmp_path, name, content, classes):
    src = tmp_path / "src"
    put_images(src, "a/1.png", "b/2.png", "c/3.png")
    cmap = tmp_path / name
    cmap.write_text(content)
    plan = plan_labels(src, "dirname", class_map=str(cmap))
    assert plan.classes == classes
    assert plan_labelled(plan) == {"a/1.png": classes.index("a"), "b/2.png": classes.index("b")}
    assert plan_reasons(plan) == {"c/3.png": UNKNOWN_CLASS}


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("c.txt", "a\n\nb\n", r"c\.txt:2: an empty line; expected one class name per line"),
        ("c.txt", "a\nb\na\n", "the class 'a' is listed twice"),
        ("c.txt", "", "no class names"),
        ("c.json", '{"a": 0, "b": 2}', r"the ids \[0, 2\] are not 0\.\.1 each once"),
        ("c.json", '{"a": ', "not valid JSON"),
        ("c.json", "3", "found JSON int; expected a list of class names"),
        (None, "", "no such file; expected auto or a file of class names"),
    ],
)
def test_bad_class_map_files(tmp_path, name, content, message):
    src = tmp_path / "src"
    put_images(src, "a/1.png")
    cmap = tmp_path / (name or "nope.txt")
    if name:
        cmap.write_text(content)
    with pytest.raises(LabelSourceError, match=message):
        plan_labels(src, "dirname", class_map=str(cmap))


def test_class_map_needs_labels(tmp_path):
    src = tmp_path / "src"
    put_images(src, "x.png")
    with pytest.raises(LabelSourceError, match=r"no labels to map .*found no class folders"):
        plan_labels(src, "auto", class_map="auto")


# --------------------------------------------------------------------------- unusable files


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        (
            "l.txt",
            b"",
            r"no entries \(the file is empty or holds only comments\); expected "
            "'path<TAB>label' or 'path label' lines",
        ),
        ("l.txt", b"# only\n\n", "no entries"),
        ("l.png", b"\x89PNG\r\n\x1a\n\x00\x00", "binary data"),
        ("l.json", b'[{"path": "a.png"}]', "a JSON document; expected JSON Lines"),
        (
            "l.txt",
            b"one\ntwo\n",
            r"none of its 2 lines could be read as 'path<TAB>label' or "
            r"'path label' lines; the first: .*l\.txt:1: expected",
        ),
        ("l.lst", b"a.png\t1\n", "none of its 1 lines could be read as 'index<TAB>label"),
    ],
)
def test_unusable_label_files(tmp_path, name, content, message):
    src = tmp_path / "src"
    src.mkdir()
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(LabelSourceError, match=message):
        plan_labels(src, str(path))


def test_missing_label_file_and_directory(tmp_path):
    with pytest.raises(LabelSourceError, match=r"nope\.txt: no such file"):
        plan_labels(tmp_path, str(tmp_path / "nope.txt"))
    (tmp_path / "d").mkdir()
    with pytest.raises(LabelSourceError, match="a directory; expected a label file"):
        plan_labels(tmp_path, str(tmp_path / "d"))


# --------------------------------------------------------------------------- fuzzing

_FUZZ_ROOT = Path(tempfile.mkdtemp(prefix="packer-labels-fuzz-"))
(_FUZZ_ROOT / "src" / "d").mkdir(parents=True)
for _rel in ("a.png", "b.jpg", "d/c.png"):
    (_FUZZ_ROOT / "src" / _rel).write_bytes(b"x")

_pieces = st.sampled_from(
    [
        "a.png",
        "b.jpg",
        "d/c.png",
        "../x.png",
        "/etc/passwd",
        "\t",
        " ",
        ",",
        '"',
        "[",
        "{",
        "}",
        "]",
        ":",
        "0",
        "1",
        "-3",
        "2.5",
        "nan",
        "\x00",
        "\r",
        "#",
        "path",
        "label",
        "\ufeff",
        '"path"',
        '"label"',
        "null",
        "\u2028",
        "é",
        "\\",
    ]
)
_noise = st.one_of(st.lists(_pieces, max_size=8).map("".join), st.text(max_size=30))
_paths = st.sampled_from(
    [
        "a.png",
        "b.jpg",
        "d/c.png",
        "./a.png",
        "d//c.png",
        "../x.png",
        "/etc/passwd",
        "gone.png",
        "d",
        "é.png",
        " a.png ",
        "a.png\x00",
        "a b.png",
    ]
)
_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3)
    ),
    max_leaves=6,
)
_label = st.one_of(
    st.lists(_pieces, max_size=4).map("".join),
    st.text(max_size=10),
    _json.map(json.dumps),
    st.lists(st.integers(0, 12), min_size=1, max_size=4).map(lambda v: ",".join(map(str, v))),
    st.just('[{"transcription": "x", "points": [[1, 2]]}]'),
)


def _damaged(line: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    """Mostly well-formed lines, some cut short at a random point, some pure noise."""
    cut = st.tuples(line, st.integers(0, 40)).map(lambda t: t[0][: t[1]])
    return st.one_of(line, line, line, cut, _noise)


_list_line = st.builds(
    lambda p, sep, label: f"{p}{sep}{label}", _paths, st.sampled_from(["\t", " ", "\t\t"]), _label
)
_lst_number = st.one_of(
    st.integers(-5, 5).map(str), st.floats().map(str), st.sampled_from(["3.000000", "x", ""])
)
_lst_line = st.builds(
    lambda i, labels, p: "\t".join([str(i), *labels, p]),
    st.integers(-2, 99),
    st.lists(_lst_number, max_size=3),
    _paths,
)
_jsonl_line = st.builds(
    lambda p, label, keys: json.dumps(
        {k: v for k, v in (("path", p), ("label", label)) if k in keys}
    ),
    _paths | _json,
    _json,
    st.sampled_from([("path", "label"), ("path", "label"), ("path",), ("label",)]),
)
_csv_row = st.tuples(_paths, _label).map(lambda row: _csv_text([row]).rstrip("\n"))
_lines = st.lists(_noise, max_size=10)


def _csv_text(rows: list) -> str:
    buf = io.StringIO(newline="")
    csv.writer(buf).writerows(rows)
    return buf.getvalue()


def _fuzz(ext: str, lines: list[str], class_map: str | None, encoding_error: bool) -> None:
    path = _FUZZ_ROOT / f"labels{ext}"
    data = "\n".join(lines).encode("utf-8", "surrogatepass")
    if encoding_error:
        data += b"\n\xff\xfe bad"
    path.write_bytes(data)
    try:
        plan = plan_labels(_FUZZ_ROOT / "src", str(path), class_map=class_map)
    except LabelSourceError:
        return
    assert {p.reason for p in plan.problems} <= REASONS
    for e in plan.entries:
        assert Path(e.file.path).is_file()
        assert e.file.rel in ("a.png", "b.jpg", "d/c.png")
        json.dumps(e.label, allow_nan=False)
    assert len({e.file.rel for e in plan.entries}) == len(plan.entries)


@pytest.mark.parametrize("ext", [".txt", ".lst", ".jsonl", ".csv", ".json", ""])
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lines=_lines, class_map=st.sampled_from([None, "auto"]), encoding_error=st.booleans())
def test_fuzz_any_text_as_label_file(ext, lines, class_map, encoding_error):
    _fuzz(ext, lines, class_map, encoding_error)


@pytest.mark.parametrize(
    ("ext", "line"),
    [(".txt", _list_line), (".lst", _lst_line), (".jsonl", _jsonl_line), (".txt", _lst_line)],
)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), class_map=st.sampled_from([None, "auto"]), encoding_error=st.booleans())
def test_fuzz_each_list_parser(ext, line, data, class_map, encoding_error):
    lines = data.draw(st.lists(_damaged(line), min_size=1, max_size=10))
    _fuzz(ext, lines, class_map, encoding_error)


@settings(max_examples=150, deadline=None)
@given(
    header=st.sampled_from(["path,label", "label,path", "Path, Label,x", "path\tlabel"]),
    lines=st.lists(_damaged(_csv_row), max_size=10),
    class_map=st.sampled_from([None, "auto"]),
    encoding_error=st.booleans(),
)
def test_fuzz_csv_manifest(header, lines, class_map, encoding_error):
    _fuzz(".csv", [header, *lines], class_map, encoding_error)


# --------------------------------------------------------------------------- CLI

runner = CliRunner()


def test_cli_several_labels_and_class_map(tmp_path):
    src = tmp_path / "src"
    put_images(src, "1.png", "2.png", "3.png")
    a, b = tmp_path / "a.txt", tmp_path / "b.csv"
    a.write_text("1.png\tzebra\n2.png\tant\n")
    b.write_text("path,label\n3.png,zebra\n1.png,ant\n")
    out = tmp_path / "out"
    result = runner.invoke(
        app,
        [
            "build",
            str(src),
            str(out),
            "--labels",
            str(a),
            "--labels",
            str(b),
            "--class-map",
            "auto",
            "--workers",
            "1",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "packed 3 images" in result.output
    assert "duplicate 1" in result.output
    assert labels_of(out) == {"1.png": 1, "2.png": 0, "3.png": 1}
    meta = meta_of(out)
    assert meta["classes"] == ["ant", "zebra"]
    assert meta["class_map"] == "auto"
    assert meta["label_source"] == f"list:{a}, csv:{b}"


def test_cli_label_depth_and_errors_exit_2(tmp_path):
    src = tmp_path / "src"
    put_images(src, "x/y/1.png", "x/z/2.png")
    out = tmp_path / "out"
    result = runner.invoke(app, ["build", str(src), str(out), "--label-depth", "2"])
    assert result.exit_code == 0, result.output
    assert meta_of(out)["classes"] == ["x/y", "x/z"]
    for args, message in (
        (["--label-depth", "3"], "no folders 3 levels under"),
        (["--labels", "none", "--labels", "x.txt"], "--labels none cannot be combined"),
        (["--class-map", str(tmp_path / "nope.txt")], "nope.txt: no such file"),
    ):
        result = runner.invoke(app, ["build", str(src), str(tmp_path / "o2"), *args])
        assert result.exit_code == 2, (args, result.output)
        assert message in result.output
        assert "Traceback" not in result.output


# --------------------------------------------------------------------------- line bound

LONG = 4 * MAX_LINE_BYTES + 5


@pytest.mark.parametrize(
    ("ext", "header", "line"),
    [
        (".txt", None, "{}\t{}"),
        (".jsonl", None, '{{"path": "{}", "label": {}}}'),
        (".csv", "path,label", "{},{}"),
    ],
)
def test_a_label_line_past_the_bound_is_a_bad_line_never_read_whole(tmp_path, ext, header, line):
    src = tmp_path / "src"
    put_images(src, "a.png", "b.png", "c.png")
    manifest = tmp_path / f"m{ext}"
    long_line = line.format("b.png", '"' + "x" * LONG + '"')
    lines = [line.format("a.png", 1), long_line, line.format("c.png", 3)]
    manifest.write_text("\n".join(([header] if header else []) + lines) + "\n")
    tracemalloc.start()
    try:
        plan = plan_labels(src, str(manifest))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 3 * MAX_LINE_BYTES  # the 4 MiB line was read and dropped piece by piece
    assert plan_labelled(plan) == {"a.png": 1, "c.png": 3}
    number = 3 if header else 2
    assert [(p.path, p.reason, p.message) for p in plan.problems] == [
        (
            f"m{ext}:{number}",
            "bad_line",
            f"{manifest}:{number}: a line of {len(long_line)} bytes, longer than the 1 MiB a "
            "label line may hold; skipped",
        )
    ]


def test_the_line_bound_is_exact_and_counts_no_line_end():
    most = b"y" * MAX_LINE_BYTES
    data = b"a\n" + most + b"\r\n" + most + b"z\r\n" + most + b"\n" + most + b"zz"
    got = list(numbered_lines(io.BufferedReader(io.BytesIO(data))))
    assert got == [
        (1, "a"),
        (2, most.decode()),
        (3, LongLine(MAX_LINE_BYTES + 1)),
        (4, most.decode()),
        (5, LongLine(MAX_LINE_BYTES + 2)),
    ]


def test_a_csv_row_spanning_lines_past_the_bound_is_a_bad_line(tmp_path):
    src = tmp_path / "src"
    put_images(src, "a.png", "b.png", "c.png")
    manifest = tmp_path / "m.csv"
    spanning = "\n".join(["x" * 1000] * (MAX_LINE_BYTES // 1000 + 10))
    manifest.write_text(f'path,label\na.png,1\nb.png,"{spanning}"\nc.png,3\n')
    plan = plan_labels(src, str(manifest))
    assert plan_labelled(plan)["a.png"] == 1
    assert "b.png" not in plan_labelled(plan)
    (problem,) = [p for p in plan.problems if p.path == "m.csv:3"]
    assert problem.reason == "bad_line"
    assert "field larger than field limit (1048576)" in problem.message
