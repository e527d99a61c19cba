"""Input checks shared by every ScoredHashTable method: run before anything is written.

Each check raises TypeError (wrong type or dtype) or ValueError (wrong shape, device, range) whose
message names the table (or tables), the argument, what was expected and what was found.
"""

from __future__ import annotations

from typing import Optional, Sequence, Union

import torch
from torch import Tensor

__all__ = ["check_int64_vector", "check_rows", "check_user_scores", "table_ids_tensor"]


def check_int64_vector(
    value: object, where: str, arg: str, device: torch.device, length: Optional[int] = None
) -> Tensor:
    """``value`` must be a 1-D int64 tensor on ``device`` (of ``length`` entries when given)."""
    if not isinstance(value, Tensor):
        raise TypeError(
            f"{where}: {arg} must be a torch.Tensor of int64, got {type(value).__name__}"
        )
    if value.dtype != torch.int64 or value.device != device:
        raise (TypeError if value.dtype != torch.int64 else ValueError)(
            f"{where}: {arg} must be int64 on {device}, got {value.dtype} on {value.device}"
        )
    if value.dim() != 1:
        raise ValueError(f"{where}: {arg} must be 1-D, got shape {tuple(value.shape)}")
    if length is not None and value.numel() != length:
        raise ValueError(
            f"{where}: {arg} must have {length} entries like keys, got {value.numel()}"
        )
    return value


def table_ids_tensor(
    table_ids: Union[None, int, Tensor],
    n: int,
    num_tables: int,
    names: Sequence[str],
    device: torch.device,
    where: str,
) -> Tensor:
    """The (n,) int64 table id of each key from None (table 0), an int, or a tensor; range-checked."""
    if table_ids is None or isinstance(table_ids, int):
        t = 0 if table_ids is None else int(table_ids)
        if not 0 <= t < num_tables:
            raise ValueError(
                f"{where}: table_ids={t} is not a table id in [0, {num_tables}) (tables: {list(names)})"
            )
        return torch.full((n,), t, dtype=torch.int64, device=device)
    tids = check_int64_vector(table_ids, where, "table_ids", device, n)
    if n:
        lo, hi = int(tids.min()), int(tids.max())
        if lo < 0 or hi >= num_tables:
            bad = lo if lo < 0 else hi
            raise ValueError(
                f"{where}: table_ids contains {bad}, not a table id in [0, {num_tables}) "
                f"(tables: {list(names)})"
            )
    return tids


def check_rows(
    rows: object, where: str, n: int, width: int, dtype: torch.dtype, device: torch.device
) -> Tensor:
    """``rows`` must be (n, width) of the table's dtype on ``device``."""
    if not isinstance(rows, Tensor):
        raise TypeError(f"{where}: rows must be a torch.Tensor, got {type(rows).__name__}")
    if rows.dtype != dtype:
        raise TypeError(f"{where}: rows must be {dtype}, got {rows.dtype}")
    if n == 0 and rows.numel() == 0 and rows.device == device:
        return rows.reshape(0, width)  # an empty batch: any empty shape will do
    if rows.device != device or rows.dim() != 2 or tuple(rows.shape) != (n, width):
        raise ValueError(
            f"{where}: rows must be ({n}, {width}) on {device}, got {tuple(rows.shape)} on {rows.device}"
        )
    return rows


def check_user_scores(
    scores: object, where: str, n: int, num_scores: int, device: torch.device
) -> Tensor:
    """``scores`` must be (n, num_scores) int64 on ``device`` (a 1-D (n,) is taken as one column)."""
    if not isinstance(scores, Tensor):
        raise TypeError(
            f"{where}: scores must be a torch.Tensor of int64, got {type(scores).__name__}"
        )
    if scores.dtype != torch.int64:
        raise TypeError(f"{where}: scores must be int64, got {scores.dtype}")
    if scores.dim() == 1 and (num_scores == 1 or n == 0):
        scores = scores.reshape(n, -1 if n else num_scores)
    if scores.device != device or tuple(scores.shape) != (n, num_scores):
        raise ValueError(
            f"{where}: scores must be ({n}, {num_scores}) int64 on {device} (user column order), "
            f"got {tuple(scores.shape)} on {scores.device}"
        )
    return scores
