"""Small dynamic-table models and helpers shared by the checkpoint tests."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Sequence, Tuple

import torch
from torch import nn

from dynamicemb_core.config import (
    DynamicEmbInitializerArgs,
    DynamicEmbInitializerMode,
    DynamicEmbPoolingMode,
    DynamicEmbScoreStrategy,
    DynamicEmbTableOptions,
    EvictedItemMode,
)

S = DynamicEmbScoreStrategy


def table_options(dim: int, **overrides) -> DynamicEmbTableOptions:
    """Options of a small trainable table whose capacity never grows (so layouts stay comparable)."""
    kwargs = {
        "dim": dim,
        "max_capacity": 256,
        "init_capacity": 256,
        "bucket_capacity": 16,
        "score_strategy": S.TIMESTAMP,
        "initializer_args": DynamicEmbInitializerArgs(
            mode=DynamicEmbInitializerMode.UNIFORM, lower=-0.5, upper=0.5
        ),
    }
    kwargs.update(overrides)
    return DynamicEmbTableOptions(**kwargs)


def batched(
    dims: Sequence[int] = (8, 4),
    optimizer: str = "EXACT_ROWWISE_ADAGRAD",
    pooling: DynamicEmbPoolingMode = DynamicEmbPoolingMode.SUM,
    names: Sequence[str] = ("t0", "t1"),
    device: str = "cpu",
    **overrides,
) -> nn.Module:
    """A BatchedDynamicEmbeddingTables with one feature per table."""
    from fbgemm_gpu.split_embedding_configs import EmbOptimType

    from dynamicemb_core.lookup import BatchedDynamicEmbeddingTables

    per_table = [dict(overrides) for _ in dims]
    return BatchedDynamicEmbeddingTables(
        table_options=[table_options(d, **o) for d, o in zip(dims, per_table, strict=True)],
        table_names=list(names),
        feature_table_map=list(range(len(dims))),
        pooling_mode=pooling,
        optimizer=getattr(EmbOptimType, optimizer),
        device=device,
        learning_rate=0.1,
    )


class Holder(nn.Module):
    """A model with its dynamic tables under ``ebc`` (the collection path the APIs report)."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.ebc = module

    def forward(self, indices: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        return self.ebc(indices.to(self.ebc.device), offsets.to(self.ebc.device))


def make_model(**kwargs) -> Holder:
    return Holder(batched(**kwargs))


def batch(
    num_tables: int, batch_size: int, key_range: int, gen: torch.Generator
) -> Tuple[torch.Tensor, torch.Tensor]:
    """A feature-major TBE batch: every sample has 1..3 keys per feature."""
    lengths = torch.randint(1, 4, (num_tables * batch_size,), generator=gen)
    indices = torch.randint(0, key_range, (int(lengths.sum()),), generator=gen, dtype=torch.int64)
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(lengths, 0)])
    return indices, offsets


def train(
    model: nn.Module, steps: int, *, seed: int = 0, key_range: int = 200, batch_size: int = 8
) -> None:
    """Forward + backward on random batches (the fused optimizer updates the rows in backward)."""
    gen = torch.Generator().manual_seed(seed)
    num_tables = len(model.ebc.table_names)
    model.train()
    for _ in range(steps):
        indices, offsets = batch(num_tables, batch_size, key_range, gen)
        out = model(indices, offsets)
        out.pow(2).sum().backward()


@dataclass
class Snapshot:
    """Everything observable of one table: key -> (slot, row, scores)."""

    slots: Dict[int, int]
    rows: Dict[int, torch.Tensor]
    scores: Dict[int, Tuple[int, ...]]

    def keys(self) -> List[int]:
        return sorted(self.slots)


def snapshot(model: nn.Module) -> Dict[str, Snapshot]:
    """Per ``collection/table``, the table's full contents (through the checkpoint's own handles)."""
    from dynamicemb_core.checkpoint.discovery import find_tables

    out = {}
    for h in find_tables(model):
        exp = h.table.export(h.table_id, None)
        rows = h.storage.read_rows(h.table_id, exp.slots)
        out[h.qualified_name] = Snapshot(
            slots={int(k): int(s) for k, s in zip(exp.keys, exp.slots, strict=True)},
            rows={int(k): r.clone() for k, r in zip(exp.keys, rows, strict=True)},
            scores={
                int(k): tuple(int(v) for v in sc)
                for k, sc in zip(exp.keys, exp.scores, strict=True)
            },
        )
    return out


def assert_same_tables(
    a: Dict[str, Snapshot], b: Dict[str, Snapshot], *, rows: bool = True, width: int = -1
) -> None:
    """Same keys at the same slots (and, with ``rows``, bit-identical rows up to ``width`` columns)."""
    assert a.keys() == b.keys()
    for name in a:
        assert a[name].slots == b[name].slots, name
        if rows:
            for k in a[name].slots:
                ra, rb = a[name].rows[k], b[name].rows[k]
                if width >= 0:
                    ra, rb = ra[:width], rb[:width]
                assert torch.equal(ra, rb), (name, k)


def assert_same_rows_by_key(a: Dict[str, Snapshot], b: Dict[str, Snapshot]) -> None:
    """Same keys with bit-identical rows, wherever each model placed them (slots not compared)."""
    for name in a:
        assert a[name].keys() == b[name].keys()
        for k in a[name].keys():
            assert torch.equal(a[name].rows[k], b[name].rows[k]), (name, k)


# Overrides for a tiny table that evicts: 4 buckets of 16 slots.
EVICTING = {"max_capacity": 64, "init_capacity": 64, "bucket_capacity": 16}
RETAIN = EvictedItemMode.RETAIN_KEY


def hot_and_cold(model: nn.Module) -> None:
    """Look key 3 up in five batches and key 7 in one, both in table t0 (LFU counts: 5 and 1).

    The lookup deduplicates a batch's keys before the table sees them, so a count grows once per batch.
    """
    for step in range(5):
        keys = torch.tensor([3, 7] if step == 0 else [3], dtype=torch.int64)
        model(keys, torch.tensor([0, keys.numel(), keys.numel()])).sum().backward()
