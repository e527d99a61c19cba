"""A replay writes every key of its delta that the target's shards own, or refuses before writing.

A served collection of two shards per table (as ``from_dump`` builds for a 2-rank trainer) gets a
delta of that layout built by hand: keys of both shards at slots of their bucket. ``replay`` must
write every key (on main it wrote only the last shard's); a plan that holds only some of the
shards of a served table must be refused with nothing written.
"""

from __future__ import annotations

from typing import Any, Dict

import pytest
import torch

from dynamicemb_core.checkpoint.errors import IncompatibleDeltaError
from dynamicemb_core.checkpoint.layout import layout_meta
from dynamicemb_core.checkpoint.replay import plan_replay
from dynamicemb_core.checkpoint.types import DeltaDumpResult, ReplayContent
from dynamicemb_core.testing import row_ledger as RL

TABLES = ("a", "b")


def _served() -> Any:
    from torchrec.modules.embedding_configs import EmbeddingBagConfig

    from dynamicemb_core import DynamicEmbTableOptions
    from dynamicemb_core.inference import InferenceEmbeddingBagCollection

    configs = [
        EmbeddingBagConfig(name=t, embedding_dim=4, num_embeddings=100, feature_names=[t])
        for t in TABLES
    ]
    options = DynamicEmbTableOptions(bucket_capacity=16, max_capacity=64)
    return InferenceEmbeddingBagCollection(
        configs, {t: options for t in TABLES}, num_shards={t: 2 for t in TABLES}
    )


def _delta(served: Any) -> Dict[str, DeltaDumpResult]:
    """Keys 0..39 of each table at the slots a scratch collection of the same layout gives them."""
    from dynamicemb_core.checkpoint.ownership import owned_mask

    scratch = _served()
    delta = DeltaDumpResult()
    gen = torch.Generator().manual_seed(0)
    for t in TABLES:
        keys, slots = [], []
        handles = [h for h in scratch.embeddings.handles(served.collection) if h.name == t]
        for h in handles:
            mine = torch.arange(40)[owned_mask(torch.arange(40), h)]
            keys.append(mine)
            slots.append(h.table.insert(mine, h.table_id))
        n = sum(k.numel() for k in keys)
        meta = layout_meta(handles[0])
        meta["current_score"] = 0
        meta["slot_index"] = torch.cat(slots)
        delta.table_names.append(t)
        delta.keys.append(torch.cat(keys))
        delta.values.append(torch.randn(n, 4, generator=gen))
        delta.optimizer_states.append(torch.empty(n, 0))
        delta.scores.append(torch.zeros(n, 1, dtype=torch.int64))
        delta.evicted_keys.append(None)
        delta.erased_keys.append(torch.empty(0, dtype=torch.int64))
        delta.meta.append(meta)
    return {served.collection: delta}


def test_replay_writes_every_shard_of_every_table() -> None:
    served = _served()
    deltas = _delta(served)
    before = RL.ledger_of_served(served)
    served.replay(deltas)
    RL.check_moved(RL.ledger_of_delta(deltas), RL.ledger_of_served(served), before)


def test_a_plan_missing_a_shard_of_a_served_table_is_refused() -> None:
    served = _served()
    deltas = _delta(served)
    shard0 = [h for h in served.embeddings.handles(served.collection) if h.rank == 0]
    with pytest.raises(IncompatibleDeltaError, match=r"only shards \[0\] of 2 are here"):
        plan_replay(shard0, deltas, ReplayContent.EMBEDDING_ONLY, every_shard=True)
    # a trainer's rank holds one shard: it plans exactly the keys that shard owns
    jobs = plan_replay(shard0, deltas, ReplayContent.EMBEDDING_ONLY)
    assert [j.keys.numel() for j in jobs] == [20, 20]
    assert not RL.ledger_of_served(served)  # nothing was written
