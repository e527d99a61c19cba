"""A training step over host rows without optimizer state (SGD) reads each host row once
(``GroupedRows.stage``): the forward reads the host part's rows onto the device, the backward
updates them there and writes them back. The module must train exactly as an all-device module
does, in every schedule: a plain loop, two forwards before their backwards (the second backward
finds its staging stale and updates in place), a prefetch between a forward and its backward (new
rows keep the staging), per-sample weights (their gradient reads the staged rows). Rows with
optimizer state (ADAM) are not staged. On CUDA the policy stages by itself; on CPU it is forced,
so the same mechanism is tested in CI.
"""

from __future__ import annotations

from typing import List

import pytest
import torch
from fbgemm_gpu.split_embedding_configs import EmbOptimType

from dynamicemb_core.config import (
    DynamicEmbInitializerArgs,
    DynamicEmbInitializerMode,
    DynamicEmbPoolingMode,
    DynamicEmbTableOptions,
)
from dynamicemb_core.lookup import BatchedDynamicEmbeddingTables
from dynamicemb_core.storage import grouped_rows
from dynamicemb_core.storage.grouped_rows import GroupedRows
from dynamicemb_core.testing.compare import assert_same_stored_rows
from tests.lookup import oracle

DIM, CAP, TABLES, BATCH, KEYS = 8, 512, 3, 8, 300
STATE = {EmbOptimType.EXACT_SGD: 0, EmbOptimType.ADAM: 2 * DIM}


def _module(device, kind, pooling, hybrid: bool) -> BatchedDynamicEmbeddingTables:
    row_bytes = (DIM + STATE[kind]) * 4
    extra = {"local_hbm_for_values": 160 * row_bytes} if hybrid else {}
    opts = [
        DynamicEmbTableOptions(
            dim=DIM,
            init_capacity=CAP,
            max_capacity=CAP,
            initializer_args=DynamicEmbInitializerArgs(mode=DynamicEmbInitializerMode.DEBUG),
            **oracle.device_resident(extra),
        )
        for _ in range(TABLES)
    ]
    return BatchedDynamicEmbeddingTables(
        opts,
        [f"t{t}" for t in range(TABLES)],
        list(range(TABLES)),
        pooling,
        kind,
        device,
        learning_rate=0.05,
    )


def _batch(device, seed: int, weighted: bool):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 6, (TABLES * BATCH,), generator=g)
    indices = torch.randint(0, KEYS, (int(lengths.sum()),), generator=g)
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
    weights = torch.rand(indices.numel(), generator=g) if weighted else None
    return indices.to(device), offsets.to(device), weights


@pytest.mark.parametrize(
    "kind,pooling,weighted",
    [
        (EmbOptimType.ADAM, DynamicEmbPoolingMode.SUM, False),
        (EmbOptimType.EXACT_SGD, DynamicEmbPoolingMode.NONE, False),
        (EmbOptimType.EXACT_SGD, DynamicEmbPoolingMode.SUM, True),
    ],
    ids=["adam-sum", "sgd-none", "sgd-sum-weighted"],
)
@pytest.mark.parametrize("schedule", ["plain", "interleaved", "prefetch"])
def test_staged_module_trains_like_an_all_device_module(
    device, monkeypatch, kind, pooling, weighted, schedule
):
    monkeypatch.setenv("DEMB_DETERMINISM_MODE", "1")  # both modules place keys alike
    monkeypatch.setattr(grouped_rows, "_stage_pays", lambda _device: True)
    used: List[bool] = []
    real = GroupedRows.update

    def spy(self, keys, table_ids, slots, grads, optimizer, frozen=(), staged=None):
        if self.has_host:
            used.append(self._current(staged))
        return real(self, keys, table_ids, slots, grads, optimizer, frozen, staged)

    monkeypatch.setattr(GroupedRows, "update", spy)
    hybrid = _module(device, kind, pooling, hybrid=True)
    plain = _module(device, kind, pooling, hybrid=False)
    rows = hybrid._group.storage.rows
    # rows with optimizer state (ADAM) are not staged: the module trains in place, as before
    stages = kind == EmbOptimType.EXACT_SGD
    assert rows.has_host and rows.stages == stages
    g = torch.Generator().manual_seed(5)

    def forward(module, batch):
        indices, offsets, weights = batch
        w = None
        if weights is not None:
            w = weights.to(device).requires_grad_()
        return module(indices, offsets, w), w

    def check(fa, fb):
        """The outputs agree; returns the coefficients of the loss both backwards take."""
        torch.testing.assert_close(fa[0], fb[0], rtol=1e-6, atol=1e-6)
        return torch.randn(fa[0].shape, generator=g).to(device)

    def backwards(fa, fb, coeff) -> None:
        """Both backwards; the per-sample weights' gradients agree."""
        for out, _ in (fa, fb):
            (out * coeff).sum().backward()
        if fa[1] is not None:
            torch.testing.assert_close(fa[1].grad, fb[1].grad, rtol=1e-5, atol=1e-6)

    batches = [_batch(device, s, weighted) for s in range(6)]
    expect: List[bool] = []
    if schedule == "plain":
        for b in batches:
            fa, fb = forward(plain, b), forward(hybrid, b)
            backwards(fa, fb, check(fa, fb))
        expect = [True] * len(batches)
    elif schedule == "interleaved":  # two forwards in flight, their backwards in order
        for b1, b2 in zip(batches[::2], batches[1::2]):
            f1 = (forward(plain, b1), forward(hybrid, b1))
            f2 = (forward(plain, b2), forward(hybrid, b2))
            c1, c2 = check(*f1), check(*f2)
            backwards(*f1, c1)
            backwards(*f2, c2)
        # the first backward finds its rows as read; the second finds them written by the first
        expect = [True, False] * (len(batches) // 2)
    else:  # a prefetch of the next batch between a forward and its backward
        for b, nxt in zip(batches, batches[1:] + batches[:1]):
            fa, fb = forward(plain, b), forward(hybrid, b)
            coeff = check(fa, fb)
            for module in (plain, hybrid):
                module.prefetch(nxt[0], nxt[1])
            backwards(fa, fb, coeff)
        expect = [True] * len(batches)
    assert used == (expect if stages else [False] * len(expect))
    probe = torch.arange(KEYS, device=device)
    for t in range(TABLES):
        assert_same_stored_rows(plain.tables[t], hybrid.tables[t], probe)
