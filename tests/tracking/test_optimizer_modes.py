"""The delta tracker's optimizer-state modes (MOMENTUM_LAST, MOMENTUM_DIFF / ROWWISE_ADAGRAD),
``record_*``, ``get_latest`` and ``fqn_to_feature_names`` over dynamic tables (issue 15 item 11).

The oracle is TorchRec's tracker semantics written out per key: MOMENTUM_LAST keeps the norm of the
key's first optimizer state read at its latest lookup in the window (UpdateMode.LAST); MOMENTUM_DIFF
keeps the row-wise accumulator at its first lookup (UpdateMode.FIRST) and reports how much it grew by
the read. The optimizer state is read independently of the tracker, through the checkpoint's table
snapshot.
"""

from __future__ import annotations

from typing import Dict

import pytest
import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from dynamicemb_core import DynamicEmbPoolingMode
from dynamicemb_core.tracking import DynamicEmbDeltaTracker, TrackingMode
from tests.checkpoint.helpers import batch, make_model, snapshot

DIMS = (8, 4)


def _state(model, table: str, key: int, dim: int, width: int) -> torch.Tensor:
    """The key's first optimizer state block from the table's snapshot (zeros when not stored)."""
    rows = snapshot(model)[f"model.ebc/{table}"].rows
    if key not in rows:
        return torch.zeros(width)
    return rows[key][dim : dim + width].float()


def _split(indices, offsets, batch_size):
    bounds = offsets[::batch_size].tolist()
    return [indices[bounds[t] : bounds[t + 1]] for t in range(len(DIMS))]


@pytest.mark.parametrize(
    "optimizer,width", [("ADAM", None), ("EXACT_ADAGRAD", None), ("EXACT_ROWWISE_ADAGRAD", 1)]
)
def test_momentum_last_keeps_the_latest_norm_per_key(optimizer, width):
    model = make_model(dims=DIMS, optimizer=optimizer)
    tracker = DynamicEmbDeltaTracker(model, mode=TrackingMode.MOMENTUM_LAST)
    want: Dict[str, Dict[int, float]] = {"ebc.t0": {}, "ebc.t1": {}}
    gen = torch.Generator().manual_seed(3)
    for step in range(6):
        tracker.step()
        indices, offsets = batch(2, 4, 25, gen)
        # the oracle reads the states the lookup will see: the table before this batch's update
        for t, keys in enumerate(_split(indices, offsets, 4)):
            name, dim = f"t{t}", DIMS[t]
            for k in keys.tolist():
                norm = _state(model, name, k, dim, width or dim).norm().item()
                want[f"ebc.{name}"][k] = norm  # LAST: a later lookup overwrites
        model(indices, offsets).pow(2).sum().backward()
        if step == 3:
            got = tracker.get_unique()
            _compare(got, want)
            want = {"ebc.t0": {}, "ebc.t1": {}}
    _compare(tracker.get_unique(), want)


def _compare(got, want):
    assert any(v > 0 for per_key in want.values() for v in per_key.values()), "a trivial window"
    for fqn, per_key in want.items():
        rows = dict(zip(got[fqn].ids.tolist(), got[fqn].states.tolist(), strict=True))
        assert rows.keys() == per_key.keys(), fqn
        for k, v in per_key.items():
            assert rows[k] == pytest.approx(v, rel=1e-5, abs=1e-7), (fqn, k)


@pytest.mark.parametrize("mode", [TrackingMode.MOMENTUM_DIFF, TrackingMode.ROWWISE_ADAGRAD])
def test_momentum_diff_reports_the_accumulator_growth_since_first_lookup(mode):
    model = make_model(dims=DIMS)  # EXACT_ROWWISE_ADAGRAD
    tracker = DynamicEmbDeltaTracker(model, mode=mode, consumers=["a", "b"])
    first: Dict[str, Dict[str, Dict[int, float]]] = {c: {"ebc.t0": {}, "ebc.t1": {}} for c in "ab"}
    gen = torch.Generator().manual_seed(4)

    def read(consumer):
        got = tracker.get_unique(consumer)
        for fqn, per_key in first[consumer].items():
            t = int(fqn[-1])
            rows = dict(zip(got[fqn].ids.tolist(), got[fqn].states.tolist(), strict=True))
            assert rows.keys() == per_key.keys()
            assert any(v > 0 for v in rows.values()), "a trivial window"
            for k, then in per_key.items():
                now = _state(model, f"t{t}", k, DIMS[t], 1).item()
                assert rows[k] == pytest.approx(now - then, rel=1e-5, abs=1e-7)
                assert rows[k] >= 0
        first[consumer] = {"ebc.t0": {}, "ebc.t1": {}}

    for step in range(7):
        tracker.step()
        indices, offsets = batch(2, 4, 25, gen)
        for t, keys in enumerate(_split(indices, offsets, 4)):
            for k in keys.tolist():
                value = _state(model, f"t{t}", k, DIMS[t], 1).item()
                for c in "ab":
                    first[c][f"ebc.t{t}"].setdefault(k, value)  # FIRST: the earliest stays
        model(indices, offsets).pow(2).sum().backward()
        if step in (2, 5):
            read("a")
    read("a")
    read("b")


def test_optimizer_modes_refuse_tables_without_the_state():
    with pytest.raises(ValueError, match="keeps none"):
        DynamicEmbDeltaTracker(make_model(optimizer="EXACT_SGD"), mode=TrackingMode.MOMENTUM_LAST)
    with pytest.raises(ValueError, match="row-wise Adagrad accumulator.*ADAM"):
        DynamicEmbDeltaTracker(make_model(optimizer="ADAM"), mode=TrackingMode.MOMENTUM_DIFF)


def test_get_latest_and_fqn_to_feature_names():
    model = make_model(dims=DIMS)
    tracker = DynamicEmbDeltaTracker(model)
    assert tracker.fqn_to_feature_names() == {
        "ebc.t0": ["t0.feature0"],
        "ebc.t1": ["t1.feature1"],
    }
    gen = torch.Generator().manual_seed(5)
    for _ in range(3):
        indices, offsets = batch(2, 4, 25, gen)
        model(indices, offsets).pow(2).sum().backward()
    latest = tracker.get_latest()
    for t, fqn in enumerate(["ebc.t0", "ebc.t1"]):
        stored = snapshot(model)[f"model.ebc/t{t}"].rows
        got = dict(zip(latest[fqn].ids.tolist(), latest[fqn].states, strict=True))
        assert got.keys() == stored.keys()
        for k, row in stored.items():
            assert torch.equal(got[k], row[DIMS[t] : DIMS[t] + 1].float())
    some = tracker.get_latest({"ebc.t1": torch.tensor([10**15, next(iter(stored))])})
    assert list(some) == ["ebc.t1"]
    assert some["ebc.t1"].states[0].item() == 0.0  # a key the table does not hold


def test_record_methods_take_torchrecs_arguments():
    """record_ids / record_embeddings / record_momentum / record_rowwise_optim_state with a KJT, as
    TorchRec's hooks call them; features map to tables through feature_to_fqn."""
    model = make_model(dims=DIMS)
    tracker = DynamicEmbDeltaTracker(model, mode=TrackingMode.ROWWISE_ADAGRAD)
    tracker.feature_to_fqn.update({"f0": "ebc.t0", "f1": "ebc.t1"})
    model(torch.tensor([1, 2, 3]), torch.tensor([0, 2, 3])).pow(2).sum().backward()
    kjt = KeyedJaggedTensor(
        keys=["f0", "f1", "other"],
        values=torch.tensor([1, 2, 2, 3, 7]),
        lengths=torch.tensor([3, 1, 1]),
    )
    tracker.record_rowwise_optim_state(None, kjt)
    rows = tracker.store.get_unique()
    assert sorted(rows["ebc.t0"].ids.tolist()) == [1, 2]
    assert rows["ebc.t1"].ids.tolist() == [3]
    with pytest.raises(ValueError, match="needs states"):
        tracker.record_ids(kjt)  # ids alone cannot feed a mode that keeps a state per id
    sequence = make_model(dims=(4, 4), pooling=DynamicEmbPoolingMode.NONE)
    tracker2 = DynamicEmbDeltaTracker(sequence, mode=TrackingMode.EMBEDDING)
    tracker2.feature_to_fqn.update({"f0": "ebc.t0", "f1": "ebc.t1"})
    tracker2.record_embeddings(kjt, torch.arange(20.0).view(5, 4))
    got = tracker2.store.get_unique()
    assert torch.equal(got["ebc.t1"].states, torch.tensor([[12.0, 13.0, 14.0, 15.0]]))
    with pytest.raises(ValueError, match="one row per id"):
        tracker2.record_embeddings(kjt, torch.arange(7.0))
