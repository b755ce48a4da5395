"""packer convert of inputs written by other tools: nothing is lost or altered unreported.

Bare LMDB labels that are not UTF-8 or missing, a ``num-samples`` beyond what the LMDB holds,
WebDataset tars with damaged headers, links and extra members, InsightFace ``.rec`` files with
images outside the header's range, and NaN/Infinity labels: every record that is not converted
is in ``errors.jsonl`` with its reason, and every label written is JSON.
"""

from __future__ import annotations

import io
import json
import struct
import tarfile
import time
from pathlib import Path
from typing import Any

import lmdb
import pytest
from typer.testing import CliRunner

from packer.cli import app
from packer.convert import ConvertConfig, convert
from packer.verify import verify
from tests.packer.test_convert import _images, _read_out, _record, write_mxnet_rec

runner = CliRunner()


def _errors(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "errors.jsonl").read_text().splitlines()]


def _index(out: Path) -> list[dict[str, Any]]:
    # json.loads with parse_constant refusing NaN/Infinity: the index must be strict JSON
    def refuse(name: str) -> Any:
        raise AssertionError(f"index.jsonl holds {name}")

    text = (out / "index.jsonl").read_text()
    return [json.loads(line, parse_constant=refuse) for line in text.splitlines()]


def _write_lmdb(root: Path, pairs: list[tuple[bytes, bytes | None]], *, count: int | None = None):
    """A PaddleOCR-layout LMDB from raw label bytes (None: no label key), by py-lmdb."""
    env = lmdb.open(str(root), map_size=1 << 26, subdir=True)
    with env.begin(write=True) as txn:
        for i, (data, label) in enumerate(pairs, start=1):
            txn.put(b"image-%09d" % i, data)
            if label is not None:
                txn.put(b"label-%09d" % i, label)
        txn.put(b"num-samples", str(len(pairs) if count is None else count).encode())
    env.close()


# ----------------------------------------------------------------------- item 6: LMDB labels


def test_lmdb_labels_that_are_not_utf8_are_bad_label_never_replaced(tmp_path: Path) -> None:
    images = _images(5)
    labels = ["你好".encode("gbk"), "再见".encode("gbk"), "café".encode("latin-1"), b"ok", None]
    _write_lmdb(
        tmp_path / "st", [(images[0], "中文".encode()), *zip(images[1:], labels[:4], strict=True)]
    )
    _write_lmdb(tmp_path / "st2", [(images[0], b"a"), (images[1], labels[0]), (images[2], None)])
    out = tmp_path / "out"
    summary = convert(ConvertConfig(tmp_path / "st", out))
    assert summary.packed == 2
    assert [g[1] for g in _read_out(out)] == ["中文", "ok"]
    errors = _errors(out)
    assert [(e["path"], e["reason"]) for e in errors] == [
        ("image-000000002", "bad_label"),
        ("image-000000003", "bad_label"),
        ("image-000000004", "bad_label"),
    ]
    assert "label-000000002 is not UTF-8 text" in errors[0]["message"]
    assert repr("你好".encode("gbk")) in errors[0]["message"]  # the bytes, escaped
    assert repr("café".encode("latin-1")) in errors[2]["message"]
    assert "\ufffd" not in (out / "index.jsonl").read_text()
    assert verify(out, deep=True) == []

    out2 = tmp_path / "out2"
    convert(ConvertConfig(tmp_path / "st2", out2))
    assert [(e["path"], e["reason"]) for e in _errors(out2)] == [
        ("image-000000002", "bad_label"),
        ("image-000000003", "no_label"),
    ]
    assert "no label-000000003 key" in _errors(out2)[1]["message"]


def test_lmdb_without_any_label_key_converts_with_null_labels(tmp_path: Path) -> None:
    images = _images(2)
    _write_lmdb(tmp_path / "st", [(images[0], None), (images[1], None)])
    out = tmp_path / "out"
    convert(ConvertConfig(tmp_path / "st", out))
    assert [g[1] for g in _read_out(out)] == [None, None]
    assert _errors(out) == []
    assert json.loads((out / "meta.json").read_text())["label_source"] == "none"


def test_lmdb_bad_label_with_on_error_fail_exits_2(tmp_path: Path) -> None:
    images = _images(2)
    _write_lmdb(tmp_path / "st", [(images[0], b"a"), (images[1], b"\xff\xfe")])
    result = runner.invoke(
        app, ["convert", str(tmp_path / "st"), str(tmp_path / "out"), "--on-error", "fail"]
    )
    assert result.exit_code == 2
    assert "bad_label" in result.output or "not UTF-8" in result.output
    assert not (tmp_path / "out").exists()


def test_lmdb_image_keys_past_num_samples_are_reported(tmp_path: Path) -> None:
    images = _images(4)
    _write_lmdb(tmp_path / "st", [(d, b"x") for d in images], count=2)
    out = tmp_path / "out"
    convert(ConvertConfig(tmp_path / "st", out))
    assert len(_read_out(out)) == 2
    assert [(e["path"], e["reason"]) for e in _errors(out)] == [
        ("image-000000003", "extra_member"),
        ("image-000000004", "extra_member"),
    ]


# ------------------------------------------------------------- item 13: num-samples too large


def test_lmdb_num_samples_beyond_its_entries_fails_at_once(tmp_path: Path) -> None:
    images = _images(3)
    _write_lmdb(tmp_path / "st", [(d, b"x") for d in images], count=10**9)
    started = time.monotonic()
    result = runner.invoke(app, ["convert", str(tmp_path / "st"), str(tmp_path / "out")])
    assert time.monotonic() - started < 10
    assert result.exit_code == 2
    assert "'num-samples' says 1000000000 samples, but the LMDB holds only 7 keys" in (
        result.output
    )
    assert not (tmp_path / "out").exists()
