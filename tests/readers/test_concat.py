"""ConcatDataset over LMDB + RecordIO, and weighted mixing through the samplers and ShardStream,
with a real DataLoader (num_workers=2)."""

from __future__ import annotations

import itertools
import pickle
from collections import Counter
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import paddle
import pytest

from packer.build import build
from packer.config import BuildConfig
from readers import (
    ChunkShuffleBatchSampler,
    ChunkShuffleSampler,
    ConcatDataset,
    LmdbDataset,
    RecordIODataset,
    ShardStream,
)
from readers.mixing import mix_counts
from tests.readers.test_order import round_robin
from tests.readers.test_samplers import RecordingDataset

SHAPE = (10, 12, 3)
SPECS = {"a": ("lmdb", ["c0", "c1", "c2"], 37), "b": ("recordio", ["c1", "c3"], 23)}


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """An LMDB (37 samples, classes c0 c1 c2, several shards) and a RecordIO dataset (23,
    classes c1 c3) of random fixed-size PNGs, so that class ids of the two disagree."""
    root = tmp_path_factory.mktemp("concat")
    rng = np.random.default_rng(7)
    out = {}
    for name, (fmt, classes, n) in SPECS.items():
        for i in range(n):
            path = root / name / classes[i % len(classes)] / f"{i:03d}.png"
            path.parent.mkdir(parents=True, exist_ok=True)
            assert cv2.imwrite(str(path), rng.integers(0, 256, SHAPE, dtype=np.uint8))
        out[name] = root / f"{name}.{fmt}"
        build(BuildConfig(src=root / name, out=out[name], format=fmt, shard_size=4_000))
    return out


@pytest.fixture(scope="module")
def truth(sources: dict[str, Path]) -> dict[str, Any]:
    """Global id by pixels, and label (as each source stores it) by global id."""
    a, b = LmdbDataset(sources["a"]), RecordIODataset(sources["b"])
    items = [a[i] for i in range(len(a))] + [b[i] for i in range(len(b))]
    return {
        "pixels": {im.tobytes(): i for i, (im, _) in enumerate(items)},
        "labels": [lab for _, lab in items],
        "n": (len(a), len(b)),
    }


def concat(sources: dict[str, Path], **kw: Any) -> ConcatDataset:
    return ConcatDataset([LmdbDataset(sources["a"]), RecordIODataset(sources["b"])], **kw)


def loader_ids(loader: Any, truth: dict[str, Any]) -> list[list[int]]:
    """Batches as global ids (recovered from the pixels), checking the labels on the way."""
    out = []
    for images, labels in loader:
        ids = [truth["pixels"][im.tobytes()] for im in images.numpy()]
        assert labels.numpy().ravel().tolist() == [truth["labels"][i] for i in ids]
        out.append(ids)
    return out


def per_source(ids: list[int], n0: int) -> list[int]:
    return [sum(i < n0 for i in ids), sum(i >= n0 for i in ids)]


# ------------------------------------------------------------------ ConcatDataset


def test_ids_offsets_and_source_of(sources: dict[str, Path], truth: dict[str, Any]) -> None:
    a, b = LmdbDataset(sources["a"]), RecordIODataset(sources["b"])
    ds = ConcatDataset([a, b])
    assert len(ds) == 60
    assert ds.offsets.tolist() == [0, 37, 60]
    assert len(a.shard_bounds) > 2
    assert len(b.shard_bounds) > 2
    assert ds.shard_bounds.tolist() == a.shard_bounds.tolist() + (b.shard_bounds[1:] + 37).tolist()
    for i in range(len(ds)):
        s, j = (0, i) if i < 37 else (1, i - 37)
        src = (a, b)[s]
        assert ds.source_of(i) == s
        assert ds.locate(i) == (s, j)
        image, label = ds[i]
        np.testing.assert_array_equal(image, src[j][0])
        assert label == src[j][1] == truth["labels"][i]
        assert ds.read_bytes(i) == src.read_bytes(j)
    np.testing.assert_array_equal(ds[-1][0], b[22][0])
    assert ds.source_of(-23) == 1
    assert ds.source_of(-24) == 0
    with pytest.raises(IndexError, match="sample 60 out of range for a ConcatDataset of 60"):
        ds[60]
    assert ds.labels is not None
    assert ds.labels.tolist() == truth["labels"]
    assert ds.index is not None
    assert ds.index.nbytes.tolist() == [*a.index.nbytes.tolist(), *b.index.nbytes.tolist()]
    assert isinstance(ds, paddle.io.Dataset)


def test_paths_pickling_and_errors(sources: dict[str, Path], truth: dict[str, Any]) -> None:
    ds = ConcatDataset([sources["b"], str(sources["a"])], decode="gray")
    assert ds.offsets.tolist() == [0, 23, 60]
    assert ds[0][0].shape == (*SHAPE[:2], 1)
    ds[30]  # handles open in this process
    again = pickle.loads(pickle.dumps(ds))
    for i in (0, 22, 23, 59):
        np.testing.assert_array_equal(again[i][0], ds[i][0])
    with pytest.raises(ValueError, match="needs a list of datasets or paths"):
        ConcatDataset([])
    with pytest.raises(ValueError, match="needs a list of datasets or paths"):
        ConcatDataset(str(sources["a"]))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="classes='all': expected 'keep' or 'union'"):
        ConcatDataset([sources["a"]], classes="all")


def test_class_ids_united_by_name(sources: dict[str, Path], truth: dict[str, Any]) -> None:
    keep, union = concat(sources), concat(sources, classes="union")
    assert keep.classes is None
    assert union.classes == ["c0", "c1", "c2", "c3"]
    # b stores c1 as 0 and c3 as 1; united: c1 -> 1 (a's id), c3 -> 3
    remap = [0, 1, 2, 1, 3]
    for i in range(60):
        local = truth["labels"][i]
        want = local if i < 37 else remap[3 + local]
        assert union[i][1] == want
        assert keep[i][1] == local
    assert union.labels is not None
    assert union.labels.tolist() == [union[i][1] for i in range(60)]
    names = union.classes
    assert {names[union[i][1]] for i in range(37, 60)} == {"c1", "c3"}
    with pytest.raises(ValueError, match=r"source 1 .* has no 'classes' list in its meta.json"):
        ConcatDataset([keep.datasets[0], RecordingDataset([0, 5])], classes="union")


def test_prefetch_goes_to_the_source_in_local_ids() -> None:
    a, b = RecordingDataset([0, 40, 70]), RecordingDataset([0, 25])
    ds = ConcatDataset([a, b])
    ds.prefetch(60, 80)
    ds.prefetch(90, 200)
    assert a.log == [("prefetch", 60, 70)]
    assert b.log == [("prefetch", 0, 10), ("prefetch", 20, 25)]


@pytest.mark.parametrize("mix", ["epoch", "batch"])
def test_sampler_hints_each_chunk_to_its_source_before_reading_it(mix: str) -> None:
    a, b = RecordingDataset([0, 40, 70]), RecordingDataset([0, 25])
    ds = ConcatDataset([a, b])
    bs = ChunkShuffleBatchSampler(
        ds, batch_size=6, chunk_size=8, window=2, weights=[1, 2], epoch_samples=150, mix=mix
    )
    for epoch in (0, 1):
        bs.set_epoch(epoch)
        for batch in bs:
            for i in batch:
                src, local = (a, i) if i < 70 else (b, i - 70)
                assert any(lo <= local < hi for _, lo, hi in src.log), f"id {i} not hinted"
                assert all(hi - lo <= 8 for _, lo, hi in src.log), "one chunk per hint"


# ------------------------------------------------------------------ samplers, DataLoader


def test_plain_sampler_over_a_concat_is_one_permutation(sources: dict[str, Path]) -> None:
    ds = concat(sources)
    s = ChunkShuffleSampler(ds, chunk_size=4, rank=0, world_size=1)
    assert s.mixture is None
    assert sorted(s) == list(range(60))


def test_mixed_batches_through_a_dataloader(
    sources: dict[str, Path], truth: dict[str, Any]
) -> None:
    ds = concat(sources)
    bs = ChunkShuffleBatchSampler(
        ds, batch_size=8, chunk_size=4, weights=[1, 3], epoch_samples=100, seed=3
    )
    counts = mix_counts(100, (1, 3)).tolist()
    assert counts == [25, 75]
    seen: Counter[int] = Counter()
    for epoch in (0, 1, 2):
        bs.set_epoch(epoch)
        expected = list(bs)
        loader = paddle.io.DataLoader(ds, batch_sampler=bs, num_workers=2)
        got = loader_ids(loader, truth)
        assert got == expected
        flat = list(itertools.chain(*got))
        assert per_source(flat, 37) == counts, "exact counts per source in every epoch"
        seen.update(flat)
    # 3 epochs: source a gave 75 of its 37 (2 passes + 1), b gave 225 of 23 (9 passes + 18)
    assert {seen[i] for i in range(37)} == {2, 3}
    assert sum(seen[i] == 3 for i in range(37)) == 1
    assert {seen[i] for i in range(37, 60)} == {9, 10}
    assert sum(seen[i] == 10 for i in range(37, 60)) == 225 - 9 * 23


def test_batch_mix_through_a_dataloader_on_two_ranks(
    sources: dict[str, Path], truth: dict[str, Any]
) -> None:
    ds = concat(sources, classes="union")
    union_truth = truth | {"labels": ds.labels.tolist()}  # type: ignore[union-attr]
    per_rank = []
    for rank in (0, 1):
        bs = ChunkShuffleBatchSampler(
            ds, batch_size=8, weights=[0.25, 0.75], mix="batch", rank=rank, world_size=2, seed=1
        )
        bs.set_epoch(4)
        got = loader_ids(paddle.io.DataLoader(ds, batch_sampler=bs, num_workers=2), union_truth)
        assert got == list(bs)
        assert all(per_source(b, 37) == [2, 6] for b in got), "every batch: 2 of a, 6 of b"
        per_rank.append(got)
    assert len(per_rank[0]) == len(per_rank[1]) == 4  # 60 // 8 = 7 batches, padded to 8
    assert per_rank[1][-1] == per_rank[0][0], "padding repeats the first batch"


def test_resume_mid_epoch(sources: dict[str, Path]) -> None:
    ds = concat(sources)

    def make(**kw: Any) -> ChunkShuffleBatchSampler:
        return ChunkShuffleBatchSampler(
            ds, batch_size=5, weights=[2, 1], epoch_samples=90, world_size=3, rank=1, **kw
        )

    for mix in ("epoch", "batch"):
        bs = make(mix=mix)
        bs.set_epoch(2)
        full = list(bs)
        state = pickle.loads(pickle.dumps(bs.state_dict(consumed_batches=2)))
        assert state["weights"] == [2.0, 1.0]
        assert state["mix"] == mix
        resumed = make(mix=mix)
        resumed.load_state_dict(state)
        assert resumed.epoch == 2
        assert list(resumed) == full[2:]
        assert list(resumed) == full, "the resume offset is used once"
        other = ChunkShuffleBatchSampler(
            ds, batch_size=5, weights=[1, 1], epoch_samples=90, world_size=3, rank=1, mix=mix
        )
        with pytest.raises(ValueError, match=r"weights: saved \[2.0, 1.0\], now \[1.0, 1.0\]"):
            other.load_state_dict(state)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"weights": [1, 0]}, r"weights\[1\] is 0"),
        ({"weights": [1, -1]}, r"weights\[1\] is -1"),
        ({"weights": [1, 1, 1]}, r"one entry per source \(2 sources\), got 3"),
        ({"weights": [1, 1], "epoch_samples": 0}, r"epoch_samples must be an integer >= 1"),
        ({"mix": "batch", "weights": [1, 50]}, r"give source 0 no sample in a batch of 8"),
    ],
)
def test_bad_mixture_arguments(
    sources: dict[str, Path], kwargs: dict[str, Any], match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        ChunkShuffleBatchSampler(concat(sources), batch_size=8, **kwargs)


def test_weights_need_a_concat(sources: dict[str, Path]) -> None:
    with pytest.raises(ValueError, match=r"mix the sources of a readers\.ConcatDataset, but got"):
        ChunkShuffleSampler(LmdbDataset(sources["a"]), weights=[1])
    with pytest.raises(ValueError, match=r"mix='batch' .* needs the batch size"):
        ChunkShuffleSampler(concat(sources), mix="batch")


# ------------------------------------------------------------------ ShardStream


def test_stream_over_two_datasets_through_a_dataloader(
    sources: dict[str, Path], truth: dict[str, Any]
) -> None:
    def stream() -> ShardStream:
        return ShardStream(
            [sources["a"], sources["b"]],
            weights=[1, 1],
            epoch_samples=70,
            chunk_size=4,
            shuffle_buffer=8,
            seed=2,
        )

    s = stream()
    assert s.mixture is not None
    assert s.mixture.counts.tolist() == [35, 35]
    for epoch in (0, 1):
        s.set_epoch(epoch)
        parts = [s.worker_order(w, 2).tolist() for w in range(2)]
        loader = paddle.io.DataLoader(s, batch_size=4, num_workers=2)
        got = loader_ids(loader, truth)
        assert got == round_robin(parts, 4, False)
        flat = list(itertools.chain(*got))
        assert per_source(flat, 37) == [35, 35]
        assert Counter(flat) == Counter(s.rank_order().tolist())
        if epoch == 1:  # source b (23) has drawn 70: passes 0, 1, 2 whole, then 1 of pass 3
            b = Counter(i for i in flat if i >= 37)
            assert set(b) == set(range(37, 60))
    # resume epoch 1 after 5 batches
    loader = paddle.io.DataLoader(s, batch_size=4, num_workers=2)
    state = s.state_dict(consumed_batches=5, loader=loader)
    assert state["weights"] == [1.0, 1.0]
    resumed = stream()
    resumed.load_state_dict(state)
    rest = loader_ids(paddle.io.DataLoader(resumed, batch_size=4, num_workers=2), truth)
    assert rest == got[5:]


def test_stream_over_a_concat_keeps_decode_and_classes(
    sources: dict[str, Path], truth: dict[str, Any]
) -> None:
    ds = ConcatDataset(
        [LmdbDataset(sources["a"], decode="gray"), RecordIODataset(sources["b"])],
        classes="union",
    )
    s = ShardStream(ds, shuffle=False)
    assert s.mixture is None
    items = list(s)
    assert len(items) == 60
    assert [im.shape for im, _ in items[:37]] == [(*SHAPE[:2], 1)] * 37
    assert [im.shape for im, _ in items[37:]] == [SHAPE] * 23
    assert [lab for _, lab in items] == ds.labels.tolist()  # type: ignore[union-attr]
    assert ds.datasets[0].decode == "gray"  # the caller's sources are untouched
