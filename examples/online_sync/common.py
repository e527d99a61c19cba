"""The model and data both commands of the online-sync example share.

Two dynamic tables (user and item ids) pooled by sum, and a small MLP on top. The trainer trains
them; the replica serves them as a read-only inference collection (dynamicemb_core.inference).
Capacities are fixed (init_capacity == max_capacity): a replica replays deltas slot for slot, which
needs the trainer's and the replica's tables to keep one layout.
"""

from __future__ import annotations

from typing import List, Tuple

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


def table_options(training: bool, capacity: int = 1024) -> List[DynamicEmbTableOptions]:
    """The options of both tables, shared by the trainer and the replica (one layout)."""
    return [
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


def build_model(training: bool, capacity: int = 1024) -> nn.Module:
    """The trainer's model: trainable dynamic tables under the MLP."""
    from fbgemm_gpu.split_embedding_configs import EmbOptimType

    from dynamicemb_core.lookup import BatchedDynamicEmbeddingTables

    torch.manual_seed(0)
    return Recommender(
        BatchedDynamicEmbeddingTables(
            table_options=table_options(training, capacity),
            table_names=list(TABLES),
            feature_table_map=[0, 1],
            pooling_mode=DynamicEmbPoolingMode.SUM,
            optimizer=EmbOptimType.EXACT_ROWWISE_ADAGRAD,
            device="cpu",
            learning_rate=0.05,
        )
    )


def build_replica(capacity: int = 1024) -> nn.Module:
    """The replica's model: the same tables as a read-only inference collection (no optimizer
    state), empty until deltas are replayed into it, under the same MLP."""
    from torchrec.modules.embedding_configs import EmbeddingBagConfig

    from dynamicemb_core.inference import InferenceEmbeddingBagCollection

    configs = [
        EmbeddingBagConfig(name=t, embedding_dim=DIM, num_embeddings=capacity, feature_names=[t])
        for t in TABLES
    ]
    # "model.sparse": the trainer's collection name, the key of its deltas
    sparse = InferenceEmbeddingBagCollection(
        configs, table_options(False, capacity), collection="model.sparse"
    )
    return Recommender(LookupAdapter(sparse))


class LookupAdapter(nn.Module):
    """Gives an inference collection the trainer's ``(indices, offsets)`` call."""

    def __init__(self, collection: nn.Module) -> None:
        super().__init__()
        self.collection = collection

    def forward(self, indices: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        return self.collection.lookup(indices, offsets)


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
