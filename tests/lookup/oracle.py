"""Helpers of the oracle tests: batches, mirrored weights, and FBGEMM / torch peers.

Peers: FBGEMM's CPU ``SplitTableBatchedEmbeddingBagsCodegen`` (what TorchRec's fused EBC/EC run) for
EXACT_SGD / EXACT_ADAGRAD / EXACT_ROWWISE_ADAGRAD, and ``torch.optim.SparseAdam`` over
``nn.EmbeddingBag(sparse=True)`` / ``nn.Embedding(sparse=True)`` for ADAM (FBGEMM's CPU build refuses
ADAM). The peers run on the CPU; our module runs on the test's device.
"""

from __future__ import annotations

from typing import List, Optional, Tuple

import torch
from torch import nn

from dynamicemb_core.config import (
    DynamicEmbInitializerArgs,
    DynamicEmbInitializerMode,
    DynamicEmbPoolingMode,
    DynamicEmbTableOptions,
)

NUM_IDS = 40  # ids per table of the peer; the dynamic table sees the same ids as keys

# A local_hbm_for_values larger than any test table: the table lives wholly in device memory. A
# zero budget means "no values in device memory" (a hybrid table with every row on the host) on
# CUDA, so tests of device-resident tables name a budget, as the planner would.
WHOLE_TABLE_BUDGET = 1 << 40


def device_resident(kw: dict) -> dict:
    """``kw`` with the whole-table budget, unless it asks for a cache, an external store or a budget."""
    if not kw.get("caching") and kw.get("external_storage") is None:
        kw.setdefault("local_hbm_for_values", WHOLE_TABLE_BUDGET)
    return kw


def make_batch(
    num_features: int, batch_size: int, seed: int, empty: bool = False, weighted: bool = False
) -> Tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
    """Feature-major (indices, offsets, weights) with repeated ids and empty bags."""
    g = torch.Generator().manual_seed(seed)
    if empty:
        lengths = torch.zeros(num_features * batch_size, dtype=torch.int64)
    else:
        lengths = torch.randint(0, 5, (num_features * batch_size,), generator=g)
        lengths[1] = 0  # always at least one empty bag
    n = int(lengths.sum())
    indices = torch.randint(0, NUM_IDS // 2, (n,), generator=g) * 2 % NUM_IDS  # repeats
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
    weights = torch.rand(n, generator=g) if weighted else None
    return indices, offsets, weights


def options(dim: int, **kw) -> DynamicEmbTableOptions:
    """Options of a table large enough that nothing is evicted."""
    kw.setdefault("max_capacity", 1024)
    return DynamicEmbTableOptions(dim=dim, bucket_capacity=128, **device_resident(kw))


def debug_options(dim: int, **kw) -> DynamicEmbTableOptions:
    """Options whose new rows are DEBUG-initialized (from the key), so twin modules start equal."""
    return DynamicEmbTableOptions(
        dim=dim,
        initializer_args=DynamicEmbInitializerArgs(mode=DynamicEmbInitializerMode.DEBUG),
        **device_resident(kw),
    )


def one_table_module(
    opts: DynamicEmbTableOptions,
    device,
    optimizer,
    pooling: DynamicEmbPoolingMode = DynamicEmbPoolingMode.SUM,
    **hyper,
):
    """A batched module over one table ``t`` read by one feature."""
    from dynamicemb_core.lookup import BatchedDynamicEmbeddingTables

    return BatchedDynamicEmbeddingTables([opts], ["t"], [0], pooling, optimizer, device, **hyper)


def mirror_weights(module, weights: List[torch.Tensor]) -> None:
    """Write the peer's rows (ids 0..NUM_IDS-1) into our tables, with fresh optimizer state."""
    for t, w in enumerate(weights):
        storage = module.tables[t]
        spec = storage.tables[0]
        rows = torch.zeros(w.size(0), spec.row_width)
        rows[:, : w.size(1)] = w
        rows[:, w.size(1) :] = module.optimizer_args.initial_accumulator_value
        keys = torch.arange(w.size(0))
        scores = torch.zeros(w.size(0), spec.num_scores, dtype=torch.int64)
        storage.insert(0, keys.to(module.device), rows.to(module.device), scores.to(module.device))


def read_weights(module, t: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """(embeddings, state) of ids 0..NUM_IDS-1 from our table t (CPU)."""
    found, rows, _ = module.tables[t].find(0, torch.arange(NUM_IDS, device=module.device))
    assert bool(found.all()), "a mirrored id is missing from the dynamic table"
    dim = module.dims[t]
    return rows[:, :dim].cpu(), rows[:, dim:].cpu()


def fbgemm_peer(
    dims,
    feature_table_map,
    pooling: DynamicEmbPoolingMode,
    optimizer,
    device: Optional[torch.device] = None,
    **kw,
):
    """FBGEMM's TBE over ``dims`` tables of NUM_IDS rows: CPU by default, CUDA (FBGEMM's CUDA build,
    the only one that offers ADAM) when ``device`` is a CUDA device."""
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import PoolingMode
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
        ComputeDevice,
        EmbeddingLocation,
        SplitTableBatchedEmbeddingBagsCodegen,
    )

    mode = {0: PoolingMode.SUM, 1: PoolingMode.MEAN, 2: PoolingMode.NONE}[int(pooling)]
    on_cuda = device is not None and device.type == "cuda"
    where = (
        (EmbeddingLocation.DEVICE, ComputeDevice.CUDA)
        if on_cuda
        else (EmbeddingLocation.HOST, ComputeDevice.CPU)
    )
    tbe = SplitTableBatchedEmbeddingBagsCodegen(
        [(NUM_IDS, d, *where) for d in dims],
        feature_table_map=feature_table_map,
        optimizer=optimizer,
        pooling_mode=mode,
        **({"device": device} if on_cuda else {}),
        **kw,
    )
    # TBE's CPU tables start at zero; random rows make every step's arithmetic matter.
    g = torch.Generator().manual_seed(123)
    with torch.no_grad():
        for w in tbe.split_embedding_weights():
            w.copy_(torch.rand(w.shape, generator=g) - 0.5)
    return tbe


class SparseAdamPeer(nn.Module):
    """Row-sparse Adam peer: one sparse embedding (bag) per table, features mapped like ours."""

    def __init__(self, dims, feature_table_map, pooling: DynamicEmbPoolingMode, lr, eps) -> None:
        super().__init__()
        self.pooling = DynamicEmbPoolingMode(pooling)
        self.feature_table_map = feature_table_map
        if self.pooling is DynamicEmbPoolingMode.NONE:
            self.tables = nn.ModuleList(nn.Embedding(NUM_IDS, d, sparse=True) for d in dims)
        else:
            mode = "sum" if self.pooling is DynamicEmbPoolingMode.SUM else "mean"
            self.tables = nn.ModuleList(
                nn.EmbeddingBag(NUM_IDS, d, mode=mode, sparse=True) for d in dims
            )
        self.opt = torch.optim.SparseAdam(self.parameters(), lr=lr, eps=eps)

    def weights(self) -> List[torch.Tensor]:
        return [t.weight.detach() for t in self.tables]

    def forward(self, indices, offsets, weights=None):
        F = len(self.feature_table_map)
        B = (offsets.numel() - 1) // F
        outs = []
        for f, t in enumerate(self.feature_table_map):
            lo, hi = int(offsets[f * B]), int(offsets[(f + 1) * B])
            idx = indices[lo:hi]
            if self.pooling is DynamicEmbPoolingMode.NONE:
                outs.append(self.tables[t](idx))
            else:
                off = offsets[f * B : (f + 1) * B] - lo
                w = None if weights is None else weights[lo:hi]
                outs.append(self.tables[t](idx, off, per_sample_weights=w))
        return torch.cat(outs, dim=0 if self.pooling is DynamicEmbPoolingMode.NONE else 1)
