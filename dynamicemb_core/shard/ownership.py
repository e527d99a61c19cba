"""Key ownership at its old import path; the code lives in :mod:`dynamicemb_core.table.ownership`.

This module only re-exports it (the ownership rule sits below the options, planner and sharders,
which all read it).
"""

from dynamicemb_core.table.ownership import (
    DEFAULT_DIST_TYPE,
    DIST_TYPES,
    block_size,
    continuous_owner,
    owner_rank,
    validate_dist_type,
)

__all__ = [
    "DEFAULT_DIST_TYPE",
    "DIST_TYPES",
    "block_size",
    "continuous_owner",
    "owner_rank",
    "validate_dist_type",
]
