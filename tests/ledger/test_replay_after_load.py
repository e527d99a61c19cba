"""Replay into a target filled by a load (a dump keeps no holes, the file records each key's slot).

The source erases keys (holes in its buckets), is dumped, loaded into a twin and into a served
collection (slot for slot), and into a twin that already held some of the dump's keys at other
slots (the load packs it: ``packed_slots`` says why), trains on (new keys fill the holes at the
source's slots), and its delta (``EvictedItemMode.RETAIN_KEY``: evictions reported) is replayed
into all three. Every key the source holds must read its row at the destination afterwards; none
may be lost because the load put it at another slot of its bucket than the source's (one process,
no sharding: the routing of shards is the gloo scenario's). The DISCARD case is
test_slot_exact_load.py's.
"""

from __future__ import annotations

import torch

from dynamicemb_core.checkpoint import (
    DynamicEmbDump,
    DynamicEmbLoad,
    erase,
    find_tables,
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
    packed = make_model(**options)
    held = [k for (_, t, k) in RL.ledger_of_model(src) if t == "t0"][:60][::-1]
    n = len(held)  # one key a bag in t0, in the reverse of the dump's order; t1's bags empty
    packed(torch.tensor(held), torch.cat([torch.arange(n + 1), torch.full((n,), n)]))
    DynamicEmbLoad(str(tmp_path), packed)
    (t0,) = [h for h in find_tables(packed) if h.name == "t0"]
    assert t0.table.packed_slots(t0.table_id), "the load was meant to pack this twin"
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
        ("replay_increment (packed)", lambda: RL.ledger_of_model(packed), lambda: RL.move_replay_increment(deltas, packed)),
        ("replay", lambda: RL.ledger_of_served(served), lambda: served.replay(deltas)),
    ):  # fmt: skip
        before = read()
        apply()
        after = read()
        gone = {k for k in before if k not in now and k in evicted}
        RL.check_moved(RL.ledger_of_delta(deltas), after, before, removed=gone, what=name)
        RL.check_moved(now, after, what=f"{name} (whole)")
