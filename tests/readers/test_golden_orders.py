"""Golden orders: the exact ids and resume states of every sampler kind, pinned as CRC-32s.

The invariant tests elsewhere check properties (a permutation, disjoint ranks, exact resumes);
this one checks values, so that moving or merging code cannot change any order by accident.
For every kind of `tests/readers/test_elastic_resume.py`'s `KINDS` (the chunked sampler and
batch sampler, weighted mixing with mix="epoch" and mix="batch", width buckets, `ShardStream`,
plain and mixed) over a grid of seeds x epochs x world sizes x ranks x drop_last, it takes the
CRC-32 of the ids the rank yields in one epoch and of its resume state after two units.

`golden_orders.json` beside this file was captured on the code before the tree was reorganised.
An intended change of an order is a new state version: regenerate the file with
`python -m tests.readers.test_golden_orders --write` and say why in the commit.
"""

from __future__ import annotations

import json
import sys
import zlib
from pathlib import Path
from typing import Any

import pytest

from tests.readers import test_elastic_resume as elastic

GOLDEN = Path(__file__).with_name("golden_orders.json")
SEEDS = (0, 7)
EPOCHS = (0, 2)
WORLDS = (1, 2, 3)


def _crc(value: Any) -> int:
    return zlib.crc32(json.dumps(value, sort_keys=True, default=str).encode())


def _orders(name: str, mp: pytest.MonkeyPatch) -> dict[str, list[int]]:
    kind = elastic.KINDS[name]
    out: dict[str, list[int]] = {}
    for seed in SEEDS:
        mp.setitem(elastic.KW, "seed", seed)
        for epoch in EPOCHS:
            for world in WORLDS:
                for rank in range(world):
                    for drop in (False, True):
                        sampler = kind.make(rank, world, drop)
                        sampler.set_epoch(epoch)
                        units = [[int(i) for i in unit] for unit in kind.run(sampler, mp)]
                        state = kind.save(sampler, 2)
                        key = f"seed={seed} epoch={epoch} world={world} rank={rank} drop={drop}"
                        out[key] = [_crc(units), _crc(state)]
    return out


def _all_orders(mp: pytest.MonkeyPatch) -> dict[str, dict[str, list[int]]]:
    return {name: _orders(name, mp) for name in sorted(elastic.KINDS)}


@pytest.mark.parametrize("name", sorted(elastic.KINDS))
def test_every_order_and_state_is_golden(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    golden = json.loads(GOLDEN.read_text())
    assert name in golden, f"{name} has no golden orders; regenerate {GOLDEN.name}"
    now = _orders(name, monkeypatch)
    differ = [key for key in golden[name] if golden[name][key] != now.get(key)]
    assert not differ, f"{name}: {len(differ)} of {len(now)} orders or states changed: {differ[:4]}"
    assert set(now) == set(golden[name])


def test_the_golden_file_covers_every_kind() -> None:
    assert sorted(json.loads(GOLDEN.read_text())) == sorted(elastic.KINDS)


if __name__ == "__main__":  # pragma: no cover - regenerates the golden file
    if sys.argv[1:] != ["--write"]:
        raise SystemExit("usage: python -m tests.readers.test_golden_orders --write")
    with pytest.MonkeyPatch.context() as patch:
        GOLDEN.write_text(json.dumps(_all_orders(patch), indent=1, sort_keys=True) + "\n")
    print(f"wrote {GOLDEN}")
