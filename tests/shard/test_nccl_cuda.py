"""The sharded models of the gloo tests, on CUDA under NCCL (world size 1, the GPU machine).

The same oracle as test_sharded_oracle / test_mixed_model: outputs at every step and the final rows
(embedding and optimizer state) of the dynamic tables equal an unsharded TorchRec twin trained with
FBGEMM's exact optimizers, here with the sharded model's tables, input dist and fused update on the
GPU. Native tables beside the dynamic one need FBGEMM's CUDA build (the CPU build has no CUDA
kernels for KeyedJaggedTensor.permute or TBE), so the GPU machine carries it.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from dist_harness import run_workers
from test_mixed_model import _all as mixed_all
from test_sharded_oracle import (
    DIST_TYPES,
    HYPER,
    OPTIMIZERS,
    STEPS,
    _configs,
    dynamic_constraints,
)

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here"),
]


def _cuda_cases(rank: int, world: int, pooled: bool) -> None:
    from dist_harness import dynamic_kernels, kernel_device, train_against_twin

    device = torch.device("cuda", rank)
    for dist_type, optimizer in itertools.product(DIST_TYPES, OPTIMIZERS):
        configs = _configs(pooled)
        constraints = dynamic_constraints(configs, dist_type)
        try:
            model = train_against_twin(
                rank, world, pooled, configs, constraints, optimizer, HYPER, STEPS, device=device
            )
        except Exception as err:
            raise AssertionError(f"dist_type={dist_type} optimizer={optimizer}: {err}") from err
        kernels = dynamic_kernels(model)
        assert kernels and all(kernel_device(k).type == "cuda" for k, _ in kernels.values())


@pytest.mark.parametrize("pooled", [True, False], ids=["ebc", "ec"])
def test_sharded_twin_oracle_on_cuda_under_nccl(pooled: bool) -> None:
    run_workers(_cuda_cases, pooled, world=1, backend="nccl")


@pytest.mark.parametrize("pooled", [True, False], ids=["ebc", "ec"])
def test_dynamic_and_native_tables_train_together_on_cuda(pooled: bool) -> None:
    run_workers(mixed_all, pooled, "cuda", world=1, backend="nccl")
