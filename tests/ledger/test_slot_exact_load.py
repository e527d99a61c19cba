"""Loads put every key back at its slot, so a delta that does not report evictions replays exactly.

The trainer (``EvictedItemMode.DISCARD``: its deltas carry no evicted keys) fills one bucket, erases a
key before the dump (a hole, which a packing load would close) and, within the next delta, takes the
hole with a new key, evicts its oldest key ``X`` for another new key and erases a key ``Y`` of the
same bucket. A twin loaded by ``DynamicEmbLoad`` and a served collection built by ``from_dump`` must
equal the trainer after the replay: every key reads the trainer's row, and ``X`` is gone.
"""

from __future__ import annotations

from typing import List

import pytest
import torch

from dynamicemb_core.checkpoint import (
    DynamicEmbDump,
    DynamicEmbLoad,
    erase,
    find_tables,
    get_score,
    incremental_dump,
)
from dynamicemb_core.config import DynamicEmbScoreStrategy, EvictedItemMode
from dynamicemb_core.table.hashing import buckets_of_tensor
from dynamicemb_core.testing import row_ledger as RL
from tests.checkpoint.helpers import make_model, table_options

COLLECTION = "model.ebc"
OPTIONS = dict(
    dims=(4, 4),
    evicted_item_mode=EvictedItemMode.DISCARD,
    score_strategy=DynamicEmbScoreStrategy.STEP,
)


def _one_bucket(n: int) -> List[int]:
    """``n`` keys of table t0's bucket 0 (capacity 256, buckets of 16)."""
    keys = torch.arange(5000, dtype=torch.int64)
    return keys[buckets_of_tensor(keys, 256 // 16) == 0][:n].tolist()


def _touch(model, keys: List[int]) -> None:
    """One training forward of ``keys`` in table t0 (one key a bag; t1's bags empty)."""
    b = len(keys)
    offsets = torch.cat([torch.arange(b + 1), torch.full((b,), b)]).to(torch.int64)
    model.train()
    model(torch.tensor(keys, dtype=torch.int64), offsets)


def _served(path: str, device: str = "cpu"):
    from torchrec.modules.embedding_configs import EmbeddingBagConfig

    from dynamicemb_core.inference import InferenceEmbeddingBagCollection

    configs = [
        EmbeddingBagConfig(name=t, embedding_dim=4, num_embeddings=5000, feature_names=[t])
        for t in ("t0", "t1")
    ]
    opts = {
        t: table_options(4, **{k: v for k, v in OPTIONS.items() if k != "dims"})
        for t in ("t0", "t1")
    }
    return InferenceEmbeddingBagCollection.from_dump(path, configs, opts, device)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_discard_replay_after_load_is_exact(tmp_path, device: str) -> None:
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    keys = _one_bucket(18)
    old, rest, new = keys[:2], keys[2:16], keys[16:]
    src = make_model(device=device, **OPTIONS)
    _touch(src, old)  # the oldest keys (STEP scores): X = old[1] is evicted later
    _touch(src, rest)  # the bucket is full
    erase(src, {COLLECTION: {"t0": torch.tensor(old[:1])}})  # a hole: a packing load closes it
    DynamicEmbDump(str(tmp_path), src, optim=True)
    twin = make_model(device=device, **OPTIONS)
    DynamicEmbLoad(str(tmp_path), twin, optim=True)
    served = _served(str(tmp_path), device)
    for h in find_tables(twin) + served.embeddings.handles(served.collection):
        assert h.table.packed_slots(h.table_id) is None, h.qualified_name

    since = get_score(src)
    _touch(src, new[:1])  # takes the hole
    _touch(src, new[1:])  # the bucket is full: evicts X, not reported (DISCARD)
    erase(src, {COLLECTION: {"t0": torch.tensor(rest[:1])}}, EvictedItemMode.RETAIN_KEY)  # Y
    deltas = incremental_dump(src, since)
    now = RL.ledger_of_model(src)
    x = (COLLECTION, "t0", old[1])
    assert x not in now and deltas[COLLECTION].evicted_keys[0] is None  # the case under test

    for name, read, apply in (
        ("replay_increment", lambda: RL.ledger_of_model(twin), lambda: RL.move_replay_increment(deltas, twin)),
        ("replay", lambda: RL.ledger_of_served(served), lambda: served.replay(deltas)),
    ):  # fmt: skip
        assert x in read(), name
        apply()
        RL.check_moved(now, read(), what=f"{name} (whole)")  # every key, nothing stale


def test_a_smaller_table_grows_to_the_source_layout_and_keeps_every_slot(tmp_path) -> None:
    """A target that starts smaller (init_capacity 64) reserves the source's 256 slots
    (max_capacity allows it) and takes every key at its dumped slot."""
    from tests.checkpoint.helpers import snapshot, train

    src = make_model(**OPTIONS)
    train(src, 6, seed=3, key_range=400)
    erase(src, {COLLECTION: {t: torch.arange(0, 400, 5) for t in ("t0", "t1")}})  # holes
    DynamicEmbDump(str(tmp_path), src, optim=True)
    dst = make_model(init_capacity=64, **OPTIONS)
    DynamicEmbLoad(str(tmp_path), dst, optim=True)
    want, got = snapshot(src), snapshot(dst)
    for name in want:
        assert got[name].slots == want[name].slots, name
    assert all(h.table.packed_slots(h.table_id) is None for h in find_tables(dst))


def test_a_file_whose_slots_break_its_layout_is_refused_before_writing(tmp_path) -> None:
    """A rewritten file (checksums and manifest recomputed) whose slot lies outside its key's
    home bucket is refused, naming the file and the key; the target is unchanged."""
    import dataclasses
    import glob
    import json
    import os

    from dynamicemb_core.checkpoint.errors import CheckpointCorruptError
    from dynamicemb_core.checkpoint.format import read_shard, read_shard_identity, write_shard
    from tests.checkpoint.helpers import train

    src = make_model(**OPTIONS)
    train(src, 2, seed=4)
    root = str(tmp_path)
    DynamicEmbDump(root, src)
    (path,) = glob.glob(os.path.join(root, COLLECTION, "t0.*"))
    header, payload = read_shard(path)
    slots = payload.slots.clone()
    slots[0] = (slots[0] + 16) % 256  # the next bucket
    write_shard(path, header, dataclasses.replace(payload, slots=slots))
    manifest = os.path.join(root, "MANIFEST.json")
    meta = json.load(open(manifest))
    for e in meta["files"]:
        if e["table"] == "t0":
            e.update(nbytes=os.path.getsize(path), crc32=read_shard_identity(path)[1])
    json.dump(meta, open(manifest, "w"))
    dst = make_model(**OPTIONS)
    train(dst, 1, seed=5)
    RL.check_refused(
        lambda: DynamicEmbLoad(root, dst),
        lambda: RL.ledger_of_model(dst),
        (CheckpointCorruptError,),
        match=(os.path.basename(path), f"key {int(payload.keys[0])}", "home bucket"),
        what="a file with a slot outside its bucket",
    )


def test_a_served_table_never_grows_past_its_buffers(tmp_path) -> None:
    """A NO_EVICTION trainer grows past max_capacity; a served collection's rows live in buffers
    sized when it is built, so its tables never grow: served at the planned max_capacity the dump
    is refused (before, the hash table grew under the buffers and rows were misaddressed); served
    at the trainer's grown capacity every key lands at its slot with its row."""
    import pytest

    from dynamicemb_core.checkpoint.errors import CheckpointMismatchError
    from dynamicemb_core.config import DynamicEmbScoreStrategy

    kw = dict(
        dims=(4, 4),
        score_strategy=DynamicEmbScoreStrategy.NO_EVICTION,
        max_capacity=16,
        init_capacity=16,
        bucket_capacity=16,
    )
    src = make_model(**kw)
    src(torch.arange(140), torch.tensor([0, 100, 140])).pow(2).sum().backward()
    DynamicEmbDump(str(tmp_path), src)
    grown = {h.name: int(h.table.capacity(h.table_id)) for h in find_tables(src)}
    assert grown["t0"] > 16

    def served(capacity):
        from torchrec.modules.embedding_configs import EmbeddingBagConfig

        from dynamicemb_core.inference import InferenceEmbeddingBagCollection

        configs = [
            EmbeddingBagConfig(name=t, embedding_dim=4, num_embeddings=200, feature_names=[t])
            for t in ("t0", "t1")
        ]
        opts = {k: v for k, v in kw.items() if k not in ("dims", "max_capacity", "init_capacity")}
        options = {
            t: table_options(4, max_capacity=capacity[t], init_capacity=capacity[t], **opts)
            for t in ("t0", "t1")
        }
        return InferenceEmbeddingBagCollection.from_dump(str(tmp_path), configs, options)

    with pytest.raises(CheckpointMismatchError, match="max_capacity of 16"):
        served({"t0": 16, "t1": 16})
    s = served(grown)
    RL.check_moved(RL.ledger_of_model(src), RL.ledger_of_served(s), what="from_dump (grown)")
    assert all(h.table.packed_slots(h.table_id) is None for h in s.embeddings.handles(s.collection))
