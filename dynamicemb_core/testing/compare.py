"""Comparisons shared by the storage tests and the conformance suites (no pytest needed)."""

from __future__ import annotations

import torch

from dynamicemb_core.storage.contract.adapter import AnyStorage, find_in_table

__all__ = ["assert_same_stored_rows"]


def assert_same_stored_rows(
    reference: AnyStorage, candidate: AnyStorage, keys: torch.Tensor, table_id: int = 0
) -> None:
    """Both storages hold the same subset of ``keys``, with the same rows (to 1e-6).

    The oracle of every tier test: a tiered or plugin storage trained like a plain device table must
    end up storing what that table stores. Flush caches before calling. Either storage may speak
    either contract.
    """
    found_r, rows_r, _ = find_in_table(reference, table_id, keys)
    found_c, rows_c, _ = find_in_table(candidate, table_id, keys.to(candidate.device))
    assert torch.equal(found_r.cpu(), found_c.cpu()), "the storages hold different keys"
    torch.testing.assert_close(rows_c[found_c].cpu(), rows_r[found_r].cpu(), rtol=1e-6, atol=1e-6)
