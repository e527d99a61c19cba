"""The storage contracts' input checks, at its old import path (external plugins import it from here).

The code lives in :mod:`dynamicemb_core.storage.contract.checks`; this module only re-exports it.
"""

from dynamicemb_core.storage.contract.checks import (
    check_erase,
    check_export,
    check_export_ids,
    check_find,
    check_insert,
    check_insert_pairs,
    check_pairs,
    check_table_id,
    check_table_ids,
    check_table_specs,
    common_row_dtype,
)

__all__ = [
    "check_erase",
    "check_export",
    "check_export_ids",
    "check_find",
    "check_insert",
    "check_insert_pairs",
    "check_pairs",
    "check_table_id",
    "check_table_ids",
    "check_table_specs",
    "common_row_dtype",
]
