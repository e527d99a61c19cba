"""Initial values of new embedding rows, one function per ``DynamicEmbInitializerMode``.

A key seen for the first time (``is_new`` from the table) gets its embedding from the table's
``initializer_args`` in training, and a missing key read in eval gets ``eval_initializer_args``
(zeros by default) without being stored.
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from dynamicemb_core.config import DynamicEmbInitializerArgs, DynamicEmbInitializerMode

__all__ = ["DEBUG_MODULUS", "initialize_embeddings", "validate_initializer"]

# DEBUG mode fills every element of a key's row with float(key mod DEBUG_MODULUS): deterministic,
# exactly representable in float32 and readable in a test's failure message.
DEBUG_MODULUS = 100_000


def validate_initializer(args: DynamicEmbInitializerArgs, where: str) -> None:
    """Check an initializer's parameters; raise ValueError naming ``where`` (table and field)."""
    mode = DynamicEmbInitializerMode(args.mode)
    if mode in (DynamicEmbInitializerMode.NORMAL, DynamicEmbInitializerMode.TRUNCATED_NORMAL):
        if not args.std_dev > 0:
            raise ValueError(f"{where}: std_dev must be > 0 for {mode.name}, got {args.std_dev}")
    lower, upper = _bounds(args)
    if mode in (DynamicEmbInitializerMode.UNIFORM, DynamicEmbInitializerMode.TRUNCATED_NORMAL):
        if not lower < upper:
            raise ValueError(
                f"{where}: {mode.name} needs lower < upper, got lower={lower}, upper={upper}"
            )


def _bounds(args: DynamicEmbInitializerArgs) -> tuple:
    mode = DynamicEmbInitializerMode(args.mode)
    if mode is DynamicEmbInitializerMode.TRUNCATED_NORMAL:
        # Without bounds, truncate at two standard deviations (torch.nn.init.trunc_normal_'s habit).
        lower = args.mean - 2 * args.std_dev if args.lower is None else args.lower
        upper = args.mean + 2 * args.std_dev if args.upper is None else args.upper
        return float(lower), float(upper)
    # UNIFORM without bounds completed by the planner: the seed API's defaults, [0, 1).
    lower = 0.0 if args.lower is None else args.lower
    upper = 1.0 if args.upper is None else args.upper
    return float(lower), float(upper)


def initialize_embeddings(
    args: DynamicEmbInitializerArgs,
    keys: torch.Tensor,
    dim: int,
    dtype: torch.dtype = torch.float32,
    generator: Optional[torch.Generator] = None,
) -> torch.Tensor:
    """New embedding rows for ``keys``.

    Args:
        args: the initializer.
        keys: (n,) int64 keys the rows are for (DEBUG derives values from them).
        dim: embedding width.
        dtype: row dtype.
        generator: random source on ``keys.device`` (None: torch's default).

    Returns:
        (n, dim) tensor of ``dtype`` on ``keys.device``.
    """
    n = keys.numel()
    mode = DynamicEmbInitializerMode(args.mode)
    out = torch.empty((n, dim), dtype=dtype, device=keys.device)
    if n == 0:
        return out
    if mode is DynamicEmbInitializerMode.CONSTANT:
        return out.fill_(float(args.value))
    if mode is DynamicEmbInitializerMode.DEBUG:
        return out.copy_(torch.remainder(keys, DEBUG_MODULUS).to(dtype).unsqueeze(1).expand(n, dim))
    if mode is DynamicEmbInitializerMode.UNIFORM:
        lower, upper = _bounds(args)
        return out.uniform_(lower, upper, generator=generator)
    if mode is DynamicEmbInitializerMode.NORMAL:
        return out.normal_(float(args.mean), float(args.std_dev), generator=generator)
    if mode is DynamicEmbInitializerMode.TRUNCATED_NORMAL:
        lower, upper = _bounds(args)
        return _truncated_normal(
            out, float(args.mean), float(args.std_dev), lower, upper, generator
        )
    raise ValueError(f"unknown initializer mode {mode!r}")  # pragma: no cover


def _truncated_normal(
    out: torch.Tensor,
    mean: float,
    std: float,
    lower: float,
    upper: float,
    generator: Optional[torch.Generator],
) -> torch.Tensor:
    """Inverse-CDF sampling of N(mean, std) restricted to [lower, upper] (exact, no rejection loop)."""

    def cdf(x: float) -> float:
        return 0.5 * (1.0 + math.erf((x - mean) / (std * math.sqrt(2.0))))

    lo, hi = cdf(lower), cdf(upper)
    u = torch.empty(out.shape, dtype=torch.float64, device=out.device).uniform_(
        lo, hi, generator=generator
    )
    u.clamp_(min=1e-12, max=1 - 1e-12)
    values = mean + std * math.sqrt(2.0) * torch.erfinv(2 * u - 1)
    return out.copy_(values.clamp_(lower, upper))
