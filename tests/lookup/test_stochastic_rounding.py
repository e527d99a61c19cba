"""Stochastic rounding of half-precision rows (FBGEMM's ``stochastic_rounding`` for fp16 weights).

An update computed in float32 lands between two neighbouring values of the row dtype; rounding to
nearest (the default) drops every update smaller than half a unit, so a weight receiving many small
updates never moves, while stochastic rounding picks the upper neighbour with the probability that
makes the stored value right on average. The random bits are a hash of (seed, step, table, key,
element) shared by the CPU and CUDA kernels (csrc/include/dynamicemb/grouped.h): never of the slot,
which depends on the engine (CUDA's key-parallel one places keys in a varying order), the capacity
and the insertion history. So every test here reads rows back by key.
"""

from __future__ import annotations

import pytest
import torch
from fbgemm_gpu.split_embedding_configs import EmbOptimType

from dynamicemb_core.config import DynamicEmbPoolingMode
from dynamicemb_core.lookup import BatchedDynamicEmbeddingTables
from dynamicemb_core.ops import lookup_ops
from tests.lookup import oracle

HALF = [torch.float16, torch.bfloat16]
# the module-level tests' optimizers with their hyper-parameters
MODULE_OPTIMIZERS = [
    (EmbOptimType.EXACT_SGD, dict(learning_rate=0.01)),
    (EmbOptimType.EXACT_ROWWISE_ADAGRAD, dict(learning_rate=0.01, eps=1e-6)),
    (EmbOptimType.ADAM, dict(learning_rate=0.001, eps=1e-8)),
]
ROWS, DIM = 256, 64
START = 1.0


def _unit_below_one(dtype: torch.dtype) -> float:
    """The spacing of ``dtype`` just below 1.0."""
    return 2.0**-11 if dtype is torch.float16 else 2.0**-8


def _module(device, dtype, **kw) -> BatchedDynamicEmbeddingTables:
    return BatchedDynamicEmbeddingTables(
        [oracle.options(DIM, embedding_dtype=dtype)],
        ["t"],
        [0],
        DynamicEmbPoolingMode.SUM,
        EmbOptimType.EXACT_SGD,
        device,
        **kw,
    )


def _train_constant(module, steps: int, lr_times_grad: float) -> torch.Tensor:
    """Every row starts at START and takes ``steps`` SGD updates of exactly ``lr_times_grad``
    (one key per bag, gradient 1, learning rate ``lr_times_grad``); returns the (ROWS, DIM) rows."""
    device = module.device
    oracle.mirror_weights(module, [torch.full((ROWS, DIM), START)])
    module.set_learning_rate(lr_times_grad)
    indices = torch.arange(ROWS, dtype=torch.int64, device=device)
    offsets = torch.arange(ROWS + 1, dtype=torch.int64, device=device)
    for _ in range(steps):
        module(indices, offsets).sum().backward()
    found, rows, _ = module.tables[0].find(0, indices)
    assert bool(found.all())
    return rows[:, :DIM].cpu()


@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_many_small_updates_average_to_the_float32_result(device, dtype):
    """100 SGD updates of a quarter unit each: rounding to nearest never moves the weights (the
    default, and what stochastic_rounding=False keeps); stochastic rounding moves them by the
    float32 amount on average over the ROWS x DIM elements (the standard error of the mean is
    0.03 units)."""
    unit = _unit_below_one(dtype)
    steps, delta = 100, unit / 4
    exact = START - steps * delta  # representable in float32: the float32 model's result

    nearest = _train_constant(_module(device, dtype), steps, delta)
    assert torch.equal(nearest, torch.full_like(nearest, START))

    torch.manual_seed(0)
    module = _module(device, dtype, stochastic_rounding=True)
    assert module.stochastic_rounding_seed is not None
    rounded = _train_constant(module, steps, delta)
    assert torch.equal(rounded, rounded.to(dtype).float())  # still values of the row dtype
    assert rounded.unique().numel() > 3  # each element took its own path
    assert abs(rounded.double().mean().item() - exact) < 0.25 * unit
    # Each step moves an element down one unit with probability 1/4, independently: the count of
    # moves is Binomial(steps, 1/4), whose variance (18.75) the elements show to a few percent.
    moves = (START - rounded.double()) / unit
    assert torch.equal(moves, moves.round())
    assert abs(moves.var().item() - steps * 0.25 * 0.75) < 0.1 * steps * 0.25 * 0.75


@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_one_update_rounds_up_with_the_right_probability(device, dtype):
    """One update of 0.3 units: each element becomes the lower neighbour or the upper one, the upper
    one in 30% of the elements (ROWS x DIM draws: 5 standard deviations is 2%)."""
    unit = _unit_below_one(dtype)
    torch.manual_seed(1)
    module = _module(device, dtype, stochastic_rounding=True)
    # START - 0.3 unit lies between 1 - unit and 1: 1.0 is the nearest, 1 - unit the other one.
    rounded = _train_constant(module, 1, 0.3 * unit)
    lower = rounded == START - unit
    assert bool((lower | (rounded == START)).all())
    assert abs(lower.double().mean().item() - 0.3) < 0.02


@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_a_seed_reproduces_the_run_and_another_seed_does_not(device, dtype):
    unit = _unit_below_one(dtype)

    def run(torch_seed=None, seed=None):
        if torch_seed is not None:
            torch.manual_seed(torch_seed)
        module = _module(device, dtype, stochastic_rounding=True)
        if seed is not None:
            module.stochastic_rounding_seed = seed
        return module.stochastic_rounding_seed, _train_constant(module, 5, unit / 3)

    seed_a, a = run(torch_seed=7)
    seed_b, b = run(torch_seed=7)
    assert seed_a == seed_b and torch.equal(a, b)
    _, c = run(seed=seed_a)
    assert torch.equal(a, c)
    _, d = run(seed=seed_a + 1)
    assert not torch.equal(a, d)


def test_float32_tables_and_the_default_round_to_nearest(device):
    """stochastic_rounding=True on float32 rows changes nothing (FBGEMM rounds only fp16/bf16
    weights), and a half-precision module without it has no seed."""
    assert _module(device, torch.float16).stochastic_rounding_seed is None
    assert _module(device, torch.float32, stochastic_rounding=True).stochastic_rounding_seed is None
    plain = _train_constant(_module(device, torch.float32), 3, 1e-4)
    asked = _module(device, torch.float32, stochastic_rounding=True)
    asked.stochastic_rounding_seed = 3  # even a seed: float32 results are stored as they are
    assert torch.equal(plain, _train_constant(asked, 3, 1e-4))


def test_torchrec_fused_params_ask_for_it(device):
    """The sharder's fused_params go through split_fused_params: stochastic_rounding=True there
    reaches the tables (TorchRec's placement keys beside it are dropped, as for the other flags)."""
    from dynamicemb_core.optim.args import split_fused_params

    fused = {"optimizer": EmbOptimType.EXACT_SGD, "learning_rate": 0.1, "cache_load_factor": 0.2}
    for asked in (True, False):
        optimizer, kwargs, out = split_fused_params({**fused, "stochastic_rounding": asked})
        module = BatchedDynamicEmbeddingTables(
            [oracle.options(4, embedding_dtype=torch.bfloat16)], ["t"], [0],
            DynamicEmbPoolingMode.SUM, optimizer, device, output_dtype=out, **kwargs,
        )  # fmt: skip
        assert (module.stochastic_rounding_seed is not None) is asked


def test_bad_seeds_are_refused(device):
    module = _module(device, torch.float16, stochastic_rounding=True)
    for bad in (-1, 2**63, 1.5, True):
        with pytest.raises(ValueError, match="stochastic_rounding_seed"):
            module.stochastic_rounding_seed = bad
    module.stochastic_rounding_seed = None  # back to rounding to nearest
    assert module.stochastic_rounding_seed is None


def _half_group(device, dtype, dims, caps, seed: int = 4):
    """(flat values, meta) of tables ``dims`` x ``caps`` rows of ``dtype`` with room for any
    optimizer's state; embeddings in [0.5, 1.5), states zero."""
    from dynamicemb_core.optim.layout import stored_width

    widths = [stored_width(3 * d + 1, d, dtype) for d in dims]
    offsets = [sum(c * w for c, w in zip(caps[:t], widths[:t])) for t in range(len(dims))]
    meta = torch.tensor([[offsets[t], widths[t], caps[t], dims[t]] for t in range(len(dims))])
    g = torch.Generator().manual_seed(seed)
    values = torch.zeros(offsets[-1] + caps[-1] * widths[-1], dtype=dtype)
    for t, d in enumerate(dims):
        block = values[offsets[t] : offsets[t] + caps[t] * widths[t]].view(caps[t], widths[t])
        block[:, :d] = (torch.rand(caps[t], d, generator=g) + 0.5).to(dtype)
    return values.to(device), meta.to(device)


def _rows_at(values: torch.Tensor, meta: torch.Tensor, t: int, slots: torch.Tensor):
    """Raw bits (int16) of table ``t``'s stored rows at ``slots``: the float32 state's halves,
    read as the row dtype, may be NaN patterns, so rows are compared as bits."""
    off, width, cap, _ = (int(x) for x in meta[t].tolist())
    block = values[off : off + cap * width].view(cap, width)
    return block[slots.to(values.device)].view(torch.int16).cpu()


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("optimizer", [0, 1, 2, 3], ids=["SGD", "ADAGRAD", "ROWWISE", "ADAM"])
def test_the_update_ops_round_alike(device, dtype, optimizer):
    """grouped_update and the fused grouped_reduce_update give the same rows for one seed (the
    random stream is the row's (table, key), not the path that updates it); seed -1 rounds to
    nearest, as the ops did before the seed existed."""
    dims, caps = [5, 8], [40, 40]
    start, meta = _half_group(device, dtype, dims, caps)
    g = torch.Generator().manual_seed(5)
    # 33 pairs per table (one skipped: slot -1), table 0's first
    tids = torch.arange(66, device=device) // 33
    slots = torch.cat([torch.arange(32), torch.tensor([-1]), torch.randperm(40, generator=g)[:33]])
    slots = slots.to(device)
    keys = torch.randint(-(2**62), 2**62, (66,), generator=g).to(device)
    grads = (torch.randn(66, 8, generator=g) * 1e-3).to(device)
    hyper = (optimizer, 0.5, 1e-6, 0.9, 0.999, 0.0, 0, 3)

    def updated(seed: int, fused: bool) -> torch.Tensor:
        values = start.clone()
        if not fused:
            lookup_ops.grouped_update(values, meta, tids, slots, grads, *hyper, seed, keys=keys)
            return values
        # NONE pooling, two features (tables 0, 1) of 33 one-index bags, one index per unique
        # key: the reduction is the gradient itself
        lookup_ops.grouped_reduce_update(
            values, meta, tids, slots, grads, torch.arange(66, device=device),
            torch.arange(67, device=device), None, torch.tensor([0, 1], device=device),
            torch.tensor([0, 8, 16], device=device), lookup_ops.POOL_NONE, 33, 8, *hyper, seed,
            keys=keys,
        )  # fmt: skip
        return values

    def bits(values: torch.Tensor) -> torch.Tensor:
        return values.view(torch.int16).cpu()

    nearest = updated(-1, False)
    plain = start.clone()
    lookup_ops.grouped_update(plain, meta, tids, slots, grads, *hyper)
    assert torch.equal(bits(nearest), bits(plain))
    a, b = updated(11, False), updated(11, True)
    assert torch.equal(bits(a), bits(b))
    assert not torch.equal(bits(a), bits(nearest))


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("optimizer", [0, 1, 2, 3], ids=["SGD", "ADAGRAD", "ROWWISE", "ADAM"])
@pytest.mark.parametrize("fused", [False, True], ids=["update", "reduce_update"])
def test_the_rounding_follows_the_key_not_the_slot(device, dtype, optimizer, fused):
    """The same keys with the same rows and gradients at other slots (another capacity, another
    placement) round to the same bits, row by row; other keys at the same slots round otherwise."""
    dims = [6, 8]
    n = 30  # keys per table
    g = torch.Generator().manual_seed(6)
    keys = torch.randint(-(2**62), 2**62, (2 * n,), generator=g)
    tids = torch.arange(2 * n) // n
    grads = torch.randn(2 * n, 8, generator=g) * 1e-3
    hyper = (optimizer, 0.5, 1e-6, 0.9, 0.999, 0.0, 0, 3, 77)

    def train(caps, slots, keys=keys):
        """Rows of the keys placed at ``slots`` (each table's rows from one start, by key order),
        updated once; -> per table, the updated rows in key order, as bits."""
        values, meta = _half_group(device, dtype, dims, caps)
        start, start_meta = _half_group(device, dtype, dims, [n, n])  # row i: key i's start
        for t in range(2):
            off, width = int(meta[t, 0]), int(meta[t, 1])
            block = values[off : off + caps[t] * width].view(caps[t], width)
            s0 = int(start_meta[t, 0])
            block[slots[t * n : (t + 1) * n].to(device)] = start[s0 : s0 + n * width].view(n, width)
        if fused:
            lookup_ops.grouped_reduce_update(
                values, meta, tids.to(device), slots.to(device), grads.to(device),
                torch.arange(2 * n, device=device), torch.arange(2 * n + 1, device=device), None,
                torch.tensor([0, 1], device=device), torch.tensor([0, 8, 16], device=device),
                lookup_ops.POOL_NONE, n, 8, *hyper, keys=keys.to(device),
            )  # fmt: skip
        else:
            lookup_ops.grouped_update(
                values, meta, tids.to(device), slots.to(device), grads.to(device), *hyper,
                keys=keys.to(device),
            )  # fmt: skip
        return [_rows_at(values, meta, t, slots[t * n : (t + 1) * n]) for t in range(2)]

    here = train([n, n], torch.arange(n).repeat(2))
    moved = [torch.randperm(cap, generator=g)[:n] for cap in (64, 48)]
    there = train([64, 48], torch.cat(moved))
    assert all(torch.equal(a, b) for a, b in zip(here, there))
    other = train([n, n], torch.arange(n).repeat(2), keys=keys + 1)
    assert not all(torch.equal(a, b) for a, b in zip(here, other))


@pytest.mark.parametrize("fused", [False, True], ids=["update", "reduce_update"])
def test_stochastic_rounding_needs_the_keys(device, fused):
    """A rounding seed without the rows' keys, or keys of the wrong shape or dtype: a clear error
    naming keys, and no row written."""
    values, meta = _half_group(device, torch.float16, [4], [8])
    before = values.clone()
    tids = torch.zeros(3, dtype=torch.int64, device=device)
    slots = torch.tensor([0, 3, 5], device=device)
    grads = torch.full((3, 4), 0.1, device=device)
    hyper = (0, 0.5, 0.0, 0.0, 0.0, 0.0, 0, 1, 9)
    bad_keys = [None, torch.arange(2, device=device), torch.arange(3, device=device).int()]
    for keys in bad_keys:
        with pytest.raises((ValueError, TypeError), match="keys"):
            if fused:
                lookup_ops.grouped_reduce_update(
                    values, meta, tids, slots, grads, torch.arange(3, device=device),
                    torch.arange(4, device=device), None, torch.tensor([0], device=device),
                    torch.tensor([0, 4], device=device), lookup_ops.POOL_NONE, 3, 4, *hyper,
                    keys=keys,
                )  # fmt: skip
            else:
                lookup_ops.grouped_update(values, meta, tids, slots, grads, *hyper, keys=keys)
        assert torch.equal(values.view(torch.int16), before.view(torch.int16))


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("optimizer,hp", MODULE_OPTIMIZERS, ids=lambda o: getattr(o, "name", ""))
def test_tables_that_place_keys_differently_round_alike(device, dtype, optimizer, hp):
    """Two modules with one seed whose tables hold the same keys at different slots (another
    capacity, the keys inserted first in another order) train to the same bits, read by key."""
    dims = [6, 8]
    twins = []
    for capacity, order_seed in ((1024, 1), (2048, 2)):
        m = BatchedDynamicEmbeddingTables(
            [oracle.options(d, embedding_dtype=dtype, max_capacity=capacity) for d in dims],
            ["t0", "t1"], [0, 1], DynamicEmbPoolingMode.SUM, optimizer, device,
            stochastic_rounding=True, **hp,
        )  # fmt: skip
        m.stochastic_rounding_seed = 99
        # the keys placed first in an order of this twin's own, with the same rows
        order = torch.randperm(oracle.NUM_IDS, generator=torch.Generator().manual_seed(order_seed))
        start = [
            torch.rand(oracle.NUM_IDS, d, generator=torch.Generator().manual_seed(d))[order]
            for d in dims
        ]
        for t, d in enumerate(dims):
            spec = m.tables[t].tables[0]
            rows = torch.zeros(oracle.NUM_IDS, spec.row_width)
            rows[:, :d] = start[t]
            scores = torch.zeros(oracle.NUM_IDS, spec.num_scores, dtype=torch.int64)
            m.tables[t].insert(0, order.to(device), rows.to(device), scores.to(device))
        twins.append(m)

    def slots(m) -> torch.Tensor:
        ids = torch.arange(oracle.NUM_IDS, device=device)
        return torch.stack(
            [m.tables[t].table.find(ids, torch.full_like(ids, m.tables[t].table_id)).slots
             for t in range(2)]
        ).cpu()  # fmt: skip

    assert not torch.equal(slots(twins[0]), slots(twins[1]))  # the placements differ
    torch.manual_seed(0)
    for seed in range(1, 5):
        indices, offsets, _ = oracle.make_batch(2, 3, seed=seed)
        outs = [m(indices.to(device), offsets.to(device)) for m in twins]
        coeff = torch.randn(outs[0].shape)
        for out in outs:
            (out * coeff.to(out.device)).sum().backward()
    for t in range(2):
        (a, _), (b, _) = (oracle.read_weights(m, t) for m in twins)
        assert torch.equal(a, b)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here")
@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("optimizer,hp", MODULE_OPTIMIZERS, ids=lambda o: getattr(o, "name", ""))
def test_cuda_rounds_as_the_cpu_for_one_seed(dtype, optimizer, hp):
    """Twin modules, one per device, one seed: the same rounding decisions, so the same rows
    (the update of a row's float32 value agrees to the bit on both devices, grouped.h), up to a
    rare last-bit difference of the gradient sums (several indices of one key) moving a decision."""
    cuda = torch.device("cuda", torch.cuda.current_device())
    dims = [5, 8, 12]
    twins = []
    for dev in ("cpu", cuda):
        m = BatchedDynamicEmbeddingTables(
            [oracle.options(d, embedding_dtype=dtype) for d in dims],
            ["t0", "t1", "t2"], [0, 1, 1, 2], DynamicEmbPoolingMode.SUM, optimizer, dev,
            stochastic_rounding=True, **hp,
        )  # fmt: skip
        m.stochastic_rounding_seed = 2024
        twins.append(m)
    start = [
        torch.rand(oracle.NUM_IDS, d, generator=torch.Generator().manual_seed(d)) for d in dims
    ]
    for m in twins:
        oracle.mirror_weights(m, start)
    torch.manual_seed(0)
    for seed in range(1, 6):
        indices, offsets, _ = oracle.make_batch(4, 3, seed=seed)
        outs = [m(indices.to(m.device), offsets.to(m.device)) for m in twins]
        coeff = torch.randn(outs[0].shape)
        for out in outs:
            (out * coeff.to(out.device)).sum().backward()
    for t in range(len(dims)):
        (e_cpu, _), (e_gpu, _) = (oracle.read_weights(m, t) for m in twins)
        assert (e_gpu == e_cpu).float().mean() > 0.97
        ulp = 2.0**-7 if dtype is torch.bfloat16 else 2.0**-10
        torch.testing.assert_close(e_gpu, e_cpu, rtol=ulp, atol=1e-6)
