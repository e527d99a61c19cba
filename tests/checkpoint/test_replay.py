"""incremental_dump + replay_increment on one process: every rule of the replay design, on CPU."""

from __future__ import annotations

import glob
import os

import pytest
import torch

from dynamicemb_core.checkpoint import DynamicEmbDump, IncompatibleDeltaError
from dynamicemb_core.checkpoint.format import read_shard_header
from dynamicemb_core.config import EvictedItemMode
from dynamicemb_core.incremental_dump import (
    ReplayContent,
    erase,
    get_score,
    incremental_dump,
    replay_increment,
)
from tests.checkpoint.helpers import (
    EVICTING,
    RETAIN,
    S,
    assert_same_tables,
    hot_and_cold,
    make_model,
    snapshot,
    train,
)

OLDEST = -(2**63)  # a threshold every score passes


def test_replay_leaves_target_layout_identical_through_evictions():
    src, dst = make_model(**EVICTING), make_model(**EVICTING)
    threshold = OLDEST
    for round_ in range(4):
        train(src, 5, seed=round_, key_range=300)  # far more keys than 64 slots: constant eviction
        deltas = incremental_dump(src, threshold)
        threshold = get_score(src)["model.ebc"]["t0"]
        replay_increment(dst, deltas, ReplayContent.ALL)
        assert_same_tables(snapshot(src), snapshot(dst))


def test_incremental_dump_returns_only_rows_touched_since_threshold():
    src = make_model()
    train(src, 3, seed=0, key_range=100)
    mark = get_score(src)
    gen_keys = torch.tensor([500, 501, 502], dtype=torch.int64)
    src(gen_keys, torch.tensor([0, 3, 3])).sum().backward()
    deltas = incremental_dump(src, mark)
    d = deltas["model.ebc"]
    assert d.table_names == ["t0", "t1"]
    assert sorted(d.keys[0].tolist()) == [500, 501, 502]
    assert d.keys[1].numel() == 0
    meta = d.meta[0]
    assert set(meta) >= {
        "current_score",
        "slot_index",
        "current_capacity",
        "row_capacity",
        "bucket_capacity",
        "num_scores",
        "world_size",
        "table_options",
    }
    snap = snapshot(src)["model.ebc/t0"]
    assert meta["slot_index"].tolist() == [snap.slots[k] for k in d.keys[0].tolist()]
    assert (
        meta["current_capacity"] == 256
        and meta["bucket_capacity"] == 16
        and meta["world_size"] == 1
    )
    assert d.values[0].shape == (3, 8)
    assert d.optimizer_states[0].shape == (3, 1)  # rowwise Adagrad: one scalar per row


def test_rowwise_adagrad_row_has_checkpoint_width_one_in_delta_and_file(tmp_path):
    src = make_model(optimizer="EXACT_ROWWISE_ADAGRAD")
    train(src, 2)
    d = incremental_dump(src, OLDEST)["model.ebc"]
    DynamicEmbDump(str(tmp_path), src, optim=True)
    for i, name in enumerate(d.table_names):
        (path,) = glob.glob(os.path.join(str(tmp_path), "model.ebc", f"{name}.*"))
        assert read_shard_header(path).optimizer_width == d.optimizer_states[i].shape[1] == 1


@pytest.mark.parametrize("threshold", [1.5, "0", True, None, {"model.ebc": {"t0": 2.0}}])
def test_threshold_of_wrong_type_raises_type_error(threshold):
    src = make_model()
    with pytest.raises(TypeError, match="score_threshold"):
        incremental_dump(src, threshold)


def test_threshold_dict_selects_tables_and_rejects_unknown_names():
    src = make_model()
    train(src, 2)
    d = incremental_dump(src, {"model.ebc": {"t1": OLDEST}})["model.ebc"]
    assert d.table_names == ["t1"]
    with pytest.raises(ValueError, match="names table 'zz'"):
        incremental_dump(src, {"model.ebc": {"zz": 0}})
    with pytest.raises(ValueError, match="collection 'nope'"):
        incremental_dump(src, {"nope": {"t0": 0}})


def test_continuous_dist_type_raises_not_implemented():
    src = make_model(dist_type="continuous")
    with pytest.raises(NotImplementedError, match="continuous"):
        incremental_dump(src, 0)


def test_mismatched_second_table_rejected_before_first_is_written():
    src = make_model(dims=(8, 4))
    train(src, 3)
    deltas = incremental_dump(src, OLDEST)
    # the target's second table gets another bucket width; its first table fits the delta
    dst2 = make_model(dims=(8, 4))
    bad = make_model(dims=(8, 4), bucket_capacity=32)
    dst2.ebc.tables[1] = bad.ebc.tables[1]
    dst2.ebc.table_options[1] = bad.ebc.table_options[1]
    before = snapshot(dst2)
    with pytest.raises(
        IncompatibleDeltaError, match="t1.*bucket_capacity expected 32, delta has 16"
    ):
        replay_increment(dst2, deltas, ReplayContent.ALL)
    after = snapshot(dst2)
    assert all(len(after[n].keys()) == len(before[n].keys()) == 0 for n in after)


@pytest.mark.parametrize(
    "field,value,pattern",
    [
        ("current_capacity", 512, "current_capacity expected 256, delta has 512"),
        ("row_capacity", 100, "row_capacity expected 256, delta has 100"),
        ("num_scores", 2, "num_scores expected 1"),
        ("world_size", 2, "world_size expected 1"),
    ],
)
def test_mismatched_meta_field_is_named(field, value, pattern):
    src = make_model()
    train(src, 2)
    deltas = incremental_dump(src, OLDEST)
    deltas["model.ebc"].meta[0][field] = value
    dst = make_model()
    with pytest.raises(IncompatibleDeltaError, match=pattern):
        replay_increment(dst, deltas)
    assert all(len(s.keys()) == 0 for s in snapshot(dst).values())


def test_other_dim_or_strategy_rejected():
    src = make_model(score_strategy=S.LFU)
    train(src, 2)
    deltas = incremental_dump(src, OLDEST)
    with pytest.raises(IncompatibleDeltaError, match="score_strategy expected"):
        replay_increment(make_model(score_strategy=S.STEP), deltas)
    with pytest.raises(IncompatibleDeltaError, match="dim expected 6, delta has 4"):
        replay_increment(make_model(dims=(8, 6), score_strategy=S.LFU), deltas)


def test_reversed_score_order_replays_into_the_right_columns():
    src = make_model(score_strategy=(S.TIMESTAMP, S.LFU))
    hot_and_cold(src)
    deltas = incremental_dump(src, OLDEST)
    dst = make_model(score_strategy=(S.LFU, S.TIMESTAMP))  # same physical layout
    replay_increment(dst, deltas, ReplayContent.SCORE)
    counts = {k: v[0] for k, v in snapshot(dst)["model.ebc/t0"].scores.items()}
    assert counts == {3: 5, 7: 1}
    src_ts = {k: v[0] for k, v in snapshot(src)["model.ebc/t0"].scores.items()}
    dst_ts = {k: v[1] for k, v in snapshot(dst)["model.ebc/t0"].scores.items()}
    assert len({src_ts[k] - dst_ts[k] for k in src_ts}) == 1  # same ages, re-based


@pytest.mark.parametrize("keeps_source_scores", [True, False])
def test_replay_scores_follow_the_content_flag(keeps_source_scores):
    src = make_model(score_strategy=S.LFU)
    hot_and_cold(src)
    deltas = incremental_dump(src, OLDEST)
    dst = make_model(score_strategy=S.LFU)
    content = ReplayContent.ALL if keeps_source_scores else ReplayContent.EMBEDDING_ONLY
    replay_increment(dst, deltas, content)
    counts = {k: v[0] for k, v in snapshot(dst)["model.ebc/t0"].scores.items()}
    assert counts == ({3: 5, 7: 1} if keeps_source_scores else {3: 1, 7: 1})


def test_embedding_only_replay_gives_fresh_state_and_all_gives_source_state():
    src = make_model(optimizer="EXACT_ADAGRAD")
    train(src, 3)
    deltas = incremental_dump(src, OLDEST)
    only, full = make_model(optimizer="EXACT_ADAGRAD"), make_model(optimizer="EXACT_ADAGRAD")
    replay_increment(only, deltas, ReplayContent.EMBEDDING_ONLY)
    replay_increment(full, deltas, ReplayContent.OPTIMIZER_STATE)
    s, o, f = (
        snapshot(src)["model.ebc/t0"],
        snapshot(only)["model.ebc/t0"],
        snapshot(full)["model.ebc/t0"],
    )
    for k in s.keys():
        assert torch.equal(s.rows[k], f.rows[k])
        assert torch.equal(s.rows[k][:8], o.rows[k][:8])
        assert torch.count_nonzero(o.rows[k][8:]) == 0


def test_optimizer_state_asked_for_but_absent_is_rejected():
    src = make_model(optimizer="EXACT_SGD")
    train(src, 2)
    deltas = incremental_dump(src, OLDEST)
    dst = make_model(optimizer="EXACT_ROWWISE_ADAGRAD")
    with pytest.raises(IncompatibleDeltaError, match="carries no optimizer state"):
        replay_increment(dst, deltas, ReplayContent.OPTIMIZER_STATE)
    assert all(len(s.keys()) == 0 for s in snapshot(dst).values())


def test_serving_replica_without_optimizer_state_takes_embeddings():
    src = make_model(optimizer="ADAM")
    train(src, 3)
    dst = make_model(optimizer="ADAM", training=False)
    replay_increment(dst, incremental_dump(src, OLDEST), ReplayContent.ALL)
    assert_same_tables(snapshot(src), snapshot(dst), rows=False)
    s, d = snapshot(src)["model.ebc/t1"], snapshot(dst)["model.ebc/t1"]
    for k in s.keys():
        assert torch.equal(s.rows[k][:4], d.rows[k])


def test_slot_outside_home_bucket_raises_before_writing():
    src = make_model()
    train(src, 2)
    deltas = incremental_dump(src, OLDEST)
    slots = deltas["model.ebc"].meta[1]["slot_index"]
    slots[0] = (slots[0] + 16) % 256  # the next bucket over
    dst = make_model()
    with pytest.raises(IncompatibleDeltaError, match="cannot be placed at slot .* home bucket"):
        replay_increment(dst, deltas)
    assert all(len(s.keys()) == 0 for s in snapshot(dst).values())


def _append_row(d, i: int, key: int, slot: int) -> None:
    """Append to table i of delta d a copy of its first row under another key and/or slot."""
    d.keys[i] = torch.cat([d.keys[i], torch.tensor([key])])
    d.meta[i]["slot_index"] = torch.cat([d.meta[i]["slot_index"], torch.tensor([slot])])
    for field in ("values", "optimizer_states", "scores"):
        column = getattr(d, field)
        column[i] = torch.cat([column[i], column[i][:1]])


def test_two_keys_claiming_one_slot_raise():
    from dynamicemb_core.table.hashing import buckets_of_tensor

    src = make_model()
    train(src, 2)
    deltas = incremental_dump(src, OLDEST)
    d = deltas["model.ebc"]
    key, slot = int(d.keys[0][0]), int(d.meta[0]["slot_index"][0])
    candidates = torch.arange(10**9, 10**9 + 1000)
    same_bucket = candidates[
        buckets_of_tensor(candidates, 16) == buckets_of_tensor(torch.tensor([key]), 16)
    ]
    _append_row(d, 0, int(same_bucket[0]), slot)  # a different key, home bucket right, slot taken
    with pytest.raises(IncompatibleDeltaError, match=f"both claim slot {slot}"):
        replay_increment(make_model(), deltas)


def test_one_key_at_two_slots_raises():
    src = make_model()
    train(src, 2)
    deltas = incremental_dump(src, OLDEST)
    d = deltas["model.ebc"]
    key, slot = int(d.keys[0][0]), int(d.meta[0]["slot_index"][0])
    used = set(d.meta[0]["slot_index"].tolist())
    free = next(s for s in range(slot - slot % 16, slot - slot % 16 + 16) if s not in used)
    _append_row(d, 0, key, free)
    with pytest.raises(IncompatibleDeltaError, match=f"key {key} appears at two slots"):
        replay_increment(make_model(), deltas)


def test_erased_keys_are_removed_and_evicted_keys_are_not():
    src, dst = make_model(evicted_item_mode=RETAIN, **EVICTING), make_model(**EVICTING)
    train(src, 3, key_range=300)
    replay_increment(dst, incremental_dump(src, OLDEST), ReplayContent.ALL)
    mark = get_score(src)
    present = snapshot(src)["model.ebc/t0"].keys()
    gone = erase(src, {"model.ebc": {"t0": torch.tensor(present[:3])}}, EvictedItemMode.RETAIN_KEY)
    assert sorted(gone["model.ebc"]["t0"].tolist()) == present[:3]
    erase(src, {"model.ebc": {"t0": torch.tensor(present[3:5])}})  # DISCARD: not reported
    train(src, 2, seed=7, key_range=300)
    d = incremental_dump(src, mark)["model.ebc"]
    assert sorted(d.erased_keys[0].tolist()) == present[:3]
    assert d.evicted_keys[0] is not None and d.evicted_keys[0].numel() > 0
    replay_increment(dst, {"model.ebc": d}, ReplayContent.ALL)
    after = snapshot(dst)["model.ebc/t0"].keys()
    assert not set(present[:3]) & set(after)
    # DISCARD-erased keys stay on the replica unless a delta key took their slot
    src_after = snapshot(src)["model.ebc/t0"]
    assert set(after) - set(src_after.keys()) <= set(present[3:5])
    # a second dump reports nothing new: both buffers were drained
    d2 = incremental_dump(src, get_score(src))["model.ebc"]
    assert d2.erased_keys[0].numel() == 0 and d2.evicted_keys[0].numel() == 0


def test_replay_rejects_bad_arguments():
    src = make_model()
    train(src, 1)
    deltas = incremental_dump(src, OLDEST)
    with pytest.raises(TypeError, match="ReplayContent"):
        replay_increment(make_model(), deltas, "ALL")
    with pytest.raises(TypeError, match="DeltaDumpResult"):
        replay_increment(make_model(), {"model.ebc": {"keys": []}})
    with pytest.raises(ValueError, match="no collection 'other'"):
        replay_increment(make_model(), {"other": deltas["model.ebc"]})


# Row bytes of a dim-8 rowwise-Adagrad row: 9 float32.
_ROW_BYTES = 9 * 4


@pytest.mark.parametrize(
    "storage",
    [
        dict(caching=True, local_hbm_for_values=32 * _ROW_BYTES),
        dict(local_hbm_for_values=100 * _ROW_BYTES),
    ],
    ids=["cache_over_host_table", "hybrid_rows"],
)
def test_replay_through_cache_and_hybrid_storage(storage):
    src = make_model(dims=(8, 8), **storage)
    dst = make_model(dims=(8, 8), **storage)
    train(dst, 3, seed=11, key_range=200)  # the replica's cache holds rows the delta will replace
    train(src, 6, key_range=200)
    replay_increment(dst, incremental_dump(src, OLDEST), ReplayContent.ALL)
    a, b = snapshot(src), snapshot(dst)
    for name in a:
        for k in a[name].keys():
            assert b[name].slots[k] == a[name].slots[k]
            assert torch.equal(a[name].rows[k], b[name].rows[k])
    # the replica serves the replayed rows, not what its cache held before
    keys = torch.tensor(a["model.ebc/t0"].keys()[:40], dtype=torch.int64)
    offsets = torch.tensor([0, keys.numel(), keys.numel()])
    src.eval()
    dst.eval()
    with torch.no_grad():
        assert torch.equal(src(keys, offsets), dst(keys, offsets))
