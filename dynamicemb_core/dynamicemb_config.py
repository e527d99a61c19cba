"""Compatibility module: ``dynamicemb.dynamicemb_config``'s public names, for ported code.

Holds no logic: the options and enums live in :mod:`dynamicemb_core.config`, the initializer
completion in :mod:`dynamicemb_core.planner.table_options`.
"""

from dynamicemb_core.config import (
    BATCH_SIZE_PER_DUMP,
    BUCKET_ALIGNMENT,
    DEFAULT_INDEX_TYPE,
    DEMB_TABLE_ALIGN_SIZE,
    DIST_TYPES,
    MAX_BUCKET_CAPACITY,
    DynamicEmbCheckMode,
    DynamicEmbEvictStrategy,
    DynamicEmbInitializerArgs,
    DynamicEmbInitializerMode,
    DynamicEmbPoolingMode,
    DynamicEmbScoreStrategy,
    DynamicEmbTableOptions,
    EvictedItemMode,
    ScoreStrategy,
    align_to_table_size,
    normalize_score_strategy,
)
from dynamicemb_core.dtypes import (
    DynamicEmbDataType,
    data_type_to_dtype,
    data_type_to_dyn_emb,
    dtype_to_bytes,
    dyn_emb_to_torch,
    torch_to_dyn_emb,
)
from dynamicemb_core.planner.capacity import (
    DEFAULT_BUCKET_CAPACITY,
    get_sharded_table_capacity,
    get_table_value_bytes,
)
from dynamicemb_core.planner.table_options import complete_initializer_args

# The seed's name for the accepted dist_type values.
SUPPORTED_DIST_TYPES = DIST_TYPES

__all__ = [
    "BATCH_SIZE_PER_DUMP",
    "BUCKET_ALIGNMENT",
    "DEFAULT_BUCKET_CAPACITY",
    "DEMB_TABLE_ALIGN_SIZE",
    "DEFAULT_INDEX_TYPE",
    "MAX_BUCKET_CAPACITY",
    "DynamicEmbCheckMode",
    "DynamicEmbDataType",
    "DynamicEmbEvictStrategy",
    "DynamicEmbInitializerArgs",
    "DynamicEmbInitializerMode",
    "DynamicEmbPoolingMode",
    "DynamicEmbScoreStrategy",
    "DynamicEmbTableOptions",
    "EvictedItemMode",
    "SUPPORTED_DIST_TYPES",
    "ScoreStrategy",
    "align_to_table_size",
    "complete_initializer_args",
    "data_type_to_dtype",
    "data_type_to_dyn_emb",
    "dtype_to_bytes",
    "dyn_emb_to_torch",
    "get_sharded_table_capacity",
    "get_table_value_bytes",
    "normalize_score_strategy",
    "torch_to_dyn_emb",
]
