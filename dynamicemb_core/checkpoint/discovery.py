"""Finding the dynamic tables inside a model: plain ``BatchedDynamicEmbeddingTables`` and sharded ones.

A table's *collection* is the module path of the embedding collection that holds it, as TorchRec's
state_dict names it (DMP's ``_dmp_wrapped_module.module.`` / ``module.`` prefixes removed):

- a ``BatchedDynamicEmbeddingTables`` used directly is its own collection (its module path);
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

__all__ = ["clean_fqn", "find_tables", "group_by_collection"]

# DMP wraps the model as ``_dmp_wrapped_module`` and, with dense parameters, DDP adds ``module``.
_PREFIXES = ("_dmp_wrapped_module.module.", "_dmp_wrapped_module.", "module.")


def clean_fqn(fqn: str) -> str:
    """Strip the prefixes DMP and DDP add, so paths match the user's model (and TorchRec's state_dict)."""
    for prefix in _PREFIXES:
        if fqn.startswith(prefix):
            return fqn[len(prefix) :]
    if fqn in ("_dmp_wrapped_module", "module"):
        return ""
    return fqn


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
    collection_of: Dict[int, str] = {}
    kernel_of: Dict[int, Any] = {}
    handles: List[TableHandle] = []
    for fqn, module in model.named_modules():
        if _is_collection(module):
            for _, sub in module.named_modules():
                collection_of.setdefault(id(sub), clean_fqn(fqn))
        if kernel_type is not None and isinstance(module, kernel_type):
            kernel_of[id(module.emb_module)] = module
        if isinstance(module, batched):
            collection = collection_of.get(id(module), clean_fqn(fqn))
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
