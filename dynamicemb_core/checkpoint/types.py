"""Data types of the checkpoint package: the table handle, the delta, and what a replay writes back."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional

import torch

from dynamicemb_core.config import DynamicEmbTableOptions

if TYPE_CHECKING:  # pragma: no cover
    from dynamicemb_core.table import ScoredHashTable

__all__ = ["DeltaDumpResult", "ReplayContent", "TableHandle"]


class ReplayContent(enum.Flag):
    """What :func:`replay_increment` writes back besides the key and its embedding.

    The embedding always travels with its key: a key written at a slot must own that slot's row, so
    there is no way to place a key and leave the previous occupant's vector behind. The flags choose
    what comes along.
    """

    EMBEDDING_ONLY = (
        0  # a serving replica: embeddings only, fresh optimizer state, target-side scores
    )
    OPTIMIZER_STATE = (
        enum.auto()
    )  # the source's optimizer state (a training replica resuming from it)
    SCORE = enum.auto()  # the source's scores (timestamps re-based from their age)
    ALL = OPTIMIZER_STATE | SCORE


@dataclass
class TableHandle:
    """One dynamic table as the checkpoint code sees it: where its keys and rows live, and how it is sharded.

    Attributes:
        collection: the embedding collection's module path (``{collection: ...}`` keys of every API).
        name: the table's name inside the collection.
        storage: the group holding every key of the table
            (:class:`~dynamicemb_core.storage.grouped.GroupedDeviceStorage`: the module's own, or
            the host table behind a cache): ``.table`` (the ScoredHashTable of keys and scores),
            ``read_rows(t, slots)``, ``write_rows(t, slots, rows)``, ``row_blocks(t)`` and
            ``tables[t]`` (a StorageTableSpec).
        table_id: the logical table inside ``storage``.
        options: the table's options (score strategy, dist_type, evicted_item_mode, ...).
        dim: embedding width; the row is ``[embedding (dim) | optimizer state]``.
        optimizer_width: optimizer-state elements a checkpoint stores per row (the filled part of the
            runtime state; a delta and a file agree on it).
        state_init: value of a fresh optimizer state (``initial_accumulator_value`` for Adagrad, else 0).
        optimizer: the optimizer's name, recorded in files for humans.
        world_size: ranks the table is row-wise sharded over (1 for a local table).
        rank: this process's shard index of the table (the global rank under TorchRec's row-wise sharding).
        dist_type: key -> rank rule: "roundrobin", "hash_roundrobin" or "continuous".
        num_embeddings: the table's TorchRec row count (needed by "continuous" ownership only).
        flush_cache: pushes a device cache in front of the storage back to it (None: no cache).
        drop_from_cache: removes keys from that cache without writing them back (None: no cache).
        owner: the ``BatchedDynamicEmbeddingTables`` holding the table (its optimizer step and
            hyper-parameters are what ``optim=True`` saves); None for a handle built by hand.
        kernel: the shard kernel driving ``owner`` under TorchRec (its fused optimizer's learning
            rate is restored with the module's), or None.
        tier: the table's whole storage in ``owner`` (cache and next tier), whose hash tables share
            the table's score clock.
        counter: the table's admission counter (``counter=True`` saves it), or None.
    """

    collection: str
    name: str
    storage: Any
    table_id: int
    options: DynamicEmbTableOptions
    dim: int
    optimizer_width: int = 0
    state_init: float = 0.0
    optimizer: str = "none"
    world_size: int = 1
    rank: int = 0
    dist_type: str = "roundrobin"
    num_embeddings: Optional[int] = None
    flush_cache: Optional[Callable[[], None]] = None
    drop_from_cache: Optional[Callable[[torch.Tensor], None]] = None
    owner: Any = None
    kernel: Any = None
    tier: Any = None
    counter: Any = None

    @property
    def table(self) -> "ScoredHashTable":
        """The hash table of keys, slots and scores."""
        return self.storage.table

    @property
    def qualified_name(self) -> str:
        """``collection/table``, used in messages and progress bars."""
        return f"{self.collection}/{self.name}"

    @property
    def row_width(self) -> int:
        """Elements per stored row (embedding plus the optimizer state's runtime width)."""
        return int(self.storage.tables[self.table_id].row_width)

    @property
    def dtype(self) -> torch.dtype:
        """Element dtype of the rows the storage reads and writes (``read_rows`` / ``write_rows``)."""
        return self.storage.tables[self.table_id].dtype

    @property
    def embedding_dtype(self) -> torch.dtype:
        """What the table stores its embeddings in, and what a dump writes them in: the storage's
        row dtype (``row_dtype``: float16 / bfloat16 for a half-precision table, whose rows are read
        and written as float32), else :attr:`dtype`."""
        return getattr(self.storage, "row_dtype", None) or self.dtype

    @property
    def state_dtype(self) -> torch.dtype:
        """What the optimizer state is stored and dumped in: float32 beside half-precision
        embeddings, else :attr:`dtype`."""
        return self.dtype if self.embedding_dtype == self.dtype else torch.float32

    @property
    def device(self) -> torch.device:
        """Where the table's keys live (rows are moved here when read)."""
        return torch.device(self.storage.device)

    @property
    def row_capacity(self) -> int:
        """Value rows behind the slots, over every memory block (device and host)."""
        return sum(int(buf.shape[0]) for buf, _ in self.storage.row_blocks(self.table_id))

    @property
    def state_width(self) -> int:
        """Runtime optimizer-state elements per row (0 for a table built with training=False)."""
        return self.row_width - self.dim


@dataclass
class DeltaDumpResult:
    """What :func:`incremental_dump` returns for one collection; lists are column-aligned by table.

    Element ``i`` of every list refers to ``table_names[i]``. Tensors are on the CPU.

    Attributes:
        table_names: the dumped tables.
        keys: (n_i,) int64 keys whose score passed the threshold.
        values: (n_i, dim) embeddings.
        optimizer_states: (n_i, w) optimizer state at the checkpoint width (w = 0 without a state).
        scores: (n_i, num_scores) int64 in the strategy tuple's order; timestamp columns as ages (ns).
        evicted_keys: keys the table evicted and retained (evicted_item_mode=RETAIN_KEY), else None.
        erased_keys: keys erased with EvictedItemMode.RETAIN_KEY since the previous dump (maybe empty).
        meta: per table, ``current_score``, ``slot_index`` ((n_i,) int64), ``current_capacity``,
            ``row_capacity``, ``bucket_capacity``, ``num_scores``, ``world_size``, ``table_options``.
    """

    table_names: List[str] = field(default_factory=list)
    keys: List[torch.Tensor] = field(default_factory=list)
    values: List[torch.Tensor] = field(default_factory=list)
    optimizer_states: List[torch.Tensor] = field(default_factory=list)
    scores: List[torch.Tensor] = field(default_factory=list)
    evicted_keys: List[Optional[torch.Tensor]] = field(default_factory=list)
    erased_keys: List[Optional[torch.Tensor]] = field(default_factory=list)
    meta: List[Dict[str, Any]] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.table_names)

    def index(self, table_name: str) -> int:
        """Position of a table in the lists; ValueError naming the tables present when absent."""
        try:
            return self.table_names.index(table_name)
        except ValueError:
            raise ValueError(
                f"delta has no table '{table_name}'; it holds {self.table_names}"
            ) from None
