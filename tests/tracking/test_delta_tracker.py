"""DynamicEmbDeltaTracker on local dynamic modules against a pure-Python model of TorchRec's semantics."""

from __future__ import annotations

import random
from typing import Dict, List

import pytest
import torch

from dynamicemb_core.config import DynamicEmbPoolingMode
from dynamicemb_core.tracking import DynamicEmbDeltaTracker, TrackingMode
from tests.checkpoint.helpers import batch, make_model


class _Oracle:
    """Per consumer, the keys (and first-seen rows) each table looked up since that consumer's last read."""

    def __init__(self, consumers: List[str], tables: List[str]) -> None:
        self.pending: Dict[str, Dict[str, Dict[int, torch.Tensor]]] = {
            c: {t: {} for t in tables} for c in consumers
        }

    def record(self, table: str, keys: torch.Tensor, rows: torch.Tensor) -> None:
        for c in self.pending:
            for i, k in enumerate(keys.tolist()):
                self.pending[c][table].setdefault(k, rows[i] if rows is not None else None)

    def read(self, consumer: str) -> Dict[str, Dict[int, torch.Tensor]]:
        out = self.pending[consumer]
        self.pending[consumer] = {t: {} for t in out}
        return out


def _split(indices, offsets, num_tables, batch_size):
    bounds = offsets[::batch_size].tolist()
    return [indices[bounds[t] : bounds[t + 1]] for t in range(num_tables)]


@pytest.mark.parametrize("delete_on_read", [True, False])
@pytest.mark.parametrize("auto_compact", [False, True])
def test_id_only_matches_model_with_two_consumers(delete_on_read, auto_compact):
    model = make_model()
    tracker = DynamicEmbDeltaTracker(
        model,
        consumers=["publisher", "topk"],
        delete_on_read=delete_on_read,
        auto_compact=auto_compact,
    )
    assert tracker.tracked_fqns == ["ebc.t0", "ebc.t1"]
    oracle = _Oracle(["publisher", "topk"], tracker.tracked_fqns)
    gen, rng = torch.Generator().manual_seed(0), random.Random(0)
    for _ in range(25):
        tracker.step()
        indices, offsets = batch(2, 4, 60, gen)
        model(indices, offsets).sum().backward()
        for t, keys in enumerate(_split(indices, offsets, 2, 4)):
            oracle.record(tracker.tracked_fqns[t], keys, None)
        if rng.random() < 0.3:
            consumer = rng.choice(["publisher", "topk"])
            got = tracker.get_unique_ids(consumer)
            want = oracle.read(consumer)
            for fqn in tracker.tracked_fqns:
                assert sorted(got[fqn].tolist()) == sorted(want[fqn]), (consumer, fqn)
    if delete_on_read:
        tracker.get_unique_ids("publisher")
        tracker.get_unique_ids("topk")
        assert all(not batches for batches in tracker.store.per_fqn.values())


def test_raw_keys_are_reported_not_slots():
    model = make_model()
    tracker = DynamicEmbDeltaTracker(model)
    tracker.step()
    keys = torch.tensor([10**12, -5, 2**62], dtype=torch.int64)
    model(keys, torch.tensor([0, 3, 3])).sum().backward()
    got = tracker.get_unique_ids()
    assert sorted(got["ebc.t0"].tolist()) == sorted(keys.tolist())
    assert got["ebc.t1"].numel() == 0  # nothing new: empty, not an error
    assert tracker.get_unique_ids()["ebc.t0"].numel() == 0  # second read with no new batch


def test_embedding_mode_keeps_first_seen_rows():
    model = make_model(dims=(4, 4), pooling=DynamicEmbPoolingMode.NONE)
    tracker = DynamicEmbDeltaTracker(model, mode=TrackingMode.EMBEDDING)
    oracle = _Oracle(["default"], tracker.tracked_fqns)
    gen = torch.Generator().manual_seed(1)
    for _ in range(6):
        tracker.step()
        indices, offsets = batch(2, 3, 20, gen)
        out = model(indices, offsets)
        bounds = offsets[::3].tolist()
        for t in range(2):
            oracle.record(
                tracker.tracked_fqns[t],
                indices[bounds[t] : bounds[t + 1]],
                out[bounds[t] : bounds[t + 1]].detach().clone(),
            )
        out.pow(2).sum().backward()  # rows move: later lookups see other values
    got = tracker.get_unique()
    want = oracle.read("default")
    for fqn in tracker.tracked_fqns:
        rows = dict(zip(got[fqn].ids.tolist(), got[fqn].states, strict=True))
        assert rows.keys() == want[fqn].keys()
        for k, row in want[fqn].items():
            assert torch.equal(rows[k], row)


def test_embedding_mode_refuses_pooled_tables():
    with pytest.raises(ValueError, match="pooled.*EMBEDDING"):
        DynamicEmbDeltaTracker(make_model(), mode=TrackingMode.EMBEDDING)


def test_unknown_consumer():
    tracker = DynamicEmbDeltaTracker(make_model(), consumers=["a"])
    with pytest.raises(ValueError, match="unknown consumer 'b'"):
        tracker.get_unique_ids("b")


def test_fqns_to_skip_and_detach():
    model = make_model()
    assert DynamicEmbDeltaTracker(model, fqns_to_skip=["ebc"]).tracked_fqns == []
    tracker = DynamicEmbDeltaTracker(model)
    tracker.detach()
    tracker.step()
    model(torch.tensor([1, 2]), torch.tensor([0, 1, 2])).sum().backward()
    assert all(v.numel() == 0 for v in tracker.get_unique_ids().values())
