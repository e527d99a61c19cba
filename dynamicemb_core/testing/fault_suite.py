"""Fault-injection suite: training through a cache over a store that fails, checked against a twin.

A tiered module (a device cache over a :class:`~dynamicemb_core.testing.faults.FaultyStorage`, or
the store used directly) and a *twin* (the same table as one plain device table, no faults) see the
same batches. The oracle:

- a step during which the store fails raises :class:`~dynamicemb_core.storage.StorageTierError`;
- after it, with the store back, every key the twin held before the step reads either its value from
  before the step or (only where the store may have taken the write, ``when="after"``) its value
  after it; no key the twin held is missing; a key the twin did not hold is absent or reads its
  initial row. With ``when="before"`` (the store refused the call) only the before value is allowed
  for rows the step had not yet acknowledged: a failed forward changes nothing, a failed backward
  leaves the forward's placement (new keys with their initial rows) and no update;
- the twin then adopts the tiered module's rows, and training goes on: every later forward matches
  the twin exactly, and after a final ``flush`` both hold the same keys and rows.

Subclass :class:`FaultInjectionSuite` with a ``Test``-prefixed class and implement
:meth:`~FaultInjectionSuite.inner_storage` (the storage to wrap, fresh and empty); override
:meth:`~FaultInjectionSuite.build` for another stack. The helpers (:func:`train_with_faults`,
:func:`check_failed_step`) serve tests with a real outage (a killed Redis server) too.
"""

from __future__ import annotations

import os
import tempfile
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, List, Optional, Tuple, Type

import pytest
import torch

from dynamicemb_core.config import (
    DynamicEmbInitializerArgs,
    DynamicEmbInitializerMode,
    DynamicEmbPoolingMode,
    DynamicEmbTableOptions,
)
from dynamicemb_core.storage import StorageTierError
from dynamicemb_core.testing.compare import assert_same_stored_rows
from dynamicemb_core.testing.faults import FaultyStorage
from dynamicemb_core.types import DynamicEmbWarning, Storage, StorageTableSpec

__all__ = [
    "DIM",
    "FaultInjectionSuite",
    "NUM_KEYS",
    "ROW_BYTES",
    "StepLog",
    "batches",
    "check_failed_step",
    "make_module",
    "table_spec",
    "train_with_faults",
]

DIM = 4
ROW_BYTES = (DIM + 1) * 4  # float32 embedding + one row-wise Adagrad accumulator
NUM_KEYS = 300
CAPACITY = 1024  # the last tier never evicts: every difference is the fault's


def table_spec(name: str = "t") -> StorageTableSpec:
    """The stored-row layout of the suite's table (what an external store must hold)."""
    return StorageTableSpec(name=name, dim=DIM, row_width=DIM + 1, capacity=CAPACITY)


def make_module(device: torch.device, **options: Any) -> Any:
    """One-table module (row-wise Adagrad, DEBUG initializer: a row is a function of its key)."""
    from fbgemm_gpu.split_embedding_configs import EmbOptimType

    from dynamicemb_core.lookup import BatchedDynamicEmbeddingTables

    options.setdefault("max_capacity", CAPACITY)
    options.setdefault("bucket_capacity", 16)
    opts = DynamicEmbTableOptions(
        dim=DIM,
        initializer_args=DynamicEmbInitializerArgs(mode=DynamicEmbInitializerMode.DEBUG),
        **options,
    )
    return BatchedDynamicEmbeddingTables(
        [opts],
        ["t"],
        [0],
        DynamicEmbPoolingMode.SUM,
        EmbOptimType.EXACT_ROWWISE_ADAGRAD,
        device,
        learning_rate=0.1,
        eps=1e-6,
    )


def batches(device: torch.device, n: int, seed: int = 0) -> Iterator[Tuple[torch.Tensor, ...]]:
    """``n`` batches of 40 bags x 4 keys from ``NUM_KEYS`` keys, with gradient coefficients."""
    g = torch.Generator().manual_seed(seed)
    for _ in range(n):
        keys = torch.randint(0, NUM_KEYS, (160,), generator=g)
        coeff = torch.randn(40, DIM, generator=g)
        yield keys.to(device), torch.arange(0, 161, 4).to(device), coeff.to(device)


def _rows(module: Any, keys: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    found, rows, _ = module.tables[0].find(0, keys)
    return found.cpu(), rows.cpu().to(torch.float32)


def check_failed_step(
    tiered: Any,
    before: Tuple[torch.Tensor, torch.Tensor],
    after: Optional[Tuple[torch.Tensor, torch.Tensor]],
    initial: torch.Tensor,
    keys: torch.Tensor,
) -> None:
    """Every key reads its value from before the failed step, or from ``after`` when given.

    Args:
        tiered: the module that failed (its store must answer again).
        before: ``(found, rows)`` of the twin before the step.
        after: the twin's after the step, or None when only ``before`` is allowed.
        initial: (n, row_width) initial rows of ``keys`` (allowed for keys not held before).
        keys: every key the batches use.
    """
    found, rows = _rows(tiered, keys)
    b_found, b_rows = before
    lost = b_found & ~found
    assert not bool(lost.any()), f"acknowledged keys lost after a failed step: {keys[lost][:10]}"

    def same(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.isclose(a, b, rtol=1e-6, atol=1e-6).all(dim=1)

    ok = same(rows, b_rows) & b_found
    ok |= ~b_found & (~found | same(rows, initial))
    if after is not None:
        a_found, a_rows = after
        ok |= a_found & found & same(rows, a_rows)
    ok |= ~found & ~b_found
    bad = (~ok).nonzero().squeeze(1)
    assert bad.numel() == 0, (
        f"{bad.numel()} keys read a row that is neither their acknowledged value nor (where "
        f"allowed) the failed step's: keys {keys[bad][:10].tolist()}"
    )


def _adopt(twin: Any, tiered: Any, keys: torch.Tensor) -> None:
    """Make the twin hold what the tiered module holds (after a checked failed step)."""
    found, rows = _rows(tiered, keys)
    store = twin.tables[0]
    held = keys[found].to(twin.device)
    if held.numel():
        scores = torch.zeros(held.numel(), store.tables[0].num_scores, dtype=torch.int64)
        store.insert(0, held, rows[found].to(twin.device), scores.to(twin.device))
    gone = keys[~found].to(twin.device)
    if gone.numel():
        store.erase(0, gone)


@dataclass
class StepLog:
    """What :func:`train_with_faults` saw: ``failed[i]`` is the error of step i, or None."""

    failed: List[Optional[BaseException]] = field(default_factory=list)

    @property
    def failures(self) -> int:
        return sum(e is not None for e in self.failed)


def train_with_faults(
    tiered: Any,
    twin: Any,
    steps: int,
    *,
    recover: Callable[[], None],
    before_step: Optional[Callable[[int], None]] = None,
    allow_after: bool = False,
    prefetch: bool = False,
    error_type: Type[BaseException] = Exception,
    seed: int = 0,
) -> StepLog:
    """Train both modules ``steps`` steps; check and resynchronize after each failed one.

    Args:
        recover: brings the store back (called after a failed step, before checking).
        before_step: called with the step number before each step (arm a fault, kill a server).
        allow_after: the store may have applied a write it then reported failed (``when="after"``,
            a killed server): the step's after-value is allowed too.
        prefetch: prefetch each batch before its forward (prefetch placements fail too).
        error_type: what a failed step must raise.
    """
    device = twin.device
    log = StepLog()
    keys_all = torch.arange(NUM_KEYS, device=device)
    initial = twin._new_rows(0, keys_all).cpu()
    for step, (keys, offsets, coeff) in enumerate(batches(device, steps, seed)):
        if before_step is not None:
            before_step(step)
        before = _rows(twin, keys_all)
        try:
            if prefetch:
                tiered.prefetch(keys, offsets)
            got = tiered(keys, offsets)
            (got * coeff).sum().backward()
        except error_type as exc:
            log.failed.append(exc)
            recover()
            for tier in tiered.tables:  # a user abandons the failed batch's prefetch
                getattr(tier, "release_pins", lambda: None)()
            after = None
            if allow_after:
                want = twin(keys, offsets)
                (want * coeff).sum().backward()
                after = _rows(twin, keys_all)
            # phase "backward": the forward's placement stands (new keys with their initial
            # rows), its update must not; "forward": nothing but initial rows of new keys.
            check_failed_step(tiered, before, after, initial, keys_all)
            _adopt(twin, tiered, keys_all)
            continue
        log.failed.append(None)
        want = twin(keys, offsets)
        torch.testing.assert_close(got.detach(), want.detach(), rtol=1e-5, atol=1e-5)
        (want * coeff).sum().backward()
    recover()
    tiered.flush()
    assert_same_stored_rows(twin.tables[0], tiered.tables[0], keys_all)
    return log


class FaultInjectionSuite:
    """A device cache over ``FaultyStorage(inner_storage())`` (and the store used directly).

    Class attributes:
        cache_rows: rows of the device cache (0: the store is used directly, no cache).
        device: where the modules live.
    """

    cache_rows = 64
    device = torch.device("cpu")

    def inner_storage(self, spec: StorageTableSpec) -> Storage:
        """A fresh, empty storage holding ``spec``."""
        raise NotImplementedError("subclass FaultInjectionSuite and implement inner_storage()")

    def build(self, cache_rows: Optional[int] = None) -> Tuple[Any, FaultyStorage]:
        """``(tiered module, the FaultyStorage its cache writes to)``."""
        rows = self.cache_rows if cache_rows is None else cache_rows
        store = FaultyStorage(self.inner_storage(table_spec()))
        module = make_module(
            self.device, external_storage=store, local_hbm_for_values=rows * ROW_BYTES
        )
        return module, store

    def twin(self) -> Any:
        return make_module(self.device)

    # ---- the tests -------------------------------------------------------------------------------
    def test_each_nth_find_or_insert_failure_is_atomic(self) -> None:
        for method in ("find", "insert"):
            for nth in (1, 2, 3, 4, 5):
                tiered, store = self.build()

                def arm(step: int, s: FaultyStorage = store, m: str = method, n: int = nth) -> None:
                    if step == 2:  # two clean steps first: the cache is full and spilling
                        s.arm({m: n})

                log = train_with_faults(
                    tiered, self.twin(), 5, recover=store.disarm, before_step=arm
                )
                assert store.injected, f"{method} #{nth}: no call was failed"
                assert log.failures == 1, (method, nth, log.failed)
                self._assert_clear(log)

    def test_random_failures_with_prefetch(self) -> None:
        for seed in (1, 2):
            tiered, store = self.build()

            def arm(step: int, s: FaultyStorage = store, sd: int = seed) -> None:
                s.arm(rate=0.25, seed=sd * 1000 + step)

            with warnings.catch_warnings():
                # a 64-row cache cannot pin a whole batch: the prefetch degrades (and says so)
                warnings.simplefilter("ignore", DynamicEmbWarning)
                log = train_with_faults(
                    tiered, self.twin(), 8, recover=store.disarm, before_step=arm, prefetch=True
                )
            assert log.failures > 0
            self._assert_clear(log)

    def test_lost_acknowledgements_keep_before_or_after_values(self) -> None:
        tiered, store = self.build()

        def arm(step: int) -> None:
            store.arm(rate=0.3, seed=step, when="after")

        log = train_with_faults(
            tiered, self.twin(), 8, recover=store.disarm, before_step=arm, allow_after=True
        )
        assert log.failures > 0
        self._assert_clear(log)

    def test_outage_then_recovery(self) -> None:
        tiered, store = self.build()

        def outage(step: int) -> None:
            if step in (2, 3):
                store.down()

        log = train_with_faults(tiered, self.twin(), 6, recover=store.up, before_step=outage)
        assert [e is not None for e in log.failed] == [False, False, True, True, False, False]
        self._assert_clear(log)

    def test_flush_dump_load_through_a_failing_store(self) -> None:
        tiered, store = self.build()
        twin = self.twin()
        train_with_faults(tiered, twin, 4, recover=store.disarm)
        for keys, offsets, coeff in batches(self.device, 2, seed=9):  # dirty rows in the cache
            (tiered(keys, offsets) * coeff).sum().backward()
            (twin(keys, offsets) * coeff).sum().backward()
        keys_all = torch.arange(NUM_KEYS, device=self.device)
        tier = tiered.tables[0]
        # with a cache, flush first writes the cached rows back (insert), then flushes the store
        fails = [{"flush": 1}] + ([{"insert": 1}] if tier.capacity(0) else [])
        for fail in fails:
            store.arm(fail)
            with pytest.raises(StorageTierError, match="failed to"):
                tiered.flush()
            store.disarm()
            assert_same_stored_rows(twin.tables[0], tier, keys_all)
        with tempfile.TemporaryDirectory() as path:
            snap = os.path.join(path, "snap")
            store.arm({"dump": 1})
            with pytest.raises(StorageTierError, match="failed to dump"):
                tier.dump(snap)
            store.disarm()
            tier.dump(snap)  # the store is back: the same call works
            assert_same_stored_rows(twin.tables[0], tier, keys_all)
            store.arm({"load": 1})
            with pytest.raises(StorageTierError, match="failed to load"):
                tier.load(snap)
            store.disarm()  # the cache kept its rows: nothing acknowledged is lost
            assert_same_stored_rows(twin.tables[0], tier, keys_all)
            tier.load(snap)
            assert_same_stored_rows(twin.tables[0], tier, keys_all)

    def test_storage_insert_and_erase_through_a_failing_store(self) -> None:
        tiered, store = self.build()
        twin = self.twin()
        train_with_faults(tiered, twin, 3, recover=store.disarm)
        tier = tiered.tables[0]
        keys_all = torch.arange(NUM_KEYS, device=self.device)
        found, _, _ = tier.find(0, keys_all)
        held = keys_all[found][:20]
        spec = tier.tables[0]
        rows = torch.full((held.numel(), spec.row_width), 7.0, device=self.device)
        scores = torch.zeros(held.numel(), spec.num_scores, dtype=torch.int64)
        for method, call in (
            ("insert", lambda: tier.insert(0, held, rows, scores)),
            ("erase", lambda: tier.erase(0, held)),
        ):
            store.arm({method: 1})
            with pytest.raises(StorageTierError, match="failed to"):
                call()
            store.disarm()
            assert_same_stored_rows(twin.tables[0], tier, keys_all)

    @staticmethod
    def _assert_clear(log: StepLog) -> None:
        for exc in log.failed:
            if exc is not None:
                assert isinstance(exc, StorageTierError), repr(exc)
                assert "table 't'" in str(exc) and "failed to" in str(exc), str(exc)
