"""Public enums and the per-table options dataclass, with the seed API's names and values.

Fields that name a plugin (``external_storage``, ``admit_strategy``, ``admission_counter``,
``score_function``) accept either an instance/callable, as NVIDIA's DynamicEmb does, or a registered
name plus a ``*_options`` dict; :func:`dynamicemb_core.plugins.resolve` turns names into objects.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Optional, Tuple, Union

import torch

from dynamicemb_core.types import AdmissionStrategy, Counter, Storage

__all__ = [
    "BUCKET_ALIGNMENT",
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
    "ScoreStrategySpec",
    "normalize_score_strategy",
]

# Bucket widths must be multiples of this many slots: the CUDA probe reads a bucket's digests in
# 16-byte vectors (see csrc/include/dynamicemb/bucket_layout.h).
BUCKET_ALIGNMENT: int = 16
# Sentinel bucket_capacity meaning "one bucket spanning the whole (per-rank) table".
MAX_BUCKET_CAPACITY: int = 2**63 - 1
DEFAULT_INDEX_TYPE: torch.dtype = torch.int64


class DynamicEmbCheckMode(enum.IntEnum):
    """What happens to keys a table could not place (see the seed API)."""

    ERROR = 0  # raise DynamicEmbError naming the table and the count
    WARNING = 1  # warn with counts; unplaced keys read as zeros
    IGNORE = 2  # silent; unplaced keys read as zeros


class DynamicEmbInitializerMode(enum.Enum):
    """How a new embedding row is filled."""

    NORMAL = "normal"
    TRUNCATED_NORMAL = "truncated_normal"
    UNIFORM = "uniform"
    CONSTANT = "constant"
    DEBUG = "debug"


@dataclass
class DynamicEmbInitializerArgs:
    """Parameters of an initializer; ``lower``/``upper`` left None are completed by the planner."""

    mode: DynamicEmbInitializerMode = DynamicEmbInitializerMode.UNIFORM
    mean: float = 0.0
    std_dev: float = 1.0
    lower: Optional[float] = None
    upper: Optional[float] = None
    value: float = 0.0


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


class EvictedItemMode(enum.Enum):
    """What the last storage tier does with a key it evicts."""

    DISCARD = "discard"  # drop it; costs nothing
    RETAIN_KEY = "retain_key"  # remember (key, table) for pop_evicted_keys


ScoreStrategySpec = Union[DynamicEmbScoreStrategy, Tuple[DynamicEmbScoreStrategy, ...]]

_COMPOUND = frozenset({DynamicEmbScoreStrategy.TIMESTAMP, DynamicEmbScoreStrategy.LFU})


def normalize_score_strategy(
    strategy: ScoreStrategySpec,
) -> Tuple[DynamicEmbScoreStrategy, ...]:
    """Return the strategy as a validated tuple: ``(X,)`` for a single one, or the compound pair.

    Raises:
        ValueError: for an unknown member or an unsupported combination.
    """
    if isinstance(strategy, (tuple, list)):
        items = tuple(DynamicEmbScoreStrategy(s) for s in strategy)
    else:
        items = (DynamicEmbScoreStrategy(strategy),)
    if len(items) == 1:
        return items
    if len(items) == 2 and frozenset(items) == _COMPOUND:
        return items
    raise ValueError(
        f"score_strategy: only single strategies or the compound (TIMESTAMP, LFU) in either order "
        f"are supported, got {tuple(s.name for s in items)}"
    )


@dataclass
class DynamicEmbTableOptions:
    """Per-table configuration; field names, order and defaults follow the seed API.

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
    score_strategy: ScoreStrategySpec = DynamicEmbScoreStrategy.TIMESTAMP
    score_function: Union[Callable[..., float], str, None] = None
    bucket_capacity: int = 128
    safe_check_mode: DynamicEmbCheckMode = DynamicEmbCheckMode.IGNORE
    global_hbm_for_values: int = 0  # bytes
    external_storage: Union[Storage, str, type, None] = None
    index_type: Optional[torch.dtype] = None
    # row-wise key -> rank routing: "continuous", "roundrobin" or "hash_roundrobin"; validated by
    # the planner (dynamicemb_core.shard.ownership holds the one definition of each)
    dist_type: str = "roundrobin"
    admit_strategy: Union[AdmissionStrategy, str, None] = None
    admission_counter: Union[Counter, str, None] = None
    evicted_item_mode: EvictedItemMode = EvictedItemMode.DISCARD
    external_storage_options: Dict[str, Any] = field(default_factory=dict)
    admit_strategy_options: Dict[str, Any] = field(default_factory=dict)
    admission_counter_options: Dict[str, Any] = field(default_factory=dict)
    score_function_options: Dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Check field values that do not depend on sharding; raise ValueError naming the field."""
        strategy = normalize_score_strategy(self.score_strategy)
        if self.score_function is not None and len(strategy) != 2:
            raise ValueError(
                "score_function is only supported with the compound score_strategy "
                "(TIMESTAMP, LFU) in either order; got score_strategy="
                f"{tuple(s.name for s in strategy)}"
            )
        cap = self.bucket_capacity
        if cap != MAX_BUCKET_CAPACITY and (cap <= 0 or cap % BUCKET_ALIGNMENT != 0):
            raise ValueError(
                f"bucket_capacity must be a positive multiple of BUCKET_ALIGNMENT "
                f"({BUCKET_ALIGNMENT}) or MAX_BUCKET_CAPACITY, got {cap}"
            )
        if not (0.0 < self.max_load_factor <= 1.0):
            raise ValueError(f"max_load_factor must be in (0, 1], got {self.max_load_factor}")
        if (
            self.init_capacity is not None
            and self.max_capacity is not None
            and self.init_capacity > self.max_capacity
        ):
            raise ValueError(
                f"init_capacity ({self.init_capacity}) must not exceed max_capacity "
                f"({self.max_capacity})"
            )
        for name in ("init_capacity", "max_capacity", "dim"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"{name} must be positive, got {value}")
        if self.index_type is not None and self.index_type != torch.int64:
            raise ValueError(f"index_type must be torch.int64, got {self.index_type}")

    @property
    def score_strategies(self) -> Tuple[DynamicEmbScoreStrategy, ...]:
        """The strategy as a tuple in the user's (logical) column order."""
        return normalize_score_strategy(self.score_strategy)

    @property
    def num_scores(self) -> int:
        """Score words kept per key: 2 for the compound strategy, else 1."""
        return len(self.score_strategies)


def ceil_div(a: int, b: int) -> int:
    """Integer ceiling of a / b for positive b."""
    return -(-a // b)


def is_power_of_two(n: int) -> bool:
    """True for 1, 2, 4, ..."""
    return n > 0 and (n & (n - 1)) == 0
