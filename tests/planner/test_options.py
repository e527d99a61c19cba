"""DynamicEmbTableOptions: every field checked at construction with a message naming it (issue 17),
equality / hashing by the seed's grouping key, score_strategy forms and the eval initializer (issue 15
item 9)."""

from __future__ import annotations

import pytest
import torch

from dynamicemb_core import (
    DynamicEmbCheckMode,
    DynamicEmbInitializerArgs,
    DynamicEmbInitializerMode,
    DynamicEmbScoreStrategy,
    DynamicEmbTableOptions,
    EvictedItemMode,
)
from dynamicemb_core.testing.dict_storage import PyDictStorage
from dynamicemb_core.types import StorageTableSpec

S = DynamicEmbScoreStrategy


@pytest.mark.parametrize(
    "field,value,error",
    [
        ("safe_check_mode", 7, ValueError),
        ("safe_check_mode", "bogus", ValueError),
        ("init_capacity", 100.5, TypeError),
        ("init_capacity", 0, ValueError),
        ("max_capacity", "10", TypeError),
        ("dim", -4, ValueError),
        ("dim", True, TypeError),
        ("global_hbm_for_values", -1, ValueError),
        ("local_hbm_for_values", -1024, ValueError),
        ("global_hbm_for_values", 1.5e9, TypeError),
        ("device_id", -1, ValueError),
        ("training", 1, TypeError),
        ("caching", "yes", TypeError),
        ("max_load_factor", 0.0, ValueError),
        ("max_load_factor", 1.5, ValueError),
        ("bucket_capacity", 100, ValueError),
        ("bucket_capacity", 128.0, TypeError),
        ("embedding_dtype", torch.int32, ValueError),
        ("index_type", torch.int32, ValueError),
        ("dist_type", "modulo", ValueError),
        ("evict_strategy", "lru", ValueError),
        ("evicted_item_mode", "retain_key", ValueError),
        ("score_strategy", "step", TypeError),
        ("score_strategy", 9, ValueError),
        ("score_strategy", (S.STEP, S.LFU), ValueError),
        ("external_storage", 3, TypeError),
        ("admit_strategy", object(), TypeError),
        ("admission_counter", 1.0, TypeError),
        ("external_storage_options", [], TypeError),
        ("initializer_args", "uniform", TypeError),
        ("initializer_args", DynamicEmbInitializerArgs(lower=1.0, upper=0.0), ValueError),
        ("initializer_args", DynamicEmbInitializerArgs(mode="normal"), ValueError),
        ("initializer_args", DynamicEmbInitializerArgs(std_dev=-1.0), ValueError),
    ],
)
def test_bad_field_is_refused_at_construction_naming_it(field, value, error) -> None:
    with pytest.raises(error, match=field):
        DynamicEmbTableOptions(**{field: value})


def test_valid_ints_become_enum_members() -> None:
    opts = DynamicEmbTableOptions(safe_check_mode=1, evicted_item_mode=1)
    assert opts.safe_check_mode is DynamicEmbCheckMode.WARNING
    assert opts.evicted_item_mode is EvictedItemMode.RETAIN_KEY


def test_eval_initializer_must_be_constant() -> None:
    with pytest.raises(ValueError, match="eval_initializer_args must use .*CONSTANT"):
        DynamicEmbTableOptions(
            eval_initializer_args=DynamicEmbInitializerArgs(mode=DynamicEmbInitializerMode.NORMAL)
        )
    opts = DynamicEmbTableOptions(
        eval_initializer_args=DynamicEmbInitializerArgs(
            mode=DynamicEmbInitializerMode.CONSTANT, value=0.5
        )
    )
    assert opts.eval_initializer_args.value == 0.5


def test_score_strategy_forms() -> None:
    assert DynamicEmbTableOptions(score_strategy=(S.STEP,)).score_strategy is S.STEP
    assert DynamicEmbTableOptions(score_strategy=[S.LFU]).score_strategy is S.LFU
    pair = DynamicEmbTableOptions(score_strategy=(S.LFU, S.TIMESTAMP))
    assert pair.score_strategy == (S.LFU, S.TIMESTAMP) and pair.num_scores == 2
    none = DynamicEmbTableOptions(score_strategy=None)  # the seed accepts it: the default applies
    assert none.score_strategy is None and none.score_strategies == (S.TIMESTAMP,)


def test_equality_and_hash_follow_the_grouping_key() -> None:
    a = DynamicEmbTableOptions(dim=4, max_capacity=64, global_hbm_for_values=10)
    b = DynamicEmbTableOptions(dim=16, max_capacity=1024, bucket_capacity=16)
    assert a == b and hash(a) == hash(b)  # sizes differ: one kernel group
    assert len({a, b}) == 1
    assert set(a.get_grouped_key()) >= {
        "training",
        "caching",
        "external_storage",
        "index_type",
        "dist_type",
        "score_strategy",
        "admit_strategy",
    }
    assert DynamicEmbTableOptions(score_strategy=(S.STEP,)) == DynamicEmbTableOptions(
        score_strategy=S.STEP
    )
    assert DynamicEmbTableOptions(score_strategy=None) == DynamicEmbTableOptions()
    for other in (
        DynamicEmbTableOptions(training=False),
        DynamicEmbTableOptions(caching=True),
        DynamicEmbTableOptions(dist_type="hash_roundrobin"),
        DynamicEmbTableOptions(score_strategy=S.LFU),
        DynamicEmbTableOptions(external_storage="dict"),
        DynamicEmbTableOptions(evicted_item_mode=EvictedItemMode.RETAIN_KEY),
        DynamicEmbTableOptions(embedding_dtype=torch.float16),
    ):
        assert other != a, other.get_grouped_key()
    assert DynamicEmbTableOptions(embedding_dtype=torch.float32) == DynamicEmbTableOptions()
    storage = PyDictStorage([StorageTableSpec(name="t", dim=4, row_width=4)], "cpu")
    assert DynamicEmbTableOptions(external_storage=storage) == DynamicEmbTableOptions(
        external_storage=storage
    )
    assert (a == "not options") is False


def test_evicted_item_mode_is_a_flag() -> None:
    # the replay PR's type: DISCARD is the empty flag, retention kinds combine with |
    import enum

    assert issubclass(EvictedItemMode, enum.Flag)
    assert not EvictedItemMode.DISCARD
    assert EvictedItemMode.DISCARD | EvictedItemMode.RETAIN_KEY is EvictedItemMode.RETAIN_KEY
    assert EvictedItemMode.RETAIN_KEY in EvictedItemMode.RETAIN_KEY
