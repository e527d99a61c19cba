"""Compatibility module: ``dynamicemb.dynamicemb_config``'s public names, for ported code.

Holds no logic: the options and enums live in :mod:`dynamicemb_core.config`, the initializer
completion in :mod:`dynamicemb_core.planner.table_options`.
"""

from dynamicemb_core.config import (
    BUCKET_ALIGNMENT,
    DEFAULT_INDEX_TYPE,
    MAX_BUCKET_CAPACITY,
    DynamicEmbCheckMode,
    DynamicEmbEvictStrategy,
    DynamicEmbInitializerArgs,
    DynamicEmbInitializerMode,
    DynamicEmbPoolingMode,
    DynamicEmbScoreStrategy,
    DynamicEmbTableOptions,
    EvictedItemMode,
)
from dynamicemb_core.planner.capacity import (
    get_sharded_table_capacity,
    get_table_value_bytes,
)
from dynamicemb_core.planner.table_options import complete_initializer_args

__all__ = [
    "BUCKET_ALIGNMENT",
    "DEFAULT_INDEX_TYPE",
    "MAX_BUCKET_CAPACITY",
    "DynamicEmbCheckMode",
    "DynamicEmbEvictStrategy",
    "DynamicEmbInitializerArgs",
    "DynamicEmbInitializerMode",
    "DynamicEmbPoolingMode",
    "DynamicEmbScoreStrategy",
    "DynamicEmbTableOptions",
    "EvictedItemMode",
    "complete_initializer_args",
    "get_sharded_table_capacity",
    "get_table_value_bytes",
]
