"""set_score as the seed has it (issue 15 item 10): STEP tables take a set step, a score of 0 is a
score, and names the model does not have are skipped with a warning rather than refused."""

from __future__ import annotations

import pytest

from dynamicemb_core.incremental_dump import get_score, set_score
from dynamicemb_core.types import DynamicEmbWarning
from tests.checkpoint.helpers import S, make_model, train


def test_step_table_takes_a_set_step_including_zero():
    model = make_model(score_strategy=S.STEP)
    set_score(model, 0)
    assert get_score(model) == {"model.ebc": {"t0": 0, "t1": 0}}
    set_score(model, {"model.ebc": {"t1": 40}})
    assert get_score(model) == {"model.ebc": {"t0": 0, "t1": 40}}
    train(model, 1, key_range=20)
    assert get_score(model) == {
        "model.ebc": {"t0": 1, "t1": 41}
    }  # the step advances from the set one


def test_customized_score_of_zero_is_set():
    model = make_model(score_strategy=S.CUSTOMIZED)
    set_score(model, 0)
    assert get_score(model) == {"model.ebc": {"t0": 0, "t1": 0}}


def test_unknown_names_are_skipped_with_a_warning_and_the_rest_is_set():
    model = make_model(score_strategy=S.CUSTOMIZED)
    with pytest.warns(DynamicEmbWarning, match=r"names table 'zz'.*skipped"):
        set_score(model, {"model.ebc": {"t0": 5, "zz": 6}})
    with pytest.warns(DynamicEmbWarning, match=r"names collection 'nope'.*skipped"):
        set_score(model, {"nope": {"t0": 9}, "model.ebc": {"t1": 7}})
    assert get_score(model) == {"model.ebc": {"t0": 5, "t1": 7}}
