"""The read side under damage and odd environments: CRC errors that name the record,
on_error="skip", fork/spawn/forkserver workers, read-only media, cut shards, torn or
disagreeing index and meta, and a fuzzed index loader."""

from __future__ import annotations

import builtins
import contextlib
import json
import os
import shutil
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path
from typing import Any

import cv2
import lmdb
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from packer.build import build
from packer.config import BuildConfig
from packer.verify import verify
from readers import LmdbDataset, RecordIODataset, open_dataset
from readers.errors import DatasetFormatError, RecordError
from readers.formats import FORMATS, REGISTRY
from readers.index import load_index, load_meta
from readers.io import handles

SHAPE = (12, 10, 3)
ROOT = Path(__file__).resolve().parents[2]


def write_src(src: Path, per_class: int = 8) -> dict[str, np.ndarray]:
    """Two class folders of same-size PNGs (so DataLoader batches collate); RGB by path."""
    rng = np.random.default_rng(11)
    images = {}
    for cls in ("a", "b"):
        (src / cls).mkdir(parents=True)
        for i in range(per_class):
            bgr = rng.integers(0, 256, SHAPE, dtype=np.uint8)
            ok, buf = cv2.imencode(".png", bgr)
            assert ok
            (src / cls / f"{i:02d}.png").write_bytes(buf.tobytes())
            images[f"{cls}/{i:02d}.png"] = cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)
    return images


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One small dataset of 16 samples in 3+ shards per format, built once; tests copy it."""
    root = tmp_path_factory.mktemp("built")
    write_src(root / "src")
    out = {}
    for fmt in FORMATS:
        out[fmt] = root / fmt
        build(
            BuildConfig(src=root / "src", out=out[fmt], format=fmt, shard_size=2000, progress=False)
        )
        assert len(json.loads((out[fmt] / "meta.json").read_text())["shards"]) >= 3
    return out


@pytest.fixture(params=FORMATS)
def dataset(request: pytest.FixtureRequest, built: dict[str, Path], tmp_path: Path) -> Path:
    """A fresh copy of the built dataset in the parametrized format."""
    out = tmp_path / request.param
    shutil.copytree(built[request.param], out)
    return out


def rows(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "index.jsonl").read_text().splitlines()]


def meta_of(out: Path) -> dict[str, Any]:
    return json.loads((out / "meta.json").read_text())


def corrupt_image_byte(out: Path, i: int, *, at: int = -20) -> None:
    """Flip one byte inside the stored image bytes of sample `i` (not in any header), where
    the shard's data file holds them."""
    stored = open_dataset(out, decode="bytes").read_bytes(i)
    meta = meta_of(out)
    fmt = REGISTRY[meta["format"]]
    shard = meta["shards"][rows(out)[i]["shard"]]["name"]
    handles.close_all()
    data = Path(fmt.data_file(fmt.shard_path(out, shard)))
    blob = bytearray(data.read_bytes())
    # every copy: a database file may keep stale copies of a value in pages it has freed
    where = bytes(blob).find(stored)
    assert where >= 0
    while where >= 0:
        blob[where + len(stored) + at if at < 0 else where + at] ^= 0xFF
        where = bytes(blob).find(stored, where + 1)
    data.write_bytes(bytes(blob))


def break_record(out: Path, i: int) -> None:
    """Make sample `i` fail to read: its image is garbage (LMDB) or its magic is gone (.rec)."""
    row = rows(out)[i]
    meta = meta_of(out)
    shard = meta["shards"][row["shard"]]["name"]
    handles.close_all()
    if meta["format"] == "lmdb":
        env = lmdb.open(str(out / shard))
        with env.begin(write=True) as txn:
            txn.put(row["key"].encode(), b"\x89PNG\r\n\x1a\n garbage")
        env.close()
    else:
        rec = out / f"{shard}.rec"
        blob = bytearray(rec.read_bytes())
        blob[row["offset"]] ^= 0xFF
        rec.write_bytes(bytes(blob))


# --------------------------------------------------------------------------------------------
# CRC-32 on read


def test_verify_crc_error_names_shard_key_and_sample(dataset):
    corrupt_image_byte(dataset, 5)
    ds = open_dataset(dataset, verify_crc=True, decode="bytes")
    row = rows(dataset)[5]
    shard = meta_of(dataset)["shards"][row["shard"]]["name"]
    assert row["shard"] > 0  # a shard other than the first: the numbers are not trivially 0
    key = row["key"]
    pattern = rf"{shard}(\.rec)? key {key} sample 5 .*CRC-32 [0-9a-f]{{8}} does not match"
    with pytest.raises(RecordError, match=pattern) as caught:
        ds[5]
    assert row["path"] in str(caught.value)
    assert open_dataset(dataset, decode="bytes")[5][0] != b""  # without the check it reads
    ds[4]  # neighbours are fine


# --------------------------------------------------------------------------------------------
# on_error="skip"


def test_on_error_skip_replaces_a_bad_sample_by_the_next_good_one(dataset):
    break_record(dataset, 6)
    corrupt_image_byte(dataset, 7)  # a CRC failure right after it: skipped as well
    strict = open_dataset(dataset, verify_crc=True)
    with pytest.raises(RecordError):
        strict[6]
    with pytest.raises(RecordError, match="CRC-32"):
        strict[7]

    ds = open_dataset(dataset, verify_crc=True, on_error="skip")
    good = open_dataset(dataset, verify_crc=True)
    with pytest.warns(RuntimeWarning, match=r"sample 6 .*returning sample 8 in its place"):
        image, label = ds[6]
    expected_image, expected_label = good[8]
    np.testing.assert_array_equal(image, expected_image)
    assert label == expected_label
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per process: no second warning
        for _ in range(3):  # deterministic over epochs
            np.testing.assert_array_equal(ds[7][0], expected_image)
            np.testing.assert_array_equal(ds[6][0], expected_image)
        np.testing.assert_array_equal(ds[5][0], good[5][0])
    assert ds.skipped == 7
    assert open_dataset(dataset, on_error="skip").skipped == 0  # per dataset object


def test_on_error_skip_wraps_around_and_fails_when_nothing_is_readable(dataset):
    n = len(open_dataset(dataset))
    break_record(dataset, n - 1)
    ds = open_dataset(dataset, on_error="skip")
    with pytest.warns(RuntimeWarning):
        np.testing.assert_array_equal(ds[n - 1][0], open_dataset(dataset)[0][0])
    for i in range(n - 1):
        break_record(dataset, i)
    ds = open_dataset(dataset, on_error="skip")
    with pytest.raises(RecordError, match=f"no sample of {n} could be read"):
        ds[3]
    with pytest.raises(ValueError, match="on_error"):
        open_dataset(dataset, on_error="ignore")


def test_on_error_skip_state_is_not_pickled(dataset):
    import pickle

    break_record(dataset, 2)
    ds = open_dataset(dataset, on_error="skip")
    with pytest.warns(RuntimeWarning):
        ds[2]
    copy = pickle.loads(pickle.dumps(ds))
    assert (copy.skipped, copy.on_error) == (0, "skip")
    with pytest.warns(RuntimeWarning):  # a new process warns once for itself
        copy[2]


# --------------------------------------------------------------------------------------------
# fork, spawn and forkserver workers

WORKER_SCRIPT = textwrap.dedent(
    """
    import json, multiprocessing as mp, os, sys, zlib
    import numpy as np

    def digest(sample):
        image, label = sample
        return [zlib.crc32(np.ascontiguousarray(image).tobytes()), int(label)]

    def read_twice(args):
        from readers import open_dataset
        from readers.io import handles
        path, ids = args
        first, second = open_dataset(path), open_dataset(path)
        out = []
        for i in ids:
            a, b = first[i], second[i]
            assert (a[0] == b[0]).all() and a[1] == b[1]
            out.append(digest(a))
        return os.getpid(), out, sorted(str(kind).split(":")[0] for kind, _ in handles._entries)

    if __name__ == "__main__":
        method, epochs = sys.argv[1], int(sys.argv[2])
        paths = sys.argv[3:]
        import paddle
        from readers import open_dataset
        report = {}
        for path in paths:
            ds = open_dataset(path)
            n = len(ds)
            expected = [digest(ds[i]) for i in range(n)]  # the parent's handles are open
            result = {"pool": [], "loader": []}
            with mp.get_context(method).Pool(2) as pool:
                for epoch in range(epochs):
                    order = np.random.default_rng(epoch).permutation(n).tolist()
                    got = [digest(s) for s in pool.map(ds.__getitem__, order, chunksize=3)]
                    result["pool"].append(got == [expected[i] for i in order])
                twice = pool.map(read_twice, [(path, list(range(n)))] * 4, chunksize=1)
            result["twice"] = [out == expected for _, out, _ in twice]
            result["handle_kinds"] = [kinds for _, _, kinds in twice]
            result["pids"] = len({pid for pid, _, _ in twice} - {os.getpid()})
            mp.set_start_method(method, force=True)  # paddle's DataLoader uses the default
            loader = paddle.io.DataLoader(
                ds, batch_size=4, shuffle=False, num_workers=2, use_shared_memory=True
            )
            for epoch in range(epochs):
                seen = []
                for images, labels in loader:
                    for image, label in zip(images.numpy(), labels.numpy().ravel().tolist()):
                        seen.append([zlib.crc32(np.ascontiguousarray(image).tobytes()), label])
                result["loader"].append(seen == expected)
            report[os.path.basename(path)] = result
        print("REPORT " + json.dumps(report))
    """
)


@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_workers_by_every_start_method_over_three_epochs(built, tmp_path, method):
    script = tmp_path / "workers.py"
    script.write_text(WORKER_SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, str(script), method, "3", *(str(built[fmt]) for fmt in FORMATS)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=tmp_path,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("REPORT "))
    report = json.loads(line[len("REPORT ") :])
    shards = {fmt: len(meta_of(built[fmt])["shards"]) for fmt in FORMATS}
    for fmt in FORMATS:
        result = report[fmt]
        assert result["pool"] == [True] * 3, fmt
        assert result["loader"] == [True] * 3, fmt
        assert all(result["twice"]), fmt
        assert result["pids"] >= 1
        kind = "lmdb" if fmt == "lmdb" else "mmap"
        for kinds in result["handle_kinds"]:
            # two dataset objects on one path share one handle per shard in each process
            assert kinds.count(kind) == shards[fmt], kinds


# --------------------------------------------------------------------------------------------
# Read-only media


def _files_under(root: Path) -> dict[str, tuple[int, int]]:
    return {
        str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def test_opens_without_write_access_or_a_lock_file(dataset, monkeypatch):
    for lock in dataset.rglob("lock.mdb"):
        lock.unlink()
    before = _files_under(dataset)
    for p in [dataset, *dataset.rglob("*")]:
        p.chmod(0o555 if p.is_dir() else 0o444)
    writes: list[str] = []
    real_open, real_os_open = builtins.open, os.open

    def spy_open(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        if str(file).startswith(str(dataset)) and any(c in mode for c in "wax+"):
            writes.append(f"open({file}, {mode})")
        return real_open(file, mode, *args, **kwargs)

    def spy_os_open(path: Any, flags: int, *args: Any, **kwargs: Any) -> Any:
        if str(path).startswith(str(dataset)) and flags & (
            os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
        ):
            writes.append(f"os.open({path}, {flags:#o})")
        return real_os_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", spy_open)
    monkeypatch.setattr(os, "open", spy_os_open)
    try:
        ds = open_dataset(dataset, verify_crc=True)
        for i in range(len(ds)):
            ds[i]
        ds.prefetch(0, len(ds))
        if isinstance(ds, LmdbDataset):
            env = ds._env(0)
            assert env.flags()["readonly"] is True
            assert env.flags()["lock"] is False
        assert verify(dataset) == []
    finally:
        monkeypatch.undo()
        for p in [dataset, *dataset.rglob("*")]:
            p.chmod(0o755 if p.is_dir() else 0o644)
    assert writes == []
    assert _files_under(dataset) == before  # nothing created (no lock.mdb), nothing touched


RO_SCRIPT = textwrap.dedent(
    """
    import sys
    from readers import open_dataset
    from packer.verify import verify
    for path in sys.argv[1:]:
        ds = open_dataset(path, verify_crc=True)
        n = sum(1 for i in range(len(ds)) if ds[i][0].shape == (12, 10, 3))
        assert n == len(ds) > 0, n
        problems = verify(path)
        assert problems == [], problems
    print("READ-ONLY OK")
    """
)


def test_reads_and_verifies_on_a_read_only_mount(built, tmp_path):
    """A real read-only file system (a bind mount remounted ro in a private mount namespace):
    even root gets EROFS for any write."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare(1) for a private read-only bind mount")
    data = tmp_path / "data"
    for fmt in FORMATS:
        shutil.copytree(built[fmt], data / fmt)
        for lock in (data / fmt).rglob("lock.mdb"):
            lock.unlink()
    script = tmp_path / "ro.py"
    script.write_text(RO_SCRIPT)
    inner = (
        f"mount --bind {data} {data} && mount -o remount,bind,ro {data} && "
        f"touch {data}/probe 2>/dev/null && echo WRITABLE; "
        f"{sys.executable} {script} {data}/lmdb {data}/recordio"
    )
    done = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", inner],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        check=False,
    )
    if "Operation not permitted" in done.stderr or "permission denied" in done.stderr.lower():
        pytest.skip(f"no mount namespace here: {done.stderr.strip()[:200]}")
    assert "WRITABLE" not in done.stdout
    assert done.returncode == 0, done.stderr[-3000:]
    assert "READ-ONLY OK" in done.stdout
    assert not list(data.rglob("lock.mdb"))


# --------------------------------------------------------------------------------------------
# Damaged files: a clear error naming the file and line or offset


@pytest.mark.parametrize("keep", [0, 4096, 8192, 0.5, -1])
def test_truncated_lmdb_shard_is_a_clear_error_not_sigbus(built, tmp_path, keep):
    out = tmp_path / "lmdb"
    shutil.copytree(built["lmdb"], out)
    data = out / "shard-00001" / "data.mdb"
    size = data.stat().st_size
    os.truncate(data, int(size * keep) if isinstance(keep, float) else keep % size)
    ds = LmdbDataset(out, decode="bytes")
    first = int(meta_of(out)["shards"][1]["first"])
    ds[0]  # other shards still read
    with pytest.raises(DatasetFormatError, match=r"shard-00001/data\.mdb: .*(cut short|LMDB)"):
        ds[first]
    problems = verify(out)
    assert any(("shard-00001" in p and "cut short" in p) or "LMDB" in p for p in problems)


def test_missing_shard_is_an_error_at_open(dataset):
    name = meta_of(dataset)["shards"][2]["name"]
    for p in dataset.glob(f"{name}*"):
        shutil.rmtree(p) if p.is_dir() else p.unlink()
    with pytest.raises(DatasetFormatError, match=rf"{name}.*(missing|cannot open).*shard 2"):
        open_dataset(dataset)


def test_truncated_recordio_shard_is_an_error_at_open(built, tmp_path):
    out = tmp_path / "rec"
    shutil.copytree(built["recordio"], out)
    rec = out / "shard-00001.rec"
    size = rec.stat().st_size
    os.truncate(rec, size - 10)
    with pytest.raises(
        DatasetFormatError,
        match=r"shard-00001\.rec: the record at offset \d+ \(index\.jsonl "
        r"line \d+, sample \d+\) is \d+ bytes long and would end at byte \d+, past the end",
    ):
        RecordIODataset(out)
    last = [r for r in rows(out) if r["shard"] == 1][-1]
    os.truncate(rec, last["offset"] - 4)
    with pytest.raises(
        DatasetFormatError,
        match=rf"index\.jsonl line {last['id'] + 1} \(sample {last['id']}\) gives offset "
        rf"{last['offset']}, past the end of the file",
    ):
        RecordIODataset(out)
    assert any("shard-00001" in p for p in verify(out))


def test_offset_that_does_not_point_at_its_record(built, tmp_path):
    out = tmp_path / "rec"
    shutil.copytree(built["recordio"], out)
    (out / "index.parquet").unlink()
    lines = rows(out)
    shard1 = [r for r in lines if r["shard"] == 1]
    # the last sample of shard 1 points at the first record of shard 1: found at open
    lines[shard1[-1]["id"]]["offset"] = shard1[0]["offset"]
    write_rows(out, lines)
    with pytest.raises(
        DatasetFormatError,
        match=rf"shard-00001\.rec: offset {shard1[0]['offset']} \(index\.jsonl line "
        rf"{shard1[-1]['id'] + 1}\) holds the record of sample {shard1[0]['id']}",
    ):
        RecordIODataset(out)
    # a middle sample pointing into the middle of a record: found when read, and by verify
    lines = rows(built["recordio"])
    middle = next(r for r in lines if r["shard"] == 0 and 0 < r["id"] < len(shard1) - 1)
    middle_id = middle["id"]
    lines[middle_id]["offset"] += 12
    write_rows(out, lines)
    ds = RecordIODataset(out)
    with pytest.raises(RecordError, match=rf"shard-00000\.rec key \d+ sample {middle_id} \(offset"):
        ds[middle_id]
    assert verify(out) != []


def write_rows(out: Path, lines: list[dict[str, Any]]) -> None:
    text = "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in lines)
    (out / "index.jsonl").write_text(text)


def test_torn_last_index_line_is_an_error_at_open(dataset):
    text = (dataset / "index.jsonl").read_bytes()
    (dataset / "index.jsonl").write_bytes(text[:-15])  # parquet now stale: the jsonl is read
    n = text.count(b"\n")
    with (
        pytest.warns(UserWarning, match="does not match"),
        pytest.raises(DatasetFormatError, match=rf"index\.jsonl:{n}: the last line is cut short"),
    ):
        open_dataset(dataset)


@pytest.mark.parametrize("columnar", [True, False])
def test_meta_that_disagrees_with_the_index(dataset, columnar):
    if not columnar:
        (dataset / "index.parquet").unlink()
    meta = meta_of(dataset)
    original = json.dumps(meta)

    def check(change: Any, pattern: str) -> None:
        edited = json.loads(original)
        change(edited)
        (dataset / "meta.json").write_text(json.dumps(edited))
        with pytest.raises(DatasetFormatError, match=pattern):
            open_dataset(dataset)

    def move_one(m: dict[str, Any]) -> None:  # shard 0 one sample shorter, shard 1 longer
        m["shards"][0]["count"] -= 1
        m["shards"][1]["first"] -= 1
        m["shards"][1]["count"] += 1

    def one_more(m: dict[str, Any]) -> None:
        m["num_samples"] += 1
        m["shards"][-1]["count"] += 1

    count = meta["shards"][0]["count"]
    where = "index.parquet" if columnar else rf"index\.jsonl:{count}"
    check(move_one, rf"{where}.*sample {count - 1} .*shard|shard is 0, but .* shard 1")
    check(one_more, r"index\.jsonl: \d+ lines but meta\.json says num_samples = \d+")
    check(lambda m: m.update(num_shards=99), r"num_shards is 99 but the shard table lists \d+")
    check(lambda m: m.update(version=99), "format version 99 was written by a newer packer")
    check(
        lambda m: m["shards"][0].update(name="../elsewhere"),
        r"shard 0 has name '\.\./elsewhere', expected a file name",
    )
    check(lambda m: m["shards"][0].update(first=1), "shard 0 starts at id 1, expected 0")


def test_bad_index_lines_name_the_file_and_line(dataset):
    (dataset / "index.parquet").unlink()
    lines = rows(dataset)
    original = [dict(r) for r in lines]
    for field, value, pattern in [
        ("nbytes", -1, "nbytes is -1"),
        ("crc32", "abc", "crc32 is 'abc'"),
        ("offset", 1.5, "offset is 1.5"),
        ("id", True, "id is True"),
    ]:
        lines = [dict(r) for r in original]
        lines[3][field] = value
        write_rows(dataset, lines)
        with pytest.raises(DatasetFormatError, match=rf"index\.jsonl:4: {pattern}"):
            load_index(dataset)
    (dataset / "index.jsonl").write_bytes(b'{"id": 0}\n\xff\xfe\n')
    with pytest.raises(DatasetFormatError, match=r"index\.jsonl:1: nbytes is None"):
        load_index(dataset)
    (dataset / "index.jsonl").write_bytes(b"\xff\xfe\n")
    with pytest.raises(DatasetFormatError, match=r"index\.jsonl:1: not UTF-8"):
        load_index(dataset)


def test_huge_int_labels_fall_back_to_json(dataset):
    (dataset / "index.parquet").unlink()
    lines = rows(dataset)
    lines[0]["label"] = 2**70
    write_rows(dataset, lines)
    index = load_index(dataset)
    assert index.labels.kind == "json"
    assert index.labels[0] == 2**70


# --------------------------------------------------------------------------------------------
# Fuzzing: the index loader raises DatasetFormatError or loads, nothing else

_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True)
    | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=12,
)
_keys = st.sampled_from(
    [
        "id",
        "path",
        "label",
        "shard",
        "key",
        "offset",
        "nbytes",
        "width",
        "height",
        "channels",
        "format",
        "crc32",
    ]
)


def _row(n: int) -> dict[str, Any]:
    return {
        "id": n,
        "path": f"a/{n}.png",
        "label": n % 3,
        "shard": 0,
        "key": f"image-{n + 1:09d}",
        "nbytes": 10,
        "width": 2,
        "height": 2,
        "channels": 3,
        "format": "png",
        "crc32": 7,
    }


def _meta(n: int) -> dict[str, Any]:
    return {
        "format": "lmdb",
        "version": 1,
        "num_samples": n,
        "num_shards": 1,
        "shards": [{"name": "shard-00000", "first": 0, "count": n, "bytes": 10 * n}],
    }


def _load(root: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with contextlib.suppress(DatasetFormatError):
            load_index(root, extra=("width", "height", "channels", "format", "path"))


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    data=st.data(),
    mode=st.sampled_from(["bytes", "lines", "fields"]),
)
def test_fuzzed_index_jsonl_raises_only_dataset_format_error(tmp_path, data, mode):
    root = tmp_path / "fuzz"
    root.mkdir(exist_ok=True)
    n = data.draw(st.integers(0, 5))
    lines = [json.dumps(_row(i)) + "\n" for i in range(n)]
    if mode == "bytes":
        blob = data.draw(st.binary(max_size=200))
    elif mode == "lines":
        extra = data.draw(st.lists(st.text(max_size=30), max_size=4))
        at = data.draw(st.integers(0, n))
        blob = "".join(lines[:at] + [x + "\n" for x in extra] + lines[at:]).encode(
            "utf-8", "surrogatepass"
        )
    else:
        rows_ = [_row(i) for i in range(n)]
        for _ in range(data.draw(st.integers(1, 4))):
            if not rows_:
                break
            target = rows_[data.draw(st.integers(0, len(rows_) - 1))]
            target[data.draw(_keys)] = data.draw(_json)
        blob = "".join(json.dumps(r) + "\n" for r in rows_).encode()
        if data.draw(st.booleans()) and blob:
            blob = blob[: data.draw(st.integers(0, len(blob)))]
    (root / "meta.json").write_text(json.dumps(_meta(n)))
    (root / "index.jsonl").write_bytes(blob)
    _load(root)


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data(), mode=st.sampled_from(["bytes", "json", "fields"]))
def test_fuzzed_meta_json_raises_only_dataset_format_error(tmp_path, data, mode):
    root = tmp_path / "fuzz"
    root.mkdir(exist_ok=True)
    n = 3
    (root / "index.jsonl").write_text("".join(json.dumps(_row(i)) + "\n" for i in range(n)))
    if mode == "bytes":
        blob = data.draw(st.binary(max_size=200))
    elif mode == "json":
        blob = json.dumps(data.draw(_json)).encode()
    else:
        meta = _meta(n)
        for _ in range(data.draw(st.integers(1, 3))):
            if data.draw(st.booleans()):
                meta[data.draw(st.sampled_from(sorted(meta)))] = data.draw(_json)
            else:
                meta["shards"] = [
                    {k: data.draw(_json) if data.draw(st.booleans()) else v for k, v in s.items()}
                    for s in (meta["shards"] if isinstance(meta["shards"], list) else [])
                    if isinstance(s, dict)
                ]
        blob = json.dumps(meta).encode()
    (root / "meta.json").write_bytes(blob)
    _load(root)
    with contextlib.suppress(DatasetFormatError):
        load_meta(root)
