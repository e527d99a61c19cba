"""What a full checkpoint keeps besides the rows, so that training resumes exactly where it stopped.

- **Training state** (``optim=True``), per lookup module: the optimizer, its step counter (FBGEMM's
  ``iter``, which Adam's bias correction reads) and its hyper-parameters (learning rate, eps, betas,
  weight decay and its mode, initial accumulator). Stored in every table shard's header, since every
  table of a module shares them; a load checks that the shards it reads agree.
- **Score clock**, per table: the step of a STEP table, the set score of a CUSTOMIZED one (what the
  next forward writes). Always stored, because the rows' scores are stored: after a load, keys
  touched next must still score above the ones loaded. A load only moves a clock forward.
- **Admission counters** (``counter=True``), per table: the keys seen but not yet admitted and their
  counts, in a shard file of their own (keys and one ``COUNT`` score column, no embedding), routed
  by owner on load like rows. They go through the counter's own ``dump``/``load`` (the seed's
  ``Counter`` interface), so any counter plugin is saved.

Everything here is checked before the first row of a load is written.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from dynamicemb_core.checkpoint.errors import CheckpointMismatchError
from dynamicemb_core.checkpoint.format import COUNTER, ShardHeader, ShardPayload
from dynamicemb_core.checkpoint.types import TableHandle
from dynamicemb_core.config import DynamicEmbScoreStrategy

__all__ = [
    "COUNT_COLUMNS",
    "SCORE_CLOCK",
    "TRAINING_STATE",
    "TrainingRestore",
    "check_training_states",
    "counter_header",
    "counter_payload",
    "load_counter",
    "restore_score_clock",
    "restore_training",
    "saved_score_clock",
    "score_clock",
    "set_score_clock",
    "training_state",
]

TRAINING_STATE = "training_state"  # header extra key
SCORE_CLOCK = "score_clock"  # header extra key
ROUNDING_SEED = "stochastic_rounding_seed"  # training state key
COUNTER_KIND = "admission_counter"
COUNT_COLUMNS = ("COUNT",)
_CLOCKED = ((DynamicEmbScoreStrategy.STEP,), (DynamicEmbScoreStrategy.CUSTOMIZED,))


# ---- training state ---------------------------------------------------------------------------
def training_state(handle: TableHandle) -> Dict[str, Any]:
    """The optimizer, step and hyper-parameters of the module holding ``handle``'s table, and the
    seed of its stochastic rounding when it has one (the random bits of an update hash the seed
    and the step, so a resumed run rounds as the uninterrupted one)."""
    from dynamicemb_core.optim import optimizer_args_state

    module = handle.owner
    state = {
        "optimizer": module.optimizer_kind.value,
        "step": int(module.step),
        "hyper_parameters": optimizer_args_state(module.optimizer_args),
    }
    seed = getattr(module, "stochastic_rounding_seed", None)
    if seed is not None:
        state[ROUNDING_SEED] = int(seed)
    return state


class TrainingRestore:
    """One module's training state read from a checkpoint, validated, ready to set."""

    def __init__(
        self, handle: TableHandle, step: int, args: Any, rounding_seed: Optional[int] = None
    ) -> None:
        self.handle, self.step, self.args = handle, step, args
        self.rounding_seed = rounding_seed


def check_training_states(
    plan: Sequence[Tuple[TableHandle, Sequence[ShardHeader]]], path: str
) -> List[TrainingRestore]:
    """Per lookup module of the loaded tables, the training state its shards hold.

    Raises:
        CheckpointMismatchError: a shard without training state (dumped without ``optim=True``),
            another optimizer than the module's, shards of one module that disagree, or
            hyper-parameters the module's optimizer refuses.
    """
    from dynamicemb_core.optim import optimizer_args_from_kwargs

    by_module: Dict[int, Tuple[TableHandle, Dict[str, Any], str]] = {}
    for handle, headers in plan:
        if handle.owner is None:
            continue
        for header in headers:
            state = header.extra.get(TRAINING_STATE)
            if state is None:
                raise CheckpointMismatchError(
                    f"checkpoint {path}: {header.describe()} holds no optimizer step or "
                    "hyper-parameters (it was dumped with optim=False); load it with optim=False"
                )
            kind = handle.owner.optimizer_kind.value
            if state.get("optimizer") != kind:
                raise CheckpointMismatchError(
                    f"checkpoint {path}: {header.describe()} was trained with optimizer "
                    f"{state.get('optimizer')!r}, target table '{handle.qualified_name}' uses "
                    f"{kind!r}; load it with optim=False to take the embeddings alone"
                )
            seen = by_module.setdefault(id(handle.owner), (handle, state, header.describe()))
            if seen[1] != state:
                raise CheckpointMismatchError(
                    f"checkpoint {path}: {header.describe()} and {seen[2]} load into one lookup "
                    f"module but hold different optimizer states ({state} vs {seen[1]})"
                )
    out = []
    for handle, state, where in by_module.values():
        try:
            args = optimizer_args_from_kwargs(handle.owner.optimizer, state["hyper_parameters"])
            step = int(state["step"])
            seed = state.get(ROUNDING_SEED)
            seed = None if seed is None else int(seed)
        except (KeyError, TypeError, ValueError) as err:
            raise CheckpointMismatchError(
                f"checkpoint {path}: {where}: unusable optimizer state {state}: {err}"
            ) from None
        if step < 0:
            raise CheckpointMismatchError(f"checkpoint {path}: {where}: negative step {step}")
        if seed is not None and not 0 <= seed < 2**63:
            raise CheckpointMismatchError(
                f"checkpoint {path}: {where}: stochastic_rounding_seed {seed} outside [0, 2**63)"
            )
        out.append(TrainingRestore(handle, step, args, seed))
    return out


def restore_training(restore: TrainingRestore) -> None:
    """Set a module's step and hyper-parameters (and its TorchRec fused optimizer's rate), and the
    checkpoint's stochastic rounding seed where the module rounds stochastically (a module that
    rounds to nearest keeps doing so: its own ``stochastic_rounding`` setting stands)."""
    from dynamicemb_core.checkpoint.adapters import set_training_state

    module = restore.handle.owner
    set_training_state(module, restore.handle.kernel, restore.step, restore.args)
    if restore.rounding_seed is not None and getattr(module, ROUNDING_SEED, None) is not None:
        module.stochastic_rounding_seed = restore.rounding_seed


# ---- score clocks -----------------------------------------------------------------------------
def _clock_tables(handle: TableHandle) -> List[Tuple[Any, int]]:
    from dynamicemb_core.lookup.steps import hash_tables

    if handle.tier is not None:
        return list(hash_tables(handle.tier, 0))
    return [(handle.table, handle.table_id)]


def score_clock(handle: TableHandle) -> Optional[int]:
    """The score the table's next forward writes, for STEP and CUSTOMIZED tables (else None)."""
    if handle.options.score_strategies not in _CLOCKED:
        return None
    return int(handle.table.get_score(handle.table_id))


def saved_score_clock(headers: Sequence[ShardHeader]) -> Optional[int]:
    """The latest score clock the shards of one table recorded (None: none recorded)."""
    values = [int(h.extra[SCORE_CLOCK]) for h in headers if h.extra.get(SCORE_CLOCK) is not None]
    return max(values) if values else None


def _clocked_tables(handle: TableHandle) -> List[Tuple[Any, int]]:
    clocked = {int(DynamicEmbScoreStrategy.STEP), int(DynamicEmbScoreStrategy.CUSTOMIZED)}
    return [(t, i) for t, i in _clock_tables(handle) if int(t.specs[i].policy) in clocked]


def set_score_clock(handle: TableHandle, score: int) -> None:
    """Set the score clock of every STEP / CUSTOMIZED hash table of the table's storage (a device
    cache and the table behind it score the same keys, so they keep one clock)."""
    for table, t in _clocked_tables(handle):
        table.set_score(t, int(score))


def restore_score_clock(handle: TableHandle, saved: Optional[int]) -> None:
    """Move the table's score clock (every hash table of its storage) up to ``saved``."""
    if saved is None or handle.options.score_strategies not in _CLOCKED:
        return
    tables = _clocked_tables(handle)
    if tables:
        set_score_clock(handle, max([int(saved)] + [int(t.get_score(i)) for t, i in tables]))


# ---- admission counters -----------------------------------------------------------------------
def counter_header(handle: TableHandle, n: int, rank: int, world: int) -> ShardHeader:
    """The header of a table's counter shard: keys and counts, no embedding."""
    return ShardHeader(
        table_name=handle.name,
        collection=handle.collection,
        num_rows=n,
        dim=0,
        optimizer_width=0,
        dtype=torch.float32,
        score_columns=COUNT_COLUMNS,
        rank=rank,
        world_size=world,
        extra={"kind": COUNTER_KIND},
        kind=COUNTER,
    )


def counter_payload(counter: Any) -> ShardPayload:
    """The counter's keys and counts, read through its own ``dump`` (the seed's Counter API)."""
    with tempfile.TemporaryDirectory(prefix="demb-counter-") as tmp:
        key_file, count_file = os.path.join(tmp, "keys"), os.path.join(tmp, "counts")
        counter.dump(key_file, count_file)
        keys = torch.from_numpy(np.fromfile(key_file, dtype="<i8").copy())
        counts = torch.from_numpy(np.fromfile(count_file, dtype="<i8").copy())
    if keys.shape != counts.shape:
        raise ValueError(
            f"admission counter {type(counter).__name__}.dump wrote {keys.numel()} keys and "
            f"{counts.numel()} counts"
        )
    n = keys.numel()
    return ShardPayload(
        keys=keys,
        embeddings=torch.empty((n, 0), dtype=torch.float32),
        optimizer_states=torch.empty((n, 0), dtype=torch.float32),
        scores=counts.unsqueeze(1),
    )


def load_counter(counter: Any, keys: torch.Tensor, counts: torch.Tensor) -> None:
    """Set ``counts`` for ``keys`` in the counter, through its own ``load``."""
    if keys.numel() == 0:
        return
    with tempfile.TemporaryDirectory(prefix="demb-counter-") as tmp:
        key_file, count_file = os.path.join(tmp, "keys"), os.path.join(tmp, "counts")
        keys.cpu().numpy().astype("<i8").tofile(key_file)
        counts.cpu().numpy().astype("<i8").tofile(count_file)
        counter.load(key_file, count_file)
