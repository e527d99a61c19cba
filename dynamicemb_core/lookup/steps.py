"""The STEP score clock of a table's storage: where it starts and when it moves.

A STEP table scores every key a forward touches with the table's step (the seed's
``DynamicEmbScoreStrategy.STEP``): the step starts at 1, the first training forward writes 1, and
each training forward adds one after its lookups, so ``get_score`` always says what the next
forward will write, older keys score lower (eviction removes them first) and ``incremental_dump``
with an earlier ``get_score`` result returns the keys touched since.

A table's storage may hold several hash tables that score the same keys (a device cache and the
host table behind it); they all keep one step, moved together here. The lookup module calls
:func:`start_steps` once per table when it builds the storage and :func:`advance_clocks` (over the
:func:`step_clocks` it keeps) once per training forward; a checkpoint restores a step with the hash
table's ``set_score``.
"""

from __future__ import annotations

from typing import Any, Iterable, Iterator, List, Tuple

from dynamicemb_core.config import DynamicEmbScoreStrategy

__all__ = [
    "FIRST_STEP",
    "advance_clocks",
    "hash_tables",
    "start_steps",
    "step_clocks",
    "step_tables",
]

FIRST_STEP = 1
_STEP = int(DynamicEmbScoreStrategy.STEP)


def hash_tables(storage: Any, table_id: int = 0) -> Iterator[Tuple[Any, int]]:
    """``(ScoredHashTable, table id)`` of every hash table of ``storage`` holding ``table_id``.

    A module's per-table view holds its table as id 0 of the view: the group's table
    ``view.table_id``, and for a cached table also its backing store's when that is a hash-table
    storage (a host table; an external storage keeps its scores itself)."""
    group = getattr(storage, "group", None)
    if group is not None:
        t = int(storage.table_id)
        yield group.table, t
        cache = group.cache
        if cache is not None and cache.cached[t]:
            yield from hash_tables(cache.backing.store(t), cache.backing.backing_ids[t])
        return
    table = getattr(storage, "table", None)
    if table is not None and hasattr(table, "advance_step"):
        yield table, table_id


def step_tables(storage: Any, table_id: int = 0) -> List[Tuple[Any, int]]:
    """The STEP-scored hash tables of ``storage`` for ``table_id`` (none for other strategies)."""
    return [(t, i) for t, i in hash_tables(storage, table_id) if t.specs[i].policy == _STEP]


def start_steps(storage: Any, table_id: int = 0) -> None:
    """Set every STEP hash table of ``storage`` to the first step (a new table's clock)."""
    for table, t in step_tables(storage, table_id):
        table.set_score(t, FIRST_STEP)


def step_clocks(storages: Iterable[Any], table_id: int = 0) -> List[Tuple[Any, int]]:
    """The STEP-scored ``(hash table, table id)`` of every storage: the clocks a training
    forward moves. Fixed once the storages are built: a module keeps the list and advances it with
    :func:`advance_clocks` after each training forward (no per-table lookups per step)."""
    return [clock for storage in storages for clock in step_tables(storage, table_id)]


def advance_clocks(clocks: Iterable[Tuple[Any, int]]) -> None:
    """Add one to the step of each ``(hash table, table id)`` of :func:`step_clocks`."""
    for table, t in clocks:
        table.advance_step(t)
