"""The scored hash table: ``(table_id, key) -> slot`` with per-slot score words and value rows.

:class:`ScoredHashTable` implements docs/table_design.md on top of the ``torch.ops.dynamicemb`` ops;
:class:`TableSpec` describes one logical table. Result types are dataclasses of tensors.
"""

from dynamicemb_core.table.results import EvictedItems, ExportResult, FindResult, InsertResult
from dynamicemb_core.table.scored_hash_table import ScoredHashTable
from dynamicemb_core.table.spec import TableSpec

__all__ = [
    "EvictedItems",
    "ExportResult",
    "FindResult",
    "InsertResult",
    "ScoredHashTable",
    "TableSpec",
]
