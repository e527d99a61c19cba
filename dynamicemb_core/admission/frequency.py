"""FrequencyAdmissionStrategy: admit a key once it has been seen ``threshold`` times."""

from __future__ import annotations

import operator
from typing import Optional

import torch

from dynamicemb_core.config import DynamicEmbInitializerArgs
from dynamicemb_core.types import AdmissionStrategy

__all__ = ["FrequencyAdmissionStrategy"]


class FrequencyAdmissionStrategy(AdmissionStrategy):
    """Admit keys whose accumulated frequency is at least ``threshold``.

    Args:
        threshold: minimum count (>= 0; 0 admits every key, as the seed allows).
        initializer_args: embedding of keys not admitted (None: the table's initializer).
    """

    def __init__(
        self, threshold: int, initializer_args: Optional[DynamicEmbInitializerArgs] = None
    ) -> None:
        try:
            if isinstance(threshold, bool):
                raise TypeError
            value = operator.index(threshold)  # any integer type, nothing that truncates
        except TypeError:
            raise TypeError(
                f"FrequencyAdmissionStrategy: threshold must be an int, got {threshold!r}"
            ) from None
        if value < 0:
            raise ValueError(f"FrequencyAdmissionStrategy: threshold must be >= 0, got {value}")
        self.threshold: int = value
        self.initializer_args = initializer_args

    def admit(self, keys: torch.Tensor, frequencies: torch.Tensor) -> torch.Tensor:
        """(n,) bool: ``frequencies >= threshold`` for (n,) keys and (n,) frequencies."""
        if keys.shape != frequencies.shape:
            raise ValueError(
                "FrequencyAdmissionStrategy.admit: keys and frequencies must have the same shape, "
                f"got {tuple(keys.shape)} and {tuple(frequencies.shape)}"
            )
        return frequencies >= self.threshold

    def get_initializer_args(self) -> Optional[DynamicEmbInitializerArgs]:
        return self.initializer_args
