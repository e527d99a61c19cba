"""Zero-filled host buffers backed by transparent huge pages where the kernel offers them.

Hash slots and value rows are read and written at random positions. With 4 KiB pages, nearly every
such access to a table much larger than the TLB's reach also misses the TLB, and each miss costs a
page walk (a nested one in a virtual machine). Asking for huge pages before the buffer is first
touched removes most of those walks: on the 2-core test VM (THP mode "madvise") it halves the pooled
gather of a 128 MiB value buffer. Only advice: where it is refused (no Linux, THP "never", CUDA)
the buffer is exactly ``torch.zeros``.
"""

from __future__ import annotations

import ctypes
import functools
import sys
from typing import Any, Callable, Optional, Sequence, Union

import torch

__all__ = ["host_zeros"]

_MADV_HUGEPAGE = 14  # linux/mman.h
_HUGE_PAGE = 2 << 20  # x86-64 and aarch64 (4 KiB base pages) PMD huge page
_MIN_BYTES = 2 * _HUGE_PAGE  # smaller buffers hold at most one aligned huge page: not worth it


@functools.lru_cache(maxsize=1)
def _madvise() -> Optional[Callable[..., Any]]:
    """libc's ``madvise``, or None off Linux or when libc cannot be loaded."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


def host_zeros(
    size: Union[int, Sequence[int]], dtype: torch.dtype, device: Union[torch.device, str]
) -> torch.Tensor:
    """``torch.zeros(size, dtype=dtype, device=device)``; on CPU, huge pages are requested first.

    Args:
        size: the shape.
        dtype: element type.
        device: where the buffer lives; only CPU buffers of at least 4 MiB get the advice.

    Returns:
        A new zero-filled, contiguous tensor.
    """
    device = torch.device(device)
    if device.type != "cpu":
        return torch.zeros(size, dtype=dtype, device=device)
    out = torch.empty(size, dtype=dtype, device=device)
    nbytes = out.numel() * out.element_size()
    madvise = _madvise() if nbytes >= _MIN_BYTES else None
    if madvise is not None:
        # The advice covers whole huge pages inside the buffer; the zero fill below is the first
        # touch, so the kernel can back those ranges with huge pages at fault time.
        begin = -(-out.data_ptr() // _HUGE_PAGE) * _HUGE_PAGE
        end = (out.data_ptr() + nbytes) // _HUGE_PAGE * _HUGE_PAGE
        if end > begin:
            madvise(begin, end - begin, _MADV_HUGEPAGE)  # a refusal changes nothing but speed
    return out.zero_()
