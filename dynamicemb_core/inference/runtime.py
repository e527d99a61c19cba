"""Loading a served package: the ops library and the AOTInductor model, nothing else.

This module imports only torch and :mod:`dynamicemb_core.ops.loader` (which finds, or builds once, the
C++ ops library the package calls through the dispatcher). Neither TorchRec nor the training code
(lookup, optimizers, storages, checkpoints) is imported, so a serving process stays small.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

__all__ = ["load_ops", "load_package"]


def load_ops(library: Optional[str] = None) -> str:
    """Load the ``torch.ops.dynamicemb`` library: ``library`` (a ``dynamicemb_ops.so`` path) or the
    cached build of this installation. Returns the path loaded."""
    if library is not None:
        torch.ops.load_library(library)
        return library
    from dynamicemb_core.ops.loader import ensure_loaded

    return str(ensure_loaded())


def load_package(path: str, *, library: Optional[str] = None, device_index: int = -1) -> Any:
    """Load an AOTInductor package exported from an inference collection; call it with tensors.

    Args:
        path: the ``.pt2`` package.
        library: the ops library to load (default: this installation's build).
        device_index: CUDA device for a CUDA package (-1: the current one).
    """
    load_ops(library)
    return torch._inductor.aoti_load_package(path, device_index=device_index)
