"""The CUDA table kernels against the CPU kernels, op by op (csrc/cuda/table.cu vs csrc/cpu/table.cpp).

The CPU kernels are the oracle here (they are themselves checked against the pure-Python reference
model in test_against_reference.py). Both devices start from the same state and run the same random
op sequence with explicit call scores, so the contract makes every output deterministic; after every
op the outputs must be equal and so must the whole state (keys and words of occupied slots,
digests, sizes). These tests run the bucket-ordered CUDA engine (``DEMB_DETERMINISM_MODE=1``, set
by an autouse fixture), which groups keys by bucket and keeps input order, so slots agree exactly,
not just contents; the key-parallel default engine is tested in test_parallel_engine.py. Every test needs a GPU; the CPU side of each behaviour is covered by the
reference-model tests.

Sanitizers (run on the H200; memcheck reports no memory errors, racecheck no hazards)::

    PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool memcheck --report-api-errors no \
        python -m pytest -q tests/table/test_cuda_ops.py tests/table/test_cuda_score_function.py \
        -m "gpu or not gpu" -k "0-mixed or full_buckets or clock or 8-dtype0 or 0-decayed_lfu"
    (the same with --tool racecheck)
"""

from __future__ import annotations

import random
from typing import List, Sequence, Tuple

import pytest
import torch

from dynamicemb_core.ops import table_ops as ops
from dynamicemb_core.ops.table_ops import TableState

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available(),
        reason="needs a CUDA device (CPU side: test_against_reference.py)",
    ),
]

TIMESTAMP, STEP, CUSTOMIZED, LFU, NO_EVICTION, COMPOUND = range(6)
INT64_MIN = -(2**63)


@pytest.fixture(autouse=True)
def deterministic_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    """Slot-for-slot comparisons need the bucket-ordered engine (the ops read the variable)."""
    monkeypatch.setenv("DEMB_DETERMINISM_MODE", "1")


# (capacity, bucket_cap, policy) per logical table. Small buckets so calls fill and evict; the
# 40-slot single bucket is a "whole region" table whose slots are not 16-aligned.
LAYOUTS = {
    "mixed": [
        (64, 16, TIMESTAMP),
        (96, 32, LFU),
        (40, 40, COMPOUND),
        (32, 16, STEP),
        (48, 16, NO_EVICTION),
        (32, 32, CUSTOMIZED),
    ],
    "one_bucket128": [(128, 128, COMPOUND)],
    "wide": [(1024, 128, TIMESTAMP), (512, 128, LFU)],
    # Buckets wider than one probe step (128 slots): probes, first-empty and victim scans loop.
    "big_buckets": [(512, 256, LFU), (1024, 1024, COMPOUND), (200, 200, TIMESTAMP)],
}


def make_state(layout: Sequence[Tuple[int, int, int]], device: str) -> TableState:
    caps = [c for c, _, _ in layout]
    offsets = [0]
    for c in caps:
        offsets.append(offsets[-1] + c)
    total = offsets[-1]
    longs = {"dtype": torch.int64, "device": device}
    return TableState(
        table_keys=torch.zeros(total, **longs),
        digests=torch.zeros(total, dtype=torch.uint8, device=device),
        scores=torch.zeros(total, 2, **longs),
        slot_offsets=torch.tensor(offsets, **longs),
        bucket_caps=torch.tensor([b for _, b, _ in layout], **longs),
        policies=torch.tensor([p for _, _, p in layout], **longs),
        sizes=torch.zeros(len(layout), **longs),
    )


def to(state: TableState, device: str) -> TableState:
    return TableState(*(t.to(device) for t in state))


def assert_same_state(cpu: TableState, cuda: TableState) -> None:
    got = TableState(*(t.cpu() for t in cuda))
    assert torch.equal(cpu.digests, got.digests), "digests differ"
    occupied = cpu.digests != 0
    assert torch.equal(cpu.table_keys[occupied], got.table_keys[occupied]), "keys differ"
    assert torch.equal(cpu.scores[occupied], got.scores[occupied]), "score words differ"
    assert torch.equal(cpu.sizes, got.sizes), f"sizes differ: {cpu.sizes} vs {got.sizes}"
    assert torch.equal(
        cpu.sizes,
        torch.bincount(
            torch.searchsorted(cpu.slot_offsets, occupied.nonzero().flatten(), right=True) - 1,
            minlength=cpu.sizes.numel(),
        ),
    ), "sizes do not count the occupied slots"


def assert_same(a, b, what: str) -> None:
    a_list = a if isinstance(a, (tuple, list)) else (a,)
    b_list = b if isinstance(b, (tuple, list)) else (b,)
    assert len(a_list) == len(b_list)
    for k, (x, y) in enumerate(zip(a_list, b_list, strict=False)):
        assert torch.equal(x, y.cpu()), f"{what}: output {k} differs\ncpu  {x}\ncuda {y.cpu()}"


class Twin:
    """The same state on CPU and CUDA, and one method per op that runs both and compares."""

    def __init__(
        self,
        layout,
        seed: int,
        cuda_score_fns: List[int] | None = None,
        cpu_score_fns: List[int] | None = None,
    ) -> None:
        self.cpu = make_state(layout, "cpu")
        self.gpu = to(self.cpu, "cuda")
        self.T = len(layout)
        self.rng = random.Random(seed)
        self.step = 1
        self.fns_cpu = torch.tensor(cpu_score_fns or [0] * self.T, dtype=torch.int64)
        self.fns_gpu = torch.tensor(cuda_score_fns or [0] * self.T, dtype=torch.int64)
        self.universe = [self.rng.randrange(-(2**63), 2**63) for _ in range(24)] + [
            INT64_MIN,
            2**63 - 1,
            -1,
            0,
            1,
        ]

    def batch(self, n: int) -> Tuple[torch.Tensor, torch.Tensor]:
        pool = self.universe + list(range(self.step * 1000, self.step * 1000 + 200))
        keys = torch.tensor([self.rng.choice(pool) for _ in range(n)], dtype=torch.int64)
        tids = torch.tensor([self.rng.randrange(self.T) for _ in range(n)], dtype=torch.int64)
        return keys, tids

    def cur(self) -> torch.Tensor:
        self.step += 1
        return torch.full((self.T,), self.step * 10, dtype=torch.int64)

    def input_scores(self, n: int) -> torch.Tensor:
        return torch.tensor(
            [[self.rng.randrange(0, 50), self.rng.randrange(0, 50)] for _ in range(n)],
            dtype=torch.int64,
        )

    def step_random(self) -> str:
        op = self.rng.choice(
            [
                "insert",
                "insert_scores",
                "find_or_insert",
                "insert_and_evict",
                "find",
                "find_update",
                "erase",
                "export",
                "insert_at",
            ]
        )
        n = self.rng.choice([1, 5, 40, 150])
        keys, tids = self.batch(n)
        kg, tg = keys.cuda(), tids.cuda()
        cur = self.cur()
        cg = cur.cuda()
        if op in ("insert", "insert_scores"):
            sc = self.input_scores(n) if op == "insert_scores" else None
            a = ops.insert(keys, tids, self.cpu, self.fns_cpu, cur, sc)
            b = ops.insert(kg, tg, self.gpu, self.fns_gpu, cg, None if sc is None else sc.cuda())
        elif op == "find_or_insert":
            a = ops.find_or_insert(keys, tids, self.cpu, self.fns_cpu, cur)
            b = ops.find_or_insert(kg, tg, self.gpu, self.fns_gpu, cg)
        elif op == "insert_and_evict":
            sc = self.input_scores(n) if self.rng.random() < 0.3 else None
            a = ops.insert_and_evict(keys, tids, self.cpu, self.fns_cpu, cur, sc)
            b = ops.insert_and_evict(
                kg, tg, self.gpu, self.fns_gpu, cg, None if sc is None else sc.cuda()
            )
        elif op in ("find", "find_update"):
            a = ops.find(keys, tids, self.cpu, cur, op == "find_update")
            b = ops.find(kg, tg, self.gpu, cg, op == "find_update")
        elif op == "erase":
            a = ops.erase(keys, tids, self.cpu)
            b = ops.erase(kg, tg, self.gpu)
        elif op == "export":
            th = torch.tensor(
                [self.rng.choice([INT64_MIN, self.step * 5, 3]) for _ in range(self.T)],
                dtype=torch.int64,
            )
            col = self.rng.randrange(2)
            a = ops.export_if(self.cpu, th, col)
            b = ops.export_if(self.gpu, th.cuda(), col)
        else:  # insert_at: half the slots right (a key's current slot), half random
            ex = ops.export_if(self.cpu, torch.full((self.T,), INT64_MIN), 0)
            slots = torch.randint(-1, 60, (n,))
            if ex[0].numel() > 0:
                pick = torch.randint(0, ex[0].numel(), (n,))
                keep = torch.rand(n) < 0.5
                keys = torch.where(keep, ex[0][pick], keys)
                tids = torch.where(keep, ex[3][pick], tids)
                slots = torch.where(keep, ex[1][pick], slots)
                kg, tg = keys.cuda(), tids.cuda()
            sc = self.input_scores(n)
            dry = self.rng.random() < 0.3
            a = ops.insert_at(keys, tids, slots, self.cpu, sc, dry)
            b = ops.insert_at(kg, tg, slots.cuda(), self.gpu, sc.cuda(), dry)
        assert_same(a, b, op)
        assert_same_state(self.cpu, self.gpu)
        return op


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("seed", range(3))
def test_random_op_sequence_matches_cpu_slot_for_slot(layout: str, seed: int) -> None:
    twin = Twin(LAYOUTS[layout], seed)
    seen = set()
    for _ in range(60):
        seen.add(twin.step_random())
    assert len(seen) >= 6  # the sequence exercised most ops


@pytest.mark.slow
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("seed", range(3, 8))
def test_long_random_op_sequence_matches_cpu(layout: str, seed: int) -> None:
    twin = Twin(LAYOUTS[layout], seed)
    for _ in range(300):
        twin.step_random()


def test_full_buckets_evict_same_victims_as_cpu() -> None:
    """Every bucket overfull in one call: evictions, protection and -1 slots all line up."""
    twin = Twin(LAYOUTS["mixed"], seed=11)
    for step in range(6):
        keys = torch.arange(step * 500, step * 500 + 400, dtype=torch.int64)
        tids = torch.arange(400, dtype=torch.int64) % twin.T
        cur = twin.cur()
        a = ops.insert_and_evict(keys, tids, twin.cpu, twin.fns_cpu, cur)
        b = ops.insert_and_evict(keys.cuda(), tids.cuda(), twin.gpu, twin.fns_gpu, cur.cuda())
        assert_same(a, b, "insert_and_evict")
        assert_same_state(twin.cpu, twin.gpu)
    assert a[2].numel() > 0 and bool((a[0] == -1).any())  # evicted, and some keys not placed


def test_clock_scores_are_recent_device_time() -> None:
    """cur_scores < 0 reads %globaltimer: the words written lie between two host-side reads."""
    state = make_state([(64, 16, TIMESTAMP), (64, 16, COMPOUND)], "cuda")
    keys = torch.arange(20, device="cuda")
    tids = keys % 2
    neg = torch.full((2,), -1, dtype=torch.int64, device="cuda")
    slots, _ = ops.find_or_insert(keys, tids, state, torch.zeros(2, dtype=torch.int64), neg)
    _, found, words = ops.find(keys, tids, state, neg, False)
    assert bool(found.all())
    ts = torch.where(tids == 0, words[:, 0], words[:, 1])
    assert bool((ts > 0).all()) and int(ts.max() - ts.min()) == 0  # one clock read per call
    assert bool((words[tids == 1, 0] == 1).all())  # COMPOUND count


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int8])
@pytest.mark.parametrize("width", [1, 3, 8, 32, 33])
def test_rows_gather_scatter_match_cpu(dtype: torch.dtype, width: int) -> None:
    g = torch.Generator().manual_seed(width)
    values = (torch.randn(50, width, generator=g) * 20).to(dtype)
    slots = torch.randint(-1, 50, (80,), generator=g)  # repeats: last write wins
    rows = (torch.randn(80, width, generator=g) * 20).to(dtype)
    vc, vg = values.clone(), values.cuda()
    ops.scatter_rows(vc, slots, rows)
    ops.scatter_rows(vg, slots.cuda(), rows.cuda())
    assert torch.equal(vc, vg.cpu())
    assert torch.equal(ops.gather_rows(vc, slots), ops.gather_rows(vg, slots.cuda()).cpu())


def test_scatter_rows_last_write_wins_under_many_repeats() -> None:
    """200,000 positions into 5,000 slots (and -1): each slot's row must be its last position's,
    which the CUDA kernel finds through a per-call map of slot -> last position, full of
    collisions here. Rows carry their position, so a wrong winner shows."""
    g = torch.Generator().manual_seed(11)
    slots = torch.randint(-1, 5000, (200_000,), generator=g)
    rows = torch.arange(200_000, dtype=torch.float32).unsqueeze(1).repeat(1, 4)
    vc, vg = torch.zeros(5000, 4), torch.zeros(5000, 4, device="cuda")
    ops.scatter_rows(vc, slots, rows)
    ops.scatter_rows(vg, slots.cuda(), rows.cuda())
    assert torch.equal(vc, vg.cpu())


def test_ops_pass_opcheck_on_cuda() -> None:
    from torch.library import opcheck

    state = make_state(LAYOUTS["mixed"], "cuda")
    T = len(LAYOUTS["mixed"])
    keys = torch.arange(30, device="cuda")
    tids = keys % T
    cur = torch.full((T,), 7, dtype=torch.int64, device="cuda")
    fns = torch.zeros(T, dtype=torch.int64)
    lib = torch.ops.dynamicemb
    ops.find_or_insert(keys, tids, state, fns, cur)  # loads the library, fills the table
    sc = torch.ones(30, 2, dtype=torch.int64, device="cuda")
    cases = [
        (lib.find.default, (keys, tids, *state, cur, True)),
        (lib.insert.default, (keys, tids, *state[:6], fns, state.sizes, cur, sc)),
        (lib.find_or_insert.default, (keys + 100, tids, *state[:6], fns, state.sizes, cur)),
        (lib.insert_and_evict.default, (keys + 200, tids, *state[:6], fns, state.sizes, cur, None)),
        (lib.erase.default, (keys[:5], tids[:5], *state)),
        (lib.export_if.default, (*state, torch.full((T,), INT64_MIN, device="cuda"), 0)),
        (
            lib.insert_at.default,
            (keys, tids, torch.zeros_like(keys), *state[:6], state.sizes, sc, True),
        ),
        (
            lib.gather_rows.default,
            (torch.randn(10, 4, device="cuda"), torch.tensor([0, -1, 9], device="cuda")),
        ),
        (
            lib.scatter_rows.default,
            (
                torch.randn(10, 4, device="cuda"),
                torch.tensor([0, -1, 9], device="cuda"),
                torch.randn(3, 4, device="cuda"),
            ),
        ),
    ]
    for op, args in cases:
        # test_aot_dispatch_dynamic re-runs mutating ops on copies; data-dependent outputs are
        # covered by the fake kernels' dynamic sizes.
        opcheck(
            op, args, test_utils=("test_schema", "test_autograd_registration", "test_faketensor")
        )
