"""``packer merge``: records copied as stored, class names united with ids remapped and the map
recorded, checked record by record against the sources and with ``packer verify``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from packer.cli import app
from packer.errors import PackerError
from packer.labels.classmap import ClassGrowthError, remap_label, unite_classes
from packer.regroup import merge_datasets
from readers import open_dataset
from readers.formats.layout import INDEX_NAME, META_NAME
from tests.conftest import build_packed, write_tree

runner = CliRunner()


def rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / INDEX_NAME).read_text().splitlines()]


def test_unite_classes_keeps_the_first_ids() -> None:
    united, table = unite_classes(["cat", "dog"], ["eel", "dog", "ant"], grow=True)
    assert united == ["cat", "dog", "eel", "ant"]
    assert table == [2, 1, 3]
    assert remap_label(0, table) == 2
    assert remap_label([0, 2], table) == [2, 3]
    assert remap_label("text", table) == "text"
    with pytest.raises(ClassGrowthError, match="'eel', 'ant'"):
        unite_classes(["cat", "dog"], ["eel", "dog", "ant"], grow=False)


def test_merge_unites_classes_record_by_record(tmp_path: Path, fmt: str) -> None:
    a_files = write_tree(tmp_path / "a", {"cat": 3, "dog": 2})
    b_files = write_tree(tmp_path / "b", {"ant": 2, "dog": 3, "fox": 1}, seed=4)
    a = build_packed(tmp_path / "a", tmp_path / "a.ds", fmt, workers=1)
    b = build_packed(tmp_path / "b", tmp_path / "b.ds", fmt, workers=1, shard_size=1500)
    out = tmp_path / "merged"
    result = runner.invoke(app, ["merge", str(out), str(a), str(b), "--shard-size", "2000"])
    assert result.exit_code == 0, result.output
    meta = json.loads((out / META_NAME).read_text())
    assert meta["classes"] == ["cat", "dog", "ant", "fox"]
    merged = meta["options"]["merged"]
    assert [m["first_id"] for m in merged] == [0, 5]
    assert merged[0]["class_ids"] == [0, 1]
    assert merged[1]["class_ids"] == [2, 1, 3]  # b's ant, dog, fox
    ds = open_dataset(str(out), decode="bytes")
    src = [open_dataset(str(a), decode="bytes"), open_dataset(str(b), decode="bytes")]
    src_rows = rows(a) + rows(b)
    assert len(ds) == len(src_rows) == 11
    files = {
        **{f"a:{k}": v for k, v in a_files.items()},
        **{f"b:{k}": v for k, v in b_files.items()},
    }
    for i, row in enumerate(rows(out)):
        origin = 0 if i < 5 else 1
        j = i if origin == 0 else i - 5
        data, label = ds[i]
        old_data, _ = src[origin][j]
        assert bytes(data) == bytes(old_data) == files[f"{'ab'[origin]}:{row['path']}"]
        assert row["path"] == src_rows[i]["path"]
        assert meta["classes"][label] == row["path"].split("/")[0]
        for key in ("nbytes", "width", "height", "channels", "format", "crc32"):
            assert row[key] == src_rows[i][key]
    verify = runner.invoke(app, ["verify", str(out), "--deep"])
    assert verify.exit_code == 0, verify.output


def test_merge_refuses_mixed_formats_and_one_source(tmp_path: Path) -> None:
    write_tree(tmp_path / "a", {"cat": 2})
    a = build_packed(tmp_path / "a", tmp_path / "a.lmdb", "lmdb", workers=1)
    b = build_packed(tmp_path / "a", tmp_path / "b.rec", "recordio", workers=1)
    with pytest.raises(PackerError, match="different formats"):
        merge_datasets(tmp_path / "m", [a, b])
    with pytest.raises(PackerError, match="two or more"):
        merge_datasets(tmp_path / "m", [a])
    assert not (tmp_path / "m").exists()
