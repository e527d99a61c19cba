"""Registration checks of the hash-table ops: every op passes torch.library.opcheck (schema
mutation annotations, fake kernel, autograd registration, AOT dispatch) on every device, and every
defined op has a kernel for each backend the build contains."""

from __future__ import annotations

from typing import Any, Dict, List, Tuple

import pytest
import torch

from dynamicemb_core.devices import normalize_device
from dynamicemb_core.ops import ensure_loaded
from dynamicemb_core.ops.table_ops import TableState

TABLE_OPS = [
    "find",
    "insert",
    "find_or_insert",
    "insert_and_evict",
    "erase",
    "export_if",
    "insert_at",
    "gather_rows",
    "scatter_rows",
    "device_clock",
]
INT64_MIN = -(2**63)


def _state(device: torch.device) -> TableState:
    """Two tables: TIMESTAMP with 2 buckets of 16, COMPOUND with 1 bucket of 16; a few keys in."""
    i64 = {"dtype": torch.int64, "device": device}
    state = TableState(
        torch.zeros(48, **i64),
        torch.zeros(48, dtype=torch.uint8, device=device),
        torch.zeros(48, 2, **i64),
        torch.tensor([0, 32, 48], **i64),
        torch.tensor([16, 16], **i64),
        torch.tensor([0, 5], **i64),
        torch.zeros(2, **i64),
    )
    keys = torch.arange(0, 40, **i64)
    tids = (keys % 2).contiguous()
    torch.ops.dynamicemb.insert.default(
        keys,
        tids,
        state.table_keys,
        state.digests,
        state.scores,
        state.slot_offsets,
        state.bucket_caps,
        state.policies,
        torch.zeros(2, **i64),
        state.sizes,
        torch.tensor([7, 7], **i64),
        None,
    )
    return state


def _samples(device: torch.device) -> Dict[str, List[Tuple[Any, ...]]]:
    i64 = {"dtype": torch.int64, "device": device}
    s = _state(device)
    keys = torch.tensor([3, 4, 100, -1, INT64_MIN, 3], **i64)
    tids = torch.tensor([1, 0, 0, 1, 0, 1], **i64)
    fns = torch.zeros(2, **i64)
    cur = torch.tensor([9, 9], **i64)
    words = torch.arange(12, **i64).reshape(6, 2)
    evict = (keys, tids, *s[:6], fns, s.sizes, cur)
    pins = torch.zeros(s.table_keys.numel(), dtype=torch.int32, device=device)
    pins[::3] = 1
    # deterministic=True: opcheck compares runs, and the key-parallel CUDA engine may give new
    # keys of one bucket other slots in another run (test_parallel_engine.py covers it)
    det = (True, None, True)
    values = torch.randn(32, 3, device=device)
    slots = torch.tensor([0, -1, 5, 5], **i64)
    return {
        "find": [(keys, tids, *s, cur, False), (keys, tids, *s, cur, True)],
        "insert": [(*evict, None, *det), (*evict, words, True, pins, True)],
        "find_or_insert": [(*evict, *det), (*evict, True, pins, True)],
        "insert_and_evict": [(*evict, None, *det), (*evict, words, True, pins, True)],
        "erase": [(keys, tids, *s)],
        "export_if": [
            (*s, torch.tensor([INT64_MIN, INT64_MIN], **i64), 0),
            (*s, torch.tensor([8, 0], **i64), 1),
        ],
        "insert_at": [
            (keys[:2], tids[:2], torch.tensor([0, 3], **i64), *s, words[:2], True),
            (keys[:2], tids[:2], torch.tensor([0, 3], **i64), *s, words[:2], False),
        ],
        "gather_rows": [(values, slots)],
        "scatter_rows": [(values, slots, torch.randn(4, 3, device=device))],
        "device_clock": [(s.sizes,)],
    }


# A clock gives another value on every call, so eager and AOT outputs cannot match; its traced
# value is checked against eager reads instead (test_device_clock_is_the_kernels_clock_and_traces).
_CHECKS = {"device_clock": ("test_schema", "test_autograd_registration", "test_faketensor")}


@pytest.mark.parametrize("op_name", TABLE_OPS)
def test_op_passes_opcheck(device: torch.device, op_name: str) -> None:
    ensure_loaded()
    op = getattr(torch.ops.dynamicemb, op_name).default
    for args in _samples(device)[op_name]:
        if op_name in _CHECKS:
            torch.library.opcheck(op, args, test_utils=_CHECKS[op_name])
        else:
            torch.library.opcheck(op, args)


def test_device_clock_is_the_kernels_clock_and_traces(device: torch.device) -> None:
    """device_clock lies between the stamps of two inserts that read the clock (cur_scores -1),
    eagerly and traced by torch.compile (fullgraph), as a 0-d int64 on the given device."""
    ensure_loaded()
    s = _state(device)
    args = (
        s.table_keys,
        s.digests,
        s.scores,
        *s[3:6],
        torch.zeros(2, dtype=torch.int64, device=device),
        s.sizes,
        torch.tensor([-1, 9], dtype=torch.int64, device=device),
        None,
    )
    lib = torch.ops.dynamicemb

    @torch.compile(fullgraph=True, backend="aot_eager")
    def traced(like: torch.Tensor) -> torch.Tensor:
        return lib.device_clock(like) + 0

    def stamp(key: int) -> int:
        keys = torch.tensor([key], dtype=torch.int64, device=device)
        slot = lib.insert(keys, torch.zeros_like(keys), *args)
        return int(s.scores[int(slot)][0])

    first = stamp(1000)
    eager = lib.device_clock(s.sizes)
    middle = stamp(1002)
    compiled = traced(s.sizes)
    last = stamp(1004)
    assert (
        eager.shape == ()
        and eager.dtype == torch.int64
        and eager.device == normalize_device(device)
    )
    assert 0 < first <= int(eager) <= middle <= int(compiled) <= last


def test_every_table_op_has_a_kernel_per_backend() -> None:
    ensure_loaded()
    backends = ["CPU"] + (["CUDA"] if torch.cuda.is_available() else [])
    for name in TABLE_OPS:
        qualified = f"dynamicemb::{name}"
        for backend in backends:
            assert torch._C._dispatch_has_kernel_for_dispatch_key(qualified, backend), (
                f"{qualified} has no {backend} kernel"
            )
        assert torch._C._dispatch_has_kernel_for_dispatch_key(qualified, "Meta") or (
            torch._library.simple_registry.singleton.find(qualified).fake_impl.kernel is not None
        ), f"{qualified} has no fake kernel"


def test_gather_rows_traces_under_torch_compile() -> None:
    """The fake kernels let dynamo trace a call (fullgraph) and give the eager result."""
    ensure_loaded()
    values = torch.randn(8, 4)
    slots = torch.tensor([1, -1, 7])

    @torch.compile(fullgraph=True, backend="eager")
    def gather(v: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        return torch.ops.dynamicemb.gather_rows(v, s) * 2

    expected = values[[1, 0, 7]] * 2
    expected[1] = 0
    torch.testing.assert_close(gather(values, slots), expected)
