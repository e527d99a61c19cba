"""Device naming: the one rule every layer uses to name the device a table or tensor lives on."""

from __future__ import annotations

from typing import Union

import torch

__all__ = ["normalize_device"]


def normalize_device(device: Union[torch.device, str]) -> torch.device:
    """``cuda`` -> ``cuda:<current>``, so comparisons with tensors' devices (always indexed) hold."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device
