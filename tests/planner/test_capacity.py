"""Capacity helpers: per-rank layout rules, and agreement with what the planner writes."""

from __future__ import annotations

import math

import pytest
import torch
from fbgemm_gpu.split_embedding_configs import EmbOptimType
from torchrec.modules.embedding_configs import DataType, EmbeddingConfig

from dynamicemb_core import (
    BUCKET_ALIGNMENT,
    MAX_BUCKET_CAPACITY,
    DynamicEmbTableOptions,
    get_sharded_table_capacity,
    get_table_value_bytes,
)
from dynamicemb_core.planner.capacity import _sharded_table_bucket_layout
from dynamicemb_core.planner.table_options import prepare_table_options


def _config(n: int, dim: int = 8, data_type: DataType = DataType.FP32) -> EmbeddingConfig:
    return EmbeddingConfig(
        name="t", embedding_dim=dim, num_embeddings=n, feature_names=["f"], data_type=data_type
    )


def _reference_layout(n: int, world: int, bucket: int) -> tuple:
    """The spec's rule written out independently: rows per rank rounded up to whole buckets."""
    shard = math.ceil(n / world)
    if bucket == MAX_BUCKET_CAPACITY:
        width = max(1, math.ceil(shard / BUCKET_ALIGNMENT)) * BUCKET_ALIGNMENT
        return 1, width
    buckets = max(1, math.ceil(shard / bucket))
    return buckets, bucket


@pytest.mark.parametrize("n", [1, 15, 16, 17, 1000, 4096, 100_003])
@pytest.mark.parametrize("world", [1, 2, 3, 8])
@pytest.mark.parametrize("bucket", [16, 128, 1024, MAX_BUCKET_CAPACITY])
def test_layout_matches_spec_rule_for_all_sizes(n: int, world: int, bucket: int) -> None:
    layout = _sharded_table_bucket_layout(_config(n), world, bucket)
    assert layout == _reference_layout(n, world, bucket)
    assert get_sharded_table_capacity(_config(n), world, bucket) == layout[0] * layout[1]
    # a shard never holds fewer rows than TorchRec's row-wise split gives it
    assert layout[0] * layout[1] >= math.ceil(n / world)


@pytest.mark.parametrize("bucket", [128, MAX_BUCKET_CAPACITY])
@pytest.mark.parametrize("world", [1, 2, 4])
def test_helpers_equal_planner_preparation(bucket: int, world: int) -> None:
    config = _config(5000, dim=16)
    prepared = prepare_table_options(DynamicEmbTableOptions(bucket_capacity=bucket), config, world)
    assert prepared.max_capacity == get_sharded_table_capacity(config, world, bucket)
    expected_width = _reference_layout(5000, world, bucket)[1]
    assert prepared.bucket_capacity == expected_width


@pytest.mark.parametrize(
    "optimizer,state",
    [
        (EmbOptimType.EXACT_SGD, 0),
        (EmbOptimType.EXACT_ADAGRAD, 16),
        (EmbOptimType.EXACT_ROWWISE_ADAGRAD, 1),
        (EmbOptimType.ADAM, 32),
    ],
)
@pytest.mark.parametrize("data_type,elem", [(DataType.FP32, 4), (DataType.FP16, 2)])
def test_value_bytes_count_embedding_and_optimizer_state(optimizer, state, data_type, elem) -> None:
    config = _config(1000, dim=16, data_type=data_type)
    rows_per_rank = get_sharded_table_capacity(config, 2, 128)
    assert rows_per_rank == 512  # ceil(1000/2)=500 rounded up to 4 buckets of 128
    # The embedding in the table's dtype, the optimizer state in float32 (half-precision tables).
    assert get_table_value_bytes(config, optimizer, 2, 128) == 2 * 512 * (16 * elem + state * 4)


def test_bad_bucket_capacity_and_world_size_raise_naming_table() -> None:
    with pytest.raises(ValueError, match=r"table 't'.*bucket_capacity.*got 24"):
        get_sharded_table_capacity(_config(100), 2, 24)
    with pytest.raises(ValueError, match="world_size"):
        get_sharded_table_capacity(_config(100), 0, 128)


def test_dtype_of_table_follows_torchrec_data_type() -> None:
    from dynamicemb_core.planner.capacity import table_dtype

    assert table_dtype(_config(10, data_type=DataType.FP16)) == torch.float16
