"""Score word order: internal (kernels) <-> user (the strategy tuple). The one place it is decided.

Internally every slot has two words: ``[eviction score, timestamp-or-0]``; for the compound
strategy that is ``[count, timestamp]``. Users see the columns in the order of their strategy
tuple: (TIMESTAMP, LFU) -> ``[ts, count]`` (the reverse), (LFU, TIMESTAMP) -> ``[count, ts]``
(the same); single strategies see one column.
"""

from __future__ import annotations

from torch import Tensor

__all__ = ["score_columns_for_user", "score_words_from_user"]


def score_columns_for_user(
    words: Tensor, table_ids: Tensor, reversed_order: Tensor, num_columns: int
) -> Tensor:
    """Internal (n, 2) words -> (n, num_columns) user columns.

    Args:
        words: (n, 2) int64, internal order.
        table_ids: (n,) int64, the table of each row.
        reversed_order: (T,) bool, true for tables whose user order reverses the internal one
            (compound (TIMESTAMP, LFU)).
        num_columns: 1 or 2: the width of the result (rows of one-score tables read their only
            column first; their second column, if present, is 0).
    """
    flip = reversed_order[table_ids].unsqueeze(1)
    return words.flip(1).where(flip, words)[:, :num_columns].contiguous()


def score_words_from_user(
    columns: Tensor, table_ids: Tensor, reversed_order: Tensor, compound: Tensor
) -> Tensor:
    """User (n, 1 or 2) columns -> internal (n, 2) words (the inverse of score_columns_for_user).

    Args:
        columns: (n, k) int64, user order.
        table_ids, reversed_order: as in :func:`score_columns_for_user`.
        compound: (T,) bool, true for two-word tables; other tables' second word is forced to 0.
    """
    if columns.shape[1] == 1:
        return columns.new_zeros((columns.shape[0], 2)).index_copy_(
            1, columns.new_zeros(1), columns
        )
    flip = reversed_order[table_ids].unsqueeze(1)
    words = columns.flip(1).where(flip, columns).clone()
    words[:, 1] *= compound[table_ids].to(words.dtype)
    return words.contiguous()
