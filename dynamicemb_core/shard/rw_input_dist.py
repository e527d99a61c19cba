"""Row-wise input distribution by ``dist_type``: bucketize each feature's keys by owner, then all-to-all.

TorchRec's row-wise input dist (``bucketize_kjt_before_all2all``) splits a table into contiguous
blocks and rewrites keys as rows local to the block. Dynamic tables keep their raw keys (the hash
table on the owner maps them to slots) and may route by ``roundrobin`` or ``hash_roundrobin``, so
this module bucketizes with :func:`~dynamicemb_core.table.ownership.owner_rank` instead. Native
row-wise tables that share the sharding keep TorchRec's rule (continuous blocks, local rows), so both
kinds travel in one all-to-all.

The bucketized KJT has the layout TorchRec's ``KJTAllToAll`` expects: keys repeated once per rank,
lengths ordered ``[rank][feature][sample]``. For sequence (unpooled) sharding the inverse permutation
is kept in ``unbucketize_permute_tensor``, which TorchRec's sequence output dist uses to put the
returned rows back in input order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Tuple

import torch
import torch.distributed as dist
from torchrec.distributed.dist_data import KJTAllToAll
from torchrec.distributed.embedding_sharding import BaseSparseFeaturesDist
from torchrec.distributed.sharding.rw_sharding import RwSparseFeaturesDist
from torchrec.distributed.types import Awaitable
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from dynamicemb_core.lookup.features import check_kjt
from dynamicemb_core.table.ownership import continuous_owner, owner_rank, validate_dist_type

__all__ = ["FeatureRoute", "RwDynamicSparseFeaturesDist", "bucketize_kjt_by_owner"]


@dataclass(frozen=True)
class FeatureRoute:
    """How one feature's keys reach their ranks.

    Attributes:
        dist_type: the table's ``dist_type`` (native tables: ``"continuous"``).
        num_embeddings: the table's TorchRec ``num_embeddings`` (block size for ``continuous``).
        local_rows: rewrite keys as rows local to the owner's block (native TorchRec tables); dynamic
            tables keep raw keys.
    """

    dist_type: str
    num_embeddings: int
    local_rows: bool = False

    def __post_init__(self) -> None:
        validate_dist_type(self.dist_type)
        if self.local_rows and self.dist_type != "continuous":
            raise ValueError(f"local_rows needs dist_type 'continuous', got {self.dist_type!r}")


def _route_all(
    keys: torch.Tensor, key_lengths: torch.Tensor, routes: List[FeatureRoute], world_size: int
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Owner of each key and the key as the owner will look it up, for all features at once.

    The ops run per distinct ``dist_type`` (at most three), never per feature: a feature's
    ``num_embeddings`` and ``local_rows`` reach its keys as tensors expanded from the features'
    (``key_lengths``: each feature's key count, an int64 tensor on the keys' device), so the
    step's op count does not grow with the number of tables and nothing is read back.
    """
    device = keys.device
    dist_types = sorted({r.dist_type for r in routes})
    if dist_types != ["continuous"] and len(dist_types) == 1:
        # one rule for every key, no table parameter (the usual dynamic case)
        return owner_rank(keys, dist_types[0], world_size), keys
    n = keys.numel()
    feature = torch.repeat_interleave(
        torch.arange(len(routes), device=device),
        key_lengths,
        output_size=n,
    )
    owners: Optional[torch.Tensor] = None
    routed = keys
    for dist_type in dist_types:
        if dist_type == "continuous":
            num_embeddings = torch.tensor(
                [r.num_embeddings for r in routes], dtype=torch.int64, device=device
            )[feature]
            owner, in_range, block = continuous_owner(keys, num_embeddings, world_size)
            if any(r.local_rows for r in routes):
                # FBGEMM's block bucketization for native tables: in-range keys become
                # block-local rows, others key // world_size; dynamic tables keep raw keys
                local = torch.tensor([r.local_rows for r in routes], device=device)[feature]
                rows = torch.where(
                    in_range,
                    keys - owner * block,
                    torch.div(keys, world_size, rounding_mode="floor"),
                )
                routed = torch.where(local, rows, keys)
        else:
            owner = owner_rank(keys, dist_type, world_size)
        if owners is None:
            owners = owner
        else:
            mine = torch.tensor([r.dist_type == dist_type for r in routes], device=device)
            owners = torch.where(mine[feature], owner, owners)
    assert owners is not None
    return owners, routed


def bucketize_kjt_by_owner(
    kjt: KeyedJaggedTensor, routes: List[FeatureRoute], world_size: int
) -> Tuple[KeyedJaggedTensor, torch.Tensor]:
    """Reorder a KJT's values by owning rank.

    Args:
        kjt: F features, stride B (variable batch per feature is not supported).
        routes: one :class:`FeatureRoute` per feature, in the KJT's key order.
        world_size: number of ranks.

    Returns:
        ``(bucketized, unbucketize_permute)``: a KJT with ``F * world_size`` keys whose lengths are
        ordered ``[rank][feature][sample]``, and the (n,) int64 permutation with
        ``original[i] = bucketized_values[unbucketize_permute[i]]``.

    Raises:
        TypeError: float (non-integer) values: ids are never cast.
        ValueError: when ``routes`` does not have one entry per feature, or lengths / offsets do
            not describe the values (naming the feature; see ``check_kjt``).
        NotImplementedError: for a variable-batch KJT.
    """
    keys = kjt.keys()
    if len(routes) != len(keys):
        raise ValueError(f"bucketize: {len(keys)} features {keys} but {len(routes)} routes")
    if kjt.variable_stride_per_key():
        raise NotImplementedError(
            "dynamic row-wise sharding does not support variable batch per feature"
        )
    check_kjt(kjt, "dynamic row-wise input dist")
    values = kjt.values()
    device = values.device
    lengths = kjt.lengths().view(-1)
    num_segments = lengths.numel()  # F * B
    if world_size == 1:
        # one rank owns every key, and a native table's block-local row is the key itself
        # (block = num_embeddings; out-of-range keys: key // 1): nothing moves
        bucketized = KeyedJaggedTensor(
            keys=keys,
            values=values,
            weights=kjt.weights_or_none(),
            lengths=lengths,
            stride=kjt.stride(),
        )
        return bucketized, torch.arange(values.numel(), device=device)
    key_values = values.to(torch.int64)
    # keys per feature summed on the device (TorchRec's length_per_key() reads them back)
    per_feature = lengths.view(len(keys), -1).sum(1, dtype=torch.int64)
    owners, routed = _route_all(key_values, per_feature, routes, world_size)
    segment = torch.repeat_interleave(
        torch.arange(num_segments, device=device, dtype=torch.int64), lengths.to(torch.int64)
    )
    order_key = owners * num_segments + segment
    permute = torch.sort(order_key, stable=True).indices
    unbucketize = torch.empty_like(permute)
    unbucketize[permute] = torch.arange(permute.numel(), device=device, dtype=permute.dtype)
    new_lengths = torch.bincount(order_key, minlength=world_size * num_segments)
    weights = kjt.weights_or_none()
    bucketized = KeyedJaggedTensor(
        keys=keys * world_size,
        values=routed[permute].to(values.dtype),
        weights=weights[permute] if weights is not None else None,
        lengths=new_lengths.to(lengths.dtype),
        stride=kjt.stride(),
    )
    return bucketized, unbucketize


class RwDynamicSparseFeaturesDist(RwSparseFeaturesDist):
    """Bucketizes features by owner (:func:`bucketize_kjt_by_owner`) and redistributes them.

    A subclass of TorchRec's ``RwSparseFeaturesDist`` because ``ShardedEmbeddingCollection`` reads
    ``unbucketize_permute_tensor`` only from instances of that class; none of its block-bucketizing
    state is used, so its constructor is skipped.

    Args:
        pg: process group of the sharding.
        routes: one route per feature, in the order of the sharding's ``feature_names()``.
        is_sequence: keep ``unbucketize_permute_tensor`` for the sequence output dist.
    """

    def __init__(
        self, pg: dist.ProcessGroup, routes: List[FeatureRoute], is_sequence: bool
    ) -> None:
        BaseSparseFeaturesDist.__init__(self)
        self._world_size: int = pg.size()
        self._routes = list(routes)
        self._is_sequence = is_sequence
        # fields of TorchRec's class that its callers may read; position weights are not supported
        self._has_feature_processor = False
        self._need_pos = False
        self._keep_original_indices = False
        self._dist = KJTAllToAll(pg=pg, splits=[len(self._routes)] * self._world_size)
        self.unbucketize_permute_tensor: Optional[torch.Tensor] = None

    def forward(
        self, sparse_features: KeyedJaggedTensor
    ) -> Awaitable[Awaitable[KeyedJaggedTensor]]:
        """Bucketize ``sparse_features`` and start the all-to-all."""
        bucketized, unbucketize = bucketize_kjt_by_owner(
            sparse_features, self._routes, self._world_size
        )
        self.unbucketize_permute_tensor = unbucketize if self._is_sequence else None
        return self._dist(bucketized)
