"""The unique op against torch.unique, on every device, plus opcheck."""

from __future__ import annotations

import torch
from torch.library import opcheck

from dynamicemb_core.ops import lookup_ops


def _keys(device):
    g = torch.Generator().manual_seed(0)
    edge = torch.tensor([-(2**63), 2**63 - 1, -1, 0, -1, 2**63 - 1])
    return torch.cat([torch.randint(-50, 50, (500,), generator=g), edge]).to(device)


def test_unique_matches_torch_unique(device):
    keys = _keys(device)
    uniq, inverse, counts = lookup_ops.unique(keys)
    assert torch.equal(uniq[inverse], keys)
    want_keys, want_counts = torch.unique(keys, return_counts=True)
    order = torch.argsort(uniq)
    assert torch.equal(uniq[order], want_keys)
    assert torch.equal(counts[order], want_counts)


def test_unique_of_empty_input(device):
    uniq, inverse, counts = lookup_ops.unique(torch.empty(0, dtype=torch.int64, device=device))
    assert uniq.numel() == inverse.numel() == counts.numel() == 0


def test_unique_is_deterministic(device):
    keys = _keys(device)
    a, b = lookup_ops.unique(keys), lookup_ops.unique(keys)
    assert all(torch.equal(x, y) for x, y in zip(a, b))


def test_unique_passes_opcheck(device):
    lookup_ops._ops()
    opcheck(torch.ops.dynamicemb.unique.default, (_keys(device),))
