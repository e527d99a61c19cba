"""Public enums and the per-table options dataclass, with the seed API's names and values.

Fields that name a plugin (``external_storage``, ``admit_strategy``, ``admission_counter``,
``score_function``) accept either an instance/callable, as NVIDIA's DynamicEmb does, or a registered
name plus a ``*_options`` dict; :func:`dynamicemb_core.plugins.resolve` turns names into objects.
"""

from __future__ import annotations

import enum
import numbers
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Optional, Tuple, Union

import torch

from dynamicemb_core.redaction import redacted_fields_repr, redacted_repr
from dynamicemb_core.types import (  # the seed's constants and initializer types, re-exported
    BUCKET_ALIGNMENT,
    DEMB_TABLE_ALIGN_SIZE,
    MAX_BUCKET_CAPACITY,
    AdmissionStrategy,
    Counter,
    DynamicEmbInitializerArgs,
    DynamicEmbInitializerMode,
    PerTableStorage,
    Storage,
)

__all__ = [
    "BATCH_SIZE_PER_DUMP",
    "BUCKET_ALIGNMENT",
    "DEMB_TABLE_ALIGN_SIZE",
    "DEFAULT_INDEX_TYPE",
    "MAX_BUCKET_CAPACITY",
    "DynamicEmbCheckMode",
    "DynamicEmbEvictStrategy",
    "DynamicEmbInitializerArgs",
    "DynamicEmbInitializerMode",
    "DynamicEmbPoolingMode",
    "DynamicEmbScoreStrategy",
    "DynamicEmbTableOptions",
    "EvictedItemMode",
    "ScoreStrategy",
    "ScoreStrategySpec",
    "align_to_table_size",
    "normalize_score_strategy",
]

# Keys per batch when a table is read out for a dump (the seed's constant).
BATCH_SIZE_PER_DUMP: int = 65536
DEFAULT_INDEX_TYPE: torch.dtype = torch.int64


class DynamicEmbCheckMode(enum.IntEnum):
    """What happens to keys a table could not place (see the seed API)."""

    ERROR = 0  # raise DynamicEmbError naming the table and the count
    WARNING = 1  # warn with counts; unplaced keys read as zeros
    IGNORE = 2  # silent; unplaced keys read as zeros


class DynamicEmbScoreStrategy(enum.IntEnum):
    """How keys are scored; the lowest score in a full bucket is evicted first."""

    TIMESTAMP = 0  # device nanosecond timer at the time of access
    STEP = 1  # the table's step counter, incremented once per forward
    CUSTOMIZED = 2  # a score the user sets with set_score
    LFU = 3  # access count
    NO_EVICTION = 4  # never evict: the table doubles instead


class DynamicEmbEvictStrategy(enum.Enum):
    """Kept for source compatibility with the seed API; eviction follows ``score_strategy``."""

    LRU = "lru"
    LFU = "lfu"
    EPOCH_LRU = "epoch_lru"
    EPOCH_LFU = "epoch_lfu"
    CUSTOMIZED = "customized"


class DynamicEmbPoolingMode(enum.IntEnum):
    """Pooling of a bag: SUM and MEAN give (batch, total_D); NONE gives one row per index."""

    SUM = 0
    MEAN = 1
    NONE = 2


class EvictedItemMode(enum.Flag):
    """What the last storage tier keeps of a key it evicts (or that ``erase`` removes).

    A flag (the replay PR's type), so that further kinds of retention can be combined later without
    changing call sites. ``DISCARD`` is the empty flag: test it with ``not mode``; test a kind of
    retention with ``EvictedItemMode.RETAIN_KEY in mode`` (``in`` is subset containment, so the empty
    ``DISCARD`` is "in" every mode).
    """

    DISCARD = 0  # keep nothing; costs nothing
    RETAIN_KEY = enum.auto()  # remember (key, table) for pop_evicted_keys


ScoreStrategySpec = Union[DynamicEmbScoreStrategy, Tuple[DynamicEmbScoreStrategy, ...]]
# The seed's name for the same type.
ScoreStrategy = ScoreStrategySpec

_COMPOUND = frozenset({DynamicEmbScoreStrategy.TIMESTAMP, DynamicEmbScoreStrategy.LFU})


def _strategy_member(value: object) -> DynamicEmbScoreStrategy:
    if isinstance(value, bool) or not isinstance(value, (DynamicEmbScoreStrategy, int)):
        raise TypeError(
            f"score_strategy: expected a DynamicEmbScoreStrategy (or a tuple of them), got {value!r}"
        )
    try:
        return DynamicEmbScoreStrategy(value)
    except ValueError:
        raise ValueError(
            f"score_strategy: {value!r} is not a DynamicEmbScoreStrategy "
            f"(members: {[m.name for m in DynamicEmbScoreStrategy]})"
        ) from None


def normalize_score_strategy(
    strategy: Optional[ScoreStrategySpec],
) -> Tuple[DynamicEmbScoreStrategy, ...]:
    """Return the strategy as a validated tuple: ``(X,)`` for a single one, or the compound pair.

    ``None`` (which the seed accepts, for options that never build a table) means the default,
    TIMESTAMP.

    Raises:
        TypeError: for something that is not a strategy.
        ValueError: for an unknown member or an unsupported combination.
    """
    if strategy is None:
        return (DynamicEmbScoreStrategy.TIMESTAMP,)
    if isinstance(strategy, (tuple, list)):
        items = tuple(_strategy_member(s) for s in strategy)
    else:
        items = (_strategy_member(strategy),)
    if len(items) == 1:
        return items
    if len(items) == 2 and frozenset(items) == _COMPOUND:
        return items
    raise ValueError(
        f"score_strategy: only single strategies or the compound (TIMESTAMP, LFU) in either order "
        f"are supported, got {tuple(s.name for s in items)}"
    )


_FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)

# The values of ``dist_type`` (how a row-wise sharded table routes a key to a rank); the rule of
# each is dynamicemb_core.table.ownership.owner_rank.
DIST_TYPES: Tuple[str, ...] = ("continuous", "roundrobin", "hash_roundrobin")
DEFAULT_DIST_TYPE: str = "roundrobin"


def validate_dist_type(dist_type: object, table: Optional[str] = None) -> str:
    """Return ``dist_type`` if it is one of :data:`DIST_TYPES`, else raise naming the table.

    Raises:
        ValueError: for any other value.
    """
    if not isinstance(dist_type, str) or dist_type not in DIST_TYPES:
        where = f"table {table!r}: " if table is not None else ""
        raise ValueError(f"{where}dist_type must be one of {list(DIST_TYPES)}, got {dist_type!r}")
    return dist_type


def _is_int(value: object) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_real(value: object) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _check_int(name: str, value: object, *, minimum: int, optional: bool = False) -> None:
    """Raise naming ``name`` unless ``value`` is an int >= ``minimum`` (or None when optional)."""
    if value is None and optional:
        return
    if not _is_int(value):
        kind = "an int or None" if optional else "an int"
        raise TypeError(f"{name} must be {kind}, got {value!r} ({type(value).__name__})")
    if int(value) < minimum:  # type: ignore[call-overload]
        raise ValueError(f"{name} must be >= {minimum}, got {value!r}")


def _check_bool(name: str, value: object) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {value!r} ({type(value).__name__})")


def _enum_member(name: str, enum_type: Any, value: object) -> Any:
    """``value`` as a member of ``enum_type``; an int equal to a member's value is accepted."""
    if isinstance(value, enum_type):
        return value
    if _is_int(value) and issubclass(enum_type, (enum.IntEnum, enum.Flag)):
        try:
            return enum_type(value)
        except ValueError:
            pass
    raise ValueError(
        f"{name} must be one of {[f'{enum_type.__name__}.{m.name}' for m in enum_type]}, "
        f"got {value!r}"
    )


def _check_initializer(name: str, args: object) -> None:
    if not isinstance(args, DynamicEmbInitializerArgs):
        raise TypeError(f"{name} must be a DynamicEmbInitializerArgs, got {args!r}")
    if not isinstance(args.mode, DynamicEmbInitializerMode):
        raise ValueError(f"{name}.mode must be a DynamicEmbInitializerMode, got {args.mode!r}")
    for attr in ("mean", "std_dev", "value"):
        if not _is_real(getattr(args, attr)):
            raise TypeError(f"{name}.{attr} must be a number, got {getattr(args, attr)!r}")
    for attr in ("lower", "upper"):
        bound = getattr(args, attr)
        if bound is not None and not _is_real(bound):
            raise TypeError(f"{name}.{attr} must be a number or None, got {bound!r}")
    if args.std_dev < 0:
        raise ValueError(f"{name}.std_dev must be >= 0, got {args.std_dev}")
    if args.lower is not None and args.upper is not None and args.lower > args.upper:
        raise ValueError(f"{name}: lower ({args.lower}) must not exceed upper ({args.upper})")


def _check_plugin_field(name: str, value: object, contract: Any) -> None:
    """A plugin field holds an instance of its contract(s), a registered name, or None."""
    if value is None or isinstance(value, str) or isinstance(value, contract):
        return
    if name == "external_storage" and isinstance(value, type) and issubclass(value, contract):
        return
    names = contract if isinstance(contract, tuple) else (contract,)
    raise TypeError(
        f"{name} must be a {' or '.join(c.__name__ for c in names)}, a registered plugin name "
        f"(str) or None, got {redacted_repr(value)}"
    )


@dataclass
class DynamicEmbTableOptions:
    """Per-table configuration; field names, order and defaults follow the seed API.

    Every field is checked at construction (type and range); a bad value raises TypeError or
    ValueError naming the field. ``score_strategy`` is normalized: a one-element tuple becomes the
    single strategy, ``None`` is kept (it means the default, TIMESTAMP, wherever a table is built).

    Equality and hashing follow :meth:`get_grouped_key`, as in the seed: two options compare
    equal when their tables may share one kernel group (same storage kind, training mode, score
    layout, routing, admission and eviction retention), whatever their sizes.

    Beyond the seed: ``external_storage``, ``admit_strategy``, ``admission_counter`` and
    ``score_function`` may be registered plugin names, configured by the matching ``*_options``
    dict. Every field: the API reference (docs/reference/, built by ``./dev nox -s docs``).
    """

    embedding_dtype: Optional[torch.dtype] = None
    dim: Optional[int] = None
    max_capacity: Optional[int] = None
    evict_strategy: DynamicEmbEvictStrategy = DynamicEmbEvictStrategy.LRU
    local_hbm_for_values: int = 0  # bytes
    device_id: Optional[int] = None

    training: bool = True
    initializer_args: DynamicEmbInitializerArgs = field(default_factory=DynamicEmbInitializerArgs)
    eval_initializer_args: DynamicEmbInitializerArgs = field(
        default_factory=lambda: DynamicEmbInitializerArgs(
            mode=DynamicEmbInitializerMode.CONSTANT, value=0.0
        )
    )
    caching: bool = False
    init_capacity: Optional[int] = None
    max_load_factor: float = 0.5
    score_strategy: Optional[ScoreStrategySpec] = DynamicEmbScoreStrategy.TIMESTAMP
    score_function: Union[Callable[..., float], str, None] = None
    bucket_capacity: int = 128
    safe_check_mode: DynamicEmbCheckMode = DynamicEmbCheckMode.IGNORE
    global_hbm_for_values: int = 0  # bytes
    external_storage: Union[Storage, PerTableStorage, str, type, None] = None
    index_type: Optional[torch.dtype] = None
    # row-wise key -> rank routing: one of DIST_TYPES
    # (dynamicemb_core.table.ownership holds the one definition of each)
    dist_type: str = DEFAULT_DIST_TYPE
    admit_strategy: Union[AdmissionStrategy, str, None] = None
    admission_counter: Union[Counter, str, None] = None
    evicted_item_mode: EvictedItemMode = EvictedItemMode.DISCARD
    external_storage_options: Dict[str, Any] = field(default_factory=dict)
    admit_strategy_options: Dict[str, Any] = field(default_factory=dict)
    admission_counter_options: Dict[str, Any] = field(default_factory=dict)
    score_function_options: Dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Normalize before validating, so a valid int / one-element tuple is stored canonically.
        self.safe_check_mode = _enum_member(
            "safe_check_mode", DynamicEmbCheckMode, self.safe_check_mode
        )
        self.evicted_item_mode = _enum_member(
            "evicted_item_mode", EvictedItemMode, self.evicted_item_mode
        )
        if isinstance(self.score_strategy, (tuple, list)):
            items = normalize_score_strategy(self.score_strategy)
            self.score_strategy = items[0] if len(items) == 1 else items
        elif self.score_strategy is not None:
            self.score_strategy = normalize_score_strategy(self.score_strategy)[0]
        self.validate()

    def validate(self) -> None:
        """Check every field's type and range; raise TypeError/ValueError naming the field.

        Sizes that depend on sharding (``init_capacity`` above ``max_capacity``, a budget smaller
        than one bucket) are settled by the planner and the table, not refused here.
        """
        if self.embedding_dtype is not None and self.embedding_dtype not in _FLOAT_DTYPES:
            raise ValueError(
                f"embedding_dtype must be one of {list(_FLOAT_DTYPES)} or None, "
                f"got {self.embedding_dtype!r}"
            )
        _check_int("dim", self.dim, minimum=1, optional=True)
        _check_int("max_capacity", self.max_capacity, minimum=1, optional=True)
        _check_int("init_capacity", self.init_capacity, minimum=1, optional=True)
        _enum_member("evict_strategy", DynamicEmbEvictStrategy, self.evict_strategy)
        _check_int("local_hbm_for_values", self.local_hbm_for_values, minimum=0)
        _check_int("global_hbm_for_values", self.global_hbm_for_values, minimum=0)
        _check_int("device_id", self.device_id, minimum=0, optional=True)
        _check_bool("training", self.training)
        _check_bool("caching", self.caching)
        _check_initializer("initializer_args", self.initializer_args)
        _check_initializer("eval_initializer_args", self.eval_initializer_args)
        if self.eval_initializer_args.mode != DynamicEmbInitializerMode.CONSTANT:
            raise ValueError(
                "eval_initializer_args must use DynamicEmbInitializerMode.CONSTANT (a key missing "
                f"in evaluation reads a constant, zeros by default), got "
                f"{self.eval_initializer_args.mode}"
            )
        if not _is_real(self.max_load_factor) or not 0.0 < self.max_load_factor <= 1.0:
            raise ValueError(f"max_load_factor must be in (0, 1], got {self.max_load_factor!r}")
        strategy = normalize_score_strategy(self.score_strategy)
        if self.score_function is not None:
            if not (callable(self.score_function) or isinstance(self.score_function, str)):
                raise TypeError(
                    f"score_function must be callable, a registered name or None, "
                    f"got {self.score_function!r}"
                )
            if len(strategy) != 2:
                raise ValueError(
                    "score_function is only supported with the compound score_strategy "
                    "(TIMESTAMP, LFU) in either order; got score_strategy="
                    f"{tuple(s.name for s in strategy)}"
                )
        cap = self.bucket_capacity
        if not _is_int(cap):
            raise TypeError(f"bucket_capacity must be an int, got {cap!r}")
        if cap != MAX_BUCKET_CAPACITY and (cap <= 0 or cap % BUCKET_ALIGNMENT != 0):
            raise ValueError(
                f"bucket_capacity must be a positive multiple of BUCKET_ALIGNMENT "
                f"({BUCKET_ALIGNMENT}) or MAX_BUCKET_CAPACITY, got {cap}"
            )
        _enum_member("safe_check_mode", DynamicEmbCheckMode, self.safe_check_mode)
        _enum_member("evicted_item_mode", EvictedItemMode, self.evicted_item_mode)
        if self.index_type is not None and self.index_type != torch.int64:
            raise ValueError(f"index_type must be torch.int64 or None, got {self.index_type!r}")
        validate_dist_type(self.dist_type)
        _check_plugin_field("external_storage", self.external_storage, (Storage, PerTableStorage))
        _check_plugin_field("admit_strategy", self.admit_strategy, AdmissionStrategy)
        _check_plugin_field("admission_counter", self.admission_counter, Counter)
        for name in (
            "external_storage_options",
            "admit_strategy_options",
            "admission_counter_options",
            "score_function_options",
        ):
            if not isinstance(getattr(self, name), dict):
                raise TypeError(f"{name} must be a dict, got {redacted_repr(getattr(self, name))}")

    def __repr__(self) -> str:
        """The dataclass repr with secrets hidden (:mod:`dynamicemb_core.redaction`): a password in
        ``external_storage_options`` must not reach logs, tracebacks or the planner's printouts."""
        return redacted_fields_repr(self)

    def get_grouped_key(self) -> Dict[str, Any]:
        """The fields that decide whether two tables may share one kernel group (the seed's rule).

        Tables whose keys are equal can live in one grouped storage and one lookup pass: sizes,
        dims, initializers and budgets may differ per table; the kind of storage, the training
        mode, the embedding dtype (one row buffer per group), the score layout and eviction
        function, the key routing, admission and eviction retention may not.
        """
        return {
            "embedding_dtype": self.embedding_dtype or torch.float32,
            "training": self.training,
            "caching": self.caching,
            "external_storage": self.external_storage,
            "index_type": self.index_type or DEFAULT_INDEX_TYPE,
            "dist_type": self.dist_type,
            "score_strategy": self.score_strategies,
            "score_function": self.score_function,
            "admit_strategy": self.admit_strategy,
            "evicted_item_mode": self.evicted_item_mode,
        }

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, DynamicEmbTableOptions):
            return NotImplemented
        return self.get_grouped_key() == other.get_grouped_key()

    def __hash__(self) -> int:
        return hash(tuple(self.get_grouped_key().items()))

    @property
    def score_strategies(self) -> Tuple[DynamicEmbScoreStrategy, ...]:
        """The strategy as a tuple in the user's (logical) column order."""
        return normalize_score_strategy(self.score_strategy)

    @property
    def num_scores(self) -> int:
        """Score words kept per key: 2 for the compound strategy, else 1."""
        return len(self.score_strategies)


def align_to_table_size(n: int, alignment: int = DEMB_TABLE_ALIGN_SIZE) -> int:
    """Round ``n`` up to a multiple of ``alignment``; a non-positive ``n`` becomes one ``alignment``.

    A table never has zero capacity, so an empty shard still gets one bucket.
    """
    n = int(n)
    if n <= 0:
        return alignment
    return ceil_div(n, alignment) * alignment


def ceil_div(a: int, b: int) -> int:
    """Integer ceiling of a / b for positive b."""
    return -(-a // b)


def is_power_of_two(n: int) -> bool:
    """True for 1, 2, 4, ..."""
    return n > 0 and (n & (n - 1)) == 0
