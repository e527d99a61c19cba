"""Fixtures of the lookup tests: the ``device`` parametrization (cpu always, cuda marked gpu)."""

from __future__ import annotations

import pytest
import torch

_DEVICES = ["cpu"]
if torch.cuda.is_available():
    _DEVICES.append(pytest.param("cuda", marks=pytest.mark.gpu))
else:
    _DEVICES.append(
        pytest.param(
            "cuda", marks=[pytest.mark.gpu, pytest.mark.skip(reason="no CUDA device here")]
        )
    )


@pytest.fixture(params=_DEVICES)
def device(request) -> torch.device:
    """Every test body runs on each available device ([cpu] / [cuda])."""
    return torch.device(request.param)
