"""Seeded synthetic click data with power-law ids whose hot set drifts, so new ids keep arriving.

Each sample has ``num_dense`` float features and one id per sparse feature. Ids are drawn by rank
from a Zipf-like law (``P(rank r) ~ r^-alpha`` over ``id_space`` ranks) and mapped to scattered int64
ids; every step the mapping shifts by ``drift`` ranks, so yesterday's tail becomes today's head and
the set of ids seen grows far past any table's capacity: the tables must evict.

The label follows a hidden logistic model: each id carries a fixed latent weight (derived from its
hash) and the dense features a fixed weight vector, so a model that remembers the ids it has seen
can beat the base rate, and its loss falls while the tables churn.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Tuple

import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from dynamicemb_core.table.hashing import hash_keys_tensor

__all__ = ["ClickData", "ClickDataConfig"]

_ID_SCATTER = 0x9E3779B97F4A7C15 - 2**64  # odd 64-bit multiplier (golden ratio), as int64 bits


@dataclass(frozen=True)
class ClickDataConfig:
    """Shape of the synthetic stream.

    Attributes:
        features: sparse feature names, one id per sample each.
        num_dense: dense features per sample.
        id_space: ranks of the power law per feature.
        alpha: power-law exponent (1.05: a long, heavy tail).
        drift: ranks the hot set moves per step.
        seed: the stream's seed (the same seed gives the same stream on every rank).
    """

    features: Tuple[str, ...]
    num_dense: int = 8
    id_space: int = 1_000_000
    alpha: float = 1.05
    drift: int = 50
    seed: int = 0


class ClickData:
    """Batches of the stream: ``batch(step, rank, world)`` is rank ``rank``'s share of step ``step``."""

    def __init__(self, config: ClickDataConfig) -> None:
        self.config = config
        g = torch.Generator().manual_seed(config.seed)
        self._dense_weight = torch.randn(config.num_dense, generator=g) / config.num_dense**0.5

    def _ranks(self, n: int, g: torch.Generator) -> torch.Tensor:
        """Power-law ranks in [0, id_space) by inverting the continuous CDF of r^-alpha on [1, V+1)."""
        a, v = self.config.alpha, float(self.config.id_space)
        u = torch.rand(n, generator=g, dtype=torch.float64)
        top = (v + 1.0) ** (1.0 - a)
        r = ((top - 1.0) * u + 1.0) ** (1.0 / (1.0 - a))
        return (r.floor().to(torch.int64) - 1).clamp_(0, self.config.id_space - 1)

    def _ids(self, ranks: torch.Tensor, feature: int, step: int) -> torch.Tensor:
        shifted = ranks + step * self.config.drift + feature * (1 << 40)
        return (
            shifted * _ID_SCATTER
        )  # wraps like uint64: distinct ranks give distinct, scattered ids

    @staticmethod
    def _latent(ids: torch.Tensor) -> torch.Tensor:
        """Each id's hidden weight in [-1, 1), fixed by its hash."""
        h = hash_keys_tensor(ids) & ((1 << 20) - 1)
        return h.to(torch.float32) / float(1 << 19) - 1.0

    def batch(
        self, step: int, batch_size: int, rank: int = 0, world: int = 1
    ) -> Tuple[torch.Tensor, KeyedJaggedTensor, torch.Tensor]:
        """Rank ``rank``'s ``batch_size`` samples of step ``step``: ``(dense, sparse, labels)``."""
        g = torch.Generator().manual_seed(self.config.seed * 1_000_003 + step * world + rank)
        dense = torch.randn(batch_size, self.config.num_dense, generator=g)
        ids: List[torch.Tensor] = []
        logit = dense @ self._dense_weight
        for f in range(len(self.config.features)):
            fid = self._ids(self._ranks(batch_size, g), f, step)
            ids.append(fid)
            logit = logit + 1.5 * self._latent(fid)
        labels = torch.bernoulli(torch.sigmoid(logit), generator=g)
        sparse = KeyedJaggedTensor(
            keys=list(self.config.features),
            values=torch.cat(ids),
            lengths=torch.ones(len(ids) * batch_size, dtype=torch.int64),
        )
        return dense, sparse, labels
