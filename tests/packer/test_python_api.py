"""The Python API: packer.build(src, out, **options) and packer.Writer, through real datasets."""

from __future__ import annotations

import importlib
import json
import pkgutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
from typer.testing import CliRunner

import packer
import packer.errors
from packer.cli import app
from packer.config import BuildConfig
from packer.errors import (
    ConfigError,
    InputError,
    OutputExistsError,
    PackerError,
    SampleTypeError,
    WriterStateError,
)
from packer.verify import verify
from readers import LmdbDataset, RecordIODataset, open_dataset
from tests.conftest import encode, make_image, write_tree

try:  # the moto S3 server of tests/s3, for the URL test
    from tests.s3.conftest import bucket, s3_endpoint, s3fs_client  # noqa: F401
except (ImportError, pytest.skip.Exception):
    HAVE_S3 = False
else:
    HAVE_S3 = True

ROOT = Path(__file__).resolve().parents[2]
DATASETS = {"lmdb": LmdbDataset, "recordio": RecordIODataset}


def _index(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "index.jsonl").read_text().splitlines()]


def _errors(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "errors.jsonl").read_text().splitlines()]


def _samples(n: int, *, seed: int = 0) -> list[tuple[bytes, int]]:
    """`n` small encoded images (PNG and JPEG, color and gray) with int labels."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        image = make_image(rng, 6 + i % 7, 5 + i % 3, 1 if i % 4 == 3 else 3)
        out.append((encode(image, ".png" if i % 2 == 0 else ".jpg"), i % 3))
    return out


# ------------------------------------------------------------------ packer.build


@pytest.mark.parametrize("as_str", [True, False])
def test_build_takes_str_and_path(tmp_path: Path, as_str: bool) -> None:
    files = write_tree(tmp_path / "src", {"cat": 3, "dog": 2})
    src, out = tmp_path / "src", tmp_path / "out.rec"
    summary = packer.build(
        str(src) if as_str else src,
        str(out) if as_str else out,
        format="recordio",
        shard_size=1024,
        workers=1,
        progress=False,
        log=lambda msg: None,
    )
    assert isinstance(summary, packer.BuildSummary)
    assert (summary.packed, summary.skipped) == (len(files), 0)
    assert summary.shards > 1  # shard_size as bytes
    assert verify(out, deep=True) == []
    ds = RecordIODataset(out, decode="bytes")
    paths = [r["path"] for r in _index(out)]
    assert {paths[i]: ds[i][0] for i in range(len(ds))} == files
    assert json.loads((out / "meta.json").read_text())["classes"] == ["cat", "dog"]


def test_build_config_coerces_str_paths(tmp_path: Path) -> None:
    write_tree(tmp_path / "src", {"a": 2})
    cfg = BuildConfig(src=str(tmp_path / "src"), out=str(tmp_path / "o.lmdb"))  # type: ignore[arg-type]
    assert cfg.src == tmp_path / "src"
    assert isinstance(cfg.out, Path)
    with pytest.raises(ConfigError, match="expected a path"):
        BuildConfig(src=3, out=tmp_path / "o")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        ({"format": "zip"}, ConfigError, r"--format 'zip': expected one of lmdb, recordio"),
        ({"shard_size": "lots"}, ConfigError, r"lots"),
        ({"fromat": "lmdb"}, ConfigError, r"fromat='lmdb': not an option .* did you mean format="),
        ({"workers": "4"}, ConfigError, r"workers='4': expected int"),
        ({"workers": -1}, ConfigError, r"--workers -1: must be at least 1"),
        ({"compress": "lz4"}, ConfigError, r"--compress lz4 compresses raw pixels.*--encode raw"),
        ({"resize": "big"}, ConfigError, r"--resize 'big'"),
        ({"labels": ["none", "x.txt"]}, ConfigError, r"--labels none cannot be combined"),
        ({"on_error": "ignore"}, ConfigError, r"--on-error 'ignore': expected skip or fail"),
    ],
)
def test_build_option_mistakes_raise_packer_errors(
    tmp_path: Path, options: dict[str, Any], error: type[PackerError], match: str
) -> None:
    write_tree(tmp_path / "src", {"a": 1})
    with pytest.raises(error, match=match):
        packer.build(tmp_path / "src", tmp_path / "out", **options)
    assert not (tmp_path / "out").exists()


def test_build_input_mistakes_raise_packer_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"SRC .*missing does not exist"):
        packer.build(tmp_path / "missing", tmp_path / "out")
    write_tree(tmp_path / "src", {"a": 1})
    (tmp_path / "out").mkdir()
    with pytest.raises(OutputExistsError, match="already exists; pass --overwrite"):
        packer.build(tmp_path / "src", tmp_path / "out", log=lambda msg: None)


@pytest.mark.skipif(not HAVE_S3, reason="needs moto and s3fs")
def test_build_publishes_to_a_url(tmp_path: Path, bucket: str, s3fs_client: Any) -> None:
    write_tree(tmp_path / "src", {"cat": 2, "dog": 1})
    lines: list[str] = []
    summary = packer.build(tmp_path / "src", f"{bucket}/out.lmdb", workers=1, log=lines.append)
    assert summary.packed == 3
    assert any(line.startswith("uploaded ") for line in lines), lines
    assert s3fs_client.exists(f"{bucket}/out.lmdb/meta.json")
    assert len(open_dataset(f"{bucket}/out.lmdb", cache_dir=tmp_path / "cache")) == 3


def test_the_cli_says_what_the_api_raises(tmp_path: Path) -> None:
    write_tree(tmp_path / "src", {"a": 1})
    args = [str(tmp_path / "src"), str(tmp_path / "out"), "--resize", "0x5"]
    result = CliRunner().invoke(app, ["build", *args])
    with pytest.raises(ConfigError) as raised:
        packer.build(*args[:2], resize="0x5")
    assert result.exit_code == 2
    assert result.output.strip() == f"packer: error: {raised.value}"


def test_resize_takes_ints_and_pairs(tmp_path: Path) -> None:
    write_tree(tmp_path / "src", {"a": 3})
    out = tmp_path / "out"
    packer.build(tmp_path / "src", out, resize=(4, 4), workers=1, log=lambda msg: None)
    assert all(max(r["width"], r["height"]) <= 4 for r in _index(out))
    meta = json.loads((out / "meta.json").read_text())
    assert meta["options"]["resize"] == "4x4"


def test_packer_build_is_still_the_build_module() -> None:
    import packer.build

    assert callable(packer.build)
    assert packer.build.temp_dir_for(Path("/d/x")) == Path("/d/.x.partial")
    assert packer.build is sys.modules["packer.build"]


# ------------------------------------------------------------------ the import surface


def test_all_is_sorted_and_importable() -> None:
    assert packer.__all__ == sorted(packer.__all__)
    assert {"BuildSummary", "PackerError", "Writer", "build", "errors"} <= set(packer.__all__)
    for name in packer.__all__:
        assert getattr(packer, name) is not None
    assert packer.errors.__all__ == sorted(packer.errors.__all__)


def test_packer_errors_holds_every_packer_error() -> None:
    for info in pkgutil.walk_packages([str(ROOT / "packer")], "packer."):
        importlib.import_module(info.name)  # (ray and paddle are imported only when used)
    found: set[type] = set()
    todo: list[type] = [PackerError]
    while todo:
        cls = todo.pop()
        found.add(cls)
        todo.extend(cls.__subclasses__())
    for cls in found:
        assert getattr(packer.errors, cls.__name__) is cls, cls
        assert cls.__name__ in packer.errors.__all__
    assert len(found) == len(packer.errors.__all__)


# ------------------------------------------------------------------ packer.Writer


@pytest.mark.parametrize("fmt", ["lmdb", "recordio"])
def test_writer_bytes_round_trip(tmp_path: Path, fmt: str) -> None:
    samples = _samples(12)
    out = tmp_path / f"out.{fmt}"
    with packer.Writer(str(out), format=fmt, shard_size=300) as w:
        ids = [w.add(data, label) for data, label in samples]
        assert not out.exists()  # not before it closes
    assert ids == list(range(12))
    assert verify(out, deep=True) == []
    meta = json.loads((out / "meta.json").read_text())
    assert meta["num_shards"] > 1
    assert meta["num_samples"] == 12
    ds = DATASETS[fmt](out, decode="bytes")
    assert [ds[i] for i in range(len(ds))] == samples
    assert [r["path"] for r in _index(out)] == [f"{i:09d}" for i in range(12)]
    assert (out / "index.parquet").exists()
    assert _errors(out) == []
    assert (out / "warnings.jsonl").read_text() == ""


def test_writer_arrays_keep_png_jpeg(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    rgb, gray = make_image(rng, 9, 7), make_image(rng, 5, 4, 1)
    rgba = make_image(rng, 3, 6, 4)
    with packer.Writer(tmp_path / "png.lmdb") as w:
        w.add(rgb, "rgb")
        w.add(gray, "gray")
        w.add(gray[:, :, None], ["gray", 1])
        w.add(rgba, {"kind": "rgba"})
    rows = _index(tmp_path / "png.lmdb")
    assert [(r["format"], r["width"], r["height"], r["channels"]) for r in rows] == [
        ("png", 9, 7, 3),
        ("png", 5, 4, 1),
        ("png", 5, 4, 1),
        ("png", 3, 6, 4),
    ]
    ds = LmdbDataset(tmp_path / "png.lmdb", decode="unchanged")
    assert np.array_equal(cv2.cvtColor(ds[0][0], cv2.COLOR_BGR2RGB), rgb)
    assert np.array_equal(ds[1][0].reshape(gray.shape), gray)
    assert np.array_equal(cv2.cvtColor(ds[3][0], cv2.COLOR_BGRA2RGBA), rgba)
    assert [ds[i][1] for i in range(4)] == ["rgb", "gray", ["gray", 1], {"kind": "rgba"}]
    assert np.array_equal(LmdbDataset(tmp_path / "png.lmdb")[0][0], rgb)  # readers give RGB
    with packer.Writer(tmp_path / "jpg.rec", format="recordio", encode="jpeg", quality=90) as w:
        w.add(rgb, 0)
        w.add(rgba, 1)  # JPEG has no alpha: dropped
    rows = _index(tmp_path / "jpg.rec")
    assert [(r["format"], r["channels"]) for r in rows] == [("jpeg", 3), ("jpeg", 3)]
    assert verify(tmp_path / "jpg.rec", deep=True) == []


@pytest.mark.parametrize("fmt", ["lmdb", "recordio"])
def test_writer_raw_lz4_round_trip(tmp_path: Path, fmt: str) -> None:
    rng = np.random.default_rng(2)
    arrays = [make_image(rng, 4 + i, 3 + i, 3 if i % 2 else 1) for i in range(6)]
    out = tmp_path / f"raw.{fmt}"
    with packer.Writer(out, format=fmt, encode="raw", compress="lz4") as w:
        for i, array in enumerate(arrays):
            w.add(array, np.int64(i))
        w.add(encode(arrays[1], ".png"), 9)  # decoded (as BGR) and stored raw (RGB)
    rows = _index(out)
    assert {(r["format"], r["compression"]) for r in rows} == {("raw", "lz4")}
    assert verify(out, deep=True) == []
    ds = open_dataset(out, decode="unchanged")
    for i, array in enumerate(arrays):
        image, label = ds[i]
        assert np.array_equal(image.reshape(array.shape), array)
        assert label == i
    assert np.array_equal(ds[6][0], arrays[1][:, :, ::-1])


def test_rejected_samples_go_to_errors_jsonl(tmp_path: Path) -> None:
    good = _samples(1)[0][0]
    out = tmp_path / "out.lmdb"
    with packer.Writer(out, classes=["cat", "dog"]) as w:
        assert w.add(good, "dog", path="a.png") == 0
        assert w.add(b"hello, not an image", 0, path="text.png") is None
        assert w.add(good[: len(good) // 2], 0, path="cut.png") is None
        assert w.add(good, float("nan"), path="nan.png") is None
        assert w.add(good, "eel", path="eel.png") is None
        assert w.add(good, 2, path="two.png") is None
        assert w.add(good, 1) == 1
    assert [(e["path"], e["reason"]) for e in _errors(out)] == [
        ("text.png", "not_image"),
        ("cut.png", "truncated"),
        ("nan.png", "bad_label"),
        ("eel.png", "bad_label"),
        ("two.png", "bad_label"),
    ]
    meta = json.loads((out / "meta.json").read_text())
    assert (meta["classes"], meta["num_errors"]) == (["cat", "dog"], 5)
    ds = LmdbDataset(out)
    assert (ds.labels.tolist(), len(ds)) == ([1, 1], 2)
    assert verify(out) == []


def test_on_error_fail_raises_and_publishes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "out.lmdb"
    with (  # noqa: PT012
        pytest.raises(InputError, match=r"x\.png: not an image .*\[not_image\]"),
        packer.Writer(out, on_error="fail") as w,
    ):
        w.add(_samples(1)[0][0])
        w.add(b"nope", path="x.png")
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_an_exception_inside_with_leaves_nothing(tmp_path: Path) -> None:
    out = tmp_path / "out.lmdb"
    with pytest.raises(RuntimeError, match="generator failed"), packer.Writer(out) as w:  # noqa: PT012
        for data, label in _samples(5):
            w.add(data, label)
        raise RuntimeError("generator failed")
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    # over an existing dataset with overwrite=True: the old one stays as it was
    with packer.Writer(out) as w:
        w.add(_samples(1)[0][0], 7)
    before = (out / "index.jsonl").read_bytes()
    with (  # noqa: PT012
        pytest.raises(SampleTypeError, match=r"dtype is float32; expected uint8"),
        packer.Writer(out, overwrite=True) as w,
    ):
        w.add(_samples(1)[0][0], 1)
        w.add(np.zeros((4, 4), np.float32))
    assert (out / "index.jsonl").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.lmdb"]


KILLED = """
import os, signal, sys
import numpy as np
import packer
with packer.Writer(sys.argv[1], shard_size=2000) as w:
    for i in range(40):
        w.add(np.full((16, 16, 3), i, np.uint8), i)
        if i == 30:  # shards finished and one half written
            os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_kill_mid_write_leaves_nothing(tmp_path: Path) -> None:
    out = tmp_path / "out.lmdb"
    run = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(KILLED), str(out)],
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == -9, run.stderr
    assert not out.exists()
    assert (tmp_path / ".out.lmdb.partial").is_dir()  # hidden: a later writer or build clears it
    with packer.Writer(out, log=lambda msg: None) as w:
        w.add(np.zeros((2, 2), np.uint8))
    assert verify(out) == []
    assert not (tmp_path / ".out.lmdb.partial").exists()


def test_parallel_add_many_writes_the_same_dataset(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    samples: list[Any] = [(make_image(rng, 5 + i % 4, 6, 3), i % 5) for i in range(150)]
    samples += [(data, label, f"b{i}.img") for i, (data, label) in enumerate(_samples(70))]
    samples += [b"junk", (b"\x89PNG\r\n\x1a\n", 1)]
    for workers in (1, 2):
        with packer.Writer(tmp_path / f"w{workers}", workers=workers, shard_size=4000) as w:
            ids = w.add_many(iter(samples))
        assert ids == [*range(220), None, None]
    for name in ("index.jsonl", "errors.jsonl", "shard-00001/data.mdb"):
        assert (tmp_path / "w1" / name).read_bytes() == (tmp_path / "w2" / name).read_bytes()


def test_writer_mistakes(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"--format 'zip'"):
        packer.Writer(tmp_path / "o", format="zip")
    with pytest.raises(ConfigError, match=r"--compress zstd compresses raw pixels"):
        packer.Writer(tmp_path / "o", compress="zstd")
    with pytest.raises(ConfigError, match=r"classes: 'a' is given twice"):
        packer.Writer(tmp_path / "o", classes=["a", "a"])
    with pytest.raises(ConfigError, match=r"shard_size=1.5: expected str or int"):
        packer.Writer(tmp_path / "o", shard_size=1.5)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"OUT s3://b/x: a Writer writes a local dataset"):
        packer.Writer("s3://b/x")
    w = packer.Writer(tmp_path / "o")
    with pytest.raises(SampleTypeError, match=r"the image is a str"):
        w.add("cat.png")
    with pytest.raises(SampleTypeError, match=r"shape is \(4, 4, 2\)"):
        w.add(np.zeros((4, 4, 2), np.uint8))
    with pytest.raises(SampleTypeError, match=r"the label .* is a set"):
        w.add(np.zeros((4, 4), np.uint8), {1, 2})
    with pytest.raises(PackerError, match=r"no sample was stored in .*o \(0 rejected\)"):
        w.close()
    with pytest.raises(WriterStateError, match="aborted; make a new one"):
        w.add(np.zeros((4, 4), np.uint8))
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    with packer.Writer(tmp_path / "o") as w:
        w.add(np.zeros((4, 4), np.uint8))
    with pytest.raises(OutputExistsError, match="already exists; pass --overwrite"):
        packer.Writer(tmp_path / "o").open()


def test_a_writer_dataset_through_a_dataloader(tmp_path: Path) -> None:
    paddle = pytest.importorskip("paddle")
    samples = _samples(10)
    with packer.Writer(tmp_path / "out.lmdb") as w:
        w.add_many(samples)
    ds = LmdbDataset(tmp_path / "out.lmdb", decode="bytes")

    def as_arrays(batch: list[tuple[bytes, Any]]) -> list[np.ndarray]:
        return [np.frombuffer(data, dtype=np.uint8) for data, _ in batch]

    loader = paddle.io.DataLoader(ds, batch_size=4, num_workers=2, collate_fn=as_arrays)
    assert [a.numpy().tobytes() for batch in loader for a in batch] == [d for d, _ in samples]
    assert ds.labels.tolist() == [label for _, label in samples]


def test_an_open_writer_holds_the_build_lock(tmp_path: Path) -> None:
    write_tree(tmp_path / "src", {"a": 1})
    out = tmp_path / "out.lmdb"
    with packer.Writer(out) as w:
        w.add(np.zeros((3, 3), np.uint8))
        with pytest.raises(packer.errors.BuildLockedError, match=r"is being built by pid \d+"):
            packer.build(tmp_path / "src", out, workers=1)
    assert verify(out) == []
