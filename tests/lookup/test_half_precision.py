"""Half-precision tables: ``embedding_dtype`` float16 / bfloat16 store the embeddings in that dtype
and the optimizer state in float32; updates compute in float32 and round the new embedding to the
row dtype (to nearest even), as FBGEMM's CPU TBE does for fp16 weights.

Oracles: FBGEMM's CPU ``SplitTableBatchedEmbeddingBagsCodegen`` with ``weights_precision=FP16`` and
mirrored weights (EXACT_SGD, EXACT_ADAGRAD, EXACT_ROWWISE_ADAGRAD: what its CPU build offers with
fp16 weights); for ADAM and for bfloat16 (no FBGEMM CPU peer) an independent float32 computation,
rounded to the row dtype after every step (tests/optim/row_reference.py's formulas).
"""

from __future__ import annotations

import warnings
from typing import List

import pytest
import torch
from fbgemm_gpu.split_embedding_configs import EmbOptimType, SparseType

from dynamicemb_core.config import DynamicEmbPoolingMode
from dynamicemb_core.lookup import BatchedDynamicEmbeddingTables
from dynamicemb_core.types import MemoryType
from tests.lookup import oracle
from tests.optim import row_reference as ref

FEATURE_TABLE_MAP = [0, 1, 1, 2]
POOLINGS = [DynamicEmbPoolingMode.SUM, DynamicEmbPoolingMode.MEAN, DynamicEmbPoolingMode.NONE]
STEPS = [dict(seed=1), dict(seed=2), dict(seed=3, empty=True), dict(seed=4), dict(seed=5)]
EXACT = [
    (EmbOptimType.EXACT_SGD, dict(learning_rate=0.3)),
    (EmbOptimType.EXACT_ADAGRAD, dict(learning_rate=0.3, eps=1e-6)),
    (EmbOptimType.EXACT_ROWWISE_ADAGRAD, dict(learning_rate=0.3, eps=1e-6)),
]


def _dims(pooling: DynamicEmbPoolingMode, odd: bool = False) -> List[int]:
    """FBGEMM's multiples of 4, or (``odd``) dims a 2-byte row pads before its float32 state."""
    if pooling is DynamicEmbPoolingMode.NONE:
        return [5, 5, 5] if odd else [4, 4, 4]
    return [3, 6, 5] if odd else [4, 8, 12]


def _ours(dims, pooling, optimizer, device, dtype, **kw):
    return BatchedDynamicEmbeddingTables(
        [oracle.options(d, embedding_dtype=dtype) for d in dims],
        [f"t{i}" for i in range(len(dims))],
        FEATURE_TABLE_MAP,
        pooling,
        optimizer,
        device,
        **kw,
    )


def _assert_stored_as(module, dtype: torch.dtype) -> None:
    """The rows really are stored in ``dtype``, and every embedding read back is one of its values."""
    group = module.tables[0].group
    assert group.rows.values.dtype == dtype
    for t in range(len(module.dims)):
        emb, _ = oracle.read_weights(module, t)
        assert torch.equal(emb, emb.to(dtype).to(torch.float32))


def _fp16_ulp(x: torch.Tensor) -> torch.Tensor:
    """The spacing of float16 values at each element of ``x`` (float16 values, as float32)."""
    h = x.abs().half()
    return (torch.nextafter(h, torch.full_like(h, float("inf"))) - h).float()


@pytest.mark.parametrize("pooling", POOLINGS, ids=lambda p: p.name)
@pytest.mark.parametrize("optimizer,hp", EXACT, ids=lambda o: getattr(o, "name", ""))
def test_fp16_training_matches_fbgemm_fp16_tbe(device, pooling, optimizer, hp):
    """Outputs every step; rows and optimizer state after every step.

    Row-wise Adagrad on the CPU: bit for bit over all steps (FBGEMM's CPU kernel computes the new
    weight in float32 and rounds it once, as ours; on CUDA our gradient sums run in another order,
    whose last-bit differences may move a rounding: one unit, as below). EXACT_SGD / EXACT_ADAGRAD: FBGEMM's CPU kernels round the
    step (lr * g, or lr * g / (sqrt(m) + eps)) to float16 before subtracting it in float16, a
    second rounding that its CUDA kernels and ours do not make; so each step's rows must agree to
    one float16 unit (of the larger of the row's values before and after the step), and the peer is
    re-synchronised to ours before the next step (no drift).
    """
    dims = _dims(pooling)
    peer = oracle.fbgemm_peer(
        dims, FEATURE_TABLE_MAP, pooling, optimizer, weights_precision=SparseType.FP16, **hp
    )
    ours = _ours(dims, pooling, optimizer, device, torch.float16, **hp)
    oracle.mirror_weights(ours, [w.detach().float() for w in peer.split_embedding_weights()])
    exact = optimizer is EmbOptimType.EXACT_ROWWISE_ADAGRAD and torch.device(device).type == "cpu"
    before = [w.detach().float().clone() for w in peer.split_embedding_weights()]
    torch.manual_seed(0)
    for step in STEPS:
        indices, offsets, _ = oracle.make_batch(len(FEATURE_TABLE_MAP), 3, **step)
        want = peer(indices, offsets)
        got = ours(indices.to(device), offsets.to(device))
        assert got.dtype == torch.float32
        torch.testing.assert_close(got.cpu(), want.detach().float(), rtol=1e-6, atol=1e-6)
        coeff = torch.randn(want.shape)
        (want.float() * coeff).sum().backward()
        (got * coeff.to(device)).sum().backward()
        states = peer.split_optimizer_states() if optimizer is not EmbOptimType.EXACT_SGD else None
        for t, w in enumerate(peer.split_embedding_weights()):
            emb, state = oracle.read_weights(ours, t)
            theirs = w.detach().float()
            if exact:
                torch.testing.assert_close(emb, theirs, rtol=0, atol=0)
            else:
                off = (emb - theirs).abs()
                unit = _fp16_ulp(
                    torch.maximum(torch.maximum(emb.abs(), theirs.abs()), before[t].abs())
                )
                assert bool((off <= unit).all()), f"table {t}: {(off - unit).max()}"
                with torch.no_grad():
                    w.copy_(emb.half())
                before[t] = emb.clone()
            if states is not None:
                torch.testing.assert_close(
                    state.reshape(-1), states[t][0].detach().reshape(-1), rtol=1e-6, atol=1e-6
                )
    _assert_stored_as(ours, torch.float16)


def _fbgemm_has_cuda_tbe() -> bool:
    """Whether the installed fbgemm_gpu is a CUDA build (its CPU build has no CUDA TBE kernels)."""
    import fbgemm_gpu

    return torch.cuda.is_available() and getattr(fbgemm_gpu, "__variant__", "cpu") != "cpu"


# ADAM is left out: FBGEMM 1.6.0's CUDA TBE itself cannot train fp16 weights with ADAM (its
# backward raises "row_counter_dev ... expected Float, found Half"), so there is no peer to compare
# with. Our ADAM on half-precision rows is checked against the rounded float32 model instead
# (test_training_matches_rounded_float32_model, float16 and bfloat16, CPU and CUDA) and CUDA
# against CPU (test_cuda_kernels_match_cpu_kernels).
CUDA_TBE_OPTIMIZERS = EXACT


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here")
@pytest.mark.skipif(not _fbgemm_has_cuda_tbe(), reason="fbgemm_gpu is its CPU build: no CUDA TBE")
@pytest.mark.parametrize("pooling", POOLINGS, ids=lambda p: p.name)
@pytest.mark.parametrize("optimizer,hp", CUDA_TBE_OPTIMIZERS, ids=lambda o: getattr(o, "name", ""))
def test_fp16_training_matches_fbgemm_cuda_fp16_tbe(pooling, optimizer, hp):
    """Our CUDA fp16 tables against FBGEMM's CUDA TBE with ``weights_precision=FP16`` and
    ``stochastic_rounding=False``: outputs every step; rows and optimizer state after every step;
    the peer is re-synchronised to our rows before the next step (no drift).

    What is expected: FBGEMM's CUDA kernels, as ours, compute the new weight in float32 from the
    fp16 weight and round it to nearest once (unlike its CPU kernels, whose SGD / Adagrad round
    the step to fp16 first). The float32 results may still differ by a few float32 units: the
    order of the gradient sums of repeated keys, row-wise Adagrad's sum of squares (a warp
    reduction in FBGEMM's order), FMA contraction in FBGEMM's kernels. That holds for all three
    optimizers, row-wise Adagrad included, so none is required to agree bit for bit. Such a
    difference changes the fp16 result only where the float32 value lies within those few units
    of a midpoint between two fp16 values, and then by exactly one fp16 unit: with 2^13 float32
    values per fp16 unit, a k-unit difference moves about k / 2^13 of the elements. So: every
    element within one fp16 unit, and over the whole run at most 1% of the elements that changed
    differ at all (about 0.1% expected; a second rounding, as FBGEMM's CPU SGD makes, would
    move a large share of them)."""
    cuda = torch.device("cuda", torch.cuda.current_device())
    dims = _dims(pooling)
    tbe = oracle.fbgemm_peer(
        dims, FEATURE_TABLE_MAP, pooling, optimizer, device=cuda,
        weights_precision=SparseType.FP16, stochastic_rounding=False, **hp,
    )  # fmt: skip
    ours = _ours(dims, pooling, optimizer, cuda, torch.float16, **hp)
    assert ours.stochastic_rounding_seed is None
    oracle.mirror_weights(ours, [w.detach().float().cpu() for w in tbe.split_embedding_weights()])
    before = [w.detach().float().cpu() for w in tbe.split_embedding_weights()]
    changed = differ = 0
    torch.manual_seed(0)
    for step in STEPS:
        indices, offsets, _ = oracle.make_batch(len(FEATURE_TABLE_MAP), 3, **step)
        want = tbe(indices.to(cuda), offsets.to(cuda))
        got = ours(indices.to(cuda), offsets.to(cuda))
        torch.testing.assert_close(got.float(), want.detach().float(), rtol=1e-5, atol=1e-5)
        coeff = torch.randn(want.shape).to(cuda)
        (want.float() * coeff).sum().backward()
        (got * coeff).sum().backward()
        states = tbe.split_optimizer_states() if optimizer is not EmbOptimType.EXACT_SGD else None
        for t, w in enumerate(tbe.split_embedding_weights()):
            emb, state = oracle.read_weights(ours, t)
            theirs = w.detach().float().cpu()
            off = (emb - theirs).abs()
            unit = _fp16_ulp(torch.maximum(torch.maximum(emb.abs(), theirs.abs()), before[t].abs()))
            assert bool((off <= unit).all()), f"table {t}: {(off - unit).max()}"
            changed += int(((emb != before[t]) | (theirs != before[t])).sum())
            differ += int((emb != theirs).sum())
            with torch.no_grad():
                w.copy_(emb.half().to(cuda))
            before[t] = emb.clone()
            if states is not None:
                rows = emb.size(0)
                peer_state = torch.cat(
                    [s.detach().float().cpu().reshape(rows, -1) for s in states[t]], dim=1
                )
                torch.testing.assert_close(
                    state[:, : peer_state.size(1)], peer_state, rtol=1e-5, atol=1e-6
                )
    assert changed > 100  # the run trains: the bound below is over many elements
    assert differ <= 0.01 * changed, f"{differ} of {changed} updated elements differ"
    _assert_stored_as(ours, torch.float16)


class RoundedPeer:
    """Independent float32 model of a half-precision table: pooled lookups with torch, row-sparse
    updates with row_reference's formulas, the embeddings rounded to ``dtype`` after each step."""

    def __init__(self, dims, pooling, optimizer, dtype, hp, seed=123) -> None:
        g = torch.Generator().manual_seed(seed)
        self.dtype, self.pooling, self.optimizer, self.hp = dtype, pooling, optimizer, hp
        self.weights = [
            (torch.rand(oracle.NUM_IDS, d, generator=g) - 0.5).to(dtype).float() for d in dims
        ]
        if optimizer is EmbOptimType.ADAM:
            self.state = [torch.zeros(oracle.NUM_IDS, 2 * d) for d in dims]
        elif optimizer is EmbOptimType.EXACT_ROWWISE_ADAGRAD:
            self.state = [torch.zeros(oracle.NUM_IDS) for _ in dims]
        elif optimizer is EmbOptimType.EXACT_ADAGRAD:
            self.state = [torch.zeros(oracle.NUM_IDS, d) for d in dims]
        else:
            self.state = [torch.zeros(oracle.NUM_IDS, 0) for d in dims]
        self.step = 0

    def forward(self, indices, offsets):
        B = (offsets.numel() - 1) // len(FEATURE_TABLE_MAP)
        leaves = [w.clone().requires_grad_(True) for w in self.weights]
        outs = []
        for f, t in enumerate(FEATURE_TABLE_MAP):
            lo, hi = int(offsets[f * B]), int(offsets[(f + 1) * B])
            idx = indices[lo:hi]
            if self.pooling is DynamicEmbPoolingMode.NONE:
                outs.append(leaves[t][idx])
                continue
            off = offsets[f * B : (f + 1) * B] - lo
            mode = "sum" if self.pooling is DynamicEmbPoolingMode.SUM else "mean"
            outs.append(torch.nn.functional.embedding_bag(idx, leaves[t], off, mode=mode))
        dim = 0 if self.pooling is DynamicEmbPoolingMode.NONE else 1
        return torch.cat(outs, dim=dim), leaves, indices

    def update(self, leaves, indices) -> None:
        self.step += 1
        hp, rows = self.hp, torch.unique(indices)
        for t, leaf in enumerate(leaves):
            if leaf.grad is None:
                continue
            g, w, s = leaf.grad[rows], self.weights[t][rows], self.state[t][rows]
            touched = g.abs().sum(1) > 0  # rows of this table that the batch read
            if self.optimizer is EmbOptimType.EXACT_SGD:
                new = ref.sgd(w, g, hp["learning_rate"])
            elif self.optimizer is EmbOptimType.EXACT_ADAGRAD:
                new, s = ref.adagrad(w, s, g, hp["learning_rate"], hp["eps"])
            elif self.optimizer is EmbOptimType.EXACT_ROWWISE_ADAGRAD:
                new, s = ref.rowwise_adagrad(w, s, g, hp["learning_rate"], hp["eps"])
            else:
                d = w.shape[1]
                new, m, v = ref.adam(
                    w, s[:, :d], s[:, d:], g, hp["learning_rate"], hp["eps"],
                    hp["beta1"], hp["beta2"], 0.0, self.step,
                )  # fmt: skip
                s = torch.cat([m, v], dim=1)
            keep = touched if new.dim() == 1 else touched.unsqueeze(1)
            self.weights[t][rows] = torch.where(keep, new.to(self.dtype).float(), w)
            self.state[t][rows] = torch.where(
                keep if s.dim() > 1 else touched, s, self.state[t][rows]
            )


ROUNDED = EXACT + [
    (EmbOptimType.ADAM, dict(learning_rate=0.05, eps=1e-8, beta1=0.9, beta2=0.999)),
]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("pooling", POOLINGS, ids=lambda p: p.name)
@pytest.mark.parametrize("optimizer,hp", ROUNDED, ids=lambda o: getattr(o, "name", ""))
def test_training_matches_rounded_float32_model(device, dtype, pooling, optimizer, hp):
    dims = _dims(pooling, odd=True)
    peer = RoundedPeer(dims, pooling, optimizer, dtype, hp)
    ours = _ours(dims, pooling, optimizer, device, dtype, **hp)
    oracle.mirror_weights(ours, peer.weights)
    torch.manual_seed(0)
    for step in STEPS:
        indices, offsets, _ = oracle.make_batch(len(FEATURE_TABLE_MAP), 3, **step)
        want, leaves, idx = peer.forward(indices, offsets)
        got = ours(indices.to(device), offsets.to(device))
        torch.testing.assert_close(got.cpu(), want.detach(), rtol=1e-6, atol=1e-6)
        coeff = torch.randn(want.shape)
        (want * coeff).sum().backward()
        peer.update(leaves, idx)
        (got * coeff.to(device)).sum().backward()
    _assert_stored_as(ours, dtype)
    for t, w in enumerate(peer.weights):
        emb, state = oracle.read_weights(ours, t)
        # The float32 results may differ in their last bit (summation order of the gradients),
        # which can move a rounding by one unit of the row dtype: allow one unit, no more.
        ulp = 2.0**-7 if dtype is torch.bfloat16 else 2.0**-10
        torch.testing.assert_close(emb, w, rtol=ulp, atol=1e-6)
        assert (emb == w).float().mean() > 0.95
        torch.testing.assert_close(
            state.reshape(-1)[: peer.state[t].numel()],
            peer.state[t].reshape(-1),
            rtol=1e-4,
            atol=1e-6,
        )


def test_unsupported_combinations_raise_clearly(device):
    """Half precision lives in the grouped (device / hybrid) tables only, one dtype per module."""
    from dynamicemb_core.lookup import BatchedDynamicEmbeddingTables as Module

    sgd = EmbOptimType.EXACT_SGD
    with pytest.raises(ValueError, match="share one embedding_dtype"):
        Module(
            [oracle.options(4, embedding_dtype=torch.float16), oracle.options(4)],
            ["a", "b"], [0, 1], DynamicEmbPoolingMode.SUM, sgd, device,
        )  # fmt: skip
    with pytest.raises(ValueError, match="device and hybrid tables only"):
        Module(
            [oracle.options(4, embedding_dtype=torch.bfloat16, caching=True,
                            local_hbm_for_values=1 << 12)],
            ["a"], [0], DynamicEmbPoolingMode.SUM, sgd, device,
        )  # fmt: skip


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_grouped_rows_store_embeddings_in_dtype_and_state_in_float32(device, dtype):
    """Scatter then gather: the embedding comes back rounded to ``dtype`` (nearest even), the
    float32 state exactly; a stored row takes the padded embedding plus two elements per state
    column, and the buffer holds that many ``dtype`` elements, no more."""
    from dynamicemb_core.storage.grouped_rows import GroupedRows

    dims, widths, caps = [3, 4], [3 + 2, 4 + 1], [5, 6]  # Adagrad-like and row-wise-like rows
    rows = GroupedRows(torch.device(device), widths, dims, caps, dtype=dtype)
    assert rows.values.dtype == dtype
    assert rows.values.numel() == 5 * (4 + 4) + 6 * (4 + 2)
    tids = torch.tensor([0, 1, 1, 0], device=device)
    slots = torch.tensor([4, 0, 5, -1], device=device)
    g = torch.Generator().manual_seed(3)
    src = (torch.randn(4, 5, generator=g) * 10).to(device)
    rows.scatter(tids, slots, src, check=True)
    got = rows.gather(tids, slots, 5).cpu()
    want = src.cpu().clone()
    for i, (t, s) in enumerate(zip(tids.tolist(), slots.tolist())):
        d, w = dims[t], widths[t]
        if s < 0:
            want[i] = 0
            continue
        want[i, :d] = want[i, :d].to(dtype).float()
        want[i, w:] = 0
    assert torch.equal(got, want)
    assert rows.memory_usage(MemoryType.DEVICE) == rows.values.numel() * 2


def test_grouped_ops_refuse_a_misaligned_half_layout(device):
    from dynamicemb_core.ops import lookup_ops

    values = torch.zeros(64, dtype=torch.float16, device=device)
    meta = torch.tensor([[1, 6, 4, 2]], device=device)  # odd offset: the state would be misaligned
    with pytest.raises(ValueError, match="half-precision row layout"):
        lookup_ops.grouped_gather(
            values, meta, torch.zeros(1, dtype=torch.int64, device=device),
            torch.zeros(1, dtype=torch.int64, device=device), 4,
        )  # fmt: skip
    with pytest.raises(TypeError, match="float32, float16 or bfloat16"):
        lookup_ops.grouped_gather(
            values.to(torch.float64), meta, torch.zeros(1, dtype=torch.int64, device=device),
            torch.zeros(1, dtype=torch.int64, device=device), 4,
        )  # fmt: skip


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("optimizer,hp", ROUNDED, ids=lambda o: getattr(o, "name", ""))
def test_cuda_kernels_match_cpu_kernels(dtype, optimizer, hp):
    """The CUDA row kernels against the CPU ones: twin modules, one per device, same batches."""
    pooling = DynamicEmbPoolingMode.SUM
    dims = _dims(pooling, odd=True)
    start = RoundedPeer(dims, pooling, optimizer, dtype, hp).weights
    cuda = torch.device("cuda", torch.cuda.current_device())
    twins = [_ours(dims, pooling, optimizer, dev, dtype, **hp) for dev in ("cpu", cuda)]
    for m in twins:
        oracle.mirror_weights(m, start)
    torch.manual_seed(0)
    for step in STEPS:
        indices, offsets, _ = oracle.make_batch(len(FEATURE_TABLE_MAP), 3, **step)
        outs = [m(indices.to(m.device), offsets.to(m.device)) for m in twins]
        coeff = torch.randn(outs[0].shape)
        for out in outs:
            (out * coeff.to(out.device)).sum().backward()
    _assert_stored_as(twins[1], dtype)
    ulp = 2.0**-7 if dtype is torch.bfloat16 else 2.0**-10
    for t in range(len(dims)):
        (e_cpu, s_cpu), (e_gpu, s_gpu) = (oracle.read_weights(m, t) for m in twins)
        torch.testing.assert_close(e_gpu, e_cpu, rtol=ulp, atol=1e-6)
        assert (e_gpu == e_cpu).float().mean() > 0.95
        torch.testing.assert_close(s_gpu, s_cpu, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("stochastic", [False, True], ids=["nearest", "stochastic"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_hybrid_and_growing_half_precision_tables_match_a_device_resident_one(
    device, dtype, stochastic
):
    """The same training in three layouts gives the same rows bit for bit: the whole table in
    device memory; a hybrid table (rows past one bucket in host memory); a table that starts at one
    bucket and doubles while training (its rows move between buffers). With stochastic rounding
    too: the random bits follow the key, not the slot or the part (device or host) it lives in."""
    optimizer, hp = ROUNDED[3]  # ADAM: embedding and two moments per element
    dims = [3, 6]
    row = oracle.options(1).__class__  # DynamicEmbTableOptions
    layouts = {
        "whole": dict(),
        "hybrid": dict(
            local_hbm_for_values=16 * (4 * 2 + 4 * 2 * 6)
        ),  # below one bucket: rounded up
        "growing": dict(init_capacity=16, bucket_capacity=16, max_capacity=1024),
    }
    modules = {}
    for name, extra in layouts.items():
        opts = []
        for d in dims:
            kw = dict(dim=d, embedding_dtype=dtype, max_capacity=1024, bucket_capacity=16)
            kw.update(extra)
            opts.append(row(**oracle.device_resident(kw)))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the hybrid budget's round-up to one bucket
            modules[name] = BatchedDynamicEmbeddingTables(
                opts, ["a", "b"], [0, 1], DynamicEmbPoolingMode.SUM, optimizer, device,
                stochastic_rounding=stochastic, **hp,
            )  # fmt: skip
            if stochastic:
                modules[name].stochastic_rounding_seed = 5
    g = torch.Generator().manual_seed(11)
    for step in range(4):
        lengths = torch.randint(0, 6, (2 * 8,), generator=g)
        indices = torch.randint(0, 400, (int(lengths.sum()),), generator=g)
        offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
        coeff = torch.randn(8, sum(dims), generator=g)
        outs = {}
        for name, m in modules.items():
            torch.manual_seed(step)  # the same initial embeddings for new keys
            outs[name] = m(indices.to(device), offsets.to(device))
            (outs[name] * coeff.to(device)).sum().backward()
        for name in ("hybrid", "growing"):
            assert torch.equal(outs[name], outs["whole"]), (name, step)
    assert modules["growing"].tables[0].capacity(0) > 16  # it grew
    hybrid = modules["hybrid"].tables[0]
    assert hybrid.device_rows(0) < hybrid.capacity(0)  # some rows in host memory
    keys = torch.arange(400, device=device)
    for t in range(len(dims)):
        want = modules["whole"].tables[t].find(0, keys)
        for name in ("hybrid", "growing"):
            got = modules[name].tables[t].find(0, keys)
            assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), (name, t)


def test_a_frozen_half_precision_table_beside_a_training_one(device):
    """``training=False`` in a half-precision module: its rows read as stored and never move (the
    fused update sees it through a frozen layout of the 2-byte buffer), the other table trains."""
    opts = [
        oracle.options(5, embedding_dtype=torch.float16),
        oracle.options(5, embedding_dtype=torch.float16, training=False),
    ]
    m = BatchedDynamicEmbeddingTables(
        opts, ["a", "b"], [0, 1], DynamicEmbPoolingMode.SUM, EmbOptimType.ADAM, device,
        learning_rate=0.1,
    )  # fmt: skip
    start = RoundedPeer([5, 5], DynamicEmbPoolingMode.SUM, EmbOptimType.ADAM, torch.float16, {})
    oracle.mirror_weights(m, start.weights)
    before = [oracle.read_weights(m, t)[0] for t in range(2)]
    indices, offsets, _ = oracle.make_batch(2, 4, seed=7)
    m(indices.to(device), offsets.to(device)).sum().backward()
    after = [oracle.read_weights(m, t)[0] for t in range(2)]
    assert not torch.equal(after[0], before[0])
    assert torch.equal(after[1], before[1])
