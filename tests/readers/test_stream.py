"""ShardStream: order invariants over seeds x epochs x ranks, locality, resume, real DataLoader."""

from __future__ import annotations

import copy
import itertools
import pickle
import threading
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import cv2
import numpy as np
import paddle
import pytest

import readers.stream as stream_mod
from packer.build import build
from packer.config import BuildConfig
from packer.transform import Transform
from readers import LmdbDataset, ShardStream
from readers.formats import FORMATS
from readers.order import chunk_ranges, worker_counts
from readers.stream import PERSISTENT_WORKERS
from tests.readers.test_order import round_robin

N = 151  # odd, so ranks and workers get uneven shares and batches run short mid-epoch
SHAPE = (10, 12, 3)


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real LMDB of N random fixed-size PNGs in 3 classes, in several uneven shards."""
    root = tmp_path_factory.mktemp("stream")
    rng = np.random.default_rng(3)
    for i in range(N):
        cls = root / "src" / f"c{i % 3}"
        cls.mkdir(parents=True, exist_ok=True)
        ok, buf = cv2.imencode(".png", rng.integers(0, 256, SHAPE, dtype=np.uint8))
        assert ok
        (cls / f"{i:03d}.png").write_bytes(buf.tobytes())
    out = root / "out.lmdb"
    build(BuildConfig(src=root / "src", out=out, shard_size=12_000))
    return out


@pytest.fixture(scope="module")
def truth(packed: Path) -> dict[str, Any]:
    """What the map-style dataset says: bytes, decoded images and labels by id."""
    raw, rgb = LmdbDataset(packed, decode="bytes"), LmdbDataset(packed)
    assert len(raw) == N
    assert len(raw.shard_bounds) > 3
    images = [rgb[i][0] for i in range(N)]
    return {
        "bounds": raw.shard_bounds,
        "bytes": {raw[i][0]: i for i in range(N)},
        "pixels": {im.tobytes(): i for i, im in enumerate(images)},
        "images": images,
        "labels": [raw[i][1] for i in range(N)],
    }


def fake_worker(monkeypatch: pytest.MonkeyPatch, worker: int | None, num: int = 0) -> None:
    info = None if worker is None else SimpleNamespace(id=worker, num_workers=num)
    monkeypatch.setattr(stream_mod, "_worker_info", lambda: info)


def emulate_workers(
    monkeypatch: pytest.MonkeyPatch, stream: ShardStream, num_workers: int
) -> list[list[Any]]:
    """What each DataLoader worker yields: a fresh copy of the stream per worker, as a fork
    (or spawn) gives it."""
    if num_workers == 0:
        fake_worker(monkeypatch, None)
        return [list(pickle.loads(pickle.dumps(stream)))]
    out = []
    for w in range(num_workers):
        fake_worker(monkeypatch, w, num_workers)
        out.append(list(pickle.loads(pickle.dumps(stream))))
    fake_worker(monkeypatch, None)
    return out


def as_ids(items: list[Any], truth: dict[str, Any]) -> list[int]:
    return [truth["bytes"][image] for image, _ in items]


# ------------------------------------------------------------------ order invariants


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("world", [1, 2, 3])
def test_ranks_and_workers_cover_the_dataset(
    packed: Path, truth: dict[str, Any], world: int, drop_last: bool
) -> None:
    bounds = truth["bounds"]
    for seed in (0, 1, 12345):
        streams = [
            ShardStream(
                packed,
                chunk_size=8,
                shuffle_buffer=16,
                seed=seed,
                drop_last=drop_last,
                rank=r,
                world_size=world,
            )
            for r in range(world)
        ]
        again = ShardStream(
            packed,
            chunk_size=8,
            shuffle_buffer=16,
            seed=seed,
            drop_last=drop_last,
            rank=world - 1,
            world_size=world,
        )
        per = N // world if drop_last else -(-N // world)
        loader = SimpleNamespace(batch_size=8, num_workers=2, drop_last=False)
        assert {s.batches_per_epoch(loader) for s in streams} == {-(-(per // 2) // 8) * 2}
        previous = None
        for epoch in (0, 1, 7):
            union: Counter[int] = Counter()
            for s in streams:
                assert len(s) == per
                whole = s.worker_order(0, 0, epoch)
                assert sorted(whole) == sorted(s.rank_order(epoch))
                assert len(whole) == per
                for num_workers in (2, 3):
                    parts = [s.worker_order(w, num_workers, epoch) for w in range(num_workers)]
                    assert sorted(np.concatenate(parts)) == sorted(whole)
                union.update(whole.tolist())
            assert sum(union.values()) == per * world
            if drop_last:
                assert max(union.values()) == 1
                assert len(union) == per * world
            else:
                assert set(union) == set(range(N))
                assert sum(union.values()) - N == per * world - N  # duplicates: the padding
            # Equal inputs, equal order; and rank order comes from chunks within shards.
            np.testing.assert_array_equal(
                again.worker_order(1, 2, epoch), streams[-1].worker_order(1, 2, epoch)
            )
            order = streams[0].rank_order(epoch)
            shard = np.searchsorted(bounds, order, side="right")
            chunk = np.searchsorted(chunk_ranges(bounds, chunk_size=8)[0], order, side="right")
            same = chunk[1:] == chunk[:-1]
            assert np.all(np.diff(order)[same] == 1)
            assert np.all(shard[1:][same] == shard[:-1][same])
            if previous is not None:
                assert not np.array_equal(previous, order)
            previous = order


def test_items_are_the_datasets_and_follow_worker_order(
    packed: Path, truth: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    stream = ShardStream(packed, decode="bytes", chunk_size=8, shuffle_buffer=16, seed=4)
    stream.set_epoch(2)
    for num_workers in (0, 3):
        per_worker = emulate_workers(monkeypatch, stream, num_workers)
        for w, items in enumerate(per_worker):
            ids = as_ids(items, truth)
            assert ids == stream.worker_order(w, num_workers).tolist()
            assert [label for _, label in items] == [truth["labels"][i] for i in ids]
    decoded = ShardStream(packed, chunk_size=8, shuffle_buffer=16, seed=4)
    decoded.set_epoch(2)
    for i, (image, label) in zip(decoded.worker_order(), decoded, strict=True):
        np.testing.assert_array_equal(image, truth["images"][i])
        assert label == truth["labels"][i]


class RecordingDataset:
    """A map-style dataset that is not a packed one: logs reads and prefetch hints."""

    def __init__(self, bounds: np.ndarray) -> None:
        self.shard_bounds = bounds
        self.log: list[tuple[Any, ...]] = []

    def __len__(self) -> int:
        return int(self.shard_bounds[-1])

    def __getitem__(self, i: int) -> tuple[int, int]:
        self.log.append(("read", i))
        return i, -i

    def prefetch(self, start: int, stop: int) -> None:
        self.log.append(("hint", start, stop))


@pytest.mark.parametrize("shuffle", [True, False])
def test_reads_are_sequential_and_the_buffer_bounded(
    truth: dict[str, Any], monkeypatch: pytest.MonkeyPatch, shuffle: bool
) -> None:
    bounds = truth["bounds"]
    lo, hi = chunk_ranges(bounds, chunk_size=8)
    ds = RecordingDataset(bounds)
    stream = ShardStream(ds, chunk_size=8, shuffle=shuffle, shuffle_buffer=12, seed=9)
    stream.set_epoch(1)
    for num_workers in (0, 3):
        for w in range(max(num_workers, 1)):
            fake_worker(monkeypatch, w if num_workers else None, num_workers)
            ds.log.clear()
            yielded, held = [], 0
            for i, neg in copy.copy(stream):  # a fresh copy per worker, as a fork gives
                assert neg == -i
                yielded.append(i)
                reads = sum(e[0] == "read" for e in ds.log)
                held = max(held, reads - len(yielded))
            assert yielded == stream.worker_order(w, num_workers).tolist()
            assert held <= (12 if shuffle else 1) - 1
            reads = [e[1] for e in ds.log if e[0] == "read"]
            # Read in the order of the rank's chunk order: ascending inside every chunk.
            span = stream.worker_order(w, num_workers, epoch=1)
            assert sorted(reads) == sorted(span)
            chunk = np.searchsorted(lo, reads, side="right") - 1
            same = chunk[1:] == chunk[:-1]
            assert np.all(np.diff(reads)[same] == 1)
            # One hint per entered run, naming (part of) the chunk about to be read.
            hints = [e for e in ds.log if e[0] == "hint"]
            assert len(hints) == 1 + np.count_nonzero(~same)
            for _, start, stop in hints:
                k = np.searchsorted(lo, start, side="right") - 1
                assert lo[k] <= start < stop <= hi[k]
    fake_worker(monkeypatch, None)
    no_buffer = ShardStream(ds, chunk_size=8, shuffle_buffer=1, seed=9)
    for w in range(3):  # without the buffer a worker yields what it reads
        span = no_buffer.worker_order(w, 3)
        chunk = np.searchsorted(lo, span, side="right") - 1
        assert np.all(np.diff(span)[chunk[1:] == chunk[:-1]] == 1)


# ------------------------------------------------------------------ resume (in process)


def test_resume_in_process_at_any_sample(packed: Path, truth: dict[str, Any]) -> None:
    stream = ShardStream(packed, decode="bytes", chunk_size=8, shuffle_buffer=16, seed=2)
    stream.set_epoch(3)
    full = as_ids(list(stream), truth)
    for k in (0, 1, 17, 100, N - 1, N):
        state = stream.state_dict(consumed_samples=k)
        fresh = ShardStream(packed, decode="bytes", chunk_size=8, shuffle_buffer=16, seed=2)
        fresh.load_state_dict(state)
        assert fresh.epoch == 3
        assert as_ids(list(fresh), truth) == full[k:]
        fresh.set_epoch(3)  # the same epoch keeps the resume point
        assert as_ids(list(fresh), truth) == full[k:]
        fresh.set_epoch(4)
        assert len(list(fresh)) == N


@pytest.mark.parametrize(("num_workers", "batch_size", "drop"), [(2, 8, False), (3, 5, True)])
def test_resume_with_workers_is_the_rest_of_the_loader_order(
    packed: Path,
    truth: dict[str, Any],
    monkeypatch: pytest.MonkeyPatch,
    num_workers: int,
    batch_size: int,
    drop: bool,
) -> None:
    kw: dict[str, Any] = {"decode": "bytes", "chunk_size": 8, "shuffle_buffer": 16, "seed": 6}
    stream = ShardStream(packed, rank=1, world_size=2, **kw)
    stream.set_epoch(1)
    loader = SimpleNamespace(batch_size=batch_size, num_workers=num_workers, drop_last=drop)
    full = round_robin(emulate_workers(monkeypatch, stream, num_workers), batch_size, drop)
    assert len(full) == stream.batches_per_epoch(loader)
    for k in range(len(full) + 1):
        state = stream.state_dict(consumed_batches=k, loader=loader)
        assert state["consumed_samples"] == sum(len(b) for b in full[:k])
        fresh = ShardStream(packed, rank=1, world_size=2, **kw)
        fresh.load_state_dict(state)
        rest = round_robin(emulate_workers(monkeypatch, fresh, num_workers), batch_size, drop)
        assert rest == full[k:]


def test_state_errors(packed: Path, truth: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    stream = ShardStream(packed, chunk_size=8, seed=1)
    loader = SimpleNamespace(batch_size=8, num_workers=2, drop_last=False)
    with pytest.raises(ValueError, match="exactly one"):
        stream.state_dict()
    with pytest.raises(ValueError, match="needs loader="):
        stream.state_dict(consumed_batches=3)
    with pytest.raises(
        ValueError, match=r"consumed_samples=5 falls inside batch 0 \(samples 0..8\)"
    ):
        stream.state_dict(consumed_samples=5, loader=loader)
    with pytest.raises(ValueError, match="exceeds the 20 batches"):
        stream.state_dict(consumed_batches=21, loader=loader)
    with pytest.raises(ValueError, match="batch_size, num_workers and drop_last"):
        stream.state_dict(consumed_batches=1, loader=object())
    state = stream.state_dict(consumed_batches=3, loader=loader)
    assert state["consumed_samples"] == 24
    with pytest.raises(ValueError, match=r"seed: saved 1, now 2"):
        ShardStream(packed, chunk_size=8, seed=2).load_state_dict(state)
    with pytest.raises(ValueError, match=r"missing \['consumed_batches'"):
        stream.load_state_dict({k: v for k, v in state.items() if k != "consumed_batches"})
    fresh = ShardStream(packed, chunk_size=8, seed=1)
    fresh.load_state_dict(state)
    fake_worker(monkeypatch, None)
    with pytest.raises(ValueError, match="saved for num_workers=2, but this pass runs with num"):
        next(iter(fresh))


def test_second_pass_in_a_worker_refuses(packed: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    stream = ShardStream(packed, chunk_size=8)
    fake_worker(monkeypatch, 0, 2)
    assert len(list(stream)) == worker_counts(N, 2)[0]
    with pytest.raises(RuntimeError, match="persistent_workers=False"):
        next(iter(stream))


def test_source_forms_decode_and_transform(packed: Path, truth: dict[str, Any]) -> None:
    gray = LmdbDataset(packed, decode="gray", transform=lambda im: im[:2])
    stream = ShardStream(gray, shuffle=False)
    image, label = next(iter(stream))
    assert image.shape == (2, SHAPE[1], 1)
    assert label == truth["labels"][0]
    assert gray.decode == "gray"  # the caller's dataset is untouched
    assert gray[0][0].shape == (2, SHAPE[1], 1)
    raw = ShardStream(gray, shuffle=False, decode="bytes", transform=len)
    assert next(iter(raw))[0] == len(LmdbDataset(packed, decode="bytes")[0][0])
    with pytest.raises(ValueError, match="RecordingDataset has neither"):
        ShardStream(RecordingDataset(truth["bounds"]), decode="rgb")
    with pytest.raises(ValueError, match="decode='png'"):
        ShardStream(packed, decode="png")
    with pytest.raises(ValueError, match="rank must be < world_size"):
        ShardStream(packed, rank=2, world_size=2)


# ------------------------------------------------------------------ a real DataLoader


def loader_ids(
    loader: paddle.io.DataLoader, truth: dict[str, Any], stop: int = -1
) -> list[list[int]]:
    """Batches as ids (recovered from the pixels), checking images and labels on the way."""
    out: list[list[int]] = []
    for images, labels in loader:
        if len(out) == stop:
            break
        ids = [truth["pixels"][im.tobytes()] for im in images.numpy()]
        assert labels.numpy().ravel().tolist() == [truth["labels"][i] for i in ids]
        out.append(ids)
    return out


def make_loader(stream: ShardStream, workers: int, drop_last: bool = False) -> Any:
    return paddle.io.DataLoader(
        stream,
        batch_size=8,
        num_workers=workers,
        drop_last=drop_last,
        use_shared_memory=workers > 0,
    )


@pytest.mark.parametrize("workers", [0, 2])
def test_dataloader_order_and_resume(packed: Path, truth: dict[str, Any], workers: int) -> None:
    def stream() -> ShardStream:
        return ShardStream(packed, chunk_size=8, shuffle_buffer=16, seed=5)

    s = stream()
    predicted = {}
    for epoch, drop in ((0, False), (1, True)):
        s.set_epoch(epoch)
        parts = [s.worker_order(w, workers).tolist() for w in range(max(workers, 1))]
        predicted[epoch] = round_robin(parts, 8, drop)
        assert loader_ids(make_loader(s, workers, drop), truth) == predicted[epoch]
    assert predicted[0] != predicted[1]
    assert sorted(itertools.chain(*predicted[0])) == list(range(N))
    # Interrupt epoch 1 after k batches, save, resume in a new stream and loader.
    k = 7 if workers else 11  # odd with 2 workers: worker 1's batch comes next
    loader = make_loader(s, workers, drop_last=True)
    assert len(loader_ids(loader, truth, stop=k)) == k
    state = s.state_dict(consumed_batches=k, loader=loader)
    resumed = stream()
    resumed.load_state_dict(pickle.loads(pickle.dumps(state)))
    assert loader_ids(make_loader(resumed, workers, drop_last=True), truth) == predicted[1][k:]
    if workers:  # resume from a sample count after worker 0's short batch, mid-epoch
        s.set_epoch(0)
        k = next(j for j, b in enumerate(predicted[0]) if len(b) < 8) + 1
        assert k < len(predicted[0])
        samples = sum(len(b) for b in predicted[0][:k])
        resumed = stream()
        resumed.load_state_dict(s.state_dict(consumed_samples=samples, loader=make_loader(s, 2)))
        assert loader_ids(make_loader(resumed, workers), truth) == predicted[0][k:]


def test_persistent_workers_are_refused_in_the_main_process(
    packed: Path, truth: dict[str, Any]
) -> None:
    """paddle 3.3 cannot run an IterableDataset with persistent workers (it hangs): the
    stream says so in the main process, before the first epoch, at set_epoch."""
    stream = ShardStream(packed, chunk_size=8, seed=5)
    loader = paddle.io.DataLoader(stream, batch_size=8, num_workers=2, persistent_workers=True)
    seen = []

    def two_epochs() -> None:
        for epoch in range(2):
            stream.set_epoch(epoch)
            seen.extend(loader_ids(loader, truth))

    with pytest.raises(ValueError, match=r"persistent_workers=True and num_workers > 0: paddle"):
        two_epochs()
    assert seen == []  # refused before the first epoch
    with pytest.raises(ValueError, match=r"make the DataLoader with persistent_workers=False"):
        stream.batches_per_epoch(loader)
    with pytest.raises(ValueError, match=r"persistent_workers=True"):
        stream.state_dict(consumed_batches=1, loader=loader)
    del loader
    stream.set_epoch(0)  # the loader is gone: nothing to refuse
    # persistent_workers without workers is paddle's in-process iterator: two epochs run
    loader = paddle.io.DataLoader(stream, batch_size=8, num_workers=0, persistent_workers=True)
    for epoch in range(2):
        stream.set_epoch(epoch)
        assert sorted(itertools.chain(*loader_ids(loader, truth))) == list(range(N))


def test_a_persistent_worker_fails_its_first_batch(
    packed: Path, truth: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without set_epoch nothing of the stream runs in the main process: a worker forked by
    a loader with persistent workers fails at the first batch (paddle's reading thread raises
    its error), instead of the loader hanging when the first worker runs out."""
    raised: list[BaseException | None] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: raised.append(args.exc_value))
    stream = ShardStream(packed, chunk_size=8, seed=5)
    loader = paddle.io.DataLoader(stream, batch_size=8, num_workers=2, persistent_workers=True)
    with pytest.raises(SystemError, match="Blocking queue is killed"):
        loader_ids(loader, truth)
    assert any(PERSISTENT_WORKERS in str(e) for e in raised), raised


# ------------------------------------------------------------------ --encode raw, every format

RAW_N = 26  # 13 per worker with 2 workers: batches of 4 run short at each worker's end


@pytest.fixture(scope="module", params=FORMATS)
def raw_packed(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, dict[bytes, int]]:
    """A ``--encode raw`` build of PNGs (colour and gray, one size) in the given format, and
    the originals' RGB pixels (as OpenCV reads the PNG files) -> label."""
    root = tmp_path_factory.mktemp(f"raw-{request.param}")
    rng = np.random.default_rng(11)
    originals: dict[bytes, int] = {}
    for i in range(RAW_N):
        label = i % 2
        shape = SHAPE[:2] if i % 3 == 0 else SHAPE  # every third image is gray
        path = root / "src" / f"c{label}" / f"{i:03d}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        assert cv2.imwrite(str(path), rng.integers(0, 256, shape, dtype=np.uint8))
        pixels = cv2.cvtColor(cv2.imread(str(path), cv2.IMREAD_COLOR), cv2.COLOR_BGR2RGB)
        originals[pixels.tobytes()] = label
    assert len(originals) == RAW_N
    out = root / "out"
    config = BuildConfig(
        src=root / "src",
        out=out,
        format=request.param,
        shard_size=2_000,  # a few hundred bytes per sample: several shards
        transform=Transform(encode="raw"),
    )
    build(config)
    return out, originals


@pytest.mark.parametrize("decode", ["rgb", "gray"])
def test_raw_datasets_through_a_dataloader_with_workers(
    raw_packed: tuple[Path, dict[bytes, int]], decode: str
) -> None:
    out, originals = raw_packed
    stream = ShardStream(out, decode=decode, chunk_size=4, shuffle_buffer=6, seed=1)
    assert len(stream.dataset.shard_bounds) > 3
    loader = paddle.io.DataLoader(stream, batch_size=4, num_workers=2, use_shared_memory=True)
    got: Counter[bytes] = Counter()
    for images, labels in loader:
        for image, label in zip(images.numpy(), labels.numpy().ravel().tolist(), strict=True):
            if decode == "gray":
                assert image.shape == (*SHAPE[:2], 1)
                rgb = np.repeat(image, 3, axis=2)  # compared below through the gray originals
            else:
                assert image.shape == SHAPE
                rgb = image
            got[rgb.tobytes()] += 1
            if decode == "rgb":
                assert originals.get(rgb.tobytes()) == label
    if decode == "rgb":
        assert got == Counter(dict.fromkeys(originals, 1))
    else:
        gray = [
            cv2.cvtColor(np.frombuffer(p, np.uint8).reshape(SHAPE), cv2.COLOR_RGB2GRAY)
            for p in originals
        ]
        want = Counter(np.repeat(g[:, :, None], 3, axis=2).tobytes() for g in gray)
        assert got == want


def test_raw_datasets_of_mixed_sizes_in_process(packed_raw: Any) -> None:
    """conftest's tree (PNG and JPEG, colour and gray, several sizes) packed --encode raw."""
    classes = sorted({rel.split("/")[0] for rel in packed_raw.files})
    originals: Counter[tuple[tuple[int, ...], bytes, int]] = Counter()
    for rel, data in packed_raw.files.items():
        bgr = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
        rgb = cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)
        originals[rgb.shape, rgb.tobytes(), classes.index(rel.split("/")[0])] += 1
    stream = ShardStream(packed_raw.path, chunk_size=2, shuffle_buffer=3, seed=3)
    got = Counter((image.shape, image.tobytes(), label) for image, label in stream)
    assert got == originals
