"""Conformance tests for :class:`~dynamicemb_core.types.Counter` and
:class:`~dynamicemb_core.types.AdmissionStrategy` implementations.

Subclass with a ``Test``-prefixed class and implement the ``make_*`` method. Counters are checked
against an exact dict model; an approximate counter (a sketch) sets ``exact = False`` and is then
held to "never under-counts, and over-counts at most ``max_overcount_fraction`` of the keys" with
the small key sets used here, which a sketch sized by ``make_counter`` must meet.
"""

from __future__ import annotations

import os
import random
from typing import Dict

import pytest
import torch

from dynamicemb_core.config import DynamicEmbInitializerArgs
from dynamicemb_core.types import AdmissionStrategy, Counter, MemoryType

__all__ = ["AdmissionStrategySuite", "CounterSuite"]


class CounterSuite:
    """The behaviour every Counter shares. Override :meth:`make_counter`."""

    device = torch.device("cpu")
    exact = True
    max_overcount_fraction = 0.01

    def make_counter(self, device: torch.device) -> Counter:
        """Return a new, empty counter able to hold a few thousand keys."""
        raise NotImplementedError("subclass CounterSuite and implement make_counter(device)")

    def read(self, counter: Counter, keys: torch.Tensor) -> torch.Tensor:
        """Current counts of ``keys`` without changing them."""
        return counter.add(keys, torch.zeros_like(keys), False).cpu()

    def assert_counts(self, got: torch.Tensor, expected: torch.Tensor) -> None:
        got, expected = got.cpu(), expected.cpu()
        if self.exact:
            assert torch.equal(got, expected), (got, expected)
            return
        assert bool((got >= expected).all()), "an approximate counter must never under-count"
        over = int((got > expected).sum())
        assert over <= self.max_overcount_fraction * max(1, expected.numel()), (
            f"{over} keys over-counted"
        )

    def keys(self, n: int, seed: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(seed)
        return torch.unique(torch.randint(-(2**63), 2**63 - 1, (n,), generator=g)).to(self.device)

    def test_add_returns_int64_counts_on_the_keys_device(self) -> None:
        counter = self.make_counter(self.device)
        keys = self.keys(10, 0)
        out = counter.add(keys, torch.ones_like(keys), True)
        assert out.dtype == torch.int64 and tuple(out.shape) == (keys.numel(),)
        assert out.device.type == self.device.type

    def test_add_in_place_accumulates(self) -> None:
        counter = self.make_counter(self.device)
        keys = self.keys(500, 1)
        first = torch.arange(keys.numel(), device=self.device) % 7 + 1
        self.assert_counts(counter.add(keys, first, True), first)
        second = torch.full_like(keys, 3)
        self.assert_counts(counter.add(keys, second, True), first + 3)
        self.assert_counts(self.read(counter, keys), first + 3)

    def test_add_not_in_place_leaves_counts_unchanged(self) -> None:
        counter = self.make_counter(self.device)
        keys = self.keys(300, 2)
        counter.add(keys, torch.full_like(keys, 2), True)
        self.assert_counts(
            counter.add(keys, torch.full_like(keys, 5), False), torch.full_like(keys, 7)
        )
        self.assert_counts(self.read(counter, keys), torch.full_like(keys, 2))

    def test_new_keys_start_at_their_frequency(self) -> None:
        counter = self.make_counter(self.device)
        keys = self.keys(200, 3)
        freq = torch.arange(keys.numel(), device=self.device)
        self.assert_counts(counter.add(keys, freq, True), freq)

    def test_erase_forgets_only_the_given_keys(self) -> None:
        counter = self.make_counter(self.device)
        keys = self.keys(400, 4)
        counter.add(keys, torch.full_like(keys, 4), True)
        gone, kept = keys[:100], keys[100:]
        counter.erase(gone)
        self.assert_counts(self.read(counter, gone), torch.zeros_like(gone))
        self.assert_counts(self.read(counter, kept), torch.full_like(kept, 4))

    def test_dump_then_load_into_created_counter(self, tmp_path: os.PathLike) -> None:
        counter = self.make_counter(self.device)
        keys = self.keys(300, 5)
        freq = torch.arange(keys.numel(), device=self.device) % 11 + 1
        counter.add(keys, freq, True)
        key_file, count_file = os.path.join(tmp_path, "keys"), os.path.join(tmp_path, "counts")
        counter.dump(key_file, count_file)
        fresh = counter.create(self.device)
        self.assert_counts(self.read(fresh, keys), torch.zeros_like(keys))
        fresh.load(key_file, count_file)
        assert torch.equal(self.read(fresh, keys), self.read(counter, keys))

    def test_create_gives_an_independent_empty_counter(self) -> None:
        counter = self.make_counter(self.device)
        keys = self.keys(50, 6)
        counter.add(keys, torch.ones_like(keys), True)
        other = counter.create(self.device)
        assert type(other) is type(counter)
        other.add(keys, torch.ones_like(keys), True)
        self.assert_counts(self.read(counter, keys), torch.ones_like(keys))

    def test_memory_usage_is_a_nonnegative_int(self) -> None:
        counter = self.make_counter(self.device)
        for mem_type in MemoryType:
            usage = counter.memory_usage(mem_type)
            assert isinstance(usage, int) and usage >= 0

    def test_mismatched_lengths_raise(self) -> None:
        counter = self.make_counter(self.device)
        keys = self.keys(5, 7)
        with pytest.raises((ValueError, TypeError)):
            counter.add(
                keys, torch.ones(keys.numel() + 1, dtype=torch.int64, device=self.device), True
            )

    def test_random_sequence_matches_exact_model(self) -> None:
        counter = self.make_counter(self.device)
        rng = random.Random(99)
        pool = [rng.randrange(-(2**63), 2**63) for _ in range(300)]
        model: Dict[int, int] = {}
        for _ in range(25):
            batch = rng.sample(pool, rng.randrange(1, 60))
            keys = torch.tensor(batch, dtype=torch.int64, device=self.device)
            if rng.random() < 0.2:
                counter.erase(keys)
                for k in batch:
                    model.pop(k, None)
                continue
            freq = [rng.randrange(0, 5) for _ in batch]
            inplace = rng.random() < 0.8
            got = counter.add(keys, torch.tensor(freq, device=self.device), inplace)
            self.assert_counts(
                got, torch.tensor([model.get(k, 0) + f for k, f in zip(batch, freq)])
            )
            if inplace:
                for k, f in zip(batch, freq):
                    model[k] = model.get(k, 0) + f


class AdmissionStrategySuite:
    """The contract every AdmissionStrategy shares. Override :meth:`make_strategy`.

    What a strategy admits is its own business and is tested by its package; this suite checks the
    shape of the answer and the input checks.
    """

    device = torch.device("cpu")

    def make_strategy(self) -> AdmissionStrategy:
        """Return a strategy with representative settings."""
        raise NotImplementedError("subclass AdmissionStrategySuite and implement make_strategy()")

    def test_admit_returns_bool_mask_on_the_keys_device(self) -> None:
        strategy = self.make_strategy()
        keys = torch.arange(1000, dtype=torch.int64, device=self.device)
        mask = strategy.admit(keys, torch.arange(1000, device=self.device) % 10)
        assert mask.dtype == torch.bool and tuple(mask.shape) == (1000,)
        assert mask.device.type == self.device.type

    def test_admit_accepts_an_empty_batch(self) -> None:
        empty = torch.empty(0, dtype=torch.int64, device=self.device)
        assert self.make_strategy().admit(empty, empty).numel() == 0

    def test_mismatched_lengths_raise(self) -> None:
        keys = torch.arange(4, device=self.device)
        with pytest.raises((ValueError, TypeError)):
            self.make_strategy().admit(keys, torch.ones(5, dtype=torch.int64, device=self.device))

    def test_initializer_args_are_none_or_initializer_args(self) -> None:
        args = self.make_strategy().get_initializer_args()
        assert args is None or isinstance(args, DynamicEmbInitializerArgs)
