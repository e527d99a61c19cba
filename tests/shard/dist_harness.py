"""Helpers for the 2-process gloo tests: launcher, sharded/unsharded model builders, reference optimizer.

The reference optimizer is the oracle for the fused update: FBGEMM's exact optimizers written out on
dense rows (only the rows a batch touched move; Adam's bias correction uses the global step), applied
to the gradient an unsharded TorchRec module computes.
"""

from __future__ import annotations

import os
import socket
import sys
import time
import traceback
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.types import ShardingEnv
from torchrec.modules.embedding_configs import BaseEmbeddingConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from dynamicemb_core.planner import DynamicEmbeddingShardingPlanner
from dynamicemb_core.planner.planner import default_topology
from dynamicemb_core.shard import (
    BatchedDynamicEmbeddingKernel,
    DynamicEmbeddingBagCollectionSharder,
    DynamicEmbeddingCollectionSharder,
)

WORLD_SIZE = 2
CPU = torch.device("cpu")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(
    rank: int,
    world: int,
    port: int,
    backend: str,
    fn: Callable[..., None],
    args: Tuple[Any, ...],
) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    if backend == "nccl":
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, rank=rank, world_size=world)
    try:
        fn(rank, world, *args)
    except BaseException as err:
        dist.destroy_process_group()
        # the parent prints the child's traceback; add the rank so failures are attributable
        raise RuntimeError(f"rank {rank} failed:\n{traceback.format_exc()}") from err
    # Success: wait for the peer, then leave without running C++ static destructors. Tearing down
    # gloo's and OpenMP's threads at interpreter exit intermittently aborted a worker here with
    # "terminate called without an active exception" (SIGABRT) after its test had passed.
    dist.barrier()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def run_workers(
    fn: Callable[..., None],
    *args: Any,
    world: int = WORLD_SIZE,
    timeout: float = 240.0,
    backend: str = "gloo",
) -> None:
    """Run ``fn(rank, world, *args)`` in ``world`` spawned processes; raise if any fails or hangs.

    ``backend`` is the process group's: gloo on CPU, nccl with one CUDA device a rank.

    The free port is chosen before the workers bind it, so another process on the machine can take
    it in between: that one failure (and only it) is retried on a new port.
    """
    try:
        _run_once(fn, args, world, timeout, backend)
    except mp.ProcessRaisedException as err:
        if "address already in use" not in str(err).lower():
            raise
        _run_once(fn, args, world, timeout, backend)


def _run_once(
    fn: Callable[..., None], args: Tuple[Any, ...], world: int, timeout: float, backend: str
) -> None:
    ctx = mp.spawn(_worker, args=(world, free_port(), backend, fn, args), nprocs=world, join=False)
    deadline = time.monotonic() + timeout
    while not ctx.join(timeout=1.0):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
            raise TimeoutError(f"{getattr(fn, '__name__', fn)} did not finish within {timeout} s")


class Wrapper(nn.Module):
    """A model holding one collection; returns its output as tensors (pooled) or per-feature rows."""

    def __init__(self, collection: nn.Module) -> None:
        super().__init__()
        self.coll = collection
        self.pooled = isinstance(collection, EmbeddingBagCollection)

    def forward(self, kjt: KeyedJaggedTensor) -> Any:
        out = self.coll(kjt)  # sharded: a LazyAwaitable of the same result
        if self.pooled:
            return out.values()
        return {f: out[f] for f in out.keys()}  # EmbeddingCollection: {feature: JaggedTensor}


def make_collection(
    pooled: bool, configs: List[BaseEmbeddingConfig], device: torch.device, weighted: bool = False
) -> nn.Module:
    """An EBC (``weighted``: it takes per-id weights, SUM pooling) or an EC."""
    if pooled:
        return EmbeddingBagCollection(tables=configs, device=device, is_weighted=weighted)
    return EmbeddingCollection(tables=configs, device=device)


def shard_model(
    pooled: bool,
    configs: List[BaseEmbeddingConfig],
    constraints: Dict[str, Any],
    fused_params: Dict[str, Any],
    world: int,
    device: torch.device = CPU,
    weighted: bool = False,
    sharder_kwargs: Optional[Dict[str, Any]] = None,
) -> DistributedModelParallel:
    """Plan with our planner and wrap in DMP, as a user would (collection built on meta).

    ``sharder_kwargs``: more arguments of the sharder (e.g. ``use_index_dedup``)."""
    model = Wrapper(make_collection(pooled, configs, torch.device("meta"), weighted))
    sharder_cls = (
        DynamicEmbeddingBagCollectionSharder if pooled else DynamicEmbeddingCollectionSharder
    )
    sharders = [sharder_cls(fused_params=dict(fused_params), **(sharder_kwargs or {}))]
    planner = DynamicEmbeddingShardingPlanner(
        eb_configs=configs, topology=default_topology(world, device.type), constraints=constraints
    )
    plan = planner.collective_plan(model, sharders, dist.GroupMember.WORLD)
    return DistributedModelParallel(
        model,
        env=ShardingEnv.from_process_group(dist.GroupMember.WORLD),
        device=device,
        plan=plan,
        sharders=sharders,
    )


def dynamic_kernels(model: nn.Module) -> Dict[str, Tuple[BatchedDynamicEmbeddingKernel, int]]:
    """table name -> (kernel holding it on this rank, its index in the kernel)."""
    found = {}
    for m in model.modules():
        if isinstance(m, BatchedDynamicEmbeddingKernel):
            for i, name in enumerate(m.table_names):
                found[name] = (m, i)
    return found


def kernel_device(kernel: BatchedDynamicEmbeddingKernel) -> torch.device:
    """The device a dynamic kernel's tables live on."""
    return kernel.emb_module.device


def global_batch(
    step: int,
    features: List[str],
    num_embeddings: Dict[str, int],
    batch: int,
    max_len: int = 3,
    weighted: bool = False,
) -> KeyedJaggedTensor:
    """The step's whole batch (all ranks' samples), the same on every process; ``weighted``: with
    a weight in [0.5, 1.5) per id."""
    g = torch.Generator().manual_seed(1000 + step)
    lengths = torch.randint(1, max_len + 1, (len(features), batch), generator=g)
    values = torch.cat(
        [
            torch.randint(0, num_embeddings[f], (int(lengths[i].sum()),), generator=g)
            for i, f in enumerate(features)
        ]
    )
    weights = torch.rand(values.shape, generator=g) + 0.5 if weighted else None
    return KeyedJaggedTensor(
        keys=features, values=values, lengths=lengths.view(-1), weights=weights
    )


def rank_slice(kjt: KeyedJaggedTensor, rank: int, world: int) -> KeyedJaggedTensor:
    """Samples ``[rank * B/world, (rank+1) * B/world)`` of every feature."""
    b = kjt.stride() // world
    lengths, values, weights = [], [], []
    for key in kjt.keys():
        jt = kjt[key]
        offs = jt.offsets()
        lo, hi = int(offs[rank * b]), int(offs[(rank + 1) * b])
        lengths.append(jt.lengths()[rank * b : (rank + 1) * b])
        values.append(jt.values()[lo:hi])
        if jt.weights_or_none() is not None:
            weights.append(jt.weights()[lo:hi])
    return KeyedJaggedTensor(
        keys=kjt.keys(),
        values=torch.cat(values),
        lengths=torch.cat(lengths),
        weights=torch.cat(weights) if weights else None,
    )


@dataclass
class ReferenceOptimizer:
    """FBGEMM's exact row-sparse optimizers on a dense table (the oracle for the fused update)."""

    kind: str  # exact_sgd | exact_adagrad | exact_row_wise_adagrad | adam
    lr: float
    eps: float
    beta1: float
    beta2: float
    state: Optional[Dict[str, Any]] = None
    step_count: int = 0
    round_to: Optional[torch.dtype] = None  # a half-precision table: rows rounded after each step

    def step(self, weight: torch.Tensor, grad: torch.Tensor, rows: torch.Tensor) -> None:
        """Update ``weight[rows]`` in place from ``grad[rows]``; called once per training step."""
        self.step_count += 1
        if self.state is None:
            self.state = {
                "m": torch.zeros_like(weight),
                "v": torch.zeros_like(weight),
                "r": torch.zeros(weight.shape[0], dtype=weight.dtype),
            }
        g = grad[rows]
        w = weight[rows]
        if self.kind == "exact_sgd":
            w = w - self.lr * g
        elif self.kind == "exact_adagrad":
            self.state["v"][rows] += g * g
            w = w - self.lr * g / (self.state["v"][rows].sqrt() + self.eps)
        elif self.kind == "exact_row_wise_adagrad":
            self.state["r"][rows] += (g * g).mean(dim=1)
            w = w - self.lr * g / (self.state["r"][rows].sqrt() + self.eps)[:, None]
        elif self.kind == "adam":
            m = self.state["m"][rows] * self.beta1 + (1 - self.beta1) * g
            v = self.state["v"][rows] * self.beta2 + (1 - self.beta2) * g * g
            self.state["m"][rows], self.state["v"][rows] = m, v
            m_hat = m / (1 - self.beta1**self.step_count)
            v_hat = v / (1 - self.beta2**self.step_count)
            w = w - self.lr * m_hat / (v_hat.sqrt() + self.eps)
        else:
            raise ValueError(self.kind)
        weight[rows] = w if self.round_to is None else w.to(self.round_to).to(w.dtype)

    def state_row(self, row: torch.Tensor) -> torch.Tensor:
        """The stored optimizer state of rows, in the layout our value rows use after the embedding."""
        if self.state is None:
            raise RuntimeError("no step yet")
        if self.kind == "exact_sgd":
            return torch.zeros(len(row), 0)
        if self.kind == "exact_adagrad":
            return self.state["v"][row]
        if self.kind == "exact_row_wise_adagrad":
            return self.state["r"][row][:, None]
        return torch.cat([self.state["m"][row], self.state["v"][row]], dim=1)


# -- the oracle run -------------------------------------------------------------------------------


def _twin_weight(twin: nn.Module, pooled: bool, name: str) -> nn.Parameter:
    return (twin.embedding_bags if pooled else twin.embeddings)[name].weight


def _flatten(out: Any, pooled: bool) -> torch.Tensor:
    """Pooled output as is; sequence output as the rows of every feature, features sorted."""
    if pooled:
        return out
    return torch.cat([out[f].values() for f in sorted(out)], dim=0)


def _local_rows(
    flat: torch.Tensor, pooled: bool, kjt: KeyedJaggedTensor, rank: int, world: int
) -> torch.Tensor:
    """The rows of a whole-batch output (flattened by ``_flatten``) that are ``rank``'s samples."""
    b = kjt.stride() // world
    if pooled:
        return flat[rank * b : (rank + 1) * b]
    parts, base = [], 0
    for f in sorted(kjt.keys()):
        offs = kjt[f].offsets()
        parts.append(flat[base + int(offs[rank * b]) : base + int(offs[(rank + 1) * b])])
        base += int(offs[-1])
    return torch.cat(parts, dim=0)


def mirror_dynamic_rows(
    model: nn.Module, twin: nn.Module, pooled: bool, rank: int, world: int
) -> None:
    """Write the twin's initial rows (and fresh optimizer state) into the owners' dynamic tables."""
    from dynamicemb_core.optim import initial_state_value
    from dynamicemb_core.shard.ownership import owner_rank

    for name, (kernel, t) in dynamic_kernels(model).items():
        emb = kernel.emb_module
        weight = _twin_weight(twin, pooled, name).detach()
        keys = torch.arange(weight.shape[0])
        mine = keys[
            owner_rank(keys, kernel.dist_types[t], world, num_embeddings=weight.shape[0]) == rank
        ]
        tier = emb.tables[t]
        spec = tier.tables[0]
        rows = torch.empty(len(mine), spec.row_width)
        rows[:, : weight.shape[1]] = weight[mine]
        rows[:, weight.shape[1] :] = initial_state_value(emb._kind, emb.optimizer_args)
        scores = torch.zeros(len(mine), spec.num_scores, dtype=torch.int64)
        dev = kernel_device(kernel)
        tier.insert(0, mine.to(dev), rows.to(dev), scores.to(dev))


def mirror_native_rows(model: nn.Module, twin: nn.Module) -> int:
    """Copy the twin's weights into the local shards of native sharded tables; returns tables copied."""
    from torch.distributed._shard.sharded_tensor import ShardedTensor

    twin_state = twin.state_dict()
    copied = 0
    for key, value in model.state_dict().items():
        if not isinstance(value, ShardedTensor):
            continue
        full = twin_state[key.split("coll.", 1)[1]]
        for shard in value.local_shards():
            (r0, c0), (nr, nc) = shard.metadata.shard_offsets, shard.metadata.shard_sizes
            shard.tensor.detach().copy_(full[r0 : r0 + nr, c0 : c0 + nc])
        copied += 1
    return copied


def train_against_twin(
    rank: int,
    world: int,
    pooled: bool,
    configs: List[BaseEmbeddingConfig],
    constraints: Dict[str, Any],
    optimizer: str,
    hyper: Dict[str, float],
    steps: int,
    batch_per_rank: int = 4,
    device: torch.device = CPU,
    weighted: bool = False,
    sharder_kwargs: Optional[Dict[str, Any]] = None,
) -> DistributedModelParallel:
    """Train the sharded model and its unsharded twin side by side and compare at every step.

    The sharded model lives on ``device``; the twin and the reference optimizer stay on the CPU.
    ``weighted``: both are weighted EBCs fed a weight per id (the ids' per-sample weights).

    Outputs must match at every step (they depend on every table's updated rows, native ones too);
    at the end each dynamic table's rows (embedding and optimizer state) must equal the twin's, and
    its keys must be stored only on their owner rank.
    """
    from fbgemm_gpu.split_embedding_configs import EmbOptimType

    from dynamicemb_core.shard.ownership import owner_rank

    model = shard_model(
        pooled,
        configs,
        constraints,
        {"optimizer": EmbOptimType(optimizer), **hyper},
        world,
        device,
        weighted,
        sharder_kwargs,
    )
    torch.manual_seed(0)
    twin = make_collection(pooled, configs, torch.device("cpu"), weighted)
    mirror_dynamic_rows(model, twin, pooled, rank, world)
    mirror_native_rows(model, twin)
    refs = {
        c.name: ReferenceOptimizer(
            optimizer, hyper["learning_rate"], hyper["eps"], hyper["beta1"], hyper["beta2"]
        )
        for c in configs
    }
    table_of = {f: c for c in configs for f in c.feature_names}
    for step in range(steps):
        kjt = global_batch(
            step,
            sorted(table_of),
            {f: c.num_embeddings for f, c in table_of.items()},
            batch_per_rank * world,
            weighted=weighted,
        )
        out = _flatten(model(rank_slice(kjt, rank, world).to(device)), pooled)
        full = _flatten(twin(kjt) if not pooled else twin(kjt).values(), pooled)
        target = torch.randn(full.shape, generator=torch.Generator().manual_seed(step))
        torch.testing.assert_close(
            out.cpu(), _local_rows(full, pooled, kjt, rank, world), atol=1e-5, rtol=1e-5
        )
        (out * _local_rows(target, pooled, kjt, rank, world).to(device)).sum().backward()
        model.fused_optimizer.step()
        (full * target).sum().div(world).backward()
        with torch.no_grad():
            for c in configs:
                w = _twin_weight(twin, pooled, c.name)
                touched = torch.unique(torch.cat([kjt[f].values() for f in c.feature_names]))
                refs[c.name].step(w.data, w.grad, touched)
                w.grad = None

    for name, (kernel, t) in dynamic_kernels(model).items():
        tier = kernel.emb_module.tables[t]
        weight = _twin_weight(twin, pooled, name).detach()
        keys = torch.arange(weight.shape[0])
        owned = (
            owner_rank(keys, kernel.dist_types[t], world, num_embeddings=weight.shape[0]) == rank
        )
        found, rows, _ = (t.cpu() for t in tier.find(0, keys.to(kernel_device(kernel))))
        assert torch.equal(found, owned), f"table {name!r}: keys stored off their owner rank"
        assert tier.size(0) == int(owned.sum())
        dim = weight.shape[1]
        torch.testing.assert_close(rows[owned][:, :dim], weight[keys[owned]], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(
            rows[owned][:, dim:], refs[name].state_row(keys[owned]), atol=1e-5, rtol=1e-5
        )
    return model
