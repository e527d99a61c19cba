"""ServingTables: the read-only hash tables of an inference collection, and their one lookup.

Every table of a collection, and every row-wise shard of each table, is one logical table of a single
:class:`~dynamicemb_core.table.ScoredHashTable` that keeps keys and scores only (``row_width=0``). The
embeddings live beside it in one value buffer per (dim, pooling) group::

    values_g = [ rows of every shard of every table of group g | one default row per table | zero row ]

so a batch is served by one ``find`` (all features at once, each key sent to its table and owning
shard) and one ``pooled_gather`` per group reading the buffer in place. A missing key reads its table's
default row (the constant ``eval_initializer_args``, the only mode options accept), so nothing is
inserted and nothing raises.

Each shard mirrors the trainer's shard layout (capacity, bucket width, ``dist_type``), so the
checkpoint code works on it unchanged through :meth:`ServingTables.handles`: ``DynamicEmbDump``
folders load with ``load_tables`` and ``incremental_dump`` deltas replay slot for slot with
``plan_replay`` / ``apply_replay``. Both write the registered buffers in place, which is what lets an
exported or AOTInductor-compiled model that holds these buffers by reference see every replay.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
from torch import Tensor, nn

from dynamicemb_core.config import (
    DynamicEmbInitializerArgs,
    DynamicEmbInitializerMode,
    DynamicEmbPoolingMode,
    DynamicEmbTableOptions,
)
from dynamicemb_core.devices import normalize_device
from dynamicemb_core.ops import lookup_ops
from dynamicemb_core.plugins import with_score_function
from dynamicemb_core.types import StorageTableSpec

__all__ = ["ServingTable", "ServingTables"]

_STATE_FIELDS = (
    "table_keys",
    "digests",
    "scores",
    "slot_offsets",
    "bucket_caps",
    "policies",
    "sizes",
)
_POOL_CODE = {
    DynamicEmbPoolingMode.SUM: lookup_ops.POOL_SUM,
    DynamicEmbPoolingMode.MEAN: lookup_ops.POOL_MEAN,
}


@dataclass(frozen=True)
class ServingTable:
    """One table as the serving side holds it.

    Attributes:
        name: the table's name (as in its EmbeddingConfig and the checkpoint).
        dim: embedding width.
        options: the training options (score strategy, bucket width, eval initializer, dist_type).
        pooling: SUM, MEAN, or NONE (sequence output).
        num_shards: row-wise shards of the trainer's table (the dump's or delta's world size).
        shard_capacity: slots per shard; equal to the trainer's so that deltas replay slot for slot.
        bucket_capacity: slots per bucket of each shard (the trainer's).
        num_embeddings: the TorchRec row count (``dist_type="continuous"`` ownership only).
    """

    name: str
    dim: int
    options: DynamicEmbTableOptions
    pooling: DynamicEmbPoolingMode
    num_shards: int
    shard_capacity: int
    bucket_capacity: int
    num_embeddings: Optional[int] = None

    @property
    def dist_type(self) -> str:
        return str(self.options.dist_type)


class _ShardStorage:
    """The storage interface the checkpoint code expects of a table (``TableHandle.storage``).

    Logical table ``l`` of the shared hash table owns rows ``[base_l, base_l + capacity_l)`` of its
    group's value buffer; reads and writes go through the same row ops as training.
    """

    def __init__(self, owner: "ServingTables") -> None:
        self._owner = owner

    @property
    def table(self) -> Any:
        return self._owner.hash_table

    @property
    def device(self) -> torch.device:
        return self._owner.device

    @property
    def tables(self) -> List[StorageTableSpec]:
        return self._owner.logical_specs

    def _view(self, logical: int) -> Tensor:
        return self._owner.shard_rows(logical)

    def read_rows(self, table_id: int, slots: Tensor) -> Tensor:
        from dynamicemb_core.ops import table_ops

        return table_ops.gather_rows(self._view(table_id), slots.to(self.device))

    def write_rows(self, table_id: int, slots: Tensor, rows: Tensor) -> None:
        from dynamicemb_core.ops import table_ops

        view = self._view(table_id)
        table_ops.scatter_rows(view, slots.to(self.device), rows.to(view.device, view.dtype))

    def row_blocks(self, table_id: int) -> List[Tuple[Tensor, int]]:
        return [(self._view(table_id), 0)]


def _constant_default(args: DynamicEmbInitializerArgs, table: str) -> float:
    """The value every missing key of ``table`` reads (options allow only a CONSTANT initializer)."""
    if DynamicEmbInitializerMode(args.mode) is not DynamicEmbInitializerMode.CONSTANT:
        raise ValueError(
            f"table {table!r}: eval_initializer_args must be CONSTANT, got {args.mode!r}"
        )
    return float(args.value)


class ServingTables(nn.Module):
    """Read-only dynamic tables behind one batched lookup (TBE layout: feature-major bags).

    Args:
        tables: the tables.
        feature_names: the lookup's features, in input (and output) order.
        feature_table_map: for each feature, the index of its table in ``tables``.
        device: where the tables live and the lookup runs.
        validate: pass ``check=True`` to the bag op (offsets and rows checked; one device sync per
            group on CUDA). False trusts the caller's offsets.
    """

    table_of_feature: Tensor
    first_logical: Tensor
    row_base: Tensor
    default_row: Tensor
    group_of_logical: Tensor
    cur_scores: Tensor

    def __init__(
        self,
        tables: Sequence[ServingTable],
        feature_names: Sequence[str],
        feature_table_map: Sequence[int],
        device: torch.device | str,
        validate: bool = True,
    ) -> None:
        super().__init__()
        from dynamicemb_core.table import ScoredHashTable, TableSpec

        self.tables = list(tables)
        if not self.tables:
            raise ValueError("ServingTables: no tables")
        names = [t.name for t in self.tables]
        if len(set(names)) != len(names):
            raise ValueError(f"ServingTables: table names must be unique, got {names}")
        self.device = normalize_device(device)
        self.validate = bool(validate)
        self.feature_names: List[str] = list(feature_names)
        table_of_feature = [int(t) for t in feature_table_map]
        if len(set(self.feature_names)) != len(self.feature_names):
            raise ValueError(f"ServingTables: a feature is listed twice: {self.feature_names}")
        if not self.feature_names or len(table_of_feature) != len(self.feature_names):
            raise ValueError(
                f"ServingTables: feature_names ({len(self.feature_names)}) and feature_table_map "
                f"({len(table_of_feature)}) must be non-empty and of equal length"
            )
        bad = [t for t in table_of_feature if not 0 <= t < len(self.tables)]
        if bad:
            raise ValueError(
                f"ServingTables: feature_table_map has table indices {bad} outside "
                f"[0, {len(self.tables)})"
            )
        self._table_of_feature = table_of_feature
        self.feature_dims = [self.tables[t].dim for t in table_of_feature]

        # logical tables: every shard of every table, table after table
        specs: List[Any] = []
        self._first_logical: List[int] = []
        owner: List[int] = []
        for i, t in enumerate(self.tables):
            self._first_logical.append(len(specs))
            opts = dataclasses.replace(
                with_score_function(t.options),
                dim=t.dim,
                max_capacity=t.shard_capacity,
                init_capacity=t.shard_capacity,
                bucket_capacity=t.bucket_capacity,
            )
            for r in range(t.num_shards):
                spec = TableSpec.from_options(f"{t.name}/shard{r}", opts, row_width=0)
                # the rows live in this module's value buffers, sized now: a served table never
                # grows (not even NO_EVICTION, which grows past max_capacity elsewhere), so a
                # load that would need more room is refused instead of misaddressing rows
                specs.append(dataclasses.replace(spec, fixed_capacity=True))
                owner.append(i)
        self.hash_table = ScoredHashTable(specs, device=self.device)
        self.logical_specs = [
            StorageTableSpec(
                name=s.name,
                dim=self.tables[owner[lid]].dim,
                row_width=self.tables[owner[lid]].dim,
                dtype=torch.float32,
                num_scores=s.num_scores,
                capacity=self.hash_table.capacity(lid),
            )
            for lid, s in enumerate(specs)
        ]
        self._owner_table = owner

        # value buffers: one per (dim, pooling) group
        group_keys: List[Tuple[int, DynamicEmbPoolingMode]] = []
        group_of_table = []
        for t in self.tables:
            key = (t.dim, t.pooling)
            if key not in group_keys:
                group_keys.append(key)
            group_of_table.append(group_keys.index(key))
        self._group_keys = group_keys
        self._group_of_table = group_of_table
        row_base = [0] * len(specs)
        default_row = [0] * len(specs)
        self._zero_row: List[int] = []
        for g, (dim, _) in enumerate(group_keys):
            members = [i for i, gi in enumerate(group_of_table) if gi == g]
            rows = 0
            for i in members:
                for lg in range(self.tables[i].num_shards):
                    lid = self._first_logical[i] + lg
                    row_base[lid] = rows
                    rows += self.hash_table.capacity(lid)
            values = torch.zeros(rows + len(members) + 1, dim, device=self.device)
            for j, i in enumerate(members):
                table = self.tables[i]
                values[rows + j] = _constant_default(
                    table.options.eval_initializer_args, table.name
                )
                for lg in range(self.tables[i].num_shards):
                    default_row[self._first_logical[i] + lg] = rows + j
            self._zero_row.append(rows + len(members))
            self.register_buffer(f"values_{g}", values, persistent=False)
        self._row_base = row_base

        def ints(values: List[int]) -> Tensor:
            return torch.tensor(values, dtype=torch.int64, device=self.device)

        self.register_buffer("table_of_feature", ints(table_of_feature), False)
        self.register_buffer("first_logical", ints(self._first_logical), False)
        self.register_buffer("row_base", ints(row_base), False)
        self.register_buffer("default_row", ints(default_row), False)
        self.register_buffer("group_of_logical", ints([group_of_table[o] for o in owner]), False)
        self.register_buffer("cur_scores", ints([-1] * len(specs)), False)
        self._sync_state()
        self.storage = _ShardStorage(self)

    # ---- state ---------------------------------------------------------------------------------
    def _sync_state(self) -> None:
        """Register the hash table's state tensors as buffers (again, if a load replaced them)."""
        state = self.hash_table.state
        for name in _STATE_FIELDS:
            self.register_buffer(f"hash_{name}", getattr(state, name), persistent=False)

    def state_identity(self) -> Tuple[int, ...]:
        """Data pointers of every buffer a compiled model reads; equal before and after a replay."""
        return tuple(b.data_ptr() for b in self.buffers())

    def values(self, group: int) -> Tensor:
        """The value buffer of one (dim, pooling) group."""
        return getattr(self, f"values_{group}")

    def shard_rows(self, logical: int) -> Tensor:
        """The (capacity, dim) rows of one logical table: a view of its group's buffer."""
        g = self._group_of_table[self._owner_table[logical]]
        base = self._row_base[logical]
        return self.values(g)[base : base + self.hash_table.capacity(logical)]

    def handles(self, collection: str) -> List[Any]:
        """Checkpoint handles, one per shard of every table (``world_size`` = the table's shards)."""
        from dynamicemb_core.checkpoint.types import TableHandle

        out = []
        for i, t in enumerate(self.tables):
            for r in range(t.num_shards):
                out.append(
                    TableHandle(
                        collection=collection,
                        name=t.name,
                        storage=self.storage,
                        table_id=self._first_logical[i] + r,
                        options=t.options,
                        dim=t.dim,
                        optimizer_width=0,
                        optimizer="none",
                        world_size=t.num_shards,
                        rank=r,
                        dist_type=t.dist_type,
                        num_embeddings=t.num_embeddings,
                    )
                )
        return out

    def table_sizes(self) -> Dict[str, int]:
        """Keys held per table (all shards)."""
        return {
            t.name: sum(
                self.hash_table.size(self._first_logical[i] + r) for r in range(t.num_shards)
            )
            for i, t in enumerate(self.tables)
        }

    # ---- lookup -------------------------------------------------------------------------------
    def _logical_ids(self, indices: Tensor, table_of_index: Tensor) -> Tensor:
        """The logical table (table and owning shard) of every index."""
        first = self.first_logical[table_of_index]
        rules = sorted(
            {
                (t.dist_type, t.num_shards, t.num_embeddings)
                for t in self.tables
                if t.num_shards > 1
            },
            key=str,
        )
        if not rules:
            return first
        from dynamicemb_core.table.ownership import owner_rank

        shard = torch.zeros_like(indices)
        for dist_type, world, rows in rules:
            mine = [
                i
                for i, t in enumerate(self.tables)
                if (t.dist_type, t.num_shards, t.num_embeddings) == (dist_type, world, rows)
            ]
            ranks = owner_rank(indices, dist_type, world, num_embeddings=rows)
            if len(mine) == len(self.tables):
                shard = ranks
            else:
                member = torch.zeros(len(self.tables), dtype=torch.bool, device=self.device)
                member[mine] = True
                shard = torch.where(member[table_of_index], ranks, shard)
        return first + shard

    def lookup(
        self, indices: Tensor, offsets: Tensor, per_sample_weights: Optional[Tensor] = None
    ) -> Tensor:
        """Look a batch up; traceable by ``torch.export`` (no host sync, no data-dependent shape).

        Args:
            indices: (N,) int64 keys, feature after feature (``feature_names`` order).
            offsets: (F*B+1,) int64 bag boundaries, feature-major (a KJT's offsets).
            per_sample_weights: optional (N,) float weights (SUM tables only).

        Returns:
            Pooled tables: (B, sum of feature dims), feature blocks in ``feature_names`` order.
            Sequence tables (NONE): (N, D), one row per index.
        """
        num_features = len(self.feature_names)
        n = indices.shape[0]
        bags = offsets.shape[0] - 1
        batch = bags // num_features
        lengths = offsets[1:] - offsets[:-1]
        feature_of_bag = torch.arange(num_features, device=indices.device).repeat_interleave(batch)
        feature_of_index = feature_of_bag.repeat_interleave(lengths, output_size=n)
        table_of_index = self.table_of_feature[feature_of_index]
        logical = self._logical_ids(indices, table_of_index)
        state = [getattr(self, f"hash_{name}") for name in _STATE_FIELDS]
        slots, found, _ = torch.ops.dynamicemb.find.default(
            indices, logical, *state, self.cur_scores, False, False
        )
        row = torch.where(found, self.row_base[logical] + slots, self.default_row[logical])
        weights = None if per_sample_weights is None else per_sample_weights.float()
        outputs = []
        for g, (_, pooling) in enumerate(self._group_keys):
            row_g = row
            if len(self._group_keys) > 1:
                row_g = torch.where(self.group_of_logical[logical] == g, row, self._zero_row[g])
            if pooling is DynamicEmbPoolingMode.NONE:
                outputs.append(self.values(g).index_select(0, row_g))
                continue
            outputs.append(
                torch.ops.dynamicemb.pooled_gather.default(
                    self.values(g), row_g, offsets, weights, _POOL_CODE[pooling], self.validate
                )
            )
        if self._group_keys[0][1] is DynamicEmbPoolingMode.NONE:
            return outputs[0]
        if len(outputs) == 1:
            dim = self._group_keys[0][0]
            pooled = outputs[0].view(num_features, batch, dim).transpose(0, 1)
            return pooled.reshape(batch, num_features * dim)
        blocks = []
        for f in range(num_features):
            g = self._group_of_table[self._table_of_feature[f]]
            blocks.append(outputs[g][f * batch : (f + 1) * batch])
        return torch.cat(blocks, dim=1)

    def extra_repr(self) -> str:
        tables = ", ".join(
            f"{t.name}(dim={t.dim}, shards={t.num_shards}, {t.pooling.name})" for t in self.tables
        )
        return f"tables=[{tables}], device={self.device}"
