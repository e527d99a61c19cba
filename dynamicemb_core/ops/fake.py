"""Fake (meta) kernels of the hash-table ops, so they trace under torch.compile and torch.export.

Imported by :func:`dynamicemb_core.ops.loader.ensure_loaded` right after the library loads, and named
by ``m.set_python_module`` in ``csrc/ops.cpp``. Each kernel checks shapes with ``torch._check`` and
allocates outputs; sizes that depend on data (evicted and exported rows) come from
``torch.library.get_ctx().new_dynamic_size()``. No kernel reads tensor data.

Other op groups keep their fake kernels in their own module: every ``fake_*.py`` next to this file
is imported at the end (for example ``fake_lookup.py`` for the lookup and grouped ops).
"""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path
from typing import Optional, Tuple

import torch
from torch import Tensor

__all__: list = []

_NS = "dynamicemb::"


def _check_keys(keys: Tensor, table_ids: Tensor) -> int:
    torch._check(keys.dim() == 1 and table_ids.dim() == 1, lambda: "keys, table_ids must be 1-D")
    torch._check(keys.shape[0] == table_ids.shape[0], lambda: "keys and table_ids differ in length")
    return keys.shape[0]


def _check_counts(counts: Optional[Tensor], n: int) -> None:
    if counts is not None:
        torch._check(counts.dim() == 1 and counts.shape[0] == n, lambda: "counts must be (n,)")


@torch.library.register_fake(_NS + "find")
def _find_fake(
    keys: Tensor,
    table_ids: Tensor,
    table_keys: Tensor,
    digests: Tensor,
    scores: Tensor,
    slot_offsets: Tensor,
    bucket_caps: Tensor,
    policies: Tensor,
    sizes: Tensor,
    cur_scores: Tensor,
    update_score: bool,
    check: bool = True,
    counts: Optional[Tensor] = None,
) -> Tuple[Tensor, Tensor, Tensor]:
    n = _check_keys(keys, table_ids)
    _check_counts(counts, n)
    return keys.new_empty(n), keys.new_empty(n, dtype=torch.bool), keys.new_empty(n, 2)


@torch.library.register_fake(_NS + "insert")
def _insert_fake(
    keys: Tensor,
    table_ids: Tensor,
    table_keys: Tensor,
    digests: Tensor,
    scores: Tensor,
    slot_offsets: Tensor,
    bucket_caps: Tensor,
    policies: Tensor,
    score_fns: Tensor,
    sizes: Tensor,
    cur_scores: Tensor,
    input_scores: Optional[Tensor],
    check: bool = True,
    pins: Optional[Tensor] = None,
    deterministic: bool = True,
    unique_keys: bool = False,
    counts: Optional[Tensor] = None,
) -> Tensor:
    n = _check_keys(keys, table_ids)
    _check_counts(counts, n)
    return keys.new_empty(n)


@torch.library.register_fake(_NS + "find_or_insert")
def _find_or_insert_fake(
    keys: Tensor,
    table_ids: Tensor,
    table_keys: Tensor,
    digests: Tensor,
    scores: Tensor,
    slot_offsets: Tensor,
    bucket_caps: Tensor,
    policies: Tensor,
    score_fns: Tensor,
    sizes: Tensor,
    cur_scores: Tensor,
    check: bool = True,
    pins: Optional[Tensor] = None,
    deterministic: bool = True,
    unique_keys: bool = False,
    counts: Optional[Tensor] = None,
) -> Tuple[Tensor, Tensor]:
    n = _check_keys(keys, table_ids)
    _check_counts(counts, n)
    return keys.new_empty(n), keys.new_empty(n, dtype=torch.bool)


@torch.library.register_fake(_NS + "insert_and_evict")
def _insert_and_evict_fake(
    keys: Tensor,
    table_ids: Tensor,
    table_keys: Tensor,
    digests: Tensor,
    scores: Tensor,
    slot_offsets: Tensor,
    bucket_caps: Tensor,
    policies: Tensor,
    score_fns: Tensor,
    sizes: Tensor,
    cur_scores: Tensor,
    input_scores: Optional[Tensor],
    check: bool = True,
    pins: Optional[Tensor] = None,
    deterministic: bool = True,
    unique_keys: bool = False,
    counts: Optional[Tensor] = None,
) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    n = _check_keys(keys, table_ids)
    _check_counts(counts, n)
    m = torch.library.get_ctx().new_dynamic_size()
    return (
        keys.new_empty(n),
        keys.new_empty(n, dtype=torch.bool),
        keys.new_empty(m),
        keys.new_empty(m),
        keys.new_empty(m, 2),
        keys.new_empty(m),
    )


@torch.library.register_fake(_NS + "erase")
def _erase_fake(
    keys: Tensor,
    table_ids: Tensor,
    table_keys: Tensor,
    digests: Tensor,
    scores: Tensor,
    slot_offsets: Tensor,
    bucket_caps: Tensor,
    policies: Tensor,
    sizes: Tensor,
    check: bool = True,
) -> Tensor:
    return keys.new_empty(_check_keys(keys, table_ids), dtype=torch.bool)


@torch.library.register_fake(_NS + "export_if")
def _export_if_fake(
    table_keys: Tensor,
    digests: Tensor,
    scores: Tensor,
    slot_offsets: Tensor,
    bucket_caps: Tensor,
    policies: Tensor,
    sizes: Tensor,
    thresholds: Tensor,
    column: int,
) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    torch._check(column in (0, 1), lambda: f"column must be 0 or 1, got {column}")
    m = torch.library.get_ctx().new_dynamic_size()
    new = table_keys.new_empty
    return new(m), new(m), new(m, 2), new(m)


@torch.library.register_fake(_NS + "insert_at")
def _insert_at_fake(
    keys: Tensor,
    table_ids: Tensor,
    slots: Tensor,
    table_keys: Tensor,
    digests: Tensor,
    scores: Tensor,
    slot_offsets: Tensor,
    bucket_caps: Tensor,
    policies: Tensor,
    sizes: Tensor,
    input_scores: Tensor,
    dry_run: bool,
) -> Tensor:
    n = _check_keys(keys, table_ids)
    torch._check(slots.shape[0] == n, lambda: "slots and keys differ in length")
    return keys.new_empty(n, dtype=torch.bool)


@torch.library.register_fake(_NS + "gather_rows")
def _gather_rows_fake(values: Tensor, slots: Tensor, check: bool = True) -> Tensor:
    torch._check(values.dim() == 2, lambda: "values must be 2-D")
    return values.new_empty(slots.shape[0], values.shape[1])


@torch.library.register_fake(_NS + "scatter_rows")
def _scatter_rows_fake(values: Tensor, slots: Tensor, rows: Tensor, check: bool = True) -> None:
    torch._check(rows.shape[0] == slots.shape[0], lambda: "rows and slots differ in length")
    return None


@torch.library.register_fake(_NS + "device_clock")
def _device_clock_fake(like: Tensor) -> Tensor:
    return like.new_empty((), dtype=torch.int64)


def _import_sibling_fakes() -> None:
    """Import every ``fake_*.py`` beside this module (other op groups' fake kernels)."""
    for info in pkgutil.iter_modules([str(Path(__file__).parent)]):
        if info.name.startswith("fake_"):
            module = importlib.import_module(f"{__package__}.{info.name}")
            # Registered from here: torch checks the registering module against the library's
            # m.set_python_module(...), which names this one.
            for op_name, kernel in getattr(module, "FAKE_KERNELS", {}).items():
                torch.library.register_fake(_NS + op_name)(kernel)


_import_sibling_fakes()
