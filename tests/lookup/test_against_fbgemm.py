"""Oracle: outputs and updated rows after several steps match FBGEMM's fused tables (no eviction).

Every pooling mode x optimizer, mixed dims for pooled modes, repeated ids, empty bags and an empty
batch. EXACT_* optimizers are checked against FBGEMM's CPU TBE (what TorchRec's fused
EmbeddingBagCollection / EmbeddingCollection run); ADAM against torch's SparseAdam on sparse
embeddings (row-sparse Adam: only rows in the batch move; bias correction by the global step), and
on the GPU machine against FBGEMM's CUDA TBE, whose build offers ADAM.

Row-wise Adagrad's weight decay (L2 / DECOUPLE) is not checked here: FBGEMM 1.8's CPU kernel ignores
weight_decay_mode (L2, DECOUPLE and NONE give identical rows there), so the formula FBGEMM's CUDA
kernels apply is checked against tests/optim/row_reference.py instead.
"""

from __future__ import annotations

import pytest
import torch
from fbgemm_gpu.split_embedding_configs import EmbOptimType

from dynamicemb_core.config import DynamicEmbPoolingMode
from dynamicemb_core.lookup import BatchedDynamicEmbeddingTables
from tests.lookup import oracle

FEATURE_TABLE_MAP = [0, 1, 1, 2]
POOLINGS = [DynamicEmbPoolingMode.SUM, DynamicEmbPoolingMode.MEAN, DynamicEmbPoolingMode.NONE]
STEPS = [dict(seed=1), dict(seed=2), dict(seed=3, empty=True), dict(seed=4)]


def _dims(pooling: DynamicEmbPoolingMode) -> list:
    return [4, 4, 4] if pooling is DynamicEmbPoolingMode.NONE else [4, 8, 12]


def _ours(dims, pooling, optimizer, device, **kw):
    return BatchedDynamicEmbeddingTables(
        [oracle.options(d) for d in dims],
        [f"t{i}" for i in range(len(dims))],
        FEATURE_TABLE_MAP,
        pooling,
        optimizer,
        device,
        **kw,
    )


def _train_both(ours, peer, peer_step, pooling, device, weighted=False, tol=1e-5):
    torch.manual_seed(0)
    for step in STEPS:
        indices, offsets, weights = oracle.make_batch(
            len(FEATURE_TABLE_MAP), 3, weighted=weighted, **step
        )
        want = peer(indices, offsets, weights) if weights is not None else peer(indices, offsets)
        got = ours(
            indices.to(device), offsets.to(device), None if weights is None else weights.to(device)
        )
        torch.testing.assert_close(got.cpu(), want.detach(), rtol=tol, atol=tol)
        coeff = torch.randn(want.shape)
        (want * coeff).sum().backward()
        peer_step()
        (got * coeff.to(device)).sum().backward()


EXACT = [
    (EmbOptimType.EXACT_SGD, dict(learning_rate=0.3)),
    (EmbOptimType.EXACT_ADAGRAD, dict(learning_rate=0.3, eps=1e-6)),
    (EmbOptimType.EXACT_ROWWISE_ADAGRAD, dict(learning_rate=0.3, eps=1e-6)),
]


@pytest.mark.parametrize("pooling", POOLINGS, ids=lambda p: p.name)
@pytest.mark.parametrize("optimizer,hp", EXACT, ids=lambda o: getattr(o, "name", ""))
def test_training_matches_fbgemm_tbe(device, pooling, optimizer, hp):
    dims = _dims(pooling)
    peer = oracle.fbgemm_peer(dims, FEATURE_TABLE_MAP, pooling, optimizer, **hp)
    ours = _ours(dims, pooling, optimizer, device, **hp)
    oracle.mirror_weights(ours, [w.detach() for w in peer.split_embedding_weights()])
    _train_both(ours, peer, lambda: None, pooling, device)
    states = peer.split_optimizer_states() if optimizer is not EmbOptimType.EXACT_SGD else None
    for t, w in enumerate(peer.split_embedding_weights()):
        emb, state = oracle.read_weights(ours, t)
        torch.testing.assert_close(emb, w.detach(), rtol=1e-5, atol=1e-5)
        if states is not None:
            torch.testing.assert_close(
                state.reshape(-1), states[t][0].detach().reshape(-1), rtol=1e-5, atol=1e-5
            )


def test_per_sample_weights_match_fbgemm_tbe(device):
    dims = _dims(DynamicEmbPoolingMode.SUM)
    opt, hp = EXACT[2]
    peer = oracle.fbgemm_peer(dims, FEATURE_TABLE_MAP, DynamicEmbPoolingMode.SUM, opt, **hp)
    ours = _ours(dims, DynamicEmbPoolingMode.SUM, opt, device, **hp)
    oracle.mirror_weights(ours, [w.detach() for w in peer.split_embedding_weights()])
    _train_both(ours, peer, lambda: None, DynamicEmbPoolingMode.SUM, device, weighted=True)
    for t, w in enumerate(peer.split_embedding_weights()):
        torch.testing.assert_close(
            oracle.read_weights(ours, t)[0], w.detach(), rtol=1e-5, atol=1e-5
        )


@pytest.mark.parametrize("pooling", POOLINGS, ids=lambda p: p.name)
def test_adam_matches_row_sparse_adam(device, pooling):
    dims = _dims(pooling)
    lr, eps = 0.05, 1e-8
    peer = oracle.SparseAdamPeer(dims, FEATURE_TABLE_MAP, pooling, lr, eps)
    ours = _ours(dims, pooling, EmbOptimType.ADAM, device, learning_rate=lr, eps=eps)
    oracle.mirror_weights(ours, peer.weights())

    def step() -> None:
        peer.opt.step()
        peer.opt.zero_grad()

    # SparseAdam adds eps to sqrt(v) before bias correction, FBGEMM after: equal up to ~eps.
    _train_both(ours, peer, step, pooling, device, tol=1e-4)
    for t, w in enumerate(peer.weights()):
        torch.testing.assert_close(oracle.read_weights(ours, t)[0], w, rtol=1e-4, atol=1e-4)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here")
@pytest.mark.parametrize("pooling", POOLINGS, ids=lambda p: p.name)
def test_adam_matches_fbgemm_cuda_tbe(pooling):
    """ADAM on CUDA against FBGEMM's own CUDA TBE (its CPU build refuses ADAM): outputs every step,
    then rows and both moments (our row layout: embedding | m | v)."""
    cuda = torch.device("cuda", torch.cuda.current_device())
    dims = _dims(pooling)
    hp = dict(learning_rate=0.05, eps=1e-8, beta1=0.9, beta2=0.999)
    tbe = oracle.fbgemm_peer(dims, FEATURE_TABLE_MAP, pooling, EmbOptimType.ADAM, device=cuda, **hp)
    ours = _ours(dims, pooling, EmbOptimType.ADAM, cuda, **hp)
    oracle.mirror_weights(ours, [w.detach().cpu() for w in tbe.split_embedding_weights()])

    def peer(indices, offsets):
        return tbe(indices.to(cuda), offsets.to(cuda)).cpu()

    _train_both(ours, peer, lambda: None, pooling, cuda, tol=1e-5)
    states = tbe.split_optimizer_states()
    for t, (w, dim) in enumerate(zip(tbe.split_embedding_weights(), dims)):
        emb, state = oracle.read_weights(ours, t)
        torch.testing.assert_close(emb, w.detach().cpu(), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(state[:, :dim], states[t][0].cpu(), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(state[:, dim:], states[t][1].cpu(), rtol=1e-5, atol=1e-5)


def test_learning_rate_change_between_steps_matches_fbgemm(device):
    dims = _dims(DynamicEmbPoolingMode.SUM)
    opt, hp = EXACT[0]
    peer = oracle.fbgemm_peer(dims, FEATURE_TABLE_MAP, DynamicEmbPoolingMode.SUM, opt, **hp)
    ours = _ours(dims, DynamicEmbPoolingMode.SUM, opt, device, **hp)
    oracle.mirror_weights(ours, [w.detach() for w in peer.split_embedding_weights()])
    peer.set_learning_rate(0.05)
    ours.set_learning_rate(0.05)
    assert ours.get_learning_rate() == 0.05
    _train_both(ours, peer, lambda: None, DynamicEmbPoolingMode.SUM, device)
    for t, w in enumerate(peer.split_embedding_weights()):
        torch.testing.assert_close(
            oracle.read_weights(ours, t)[0], w.detach(), rtol=1e-5, atol=1e-5
        )
