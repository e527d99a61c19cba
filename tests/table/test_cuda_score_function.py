"""A compound table's score_function on CUDA (numba-cuda) picks the same victims as on CPU (numba cfunc).

The CPU callback and the CUDA ranking kernel are compiled from the same Python function; with explicit
call times both see the same ``now``, so every eviction, slot and word must agree, including NaN
("evict first") results and ties (lowest slot first).
"""

from __future__ import annotations

import math

import pytest
import torch
from test_cuda_ops import (  # noqa: F401 (deterministic_engine: the autouse fixture)
    COMPOUND,
    LFU,
    TIMESTAMP,
    Twin,
    assert_same,
    assert_same_state,
    deterministic_engine,
)

from dynamicemb_core.config import DynamicEmbScoreStrategy as S
from dynamicemb_core.ops import table_ops as ops
from dynamicemb_core.table.score_function import compile_score_function


def needs_gpu(test):
    """Mark a test as CUDA-only; the CPU side of the same behaviour is test_against_reference.py."""
    test = pytest.mark.gpu(test)
    return pytest.mark.skipif(
        not torch.cuda.is_available(),
        reason="needs a CUDA device (CPU side: test_against_reference.py)",
    )(test)


def decayed_lfu(scores, cur_timestamp):
    # scores[0] = timestamp, scores[1] = count for (TIMESTAMP, LFU)
    age = (cur_timestamp - scores[0]) * 1e-2
    return math.log(max(scores[1], 1)) + age * math.log(0.9)


def count_mod_with_nan(scores, cur_timestamp):
    # (LFU, TIMESTAMP) order: scores[0] = count. Many ties, and NaN for counts divisible by 3.
    if scores[0] % 3 == 0:
        return math.nan
    return float(scores[0] % 2)


@needs_gpu
@pytest.mark.parametrize(
    "fn, strategy",
    [(decayed_lfu, (S.TIMESTAMP, S.LFU)), (count_mod_with_nan, (S.LFU, S.TIMESTAMP))],
)
@pytest.mark.parametrize("seed", range(2))
def test_score_function_evicts_same_victims_on_cuda_and_cpu(fn, strategy, seed) -> None:
    from dynamicemb_core.table.score_function_cuda import compile_score_function_cuda

    layout = [(64, 16, COMPOUND), (40, 40, COMPOUND), (32, 16, LFU), (32, 16, TIMESTAMP)]
    cpu_fn = compile_score_function(fn, strategy).address
    gpu_fn = compile_score_function_cuda(fn, strategy, "cuda").handle
    twin = Twin(
        layout, seed, cuda_score_fns=[gpu_fn, gpu_fn, 0, 0], cpu_score_fns=[cpu_fn, cpu_fn, 0, 0]
    )
    evicted = 0
    for _ in range(40):
        keys, tids = twin.batch(60)
        cur = twin.cur()
        a = ops.insert_and_evict(keys, tids, twin.cpu, twin.fns_cpu, cur)
        b = ops.insert_and_evict(keys.cuda(), tids.cuda(), twin.gpu, twin.fns_gpu, cur.cuda())
        assert_same(a, b, "insert_and_evict")
        assert_same_state(twin.cpu, twin.gpu)
        evicted += int(((a[5] == 0) | (a[5] == 1)).sum())
        twin.step_random()
    assert evicted > 20  # the score function actually ranked victims


@needs_gpu
def test_compiled_kernel_is_cached_per_source_and_device() -> None:
    from dynamicemb_core.table.score_function_cuda import (
        compile_score_function_cuda,
        score_fn_handle,
    )

    a = compile_score_function_cuda(decayed_lfu, (S.TIMESTAMP, S.LFU), "cuda")
    b = compile_score_function_cuda(decayed_lfu, (S.TIMESTAMP, S.LFU), torch.device("cuda", 0))
    c = compile_score_function_cuda(decayed_lfu, (S.LFU, S.TIMESTAMP), "cuda")
    assert a is b and a is not c and a.handle != c.handle
    assert a.compute_capability == torch.cuda.get_device_capability(0)
    assert score_fn_handle(decayed_lfu, (S.TIMESTAMP, S.LFU), "cuda") == a.handle
    assert score_fn_handle(None, (S.TIMESTAMP, S.LFU), "cuda") == 0
    with pytest.raises(ValueError, match="compound"):
        compile_score_function_cuda(decayed_lfu, (S.LFU,), "cuda")


def test_cuda_compiler_rejects_non_compound_strategy_and_cpu_device() -> None:
    """Checked before numba-cuda is touched, so this runs (and must fail the same way) anywhere."""
    from dynamicemb_core.table.score_function_cuda import compile_score_function_cuda

    with pytest.raises(ValueError, match="compound"):
        compile_score_function_cuda(decayed_lfu, (S.TIMESTAMP,), "cuda")
    with pytest.raises(ValueError, match="needs a CUDA device, got cpu"):
        compile_score_function_cuda(decayed_lfu, (S.TIMESTAMP, S.LFU), "cpu")


def test_score_fn_handle_on_cpu_is_the_cfunc_address() -> None:
    from dynamicemb_core.table.score_function_cuda import score_fn_handle

    expected = compile_score_function(decayed_lfu, (S.TIMESTAMP, S.LFU)).address
    assert score_fn_handle(decayed_lfu, (S.TIMESTAMP, S.LFU), "cpu") == expected != 0
    assert score_fn_handle(None, (S.TIMESTAMP, S.LFU), "cpu") == 0
