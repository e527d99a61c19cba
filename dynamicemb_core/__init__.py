"""dynamicemb-core: dynamic (hash-table-backed) embedding tables for TorchRec.

Public names follow NVIDIA DynamicEmb's with the package renamed, so ported code changes only its
imports. Names are resolved lazily (PEP 562) so that ``import dynamicemb_core`` stays cheap and does not
build the C++ extension until an op is used.
"""

from __future__ import annotations

from typing import Dict

from dynamicemb_core._lazy_exports import lazy_exports

__version__ = "0.1.0"

# public name -> module that defines it (one place to look a name up)
_EXPORTS: Dict[str, str] = {
    # options and enums
    "BATCH_SIZE_PER_DUMP": "dynamicemb_core.config",
    "DEMB_TABLE_ALIGN_SIZE": "dynamicemb_core.config",
    "ScoreStrategy": "dynamicemb_core.config",
    "align_to_table_size": "dynamicemb_core.config",
    # data types and their converters
    "DynamicEmbDataType": "dynamicemb_core.dtypes",
    "data_type_to_dtype": "dynamicemb_core.dtypes",
    "data_type_to_dyn_emb": "dynamicemb_core.dtypes",
    "dtype_to_bytes": "dynamicemb_core.dtypes",
    "dyn_emb_to_torch": "dynamicemb_core.dtypes",
    "torch_to_dyn_emb": "dynamicemb_core.dtypes",
    # the fused optimizer
    "EmbOptimType": "dynamicemb_core.optimizer",
    "OptimizerArgs": "dynamicemb_core.optimizer",
    "BUCKET_ALIGNMENT": "dynamicemb_core.config",
    "MAX_BUCKET_CAPACITY": "dynamicemb_core.config",
    "DEFAULT_INDEX_TYPE": "dynamicemb_core.config",
    "DynamicEmbCheckMode": "dynamicemb_core.config",
    "DynamicEmbEvictStrategy": "dynamicemb_core.config",
    "DynamicEmbInitializerArgs": "dynamicemb_core.config",
    "DynamicEmbInitializerMode": "dynamicemb_core.config",
    "DynamicEmbPoolingMode": "dynamicemb_core.config",
    "DynamicEmbScoreStrategy": "dynamicemb_core.config",
    "DynamicEmbTableOptions": "dynamicemb_core.config",
    "EvictedItemMode": "dynamicemb_core.config",
    # plugin contracts
    "AdmissionStrategy": "dynamicemb_core.types",
    "Counter": "dynamicemb_core.types",
    "CopyMode": "dynamicemb_core.types",
    "MemoryType": "dynamicemb_core.types",
    "Storage": "dynamicemb_core.types",
    "StorageTableSpec": "dynamicemb_core.types",
    "DynamicEmbError": "dynamicemb_core.types",
    "DynamicEmbWarning": "dynamicemb_core.types",
    # the table
    "ScoredHashTable": "dynamicemb_core.table",
    "TableSpec": "dynamicemb_core.table",
    # admission
    "KVCounter": "dynamicemb_core.admission",
    "FrequencyAdmissionStrategy": "dynamicemb_core.admission",
    # planner helpers
    "get_sharded_table_capacity": "dynamicemb_core.planner.capacity",
    "get_table_value_bytes": "dynamicemb_core.planner.capacity",
    # checkpoint and online sync
    "DynamicEmbDump": "dynamicemb_core.checkpoint",
    "DynamicEmbLoad": "dynamicemb_core.checkpoint",
    "pop_evicted_keys": "dynamicemb_core.checkpoint",
    # placement counters (hits, misses, placed, evicted, unplaced) per table
    "reset_table_metrics": "dynamicemb_core.lookup.table_metrics",
    "table_metrics": "dynamicemb_core.lookup.table_metrics",
}

__all__ = sorted(_EXPORTS) + ["__version__"]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
