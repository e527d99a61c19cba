"""The row ledger: check, key by key, every path that moves rows (docs: design/row-ledger.md).

A path that moves rows (dump -> load, reshard N -> M, incremental dump -> replay, dump or model ->
served collection -> replay, export -> package after ``attach``) is right when, after the move,
every key the source held reads the source's row at the destination and nothing else changed. The
source's own rows, taken at the moment of the move, are the oracle: no second optimizer is needed.

- A :data:`Ledger` maps ``(collection, table, key)`` to a :class:`Row` (embedding, optimizer state,
  scores), built through the public export path (what ``DynamicEmbDump`` and ``incremental_dump``
  read) on CPU tensors: :func:`ledger_of_model` (gathered over the gloo/NCCL ranks of a sharded
  model), :func:`ledger_of_served` (an inference collection, every shard), :func:`ledger_of_delta`
  (what an ``incremental_dump`` result carries).
- A *move* is a function; the ones below (:func:`move_dump_load`, :func:`move_replay_increment`,
  :func:`move_from_dump`, :func:`move_from_model`, :func:`move_replay_served`) wrap the public API
  so tests of every path read alike. A new path gets the same check by adding one move.
- :func:`check_moved` compares the destination's ledger after the move with the source's and with
  the destination's before it; :func:`check_refused` runs a move that must fail and checks that the
  destination's ledger did not change; :func:`check_served` compares served lookups of held-out
  batches with the trainer's eval forward, bit for bit.

Everything here runs on any device: tables are read where they live and compared on the CPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Type

import torch
import torch.distributed as dist
from torch import Tensor, nn

__all__ = [
    "Ledger",
    "LedgerMismatch",
    "Row",
    "check_moved",
    "check_refused",
    "check_served",
    "gather_ledger",
    "ledger_of_delta",
    "ledger_of_handles",
    "ledger_of_model",
    "ledger_of_served",
    "move_dump_load",
    "move_from_dump",
    "move_from_model",
    "move_replay_increment",
    "move_replay_served",
]

Key = Tuple[str, str, int]


@dataclass(frozen=True)
class Row:
    """One key's stored row on the CPU.

    Attributes:
        embedding: (dim,) in the table's embedding dtype.
        optimizer: (w,) optimizer state at the checkpoint width (empty for a served table).
        scores: (num_scores,) int64, user order; clock columns (TIMESTAMP) as ages.
        clock: which score columns are clocks (their ages move with time, so they are not compared).
    """

    embedding: Tensor
    optimizer: Tensor
    scores: Tensor
    clock: Tuple[int, ...] = ()

    def fixed_scores(self) -> Tensor:
        """The score columns that are not clocks (compared bit for bit)."""
        keep = [i for i in range(self.scores.numel()) if i not in self.clock]
        return self.scores[keep]


Ledger = Dict[Key, Row]


class LedgerMismatch(AssertionError):
    """A destination's ledger differs from what the move promised; the message lists the first keys."""


# ---- building ledgers ---------------------------------------------------------------------------
def ledger_of_handles(handles: Iterable[Any]) -> Ledger:
    """Every row of every table handle (``dynamicemb_core.checkpoint.types.TableHandle``).

    Device caches are flushed first (as a dump does), so the last tier holds every key.
    """
    from dynamicemb_core.checkpoint.scores import clock_columns
    from dynamicemb_core.checkpoint.table_io import export_rows

    out: Ledger = {}
    for handle in handles:
        if handle.flush_cache is not None:
            handle.flush_cache()
        rows = export_rows(handle)
        clock = tuple(clock_columns(handle.options))
        keys = rows.keys.cpu().tolist()
        emb, opt, scores = rows.embeddings.cpu(), rows.optimizer_states.cpu(), rows.scores.cpu()
        for i, key in enumerate(keys):
            where = (handle.collection, handle.name, int(key))
            if where in out:
                raise LedgerMismatch(f"key {where} is held by two shards of the table")
            out[where] = Row(emb[i].clone(), opt[i].clone(), scores[i].clone(), clock)
    return out


def gather_ledger(ledger: Ledger, group: Optional[dist.ProcessGroup] = None) -> Ledger:
    """The union of every rank's ledger (every rank gets it); the ledger itself without a group.

    Raises:
        LedgerMismatch: a key held by two ranks (row-wise sharding gives each key one owner).
    """
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size(group) == 1:
        return dict(ledger)
    parts: List[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(parts, ledger, group=group)
    out: Ledger = {}
    for rank, part in enumerate(parts):
        for key, row in part.items():
            if key in out:
                raise LedgerMismatch(f"key {key} is held by rank {rank} and another rank")
            out[key] = row
    return out


def ledger_of_model(model: nn.Module, group: Optional[dist.ProcessGroup] = None) -> Ledger:
    """Every dynamic table of ``model`` (all collections), gathered over ``group`` when sharded.

    Collective when a process group is initialized: every rank must call it.
    """
    from dynamicemb_core.checkpoint.discovery import find_tables

    return gather_ledger(ledger_of_handles(find_tables(model, None)), group)


def ledger_of_served(served: Any) -> Ledger:
    """Every shard of every table of an inference collection (local; no collective)."""
    return ledger_of_handles(served.embeddings.handles(served.collection))


def ledger_of_delta(deltas: Mapping[str, Any]) -> Ledger:
    """The rows ``incremental_dump`` returned: ``{collection: DeltaDumpResult}``."""
    from dynamicemb_core.checkpoint.scores import clock_columns

    out: Ledger = {}
    for collection, delta in deltas.items():
        for i, name in enumerate(delta.table_names):
            clock = tuple(clock_columns(delta.meta[i]["table_options"]))
            opt = delta.optimizer_states[i]
            for j, key in enumerate(delta.keys[i].tolist()):
                out[(collection, name, int(key))] = Row(
                    delta.values[i][j].clone(),
                    opt[j].clone() if opt is not None else torch.empty(0),
                    delta.scores[i][j].clone(),
                    clock,
                )
    return out


def select(ledger: Ledger, keep: Callable[[Key], bool]) -> Ledger:
    """The rows whose ``(collection, table, key)`` passes ``keep``."""
    return {k: v for k, v in ledger.items() if keep(k)}


def rename(ledger: Ledger, collections: Mapping[str, str]) -> Ledger:
    """The ledger with collections renamed (a served collection may hold another path)."""
    return {(collections.get(c, c), t, k): v for (c, t, k), v in ledger.items()}


# ---- checks -------------------------------------------------------------------------------------
def _same(a: Row, b: Row, fields: Sequence[str]) -> Optional[str]:
    for field in fields:
        if field == "embedding":
            x, y = a.embedding, b.embedding
        elif field == "optimizer":
            x, y = a.optimizer, b.optimizer
        elif field == "scores":
            x, y = a.fixed_scores(), b.fixed_scores()
        else:
            raise ValueError(f"unknown field {field!r}")
        if x.shape != y.shape or x.dtype != y.dtype or not torch.equal(x, y):
            return f"{field}: {y.tolist()} != {x.tolist()}"
    return None


def check_moved(
    expected: Ledger,
    after: Ledger,
    before: Optional[Ledger] = None,
    *,
    fields: Sequence[str] = ("embedding",),
    removed: Iterable[Key] = (),
    what: str = "move",
    limit: int = 8,
) -> Dict[str, int]:
    """Check a destination after a move, key by key.

    Args:
        expected: the rows the move carries (the source's ledger at the moment of the move).
        after: the destination's ledger after the move.
        before: the destination's ledger before it (None: it was empty). Keys it held that the move
            does not carry must read what they read; no key beyond ``before`` and ``expected`` may
            appear.
        fields: what must be equal bit for bit: ``embedding``, ``optimizer``, ``scores`` (the
            non-clock columns).
        removed: keys the move removes (a delta's erased keys): absent after it.
        what: the move's name in messages.

    Returns:
        ``{"moved": n, "kept": n}``, counts of keys checked.

    Raises:
        LedgerMismatch: listing the first ``limit`` wrong keys per kind and the totals.
    """
    before = before or {}
    gone = set(removed)
    problems: Dict[str, List[str]] = {"missing": [], "wrong": [], "changed": [], "extra": []}
    for key, row in expected.items():
        got = after.get(key)
        if got is None:
            problems["missing"].append(str(key))
            continue
        diff = _same(row, got, fields)
        if diff is not None:
            problems["wrong"].append(f"{key}: {diff}")
    kept = 0
    for key, row in before.items():
        if key in expected:
            continue
        if key in gone:
            if key in after:
                problems["extra"].append(f"{key} (removed by the move, still held)")
            continue
        kept += 1
        got = after.get(key)
        if got is None:
            problems["changed"].append(f"{key}: gone")
            continue
        diff = _same(row, got, fields)
        if diff is not None:
            problems["changed"].append(f"{key}: {diff}")
    for key in after:
        if key not in expected and key not in before:
            problems["extra"].append(str(key))
    bad = {kind: items for kind, items in problems.items() if items}
    if bad:
        lines = [
            f"{what}: {len(items)} {kind} keys, e.g. " + "; ".join(items[:limit])
            for kind, items in bad.items()
        ]
        per_table = _per_table_counts(expected)
        raise LedgerMismatch("\n".join(lines + [f"(the move carried {per_table})"]))
    return {"moved": len(expected), "kept": kept}


def _per_table_counts(ledger: Ledger) -> Dict[str, int]:
    out: Dict[str, int] = {}
    for collection, table, _ in ledger:
        name = f"{collection}/{table}"
        out[name] = out.get(name, 0) + 1
    return out


def check_refused(
    move: Callable[[], Any],
    read: Callable[[], Ledger],
    errors: Tuple[Type[BaseException], ...],
    *,
    match: Sequence[str] = (),
    fields: Sequence[str] = ("embedding", "optimizer", "scores"),
    what: str = "move",
) -> BaseException:
    """Run a move that must be refused; the destination's ledger must not change.

    Args:
        move: the move (no arguments).
        read: reads the destination's ledger (collective if the destination is sharded).
        errors: the exception types a clear refusal raises.
        match: substrings the message must hold (the table, field or file it names).

    Returns:
        The exception raised.

    Raises:
        LedgerMismatch: the move succeeded, raised something else, named none of ``match``, or
            changed the destination.
    """
    before = read()
    try:
        move()
    except errors as err:
        raised: BaseException = err
    except Exception as err:  # reported as the mismatch it is
        raise LedgerMismatch(
            f"{what}: expected a refusal {[e.__name__ for e in errors]}, got "
            f"{type(err).__name__}: {err}"
        ) from err
    else:
        raise LedgerMismatch(f"{what}: was not refused")
    text = str(raised)
    absent = [m for m in match if m not in text]
    if absent:
        raise LedgerMismatch(f"{what}: the refusal does not name {absent}: {text}")
    check_moved({}, read(), before, fields=fields, what=f"{what} (refused)")
    return raised


def check_served(
    serve: Callable[[Any], Tensor],
    oracle: Callable[[Any], Tensor],
    batches: Iterable[Any],
    *,
    what: str = "served",
    atol: float = 0.0,
) -> int:
    """Served lookups of held-out batches equal the oracle's (the trainer's eval forward), bit for bit.

    Args:
        serve, oracle: map one batch to an output tensor (or a list/tuple of tensors).
        batches: held-out batches (seen and never-seen ids).
        atol: 0 (bit for bit) unless the two sum a bag in another order: a row-wise sharded
            trainer pools each rank's ids, then adds the ranks' partial sums. Bags of one id
            compare exactly there too.

    Returns:
        The number of batches compared.
    """
    n = 0
    for i, batch in enumerate(batches):
        with torch.no_grad():
            got, want = serve(batch), oracle(batch)
        got_list = list(got) if isinstance(got, (list, tuple)) else [got]
        want_list = list(want) if isinstance(want, (list, tuple)) else [want]
        if len(got_list) != len(want_list):
            raise LedgerMismatch(
                f"{what}: batch {i}: {len(got_list)} outputs, want {len(want_list)}"
            )
        for g, w in zip(got_list, want_list):
            g, w = g.detach().cpu(), w.detach().cpu()
            same = g.shape == w.shape and (
                torch.equal(g, w) if atol == 0 else torch.allclose(g, w, rtol=0, atol=atol)
            )
            if not same:
                diff = (g - w).abs().max().item() if g.shape == w.shape else "shape"
                raise LedgerMismatch(
                    f"{what}: batch {i}: output differs from the trainer's eval forward "
                    f"(shape {tuple(g.shape)} vs {tuple(w.shape)}, max |diff| {diff})"
                )
        n += 1
    return n


# ---- moves --------------------------------------------------------------------------------------
def move_dump_load(
    path: str,
    source: Optional[nn.Module],
    destination: Optional[nn.Module],
    *,
    optim: bool = True,
    pg: Optional[dist.ProcessGroup] = None,
) -> None:
    """``DynamicEmbDump(path, source)`` then ``DynamicEmbLoad(path, destination)`` (either may be
    None: a dump written by another job, or only the dump). Collective over the ranks."""
    from dynamicemb_core.checkpoint import DynamicEmbDump, DynamicEmbLoad

    if source is not None:
        DynamicEmbDump(path, source, optim=optim, pg=pg, allow_overwrite=True)
        if pg is not None or (dist.is_available() and dist.is_initialized()):
            dist.barrier(pg)
    if destination is not None:
        DynamicEmbLoad(path, destination, optim=optim, pg=pg)


def move_replay_increment(
    deltas: Mapping[str, Any], destination: nn.Module, content: Any = None
) -> None:
    """``replay_increment(destination, deltas, content)`` into a trainer twin (default: ALL)."""
    from dynamicemb_core.checkpoint import replay_increment
    from dynamicemb_core.checkpoint.types import ReplayContent

    replay_increment(
        destination,
        dict(deltas),
        ReplayContent.ALL if content is None else content,
        show_progress=False,
    )


def move_from_dump(
    cls: Any, path: str, configs: Sequence[Any], options: Any, device: Any = "cpu", **kwargs: Any
) -> Any:
    """``cls.from_dump(path, configs, options, device)``: an inference collection."""
    return cls.from_dump(path, configs, options, device, **kwargs)


def move_from_model(cls: Any, model: nn.Module, device: Any = None, **kwargs: Any) -> Any:
    """``cls.from_model(model, device=device)``: an inference collection (world size 1)."""
    return cls.from_model(model, device=device, **kwargs)


def move_replay_served(served: Any, deltas: Mapping[str, Any]) -> None:
    """``served.replay(deltas)`` (an inference collection, its exported program or package reads
    the same buffers)."""
    served.replay(deltas)
