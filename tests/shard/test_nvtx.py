"""NVTX ranges: the step's ops and the DMP stages are marked with CUDA, and cost nothing without it.

The ranges are ``torch.cuda.nvtx`` pushes and pops; here the two functions are replaced by a recorder,
so the names are checked without nsys (on the CPU by switching the module's flag on, as CUDA would).
"""

from __future__ import annotations

from typing import List

import pytest
import torch
from dist_harness import run_workers, shard_model
from fbgemm_gpu.split_embedding_configs import EmbOptimType
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

import dynamicemb_core.nvtx as nvtx
from dynamicemb_core import DynamicEmbPoolingMode, DynamicEmbTableOptions
from dynamicemb_core.lookup import BatchedDynamicEmbeddingTables
from dynamicemb_core.planner import DynamicEmbParameterConstraints

OPS = {
    "dynamicemb::unique",
    "dynamicemb::find_or_insert",
    "dynamicemb::gather",
    "dynamicemb::reduce_update",
}
STAGES = {"dynamicemb::input_dist", "dynamicemb::lookup", "dynamicemb::output_dist"}


def _record(pushed: List[str], depth: List[int]) -> None:
    def push(name: str) -> None:
        pushed.append(name)
        depth[0] += 1

    def pop() -> None:
        depth[0] -= 1

    torch.cuda.nvtx.range_push = push  # type: ignore[assignment]
    torch.cuda.nvtx.range_pop = pop  # type: ignore[assignment]


def test_without_cuda_the_ranges_are_free() -> None:
    assert nvtx.NVTX_ENABLED == torch.cuda.is_available()
    if nvtx.NVTX_ENABLED:
        pytest.skip("CUDA is present: ranges are on")

    def f() -> int:
        return 1

    assert nvtx.ranged("x")(f) is f  # the function itself: no wrapper
    assert nvtx.nvtx_range("a") is nvtx.nvtx_range("b")  # one shared no-op context


def test_ranged_and_nvtx_range_push_and_pop(monkeypatch: pytest.MonkeyPatch) -> None:
    pushed: List[str] = []
    depth = [0]
    monkeypatch.setattr(nvtx, "NVTX_ENABLED", True)
    monkeypatch.setattr(
        torch.cuda.nvtx,
        "range_push",
        lambda n: (pushed.append(n), depth.__setitem__(0, depth[0] + 1)),
    )
    monkeypatch.setattr(torch.cuda.nvtx, "range_pop", lambda: depth.__setitem__(0, depth[0] - 1))

    @nvtx.ranged("outer")
    def boom() -> None:
        with nvtx.nvtx_range("inner"):
            raise ValueError("x")

    with pytest.raises(ValueError):
        boom()
    assert pushed == ["outer", "inner"] and depth[0] == 0


def _stages(rank: int, world: int) -> None:
    pushed: List[str] = []
    depth = [0]
    nvtx.NVTX_ENABLED = True  # before the model is built: the stage hooks are set up then
    _record(pushed, depth)
    configs = [
        EmbeddingBagConfig(
            name=f"t{i}", embedding_dim=4, num_embeddings=100, feature_names=[f"f{i}"]
        )
        for i in range(2)
    ]
    constraints = {
        c.name: DynamicEmbParameterConstraints(
            use_dynamicemb=True, dynamicemb_options=DynamicEmbTableOptions()
        )
        for c in configs
    }
    model = shard_model(
        True, configs, constraints, {"optimizer": EmbOptimType.EXACT_SGD, "learning_rate": 0.1}, 1
    )
    kjt = KeyedJaggedTensor(keys=["f0", "f1"], values=torch.arange(8), lengths=torch.full((4,), 2))
    pushed.clear()
    model(kjt).sum().backward()
    assert STAGES <= set(pushed), pushed
    assert depth[0] == 0, "unbalanced ranges"


def test_dmp_stages_are_marked() -> None:
    run_workers(_stages, world=1)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here")
def test_step_ops_are_marked_on_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    pushed: List[str] = []
    depth = [0]
    monkeypatch.setattr(
        torch.cuda.nvtx,
        "range_push",
        lambda n: (pushed.append(n), depth.__setitem__(0, depth[0] + 1)),
    )
    monkeypatch.setattr(torch.cuda.nvtx, "range_pop", lambda: depth.__setitem__(0, depth[0] - 1))
    module = BatchedDynamicEmbeddingTables(
        [DynamicEmbTableOptions(dim=8, max_capacity=1024, local_hbm_for_values=1 << 20)],
        ["t"],
        [0],
        DynamicEmbPoolingMode.SUM,
        EmbOptimType.EXACT_SGD,
        "cuda",
    )
    module(torch.arange(8, device="cuda"), torch.tensor([0, 4, 8], device="cuda")).sum().backward()
    assert OPS <= set(pushed), pushed
    assert depth[0] == 0
