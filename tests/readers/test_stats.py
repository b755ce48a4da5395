"""readers.LoaderStats over a real DataLoader: a slow dataset shows a high wait fraction, a slow
step a low one; one summary per epoch with the right counts. No absolute timing asserts."""

from __future__ import annotations

import time

import numpy as np
import paddle
import pytest

from readers import LoaderStats
from readers.stats import EpochStats

SLEEP = 0.01


class SlowDataset(paddle.io.Dataset):  # type: ignore[misc]
    def __init__(self, n: int, delay: float) -> None:
        self.n = n
        self.delay = delay

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[np.ndarray, int]:
        if self.delay:
            time.sleep(self.delay)
        return np.full((4, 4, 3), i % 256, np.uint8), i


def loader(delay: float, *, n: int = 24, batch_size: int = 4) -> paddle.io.DataLoader:
    return paddle.io.DataLoader(
        SlowDataset(n, delay),
        batch_size=batch_size,
        num_workers=2,
        use_shared_memory=True,
        persistent_workers=False,  # paddle pauses persistent workers 0.5 s per epoch
    )


def run(stats: LoaderStats, data: paddle.io.DataLoader, *, epochs: int, step: float) -> int:
    seen = 0
    for epoch in range(epochs):
        for images, _labels in stats.wrap(data, epoch=epoch):
            seen += images.shape[0]
            if step:
                time.sleep(step)
    return seen


def test_slow_data_vs_slow_step():
    got: list[EpochStats] = []
    slow_data = LoaderStats(on_epoch_end=got.append)
    run(slow_data, loader(SLEEP * 4), epochs=2, step=0.0)
    slow_step = LoaderStats(on_epoch_end=got.append)
    run(slow_step, loader(0.0), epochs=2, step=SLEEP * 4)

    assert len(got) == 4
    data_bound, step_bound = got[:2], got[2:]
    for stats in got:
        assert stats.batches == 6
        assert stats.samples == 24
        assert stats.complete
        assert stats.num_workers == 2
        assert 0.0 <= stats.idle_fraction <= 1.0
    assert [s.epoch for s in got] == [0, 1, 0, 1]
    # compare the two loops, not absolute times: waiting dominates one, stepping the other
    for d, s in zip(data_bound, step_bound, strict=True):
        assert d.idle_fraction > s.idle_fraction
        assert d.mean_wait_s > s.mean_wait_s
        assert d.mean_step_s < s.mean_step_s
    assert max(s.idle_fraction for s in step_bound) < min(d.idle_fraction for d in data_bound)
    assert slow_data.history == data_bound


def test_default_prints_one_line_per_epoch(capsys):
    stats = LoaderStats(loader(SLEEP, n=8))
    for _ in range(3):
        for _batch in stats:
            pass
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3
    assert [line.split(":")[0] for line in lines] == ["epoch 0", "epoch 1", "epoch 2"]
    for line in lines:
        assert "2 batches, data wait" in line
        assert "ms/batch" in line
        assert "->" in line


def test_leaving_early_reports_a_partial_epoch():
    got: list[EpochStats] = []
    stats = LoaderStats(on_epoch_end=got.append)
    for i, _batch in enumerate(stats.wrap(loader(0.0))):
        if i == 2:
            break
    (partial,) = got
    assert partial.batches == 3
    assert not partial.complete
    assert "stopped early" in partial.line()


def test_epoch_summary_while_running_and_after():
    got: list[EpochStats] = []
    stats = LoaderStats(on_epoch_end=got.append)
    assert stats.epoch_summary() is None
    for i, _batch in enumerate(stats.wrap([np.zeros((2, 3))] * 5)):
        if i == 1:
            running = stats.epoch_summary()
            assert running is not None
            assert running.batches == 2
            assert not running.complete
    done = stats.epoch_summary()
    assert done is got[0]
    assert done.batches == 5
    assert done.samples == 10
    assert done.num_workers is None


class FakeLoader(list):  # type: ignore[type-arg]
    num_workers = 1


def fake_epoch(ticks: list[int]) -> EpochStats:
    """One epoch of three 1-sample batches timed by a clock that returns `ticks`."""
    clock = iter(ticks)
    got: list[EpochStats] = []
    stats = LoaderStats(on_epoch_end=got.append, clock=lambda: float(next(clock)))
    assert len(list(stats.wrap(FakeLoader([np.zeros(1)] * 3), epoch=7))) == 3
    (s,) = got
    return s


def test_line_and_hint_from_a_fake_clock():
    # waits 1 (the first, with worker start-up) + 2 + 2, steps 1 each: idle 5/8
    s = fake_epoch([0, 1, 1, 2, 2, 4, 5, 5, 7, 8, 8, 8])
    assert (s.epoch, s.batches, s.samples) == (7, 3, 3)
    assert s.wait_s == 5
    assert s.step_s == 3
    assert s.first_wait_s == 1
    assert s.wall_s == 8
    assert s.idle_fraction == pytest.approx(5 / 8)
    assert s.mean_wait_s == 2.0  # the start-up wait is left out of the mean
    line = s.line()
    assert line.startswith("epoch 7: 3 batches, data wait 62% of the loop (mean 2000.0 ms/batch")
    assert "first 1.00 s" in line
    assert "the GPU would idle 62% of the time" in line
    assert "num_workers" in line
    assert s.as_dict()["idle_fraction"] == pytest.approx(5 / 8)
    assert s.as_dict()["batches"] == 3


def test_a_slow_first_batch_gets_its_own_hint():
    # waits 3 (the first) + 1 + 1: the epoch start dominates
    s = fake_epoch([0, 3, 3, 4, 4, 5, 6, 6, 7, 8, 8, 8])
    assert s.first_wait_s == 3
    assert "most of it is the first batch" in s.line()


def test_a_fast_loader_keeps_up():
    s = fake_epoch([0, 0, 0, 10, 10, 10, 20, 20, 20, 30, 30, 30])
    assert s.idle_fraction == 0
    assert s.line().endswith("-> data loading keeps up")


def test_iterating_without_a_loader_is_an_error():
    with pytest.raises(TypeError, match=r"use stats\.wrap\(loader\)"):
        iter(LoaderStats())
