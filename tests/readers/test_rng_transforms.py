"""Transforms that take ``rng``: the same sample gets the same augmentation whatever the number
of DataLoader workers or ranks, and wherever a run resumed (`readers.augment_rng`).

Every image here is its own class, so a batch's labels name its samples; the reference of an
epoch is what one rank without workers reads, and every other way of reading the epoch must
give each sample exactly that image.
"""

from __future__ import annotations

import functools
import pickle
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import paddle
import pytest

from readers import (
    BucketBatchSampler,
    ChunkShuffleBatchSampler,
    ConcatDataset,
    LmdbDataset,
    ShardStream,
)
from readers.augment_rng import NO, OPTIONAL, REQUIRED, SampleRef, rng_use, sample_rng
from readers.transforms import RandomResizedCropDraft
from tests.conftest import build_packed

N = 24
SEED, EPOCH = 3, 1
BATCH = 3


def jitter(image: np.ndarray, *, rng: np.random.Generator) -> np.ndarray:
    """A user's augmentation: a random flip and random noise, from the generator given."""
    if rng.random() < 0.5:
        image = image[:, ::-1]
    return np.clip(image.astype(np.int16) + rng.integers(-8, 9, image.shape), 0, 255).astype(
        np.uint8
    )


AUG = RandomResizedCropDraft(8, then=jitter)


def write_classes(root: Path, prefix: str, count: int) -> Path:
    """`count` class folders of one image each (PNG and JPEG alternating, sizes varying)."""
    rng = np.random.default_rng(len(prefix) + count)
    for k in range(count):
        folder = root / f"{prefix}{k:02d}"
        folder.mkdir(parents=True)
        image = rng.integers(0, 256, (24 + 3 * k, 32 + 2 * k, 3), dtype=np.uint8)
        image = cv2.GaussianBlur(image, (5, 5), 0)  # JPEGs worth a reduced decode
        cv2.imwrite(str(folder / ("a.jpg" if k % 2 else "a.png")), image)
    return root


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("rng")
    return {
        "lmdb": build_packed(write_classes(tmp / "a", "c", N), tmp / "a.lmdb", "lmdb"),
        "rec": build_packed(write_classes(tmp / "b", "d", 12), tmp / "b.rec", "recordio"),
    }


Batch = tuple[list[int], np.ndarray]


def batches(loader: Any) -> list[Batch]:
    """The loader's batches as (labels, images)."""
    return [(labels.numpy().ravel().tolist(), images.numpy()) for images, labels in loader]


def by_label(got: list[Batch]) -> dict[int, np.ndarray]:
    return {
        label: image for labels, images in got for label, image in zip(labels, images, strict=True)
    }


def assert_same_batches(a: list[Batch], b: list[Batch]) -> None:
    assert [labels for labels, _ in a] == [labels for labels, _ in b]
    for (_, x), (_, y) in zip(a, b, strict=True):
        np.testing.assert_array_equal(x, y)


def assert_matches(got: list[Batch], reference: dict[int, np.ndarray]) -> list[int]:
    """Every sample of `got` is its reference image; returns the labels in order."""
    seen = []
    for labels, images in got:
        for label, image in zip(labels, images, strict=True):
            np.testing.assert_array_equal(image, reference[label], err_msg=f"sample {label}")
            seen.append(label)
    return seen


def loader(dataset: Any, sampler: Any = None, workers: int = 0, **kw: Any) -> Any:
    # paddle 3.3's shared-memory handoff can hang a worker forked right after another loader's
    # (its feeder thread blocks in _share_filename): these tests make many loaders in a row
    kw.setdefault("use_shared_memory", False)
    if sampler is None:
        kw.setdefault("batch_size", BATCH)
        return paddle.io.DataLoader(dataset, num_workers=workers, **kw)
    return paddle.io.DataLoader(dataset, batch_sampler=sampler, num_workers=workers, **kw)


def reference(ds: Any, epoch: int = EPOCH, seed: int = SEED) -> dict[int, np.ndarray]:
    sampler = ChunkShuffleBatchSampler(ds, batch_size=BATCH, seed=seed, rank=0, world_size=1)
    sampler.set_epoch(epoch)
    got = by_label(batches(loader(ds, sampler)))
    assert sorted(got) == list(range(len(ds)))
    return got


# --------------------------------------------------------------------------- the invariance


Make = Callable[[int, int], Any]
"""(rank, world size) -> a sampler or stream of the epoch, seed `SEED`."""


def check_every_way(
    make: Make,
    read: Callable[[Any, int], Any],
    reference: dict[int, np.ndarray],
    workers: int,
    save: Callable[[Any, Any], dict[str, Any]],
) -> None:
    """Over 1, 2 and 3 ranks with `workers`: whole epochs, a resume at the same world size
    (identical batches) and one at another (the rest of the epoch, each sample as before)."""
    for world in (1, 2, 3):
        full, made = [], []
        for rank in range(world):
            source = make(rank, world)
            source.set_epoch(EPOCH)
            ldr = read(source, workers)
            full.append(batches(ldr))
            made.append((source, ldr))
            assert_matches(full[-1], reference)
        assert {lab for got in full for labels, _ in got for lab in labels} == set(reference)
        state = pickle.loads(pickle.dumps(save(*made[0])))  # rank 0's, after 2 batches
        consumed = {lab for got in full for labels, _ in got[:2] for lab in labels}
        for rank in range(world):  # the same ranks: the batches an uninterrupted run has
            resumed = make(rank, world)
            resumed.load_state_dict(state)
            assert_same_batches(batches(read(resumed, workers)), full[rank][2:])
        other = world % 3 + 1
        rest = []
        for rank in range(other):  # elastic: the other ranks read the rest, as it was
            resumed = make(rank, other)
            resumed.load_state_dict(state)
            rest += assert_matches(batches(read(resumed, 2 - workers)), reference)
        assert consumed | set(rest) == set(reference)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_sampler_gives_each_sample_its_augmentation_across_ranks_workers_and_resumes(
    data: dict[str, Path], workers: int
) -> None:
    ds = LmdbDataset(data["lmdb"], transform=AUG)
    ref = reference(ds)

    def make(rank: int, world: int) -> ChunkShuffleBatchSampler:
        return ChunkShuffleBatchSampler(
            ds, batch_size=BATCH, seed=SEED, rank=rank, world_size=world, chunk_size=4
        )

    check_every_way(
        make,
        lambda sampler, w: loader(ds, sampler, w),
        ref,
        workers,
        lambda sampler, _: sampler.state_dict(consumed_batches=2),
    )


@pytest.mark.parametrize("workers", [0, 2])
def test_a_stream_gives_each_sample_its_augmentation_across_ranks_workers_and_resumes(
    data: dict[str, Path], workers: int
) -> None:
    # the stream's seed and epoch give the sampler's augmentation: one reference for both
    ref = reference(LmdbDataset(data["lmdb"], transform=AUG))

    def make(rank: int, world: int) -> ShardStream:
        return ShardStream(
            data["lmdb"],
            transform=AUG,
            seed=SEED,
            rank=rank,
            world_size=world,
            chunk_size=4,
            shuffle_buffer=4,
        )

    check_every_way(
        make,
        lambda stream, w: loader(stream, workers=w),
        ref,
        workers,
        lambda stream, ldr: stream.state_dict(consumed_batches=2, loader=ldr),
    )


def test_persistent_workers_get_each_epoch_from_the_ids(data: dict[str, Path]) -> None:
    """Workers forked once never see a later set_epoch: the epoch travels with the ids."""
    ds = LmdbDataset(data["lmdb"], transform=AUG)
    sampler = ChunkShuffleBatchSampler(ds, batch_size=BATCH, seed=SEED, rank=0, world_size=1)
    ldr = loader(ds, sampler, 2, persistent_workers=True)
    for epoch in (EPOCH, EPOCH + 1, EPOCH):
        sampler.set_epoch(epoch)
        assert_matches(batches(ldr), reference(ds, epoch))


def test_draws_differ_between_epochs_seeds_and_samples(data: dict[str, Path]) -> None:
    ds = LmdbDataset(data["lmdb"], transform=AUG)
    ref = reference(ds)
    for other in (reference(ds, epoch=EPOCH + 1), reference(ds, seed=SEED + 1)):
        differ = sum(not np.array_equal(ref[k], other[k]) for k in ref)
        assert differ >= N - 2, differ
    firsts = {sample_rng(SEED, EPOCH, i).integers(2**62) for i in range(1000)}
    assert len(firsts) == 1000
    # the crop's boxes, drawn per sample: not one shared sequence
    boxes = [AUG.box(500, 500, rng=sample_rng(SEED, EPOCH, i)) for i in range(50)]
    assert len(set(boxes)) == 50
    assert AUG.box(500, 500, rng=sample_rng(SEED, EPOCH, 7)) == boxes[7]


def test_bucket_and_weighted_samplers_and_a_stream_of_several_sources_agree(
    data: dict[str, Path],
) -> None:
    """Over a ConcatDataset the generator is keyed by the concatenation's id, so a mixing
    sampler, a bucket sampler and a stream of the same sources give each sample one image."""
    ds = LmdbDataset(data["lmdb"], transform=AUG)
    ref = reference(ds)
    buckets = BucketBatchSampler(ds, 2, key="width", buckets=3, seed=SEED, rank=0, world_size=1)
    buckets.set_epoch(EPOCH)
    assert_matches(batches(loader(ds, buckets, 2)), ref)

    both = ConcatDataset([data["lmdb"], data["rec"]], classes="union", transform=AUG)
    whole = reference(both)
    mixed = ChunkShuffleBatchSampler(
        both, batch_size=BATCH, weights=[1, 1], seed=SEED, rank=1, world_size=2
    )
    mixed.set_epoch(EPOCH)
    assert_matches(batches(loader(both, mixed, 2)), whole)
    stream = ShardStream(both, seed=SEED, rank=0, world_size=1)  # the sources' transforms
    stream.set_epoch(EPOCH)
    assert sorted(assert_matches(batches(loader(stream, workers=2)), whole)) == sorted(whole)


# --------------------------------------------------------------------------- plain ids


def test_plain_ids_use_the_datasets_own_epoch_or_keep_the_old_draws(data: dict[str, Path]) -> None:
    ds = LmdbDataset(data["lmdb"], transform=AUG)
    ref = reference(ds)
    # paddle's own samplers pass plain ints: the dataset's set_epoch seeds them instead
    ds.set_epoch(EPOCH, seed=SEED)
    for i in range(N):
        image, label = ds[i]
        np.testing.assert_array_equal(image, ref[label])
    assert ds[-1][1] == N - 1  # keyed by the located id
    np.testing.assert_array_equal(ds[-1][0], ref[N - 1])
    ds.set_epoch(0)  # seed 0
    np.testing.assert_array_equal(ds[5][0], ds[SampleRef(5, 0, 0)][0])
    with pytest.raises(ValueError, match=r"epoch and seed must be >= 0, got epoch=-1"):
        ds.set_epoch(-1)
    # without set_epoch an rng that has a default is not given: the global generators draw,
    # as paddle's RandomResizedCrop does (tests/readers/test_crop.py pins those boxes)
    crop = LmdbDataset(data["lmdb"], transform=RandomResizedCropDraft(8))
    draws = []
    for _ in range(2):
        np.random.seed(11)  # noqa: NPY002
        random.seed(11)
        draws.append(np.stack([crop[i][0] for i in range(N)]))
    np.testing.assert_array_equal(*draws)
    np.random.seed(12)  # noqa: NPY002
    random.seed(12)
    assert not np.array_equal(np.stack([crop[i][0] for i in range(N)]), draws[0])
    # a transform that requires rng always gets one: seed 0, epoch 0 without set_epoch
    plain = LmdbDataset(data["lmdb"], transform=jitter)
    np.testing.assert_array_equal(plain[3][0], plain[SampleRef(3, 0, 0)][0])
    assert not np.array_equal(plain[3][0], plain[SampleRef(3, 0, 1)][0])


def test_samplers_yield_plain_ints_unless_a_transform_takes_rng(data: dict[str, Path]) -> None:
    for transform, kind in ((None, int), (RandomResizedCropDraft(8), SampleRef)):
        ds = LmdbDataset(data["lmdb"], transform=transform)
        batch = next(iter(ChunkShuffleBatchSampler(ds, batch_size=2, rank=0, world_size=1)))
        assert {type(i) for i in batch} == {kind}
        buckets = BucketBatchSampler(ds, 2, key="width", buckets=2, rank=0, world_size=1)
        assert {type(i) for i in next(iter(buckets))} == {kind}
    ref = SampleRef(4, seed=SEED, epoch=EPOCH)
    assert ref == 4
    assert ref + 1 == 5
    assert pickle.loads(pickle.dumps(ref)).epoch == EPOCH
    assert np.array([ref]).dtype == np.int64


class Callable_:
    def __call__(self, image: np.ndarray, rng: np.random.Generator | None = None) -> Any:
        return image

    def method(self, image: np.ndarray, *, rng: np.random.Generator) -> Any:
        return image


def test_which_transforms_take_rng() -> None:
    def plain(image: Any) -> Any:
        return image

    def kwargs(image: Any, **kw: Any) -> Any:
        return image

    def positional(image: Any, rng: Any, /) -> Any:
        return image

    obj = Callable_()
    assert rng_use(None) == rng_use(plain) == rng_use(kwargs) == rng_use(positional) == NO
    assert rng_use(np.asarray) == NO  # no signature to read
    assert rng_use(jitter) == rng_use(obj.method) == REQUIRED
    assert rng_use(obj) == rng_use(AUG) == rng_use(lambda im, rng=None: im) == OPTIONAL
    assert rng_use(functools.partial(jitter)) == REQUIRED
    assert rng_use(functools.partial(jitter, rng=None)) == OPTIONAL
    from readers import augment_rng

    class Derived(Callable_):
        pass

    assert rng_use(Derived()) == OPTIONAL
    before = len(augment_rng._USE)
    for _ in range(100):  # a bound method or an object: one entry per function or class
        rng_use(Callable_().method)
        rng_use(Callable_())
        rng_use(Derived())
    assert len(augment_rng._USE) == before
