"""``packer verify`` of a dataset in S3 whose LMDB shard has no ``wh-`` keys (an older packer's):
OK, with the note on stderr naming the URL's shard, as for a local dataset."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from packer.cli import app
from packer.publish import publish
from tests.conftest import write_tree
from tests.packer.test_wh_keys import _drop_wh_keys, _rewrite


def test_verify_of_an_older_lmdb_in_s3_notes_the_missing_wh_keys(
    tmp_path: Path, bucket: str
) -> None:
    runner = CliRunner()
    src, out = tmp_path / "src", tmp_path / "old.lmdb"
    write_tree(src, {"a": 3, "b": 3})
    assert runner.invoke(app, ["build", str(src), str(out), "--no-progress"]).exit_code == 0
    _rewrite(out / "shard-00000", _drop_wh_keys)
    meta = json.loads((out / "meta.json").read_text())  # the shard's size as now on disk
    meta["shards"][0]["file_bytes"] = (out / "shard-00000" / "data.mdb").stat().st_size
    (out / "meta.json").write_text(json.dumps(meta))
    url = f"{bucket}/old.lmdb"
    publish(out, url, log=lambda _msg: None)
    result: Any = runner.invoke(app, ["verify", url])
    assert result.exit_code == 0, result.output
    assert result.stdout == f"{url}: OK\n"
    assert result.stderr.startswith("note: shard-00000: no wh- keys (built by an older packer)")
