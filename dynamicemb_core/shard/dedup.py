"""Index deduplication for a sharded EmbeddingCollection (``use_index_dedup=True``), with our own op.

TorchRec deduplicates a sequence batch before the input all-to-all so that each distinct id travels
and is looked up once, then expands the looked-up rows back with ``reverse_indices``. Its version
calls ``fbgemm.jagged_unique_indices``, which has no CPU kernel, and it separates tables by
offsetting ids with each table's ``num_embeddings``, which is no bound for a dynamic table (any int64
is a valid id), so two tables' ids could meet. Here each table's ids (all its features together) go
through :func:`dynamicemb_core.ops.lookup_ops.unique` on their own, on CPU and CUDA alike.

The deduplicated batch keeps the input's keys and bags: a table's distinct ids are laid out in the
value order of its features' bags, spread as evenly as possible over those bags (bag lengths carry no
meaning in a sequence lookup; only the values' order and their table do). The output is expanded back
by ``reverse_indices`` (the position of each input id among the deduplicated values), as TorchRec does.

Each distinct id stands for all its occurrences: LFU scores and admission counters must count every one
of them (a key seen 3 times in a batch counts 3 whether or not the batch was deduplicated). The
deduplicated batch therefore carries each id's occurrence count as its weight, as NVIDIA's DynamicEmb
does; the weights travel with the ids through the all-to-all and the owner's lookup reads them as
occurrence counts (:attr:`BatchedDynamicEmbeddingKernel.weights_are_counts`).
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from dynamicemb_core.ops import lookup_ops

__all__ = ["dedup_by_table"]


def _spread(count: int, bags: int, device: torch.device) -> torch.Tensor:
    """(bags,) lengths summing to ``count``, as even as possible (the first ones one longer)."""
    lengths = torch.full((bags,), count // bags, dtype=torch.int64, device=device)
    lengths[: count % bags] += 1
    return lengths


def dedup_by_table(
    features: KeyedJaggedTensor,
    features_per_table: Sequence[int],
    accumulate_weights: bool = False,
    counts_as_weights: bool = False,
) -> Tuple[KeyedJaggedTensor, torch.Tensor]:
    """Deduplicate each table's ids of ``features``.

    Args:
        features: one sharding's features, each table's features consecutive (TorchRec's order).
        features_per_table: how many consecutive keys of ``features`` each table has.
        accumulate_weights: sum the weights of equal ids (TorchRec's feature-score accumulation);
            otherwise the deduplicated batch has no weights, as in TorchRec, unless
            ``counts_as_weights``.
        counts_as_weights: (without ``accumulate_weights``) weight each distinct id by how many
            times it occurs in its table's ids (float32, exact below 2**24 occurrences).

    Returns:
        ``(deduplicated features, reverse_indices)``: ``reverse_indices[i]`` is the position in the
        deduplicated values of ``features.values()[i]``.

    Raises:
        ValueError: when ``features_per_table`` does not cover the features' keys.
    """
    keys = features.keys()
    if sum(features_per_table) != len(keys) or any(n <= 0 for n in features_per_table):
        raise ValueError(
            f"dedup_by_table: features_per_table {list(features_per_table)} does not cover the "
            f"{len(keys)} keys {keys}"
        )
    values = features.values().to(torch.int64)
    device = values.device
    ids_per_key = features.length_per_key()
    bags_per_key = features.stride_per_key()
    reverse = torch.empty_like(values)
    uniques: List[torch.Tensor] = []
    occurrences: List[torch.Tensor] = []
    lengths: List[torch.Tensor] = []
    value_start = key = found = 0
    for n_features in features_per_table:
        value_end = value_start + sum(ids_per_key[key : key + n_features])
        bags = sum(bags_per_key[key : key + n_features])
        unique, inverse, counts = lookup_ops.unique(values[value_start:value_end])
        reverse[value_start:value_end] = inverse + found
        uniques.append(unique)
        occurrences.append(counts)
        if bags:
            lengths.append(_spread(unique.numel(), bags, device))
        found += unique.numel()
        value_start, key = value_end, key + n_features
    weights: Optional[torch.Tensor] = None
    source_weights = features.weights_or_none()
    if accumulate_weights and source_weights is not None:
        weights = torch.zeros(found, dtype=source_weights.dtype, device=device)
        weights.scatter_add_(0, reverse, source_weights)
    elif counts_as_weights:
        weights = (torch.cat(occurrences) if occurrences else values[:0]).to(torch.float32)
    dedup = KeyedJaggedTensor(
        keys=keys,
        values=torch.cat(uniques) if uniques else values[:0],
        lengths=torch.cat(lengths).to(features.lengths().dtype)
        if lengths
        else features.lengths()[:0],
        weights=weights,
        stride_per_key_per_rank=features.stride_per_key_per_rank()
        if features.variable_stride_per_key()
        else None,
        stride=None if features.variable_stride_per_key() else features.stride(),
    )
    return dedup, reverse
