"""``HashSampleAdmissionStrategy``: admit the keys whose hash falls in a fixed fraction.

Every process and every step makes the same decision for a key (no random state), which is what a
consistent sample of the feature space for an experiment needs. Frequencies are ignored.
"""

from __future__ import annotations

from typing import Optional

import torch

from dynamicemb_core.config import DynamicEmbInitializerArgs
from dynamicemb_core.table.hashing import hash_keys_tensor
from dynamicemb_core.types import AdmissionStrategy


class HashSampleAdmissionStrategy(AdmissionStrategy):
    """Admit about ``rate`` of all keys, always the same ones.

    Args:
        rate: fraction of the key space admitted, in (0, 1].
        initializer_args: initializer of keys not admitted (None: the table's own).
    """

    def __init__(
        self, rate: float, initializer_args: Optional[DynamicEmbInitializerArgs] = None
    ) -> None:
        if not 0.0 < rate <= 1.0:
            raise ValueError(f"HashSampleAdmissionStrategy: rate must be in (0, 1], got {rate}")
        self.rate = rate
        self.initializer_args = initializer_args

    def admit(self, keys: torch.Tensor, frequencies: torch.Tensor) -> torch.Tensor:
        if keys.dim() != 1 or frequencies.shape != keys.shape:
            raise ValueError(
                f"HashSampleAdmissionStrategy: keys and frequencies must be 1-D of one length, got "
                f"{tuple(keys.shape)} and {tuple(frequencies.shape)}"
            )
        # top 53 bits of the hash as a uniform number in [0, 1)
        unit = ((hash_keys_tensor(keys) >> 11) & ((1 << 53) - 1)).to(torch.float64) / float(1 << 53)
        return unit < self.rate

    def get_initializer_args(self) -> Optional[DynamicEmbInitializerArgs]:
        return self.initializer_args
