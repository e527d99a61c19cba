"""Per-rank capacity of a row-wise sharded dynamic table: the one set of rules the planner uses.

A dynamic table of ``num_embeddings`` rows sharded over ``world_size`` ranks gets
``ceil(num_embeddings / world_size)`` rows per rank, rounded up to whole hash-table buckets. The
planner writes exactly these numbers into ``DynamicEmbTableOptions`` (``bucket_capacity``,
``max_capacity``), and the public helpers :func:`get_sharded_table_capacity` and
:func:`get_table_value_bytes` call the same function, so a user sizing ``global_hbm_for_values``
before planning gets the numbers the planner will use.
"""

from __future__ import annotations

from typing import Any, Tuple

import torch
from torchrec.modules.embedding_configs import BaseEmbeddingConfig, data_type_to_dtype

from dynamicemb_core.config import (
    BUCKET_ALIGNMENT,
    MAX_BUCKET_CAPACITY,
    align_to_table_size,
    ceil_div,
)

__all__ = [
    "DEFAULT_BUCKET_CAPACITY",
    "align_up",
    "get_sharded_table_capacity",
    "get_table_value_bytes",
    "table_dtype",
]

# DynamicEmbTableOptions.bucket_capacity's default, in slots.
DEFAULT_BUCKET_CAPACITY: int = 128


def align_up(n: int, alignment: int) -> int:
    """Round ``n`` up to a multiple of ``alignment`` (:func:`~dynamicemb_core.config.align_to_table_size`)."""
    return align_to_table_size(n, alignment)


def _check_world_size(world_size: int) -> None:
    if not isinstance(world_size, int) or world_size <= 0:
        raise ValueError(f"world_size must be a positive int, got {world_size!r}")


def _sharded_table_bucket_layout(
    embedding_config: BaseEmbeddingConfig, world_size: int, bucket_capacity: int
) -> Tuple[int, int]:
    """Per-rank bucket layout ``(num_buckets, effective_bucket_width)``, both in rows.

    ``MAX_BUCKET_CAPACITY`` asks for one bucket spanning the shard: its width is the shard's rows
    rounded up to ``BUCKET_ALIGNMENT``. Otherwise ``bucket_capacity`` must be a positive multiple of
    ``BUCKET_ALIGNMENT`` and the shard's rows are rounded up to whole buckets.

    Raises:
        ValueError: naming the table, for a bad ``world_size`` or ``bucket_capacity``.
    """
    _check_world_size(world_size)
    shard_rows = ceil_div(int(embedding_config.num_embeddings), world_size)
    if bucket_capacity == MAX_BUCKET_CAPACITY:
        return 1, align_up(shard_rows, BUCKET_ALIGNMENT)
    if bucket_capacity <= 0 or bucket_capacity % BUCKET_ALIGNMENT != 0:
        raise ValueError(
            f"table {embedding_config.name!r}: bucket_capacity must be a positive multiple of "
            f"BUCKET_ALIGNMENT ({BUCKET_ALIGNMENT}) or MAX_BUCKET_CAPACITY, got {bucket_capacity}"
        )
    return align_up(shard_rows, bucket_capacity) // bucket_capacity, bucket_capacity


def get_sharded_table_capacity(
    embedding_config: BaseEmbeddingConfig,
    world_size: int,
    bucket_capacity: int = DEFAULT_BUCKET_CAPACITY,
) -> int:
    """Rows one rank's shard of the table holds: ``num_buckets * effective_bucket_width``.

    This is the ``max_capacity`` the planner writes into the table's options.

    Args:
        embedding_config: the TorchRec table config (``num_embeddings`` is read).
        world_size: ranks the table is sharded over.
        bucket_capacity: requested bucket width in rows, or ``MAX_BUCKET_CAPACITY``.
    """
    num_buckets, width = _sharded_table_bucket_layout(embedding_config, world_size, bucket_capacity)
    return num_buckets * width


def table_dtype(embedding_config: BaseEmbeddingConfig) -> torch.dtype:
    """The torch dtype of the table's weights, from TorchRec's ``data_type``."""
    return data_type_to_dtype(embedding_config.data_type)


def get_table_value_bytes(
    embedding_config: BaseEmbeddingConfig,
    optimizer_type: Any,
    world_size: int,
    bucket_capacity: int = DEFAULT_BUCKET_CAPACITY,
) -> int:
    """Bytes of value storage (embedding and optimizer state rows) the table needs over all ranks.

    Size ``global_hbm_for_values`` with this before planning (scaled by a cache ratio if wanted).

    Args:
        embedding_config: the TorchRec table config (``num_embeddings``, ``embedding_dim``,
            ``data_type``).
        optimizer_type: an ``fbgemm_gpu`` ``EmbOptimType`` (or its string value); decides the state
            width per row.
        world_size: ranks the table is sharded over.
        bucket_capacity: as for :func:`get_sharded_table_capacity`.
    """
    # One source of truth for the row layout: the optimizer package that reads and writes rows.
    from dynamicemb_core.optim import optimizer_kind, row_width
    from dynamicemb_core.optim.layout import row_bytes

    rows = get_sharded_table_capacity(embedding_config, world_size, bucket_capacity) * world_size
    dim = int(embedding_config.embedding_dim)
    width = row_width(optimizer_kind(optimizer_type), dim, True)
    # A half-precision table stores its embedding in 2 bytes per element, its state in float32.
    return rows * row_bytes(width, dim, table_dtype(embedding_config))
