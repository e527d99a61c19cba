"""Shared fixtures: the ``device`` parametrization every device-agnostic test uses (STYLE rule 17).

``device`` runs a test body on ``cpu`` always and on ``cuda`` as ``pytest.param(..., marks=gpu)``;
on a machine without CUDA the cuda case is skipped with the reason, so ids read ``[cpu]`` /
``[cuda]`` everywhere and ``pytest -m gpu`` selects the CUDA cases on the GPU machine.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

# Test helpers (reference models) import by bare name: make each test folder importable.
_TESTS = Path(__file__).resolve().parent
_ROOT = _TESTS.parent
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

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
def device(request: pytest.FixtureRequest) -> torch.device:
    """The device a test body runs on: cpu, and cuda where available (marked gpu)."""
    return torch.device(request.param)
