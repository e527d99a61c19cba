"""The few collectives checkpointing needs, each a no-op in a single process.

Gloo moves CPU tensors and NCCL CUDA tensors, so tensors are staged on the device the process group's
backend expects and returned on the CPU.
"""

from __future__ import annotations

from typing import Any, List, Optional

import torch
import torch.distributed as dist

__all__ = [
    "barrier",
    "broadcast_object",
    "gather_rows",
    "global_rank",
    "group_rank",
    "group_size",
]


def _active() -> bool:
    return dist.is_available() and dist.is_initialized()


def global_rank() -> int:
    """This process's rank in WORLD (0 without torch.distributed)."""
    return dist.get_rank() if _active() else 0


def group_rank(pg: Optional[dist.ProcessGroup]) -> int:
    """Rank inside ``pg`` (WORLD when None); 0 without torch.distributed."""
    return dist.get_rank(pg) if _active() else 0


def group_size(pg: Optional[dist.ProcessGroup]) -> int:
    """Size of ``pg`` (WORLD when None); 1 without torch.distributed."""
    return dist.get_world_size(pg) if _active() else 1


def barrier(pg: Optional[dist.ProcessGroup]) -> None:
    """Wait for every rank of ``pg``; nothing to wait for in one process."""
    if _active() and group_size(pg) > 1:
        dist.barrier(group=pg)


def broadcast_object(obj: Any, pg: Optional[dist.ProcessGroup]) -> Any:
    """``obj`` of ``pg``'s rank 0 on every rank of ``pg`` (a decision every rank must act on alike)."""
    if not _active() or group_size(pg) == 1:
        return obj
    holder = [obj]
    src = dist.get_global_rank(pg, 0) if pg is not None else 0
    if "nccl" in str(dist.get_backend(pg)).lower():
        dist.broadcast_object_list(holder, src=src, group=pg, device=_staging_device(pg))
    else:
        dist.broadcast_object_list(holder, src=src, group=pg)
    return holder[0]


def _staging_device(pg: Optional[dist.ProcessGroup]) -> torch.device:
    backend = dist.get_backend(pg)
    if "nccl" in str(backend).lower():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def gather_rows(tensors: List[torch.Tensor], pg: Optional[dist.ProcessGroup]) -> List[torch.Tensor]:
    """All-gather row-aligned tensors of this rank's length and concatenate them in rank order.

    Args:
        tensors: tensors sharing their first dimension n (n may differ between ranks); any dtype.
        pg: the group to gather over; None without distribution returns the inputs on the CPU.

    Returns:
        The same tensors, each the concatenation over ranks, on the CPU.
    """
    if not _active() or group_size(pg) == 1:
        return [t.cpu() for t in tensors]
    device = _staging_device(pg)
    world = group_size(pg)
    n = torch.tensor([tensors[0].shape[0] if tensors else 0], dtype=torch.int64, device=device)
    sizes = [torch.zeros_like(n) for _ in range(world)]
    dist.all_gather(sizes, n, group=pg)
    counts = [int(s.item()) for s in sizes]
    longest = max(counts)
    out = []
    for t in tensors:
        padded = torch.zeros((longest,) + tuple(t.shape[1:]), dtype=t.dtype, device=device)
        padded[: t.shape[0]] = t.to(device)
        parts = [torch.empty_like(padded) for _ in range(world)]
        dist.all_gather(parts, padded, group=pg)
        out.append(torch.cat([p[:c] for p, c in zip(parts, counts, strict=True)]).cpu())
    return out
