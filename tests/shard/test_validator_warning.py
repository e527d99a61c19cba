"""TorchRec's input check warns for ids beyond ``num_embeddings`` ("Feature ... out of range"):
native tables keep the warning, dynamic tables (where such ids are the point) do not trigger it.

One gloo process; only the sharded EBC's first ``input_dist`` runs (TorchRec validates there),
so a native table can be handed out-of-range ids without a lookup reading past its rows.
"""

from __future__ import annotations

import logging
from typing import List

import torch
import torch.distributed as dist
from dist_harness import CPU, run_workers, shard_model
from fbgemm_gpu.split_embedding_configs import EmbOptimType
from torchrec.distributed.types import ShardingType
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from dynamicemb_core import MAX_BUCKET_CAPACITY, DynamicEmbTableOptions
from dynamicemb_core.planner import DynamicEmbParameterConstraints
from dynamicemb_core.shard import ShardedDynamicEmbeddingBagCollection

VALIDATOR_LOGGER = "torchrec.sparse.jagged_tensor_validator"


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: List[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _first_input_dist(rank: int, world: int, native_ids: List[int]) -> None:
    configs = [
        EmbeddingBagConfig(name="dyn", embedding_dim=4, num_embeddings=50, feature_names=["f_dyn"]),
        EmbeddingBagConfig(name="nat", embedding_dim=4, num_embeddings=10, feature_names=["f_nat"]),
    ]
    constraints = {
        "dyn": DynamicEmbParameterConstraints(
            use_dynamicemb=True,
            dynamicemb_options=DynamicEmbTableOptions(bucket_capacity=MAX_BUCKET_CAPACITY),
        ),
        "nat": DynamicEmbParameterConstraints(sharding_types=[ShardingType.TABLE_WISE.value]),
    }
    fused = {"optimizer": EmbOptimType.EXACT_SGD, "learning_rate": 0.1}
    model = shard_model(True, configs, constraints, fused, world, CPU)
    (ebc,) = [m for m in model.modules() if isinstance(m, ShardedDynamicEmbeddingBagCollection)]
    dynamic_ids = [3, 10**6, 2**40]  # far beyond num_embeddings=50: a dynamic table takes them
    kjt = KeyedJaggedTensor(
        keys=["f_dyn", "f_nat"],
        values=torch.tensor(dynamic_ids + native_ids),
        lengths=torch.tensor([len(dynamic_ids), len(native_ids)]),
    )
    handler = _Collect()
    logger = logging.getLogger(VALIDATOR_LOGGER)
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        ebc.input_dist(ebc.create_context(), kjt)
    finally:
        logger.removeHandler(handler)
    out_of_range = [m for m in handler.messages if "out of range" in m]
    assert not any("f_dyn" in m for m in out_of_range), out_of_range
    if max(native_ids) >= 10:
        assert any("Feature f_nat" in m for m in out_of_range), handler.messages
    else:
        assert out_of_range == [], out_of_range
    # the dynamic table is hidden only for the check: the module still serves both tables
    assert [c.name for c in ebc._embedding_bag_configs] == ["dyn", "nat"]
    dist.barrier()


def test_dynamic_feature_does_not_warn_native_feature_does() -> None:
    run_workers(_first_input_dist, [1, 25], world=1)


def test_in_range_native_and_dynamic_features_do_not_warn() -> None:
    run_workers(_first_input_dist, [1, 9], world=1)
