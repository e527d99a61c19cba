"""The model and data both commands of the online-sync example share.

Two dynamic tables (user and item ids) pooled by sum, and a small MLP on top. Capacities are fixed
(init_capacity == max_capacity): a replica replays deltas slot for slot, which needs the trainer's and
the replica's tables to keep one layout.
"""

from __future__ import annotations

from typing import Tuple

import torch
from torch import nn

from dynamicemb_core.config import (
    DynamicEmbInitializerArgs,
    DynamicEmbInitializerMode,
    DynamicEmbPoolingMode,
    DynamicEmbScoreStrategy,
    DynamicEmbTableOptions,
)

TABLES = ("user", "item")
DIM = 8


def build_model(training: bool, capacity: int = 1024) -> nn.Module:
    """The trainer's model (``training=True``) or the replica's (embeddings only)."""
    from fbgemm_gpu.split_embedding_configs import EmbOptimType

    from dynamicemb_core.lookup import BatchedDynamicEmbeddingTables

    options = [
        DynamicEmbTableOptions(
            dim=DIM,
            max_capacity=capacity,
            init_capacity=capacity,
            bucket_capacity=64,
            training=training,
            score_strategy=DynamicEmbScoreStrategy.TIMESTAMP,
            initializer_args=DynamicEmbInitializerArgs(
                mode=DynamicEmbInitializerMode.UNIFORM, lower=-0.1, upper=0.1
            ),
        )
        for _ in TABLES
    ]
    torch.manual_seed(0)
    return Recommender(
        BatchedDynamicEmbeddingTables(
            table_options=options,
            table_names=list(TABLES),
            feature_table_map=[0, 1],
            pooling_mode=DynamicEmbPoolingMode.SUM,
            optimizer=EmbOptimType.EXACT_ROWWISE_ADAGRAD,
            device="cpu",
            learning_rate=0.05,
        )
    )


class Recommender(nn.Module):
    """Sparse features -> pooled embeddings -> MLP -> one logit per sample."""

    def __init__(self, sparse: nn.Module) -> None:
        super().__init__()
        self.sparse = sparse
        self.mlp = nn.Sequential(nn.Linear(2 * DIM, 16), nn.ReLU(), nn.Linear(16, 1))

    def forward(self, indices: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.sparse(indices, offsets)).squeeze(-1)


def make_batch(
    step: int, batch_size: int, key_space: int
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Deterministic batch ``step``: (indices, offsets, labels); one to three ids per feature and sample."""
    gen = torch.Generator().manual_seed(1000 + step)
    lengths = torch.randint(1, 4, (2 * batch_size,), generator=gen)
    indices = torch.randint(0, key_space, (int(lengths.sum()),), generator=gen, dtype=torch.int64)
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(lengths, 0)])
    labels = torch.randint(0, 2, (batch_size,), generator=gen).float()
    return indices, offsets, labels


HELD_OUT_STEP = -1  # the batch both sides evaluate: never used for training
