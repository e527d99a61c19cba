"""Checkpoints of half-precision tables: the files carry the embeddings in the table's dtype and the
optimizer state in float32 (header ``dtype`` / ``state_dtype``); a load restores them bit for bit;
a file of another embedding dtype is refused before anything is written."""

from __future__ import annotations

import glob
import os

import pytest
import torch

from dynamicemb_core.checkpoint import CheckpointMismatchError, DynamicEmbDump, DynamicEmbLoad
from dynamicemb_core.checkpoint.format import read_shard
from tests.checkpoint.helpers import assert_same_rows_by_key, make_model, snapshot, train

HALF = [torch.float16, torch.bfloat16]


def _files(path: str):
    return [read_shard(f) for f in sorted(glob.glob(os.path.join(path, "**", "*.*"), recursive=True))
            if os.path.isfile(f) and not f.endswith(".json")]  # fmt: skip


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize(
    "optimizer", ["EXACT_ROWWISE_ADAGRAD", "EXACT_ADAGRAD", "ADAM", "EXACT_SGD"]
)
def test_dump_writes_the_row_dtype_and_load_restores_bit_for_bit(tmp_path, dtype, optimizer):
    src = make_model(optimizer=optimizer, embedding_dtype=dtype)
    train(src, 4)
    DynamicEmbDump(str(tmp_path), src, optim=True)
    before = snapshot(src)
    shards = [(h, p) for h, p in _files(str(tmp_path)) if h.num_rows > 0]
    assert shards, "no table rows were dumped"
    for header, payload in shards:
        assert header.dtype == dtype and payload.embeddings.dtype == dtype
        if optimizer != "EXACT_SGD":
            assert header.states_dtype == torch.float32
            assert payload.optimizer_states.dtype == torch.float32
        # The file's embeddings are the stored ones (no rounding on the way out).
        rows = before[f"model.ebc/{header.table_name}"].rows
        for key, emb in zip(payload.keys.tolist(), payload.embeddings):
            assert torch.equal(emb.float(), rows[key][: header.dim])
    dst = make_model(optimizer=optimizer, embedding_dtype=dtype)
    DynamicEmbLoad(str(tmp_path), dst, optim=True)
    after = snapshot(dst)
    for name in before:
        assert before[name].keys() == after[name].keys() and before[name].keys()
        for k in before[name].keys():
            assert torch.equal(before[name].rows[k], after[name].rows[k]), (name, k)


def test_resumed_half_precision_training_equals_an_uninterrupted_run(tmp_path):
    """Train 3, dump, load into a fresh model, train 3 == train 6 (Adam: state and step restored)."""
    kw = dict(optimizer="ADAM", embedding_dtype=torch.float16)
    whole = make_model(**kw)
    torch.manual_seed(5)
    train(whole, 3, seed=1)
    train(whole, 3, seed=2)
    part = make_model(**kw)
    torch.manual_seed(5)
    train(part, 3, seed=1)
    DynamicEmbDump(str(tmp_path), part, optim=True)
    resumed = make_model(**kw)
    DynamicEmbLoad(str(tmp_path), resumed, optim=True)
    train(resumed, 3, seed=2)
    assert_same_rows_by_key(snapshot(whole), snapshot(resumed))


@pytest.mark.parametrize(
    "dumped,loaded",
    [(torch.float32, torch.float16), (torch.float32, torch.bfloat16), (torch.bfloat16, torch.float16),
     (torch.float16, torch.bfloat16)],
    ids=str,
)  # fmt: skip
def test_a_narrowing_load_is_refused_untouched(tmp_path, dumped, loaded):
    """A load that would round the file's embeddings is refused before anything is written."""
    src = make_model(embedding_dtype=dumped)
    train(src, 2)
    DynamicEmbDump(str(tmp_path), src)
    dst = make_model(embedding_dtype=loaded)
    train(dst, 1, seed=3)
    before = snapshot(dst)
    with pytest.raises(
        CheckpointMismatchError, match=f"dtype expected {loaded}, file has {dumped}"
    ):
        DynamicEmbLoad(str(tmp_path), dst)
    after = snapshot(dst)
    for name in before:
        assert before[name].keys() == after[name].keys()
        assert all(
            torch.equal(before[name].rows[k], after[name].rows[k]) for k in before[name].keys()
        )


@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_a_half_precision_dump_loads_into_a_float32_table_exactly(tmp_path, dtype):
    src = make_model(optimizer="EXACT_ADAGRAD", embedding_dtype=dtype)
    train(src, 3)
    DynamicEmbDump(str(tmp_path), src, optim=True)
    dst = make_model(optimizer="EXACT_ADAGRAD")
    DynamicEmbLoad(str(tmp_path), dst, optim=True)
    a, b = snapshot(src), snapshot(dst)
    for name in a:
        assert a[name].keys() == b[name].keys() and a[name].keys()
        for k in a[name].keys():
            assert torch.equal(a[name].rows[k], b[name].rows[k]), (name, k)


def test_resumed_stochastic_rounding_equals_an_uninterrupted_run(tmp_path):
    """With stochastic rounding, a resumed run rounds as the uninterrupted one: the dump keeps the
    rounding seed beside the step (both key the random bits), and the load restores it into a
    module that rounds stochastically with another seed; a module that rounds to nearest stays so."""
    kw = dict(optimizer="EXACT_SGD", embedding_dtype=torch.float16)

    def stochastic(seed: int):
        model = make_model(**kw)
        model.ebc.stochastic_rounding_seed = seed
        return model

    whole = stochastic(123)
    torch.manual_seed(5)  # the new rows' initializer
    train(whole, 3, seed=1)
    train(whole, 3, seed=2)
    part = stochastic(123)
    torch.manual_seed(5)
    train(part, 3, seed=1)
    DynamicEmbDump(str(tmp_path), part, optim=True)
    resumed = stochastic(456)
    DynamicEmbLoad(str(tmp_path), resumed, optim=True)
    assert resumed.ebc.stochastic_rounding_seed == 123
    train(resumed, 3, seed=2)
    a = snapshot(whole)
    assert_same_rows_by_key(a, snapshot(resumed))
    nearest = make_model(**kw)
    DynamicEmbLoad(str(tmp_path), nearest, optim=True)
    assert nearest.ebc.stochastic_rounding_seed is None
    # and the seed matters: another one gives other rows
    other = stochastic(456)
    torch.manual_seed(5)
    train(other, 3, seed=1)
    train(other, 3, seed=2)
    c = snapshot(other)
    assert any(not torch.equal(a[n].rows[k], c[n].rows[k]) for n in a for k in a[n].keys())
