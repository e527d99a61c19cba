"""DynamicEmbDump / DynamicEmbLoad on one process: round trips, score columns, and refusal of bad input."""

from __future__ import annotations

import glob
import os

import pytest
import torch

from dynamicemb_core.checkpoint import (
    CheckpointCorruptError,
    CheckpointMismatchError,
    DynamicEmbDump,
    DynamicEmbLoad,
)
from dynamicemb_core.checkpoint.format import read_shard
from tests.checkpoint.helpers import S, hot_and_cold, make_model, snapshot, train


def _contents(model):
    return {name: (snap.rows, snap.scores) for name, snap in snapshot(model).items()}


@pytest.mark.parametrize(
    "optimizer", ["EXACT_ROWWISE_ADAGRAD", "EXACT_ADAGRAD", "ADAM", "EXACT_SGD"]
)
def test_dump_then_load_restores_rows_and_optimizer_state(tmp_path, optimizer):
    src = make_model(optimizer=optimizer, score_strategy=S.LFU)
    train(src, 6)
    DynamicEmbDump(str(tmp_path), src, optim=True)
    dst = make_model(optimizer=optimizer, score_strategy=S.LFU)
    DynamicEmbLoad(str(tmp_path), dst, optim=True)
    a, b = snapshot(src), snapshot(dst)
    assert a.keys() == b.keys()
    for name in a:
        assert a[name].keys() == b[name].keys() and len(a[name].keys()) > 0
        for k in a[name].keys():
            assert torch.equal(a[name].rows[k], b[name].rows[k]), (name, k)
            assert a[name].scores[k] == b[name].scores[k]  # LFU counts travel as they are


def test_load_without_optim_gives_new_keys_a_fresh_state(tmp_path):
    src = make_model(optimizer="EXACT_ROWWISE_ADAGRAD")
    train(src, 4)
    DynamicEmbDump(str(tmp_path), src, optim=False)
    dst = make_model(optimizer="EXACT_ROWWISE_ADAGRAD")
    DynamicEmbLoad(str(tmp_path), dst)
    a, b = snapshot(src), snapshot(dst)
    for name, dim in (("model.ebc/t0", 8), ("model.ebc/t1", 4)):
        for k in a[name].keys():
            assert torch.equal(a[name].rows[k][:dim], b[name].rows[k][:dim])
            assert float(b[name].rows[k][dim]) == 0.0  # initial_accumulator_value default
            assert float(a[name].rows[k][dim]) > 0.0  # the source's accumulator moved


def test_load_without_optim_keeps_state_of_keys_already_present(tmp_path):
    src = make_model()
    train(src, 3)
    DynamicEmbDump(str(tmp_path), src, optim=False)
    before = snapshot(src)
    DynamicEmbLoad(str(tmp_path), src)  # into itself: rows unchanged, accumulators kept
    after = snapshot(src)
    for name in before:
        for k in before[name].keys():
            assert torch.equal(before[name].rows[k], after[name].rows[k])


def test_timestamps_travel_as_ages(tmp_path):
    src = make_model(score_strategy=S.TIMESTAMP)
    train(src, 2, seed=1, key_range=50)
    train(src, 1, seed=2, key_range=10)  # keys < 10 touched last: youngest
    DynamicEmbDump(str(tmp_path), src)
    (path,) = glob.glob(os.path.join(str(tmp_path), "model.ebc", "t0.*"))
    header, payload = read_shard(path)
    assert header.score_columns == ("TIMESTAMP",)
    ages = dict(zip(payload.keys.tolist(), payload.scores[:, 0].tolist(), strict=True))
    assert all(age >= 0 for age in ages.values())
    src_scores = snapshot(src)["model.ebc/t0"].scores
    # age order is the reverse of timestamp order, exactly
    for a in list(ages)[:20]:
        for b in list(ages)[:20]:
            assert (ages[a] < ages[b]) == (src_scores[a][0] > src_scores[b][0])
    dst = make_model(score_strategy=S.TIMESTAMP)
    DynamicEmbLoad(str(tmp_path), dst)
    dst_scores = snapshot(dst)["model.ebc/t0"].scores
    diffs = {src_scores[k][0] - dst_scores[k][0] for k in src_scores}
    assert len(diffs) == 1  # every timestamp shifted by the same clock offset


@pytest.mark.parametrize("order", [(S.TIMESTAMP, S.LFU), (S.LFU, S.TIMESTAMP)])
def test_file_score_columns_follow_the_strategy_tuple(tmp_path, order):
    src = make_model(score_strategy=order)
    hot_and_cold(src)
    DynamicEmbDump(str(tmp_path), src)
    (path,) = glob.glob(os.path.join(str(tmp_path), "model.ebc", "t0.*"))
    header, payload = read_shard(path)
    assert header.score_columns == tuple(s.name for s in order)
    lfu = order.index(S.LFU)
    counts = dict(zip(payload.keys.tolist(), payload.scores[:, lfu].tolist(), strict=True))
    assert counts == {3: 5, 7: 1}


def test_load_into_reversed_score_order_is_refused(tmp_path):
    src = make_model(score_strategy=(S.TIMESTAMP, S.LFU))
    train(src, 2)
    DynamicEmbDump(str(tmp_path), src)
    dst = make_model(score_strategy=(S.LFU, S.TIMESTAMP))
    with pytest.raises(CheckpointMismatchError, match="score columns"):
        DynamicEmbLoad(str(tmp_path), dst)
    assert all(len(s.keys()) == 0 for s in snapshot(dst).values())


def _checkpoint_and_target(tmp_path):
    src = make_model()
    train(src, 3)
    DynamicEmbDump(str(tmp_path), src, optim=True)
    dst = make_model()
    train(dst, 2, seed=9)
    return dst, _contents(dst)


def _assert_unchanged(dst, before):
    after = _contents(dst)
    assert before.keys() == after.keys()
    for name in before:
        assert before[name][1] == after[name][1]
        assert before[name][0].keys() == after[name][0].keys()
        assert all(torch.equal(before[name][0][k], after[name][0][k]) for k in before[name][0])


def test_truncated_shard_is_refused_and_tables_untouched(tmp_path):
    dst, before = _checkpoint_and_target(tmp_path)
    (path,) = glob.glob(os.path.join(str(tmp_path), "model.ebc", "t1.*"))  # the second table's file
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) - 8)
    with pytest.raises(CheckpointCorruptError, match="truncated|manifest says"):
        DynamicEmbLoad(str(tmp_path), dst, optim=True)
    _assert_unchanged(dst, before)


def test_flipped_payload_byte_is_refused_and_tables_untouched(tmp_path):
    dst, before = _checkpoint_and_target(tmp_path)
    (path,) = glob.glob(os.path.join(str(tmp_path), "model.ebc", "t1.*"))
    data = bytearray(open(path, "rb").read())
    data[-3] ^= 0xFF  # inside the last section (scores)
    open(path, "wb").write(data)
    with pytest.raises(CheckpointCorruptError, match="checksum"):
        DynamicEmbLoad(str(tmp_path), dst, optim=True)
    _assert_unchanged(dst, before)


def test_other_dim_is_refused_and_tables_untouched(tmp_path):
    src = make_model(dims=(8, 4))
    train(src, 3)
    DynamicEmbDump(str(tmp_path), src)
    dst = make_model(dims=(8, 6))
    train(dst, 1)
    before = _contents(dst)
    with pytest.raises(CheckpointMismatchError, match="t1.*dim expected 6, file has 4"):
        DynamicEmbLoad(str(tmp_path), dst)
    _assert_unchanged(dst, before)


def test_other_optimizer_width_is_refused_with_optim(tmp_path):
    src = make_model(optimizer="EXACT_ROWWISE_ADAGRAD")
    train(src, 2)
    DynamicEmbDump(str(tmp_path), src, optim=True)
    dst = make_model(optimizer="ADAM")
    with pytest.raises(
        CheckpointMismatchError, match="optimizer state width expected 16, file has 1"
    ):
        DynamicEmbLoad(str(tmp_path), dst, optim=True)
    DynamicEmbLoad(str(tmp_path), dst, optim=False)  # embeddings alone fit


def test_incomplete_checkpoint_is_refused(tmp_path):
    src = make_model()
    train(src, 1)
    DynamicEmbDump(str(tmp_path), src)
    os.unlink(os.path.join(str(tmp_path), "MANIFEST.json"))  # as if the dump died before publishing
    with pytest.raises(CheckpointCorruptError, match="did not finish"):
        DynamicEmbLoad(str(tmp_path), make_model())


def test_redump_is_refused_unless_allow_overwrite(tmp_path):
    a = make_model(names=("t0", "t1"))
    train(a, 2)
    DynamicEmbDump(str(tmp_path), a)
    b = make_model(names=("u0", "u1"))
    train(b, 2, seed=3)
    with pytest.raises(FileExistsError, match="already holds a checkpoint.*allow_overwrite=True"):
        DynamicEmbDump(str(tmp_path), b)
    DynamicEmbLoad(str(tmp_path), make_model(names=("t0", "t1")))  # the first one is intact
    DynamicEmbDump(str(tmp_path), b, allow_overwrite=True)
    assert not glob.glob(os.path.join(str(tmp_path), "model.ebc", "t0.*"))  # stale shards removed
    with pytest.raises(CheckpointMismatchError, match="no table 'model.ebc/t0'"):
        DynamicEmbLoad(str(tmp_path), make_model(names=("t0", "t1")))


def test_table_names_select_a_subset(tmp_path):
    src = make_model()
    train(src, 2)
    DynamicEmbDump(str(tmp_path), src, table_names={"model.ebc": ["t1"]})
    dst = make_model()
    DynamicEmbLoad(str(tmp_path), dst, table_names={"model.ebc": ["t1"]})
    snap = snapshot(dst)
    assert (
        len(snap["model.ebc/t0"].keys()) == 0
        and snap["model.ebc/t1"].keys() == snapshot(src)["model.ebc/t1"].keys()
    )
    with pytest.raises(ValueError, match="no dynamic table \\['nope'\\]"):
        DynamicEmbDump(str(tmp_path), src, table_names={"model.ebc": ["nope"]})


def test_load_accepts_a_plain_list_of_table_names(tmp_path):
    src = make_model()
    train(src, 2)
    DynamicEmbDump(str(tmp_path), src)
    dst = make_model()
    DynamicEmbLoad(str(tmp_path), dst, table_names=["t0"])
    snap = snapshot(dst)
    assert (
        snap["model.ebc/t0"].keys() == snapshot(src)["model.ebc/t0"].keys()
        and not snap["model.ebc/t1"].keys()
    )
    with pytest.raises(ValueError, match="no dynamic table \\['zz'\\]"):
        DynamicEmbLoad(str(tmp_path), dst, table_names=["zz"])


def test_progress_bars_count_rows_on_request(tmp_path, capsys):
    src = make_model()
    train(src, 2)
    rows = sum(len(s.keys()) for s in snapshot(src).values())
    DynamicEmbDump(str(tmp_path), src, show_progress=True)
    err = capsys.readouterr().err
    assert "dump model.ebc/t0" in err and "dump model.ebc/t1" in err and "rows" in err
    DynamicEmbLoad(str(tmp_path), make_model(), show_progress=False)
    assert capsys.readouterr().err == ""
    assert rows > 0


def test_dump_refuses_a_folder_holding_other_files(tmp_path):
    src = make_model()
    train(src, 1)
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match=r"1 entries \(notes.txt\)"):
        DynamicEmbDump(str(tmp_path), src)
    assert sorted(os.listdir(tmp_path)) == ["notes.txt"]  # nothing written
    with pytest.raises(NotADirectoryError, match="not a folder"):
        DynamicEmbDump(str(tmp_path / "notes.txt"), src)
    with pytest.raises(TypeError, match="pass counter=.*by keyword"):
        DynamicEmbDump(str(tmp_path / "new"), src, None, True, True)  # upstream's positional order


def test_load_from_a_missing_path_says_so(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        DynamicEmbLoad(str(tmp_path / "nowhere"), make_model())


def _admission():
    from dynamicemb_core.admission import FrequencyAdmissionStrategy, KVCounter

    return dict(
        admit_strategy=FrequencyAdmissionStrategy(threshold=2),
        admission_counter=KVCounter(capacity=256, bucket_capacity=16),
    )


def _counts(model):
    from dynamicemb_core.checkpoint.state import counter_payload

    return [counter_payload(adm[1]).keys.tolist() for adm in model.ebc._admission]


def test_training_state_and_counters_are_checked_before_anything_is_written(tmp_path):
    src = make_model(optimizer="EXACT_SGD", **_admission())
    train(src, 3, key_range=40)
    plain, full = str(tmp_path / "plain"), str(tmp_path / "full")
    DynamicEmbDump(plain, src)  # neither optimizer state nor counters
    DynamicEmbDump(full, src, optim=True, counter=True)
    dst = make_model(optimizer="EXACT_SGD", **_admission())
    train(dst, 1, seed=5, key_range=40)
    before, step, counts = _contents(dst), dst.ebc.step, _counts(dst)
    assert any(counts)
    with pytest.raises(CheckpointMismatchError, match="dumped with optim=False"):
        DynamicEmbLoad(plain, dst, optim=True)
    with pytest.raises(CheckpointMismatchError, match="dumped without counter=True"):
        DynamicEmbLoad(plain, dst, counter=True)
    with pytest.raises(CheckpointMismatchError, match="no admit_strategy"):
        DynamicEmbLoad(full, make_model(optimizer="EXACT_SGD"), counter=True)
    (path,) = glob.glob(os.path.join(full, "model.ebc", "t1.*.counter.demb"))
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) - 8)
    with pytest.raises(CheckpointCorruptError, match="truncated|manifest says"):
        DynamicEmbLoad(full, dst, optim=True, counter=True)
    _assert_unchanged(dst, before)
    assert dst.ebc.step == step and _counts(dst) == counts


def test_optim_restores_step_and_hyper_parameters(tmp_path):
    src = make_model(optimizer="ADAM")
    train(src, 4)
    src.ebc.set_learning_rate(0.025)
    DynamicEmbDump(str(tmp_path), src, optim=True)
    dst = make_model(optimizer="ADAM")
    dst.ebc.set_learning_rate(0.5)
    DynamicEmbLoad(str(tmp_path), dst)  # without optim: rows only
    assert dst.ebc.step == 0 and dst.ebc.get_learning_rate() == 0.5
    DynamicEmbLoad(str(tmp_path), dst, optim=True)
    assert dst.ebc.step == 4 and dst.ebc.optimizer_args == src.ebc.optimizer_args


def test_empty_counters_and_tables_round_trip(tmp_path):
    src = make_model(optimizer="ADAM", **_admission())  # nothing trained: every section empty
    DynamicEmbDump(str(tmp_path), src, optim=True, counter=True)
    dst = make_model(optimizer="ADAM", **_admission())
    DynamicEmbLoad(str(tmp_path), dst, optim=True, counter=True)
    assert _counts(dst) == [[], []] and all(not s.keys() for s in snapshot(dst).values())
