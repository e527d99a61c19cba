"""Inference collections against the trained module's eval forward, bit for bit.

Oracle: the ``BatchedDynamicEmbeddingTables`` the tables were trained in, in eval mode, on the same
batch (including keys it never saw: they read the eval initializer, and are not inserted).
"""

from __future__ import annotations

import pytest
import torch

from dynamicemb_core.checkpoint import CheckpointMismatchError, DynamicEmbDump
from dynamicemb_core.config import (
    DynamicEmbInitializerArgs,
    DynamicEmbInitializerMode,
    DynamicEmbPoolingMode,
)
from dynamicemb_core.inference import InferenceEmbeddingBagCollection, InferenceEmbeddingCollection
from tests.inference import helpers as H

P = DynamicEmbPoolingMode


@pytest.mark.parametrize("pooling", [P.SUM, P.MEAN])
def test_from_model_matches_eval_forward(device: torch.device, pooling: P) -> None:
    trained = H.trained_tables(pooling, device=device)
    served = InferenceEmbeddingBagCollection.from_model(trained)
    before = served.embeddings.table_sizes()
    for step, batch_size in ((100, 16), (101, 5), (102, 1)):
        indices, offsets, weights = H.batch(step, batch_size, 600, device)  # half the keys unseen
        assert torch.equal(served.lookup(indices, offsets), H.reference(trained, indices, offsets))
        if pooling is P.SUM:
            got = served.lookup(indices, offsets, weights)
            assert torch.equal(got, H.reference(trained, indices, offsets, weights))
    assert served.embeddings.table_sizes() == before  # lookups never insert


def test_sequence_collection_matches_eval_forward(device: torch.device) -> None:
    trained = H.trained_tables(P.NONE, dims=(8, 8, 8), device=device)
    served = InferenceEmbeddingCollection.from_model(trained)
    indices, offsets, _ = H.batch(200, 9, 600, device)
    assert torch.equal(served.lookup(indices, offsets), H.reference(trained, indices, offsets))


def test_missing_keys_read_the_eval_initializer(device: torch.device) -> None:
    init = DynamicEmbInitializerArgs(mode=DynamicEmbInitializerMode.CONSTANT, value=0.25)
    trained = H.trained_tables(P.SUM, device=device, eval_initializer_args=init)
    served = InferenceEmbeddingBagCollection.from_model(trained)
    before = served.embeddings.table_sizes()
    unseen = torch.arange(10_000, 10_008, device=device)
    offsets = torch.arange(0, 9, device=device)  # 4 features x 2 samples, one id each
    got = served.lookup(unseen, offsets)
    assert torch.equal(got, H.reference(trained, unseen, offsets))
    assert bool((got == 0.25).all())
    assert served.embeddings.table_sizes() == before


def test_kjt_forward_matches_lookup() -> None:
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    trained = H.trained_tables(P.SUM)
    served = InferenceEmbeddingBagCollection.from_model(trained)
    indices, offsets, _ = H.batch(300, 6, 400)
    kjt = KeyedJaggedTensor.from_offsets_sync(
        keys=served.feature_names, values=indices, offsets=offsets
    )
    out = served(kjt)
    assert out.keys() == served.feature_names
    assert torch.equal(out.values(), H.reference(trained, indices, offsets))
    # a KJT with its features in another order is permuted, not misread
    order = [3, 1, 0, 2]
    idx2, off2 = H.reorder(indices, offsets, order, 6)
    shuffled = KeyedJaggedTensor.from_offsets_sync(
        keys=[served.feature_names[f] for f in order], values=idx2, offsets=off2
    )
    assert torch.equal(served(shuffled).values(), out.values())


@pytest.mark.parametrize(
    ("world_size", "dist_type"), [(1, "roundrobin"), (2, "roundrobin"), (3, "hash_roundrobin")]
)
def test_from_dump_of_any_world_size(tmp_path, world_size: int, dist_type: str) -> None:
    trained = H.trained_tables(P.SUM, steps=6, dist_type=dist_type)
    path = str(tmp_path / "dump")
    if world_size == 1:
        DynamicEmbDump(path, trained)
    else:
        H.write_sharded_dump(path, trained, world_size, dist_type)
    served = InferenceEmbeddingBagCollection.from_dump(
        path, H.configs(), H.options_by_name(trained)
    )
    assert served.embeddings.table_sizes() == {s["name"]: s["size"] for s in trained.table_stats()}
    assert all(t.num_shards == world_size for t in served.embeddings.tables)
    batch_size = 12
    indices, offsets, weights = H.batch(400, batch_size, 600)
    want = H.in_config_order(H.reference(trained, indices, offsets, weights), H.DIMS, batch_size)
    idx2, off2 = H.reorder(indices, offsets, H.feature_order(), batch_size)
    _, _, w_all = H.batch(400, batch_size, 600)
    w2, _ = H.reorder(w_all, offsets, H.feature_order(), batch_size)
    assert torch.equal(served.lookup(idx2, off2, w2), want)


def test_from_dump_refuses_a_table_of_another_dim(tmp_path) -> None:
    trained = H.trained_tables(P.SUM)
    DynamicEmbDump(str(tmp_path), trained)
    wrong = H.configs(dims=(8, 6, 8))
    opts = H.options_by_name(trained)
    opts["item"] = H.options(6)
    with pytest.raises(CheckpointMismatchError, match="dim expected 6, file has 4"):
        InferenceEmbeddingBagCollection.from_dump(str(tmp_path), wrong, opts)
    missing = H.configs() + [H.DuckConfig("clicks", 8, ["clicks"])]
    opts["clicks"] = H.options(8)
    with pytest.raises(ValueError, match="has no table \\['clicks'\\]"):
        InferenceEmbeddingBagCollection.from_dump(
            str(tmp_path), missing, dict(opts, item=H.options(4))
        )


def test_from_dump_refuses_to_drop_keys(tmp_path) -> None:
    trained = H.trained_tables(P.SUM, steps=6)
    DynamicEmbDump(str(tmp_path), trained)
    tiny = {"user": 32, "item": 32, "ad": 32}  # one bucket each: most keys find no slot
    with pytest.raises(ValueError, match="do not fit its max_capacity of 32 slots"):
        InferenceEmbeddingBagCollection.from_dump(
            str(tmp_path), H.configs(), H.options_by_name(trained), shard_capacity=tiny
        )
    # from two writer ranks, the second file's keys can evict the first's: counted, refused too
    H.write_sharded_dump(str(tmp_path / "two"), trained, 2, "roundrobin")
    with pytest.raises(ValueError, match="do not fit its max_capacity of 32 slots"):
        InferenceEmbeddingBagCollection.from_dump(
            str(tmp_path / "two"), H.configs(), H.options_by_name(trained), shard_capacity=tiny
        )


def test_replay_of_another_layout_writes_nothing() -> None:
    from dynamicemb_core.checkpoint import IncompatibleDeltaError, get_score, incremental_dump

    trained = H.trained_tables(P.SUM)
    served = InferenceEmbeddingBagCollection(
        H.configs(), H.options_by_name(trained, max_capacity=1024, init_capacity=1024)
    )
    threshold = get_score(trained)
    H.train(trained, range(60, 62))
    delta = incremental_dump(trained, threshold)
    with pytest.raises(IncompatibleDeltaError, match="current_capacity expected 1024"):
        served.replay(delta)
    assert served.embeddings.table_sizes() == {"user": 0, "item": 0, "ad": 0}


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_half_precision_tables_serve_their_stored_values(tmp_path, device, dtype) -> None:
    """Serving keeps float32 rows: a half-precision table's embeddings widen exactly, from the
    trained module or from its dump (whose embeddings are in the table's dtype)."""
    trained = H.trained_tables(P.SUM, device=device, embedding_dtype=dtype)
    assert trained.tables[0].group.rows.values.dtype == dtype
    served = InferenceEmbeddingBagCollection.from_model(trained)
    indices, offsets, weights = H.batch(300, 16, 600, device)
    assert torch.equal(served.lookup(indices, offsets), H.reference(trained, indices, offsets))
    if torch.device(device).type != "cpu":
        return
    path = str(tmp_path / "dump")
    DynamicEmbDump(path, trained)
    loaded = InferenceEmbeddingBagCollection.from_dump(
        path, H.configs(), H.options_by_name(trained)
    )
    batch_size = 12
    indices, offsets, weights = H.batch(400, batch_size, 600)
    want = H.in_config_order(H.reference(trained, indices, offsets, weights), H.DIMS, batch_size)
    idx2, off2 = H.reorder(indices, offsets, H.feature_order(), batch_size)
    w2, _ = H.reorder(weights, offsets, H.feature_order(), batch_size)
    assert torch.equal(loaded.lookup(idx2, off2, w2), want)
