"""get_score / set_score and pop_evicted_keys / erase on one process."""

from __future__ import annotations

import pytest
import torch

from dynamicemb_core import pop_evicted_keys
from dynamicemb_core.config import EvictedItemMode
from dynamicemb_core.incremental_dump import erase, get_score, incremental_dump, set_score
from dynamicemb_core.types import DynamicEmbWarning
from tests.checkpoint.helpers import EVICTING, RETAIN, S, make_model, snapshot, train


def test_get_score_per_strategy():
    assert get_score(torch.nn.Linear(2, 2)) is None
    step = make_model(score_strategy=S.STEP)
    assert get_score(step) == {"model.ebc": {"t0": 1, "t1": 1}}  # the seed: the step starts at 1
    train(step, 2, key_range=50)
    assert get_score(step) == {"model.ebc": {"t0": 3, "t1": 3}}  # one per training forward
    step.eval()
    step(torch.tensor([1, 2], dtype=torch.int64), torch.tensor([0, 1, 2]))
    assert get_score(step) == {"model.ebc": {"t0": 3, "t1": 3}}  # an eval forward does not count
    clock = make_model(score_strategy=S.TIMESTAMP)
    a = get_score(clock)["model.ebc"]["t0"]
    b = get_score(clock)["model.ebc"]["t0"]
    assert b >= a > 0


def test_set_score_drives_customized_scores_and_thresholds():
    model = make_model(score_strategy=S.CUSTOMIZED)
    set_score(model, 10)
    train(model, 2, seed=0, key_range=50)
    set_score(model, {"model.ebc": {"t0": 20, "t1": 20}})
    keys = torch.tensor([900, 901], dtype=torch.int64)
    model(keys, torch.tensor([0, 2, 2])).sum().backward()
    assert get_score(model) == {"model.ebc": {"t0": 20, "t1": 20}}
    scores = snapshot(model)["model.ebc/t0"].scores
    assert {scores[900][0], scores[901][0]} == {20}
    assert {v[0] for k, v in scores.items() if k < 50} == {10}
    d = incremental_dump(model, 20)["model.ebc"]
    assert sorted(d.keys[0].tolist()) == [900, 901]
    with pytest.warns(DynamicEmbWarning, match="goes down"):
        set_score(model, 5)


def test_set_score_rejects_bad_input_before_setting_anything():
    model = make_model(score_strategy=S.CUSTOMIZED)
    set_score(model, 7)
    with pytest.raises(TypeError, match=r"table_score\['model.ebc'\]\['t1'\] must be an int"):
        set_score(model, {"model.ebc": {"t0": 8, "t1": 8.5}})
    assert get_score(model) == {"model.ebc": {"t0": 7, "t1": 7}}  # t0 not set either
    with pytest.raises(ValueError, match="CUSTOMIZED and STEP"):
        set_score(make_model(score_strategy=S.LFU), {"model.ebc": {"t0": 1}})
    with pytest.raises(ValueError, match="no CUSTOMIZED or STEP"):
        set_score(make_model(score_strategy=S.TIMESTAMP), 3)


def test_pop_evicted_keys_reads_clears_and_omits_discard_tables():
    model = make_model(evicted_item_mode=RETAIN, **EVICTING)
    model.ebc.table_options[1].evicted_item_mode = EvictedItemMode.DISCARD  # t1 reports nothing
    train(model, 8, key_range=400)
    popped = pop_evicted_keys(model)
    assert list(popped) == ["model.ebc"] and list(popped["model.ebc"]) == ["t0"]
    keys = popped["model.ebc"]["t0"]
    assert keys.numel() > 0 and torch.equal(keys, torch.unique(keys))
    assert pop_evicted_keys(model)["model.ebc"]["t0"].numel() == 0  # read and clear
    assert pop_evicted_keys(make_model()) == {}


def test_erase_validates_keys_and_reports_what_was_present():
    model = make_model()
    train(model, 2, key_range=30)
    present = snapshot(model)["model.ebc/t1"].keys()
    with pytest.raises(TypeError, match="keys must be a 1-D int64"):
        erase(model, {"model.ebc": {"t1": torch.tensor([1.0])}})
    gone = erase(model, {"model.ebc": {"t1": torch.tensor([present[0], 10**9])}})
    assert gone["model.ebc"]["t1"].tolist() == [present[0]]
    assert present[0] not in snapshot(model)["model.ebc/t1"].keys()


def test_set_score_reaches_a_device_cache_and_the_table_behind_it():
    """A cached table's cache and host table score the same keys: one set score for both."""
    model = make_model(score_strategy=S.CUSTOMIZED, caching=True, local_hbm_for_values=4096)
    set_score(model, 10)
    train(model, 3, key_range=200)  # more keys than the cache holds: some spill to the host table
    keys = set(incremental_dump(model, 0)["model.ebc"].keys[0].tolist())
    assert keys and set(incremental_dump(model, 10)["model.ebc"].keys[0].tolist()) == keys
    assert incremental_dump(model, 11)["model.ebc"].keys[0].numel() == 0
