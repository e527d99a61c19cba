"""incremental_dump, get_score and set_score: what changed since a score threshold, and the score clock.

A delta row carries the whole stored row: the embedding (``values``), the optimizer state at checkpoint
width (``optimizer_states``) and every score word (``scores``, timestamps as ages), plus the slot the key
occupies (``meta["slot_index"]``) so :func:`replay_increment` can put it back exactly there.
"""

from __future__ import annotations

import warnings
from typing import Any, Dict, List, Optional, Tuple, TypeGuard, Union

import torch
import torch.distributed as dist
from torch import nn

from dynamicemb_core.checkpoint.collectives import gather_rows, group_rank
from dynamicemb_core.checkpoint.discovery import find_tables, group_by_collection
from dynamicemb_core.checkpoint.evicted import take_erased_keys, take_evicted_keys
from dynamicemb_core.checkpoint.layout import layout_meta
from dynamicemb_core.checkpoint.ownership import check_dist_type_supported
from dynamicemb_core.checkpoint.progress import row_bar
from dynamicemb_core.checkpoint.table_io import export_rows
from dynamicemb_core.checkpoint.types import DeltaDumpResult, TableHandle
from dynamicemb_core.types import DynamicEmbWarning

__all__ = ["get_score", "incremental_dump", "set_score"]

ScoreArg = Union[int, Dict[str, Dict[str, int]]]


def _is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _select(
    handles: List[TableHandle], score: ScoreArg, api: str, arg: str, *, warn_unknown: bool = False
) -> List[Tuple[TableHandle, int]]:
    """Pair each table with its integer score; validate the whole argument first.

    ``warn_unknown``: a collection or table the model does not have is skipped with a warning (the
    seed's ``set_score``) instead of raising.
    """
    if _is_int(score):
        return [(h, int(score)) for h in handles]
    if not isinstance(score, dict):
        raise TypeError(
            f"{api}: {arg} must be an int or Dict[str, Dict[str, int]], got {type(score).__name__}"
        )
    known = group_by_collection(handles)
    selected = []
    for collection, per_table in score.items():
        if collection not in known:
            message = f"{api}: {arg} names collection '{collection}'; the model has {sorted(known)}"
            if not warn_unknown:
                raise ValueError(message)
            warnings.warn(message + "; skipped", DynamicEmbWarning, stacklevel=3)
            continue
        if not isinstance(per_table, dict):
            raise TypeError(
                f"{api}: {arg}['{collection}'] must be Dict[str, int], got {type(per_table).__name__}"
            )
        names = {h.name: h for h in known[collection]}
        for table, value in per_table.items():
            if table not in names:
                message = (
                    f"{api}: {arg}['{collection}'] names table '{table}'; the collection has "
                    f"{sorted(names)}"
                )
                if not warn_unknown:
                    raise ValueError(message)
                warnings.warn(message + "; skipped", DynamicEmbWarning, stacklevel=3)
                continue
            if not _is_int(value):
                raise TypeError(
                    f"{api}: {arg}['{collection}']['{table}'] must be an int, got {type(value).__name__}"
                )
            selected.append((names[table], int(value)))
    order = {id(h): i for i, h in enumerate(handles)}
    return sorted(
        selected, key=lambda pair: order[id(pair[0])]
    )  # model order: identical on every rank


def incremental_dump(
    model: nn.Module,
    score_threshold: ScoreArg,
    pg: Optional[dist.ProcessGroup] = None,
    *,
    show_progress: Optional[bool] = None,
) -> Dict[str, DeltaDumpResult]:
    """Dump the rows whose score is not less than the threshold, gathered over ``pg``.

    For a clock-scored table (TIMESTAMP, or a compound strategy with TIMESTAMP) the threshold is a time:
    rows touched since then are dumped; pass an earlier :func:`get_score` result. For STEP, LFU and
    CUSTOMIZED it is compared to the score itself.

    Args:
        model: the model holding dynamic tables.
        score_threshold: one int for every table, or ``{collection: {table: int}}`` to dump only those.
        pg: group whose ranks' rows are all-gathered (every rank gets the union); None is WORLD.
        show_progress: force the rank-0 progress bars on or off.

    Returns:
        ``{collection_path: DeltaDumpResult}``.

    Raises:
        TypeError: a threshold that is not an int (checked before anything is read).
        NotImplementedError: a selected table sharded with ``dist_type="continuous"``.
    """
    selected = _select(
        find_tables(model, None), score_threshold, "incremental_dump", "score_threshold"
    )
    for handle, _ in selected:
        check_dist_type_supported(handle, "incremental_dump")
    rank = group_rank(pg)
    results: Dict[str, DeltaDumpResult] = {}
    for handle, threshold in selected:
        if handle.flush_cache is not None:
            handle.flush_cache()
        desc = f"incremental_dump {handle.qualified_name}"
        with row_bar(
            handle.table.size(handle.table_id), desc, rank=rank, show_progress=show_progress
        ) as bar:
            rows = export_rows(handle, threshold, bar)
        keys, slots, values, states, scores = gather_rows(
            [rows.keys, rows.slots, rows.embeddings, rows.optimizer_states, rows.scores], pg
        )
        evicted = take_evicted_keys(handle)
        if evicted is not None:
            (evicted,) = gather_rows([evicted], pg)
            evicted = torch.unique(evicted)
        (erased,) = gather_rows([take_erased_keys(handle)], pg)
        meta = layout_meta(handle)
        meta["current_score"] = int(handle.table.get_score(handle.table_id))
        meta["slot_index"] = slots
        result = results.setdefault(handle.collection, DeltaDumpResult())
        result.table_names.append(handle.name)
        result.keys.append(keys)
        result.values.append(values)
        result.optimizer_states.append(states)
        result.scores.append(scores)
        result.evicted_keys.append(evicted)
        result.erased_keys.append(torch.unique(erased))
        result.meta.append(meta)
    return results


def get_score(model: nn.Module) -> Optional[Dict[str, Dict[str, int]]]:
    """The score each dynamic table's next forward will use: a clock reading (TIMESTAMP), the step
    (STEP) or the set score (CUSTOMIZED). None when the model has no dynamic table.

    Keep a result as the threshold of a later :func:`incremental_dump` to get what changed in between.
    """
    handles = find_tables(model, None)
    if not handles:
        return None
    out: Dict[str, Dict[str, int]] = {}
    for handle in handles:
        out.setdefault(handle.collection, {})[handle.name] = int(
            handle.table.get_score(handle.table_id)
        )
    return out


def set_score(model: nn.Module, table_score: ScoreArg) -> None:
    """Register the score the next forwards write, for CUSTOMIZED (and STEP) tables.

    Args:
        model: the model holding dynamic tables.
        table_score: one int for every table whose score can be set (CUSTOMIZED and STEP), or
            ``{collection: {table: int}}``. The table warns (DynamicEmbWarning) when a CUSTOMIZED score
            goes down, unless ``DYNAMICEMB_CSTM_SCORE_CHECK=0``.

    Raises:
        TypeError / ValueError: a non-int score, a named table whose strategy has no settable score,
            or an int when no table has one; all before any score is set. A collection or table the
            model does not have is skipped with a DynamicEmbWarning, as the seed does.
    """
    handles = find_tables(model, None)
    if _is_int(table_score):
        handles = [h for h in handles if _settable(h)]
        if not handles:
            raise ValueError(
                "set_score: the model has no CUSTOMIZED or STEP dynamic table to set a score for"
            )
    selected = _select(handles, table_score, "set_score", "table_score", warn_unknown=True)
    for handle, _ in selected:
        if not _settable(handle):
            raise ValueError(
                f"set_score: table '{handle.qualified_name}' has score_strategy "
                f"{tuple(s.name for s in handle.options.score_strategies)}; only CUSTOMIZED and STEP "
                f"tables take a set score"
            )
    from dynamicemb_core.checkpoint.state import set_score_clock

    for handle, score in selected:
        set_score_clock(handle, score)


def _settable(handle: TableHandle) -> bool:
    from dynamicemb_core.config import DynamicEmbScoreStrategy as S

    return handle.options.score_strategies in ((S.CUSTOMIZED,), (S.STEP,))
