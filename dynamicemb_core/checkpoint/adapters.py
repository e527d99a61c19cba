"""Turning a ``BatchedDynamicEmbeddingTables`` (and the shard kernel driving it) into table handles.

This is the only module that knows the batched module's internals: ``tables[t]`` is the table's storage
tier holding it as table id 0, ``dims``, ``table_options``, the optimizer's kind and hyper-parameters.
The checkpoint code works on the *last* tier, the one holding every key: a device (or hybrid) table
directly, or the backing table of a device cache, whose flush and invalidation become the handle's
``flush_cache`` and ``drop_from_cache``.
"""

from __future__ import annotations

from typing import Any, Callable, List, Optional, Tuple

import torch

from dynamicemb_core.checkpoint.types import TableHandle

__all__ = ["handles_for_batched", "set_training_state"]


def _is_slot_storage(tier: Any) -> bool:
    return all(hasattr(tier, a) for a in ("table", "read_rows", "write_rows", "row_blocks"))


_Tier = Tuple[Any, int, Optional[Callable[[], None]], Optional[Callable[[torch.Tensor], None]]]


def _last_tier(name: str, tier: Any) -> _Tier:
    """``(storage, table_id, flush, drop)`` for one table's tier."""
    from dynamicemb_core.storage.table_views import CachedTableView, TableView

    if isinstance(tier, CachedTableView):
        backing = tier.backing
        if not _is_slot_storage(backing):
            raise NotImplementedError(
                f"table '{name}': its keys live in external storage {type(backing).__name__}; slot-based "
                f"checkpoints (DynamicEmbDump, incremental_dump, replay_increment) need a hash-table "
                f"storage. Use the storage's own dump()/load() for it."
            )
        return backing, int(tier.backing_ids[0]), tier.flush, tier.drop_from_cache
    if isinstance(tier, TableView):
        return tier.group, tier.table_id, None, None  # a grouped module's table: the group's id
    if not _is_slot_storage(tier):
        raise NotImplementedError(
            f"table '{name}': storage {type(tier).__name__} holds no hash table; slot-based checkpoints "
            f"need DeviceStorage, HybridStorage or a cache over one"
        )
    return tier, 0, None, None


def handles_for_batched(
    module: Any, collection: str, kernel: Optional[Any] = None
) -> List[TableHandle]:
    """One handle per table of ``module``.

    Args:
        module: a ``BatchedDynamicEmbeddingTables``.
        collection: the collection path the tables belong to.
        kernel: the ``BatchedDynamicEmbeddingKernel`` driving it under TorchRec sharding (gives the shard's
            rank, world size, dist_type and num_embeddings), or None for a local module.
    """
    from dynamicemb_core.optim import initial_state_value
    from dynamicemb_core.optim.layout import state_width

    kind = module._kind  # the optimizer kind the module resolved from FBGEMM's EmbOptimType
    state_init = float(initial_state_value(kind, module.optimizer_args))
    handles = []
    for t, name in enumerate(module.table_names):
        options = module.table_options[t]
        storage, table_id, flush, drop = _last_tier(name, module.tables[t])
        dim = int(module.dims[t])
        world, rank, num_embeddings = 1, 0, None
        if kernel is not None:
            world, rank = int(kernel.world_size), int(kernel.rank)
            num_embeddings = int(kernel.config.embedding_tables[t].num_embeddings)
        handles.append(
            TableHandle(
                collection=collection,
                name=name,
                storage=storage,
                table_id=table_id,
                options=options,
                dim=dim,
                optimizer_width=state_width(kind, dim) if options.training else 0,
                state_init=state_init,
                optimizer=kind.name.lower(),
                world_size=world,
                rank=rank,
                dist_type=str(options.dist_type),
                num_embeddings=num_embeddings,
                flush_cache=flush,
                drop_from_cache=drop,
                owner=module,
                kernel=kernel,
                tier=module.tables[t],
                counter=module._admission[t][1] if module._admission[t] is not None else None,
            )
        )
    return handles


def set_training_state(module: Any, kernel: Optional[Any], step: int, args: Any) -> None:
    """Give ``module`` a restored optimizer step and hyper-parameters.

    Under TorchRec the kernel's fused optimizer pushes its ``param_groups`` learning rate to the module
    at every ``step()``, so that rate is restored too (otherwise the next ``step()`` would undo it).
    """
    module._step = int(step)
    module.optimizer_args = args
    if kernel is not None:
        for group in kernel.fused_optimizer.param_groups:
            group["lr"] = float(args.learning_rate)
