"""Every dynamic table's counters, occupancy and eviction rate, written to TensorBoard.

:class:`TableMetricsWriter` reads :func:`dynamicemb_core.table_metrics` (hits, misses, placed,
evicted and unplaced keys since the start) and each table's size and capacity every ``every``
steps, and writes them as scalars of a ``torch.utils.tensorboard.SummaryWriter``, tagged
``<prefix>/<collection>/<table>/<name>``, where ``name`` is one of :data:`SCALARS`. Open the log
with ``tensorboard --logdir <log_dir>``.

Under sharding each rank holds its own shards; given a process group, the writer sums the counts,
sizes and capacities over it (a collective, so every rank must call :meth:`step`) and only the
group's rank 0 writes a log.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, List, Optional, Union

import torch.distributed as dist
from torch import nn

if TYPE_CHECKING:
    from torch.utils.tensorboard import SummaryWriter

__all__ = ["COUNTERS", "SCALARS", "TableMetricsWriter", "table_snapshot"]

# The placement counters of :func:`dynamicemb_core.table_metrics`, cumulative since the start.
COUNTERS = ("hits", "misses", "placed", "evicted", "unplaced")
# Every scalar written per table: the counters, then
#   size, capacity: keys stored and device slots now;
#   occupancy: size / capacity;
#   eviction_rate: keys evicted per step since the previous write (the first write: since step 0);
#   hit_rate: hits / (hits + misses) since the start.
SCALARS = (*COUNTERS, "size", "capacity", "occupancy", "eviction_rate", "hit_rate")

Snapshot = Dict[str, Dict[str, Dict[str, int]]]


def table_snapshot(model: nn.Module, group: Optional[dist.ProcessGroup] = None) -> Snapshot:
    """``{collection: {table: {counter..., "size", "capacity": int}}}`` of every dynamic table.

    The counters are :func:`dynamicemb_core.table_metrics`'s; ``size`` and ``capacity`` are the
    table's keys stored and device slots. With ``group``, every number is summed over its ranks.
    """
    from dynamicemb_core.checkpoint.discovery import find_tables
    from dynamicemb_core.lookup.table_metrics import table_metrics

    counters = table_metrics(model)
    stats: Dict[int, Dict[str, Dict[str, Any]]] = {}
    snapshot: Snapshot = {}
    for handle in find_tables(model, None):
        owner = handle.owner
        if owner is None:
            continue
        if id(owner) not in stats:
            stats[id(owner)] = {s["name"]: s for s in owner.table_stats()}
        table = stats[id(owner)][handle.name]
        row = dict(counters[handle.collection][handle.name])
        row["size"], row["capacity"] = int(table["size"]), int(table["capacity"])
        snapshot.setdefault(handle.collection, {})[handle.name] = row
    if group is not None:
        # Gathered as objects, not one all_reduce: under table-wise sharding a rank holds only some
        # tables, so the ranks' lists differ.
        gathered: List[Optional[Snapshot]] = [None] * dist.get_world_size(group)
        dist.all_gather_object(gathered, snapshot, group=group)
        snapshot = {}
        for part in gathered:
            for collection, rows in (part or {}).items():
                for name, counts in rows.items():
                    into = snapshot.setdefault(collection, {}).setdefault(name, {})
                    for key, value in counts.items():
                        into[key] = into.get(key, 0) + value
    return snapshot


class TableMetricsWriter:
    """Write every dynamic table's metrics to TensorBoard every ``every`` steps.

    Args:
        log_dir: a folder for a new ``SummaryWriter``, or a writer to use (not closed by
            :meth:`close`).
        every: write at the steps that are multiples of it (:meth:`step`); at least 1.
        prefix: the first part of every tag.
        group: sum over this process group's ranks (every rank calls :meth:`step`); only its rank
            0 writes. None: this process's tables only.

    Raises:
        ValueError: when ``every`` is below 1.
    """

    def __init__(
        self,
        log_dir: Union[str, "SummaryWriter"],
        every: int = 100,
        prefix: str = "dynamicemb",
        group: Optional[dist.ProcessGroup] = None,
    ) -> None:
        if every < 1:
            raise ValueError(f"TableMetricsWriter: every must be at least 1, got {every}")
        self.every = every
        self.prefix = prefix.rstrip("/")
        self.group = group
        self._owns_writer = isinstance(log_dir, str)
        self.writer: Optional["SummaryWriter"] = None
        if group is None or dist.get_rank(group) == 0:
            if isinstance(log_dir, str):
                from torch.utils.tensorboard import SummaryWriter

                self.writer = SummaryWriter(log_dir=log_dir)
            else:
                self.writer = log_dir
        self._last_step = 0
        self._last_evicted: Dict[tuple, int] = {}

    def step(self, model: nn.Module, step: int) -> Optional[Dict[str, float]]:
        """Write at a multiple of ``every`` (see :meth:`write`); None at other steps."""
        if step % self.every != 0:
            return None
        return self.write(model, step)

    def write(self, model: nn.Module, step: int) -> Dict[str, float]:
        """Write every table's scalars (:data:`SCALARS`) at global step ``step``; return them by tag.

        Every rank of ``group`` returns the same values; only rank 0 writes them.
        """
        snapshot = table_snapshot(model, self.group)
        steps = max(step - self._last_step, 1)
        scalars: Dict[str, float] = {}
        for collection, tables in snapshot.items():
            for table, row in tables.items():
                base = "/".join(p for p in (self.prefix, collection, table) if p)
                for name in (*COUNTERS, "size", "capacity"):
                    scalars[f"{base}/{name}"] = float(row[name])
                capacity = row["capacity"]
                scalars[f"{base}/occupancy"] = row["size"] / capacity if capacity else 0.0
                previous = self._last_evicted.get((collection, table), 0)
                # a counter below its last value was reset (table_metrics(reset=True)): count anew
                evicted = (
                    row["evicted"] - previous if row["evicted"] >= previous else row["evicted"]
                )
                scalars[f"{base}/eviction_rate"] = evicted / steps
                looked_up = row["hits"] + row["misses"]
                scalars[f"{base}/hit_rate"] = row["hits"] / looked_up if looked_up else 0.0
                self._last_evicted[(collection, table)] = row["evicted"]
        self._last_step = step
        if self.writer is not None:
            for tag, value in scalars.items():
                self.writer.add_scalar(tag, value, global_step=step)
            self.writer.flush()
        return scalars

    def add_scalar(self, tag: str, value: float, step: int) -> None:
        """Write one more scalar (a loss, a throughput) to the same log, on the writing rank."""
        if self.writer is not None:
            self.writer.add_scalar(tag, value, global_step=step)

    def close(self) -> None:
        """Flush; close the writer when this object made it."""
        if self.writer is not None:
            self.writer.flush()
            if self._owns_writer:
                self.writer.close()
