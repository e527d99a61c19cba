"""Sizing a dynamic table (docs/sizing.md): at its id count it evicts, with headroom it does not;
the planner says the rule for each dynamic table it plans."""

from __future__ import annotations

import logging

import pytest
from torchrec.distributed.types import ShardingType
from torchrec.modules.embedding_configs import EmbeddingBagConfig

from dynamicemb_core import DynamicEmbTableOptions
from dynamicemb_core.demo.sizing import measure
from dynamicemb_core.planner import DynamicEmbeddingShardingPlanner, DynamicEmbParameterConstraints
from dynamicemb_core.planner.planner import default_topology


def test_table_sized_at_its_id_count_evicts_and_twice_that_does_not() -> None:
    tight = measure(2000, 1.0, epochs=2)
    assert tight.capacity >= tight.ids  # every id would fit...
    assert all(e > 0 for e in tight.evictions_per_epoch)  # ...yet full buckets evict, each epoch
    assert tight.kept < tight.ids
    roomy = measure(2000, 2.0, epochs=2)
    assert roomy.evictions_per_epoch == [0, 0] and roomy.kept == roomy.ids


def test_planner_logs_slots_and_sizing_rule_per_dynamic_table(
    caplog: pytest.LogCaptureFixture,
) -> None:
    configs = [
        EmbeddingBagConfig(name="users", embedding_dim=8, num_embeddings=943, feature_names=["u"]),
        EmbeddingBagConfig(name="native", embedding_dim=8, num_embeddings=64, feature_names=["n"]),
    ]
    constraints = {
        "users": DynamicEmbParameterConstraints(
            use_dynamicemb=True, dynamicemb_options=DynamicEmbTableOptions()
        ),
        "native": DynamicEmbParameterConstraints(sharding_types=[ShardingType.TABLE_WISE.value]),
    }
    with caplog.at_level(logging.INFO, logger="dynamicemb_core.planner.planner"):
        DynamicEmbeddingShardingPlanner(
            eb_configs=configs, topology=default_topology(2, "cpu"), constraints=constraints
        )
    lines = [r.getMessage() for r in caplog.records if r.name == "dynamicemb_core.planner.planner"]
    assert len(lines) == 1, lines  # the dynamic table only
    assert lines[0].startswith(
        "table 'users': 512 slots per rank (num_embeddings 943 over 2 rank(s))"
    )
    assert "1.5x to 2x" in lines[0] and "docs/sizing.md" in lines[0]
