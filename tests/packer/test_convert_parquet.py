"""``packer convert`` of Parquet files, as pyarrow and the Hugging Face ``datasets`` library write
them: images from a binary or ``{bytes, path}`` column, labels from one or several columns,
``ClassLabel`` names as classes, bad rows in ``errors.jsonl``, several files and directories,
and an interrupted convert that ``--resume`` finishes with the bytes of an uninterrupted one.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from packer.cli import app
from packer.convert import ConvertConfig, convert
from packer.errors import ConfigError, InputError, OutputExistsError
from packer.parquet_source import BATCH_ROWS, ParquetInputError
from packer.repack import KILL_AT_ENV
from packer.verify import verify
from tests.conftest import build_packed, encode, make_image
from tests.packer.test_convert import _images, _read_out
from tests.packer.test_convert_kill import dataset_files

runner = CliRunner()
IMAGE_STRUCT = pa.struct([("bytes", pa.binary()), ("path", pa.string())])


def _hf_metadata(features: dict[str, Any]) -> dict[bytes, bytes]:
    """The schema metadata ``datasets`` writes: its features as JSON under ``huggingface``."""
    return {b"huggingface": json.dumps({"info": {"features": features}}).encode()}


def _write(path: Path, columns: dict[str, pa.Array], *, metadata: Any = None, rows: int = 4):
    """A Parquet file of `columns` by pyarrow, `rows` rows per row group."""
    table = pa.table(columns)
    if metadata:
        table = table.replace_schema_metadata(metadata)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path, row_group_size=rows)
    return path


def _errors(out: Path) -> list[tuple[str, str]]:
    lines = (out / "errors.jsonl").read_text().splitlines()
    return [(e["path"], e["reason"]) for e in map(json.loads, lines)]


def _meta(out: Path) -> dict[str, Any]:
    return json.loads((out / "meta.json").read_text())


def _fail(args: list[str]) -> str:
    """Run the CLI, expect the one-line error exit, return the line."""
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    assert lines[0].startswith("packer: error: "), result.output
    return lines[0]


def test_binary_column_with_a_text_label_is_guessed_and_round_trips(tmp_path: Path) -> None:
    images = _images(11)
    words = [f"word {i}" for i in range(11)]
    src = _write(
        tmp_path / "ocr.parquet", {"img": pa.array(images, pa.binary()), "text": words}, rows=3
    )
    out = tmp_path / "out"
    # small shards: shards start and end inside row groups (3 rows each) and batches
    summary = convert(ConvertConfig(src, out, shard_size=sum(map(len, images)) // 4))
    assert summary.packed == 11
    assert summary.skipped == 0
    assert len(_meta(out)["shards"]) >= 4
    got = _read_out(out)
    assert [g[0] for g in got] == images
    assert [g[1] for g in got] == words
    assert [g[2] for g in got] == [f"ocr.parquet#row {i}" for i in range(11)]  # one file: its name
    meta = _meta(out)
    assert meta["classes"] is None
    assert meta["label_source"] == "parquet"
    assert meta["options"]["converted_from"] == "parquet"
    assert meta["options"]["image_column"] == "img"
    assert meta["options"]["label_columns"] == ["text"]
    assert verify(out, deep=True) == []


def test_struct_column_names_rows_by_their_path(tmp_path: Path) -> None:
    images = _images(4)
    paths = ["a/cat.png", None, "", "d.jpg"]
    structs = [{"bytes": b, "path": p} for b, p in zip(images, paths, strict=True)]
    src = _write(tmp_path / "s.parquet", {"image": pa.array(structs, IMAGE_STRUCT)})
    out = tmp_path / "out"
    convert(ConvertConfig(src, out, format="recordio"))
    got = _read_out(out)
    assert [g[0] for g in got] == images
    assert [g[1] for g in got] == [None] * 4  # no other column: no labels
    assert [g[2] for g in got] == ["a/cat.png", "s.parquet#row 1", "s.parquet#row 2", "d.jpg"]
    assert _meta(out)["label_source"] == "none"


def test_classlabel_metadata_gives_classes_and_ids(tmp_path: Path) -> None:
    images = _images(5)
    features = {
        "image": {"_type": "Image"},
        "label": {"_type": "ClassLabel", "names": ["cat", "dog", "eel"]},
    }
    structs = [{"bytes": b, "path": None} for b in images]
    columns = {
        "thumb": pa.array([b"\x00"] * 5),  # binary too, but the metadata marks `image` Image
        "image": pa.array(structs, IMAGE_STRUCT),
        "label": pa.array([2, 0, -1, 3, 1], pa.int64()),
    }
    src = _write(tmp_path / "c.parquet", columns, metadata=_hf_metadata(features))
    out = tmp_path / "out"
    convert(ConvertConfig(src, out))
    assert _meta(out)["options"]["image_column"] == "image"
    assert _meta(out)["classes"] == ["cat", "dog", "eel"]
    # -1 is datasets' "no label"; 3 is no class of the ClassLabel
    assert [g[1] for g in _read_out(out)] == [2, 0, None, 1]
    assert _errors(out) == [("c.parquet#row 3", "bad_label")]
    message = json.loads((out / "errors.jsonl").read_text())["message"]
    assert "column 'label' holds 3, not a class id of its ClassLabel (3 names)" in message


def test_missing_and_non_image_rows_are_errors_with_reasons(tmp_path: Path) -> None:
    good = _images(2)
    structs = [
        {"bytes": good[0], "path": "ok.png"},
        None,  # no image at all
        {"bytes": None, "path": "/elsewhere/x.jpg"},  # datasets' Image not embedded
        {"bytes": b"", "path": None},
        {"bytes": b"plain text, not an image", "path": "notes.txt"},
        {"bytes": good[1][: len(good[1]) // 2], "path": None},  # cut short
        {"bytes": good[1], "path": None},
    ]
    src = _write(
        tmp_path / "bad.parquet",
        {
            "image": pa.array(structs, IMAGE_STRUCT),
            "y": pa.array([0.5, 1, 2, 3, 4, 5, float("nan")]),
        },
    )
    out = tmp_path / "out"
    summary = convert(ConvertConfig(src, out))
    assert summary.packed == 1
    name = src.name
    assert _errors(out) == [
        (f"{name}#row 1", "missing"),
        ("/elsewhere/x.jpg", "missing"),
        (f"{name}#row 3", "empty"),
        ("notes.txt", "not_image"),
        (f"{name}#row 5", "truncated"),
        (f"{name}#row 6", "bad_label"),  # NaN: no JSON holds it
    ]
    messages = [json.loads(line)["message"] for line in (out / "errors.jsonl").open()]
    assert messages[0] == f"no image in column 'image' of {name}#row 1 (null)"
    assert "only the path '/elsewhere/x.jpg', no bytes" in messages[1]
    assert f"{name}#row 2" in messages[1]
    assert [g[:2] for g in _read_out(out)] == [(good[0], 0.5)]
    with pytest.raises(InputError, match=r"#row 1: no image in column 'image'.*\[missing\]"):
        convert(ConvertConfig(src, tmp_path / "failed", on_error="fail"))
    assert not (tmp_path / "failed").exists()


def test_several_files_and_label_columns_as_a_json_object_by_the_cli(tmp_path: Path) -> None:
    images = _images(7)
    a = _write(
        tmp_path / "data" / "part-0.parquet",
        {"jpg": pa.array(images[:4]), "cls": [0, 1, 0, 1], "w": ["a", "b", "c", "d"], "n": [1] * 4},
    )
    b = _write(
        tmp_path / "data" / "part-1.parquet",
        {"jpg": pa.array(images[4:]), "cls": [1, 1, 0], "w": ["e", "f", "g"], "n": [2] * 3},
    )
    out = tmp_path / "out"
    args = ["convert", str(a), str(b), str(out), "--label-column", "w", "--label-column", "cls"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    got = _read_out(out)
    assert [g[0] for g in got] == images
    assert [g[1] for g in got][3:5] == [{"w": "d", "cls": 1}, {"w": "e", "cls": 1}]
    # named from the directory that holds every file given
    assert [g[2] for g in got][3:5] == ["part-0.parquet#row 3", "part-1.parquet#row 0"]
    assert _meta(out)["source"] == f"{a} {b}"
    # exported as WebDataset tars, read back: the same bytes and labels
    tars = tmp_path / "tars"
    assert (
        runner.invoke(app, [*args[:3], str(tars), *args[4:], "--to", "webdataset"]).exit_code == 0
    )
    from readers import open_dataset

    exported = open_dataset(tars, decode="bytes")
    assert [exported[i] for i in range(len(exported))] == [g[:2] for g in got]
    # the files in the other order: the other order of samples
    again = tmp_path / "again"
    assert runner.invoke(app, [*args[:1], str(b), str(a), str(again), *args[4:]]).exit_code == 0
    assert [g[0] for g in _read_out(again)] == images[4:] + images[:4]


def test_a_directory_of_files_in_path_order(tmp_path: Path) -> None:
    images = _images(6)
    root = tmp_path / "repo"
    for name, part in [("data/train-00001-of-00002", 1), ("data/train-00000-of-00002", 0)]:
        _write(root / f"{name}.parquet", {"image": pa.array(images[3 * part : 3 * part + 3])})
    _write(root / ".cache" / "stale.parquet", {"image": pa.array(_images(1, seed=9))})
    (root / "README.md").write_text("# a dataset card\n")
    out = tmp_path / "out"
    assert runner.invoke(app, ["convert", str(root), str(out)]).exit_code == 0
    got = _read_out(out)
    assert [g[0] for g in got] == images
    assert got[4][2] == "data/train-00001-of-00002.parquet#row 1"  # relative to the directory
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "x.txt").write_text("no parquet here")
    assert "none of these" in _fail(["convert", str(empty), str(tmp_path / "o2")])


def test_datasets_library_image_and_classlabel(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")  # offline, its cache in tmp_path
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    datasets = pytest.importorskip("datasets")
    paddle = pytest.importorskip("paddle")
    images = _images(6, seed=3)
    features = datasets.Features(
        {
            "image": datasets.Image(),
            "label": datasets.ClassLabel(names=["cat", "dog"]),
            "caption": datasets.Value("string"),
        }
    )
    ds = datasets.Dataset.from_dict(
        {
            "image": [{"bytes": b, "path": None} for b in images],
            "label": [0, 1, 1, 0, 1, 0],
            "caption": [f"c{i}" for i in range(6)],
        },
        features=features,
    )
    root = tmp_path / "hub"
    (root / "data").mkdir(parents=True)
    ds.select(range(3)).to_parquet(str(root / "data" / "train-00000-of-00002.parquet"))
    ds.select(range(3, 6)).to_parquet(str(root / "data" / "train-00001-of-00002.parquet"))
    # two label candidates (label, caption): guessing refuses, naming the fix
    assert "--label-column" in _fail(["convert", str(root), str(tmp_path / "no")])
    out = tmp_path / "out.lmdb"
    result = runner.invoke(
        app, ["convert", str(root / "data"), str(out), "--label-column", "label"]
    )
    assert result.exit_code == 0, result.output
    assert _meta(out)["classes"] == ["cat", "dog"]
    from readers import open_dataset

    packed = open_dataset(out)
    assert packed.classes == ["cat", "dog"]
    assert packed.num_classes == 2
    loader = paddle.io.DataLoader(
        packed, batch_size=2, shuffle=False, num_workers=2, collate_fn=lambda batch: batch
    )
    got = [(np.asarray(image).shape, label) for batch in loader for image, label in batch]
    assert [label for _, label in got] == [0, 1, 1, 0, 1, 0]
    assert [shape[:2] for shape, _ in got] == [(6 + i % 3, 8 + i) for i in range(6)]
    assert verify(out, deep=True) == []


@pytest.mark.parametrize(
    ("columns", "options", "message"),
    [
        ({"a": [b"x"], "b": [b"y"]}, [], r"2 columns \('a', 'b'\) could hold the images"),
        ({"t": ["x"]}, [], r"no column could hold the images .* --image-column \(columns: 't'\)"),
        ({"a": [b"x"], "t": ["x"]}, ["--image-column", "z"], r"'z': .* has no such column"),
        ({"a": [b"x"], "t": ["x"]}, ["--image-column", "t"], r"a column of type string"),
        ({"a": [b"x"], "t": ["x"], "u": [1]}, [], r"2 columns could be the label \('t', 'u'\)"),
        ({"a": [b"x"], "t": ["x"]}, ["--label-column", "a"], r"'a' is the image column"),
        ({"a": [b"x"], "t": ["x"]}, ["--label-column", "t"] * 2, r"'t' is given twice"),
    ],
)
def test_columns_that_cannot_serve_are_one_error_line(
    tmp_path: Path, columns: dict[str, list[Any]], options: list[str], message: str
) -> None:
    src = _write(tmp_path / "x.parquet", {k: pa.array(v) for k, v in columns.items()})
    assert re.search(message, _fail(["convert", str(src), str(tmp_path / "out"), *options]))
    assert not (tmp_path / "out").exists()


def test_inputs_that_are_not_parquet_are_refused(
    tmp_path: Path, tree: tuple[Path, dict[str, bytes]]
) -> None:
    ours = build_packed(tree[0], tmp_path / "in.lmdb", "lmdb")
    src = _write(tmp_path / "x.parquet", {"a": pa.array(_images(1))})
    with pytest.raises(ConfigError, match=r"--image-column applies to Parquet input only"):
        convert(ConvertConfig(ours, tmp_path / "o1", image_column="a"))
    line = _fail(["convert", str(src), str(ours), str(tmp_path / "o2")])
    assert "not Parquet (several INs must all be Parquet files or folders)" in line
    broken = tmp_path / "broken.parquet"
    broken.write_bytes(b"PAR1 this is not a parquet footer")
    with pytest.raises(ParquetInputError, match=r"broken.parquet: not a Parquet file"):
        convert(ConvertConfig(broken, tmp_path / "o3"))
    (tmp_path / "exists").mkdir()
    with pytest.raises(OutputExistsError):  # found before IN is read (IN is not Parquet)
        convert(ConvertConfig(broken, tmp_path / "exists"))


def test_other_files_must_have_the_first_files_columns(tmp_path: Path) -> None:
    a = _write(tmp_path / "a.parquet", {"image": pa.array(_images(1)), "label": [0]})
    b = _write(tmp_path / "b.parquet", {"image": pa.array(_images(1)), "other": [0]})
    with pytest.raises(ConfigError, match=r"b.parquet has no column 'label', which the first"):
        convert(ConvertConfig((a, b), tmp_path / "out"))
    features = {"label": {"_type": "ClassLabel", "names": ["x", "y"]}}
    c = _write(
        tmp_path / "c.parquet",
        {"image": pa.array(_images(1)), "label": [0]},
        metadata=_hf_metadata(features),
    )
    with pytest.raises(ConfigError, match=r"c.parquet: its ClassLabel names"):
        convert(ConvertConfig([a, c], tmp_path / "out"))


def test_kill_9_then_resume_gives_the_bytes_of_an_uninterrupted_convert(tmp_path: Path) -> None:
    images = _images(2 * BATCH_ROWS + 5)
    src = _write(
        tmp_path / "big.parquet",
        {"image": pa.array(images), "n": list(range(len(images)))},
        rows=BATCH_ROWS + 7,
    )
    size = sum(map(len, images)) // 3
    whole = tmp_path / "whole"
    convert(ConvertConfig(src, whole, shard_size=size))
    assert len(_meta(whole)["shards"]) >= 3
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "packer.cli", "convert", str(src), str(out)]
    cmd += ["--shard-size", str(size)]
    proc = subprocess.run(
        cmd, env={**os.environ, KILL_AT_ENV: "writing"}, capture_output=True, check=False
    )
    assert proc.returncode == -9, proc.stderr
    assert not out.exists()
    assert (tmp_path / ".out.partial").is_dir()
    result = runner.invoke(
        app, ["convert", str(src), str(out), "--shard-size", str(size), "--resume"]
    )
    assert result.exit_code == 0, result.output
    assert dataset_files(out) == dataset_files(whole)
    assert [g[1] for g in _read_out(out)] == list(range(len(images)))


@pytest.mark.parametrize("column", [0, 1])
def test_a_damaged_page_is_one_error_line_and_no_out(tmp_path: Path, column: int) -> None:
    images = _images(12)
    src = _write(
        tmp_path / "d.parquet", {"image": pa.array(images), "t": [f"w{i}" for i in range(12)]}
    )
    # the page header of row group 2's image column (found when the sizes are read) or of its
    # label column (found amid the convert, after shards 0 and 1 are written)
    at = pq.ParquetFile(src).metadata.row_group(2).column(column).data_page_offset
    data = bytearray(src.read_bytes())
    data[at : at + 24] = bytes(b ^ 0xFF for b in data[at : at + 24])
    src.write_bytes(bytes(data))
    out = tmp_path / "out"
    line = _fail(["convert", str(src), str(out), "--shard-size", str(len(images[0]))])
    assert re.fullmatch(r"packer: error: .*d\.parquet: cannot be read \(.+\)", line)
    assert not out.exists()
    assert not (tmp_path / ".out.partial").exists()


PEAK_SCRIPT = """
import sys
from pathlib import Path
import pyarrow as pa
from packer.convert import ConvertConfig, convert
convert(ConvertConfig(Path(sys.argv[1]), Path(sys.argv[2]), progress=False))
print(pa.default_memory_pool().max_memory())
"""


def test_memory_is_bounded_by_a_row_group_not_by_the_file(tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    images = [encode(make_image(rng, 100, 70), ".png") for _ in range(640)]  # ~21 KB each
    total = sum(map(len, images))
    src = _write(tmp_path / "m.parquet", {"image": pa.array(images)}, rows=16)
    # a fresh process: the peak of pyarrow's memory pool over the whole convert
    proc = subprocess.run(
        [sys.executable, "-c", PEAK_SCRIPT, str(src), str(tmp_path / "out")],
        capture_output=True,
        text=True,
        check=True,
    )
    peak = int(proc.stdout.split()[-1])
    assert peak < total / 2, (peak, total)  # the file read at once: more than `total`
    assert len(_read_out(tmp_path / "out")) == 640


@pytest.mark.parametrize(
    "image_type",
    [pa.large_binary(), pa.binary_view(), pa.struct([("bytes", pa.binary_view())]), "fixed"],
    ids=str,
)
def test_every_binary_type_holds_images(tmp_path: Path, image_type: Any) -> None:
    image = _images(1)[0]
    if image_type == "fixed":
        image_type = pa.binary(len(image))
    value: Any = {"bytes": image} if pa.types.is_struct(image_type) else image
    labels = pa.array(["b", "a"], pa.dictionary(pa.int8(), pa.string()))  # a pandas category
    src = _write(tmp_path / "t.parquet", {"im": pa.array([value] * 2, image_type), "l": labels})
    convert(ConvertConfig(src, tmp_path / "out"))
    assert [g[:2] for g in _read_out(tmp_path / "out")] == [(image, "b"), (image, "a")]
