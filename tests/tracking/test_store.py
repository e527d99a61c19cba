"""KeyDeltaStore against TorchRec's own DeltaStoreTrec, driven by the same random operation sequences."""

from __future__ import annotations

import random

import pytest
import torch

from dynamicemb_core.tracking.store import KeyDeltaStore
from dynamicemb_core.tracking.types import UpdateMode

delta_store = pytest.importorskip("torchrec.distributed.model_tracker.delta_store")
TorchRecStore = getattr(delta_store, "DeltaStoreTrec", None) or delta_store.DeltaStore


def _as_map(rows):
    """ids -> state row (or None), independent of the order unique() returns ids in."""
    if rows.states is None:
        return {int(i): None for i in rows.ids}
    return {int(i): tuple(s.tolist()) for i, s in zip(rows.ids, rows.states, strict=True)}


@pytest.mark.parametrize("mode", [UpdateMode.NONE, UpdateMode.FIRST, UpdateMode.LAST])
@pytest.mark.parametrize("seed", range(6))
def test_store_matches_torchrec_delta_store(mode, seed):
    rng = random.Random(seed)
    ours, theirs = KeyDeltaStore(mode), TorchRecStore(mode)
    batch = 0
    fqns = ["ec.t0", "ec.t1"]
    for _ in range(60):
        op = rng.random()
        if op < 0.55:
            batch += rng.choice([0, 1, 1, 2])
            for fqn in fqns:
                n = rng.randint(1, 12)
                ids = torch.tensor([rng.randint(-5, 20) for _ in range(n)], dtype=torch.int64)
                states = None if mode == UpdateMode.NONE else torch.randn(n, 3)
                ours.append(batch, fqn, ids, states)
                theirs.append(batch_idx=batch, fqn=fqn, ids=ids, states=states)
        elif op < 0.7 and batch > 0:
            lo = rng.randint(0, batch)
            hi = rng.randint(lo + 1, batch + 2)
            ours.compact(lo, hi)
            theirs.compact(lo, hi)
        elif op < 0.8:
            up_to = rng.randint(0, batch + 1)
            ours.delete(up_to)
            theirs.delete(up_to_idx=up_to)
        else:
            start = rng.randint(0, batch + 1)
            got = ours.get_unique(start)
            nonempty = {
                fqn
                for fqn, lookups in theirs.per_fqn_lookups.items()
                if any(x.batch_idx >= start for x in lookups)
            }
            want = (
                dict(theirs.get_unique(start).items())
                if nonempty == set(theirs.per_fqn_lookups)
                else None
            )
            for fqn in nonempty:
                if want is None:  # TorchRec raises on a table with nothing in range; ask per table
                    sub = TorchRecStore(mode)
                    sub.per_fqn_lookups = {fqn: theirs.per_fqn_lookups[fqn]}
                    expected = sub.get_unique(start)[fqn]
                else:
                    expected = want[fqn]
                assert _as_map(got[fqn]) == _as_map(expected)
            for fqn, rows in got.items():
                if fqn not in nonempty:
                    assert rows.ids.numel() == 0


def test_store_requires_states_outside_id_only():
    store = KeyDeltaStore(UpdateMode.FIRST)
    with pytest.raises(ValueError, match="needs states"):
        store.append(0, "ec.t0", torch.tensor([1]))


def test_compact_rejects_empty_range():
    with pytest.raises(ValueError, match="start_idx < end_idx"):
        KeyDeltaStore().compact(3, 3)
