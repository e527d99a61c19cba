"""save_deltas / load_deltas: deltas shipped as files load with weights_only=True and round-trip.

A delta file comes from a folder others may write to (trainer -> replica). A file crafted to run
code when unpickled must be refused before anything in it runs; a real delta must come back key
by key, and replay the same as the delta it was saved from.
"""

from __future__ import annotations

import importlib.util
import os
import pickle
import sys
from typing import Dict, Tuple

import pytest
import torch

from dynamicemb_core.checkpoint import CheckpointCorruptError, load_deltas, save_deltas
from dynamicemb_core.config import DynamicEmbTableOptions, EvictedItemMode
from dynamicemb_core.incremental_dump import (
    DeltaDumpResult,
    ReplayContent,
    erase,
    incremental_dump,
    replay_increment,
)
from tests.checkpoint.helpers import (
    EVICTING,
    RETAIN,
    S,
    assert_same_tables,
    make_model,
    snapshot,
    train,
)

OLDEST = -(2**63)
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class _RunsCode:
    """Unpickling this creates ``marker``: what a crafted file could do instead (run anything)."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _by_key(delta: DeltaDumpResult, i: int) -> Dict[int, Tuple]:
    """Table ``i`` of a delta as key -> (slot, embedding, optimizer state, scores)."""
    slots = delta.meta[i]["slot_index"]
    return {
        int(k): (
            int(slots[j]),
            delta.values[i][j].tolist(),
            delta.optimizer_states[i][j].tolist(),
            delta.scores[i][j].tolist(),
        )
        for j, k in enumerate(delta.keys[i].tolist())
    }


def _trained_deltas() -> Tuple[torch.nn.Module, Dict[str, DeltaDumpResult]]:
    src = make_model(**EVICTING, evicted_item_mode=RETAIN)
    train(src, 6, seed=1, key_range=300)  # evicts: retained evicted keys travel too
    erase(src, {"model.ebc": {"t1": torch.tensor([1, 2, 3])}}, EvictedItemMode.RETAIN_KEY)
    return src, incremental_dump(src, OLDEST)


def test_a_delta_round_trips_exactly_key_by_key_and_replays_the_same(tmp_path) -> None:
    src, deltas = _trained_deltas()
    path = str(tmp_path / "delta.pt")
    assert save_deltas(deltas, path) == os.path.getsize(path)
    torch.load(path, weights_only=True)  # the file is weights_only-safe as it stands
    loaded = load_deltas(path)
    assert list(loaded) == list(deltas) == ["model.ebc"]
    a, b = deltas["model.ebc"], loaded["model.ebc"]
    assert b.table_names == a.table_names == ["t0", "t1"]
    for i in range(len(a)):
        assert a.keys[i].numel() > 0
        assert _by_key(b, i) == _by_key(a, i)  # key by key: slot, row, state, scores
        for field in ("keys", "values", "optimizer_states", "scores"):
            x, y = getattr(a, field)[i], getattr(b, field)[i]
            assert x.dtype == y.dtype and torch.equal(x, y), field
        for field in ("evicted_keys", "erased_keys"):
            x, y = getattr(a, field)[i], getattr(b, field)[i]
            assert (x is None) == (y is None) and (x is None or torch.equal(x, y)), field
        assert set(b.meta[i]) == set(a.meta[i])
        for key, value in a.meta[i].items():
            if key == "table_options":
                got = b.meta[i][key]
                assert isinstance(got, DynamicEmbTableOptions)
                assert got.score_strategies == value.score_strategies
                assert (got.dim, got.dist_type, got.max_capacity, got.bucket_capacity) == (
                    value.dim,
                    value.dist_type,
                    value.max_capacity,
                    value.bucket_capacity,
                )
                assert got.initializer_args == value.initializer_args
                assert got.evicted_item_mode == value.evicted_item_mode
            elif isinstance(value, torch.Tensor):
                assert torch.equal(b.meta[i][key], value), key
            else:
                assert b.meta[i][key] == value, key
    assert a.erased_keys[1].numel() > 0 and a.evicted_keys[0].numel() > 0  # both travel
    # the oracle: replaying the loaded delta gives the tables the in-memory one gives
    direct = make_model(**EVICTING, evicted_item_mode=RETAIN)
    shipped = make_model(**EVICTING, evicted_item_mode=RETAIN)
    replay_increment(direct, deltas, ReplayContent.ALL)
    replay_increment(shipped, loaded, ReplayContent.ALL)
    assert_same_tables(snapshot(direct), snapshot(shipped))
    assert_same_tables(snapshot(src), snapshot(shipped))


def test_a_compound_strategy_and_no_optimizer_state_round_trip(tmp_path) -> None:
    src = make_model(optimizer="SGD", score_strategy=(S.LFU, S.TIMESTAMP))
    train(src, 2, seed=2)
    deltas = incremental_dump(src, {"model.ebc": {"t0": 0}})  # LFU first: a count threshold
    save_deltas(deltas, str(tmp_path / "d.pt"))
    loaded = load_deltas(str(tmp_path / "d.pt"))["model.ebc"]
    assert loaded.table_names == ["t0"] and _by_key(loaded, 0) == _by_key(deltas["model.ebc"], 0)
    assert loaded.meta[0]["table_options"].score_strategies == (S.LFU, S.TIMESTAMP)
    assert loaded.optimizer_states[0].shape[1] == 0


def test_plugin_options_and_their_secrets_stay_behind(tmp_path) -> None:
    secret = "Pw-delta-s3cret"
    options = DynamicEmbTableOptions(
        dim=4,
        external_storage="dict",
        external_storage_options={"url": f"redis://u:{secret}@h/0", "password": secret},
        score_function_options={},
    )
    delta = DeltaDumpResult(
        table_names=["t"],
        keys=[torch.tensor([5])],
        values=[torch.ones(1, 4)],
        optimizer_states=[torch.zeros(1, 0)],
        scores=[torch.zeros(1, 1, dtype=torch.int64)],
        evicted_keys=[None],
        erased_keys=[torch.empty(0, dtype=torch.int64)],
        meta=[{"slot_index": torch.tensor([0]), "table_options": options}],
    )
    path = tmp_path / "d.pt"
    save_deltas({"c": delta}, str(path))
    assert secret.encode() not in path.read_bytes()
    got = load_deltas(str(path))["c"].meta[0]["table_options"]
    assert got.external_storage == "dict" and got.external_storage_options == {}


def test_a_crafted_file_that_would_run_code_is_refused_and_runs_nothing(tmp_path) -> None:
    marker = tmp_path / "ran"
    crafted = tmp_path / "delta_rank0_0000.pt"
    torch.save({"ebc": _RunsCode(str(marker))}, str(crafted))
    # the payload is real: an unsafe load runs it (checked on another marker)
    proof = tmp_path / "proof"
    torch.save(_RunsCode(str(proof)), str(tmp_path / "proof.pt"))
    torch.load(str(tmp_path / "proof.pt"), weights_only=False)
    assert proof.exists()
    with pytest.raises(CheckpointCorruptError, match="refused without running anything") as info:
        load_deltas(str(crafted))
    assert str(crafted) in str(info.value) and "not a delta file" in str(info.value)
    assert not marker.exists()
    # a bare pickle (not torch's zip format) too
    with open(crafted, "wb") as f:
        pickle.dump(_RunsCode(str(marker)), f)
    with pytest.raises(CheckpointCorruptError, match=str(crafted)):
        load_deltas(str(crafted))
    assert not marker.exists()


def test_a_pickled_delta_object_is_refused_with_a_clear_error(tmp_path) -> None:
    _, deltas = _trained_deltas()
    path = str(tmp_path / "old.pt")
    torch.save(deltas, path)  # how the example shipped deltas before: a pickle of the objects
    with pytest.raises(CheckpointCorruptError, match=r"not a delta file written by save_deltas"):
        load_deltas(path)


@pytest.mark.parametrize(
    "content, reason",
    [
        ({"ebc": []}, "no 'dynamicemb_core.delta' format tag"),
        ({"format": "dynamicemb_core.delta", "version": 99, "collections": {}}, "version 99"),
        (
            {
                "format": "dynamicemb_core.delta",
                "version": 1,
                "collections": {"ebc": {"table_names": ["t"], "keys": []}},
            },
            r"keys is not a list of 1",
        ),
        (
            {
                "format": "dynamicemb_core.delta",
                "version": 1,
                "collections": {"ebc": {"table_names": ["t"], "keys": ["x"]}},
            },
            r"table 't': keys is a str, not a tensor",
        ),
        (
            {
                "format": "dynamicemb_core.delta",
                "version": 1,
                "collections": {
                    "ebc": {"table_names": ["t"], "meta": [{"table_options": {"dim": -1}}]}
                },
            },
            r"table_options'\] is not valid: dim",
        ),
    ],
)
def test_content_not_in_the_format_is_refused(tmp_path, content, reason: str) -> None:
    path = str(tmp_path / "d.pt")
    torch.save(content, path)
    with pytest.raises(CheckpointCorruptError, match=reason):
        load_deltas(path)


def test_the_replica_example_refuses_a_crafted_delta(tmp_path) -> None:
    example = os.path.join(ROOT, "examples", "online_sync")
    sys.path.insert(0, example)
    try:
        spec = importlib.util.spec_from_file_location(
            "online_sync_replica_sec", os.path.join(example, "replica.py")
        )
        replica = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(replica)
        common = sys.modules["common"]
    finally:
        sys.path.remove(example)
    torch.save(common.build_replica().mlp.state_dict(), str(tmp_path / "dense.pt"))
    marker = tmp_path / "ran"
    torch.save({"sparse": _RunsCode(str(marker))}, str(tmp_path / "delta_rank0_0000.pt"))
    with pytest.raises(CheckpointCorruptError, match="delta_rank0_0000.pt"):
        replica.main(["--dir", str(tmp_path)])
    assert not marker.exists()
