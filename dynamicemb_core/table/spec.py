"""TableSpec: what one logical table of a ScoredHashTable is, and how its layout is derived."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Callable, Optional, Tuple

import torch

from dynamicemb_core.config import (
    BUCKET_ALIGNMENT,
    MAX_BUCKET_CAPACITY,
    DynamicEmbCheckMode,
    DynamicEmbScoreStrategy,
    DynamicEmbTableOptions,
    EvictedItemMode,
    ScoreStrategySpec,
    ceil_div,
    normalize_score_strategy,
)
from dynamicemb_core.types import DynamicEmbWarning

__all__ = ["COMPOUND_POLICY", "TableSpec", "policy_code"]

# Policy code of the compound (TIMESTAMP, LFU) strategy; single strategies use their enum value
# (csrc/include/dynamicemb/score_policy.h).
COMPOUND_POLICY = 5
_NO_EVICTION_POLICY = int(DynamicEmbScoreStrategy.NO_EVICTION)


def policy_code(strategies: Tuple[DynamicEmbScoreStrategy, ...]) -> int:
    """The kernels' policy code of a normalized strategy tuple."""
    return COMPOUND_POLICY if len(strategies) == 2 else int(strategies[0])


@dataclass
class TableSpec:
    """One logical table of a :class:`~dynamicemb_core.table.ScoredHashTable`.

    Attributes:
        name: table name, used in every error message.
        row_width: elements per value row (embedding then optimizer state); 0 keeps keys only.
        dtype: element dtype of the value rows.
        init_capacity: slots at creation, rounded up to a whole number of buckets.
        max_capacity: expansion stops once the capacity reaches this; a NO_EVICTION table
            grows past it while memory allows (``expansion.GrowthGuard``), unless
            ``fixed_capacity``.
        bucket_capacity: slots per bucket, a multiple of BUCKET_ALIGNMENT, or MAX_BUCKET_CAPACITY
            for one bucket spanning the table.
        max_load_factor: an insert that would pass ``size / capacity`` above this doubles the table.
        score_strategy: one strategy, or the compound (TIMESTAMP, LFU) pair in either order.
        score_function: compound strategy only: ``f(scores, cur_timestamp) -> float``.
        safe_check_mode: what happens to keys that could not be placed.
        evicted_item_mode: RETAIN_KEY keeps evicted keys for :meth:`pop_evicted_keys`.
        fixed_capacity: never grow past ``max_capacity``, NO_EVICTION included (a cache tier,
            whose size is its device budget: what it cannot hold goes to the next tier).
    """

    name: str
    row_width: int = 0
    dtype: torch.dtype = torch.float32
    init_capacity: int = 1024
    max_capacity: int = 1024
    bucket_capacity: int = 128
    max_load_factor: float = 0.5
    score_strategy: ScoreStrategySpec = DynamicEmbScoreStrategy.TIMESTAMP
    score_function: Optional[Callable[..., float]] = None
    safe_check_mode: DynamicEmbCheckMode = DynamicEmbCheckMode.IGNORE
    evicted_item_mode: EvictedItemMode = EvictedItemMode.DISCARD
    fixed_capacity: bool = False

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Check every field; raise ValueError/TypeError naming the table and the field."""
        where = f"table {self.name!r}"
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"TableSpec.name must be a non-empty string, got {self.name!r}")
        if not isinstance(self.dtype, torch.dtype):
            raise TypeError(f"{where}: dtype must be a torch.dtype, got {self.dtype!r}")
        if self.row_width < 0:
            raise ValueError(f"{where}: row_width must be >= 0, got {self.row_width}")
        for field_name in ("init_capacity", "max_capacity"):
            value = getattr(self, field_name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"{where}: {field_name} must be a positive int, got {value!r}")
        if self.init_capacity > self.max_capacity:
            raise ValueError(
                f"{where}: init_capacity ({self.init_capacity}) must not exceed max_capacity "
                f"({self.max_capacity})"
            )
        cap = self.bucket_capacity
        if cap != MAX_BUCKET_CAPACITY and (cap <= 0 or cap % BUCKET_ALIGNMENT != 0):
            raise ValueError(
                f"{where}: bucket_capacity must be a positive multiple of BUCKET_ALIGNMENT "
                f"({BUCKET_ALIGNMENT}) or MAX_BUCKET_CAPACITY, got {cap}"
            )
        if not 0.0 < self.max_load_factor <= 1.0:
            raise ValueError(
                f"{where}: max_load_factor must be in (0, 1], got {self.max_load_factor}"
            )
        try:
            strategies = normalize_score_strategy(self.score_strategy)
        except ValueError as err:
            raise ValueError(f"{where}: {err}") from None
        if self.score_function is not None:
            if len(strategies) != 2:
                raise ValueError(
                    f"{where}: score_function is only supported with the compound score_strategy "
                    f"(TIMESTAMP, LFU) in either order; got score_strategy="
                    f"{tuple(s.name for s in strategies)}"
                )
            if not callable(self.score_function):
                raise TypeError(
                    f"{where}: score_function must be callable, got {self.score_function!r}"
                )
        self.safe_check_mode = DynamicEmbCheckMode(self.safe_check_mode)
        self.evicted_item_mode = EvictedItemMode(self.evicted_item_mode)

    # -- derived -----------------------------------------------------------------------------
    @property
    def strategies(self) -> Tuple[DynamicEmbScoreStrategy, ...]:
        """The score strategy as a tuple in the user's column order.

        Read several times per lookup (policy, no_eviction, ...): the normalized tuple is kept
        beside the value it came from, and made again only when ``score_strategy`` changes.
        """
        return self._derived()[1]

    def _derived(self) -> Tuple[Any, Tuple[DynamicEmbScoreStrategy, ...], int]:
        """``(score_strategy, strategies, policy code)``, made again only when ``score_strategy``
        changes (a lookup reads the policy of every table several times)."""
        memo = self.__dict__.get("_strategies_memo")
        if memo is None or memo[0] is not self.score_strategy:
            strategies = normalize_score_strategy(self.score_strategy)
            memo = (self.score_strategy, strategies, policy_code(strategies))
            self.__dict__["_strategies_memo"] = memo
        return memo

    @property
    def policy(self) -> int:
        """The kernels' policy code (score_policy.h)."""
        return self._derived()[2]

    @property
    def num_scores(self) -> int:
        """Score columns the user sees: 2 for the compound strategy, else 1."""
        return len(self.strategies)

    @property
    def timestamp_first(self) -> bool:
        """True for the compound (TIMESTAMP, LFU), whose user columns are [ts, count] (reversed)."""
        return self.strategies == (DynamicEmbScoreStrategy.TIMESTAMP, DynamicEmbScoreStrategy.LFU)

    @property
    def single_bucket(self) -> bool:
        """True for MAX_BUCKET_CAPACITY: one bucket spanning the table, which doubles its width."""
        return self.bucket_capacity == MAX_BUCKET_CAPACITY

    @property
    def no_eviction(self) -> bool:
        return self._derived()[2] == _NO_EVICTION_POLICY

    @property
    def grows_past_max_capacity(self) -> bool:
        """NO_EVICTION tables grow past ``max_capacity`` while memory allows (the seed), except
        a ``fixed_capacity`` one."""
        return self.no_eviction and not self.fixed_capacity

    def initial_layout(self) -> Tuple[int, int]:
        """``(num_buckets, bucket_cap)`` at creation; warns when init_capacity is rounded up."""
        if self.single_bucket:
            return 1, self.init_capacity
        num_buckets = ceil_div(self.init_capacity, self.bucket_capacity)
        capacity = num_buckets * self.bucket_capacity
        if capacity != self.init_capacity:
            warnings.warn(
                f"table {self.name!r}: init_capacity {self.init_capacity} rounded up to {capacity} "
                f"({num_buckets} buckets of {self.bucket_capacity})",
                DynamicEmbWarning,
                stacklevel=3,
            )
        return num_buckets, self.bucket_capacity

    @classmethod
    def from_options(
        cls, name: str, options: DynamicEmbTableOptions, row_width: int
    ) -> "TableSpec":
        """Build a spec from the seed API's per-table options.

        Args:
            name: the table's name.
            options: its DynamicEmbTableOptions; ``max_capacity`` must be set (the planner sets it),
                ``init_capacity`` defaults to it, ``embedding_dtype`` to float32. A
                ``score_function`` must be a function: names resolve above the table, where
                admission strategies do (:func:`dynamicemb_core.plugins.with_score_function`).
            row_width: elements per stored row (embedding dim plus optimizer state).

        Raises:
            ValueError: max_capacity is unset, score_function is a name, or any field is
                invalid.
        """
        if options.max_capacity is None:
            raise ValueError(
                f"table {name!r}: DynamicEmbTableOptions.max_capacity must be set (the planner "
                "sets it from the sharded row count), got None"
            )
        score_function = options.score_function
        if score_function is not None and not callable(score_function):
            raise ValueError(
                f"table {name!r}: score_function {score_function!r} is a registered name; resolve "
                "it first (dynamicemb_core.plugins.with_score_function)"
            )
        init = options.init_capacity if options.init_capacity is not None else options.max_capacity
        return cls(
            name=name,
            row_width=row_width,
            dtype=options.embedding_dtype or torch.float32,
            init_capacity=min(init, options.max_capacity),
            max_capacity=options.max_capacity,
            bucket_capacity=options.bucket_capacity,
            max_load_factor=options.max_load_factor,
            score_strategy=options.score_strategies,
            score_function=score_function,
            safe_check_mode=options.safe_check_mode,
            evicted_item_mode=options.evicted_item_mode,
        )
