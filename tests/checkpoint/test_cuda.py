"""The checkpoint paths on a CUDA table (run on the GPU machine with ``pytest -m gpu``).

The CPU suite covers every rule; these repeat the end-to-end properties on the device: replay leaves the
target layout-identical through evictions, a dump loads back bit for bit, and timestamps (read from
the device clock) keep their order through the age encoding.
"""

from __future__ import annotations

import pytest
import torch

from dynamicemb_core.checkpoint import DynamicEmbDump, DynamicEmbLoad
from dynamicemb_core.incremental_dump import (
    ReplayContent,
    get_score,
    incremental_dump,
    replay_increment,
)
from tests.checkpoint.helpers import EVICTING, S, assert_same_tables, make_model, snapshot, train

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available(), reason="needs a CUDA device (CPU runs test_replay.py)"
    ),
]


def test_replay_layout_identical_on_cuda():
    src, dst = make_model(device="cuda", **EVICTING), make_model(device="cuda", **EVICTING)
    threshold = -(2**63)
    for round_ in range(3):
        train(src, 5, seed=round_, key_range=300)
        deltas = incremental_dump(src, threshold)
        threshold = get_score(src)["model.ebc"]["t0"]
        replay_increment(dst, deltas, ReplayContent.ALL)
        assert_same_tables(snapshot(src), snapshot(dst))


def test_dump_load_roundtrip_on_cuda(tmp_path):
    src = make_model(device="cuda", score_strategy=S.LFU)
    train(src, 5)
    DynamicEmbDump(str(tmp_path), src, optim=True)
    dst = make_model(device="cuda", score_strategy=S.LFU)
    DynamicEmbLoad(str(tmp_path), dst, optim=True)
    a, b = snapshot(src), snapshot(dst)
    for name in a:
        assert a[name].keys() == b[name].keys() and a[name].keys()
        for k in a[name].keys():
            assert torch.equal(a[name].rows[k], b[name].rows[k])
            assert a[name].scores[k] == b[name].scores[k]


def test_timestamp_order_survives_replay_on_cuda():
    src = make_model(device="cuda")
    train(src, 2, seed=1, key_range=50)
    train(src, 1, seed=2, key_range=10)
    dst = make_model(device="cuda")
    replay_increment(dst, incremental_dump(src, -(2**63)), ReplayContent.SCORE)
    s, d = snapshot(src)["model.ebc/t0"].scores, snapshot(dst)["model.ebc/t0"].scores
    assert len({s[k][0] - d[k][0] for k in s}) == 1  # every timestamp shifted by one offset


def test_room_is_checked_and_planned_on_cuda(tmp_path):
    """check_room hashes keys on the table's device: 17 keys of one home bucket are refused by a
    256-slot table that may not grow and land whole in one that may (issue 28 item 3)."""
    from dynamicemb_core.checkpoint import CheckpointMismatchError
    from dynamicemb_core.table.hashing import buckets_of_tensor

    cand = torch.arange(1, 20000, dtype=torch.int64)
    crowd = cand[buckets_of_tensor(cand, 16) == 0][:17]
    src = make_model(device="cuda", max_capacity=4096, init_capacity=4096)
    src(crowd, torch.tensor([0, 17, 17])).sum().backward()
    DynamicEmbDump(str(tmp_path), src)
    small = make_model(device="cuda")
    with pytest.raises(CheckpointMismatchError, match="1 keys would find no free slot"):
        DynamicEmbLoad(str(tmp_path), small)
    assert all(not s.keys() for s in snapshot(small).values())
    grows = make_model(device="cuda", max_capacity=512)
    assert DynamicEmbLoad(str(tmp_path), grows)["model.ebc/t0"] == (17, 0)
    assert snapshot(grows)["model.ebc/t0"].keys() == sorted(crowd.tolist())
