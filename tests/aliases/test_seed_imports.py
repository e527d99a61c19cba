"""Code written for the seeds imports by the seed's paths: every ``from dynamicemb... import ...`` of the
seed documents works with ``dynamicemb`` renamed ``dynamicemb_core`` (issue 15 item 5).

``SEED_IMPORTS`` is what :func:`parse_seed_imports` reads out of the seed documents; where they are
present (``/work/shared/seeds`` on the development machine) the test re-parses them and fails when the
list here is out of date, so the list cannot silently lose a name. ``UPSTREAM_IMPORTS`` are the module
paths and names the seed's code uses beyond its import lines (issue 15's list).
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path
from typing import Iterable, Set, Tuple

import pytest
import torch

SEEDS = Path("/work/shared/seeds")

SEED_IMPORTS = {
    ("dynamicemb", "BUCKET_ALIGNMENT"),
    ("dynamicemb", "DynamicEmbCheckMode"),
    ("dynamicemb", "DynamicEmbDump"),
    ("dynamicemb", "DynamicEmbInitializerArgs"),
    ("dynamicemb", "DynamicEmbInitializerMode"),
    ("dynamicemb", "DynamicEmbLoad"),
    ("dynamicemb", "DynamicEmbPoolingMode"),
    ("dynamicemb", "DynamicEmbScoreStrategy"),
    ("dynamicemb", "DynamicEmbTableOptions"),
    ("dynamicemb", "MAX_BUCKET_CAPACITY"),
    ("dynamicemb", "get_sharded_table_capacity"),
    ("dynamicemb", "get_table_value_bytes"),
    ("dynamicemb", "pop_evicted_keys"),
    ("dynamicemb.dynamicemb_config", "complete_initializer_args"),
    ("dynamicemb.incremental_dump", "get_score"),
    ("dynamicemb.incremental_dump", "incremental_dump"),
    ("dynamicemb.incremental_dump", "set_score"),
    ("dynamicemb.planner", "DynamicEmbParameterConstraints"),
    ("dynamicemb.planner", "DynamicEmbeddingEnumerator"),
    ("dynamicemb.planner", "DynamicEmbeddingShardingPlanner"),
    ("dynamicemb.shard", "DynamicEmbeddingCollectionSharder"),
}

UPSTREAM_IMPORTS = {
    # names the seed documents as classes / types of the package
    ("dynamicemb", "AdmissionStrategy"),
    ("dynamicemb", "Counter"),
    ("dynamicemb", "KVCounter"),
    ("dynamicemb", "FrequencyAdmissionStrategy"),
    ("dynamicemb", "DynamicEmbEvictStrategy"),
    ("dynamicemb", "EvictedItemMode"),
    ("dynamicemb", "ScoreStrategy"),
    ("dynamicemb", "EmbOptimType"),
    ("dynamicemb", "OptimizerArgs"),
    ("dynamicemb", "BATCH_SIZE_PER_DUMP"),
    ("dynamicemb", "DEMB_TABLE_ALIGN_SIZE"),
    ("dynamicemb", "align_to_table_size"),
    ("dynamicemb", "data_type_to_dtype"),
    ("dynamicemb", "data_type_to_dyn_emb"),
    ("dynamicemb", "dyn_emb_to_torch"),
    ("dynamicemb", "torch_to_dyn_emb"),
    ("dynamicemb", "dtype_to_bytes"),
    ("dynamicemb", "DynamicEmbDataType"),
    ("dynamicemb.dynamicemb_config", "DynamicEmbTableOptions"),
    ("dynamicemb.dynamicemb_config", "BATCH_SIZE_PER_DUMP"),
    ("dynamicemb.dynamicemb_config", "DEFAULT_BUCKET_CAPACITY"),
    ("dynamicemb.dynamicemb_config", "SUPPORTED_DIST_TYPES"),
    ("dynamicemb.dynamicemb_config", "ScoreStrategy"),
    ("dynamicemb.dynamicemb_config", "align_to_table_size"),
    ("dynamicemb.dynamicemb_config", "data_type_to_dtype"),
    ("dynamicemb.dynamicemb_config", "get_sharded_table_capacity"),
    ("dynamicemb.dynamicemb_config", "get_table_value_bytes"),
    ("dynamicemb.optimizer", "EmbOptimType"),
    ("dynamicemb.optimizer", "OptimizerArgs"),
    ("dynamicemb.dump_load", "DynamicEmbDump"),
    ("dynamicemb.dump_load", "DynamicEmbLoad"),
    ("dynamicemb.batched_dynamicemb_tables", "BatchedDynamicEmbeddingTablesV2"),
    ("dynamicemb.embedding_admission", "FrequencyAdmissionStrategy"),
    ("dynamicemb.embedding_admission", "KVCounter"),
    ("dynamicemb.embedding_admission", "Counter"),
    ("dynamicemb.types", "Storage"),
    ("dynamicemb.types", "Counter"),
    ("dynamicemb.types", "AdmissionStrategy"),
    ("dynamicemb.types", "MemoryType"),
    ("dynamicemb.types", "DynamicEmbInitializerArgs"),
    ("dynamicemb.types", "DynamicEmbInitializerMode"),
    ("dynamicemb.types", "DEMB_TABLE_ALIGN_SIZE"),
    ("dynamicemb.types", "MAX_BUCKET_CAPACITY"),
    ("dynamicemb.shard.embedding", "DynamicEmbeddingCollectionSharder"),
    ("dynamicemb.shard.embedding", "ShardedDynamicEmbeddingCollection"),
    ("dynamicemb.shard.embeddingbag", "DynamicEmbeddingBagCollectionSharder"),
    ("dynamicemb.planner.enumerators", "DynamicEmbeddingEnumerator"),
    ("dynamicemb.planner.planner", "DynamicEmbeddingShardingPlanner"),
    ("dynamicemb.incremental_dump", "replay_increment"),
    ("dynamicemb.incremental_dump", "DeltaDumpResult"),
    ("dynamicemb.incremental_dump", "ReplayContent"),
}

_IMPORT = re.compile(r"from\s+dynamicemb((?:\.\w+)*)\s+import\s+([\w ,]+)")


def parse_seed_imports(texts: Iterable[str]) -> Set[Tuple[str, str]]:
    """Every ``(module, name)`` a ``from dynamicemb... import a, b`` line of the texts names."""
    found: Set[Tuple[str, str]] = set()
    for text in texts:
        for match in _IMPORT.finditer(text):
            for piece in match.group(2).split(","):
                if piece.split():
                    found.add(("dynamicemb" + match.group(1), piece.split()[0]))
    return found


def _renamed(module: str) -> str:
    return "dynamicemb_core" + module[len("dynamicemb") :]


def test_the_list_is_the_seeds_import_lines() -> None:
    assert parse_seed_imports(["from dynamicemb.x import A, B_c — prose, more"]) == {
        ("dynamicemb.x", "A"),
        ("dynamicemb.x", "B_c"),
    }
    if SEEDS.is_dir():  # the development machine: the list must match the seeds as they are now
        texts = [p.read_text() for p in sorted(SEEDS.glob("*.md"))]
        assert parse_seed_imports(texts) == SEED_IMPORTS


@pytest.mark.parametrize(
    "module,name", sorted(SEED_IMPORTS | UPSTREAM_IMPORTS), ids=lambda x: str(x)
)
def test_seed_name_imports_from_its_seed_path(module: str, name: str) -> None:
    value = getattr(importlib.import_module(_renamed(module)), name)
    assert value is not None


def test_aliases_are_the_same_objects() -> None:
    import dynamicemb_core as d
    from dynamicemb_core.batched_dynamicemb_tables import BatchedDynamicEmbeddingTablesV2
    from dynamicemb_core.lookup import BatchedDynamicEmbeddingTables
    from dynamicemb_core.optimizer import EmbOptimType

    assert BatchedDynamicEmbeddingTablesV2 is BatchedDynamicEmbeddingTables
    assert d.EmbOptimType is EmbOptimType
    assert d.DEMB_TABLE_ALIGN_SIZE == d.BUCKET_ALIGNMENT == 16
    assert d.BATCH_SIZE_PER_DUMP == 65536


def test_align_to_table_size() -> None:
    from dynamicemb_core import align_to_table_size

    assert [align_to_table_size(n) for n in (-3, 0, 1, 16, 17)] == [16, 16, 16, 16, 32]
    assert align_to_table_size(100, 128) == 128


def test_dtype_converters_round_trip_and_name_what_they_cannot_map() -> None:
    from torchrec.types import DataType

    import dynamicemb_core as d

    for data_type, dtype in [
        (DataType.FP32, torch.float32),
        (DataType.FP16, torch.float16),
        (DataType.BF16, torch.bfloat16),
        (DataType.INT64, torch.int64),
    ]:
        assert d.data_type_to_dtype(data_type) == dtype
        assert d.dyn_emb_to_torch(d.data_type_to_dyn_emb(data_type)) == dtype
        assert d.dyn_emb_to_torch(d.torch_to_dyn_emb(dtype)) == dtype
    assert d.dyn_emb_to_torch(d.DynamicEmbDataType.Size_t) == torch.int64
    assert d.dtype_to_bytes(torch.bfloat16) == 2 and d.dtype_to_bytes(torch.int64) == 8
    with pytest.raises(ValueError, match="cannot be converted"):
        d.data_type_to_dtype(DataType.INT4)
    with pytest.raises(ValueError, match="torch_to_dyn_emb: no DynamicEmbDataType"):
        d.torch_to_dyn_emb(torch.complex64)
