"""The planner's checks and preparation of one dynamic table's options, in the spec's order.

:func:`prepare_table_options` is what ``DynamicEmbeddingShardingPlanner`` runs for every table whose
constraints say ``use_dynamicemb=True``:

1. ``initializer_args``: :func:`complete_initializer_args` fills missing UNIFORM and
   TRUNCATED_NORMAL bounds.
2. ``bucket_capacity`` / ``max_capacity`` / ``init_capacity``: the per-rank bucket layout of
   :mod:`dynamicemb_core.planner.capacity` (the same numbers the public helpers return).
3. ``local_hbm_for_values``: ``ceil(global_hbm_for_values / world_size)``.

Every check runs first (:func:`validate_table_options`), so bad options raise at planning, naming
the table and the value, before any process allocates a table. What the seed settles rather than
refuses is settled: ``dim`` is overwritten from ``embedding_dim`` (with a warning) and
``init_capacity`` is clamped to ``max_capacity``.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from typing import Optional

from torchrec.modules.embedding_configs import BaseEmbeddingConfig

from dynamicemb_core.config import (
    DynamicEmbInitializerArgs,
    DynamicEmbInitializerMode,
    DynamicEmbTableOptions,
    ceil_div,
    validate_dist_type,
)
from dynamicemb_core.planner.capacity import (
    _sharded_table_bucket_layout,
    align_up,
    table_dtype,
)

__all__ = ["complete_initializer_args", "prepare_table_options", "validate_table_options"]


def complete_initializer_args(
    initializer_args: DynamicEmbInitializerArgs,
    embedding_config: Optional[BaseEmbeddingConfig] = None,
) -> DynamicEmbInitializerArgs:
    """Return initializer args with missing bounds filled in; other modes unchanged.

    UNIFORM: with a TorchRec ``embedding_config`` the bounds are ``±sqrt(1 / num_embeddings)``
    (TorchRec's own default for its tables, so a dynamic table starts like the table it replaces);
    without one they are 0.0 and 1.0. TRUNCATED_NORMAL: with an ``embedding_config`` the same
    ``±sqrt(1 / num_embeddings)`` (the seed's field documentation); without one the bounds stay unset
    and the initializer truncates at ``mean ± 2 std_dev``. A new object is returned when anything is
    filled; the input is not changed.
    """
    mode = initializer_args.mode
    if mode not in (DynamicEmbInitializerMode.UNIFORM, DynamicEmbInitializerMode.TRUNCATED_NORMAL):
        return initializer_args
    if initializer_args.lower is not None and initializer_args.upper is not None:
        return initializer_args
    if embedding_config is not None:
        bound = math.sqrt(1.0 / int(embedding_config.num_embeddings))
        lower, upper = -bound, bound
    elif mode == DynamicEmbInitializerMode.UNIFORM:
        lower, upper = 0.0, 1.0
    else:
        return initializer_args
    return dataclasses.replace(
        initializer_args,
        lower=lower if initializer_args.lower is None else initializer_args.lower,
        upper=upper if initializer_args.upper is None else initializer_args.upper,
    )


def validate_table_options(
    options: DynamicEmbTableOptions, embedding_config: BaseEmbeddingConfig, world_size: int
) -> None:
    """Check one dynamic table's options against its TorchRec config and the world size.

    What the seed's planner settles instead of refusing is not an error here: a ``dim`` that
    disagrees with ``embedding_dim`` is overwritten (with a warning, in
    :func:`prepare_table_options`), ``init_capacity`` above the shard's capacity is clamped, and a
    value budget smaller than one bucket is rounded up when the table is built
    (:func:`dynamicemb_core.lookup.placement.device_budget_bytes`, which knows the optimizer's row width).

    Raises:
        ValueError / TypeError: naming the table and the offending value: an option the dataclass
            rejects (options may have been changed after construction), an unknown ``dist_type``,
            or a bucket layout that cannot be built for this world size.
    """
    name = embedding_config.name
    try:
        options.validate()
    except (TypeError, ValueError) as err:
        raise type(err)(f"table {name!r}: {err}") from err
    validate_dist_type(options.dist_type, table=name)
    _sharded_table_bucket_layout(embedding_config, world_size, options.bucket_capacity)


def prepare_table_options(
    options: DynamicEmbTableOptions, embedding_config: BaseEmbeddingConfig, world_size: int
) -> DynamicEmbTableOptions:
    """Return a copy of ``options`` filled in for one rank's shard (the planner's three steps).

    Preparing already prepared options gives the same options again, so planning twice is safe.

    Raises:
        ValueError: as :func:`validate_table_options`.
    """
    validate_table_options(options, embedding_config, world_size)
    embedding_dim = int(embedding_config.embedding_dim)
    if options.dim is not None and options.dim != embedding_dim:
        warnings.warn(
            f"table {embedding_config.name!r}: dynamicemb_options.dim={options.dim} differs from "
            f"the EmbeddingConfig's embedding_dim={embedding_dim}; the planner uses "
            f"embedding_dim",
            UserWarning,
            stacklevel=3,
        )
    # step 1: initializer bounds
    initializer_args = complete_initializer_args(options.initializer_args, embedding_config)
    # step 2: bucket layout, max_capacity and init_capacity per rank
    num_buckets, width = _sharded_table_bucket_layout(
        embedding_config, world_size, options.bucket_capacity
    )
    max_capacity = num_buckets * width
    if options.init_capacity is None:
        init_capacity = max_capacity
    else:
        init_capacity = min(align_up(options.init_capacity, width), max_capacity)
    # step 3: each rank's equal share of the value budget
    local_hbm = ceil_div(options.global_hbm_for_values, world_size)
    return dataclasses.replace(
        options,
        dim=embedding_dim,
        embedding_dtype=options.embedding_dtype or table_dtype(embedding_config),
        initializer_args=initializer_args,
        bucket_capacity=width,
        max_capacity=max_capacity,
        init_capacity=init_capacity,
        local_hbm_for_values=local_hbm,
    )
