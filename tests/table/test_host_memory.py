"""host_zeros: the buffers the hash table allocates on the host (huge-page advice, zero fill)."""

from __future__ import annotations

import torch

from dynamicemb_core.table.host_memory import host_zeros


def test_large_buffer_is_zeros_of_the_requested_shape_and_dtype() -> None:
    # Dirty the allocator's free memory first, so a buffer that skipped the zero fill would show it.
    junk = torch.full((3 << 20,), 7.0)
    del junk
    out = host_zeros((1 << 20, 3), torch.float32, "cpu")
    assert out.shape == (1 << 20, 3) and out.dtype == torch.float32 and out.is_contiguous()
    assert not out.any()


def test_small_and_int_buffers() -> None:
    for size, dtype in (((5,), torch.int64), ((0, 4), torch.float32), (7, torch.uint8)):
        out = host_zeros(size, dtype, torch.device("cpu"))
        assert out.dtype == dtype and not out.any()
        assert out.shape == torch.zeros(size).shape
