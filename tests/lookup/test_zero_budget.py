"""A CUDA table left at the default zero HBM budget says so, once; the plan shows each table's split.

The decision reads options and the device type only, so it is checked here with a ``cuda`` device
object on a machine without a GPU (nothing is allocated).
"""

from __future__ import annotations

import logging
import warnings

import pytest
import torch
from fbgemm_gpu.split_embedding_configs import EmbOptimType
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection

from dynamicemb_core import DynamicEmbTableOptions, DynamicEmbWarning
from dynamicemb_core.lookup import placement
from dynamicemb_core.planner import DynamicEmbeddingShardingPlanner, DynamicEmbParameterConstraints
from dynamicemb_core.planner.planner import default_topology, split_lines
from dynamicemb_core.shard import DynamicEmbeddingBagCollectionSharder
from dynamicemb_core.types import StorageTableSpec

CUDA = torch.device("cuda")
ROW = 8 * 4  # dim 8, EXACT_SGD, float32


def _spec(name: str = "t") -> StorageTableSpec:
    return StorageTableSpec(
        name=name, dim=8, row_width=8, dtype=torch.float32, num_scores=1, capacity=1024
    )


def _opts(**kw) -> DynamicEmbTableOptions:
    return DynamicEmbTableOptions(dim=8, max_capacity=1024, bucket_capacity=128, **kw)


@pytest.fixture(autouse=True)
def fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(placement, "_WARNED_ZERO_BUDGET", set())


def test_message_only_for_a_cuda_table_with_a_zero_budget() -> None:
    message = placement.zero_budget_message(_opts(), _spec(), CUDA)
    assert message is not None and "global_hbm_for_values" in message and "'t'" in message
    assert placement.zero_budget_message(_opts(), _spec(), torch.device("cpu")) is None
    assert (
        placement.zero_budget_message(_opts(local_hbm_for_values=1024 * ROW), _spec(), CUDA) is None
    )
    assert (
        placement.zero_budget_message(_opts(local_hbm_for_values=256 * ROW), _spec(), CUDA) is None
    )
    assert placement.zero_budget_message(_opts(caching=True), _spec(), CUDA) is None


def test_warns_once_per_table() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            placement.warn_zero_budget([_opts(), _opts()], [_spec("a"), _spec("b")], CUDA)
            placement.warn_zero_budget([_opts()], [_spec("c")], torch.device("cpu"))
    found = [w for w in caught if issubclass(w.category, DynamicEmbWarning)]
    assert sorted(str(w.message).split("'")[1] for w in found) == ["a", "b"]


def test_device_split() -> None:
    assert placement.device_split(_opts(), _spec(), CUDA) == ("hybrid", 0, 1024)
    assert placement.device_split(_opts(local_hbm_for_values=256 * ROW), _spec(), CUDA) == (
        "hybrid",
        256,
        768,
    )
    assert placement.device_split(_opts(local_hbm_for_values=1 << 30), _spec(), CUDA) == (
        "device",
        1024,
        0,
    )
    assert placement.device_split(_opts(), _spec(), torch.device("cpu")) == ("device", 0, 1024)


def test_plan_printout_shows_each_tables_split(caplog: pytest.LogCaptureFixture) -> None:
    configs = [
        EmbeddingBagConfig(name=n, embedding_dim=8, num_embeddings=1000, feature_names=[f"f{n}"])
        for n in ("all", "part", "none")
    ]
    budgets = {"all": 1 << 30, "part": 128 * 3 * ROW, "none": 0}  # ADAM rows: 3 x dim floats
    constraints = {
        n: DynamicEmbParameterConstraints(
            use_dynamicemb=True,
            dynamicemb_options=DynamicEmbTableOptions(global_hbm_for_values=b, bucket_capacity=128),
        )
        for n, b in budgets.items()
    }
    planner = DynamicEmbeddingShardingPlanner(
        eb_configs=configs, topology=default_topology(1, "cpu"), constraints=constraints
    )
    sharder = DynamicEmbeddingBagCollectionSharder(
        fused_params={"optimizer": EmbOptimType.ADAM, "learning_rate": 0.1}
    )
    lines = split_lines(planner.dynamic_table_options, [sharder], "cuda")
    capacity = planner.dynamic_table_options["all"].max_capacity
    assert lines[0].startswith(f"table 'all': device, per rank {capacity} rows in cuda memory, 0")
    assert lines[1].startswith(
        f"table 'part': hybrid, per rank 128 rows in cuda memory, {capacity - 128}"
    )
    assert lines[2].startswith(f"table 'none': hybrid, per rank 0 rows in cuda memory, {capacity}")
    # planning logs them (on this CPU planner: every row in host memory)
    model = EmbeddingBagCollection(tables=configs, device=torch.device("meta"))
    with caplog.at_level(logging.INFO, logger="dynamicemb_core.planner.planner"):
        planner.plan(model, [sharder])
    assert f"table 'part': hybrid, per rank all {capacity} rows in host memory (CPU)" in caplog.text
