"""A ``score_function`` given by its registered name ranks the training table's victims exactly as
the function itself does: names resolve in the batched tables module, where admission strategies
and counters resolve (issue 30), and the table takes functions only."""

from __future__ import annotations

import types
from typing import Any, Iterator, Sequence

import pytest
import torch
from fbgemm_gpu.split_embedding_configs import EmbOptimType

from dynamicemb_core.config import (
    DynamicEmbPoolingMode,
    DynamicEmbScoreStrategy,
    DynamicEmbTableOptions,
)
from dynamicemb_core.lookup import BatchedDynamicEmbeddingTables
from dynamicemb_core.plugins import hookimpl, register_plugin, unregister_plugin
from dynamicemb_core.table import TableSpec

NAME = "test_evict_frequent"


def evict_frequent(scores: Sequence[int], cur_timestamp: int) -> float:
    """Lower for higher counts (``scores`` is ``(timestamp, count)``): evicts the most frequent key."""
    return -1.0 * scores[1]


@pytest.fixture
def registered() -> Iterator[None]:
    plugin = types.SimpleNamespace()

    @hookimpl
    def dynamicemb_register_score_functions(register: Any) -> None:
        register(NAME, lambda strategies, **_: evict_frequent, description="test")

    plugin.dynamicemb_register_score_functions = dynamicemb_register_score_functions
    register_plugin(plugin, NAME)
    try:
        yield
    finally:
        unregister_plugin(NAME)


def _options(score_function: Any) -> DynamicEmbTableOptions:
    return DynamicEmbTableOptions(
        dim=4,
        max_capacity=16,
        init_capacity=16,
        bucket_capacity=16,
        score_strategy=(DynamicEmbScoreStrategy.TIMESTAMP, DynamicEmbScoreStrategy.LFU),
        score_function=score_function,
    )


def _lookup(m: BatchedDynamicEmbeddingTables, keys: Sequence[int]) -> None:
    m(torch.tensor(list(keys)), torch.tensor([0, len(keys)]))


@pytest.mark.parametrize("score_function", [NAME, evict_frequent], ids=["name", "function"])
def test_the_named_function_picks_the_training_tables_victim(
    registered: None, score_function: Any
) -> None:
    m = BatchedDynamicEmbeddingTables(
        [_options(score_function)],
        ["t"],
        [0],
        DynamicEmbPoolingMode.NONE,
        EmbOptimType.EXACT_SGD,
        "cpu",
        learning_rate=0.1,
    )
    _lookup(m, range(16))  # fills the one bucket
    for _ in range(4):
        _lookup(m, [5])  # key 5 becomes the most frequent
    _lookup(m, [99])  # evicts one key: the most frequent under evict_frequent
    m.reset_metrics()
    _lookup(m, [5])
    assert m.metrics()["t"]["misses"] == 1, m.metrics()


def test_the_table_refuses_a_name() -> None:
    with pytest.raises(ValueError, match="'t'.*registered name.*with_score_function"):
        TableSpec.from_options("t", _options(NAME), row_width=4)
