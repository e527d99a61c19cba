"""Initial values of new embedding rows, one function per ``DynamicEmbInitializerMode``.

A key seen for the first time (``is_new`` from the table) gets its embedding from the table's
``initializer_args`` in training, and a missing key read in eval gets ``eval_initializer_args``
(zeros by default) without being stored.

Every new row comes from one op, ``grouped_init_rows`` (csrc/include/dynamicemb/row_init.h): the
value of element ``d`` of key ``k``'s row in table ``t`` is a counter-based random draw of
``(seed, t, k, d)`` under the table's initializer, so rows are made on the device without a count
of how many there are (the grouped step initialises its new rows in place, masked by the insert's
``is_new``, with no readback), and a key gets the same row on the CPU and on CUDA for one seed.
The seed is drawn from torch's default generator once per batch of new rows (:func:`draw_seed`),
so ``torch.manual_seed`` decides the values as before.
"""

from __future__ import annotations

import math
from typing import List, Optional, Sequence

import torch

from dynamicemb_core.config import DynamicEmbInitializerArgs, DynamicEmbInitializerMode
from dynamicemb_core.ops.lookup_ops import initial_rows

__all__ = [
    "DEBUG_MODULUS",
    "INIT_COLUMNS",
    "draw_seed",
    "initial_rows",
    "initialize_embeddings",
    "initializer_row",
    "initializer_table",
    "validate_initializer",
]

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


# Initializer codes of grouped_init_rows (csrc/include/dynamicemb/row_init.h).
_MODE_CODES = {
    DynamicEmbInitializerMode.CONSTANT: 0,
    DynamicEmbInitializerMode.DEBUG: 1,
    DynamicEmbInitializerMode.UNIFORM: 2,
    DynamicEmbInitializerMode.NORMAL: 3,
    DynamicEmbInitializerMode.TRUNCATED_NORMAL: 4,
}
# Columns of an initializer table: [mode, p0..p5, optimizer state value].
INIT_COLUMNS = 8


def initializer_row(args: DynamicEmbInitializerArgs, state: float = 0.0) -> List[float]:
    """One table's row of an initializer table (row_init.h's layout): its mode's code and
    parameters, then ``state``, the value of the optimizer-state columns of a new row."""
    mode = DynamicEmbInitializerMode(args.mode)
    row = [float(_MODE_CODES[mode])] + [0.0] * (INIT_COLUMNS - 1)
    if mode is DynamicEmbInitializerMode.CONSTANT:
        row[1] = float(args.value)
    elif mode is DynamicEmbInitializerMode.DEBUG:
        row[1] = float(DEBUG_MODULUS)
    elif mode is DynamicEmbInitializerMode.UNIFORM:
        row[1:3] = _bounds(args)
    elif mode is DynamicEmbInitializerMode.NORMAL:
        row[1:3] = [float(args.mean), float(args.std_dev)]
    else:
        mean, std = float(args.mean), float(args.std_dev)
        lower, upper = _bounds(args)

        def cdf(x: float) -> float:
            return 0.5 * (1.0 + math.erf((x - mean) / (std * math.sqrt(2.0))))

        row[1:7] = [mean, std, lower, upper, cdf(lower), cdf(upper)]
    row[INIT_COLUMNS - 1] = float(state)
    return row


def initializer_table(
    args: Sequence[DynamicEmbInitializerArgs], device: torch.device, state: float = 0.0
) -> torch.Tensor:
    """(T, 8) float64 on ``device``: table ``t``'s initializer ``args[t]`` for grouped_init_rows."""
    rows = [initializer_row(a, state) for a in args]
    return torch.tensor(rows, dtype=torch.float64).to(device)


def draw_seed(generator: Optional[torch.Generator] = None) -> int:
    """The seed of one batch of new rows, from ``generator`` (None: torch's default CPU one, so
    ``torch.manual_seed`` decides the values; drawing from it needs no device sync)."""
    device = generator.device if generator is not None else torch.device("cpu")
    return int(torch.randint(0, 2**62, (1,), generator=generator, device=device).item())


def initialize_embeddings(
    args: DynamicEmbInitializerArgs,
    keys: torch.Tensor,
    dim: int,
    dtype: torch.dtype = torch.float32,
    generator: Optional[torch.Generator] = None,
) -> torch.Tensor:
    """New embedding rows for ``keys``: the rows a table with initializer ``args`` (table id 0 of
    its group) gives them, for a seed drawn from ``generator``.

    Args:
        args: the initializer.
        keys: (n,) int64 keys the rows are for (each key's values are its own random stream).
        dim: embedding width.
        dtype: row dtype.
        generator: where the seed is drawn from (None: torch's default CPU generator).

    Returns:
        (n, dim) tensor of ``dtype`` on ``keys.device``.
    """
    init = initializer_table([args], keys.device)
    tids = torch.zeros_like(keys)
    rows = initial_rows(init, keys, tids, dim, [dim], draw_seed(generator))
    return rows if dtype == torch.float32 else rows.to(dtype)
