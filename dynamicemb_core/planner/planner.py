"""DynamicEmbeddingShardingPlanner: TorchRec's planner plus validation and preparation of dynamic tables.

Construction does all the checking and filling in, before any process allocates a table:

1. ``constraints`` and ``eb_configs`` must agree exactly: every config name appears once and has a
   constraint, and every constraint names a config (errors name the tables).
2. Each dynamic table's options are validated and prepared for one rank
   (:func:`~dynamicemb_core.planner.table_options.prepare_table_options`); the prepared options
   replace ``constraint.dynamicemb_options``.

``plan`` / ``collective_plan`` then run TorchRec's planner with a
:class:`~dynamicemb_core.planner.enumerator.DynamicEmbeddingEnumerator` and turn each dynamic
table's row-wise entry into a :class:`DynamicEmbParameterSharding`. The conversion runs on every rank
after TorchRec's broadcast, so options (which may hold callables) are never pickled.
"""

from __future__ import annotations

import logging
import warnings
from collections import Counter
from typing import Dict, List, Optional, Union

import torch
import torch.distributed as dist
from torch import nn
from torchrec.distributed.planner import EmbeddingShardingPlanner
from torchrec.distributed.planner.types import (
    Enumerator,
    Partitioner,
    PerfModel,
    Proposer,
    Stats,
    StorageReservation,
    Topology,
)
from torchrec.distributed.types import ModuleSharder, ShardingPlan
from torchrec.modules.embedding_configs import BaseEmbeddingConfig

from dynamicemb_core.config import DynamicEmbTableOptions
from dynamicemb_core.planner.constraints import DynamicEmbParameterConstraints
from dynamicemb_core.planner.enumerator import (
    DynamicEmbeddingEnumerator,
    _torchrec_constraints,
)
from dynamicemb_core.planner.parameter_sharding import DynamicEmbParameterSharding
from dynamicemb_core.planner.table_options import prepare_table_options

__all__ = ["DynamicEmbeddingShardingPlanner", "default_topology", "validate_constraints"]

logger = logging.getLogger(__name__)


def validate_constraints(
    eb_configs: List[BaseEmbeddingConfig],
    constraints: Optional[Dict[str, DynamicEmbParameterConstraints]],
) -> None:
    """Check that ``constraints`` and ``eb_configs`` name exactly the same tables, each once.

    Raises:
        ValueError: naming the duplicated, unconstrained or unknown tables.
    """
    names = [c.name for c in eb_configs]
    duplicates = sorted(n for n, k in Counter(names).items() if k > 1)
    if duplicates:
        raise ValueError(f"eb_configs: table names must be unique; repeated: {duplicates}")
    keys = set(constraints or {})
    missing = [n for n in names if n not in keys]
    unknown = sorted(keys - set(names))
    if missing:
        raise ValueError(
            f"constraints: no entry for table(s) {missing} of eb_configs; give every table a "
            f"DynamicEmbParameterConstraints (use_dynamicemb=False for a native TorchRec table)"
        )
    if unknown:
        raise ValueError(
            f"constraints: table(s) {unknown} are not in eb_configs (tables: {sorted(names)})"
        )


def _log_sizing(config: BaseEmbeddingConfig, options: DynamicEmbTableOptions, world: int) -> None:
    """Say each dynamic table's slots and the sizing rule (docs/sizing.md): hash buckets fill
    unevenly, so a table whose num_embeddings equals its distinct ids still evicts some of them."""
    logger.info(
        "table %r: %s slots per rank (num_embeddings %d over %d rank(s)); if num_embeddings is "
        "the number of distinct ids the table must keep, some will be evicted anyway (buckets "
        "fill unevenly): give it 1.5x to 2x those ids (docs/sizing.md)",
        config.name,
        options.max_capacity,
        config.num_embeddings,
        world,
    )


def split_lines(
    options_by_table: Dict[str, DynamicEmbTableOptions],
    sharders: List[ModuleSharder[nn.Module]],
    compute_device: str,
) -> List[str]:
    """Per dynamic table, where its rows will live on each rank: ``device`` / ``host`` rows of its
    ``max_capacity`` under its ``local_hbm_for_values`` (the lookup's rule,
    ``lookup.placement.device_split``), for the sharders' optimizer (its state widens each row)."""
    from dynamicemb_core.lookup.placement import device_split
    from dynamicemb_core.optim import optimizer_kind, row_width
    from dynamicemb_core.types import StorageTableSpec

    optimizer = next(
        (
            (getattr(s, "fused_params", None) or {}).get("optimizer")
            for s in sharders
            if (getattr(s, "fused_params", None) or {}).get("optimizer") is not None
        ),
        None,
    )
    device = torch.device(compute_device)
    lines = []
    for name, o in options_by_table.items():
        dim = int(o.dim or 0)
        width = row_width(optimizer_kind(optimizer), dim, o.training) if optimizer else dim
        spec = StorageTableSpec(
            name=name,
            dim=dim,
            row_width=width,
            dtype=o.embedding_dtype or torch.float32,
            num_scores=o.num_scores,
            capacity=int(o.max_capacity or 0),
        )
        kind, on_device, on_host = device_split(o, spec, device)
        if device.type == "cpu":
            lines.append(
                f"table {name!r}: {kind}, per rank all {on_host} rows in host memory (CPU)"
            )
            continue
        lines.append(
            f"table {name!r}: {kind}, per rank {on_device} rows in {compute_device} memory, "
            f"{on_host} rows in host memory (local_hbm_for_values={int(o.local_hbm_for_values)} "
            f"bytes, rows of {width} floats{'' if optimizer else ', optimizer state not counted'})"
        )
    return lines


def default_topology(world_size: int, compute_device: Optional[str] = None) -> Topology:
    """A TorchRec topology for ``world_size`` ranks on this machine kind (CUDA if present, else CPU)."""
    device = compute_device or ("cuda" if torch.cuda.is_available() else "cpu")
    local = world_size
    if dist.is_initialized():
        from torchrec.distributed.comm import get_local_size

        local = get_local_size(world_size)
    try:  # TorchRec >= 1.8: the factory avoids Topology's direct-construction warning
        from torchrec.distributed.planner.types import (
            KernelConfig,
            TopologyFactory,
            TrainerConfig,
        )

        return TopologyFactory.create_topology(
            TrainerConfig(world_size=world_size, local_world_size=local),
            kernel_config=KernelConfig(compute_device=device),
        )
    except ImportError:  # pragma: no cover - older TorchRec
        return Topology(world_size=world_size, local_world_size=local, compute_device=device)


class DynamicEmbeddingShardingPlanner:
    """Plans a model mixing dynamic and native TorchRec tables.

    Args:
        eb_configs: every TorchRec table config of the model (``EmbeddingConfig`` /
            ``EmbeddingBagConfig``); dynamic tables are sized from these.
        topology: TorchRec topology; default: :func:`default_topology` for the process group's
            world size. The topology's memory budget is for native tables only.
        enumerator: as TorchRec's; default: a :class:`DynamicEmbeddingEnumerator`.
        batch_size, storage_reservation, proposer, partitioner, performance_model, stats, debug:
            as TorchRec's ``EmbeddingShardingPlanner``.
        constraints: one entry per table in ``eb_configs``; ``use_dynamicemb=True`` makes it dynamic.

    Raises:
        ValueError: at construction, naming the table and the value, for any inconsistency or bad
            option (see the module docstring).
    """

    def __init__(
        self,
        eb_configs: List[BaseEmbeddingConfig],
        topology: Optional[Topology] = None,
        batch_size: Optional[int] = None,
        enumerator: Optional[Enumerator] = None,
        storage_reservation: Optional[StorageReservation] = None,
        proposer: Optional[Union[Proposer, List[Proposer]]] = None,
        partitioner: Optional[Partitioner] = None,
        performance_model: Optional[PerfModel] = None,
        stats: Optional[Union[Stats, List[Stats]]] = None,
        constraints: Optional[Dict[str, DynamicEmbParameterConstraints]] = None,
        debug: bool = True,
    ) -> None:
        validate_constraints(eb_configs, constraints)
        assert constraints is not None  # validate_constraints rejects None with any table
        if topology is None:
            if not dist.is_initialized():
                raise ValueError(
                    "DynamicEmbeddingShardingPlanner: pass a topology, or initialize the process "
                    "group first (the world size sizes every dynamic table's shard)"
                )
            topology = default_topology(dist.get_world_size())
        world_size = topology.world_size
        configs = {c.name: c for c in eb_configs}
        # Validate every table before preparing any, so a bad table leaves all options untouched.
        prepared = {
            name: prepare_table_options(
                c.dynamicemb_options or DynamicEmbTableOptions(), configs[name], world_size
            )
            for name, c in constraints.items()
            if getattr(c, "use_dynamicemb", False)
        }
        for name, options in prepared.items():
            constraints[name].dynamicemb_options = options
            _log_sizing(configs[name], options, world_size)
        self._constraints = constraints
        self._dynamic_options = prepared
        self._world_size = world_size
        self._topology = topology
        if enumerator is None:
            enumerator = DynamicEmbeddingEnumerator(
                topology=topology, batch_size=batch_size, constraints=constraints
            )
        elif not isinstance(enumerator, DynamicEmbeddingEnumerator) and prepared:
            warnings.warn(
                "DynamicEmbeddingShardingPlanner: a custom enumerator that is not a "
                "DynamicEmbeddingEnumerator prices dynamic tables as dense ones",
                stacklevel=2,
            )
        self._planner = EmbeddingShardingPlanner(
            topology=topology,
            batch_size=batch_size,
            enumerator=enumerator,
            storage_reservation=storage_reservation,
            proposer=proposer,
            partitioner=partitioner,
            performance_model=performance_model,
            stats=stats,
            constraints=_torchrec_constraints(constraints),
            debug=debug,
        )

    @property
    def dynamic_table_options(self) -> Dict[str, DynamicEmbTableOptions]:
        """Prepared per-rank options of each dynamic table, by table name."""
        return dict(self._dynamic_options)

    def _to_dynamic_plan(self, plan: ShardingPlan) -> ShardingPlan:
        for module_plan in plan.plan.values():
            for name in list(module_plan.keys()):
                options = self._dynamic_options.get(name)
                if options is not None:
                    module_plan[name] = DynamicEmbParameterSharding.from_torchrec(
                        module_plan[name],
                        options,
                        name,
                    )
        return plan

    def _log_splits(self, sharders: List[ModuleSharder[nn.Module]]) -> None:
        """The plan printout's device / host split of each dynamic table (logged at INFO)."""
        device = str(getattr(self._topology, "compute_device", "cpu"))
        for line in split_lines(self._dynamic_options, sharders, device):
            logger.info("%s", line)

    def plan(self, module: nn.Module, sharders: List[ModuleSharder[nn.Module]]) -> ShardingPlan:
        """Plan on this process alone (all ranks must make the same call)."""
        self._log_splits(sharders)
        return self._to_dynamic_plan(self._planner.plan(module, sharders))

    def collective_plan(
        self,
        module: nn.Module,
        sharders: Optional[List[ModuleSharder[nn.Module]]] = None,
        pg: Optional[dist.ProcessGroup] = None,
    ) -> ShardingPlan:
        """Plan on rank 0, broadcast TorchRec's plan, and add the dynamic entries on every rank."""
        if sharders is None:
            from dynamicemb_core.shard.sharders import default_sharders

            sharders = default_sharders()
        self._log_splits(sharders)
        return self._to_dynamic_plan(self._planner.collective_plan(module, sharders, pg))
