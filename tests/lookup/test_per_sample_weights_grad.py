"""Oracle: learned per-sample weights (SUM pooling) get torch's ``embedding_bag`` gradient.

The peer is one dense weight per table, pooled per feature by
``torch.nn.functional.embedding_bag(mode="sum", per_sample_weights=...)`` and trained by plain SGD
on its dense gradient (rows outside the batch get a zero gradient, so this is EXACT_SGD). Our
module starts from the same rows (``oracle.mirror_weights``). Each step compares the outputs, the
gradient of the weights, and, after the step, the stored rows: the weights' gradient must use the
rows the forward read, not the rows the fused step writes. Mixed dims, two features on one table,
repeated ids, empty bags, a table with no index in a batch, all-empty bags and a batch of size 0.
"""

from __future__ import annotations

from typing import List, Optional, Sequence

import pytest
import torch
import torch.nn.functional as F
from fbgemm_gpu.split_embedding_configs import EmbOptimType

from dynamicemb_core.config import DynamicEmbPoolingMode
from dynamicemb_core.lookup import BatchedDynamicEmbeddingTables
from tests.lookup import oracle

FEATURE_TABLE_MAP = [0, 1, 1, 2]
DIMS = [4, 8, 12]
LR = 0.3
# (batch size, seed, features whose bags are all empty): feature 0 empty leaves table 0 unused.
STEPS = [(3, 1, ()), (3, 2, (0,)), (3, 3, (0, 1, 2, 3)), (0, 4, ()), (4, 5, ())]


def _batch(batch_size: int, seed: int, empty_features: Sequence[int]):
    """Feature-major (indices, offsets, weights) with repeated ids and some empty bags."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, 5, (len(FEATURE_TABLE_MAP), batch_size), generator=g)
    if batch_size > 1:
        lengths[:, 1] = 0
    lengths[list(empty_features)] = 0
    lengths = lengths.reshape(-1)
    n = int(lengths.sum())
    indices = torch.randint(0, oracle.NUM_IDS // 4, (n,), generator=g) * 3  # repeats
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
    return indices, offsets, torch.rand(n, generator=g) + 0.5


class DensePeer:
    """One dense table per table id, pooled per feature by ``F.embedding_bag``."""

    def __init__(self, seed: int = 7) -> None:
        g = torch.Generator().manual_seed(seed)
        self.tables = [
            (torch.rand(oracle.NUM_IDS, d, generator=g) - 0.5).requires_grad_() for d in DIMS
        ]

    def __call__(self, indices, offsets, weights) -> torch.Tensor:
        B = (offsets.numel() - 1) // len(FEATURE_TABLE_MAP)
        if B == 0:  # embedding_bag needs at least one bag; the pooled output is (0, total_D)
            return (weights.sum() * 0).expand(0, sum(DIMS[t] for t in FEATURE_TABLE_MAP))
        outs = []
        for f, t in enumerate(FEATURE_TABLE_MAP):
            lo, hi = int(offsets[f * B]), int(offsets[(f + 1) * B])
            bag_starts = offsets[f * B : (f + 1) * B] - lo
            outs.append(
                F.embedding_bag(
                    indices[lo:hi],
                    self.tables[t],
                    bag_starts,
                    mode="sum",
                    per_sample_weights=weights[lo:hi],
                )
            )
        return torch.cat(outs, dim=1)

    def sgd_step(self, trained: Sequence[int]) -> None:
        with torch.no_grad():
            for t, w in enumerate(self.tables):
                if t in trained and w.grad is not None:
                    w -= LR * w.grad
                w.grad = None


# Storage kinds: one device buffer (the forward reads the table's own rows by slot, the backward
# runs the fused SGD op), and two-tier ones (the forward reads gathered rows of unique keys).
STORAGES = {
    "device": {},
    "hybrid": dict(local_hbm_for_values=512),
    "caching": dict(caching=True, local_hbm_for_values=512),
}


def _ours(
    device,
    training: Optional[List[bool]] = None,
    pooling=DynamicEmbPoolingMode.SUM,
    storage: str = "device",
):
    training = training or [True] * len(DIMS)
    return BatchedDynamicEmbeddingTables(
        [oracle.options(d, training=tr, **STORAGES[storage]) for d, tr in zip(DIMS, training)],
        [f"t{i}" for i in range(len(DIMS))],
        FEATURE_TABLE_MAP,
        pooling,
        EmbOptimType.EXACT_SGD,
        device,
        learning_rate=LR,
    )


def _check_steps(ours, peer: DensePeer, device, trained: Sequence[int]) -> None:
    for batch_size, seed, empty in STEPS:
        indices, offsets, weights = _batch(batch_size, seed, empty)
        w_peer = weights.clone().requires_grad_()
        w_ours = weights.to(device).requires_grad_()
        want = peer(indices, offsets, w_peer)
        got = ours(indices.to(device), offsets.to(device), w_ours)
        torch.testing.assert_close(got.detach().cpu(), want.detach(), rtol=1e-5, atol=1e-5)
        coeff = torch.randn(want.shape, generator=torch.Generator().manual_seed(seed))
        (want * coeff).sum().backward()
        (got * coeff.to(device)).sum().backward()
        assert w_ours.grad is not None and w_ours.grad.shape == weights.shape
        torch.testing.assert_close(w_ours.grad.cpu(), w_peer.grad, rtol=1e-5, atol=1e-5)
        peer.sgd_step(trained)
        for t, w in enumerate(peer.tables):
            emb, _ = oracle.read_weights(ours, t)
            torch.testing.assert_close(emb, w.detach(), rtol=1e-5, atol=1e-5)


@pytest.mark.filterwarnings("ignore:.*rounded up:UserWarning")
@pytest.mark.parametrize("storage", list(STORAGES))
def test_weight_grad_matches_embedding_bag_over_sgd_steps(device, storage):
    peer = DensePeer()
    ours = _ours(device, storage=storage)
    oracle.mirror_weights(ours, [w.detach() for w in peer.tables])
    _check_steps(ours, peer, device, trained=range(len(DIMS)))


@pytest.mark.parametrize("case", ["eval_mode", "frozen_table"])
def test_weight_grad_flows_without_table_updates(device, case):
    peer = DensePeer(seed=11)
    training = [True, False, True] if case == "frozen_table" else None
    ours = _ours(device, training)
    oracle.mirror_weights(ours, [w.detach() for w in peer.tables])
    if case == "eval_mode":
        ours.eval()
    trained = [0, 2] if case == "frozen_table" else []
    _check_steps(ours, peer, device, trained)


def test_weight_grad_keeps_the_weights_dtype(device):
    peer = DensePeer()
    ours = _ours(device)
    oracle.mirror_weights(ours, [w.detach() for w in peer.tables])
    indices, offsets, weights = _batch(3, 1, ())
    w_ours = weights.double().to(device).requires_grad_()
    w_peer = weights.clone().requires_grad_()
    got = ours(indices.to(device), offsets.to(device), w_ours)
    want = peer(indices, offsets, w_peer)
    coeff = torch.randn(want.shape)
    (want * coeff).sum().backward()
    (got * coeff.to(device)).sum().backward()
    assert w_ours.grad is not None and w_ours.grad.dtype == torch.float64
    torch.testing.assert_close(w_ours.grad.float().cpu(), w_peer.grad, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("case", ["plain_weights", "no_grad_mode"])
def test_weights_without_grad_keep_nothing(device, case):
    ours = _ours(device)
    indices, offsets, weights = _batch(3, 1, ())
    indices, offsets, weights = indices.to(device), offsets.to(device), weights.to(device)
    if case == "no_grad_mode":
        weights.requires_grad_()
        with torch.no_grad():
            out = ours(indices, offsets, weights)
        assert out.grad_fn is None
        return
    out = ours(indices, offsets, weights)
    # The autograd node holds the step: no rows were copied for a gradient nobody asked for.
    step = out.grad_fn.step
    assert step is not None and step.weight_rows is None
    out.sum().backward()
    assert weights.grad is None


def _bad_weights(case: str, n: int, device) -> torch.Tensor:
    if case == "shape":
        return torch.rand(n + 1, device=device, requires_grad=True)
    if case == "dtype":
        return torch.ones(n, dtype=torch.int64, device=device)
    if case == "device":
        return torch.rand(n, device="meta", requires_grad=True)
    return torch.rand(n, device=device, requires_grad=True)  # "mean": good weights, MEAN pooling


@pytest.mark.parametrize(
    "case,match",
    [
        ("shape", "shaped like indices"),
        ("dtype", "float tensor"),
        ("device", "must be on"),
        ("mean", "only supported with DynamicEmbPoolingMode.SUM"),
    ],
)
def test_bad_weights_raise_before_anything_is_written(device, case, match):
    pooling = DynamicEmbPoolingMode.MEAN if case == "mean" else DynamicEmbPoolingMode.SUM
    ours = _ours(device, pooling=pooling)
    indices, offsets, _ = _batch(3, 1, ())
    weights = _bad_weights(case, indices.numel(), device)
    with pytest.raises(ValueError, match=f"per_sample_weights.*{match}|{match}.*per_sample"):
        ours(indices.to(device), offsets.to(device), weights)
    assert [s["size"] for s in ours.table_stats()] == [0, 0, 0]
    assert ours.step == 0
