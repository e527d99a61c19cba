"""Replay into a target filled by a load, whose buckets are packed (a dump keeps no holes).

The source erases keys (holes in its buckets), is dumped, loaded into a twin and into a served
collection, trains on (new keys fill the holes at the source's slots), and its delta is replayed
into both. Every key the source holds must read its row at the destination afterwards; none may be
lost because the load put it at another slot of its bucket than the source's (one process, no
sharding: the routing of shards is the gloo scenario's).
"""

from __future__ import annotations

import torch

from dynamicemb_core.checkpoint import (
    DynamicEmbDump,
    DynamicEmbLoad,
    erase,
    get_score,
    incremental_dump,
)
from dynamicemb_core.config import EvictedItemMode
from dynamicemb_core.testing import row_ledger as RL
from tests.checkpoint.helpers import make_model, train


def test_replay_after_load_keeps_every_key_the_source_holds(tmp_path) -> None:
    from torchrec.modules.embedding_configs import EmbeddingBagConfig

    from dynamicemb_core.inference import InferenceEmbeddingBagCollection
    from tests.checkpoint.helpers import table_options

    options = dict(dims=(4, 4), evicted_item_mode=EvictedItemMode.RETAIN_KEY)
    src = make_model(**options)
    train(src, 6, seed=0, key_range=400)
    erase(src, {"model.ebc": {t: torch.arange(0, 400, 3) for t in ("t0", "t1")}})  # holes
    DynamicEmbDump(str(tmp_path), src)
    twin = make_model(**options)
    DynamicEmbLoad(str(tmp_path), twin)
    configs = [
        EmbeddingBagConfig(name=t, embedding_dim=4, num_embeddings=400, feature_names=[t])
        for t in ("t0", "t1")
    ]
    served = InferenceEmbeddingBagCollection.from_dump(
        str(tmp_path), configs, {t: table_options(4) for t in ("t0", "t1")}
    )
    since = get_score(src)
    train(src, 4, seed=1, key_range=400)  # new keys take the holes' slots
    deltas = incremental_dump(src, since)
    now = RL.ledger_of_model(src)
    evicted = {
        ("model.ebc", t, int(k))
        for i, t in enumerate(deltas["model.ebc"].table_names)
        for k in deltas["model.ebc"].evicted_keys[i].tolist()
    }
    for name, read, apply in (
        ("replay_increment", lambda: RL.ledger_of_model(twin), lambda: RL.move_replay_increment(deltas, twin)),
        ("replay", lambda: RL.ledger_of_served(served), lambda: served.replay(deltas)),
    ):  # fmt: skip
        before = read()
        apply()
        after = read()
        gone = {k for k in before if k not in now and k in evicted}
        RL.check_moved(RL.ledger_of_delta(deltas), after, before, removed=gone, what=name)
        RL.check_moved(now, after, what=f"{name} (whole)")
