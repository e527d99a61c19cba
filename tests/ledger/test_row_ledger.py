"""The row ledger over the paths that move rows (design/row-ledger.md), default matrix.

World 1 and 2 (gloo), two tables of one shape, TIMESTAMP, EBC; each run also reloads its dump at
the other world size (N -> M). The full matrix is in test_row_ledger_matrix.py (slow).
"""

from __future__ import annotations

import pytest

from tests.ledger.scenario import Case, run_reload, run_scenario
from tests.shard.dist_harness import run_workers


@pytest.mark.parametrize(("world", "reload_world"), [(1, 2), (2, 1)])
def test_every_move_keeps_every_row(tmp_path, world: int, reload_world: int) -> None:
    case = Case(export=world == 1)
    run_workers(run_scenario, case, str(tmp_path), world=world)
    run_workers(run_reload, case, str(tmp_path), world=reload_world)


@pytest.mark.gpu
@pytest.mark.parametrize("world", [1, 2])
def test_every_move_keeps_every_row_on_cuda(tmp_path, world: int) -> None:
    """The same moves with the tables on the GPU (one a rank, NCCL); the lead runs it there."""
    import torch

    if torch.cuda.device_count() < world:
        pytest.skip(f"needs {world} CUDA devices, found {torch.cuda.device_count()}")
    case = Case(export=True, device="cuda")
    run_workers(run_scenario, case, str(tmp_path), world=world, backend="nccl")
    reload = 3 - world if torch.cuda.device_count() >= 3 - world else world
    run_workers(run_reload, case, str(tmp_path), world=reload, backend="nccl")
