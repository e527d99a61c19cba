"""Conformance test for a Storage used as the last tier under the device cache (``caching``).

A table whose ``external_storage`` names the plugin gets a small device cache over it; evicted rows
spill into the plugin and come back on the next miss. Training through that stack must give the same
outputs and the same final rows as training on one plain device table (the oracle), which checks
that the storage keeps rows, optimizer state and scores exactly, whatever order the cache spills in.

Subclass with a ``Test``-prefixed class and implement :meth:`StorageUnderCacheSuite.storage_options`
(and set ``storage_name``).
"""

from __future__ import annotations

from typing import Any, Dict, Iterator, Tuple

import torch

from dynamicemb_core.config import (
    DynamicEmbInitializerArgs,
    DynamicEmbInitializerMode,
    DynamicEmbPoolingMode,
    DynamicEmbTableOptions,
)
from dynamicemb_core.storage.contract.adapter import size_of_table
from dynamicemb_core.testing.compare import assert_same_stored_rows

__all__ = ["StorageUnderCacheSuite"]

DIM = 4
NUM_KEYS = 300


class StorageUnderCacheSuite:
    """Train through ``cache -> <storage_name>`` and compare with a device table."""

    storage_name: str = ""
    device = torch.device("cpu")
    cache_rows = 64  # far fewer than NUM_KEYS: most rows live in the plugin

    def storage_options(self) -> Dict[str, Any]:
        """``external_storage_options`` for a fresh, empty storage."""
        raise NotImplementedError("subclass StorageUnderCacheSuite and implement storage_options()")

    def _module(self, **kw: Any) -> Any:
        from fbgemm_gpu.split_embedding_configs import EmbOptimType

        from dynamicemb_core.lookup import BatchedDynamicEmbeddingTables

        options = DynamicEmbTableOptions(
            dim=DIM,
            max_capacity=1024,
            bucket_capacity=16,
            initializer_args=DynamicEmbInitializerArgs(mode=DynamicEmbInitializerMode.DEBUG),
            **kw,
        )
        return BatchedDynamicEmbeddingTables(
            [options],
            ["t"],
            [0],
            DynamicEmbPoolingMode.SUM,
            EmbOptimType.EXACT_ROWWISE_ADAGRAD,
            self.device,
            learning_rate=0.1,
            eps=1e-6,
        )

    def _batches(self) -> Iterator[Tuple[torch.Tensor, torch.Tensor]]:
        g = torch.Generator().manual_seed(0)
        for _ in range(6):
            keys = torch.randint(0, NUM_KEYS, (160,), generator=g)
            yield keys.to(self.device), torch.arange(0, 161, 4).to(self.device)

    def test_trains_like_a_device_table_as_the_last_tier_under_the_cache(self) -> None:
        row_bytes = (DIM + 1) * 4  # float32 embedding + one row-wise Adagrad accumulator
        tiered = self._module(
            external_storage=self.storage_name,
            external_storage_options=self.storage_options(),
            local_hbm_for_values=self.cache_rows * row_bytes,
        )
        plain = self._module()
        stack = tiered.tables[0]
        for keys, offsets in self._batches():
            want, got = plain(keys, offsets), tiered(keys, offsets)
            torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
            coeff = torch.randn(want.shape, device=self.device)
            (want * coeff).sum().backward()
            (got * coeff).sum().backward()
        held = size_of_table(stack.backing, stack.backing_ids[0])
        assert stack.spills(0) > 0 and held > 0, "the cache never spilled into the plugin"
        tiered.flush()
        keys = torch.arange(NUM_KEYS, device=self.device)
        # after flush, the plugin holds every row
        assert_same_stored_rows(plain.tables[0], stack.backing, keys)
