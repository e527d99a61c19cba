"""The adapter between the two storage contracts, at its old import path (external plugins import it from here).

The code lives in :mod:`dynamicemb_core.storage.contract.adapter`; this module only re-exports it.
"""

from dynamicemb_core.storage.contract.adapter import (
    AnyStorage,
    PerTableAdapter,
    TableGroups,
    as_storage,
    erase_in_table,
    export_table,
    find_in_table,
    insert_in_table,
    size_of_table,
    split_by_table,
)

__all__ = [
    "AnyStorage",
    "PerTableAdapter",
    "TableGroups",
    "as_storage",
    "erase_in_table",
    "export_table",
    "find_in_table",
    "insert_in_table",
    "size_of_table",
    "split_by_table",
]
