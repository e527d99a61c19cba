"""NO_EVICTION scores: a key's insertion number, and incremental dumps that threshold on it.

The seed: "Strategies without a timestamp column (e.g. STEP, single LFU, NO_EVICTION) instead threshold
on the absolute score value: items whose score is not less than the threshold are dumped. This is not a
time-based increment." Here a NO_EVICTION key scores its table's insertion number (0, 1, 2, ... in the
order keys were first stored, as NVIDIA's numbers them), kept when the key is touched again, and
``get_score`` returns the next number: ``incremental_dump(model, get_score(model))`` taken later returns
the keys inserted since, not every key touched since (which a time-based dump would).
"""

from __future__ import annotations

from typing import List

import torch

from dynamicemb_core.checkpoint import DynamicEmbDump, DynamicEmbLoad
from dynamicemb_core.incremental_dump import get_score, incremental_dump
from dynamicemb_core.table import ScoredHashTable, TableSpec
from tests.checkpoint.helpers import S, make_model, snapshot


def _step(model, keys: List[List[int]]) -> None:
    """One training forward: ``keys[t]`` as one bag of table t's feature."""
    flat = [k for ks in keys for k in ks]
    offsets = torch.tensor([0] + [len(ks) for ks in keys], dtype=torch.int64).cumsum(0)
    model(torch.tensor(flat, dtype=torch.int64), offsets).pow(2).sum().backward()


def test_keys_score_their_insertion_number_and_touches_keep_it(device):
    table = ScoredHashTable(
        [TableSpec(name="a", score_strategy=S.NO_EVICTION, max_capacity=4096)], device
    )
    assert table.get_score(0) == 0
    first = torch.tensor([50, 7, 9, 7], device=device)  # 7 twice: one number
    res = table.find_or_insert(first)
    got = table.find(torch.tensor([50, 7, 9], device=device)).scores[:, 0].tolist()
    # numbered 0..2 in slot order within the call
    order = torch.argsort(res.slots[:3]).tolist()
    want = [0] * 3
    for number, i in enumerate(order):
        want[i] = number
    assert got == want
    assert table.get_score(0) == 3
    table.find_or_insert(torch.tensor([9, 11], device=device))  # 9 touched, 11 new
    table.find(torch.tensor([50], device=device), update_score=True)  # a touch
    scores = dict(
        zip(
            [50, 7, 9, 11],
            table.find(torch.tensor([50, 7, 9, 11], device=device)).scores[:, 0].tolist(),
        )
    )
    assert scores == {50: want[0], 7: want[1], 9: want[2], 11: 3}
    assert table.export(0, threshold=3).keys.tolist() == [11]
    # rows placed with given scores keep them; the next number passes the largest
    table.insert(torch.tensor([100], device=device), scores=torch.tensor([[41]], device=device))
    assert table.get_score(0) == 42
    table.find_or_insert(torch.tensor([101], device=device))
    assert table.find(torch.tensor([101], device=device)).scores[0, 0].item() == 42


def test_incremental_dump_returns_the_keys_inserted_since(device):
    model = make_model(score_strategy=S.NO_EVICTION, device=str(device))
    assert get_score(model) == {"model.ebc": {"t0": 0, "t1": 0}}
    old = [list(range(0, 30)), list(range(200, 210))]
    _step(model, old)
    since = get_score(model)
    assert since == {"model.ebc": {"t0": 30, "t1": 10}}
    assert all(d.keys[0].numel() == 0 for d in incremental_dump(model, since).values())
    new = [list(range(100, 105)), [300]]
    _step(model, [old[0] + new[0], old[1] + new[1]])  # the old keys trained again: not dumped
    delta = incremental_dump(model, since)["model.ebc"]
    for t, name in enumerate(("t0", "t1")):
        assert delta.table_names[t] == name
        assert sorted(delta.keys[t].tolist()) == new[t], name
        assert delta.meta[t]["current_score"] == since["model.ebc"][name] + len(new[t])
        scores = snapshot(model)[f"model.ebc/{name}"].scores
        numbers = sorted(v[0] for v in scores.values())
        assert numbers == list(range(len(old[t]) + len(new[t])))  # one number per key
        assert {scores[k][0] for k in new[t]} == set(
            range(since["model.ebc"][name], since["model.ebc"][name] + len(new[t]))
        )
    # a threshold of 0 dumps everything; one past the last number, nothing
    assert sorted(incremental_dump(model, 0)["model.ebc"].keys[0].tolist()) == old[0] + new[0]
    assert incremental_dump(model, 35)["model.ebc"].keys[0].numel() == 0


def test_numbers_survive_a_checkpoint(tmp_path, device):
    src = make_model(score_strategy=S.NO_EVICTION, device=str(device))
    _step(src, [list(range(20)), list(range(5))])
    _step(src, [list(range(10, 30)), [7]])
    DynamicEmbDump(str(tmp_path), src, optim=True)
    dst = make_model(score_strategy=S.NO_EVICTION, device=str(device))
    DynamicEmbLoad(str(tmp_path), dst, optim=True)
    assert get_score(dst) == get_score(src) == {"model.ebc": {"t0": 30, "t1": 6}}
    a, b = snapshot(src), snapshot(dst)
    for name in a:
        assert a[name].scores == b[name].scores, name
    for model in (src, dst):  # the next key gets the same number in both
        _step(model, [[500], [501]])
    assert (
        snapshot(src)["model.ebc/t0"].scores[500]
        == snapshot(dst)["model.ebc/t0"].scores[500]
        == (30,)
    )
