"""Finding the dynamic tables inside a model: plain ``BatchedDynamicEmbeddingTables`` and sharded ones.

A table's *collection* is named as NVIDIA's DynamicEmb names it (``find_sharded_modules``): the model
itself is ``"model"``, and a module inside it is ``"model."`` followed by its attribute path, with the
wrappers of distributed training (DMP's ``_dmp_wrapped_module``, DDP's ``module``, FSDP's
``_fsdp_wrapped_module``) left out at every level. One function, :func:`module_paths`, applies the
rule; every API that names collections (``get_score``, ``set_score``, ``incremental_dump``,
``pop_evicted_keys``, ``erase``, ``DynamicEmbDump`` / ``DynamicEmbLoad``, ``table_metrics``, the
inference collections and their ``replay``) takes its names from :func:`find_tables`, which uses it.

- a ``BatchedDynamicEmbeddingTables`` used directly is its own collection (its path);
- inside a TorchRec-sharded collection (row-wise, through :mod:`dynamicemb_core.shard`), every dynamic
  table of every group on this rank belongs to the sharded collection's path, and carries the shard's
  rank, world size and dist_type from the kernel that drives it.

The order of the returned handles follows ``named_modules()`` and is the same on every rank of a job
whose ranks build the same model, which collectives in dump and incremental_dump rely on.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence

from torch import nn

from dynamicemb_core.checkpoint.types import TableHandle

__all__ = ["ROOT", "find_tables", "group_by_collection", "module_paths"]

ROOT = "model"
"""The name of the model itself, the first part of every collection name (NVIDIA's)."""


def _unwrap(module: nn.Module) -> nn.Module:
    """The module inside DMP / DDP / FSDP wrappers (TorchRec's ``get_unwrapped_module``)."""
    from torchrec.distributed.model_parallel import get_unwrapped_module

    return get_unwrapped_module(module)


def module_paths(model: nn.Module, root: str = ROOT) -> Dict[int, str]:
    """``{id(module): path}`` for every module of ``model``, wrappers of distributed training left out.

    ``model`` is ``root``; a child is its parent's path, ``"."``, and its attribute name in the
    unwrapped parent. A wrapper shares the path of the module it wraps. A module reachable by two
    paths keeps the first in ``named_modules`` order. With ``root=""`` the paths are TorchRec's
    (what its state_dict and delta tracker use, without DMP's and DDP's prefixes).
    """
    paths: Dict[int, str] = {}

    def visit(module: nn.Module, path: str) -> None:
        inner = module
        while True:
            if id(inner) in paths:
                return
            paths[id(inner)] = path
            unwrapped = _unwrap(inner)
            if unwrapped is inner:
                break
            inner = unwrapped
        for name, child in inner.named_children():
            visit(child, f"{path}.{name}" if path else name)

    visit(model, root)
    return paths


def _is_collection(module: nn.Module) -> bool:
    try:
        from torchrec.distributed.embedding import ShardedEmbeddingCollection
        from torchrec.distributed.embeddingbag import ShardedEmbeddingBagCollection
    except ImportError:  # pragma: no cover - torchrec is a dependency
        return False
    return isinstance(module, (ShardedEmbeddingCollection, ShardedEmbeddingBagCollection))


def _shard_kernel_type() -> Any:
    try:
        from dynamicemb_core.shard.kernel import BatchedDynamicEmbeddingKernel
    except ImportError:
        return None
    return BatchedDynamicEmbeddingKernel


def _batched_type() -> type:
    from dynamicemb_core.lookup import BatchedDynamicEmbeddingTables

    return BatchedDynamicEmbeddingTables


def _handles_of(module: Any, collection: str, kernel: Optional[Any]) -> List[TableHandle]:
    from dynamicemb_core.checkpoint.adapters import handles_for_batched

    return handles_for_batched(module, collection, kernel)


def find_tables(
    model: nn.Module, table_names: Optional[Mapping[str, Sequence[str]]] = None
) -> List[TableHandle]:
    """Every dynamic table of ``model`` (or those named in ``table_names``), as handles.

    Args:
        model: a module, a DMP-wrapped model, or a ``BatchedDynamicEmbeddingTables``.
        table_names: ``{collection_path: [table, ...]}``; None selects every table.

    Raises:
        ValueError: ``table_names`` names a collection or table the model does not have.
    """
    batched = _batched_type()
    kernel_type = _shard_kernel_type()
    paths = module_paths(model)
    collection_of: Dict[int, str] = {}
    kernel_of: Dict[int, Any] = {}
    handles: List[TableHandle] = []
    for fqn, module in model.named_modules():
        if _is_collection(module):
            for _, sub in module.named_modules():
                collection_of.setdefault(id(sub), paths.get(id(module), f"{ROOT}.{fqn}"))
        if kernel_type is not None and isinstance(module, kernel_type):
            kernel_of[id(module.emb_module)] = module
        if isinstance(module, batched):
            collection = collection_of.get(id(module)) or paths.get(id(module), f"{ROOT}.{fqn}")
            handles.extend(_handles_of(module, collection, kernel_of.get(id(module))))
    if table_names is None:
        return handles
    grouped = group_by_collection(handles)
    for collection, names in table_names.items():
        if collection not in grouped:
            raise ValueError(
                f"table_names: the model has no dynamic collection '{collection}'; it has {sorted(grouped)}"
            )
        have = {h.name for h in grouped[collection]}
        missing = [n for n in names if n not in have]
        if missing:
            raise ValueError(
                f"table_names: collection '{collection}' has no dynamic table {missing}; it has {sorted(have)}"
            )
    wanted = {(c, n) for c, names in table_names.items() for n in names}
    return [h for h in handles if (h.collection, h.name) in wanted]


def group_by_collection(handles: Sequence[TableHandle]) -> Dict[str, List[TableHandle]]:
    """``{collection: [handle, ...]}`` preserving order."""
    out: Dict[str, List[TableHandle]] = {}
    for h in handles:
        out.setdefault(h.collection, []).append(h)
    return out
