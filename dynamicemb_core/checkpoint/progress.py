"""Progress bars for dump, load, incremental dump and replay (STYLE rule 12): rank 0 only, rows as unit."""

from __future__ import annotations

import sys
from typing import Optional

from tqdm.auto import tqdm

__all__ = ["row_bar"]


def row_bar(total: int, desc: str, *, rank: int = 0, show_progress: Optional[bool] = None) -> tqdm:
    """A tqdm bar counting rows on stderr.

    Args:
        total: rows the operation will process.
        desc: e.g. ``"dump model.ec/user"``.
        rank: the caller's rank; ranks other than 0 never show a bar.
        show_progress: True forces the bar, False hides it, None lets tqdm decide (hidden off a TTY).
    """
    disable: Optional[bool] = None if show_progress is None else not show_progress
    if rank != 0:
        disable = True
    return tqdm(
        total=total,
        desc=desc,
        unit="rows",
        unit_scale=True,
        file=sys.stderr,
        disable=disable,
        leave=False,
    )
