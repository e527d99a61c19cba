"""Turning a ``BatchedDynamicEmbeddingTables`` (and the shard kernel driving it) into table handles.

This is the only module that knows the batched module's internals: ``tables[t]`` is the table's view
of the module's group, ``dims``, ``table_options``, the optimizer's kind and hyper-parameters. The
checkpoint code works on the group holding every key of a table, which the view names
(``tables[t].home()``): the module's own group, or the host table behind a device cache, whose flush
and invalidation become the handle's ``flush_cache`` and ``drop_from_cache``.
"""

from __future__ import annotations

from typing import Any, List, Optional

from dynamicemb_core.checkpoint.types import TableHandle

__all__ = ["handles_for_batched", "set_training_state"]


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
        storage, table_id, flush, drop = module.tables[t].home()
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
    module.step = int(step)
    module.optimizer_args = args
    if kernel is not None:
        for group in kernel.fused_optimizer.param_groups:
            group["lr"] = float(args.learning_rate)
