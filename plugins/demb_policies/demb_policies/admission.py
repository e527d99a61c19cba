"""Probabilistic admission: each sighting of a key admits it with probability ``p``.

A key seen ``f`` times (the counter's accumulated frequency) is admitted with probability
``1 - (1 - p)^f``: a one-off key rarely takes a slot, a recurring one almost surely does, with no hard
threshold to tune per feature. This is the "probabilistic filter" idea of feature admission in
large-scale recommenders (e.g. ByteDance's Monolith paper, section 2.2, arXiv:2209.07663).
"""

from __future__ import annotations

from typing import Dict, Optional

import torch

from dynamicemb_core.config import DynamicEmbInitializerArgs
from dynamicemb_core.types import AdmissionStrategy

__all__ = ["ProbabilisticAdmissionStrategy"]


class ProbabilisticAdmissionStrategy(AdmissionStrategy):
    """Admit a key seen ``f`` times with probability ``1 - (1 - probability)^f``.

    Args:
        probability: per-sighting admission probability in (0, 1].
        seed: seeds one generator per device, for reproducible runs; None draws from torch's
            default generator.
        initializer_args: initializer of keys not admitted (None: the table's own).
    """

    def __init__(
        self,
        probability: float,
        *,
        seed: Optional[int] = None,
        initializer_args: Optional[DynamicEmbInitializerArgs] = None,
    ) -> None:
        if not 0.0 < float(probability) <= 1.0:
            raise ValueError(
                f"ProbabilisticAdmissionStrategy: probability must be in (0, 1], got {probability}"
            )
        self.probability = float(probability)
        self.seed = seed
        self.initializer_args = initializer_args
        self._generators: Dict[torch.device, torch.Generator] = {}

    def _generator(self, device: torch.device) -> Optional[torch.Generator]:
        if self.seed is None:
            return None
        gen = self._generators.get(device)
        if gen is None:
            gen = self._generators[device] = torch.Generator(device=device).manual_seed(self.seed)
        return gen

    def admission_probability(self, frequencies: torch.Tensor) -> torch.Tensor:
        """``1 - (1 - p)^f`` per key (float64); frequencies below 1 give 0."""
        f = frequencies.to(torch.float64).clamp(min=0)
        return -torch.expm1(f * torch.log1p(torch.tensor(-self.probability, dtype=torch.float64)))

    def admit(self, keys: torch.Tensor, frequencies: torch.Tensor) -> torch.Tensor:
        """(n,) bool on the keys' device: which keys to admit."""
        if keys.dim() != 1 or frequencies.shape != keys.shape:
            raise ValueError(
                f"ProbabilisticAdmissionStrategy: keys and frequencies must be 1-D of one length, got "
                f"{tuple(keys.shape)} and {tuple(frequencies.shape)}"
            )
        p = self.admission_probability(frequencies.to(keys.device))
        u = torch.rand(
            keys.numel(),
            generator=self._generator(keys.device),
            device=keys.device,
            dtype=torch.float64,
        )
        return u < p

    def get_initializer_args(self) -> Optional[DynamicEmbInitializerArgs]:
        return self.initializer_args
