"""A small trained model on dynamic tables, its batches, and a hand-written multi-rank dump."""

from __future__ import annotations

import os
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

import torch
from torch import nn

from dynamicemb_core.config import (
    DynamicEmbInitializerArgs,
    DynamicEmbInitializerMode,
    DynamicEmbPoolingMode,
    DynamicEmbScoreStrategy,
    DynamicEmbTableOptions,
)

NAMES = ("user", "item", "ad")
# user and ad share a dim, item does not: pooled outputs mix (dim, pooling) groups
DIMS = (8, 4, 8)
FEATURE_TABLE_MAP = [0, 1, 0, 2]  # user is read by two features, interleaved with the others


def options(dim: int, **overrides) -> DynamicEmbTableOptions:
    """A table whose capacity never grows, so a served copy keeps the trainer's layout."""
    kwargs = dict(
        dim=dim,
        max_capacity=512,
        init_capacity=512,
        bucket_capacity=32,
        score_strategy=DynamicEmbScoreStrategy.TIMESTAMP,
        initializer_args=DynamicEmbInitializerArgs(
            mode=DynamicEmbInitializerMode.UNIFORM, lower=-0.5, upper=0.5
        ),
    )
    kwargs.update(overrides)
    return DynamicEmbTableOptions(**kwargs)


def trained_tables(
    pooling: DynamicEmbPoolingMode = DynamicEmbPoolingMode.SUM,
    dims: Sequence[int] = DIMS,
    device: str | torch.device = "cpu",
    steps: int = 4,
    key_space: int = 300,
    **overrides,
) -> nn.Module:
    """A BatchedDynamicEmbeddingTables after ``steps`` Adagrad steps on random batches."""
    from fbgemm_gpu.split_embedding_configs import EmbOptimType

    from dynamicemb_core.lookup import BatchedDynamicEmbeddingTables

    torch.manual_seed(0)
    module = BatchedDynamicEmbeddingTables(
        table_options=[options(d, **overrides) for d in dims],
        table_names=list(NAMES),
        feature_table_map=list(FEATURE_TABLE_MAP),
        pooling_mode=pooling,
        optimizer=EmbOptimType.EXACT_ROWWISE_ADAGRAD,
        device=device,
        learning_rate=0.1,
    )
    train(module, range(steps), key_space)
    return module


def train(module: nn.Module, steps, key_space: int = 300) -> None:
    module.train()
    for step in steps:
        indices, offsets, weights = batch(step, 16, key_space, module.device)
        out = module(indices, offsets)
        out.square().sum().backward()
    module.eval()


def batch(
    step: int, batch_size: int, key_space: int, device: str | torch.device = "cpu"
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Feature-major (indices, offsets, weights); some bags empty, ids repeat within a bag."""
    gen = torch.Generator().manual_seed(7000 + step)
    lengths = torch.randint(0, 4, (len(FEATURE_TABLE_MAP) * batch_size,), generator=gen)
    indices = torch.randint(-5, key_space, (int(lengths.sum()),), generator=gen)
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(lengths, 0)])
    weights = torch.rand(indices.shape, generator=gen)
    return indices.to(device), offsets.to(device), weights.to(device)


@dataclass
class DuckConfig:
    """The fields of a TorchRec EmbeddingBagConfig the inference collections read."""

    name: str
    embedding_dim: int
    feature_names: List[str]
    num_embeddings: int = 1000


def configs(dims: Sequence[int] = DIMS) -> List[DuckConfig]:
    """One config per table, its features named as ``from_model`` names them (``table.position``)."""
    return [
        DuckConfig(name, d, [f"{name}.{f}" for f, t in enumerate(FEATURE_TABLE_MAP) if t == i])
        for i, (name, d) in enumerate(zip(NAMES, dims))
    ]


def feature_order() -> List[int]:
    """Training feature indices in config order (table by table): the served model's input order."""
    return [f for i in range(len(NAMES)) for f, t in enumerate(FEATURE_TABLE_MAP) if t == i]


def reorder(
    indices: torch.Tensor, offsets: torch.Tensor, order: List[int], batch_size: int
) -> Tuple[torch.Tensor, torch.Tensor]:
    """The same batch with its features in ``order`` (feature-major layout)."""
    parts, lengths = [], []
    for f in order:
        lo, hi = int(offsets[f * batch_size]), int(offsets[(f + 1) * batch_size])
        parts.append(indices[lo:hi])
        lengths.append(
            offsets[f * batch_size + 1 : (f + 1) * batch_size + 1]
            - offsets[f * batch_size : (f + 1) * batch_size]
        )
    lengths_t = torch.cat(lengths)
    new_offsets = torch.cat([offsets.new_zeros(1), torch.cumsum(lengths_t, 0)])
    return torch.cat(parts), new_offsets


def write_sharded_dump(path: str, module: nn.Module, world_size: int, dist_type: str) -> None:
    """The dump a ``world_size``-rank trainer would write: each rank's file holds the keys it owns.

    Written with the checkpoint format's own writers (shard files, then the manifest), from the
    rows of a one-process model, split by the same owner rule the sharded trainer uses.
    """
    from dynamicemb_core.checkpoint.discovery import find_tables
    from dynamicemb_core.checkpoint.format import ShardHeader, ShardPayload
    from dynamicemb_core.checkpoint.manifest import (
        merge_rank_manifests,
        new_dump_id,
        write_entry,
        write_rank_manifest,
    )
    from dynamicemb_core.checkpoint.scores import score_column_names
    from dynamicemb_core.checkpoint.table_io import export_rows
    from dynamicemb_core.shard.ownership import owner_rank

    os.makedirs(path, exist_ok=True)
    handles = find_tables(module)
    dump_id = new_dump_id()
    for rank in range(world_size):
        entries = []
        for h in handles:
            rows = export_rows(h)
            keep = owner_rank(rows.keys, dist_type, world_size) == rank
            header = ShardHeader(
                table_name=h.name,
                collection=h.collection,
                num_rows=int(keep.sum()),
                dim=h.dim,
                optimizer_width=0,
                dtype=h.dtype,
                score_columns=score_column_names(h.options),
                rank=rank,
                world_size=world_size,
                extra={"dist_type": dist_type},
                dump_id=dump_id,
            )
            payload = ShardPayload(
                keys=rows.keys[keep].cpu(),
                embeddings=rows.embeddings[keep].cpu(),
                optimizer_states=rows.optimizer_states[keep][:, :0].cpu(),
                scores=rows.scores[keep].cpu(),
            )
            entries.append(write_entry(path, header, payload))
        write_rank_manifest(path, rank, entries)
    merge_rank_manifests(path, world_size, dump_id)


def reference(module: nn.Module, indices, offsets, weights=None) -> torch.Tensor:
    """The trained module's eval forward."""
    module.eval()
    with torch.no_grad():
        return module(indices, offsets, weights)


def options_by_name(module: nn.Module, **overrides) -> Dict[str, DynamicEmbTableOptions]:
    import dataclasses

    return {
        n: dataclasses.replace(o, **overrides)
        for n, o in zip(module.table_names, module.table_options)
    }


def in_config_order(out: torch.Tensor, dims: Sequence[int], batch_size: int) -> torch.Tensor:
    """Training's pooled output (B, sum dims in training feature order) -> config feature order."""
    starts, pos = [], 0
    for t in FEATURE_TABLE_MAP:
        starts.append(pos)
        pos += dims[t]
    return torch.cat(
        [out[:, starts[f] : starts[f] + dims[FEATURE_TABLE_MAP[f]]] for f in feature_order()], 1
    )


def static_cxx_runtime_compiler(folder: Path) -> str:
    """A g++ that links libstdc++ statically into every shared object it links (what the GPU
    machine's ``$CXX`` does on its own; dynamicemb_core/inference/toolchain.py)."""
    gxx = shutil.which("g++")
    assert gxx is not None, "the ops library needs g++: the suite cannot run without it"
    script = Path(folder) / "static-g++"
    script.write_text(
        "#!/bin/sh\n"
        'for a in "$@"; do [ "$a" = "-shared" ] && exec '
        f'{gxx} "$@" -static-libstdc++; done\n'
        f'exec {gxx} "$@"\n'
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return str(script)
