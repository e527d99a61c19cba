"""Prefetched keys stay pinned in the device cache until the forward that consumes them.

The cache is LFU, which is adversarial here: a key a prefetch just brought in has the lowest count,
so without pins the next prefetch evicts it first (a control run checks that it does). Training
through the pinned cache is compared with the same training on an uncached device table, and pin
counts with a Python model (outstanding prefetched batches holding each key).
"""

from __future__ import annotations

from collections import Counter
from typing import List

import pytest
import torch
from fbgemm_gpu.split_embedding_configs import EmbOptimType

from dynamicemb_core.config import (
    DynamicEmbScoreStrategy,
)
from dynamicemb_core.lookup import BatchedDynamicEmbeddingTables
from dynamicemb_core.storage.table_views import CachedTableView, TableView
from dynamicemb_core.table.hashing import buckets_of_tensor
from dynamicemb_core.testing.compare import assert_same_stored_rows
from dynamicemb_core.types import DynamicEmbError, DynamicEmbWarning
from tests.lookup import oracle

DIM = 4
ROW_BYTES = (DIM + 1) * 4  # EXACT_ROWWISE_ADAGRAD: embedding + one accumulator, float32
CACHE_ROWS = 64
UNIVERSE = 400
no_prefetch_warnings = pytest.mark.filterwarnings("error::dynamicemb_core.types.DynamicEmbWarning")


def _module(device, cached: bool, bucket: int = CACHE_ROWS) -> BatchedDynamicEmbeddingTables:
    extra = dict(caching=True, local_hbm_for_values=CACHE_ROWS * ROW_BYTES) if cached else {}
    opts = oracle.debug_options(
        DIM,
        max_capacity=1024,
        bucket_capacity=bucket,
        score_strategy=DynamicEmbScoreStrategy.LFU,
        **extra,
    )
    return oracle.one_table_module(
        opts, device, EmbOptimType.EXACT_ROWWISE_ADAGRAD, learning_rate=0.1, eps=1e-6
    )


def _pair(device):
    """(cached module, its CachedTableView, uncached reference module)."""
    tiered, plain = _module(device, cached=True), _module(device, cached=False)
    storage = tiered.tables[0]
    assert isinstance(storage, CachedTableView) and storage.capacity(0) == CACHE_ROWS
    assert isinstance(plain.tables[0], TableView)  # the device-only module is grouped
    return tiered, storage, plain


def _batches(device, n: int, size: int = 20) -> List[torch.Tensor]:
    """``n`` batches of ``size`` distinct keys each; batches overlap (keys repeat across them)."""
    g = torch.Generator().manual_seed(7)
    return [torch.randperm(UNIVERSE, generator=g)[:size].to(device) for _ in range(n)]


def _offsets(keys: torch.Tensor) -> torch.Tensor:
    return torch.arange(0, keys.numel() + 1, 4, device=keys.device)


def _step(module, keys, seed: int) -> torch.Tensor:
    out = module(keys, _offsets(keys))
    coeff = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed))
    (out * coeff.to(out.device)).sum().backward()
    return out.detach()


def _in_cache(storage: CachedTableView, keys: torch.Tensor) -> torch.Tensor:
    return storage.cached(keys)


def _scores(storage: CachedTableView, keys: torch.Tensor) -> torch.Tensor:
    """The cache's score words of ``keys`` (the group's hash table holds the cache)."""
    return storage.group.table.find(keys, storage.table_id).scores


def _assert_same_rows(tiered, plain, device) -> None:
    tiered.flush()
    probe = torch.arange(UNIVERSE, device=device)
    assert_same_stored_rows(plain.tables[0], tiered.tables[0], probe)


def _pipeline(device, tiered, storage, plain, batches, check_pins: bool) -> int:
    """Prefetch two batches ahead of each forward; returns prefetched keys missing at forward."""
    outstanding: List[torch.Tensor] = []
    missing = 0

    def prefetch(keys):
        tiered.prefetch(keys, _offsets(keys))
        outstanding.append(keys)

    prefetch(batches[0])
    prefetch(batches[1])
    for i, keys in enumerate(batches):
        if i + 2 < len(batches):
            prefetch(batches[i + 2])
        for held in outstanding:
            missing += int((~_in_cache(storage, held)).sum())
        if check_pins:
            _assert_pin_counts(storage, outstanding, device)
        torch.testing.assert_close(_step(tiered, keys, i), _step(plain, keys, i))
        assert torch.equal(outstanding.pop(0), keys)
        if check_pins:
            _assert_pin_counts(storage, outstanding, device)
    return missing


def _assert_pin_counts(storage: CachedTableView, outstanding, device) -> None:
    model = Counter(k for keys in outstanding for k in keys.tolist())
    probe = torch.arange(UNIVERSE, device=device)
    want = torch.tensor([model[k] for k in range(UNIVERSE)], device=device)
    assert torch.equal(storage.pin_counts(0, probe), want)
    assert storage.pinned(0) == len(model)


@no_prefetch_warnings
def test_prefetched_keys_survive_until_their_forward_and_train_like_a_device_table(device):
    tiered, storage, plain = _pair(device)
    batches = _batches(device, 10)
    assert _pipeline(device, tiered, storage, plain, batches, check_pins=True) == 0
    assert storage.pinned(0) == 0  # every prefetch was consumed: counts back to zero
    assert storage.spills(0) > 0  # the cache was under pressure: keys did leave it
    assert storage.prefetch_skipped(0) == 0
    _assert_same_rows(tiered, plain, device)


def test_without_pins_the_same_pipeline_evicts_prefetched_keys(device):
    """Control: prefetch as a plain acquire (no pins) loses prefetched keys before their forward,
    so the test above would notice if pinning did nothing."""
    tiered, storage, plain = _pair(device)
    cache = storage.group.cache
    cache.add_prefetch = storage.group.unpin  # type: ignore[method-assign]  # pins given back at once
    batches = _batches(device, 10)
    assert _pipeline(device, tiered, storage, plain, batches, check_pins=False) > 0
    _assert_same_rows(tiered, plain, device)  # values stay right (evictions spill), only misses


@no_prefetch_warnings
def test_key_prefetched_twice_stays_pinned_until_both_forwards(device):
    tiered, storage, plain = _pair(device)
    shared = torch.tensor([500], device=device)
    a = torch.cat([torch.arange(0, 11, device=device), shared])
    b = torch.cat([torch.arange(100, 111, device=device), shared])
    c = torch.arange(200, 200 + CACHE_ROWS - b.numel(), device=device)  # fills the cache exactly
    for keys in (a, b):
        tiered.prefetch(keys, _offsets(keys))
    assert storage.pin_counts(0, shared).tolist() == [2]
    only_b = b[:-1]
    b_scores = _scores(storage, only_b)  # LFU counts
    _step(plain, a, 0)
    _step(tiered, a, 0)
    assert storage.pin_counts(0, shared).tolist() == [1]
    assert int(storage.pin_counts(0, a).sum()) == 1
    tiered.prefetch(c, _offsets(c))  # every slot not pinned by b is needed: a's keys must go
    assert not bool(_in_cache(storage, a[:-1]).any())
    assert bool(_in_cache(storage, b).all()) and bool(_in_cache(storage, c).all())
    # riding along in forward(a) and prefetch(c) left b's pinned keys' scores as they were
    assert torch.equal(_scores(storage, only_b), b_scores)
    for i, keys in enumerate((b, c), start=1):
        torch.testing.assert_close(_step(tiered, keys, i), _step(plain, keys, i))
    assert storage.pin_counts(0, shared).tolist() == [0] and storage.pinned(0) == 0
    _assert_same_rows(tiered, plain, device)


@no_prefetch_warnings
def test_a_forward_that_was_not_prefetched_releases_no_pins(device):
    """Its keys overlap an outstanding prefetch's; the pins stay until that batch's own forward,
    and training still matches the uncached table."""
    tiered, storage, plain = _pair(device)
    b = torch.arange(100, 112, device=device)
    x = torch.cat([b[:4], torch.arange(300, 308, device=device)])  # shares 4 keys with b
    tiered.prefetch(b, _offsets(b))
    assert storage.pin_counts(0, b).tolist() == [1] * b.numel()
    for i, keys in enumerate((x, b)):
        if keys is b:
            assert storage.pin_counts(0, b).tolist() == [1] * b.numel()  # x released nothing
        torch.testing.assert_close(_step(tiered, keys, i), _step(plain, keys, i))
    assert storage.pinned(0) == 0  # b's forward consumed b's prefetch
    _assert_same_rows(tiered, plain, device)


def test_a_prefetch_between_a_forward_and_its_backward_cannot_evict_the_forwards_keys(device):
    """forward(a) pins a's slots until its backward; prefetch(b) in between finds only the other
    slots (a 64-row cache, 40 of them a's): a's keys stay cached, the 16 keys of b without room
    are left to b's forward (a warning says so), and the backward updates a's rows where the
    forward read them. Training equals the uncached table's."""
    tiered, storage, plain = _pair(device)
    a = torch.arange(0, 40, device=device)
    b = torch.arange(100, 140, device=device)
    out = tiered(a, _offsets(a))
    want = _step(plain, a, 0)
    torch.testing.assert_close(out.detach(), want)
    with pytest.warns(DynamicEmbWarning, match="16 keys cannot be pinned"):
        tiered.prefetch(b, _offsets(b))
    assert bool(_in_cache(storage, a).all()) and storage.prefetch_skipped(0) == 16
    assert storage.pinned(0) == 24
    coeff = torch.randn(out.shape, generator=torch.Generator().manual_seed(0))
    (out * coeff.to(device)).sum().backward()
    # the backward gave a's pins back: only b's prefetch holds slots now
    assert _pinned_slots(storage) == 24
    torch.testing.assert_close(_step(tiered, b, 1), _step(plain, b, 1))
    assert storage.pinned(0) == 0
    _assert_same_rows(tiered, plain, device)


def _pinned_slots(storage: CachedTableView) -> int:
    return int((storage.group.table.pin_counts(storage.table_id) > 0).sum())


def test_a_forward_without_a_backward_gives_its_pins_back_when_dropped(device):
    """A training forward's slots are pinned by the next placing call (here another forward) and
    stay pinned as long as its autograd graph lives: dropping the output without a backward
    releases them (an abandoned batch cannot block the cache)."""
    tiered, storage, _ = _pair(device)
    a = torch.arange(0, 40, device=device)
    out = tiered(a, _offsets(a))
    assert _pinned_slots(storage) == 0  # held, not pinned: nothing has placed keys since
    x = torch.arange(200, 208, device=device)
    tiered(x, _offsets(x))  # a placing call (its own output dropped at once)
    assert _pinned_slots(storage) == 40
    del out
    assert _pinned_slots(storage) == 0


def _cached_module(device, strict: bool, bucket: int):
    """A cached module (its 64-row cache in buckets of ``bucket``) and its table's view."""
    tiered = _module(device, cached=True, bucket=bucket)
    storage = tiered.tables[0]
    storage.strict_prefetch = strict
    return tiered, storage


def _prefetch(module, keys: torch.Tensor) -> None:
    module.prefetch(keys, torch.tensor([0, keys.numel()], device=keys.device))


def _keys_in_bucket(device, bucket: int, num_buckets: int, count: int) -> torch.Tensor:
    candidates = torch.arange(10_000, device=device)
    return candidates[buckets_of_tensor(candidates, num_buckets) == bucket][:count]


def _snapshot(storage: CachedTableView):
    table, t = storage.group.table, storage.table_id
    res = table.export(t)
    order = torch.argsort(res.keys)
    rows = storage.group.read_rows(t, res.slots)
    return res.keys[order], rows[order], res.scores[order], storage.pinned(0)


def test_strict_prefetch_over_a_bucket_raises_before_writing(device):
    tiered, storage = _cached_module(device, strict=True, bucket=16)  # 4 cache buckets of 16
    keys = _keys_in_bucket(device, 2, 4, 17)
    _prefetch(tiered, keys[:10])
    other = _keys_in_bucket(device, 1, 4, 5)
    _prefetch(tiered, other)  # another bucket: fits
    before = _snapshot(storage)
    with pytest.raises(DynamicEmbError, match=r"table 't'.*bucket 2, which has 16 slots"):
        _prefetch(tiered, keys[7:])  # 10 pinned + 7 new in bucket 2
    after = _snapshot(storage)
    for x, y in zip(before[:3], after[:3]):
        assert torch.equal(x, y)
    assert before[3] == after[3] == 15
    assert storage.backing.size(0) == 0  # nothing spilled or written through
    _prefetch(tiered, keys[7:16])  # exactly full: 16 pinned in bucket 2
    assert bool(_in_cache(storage, keys[:16]).all())
    assert storage.pin_counts(0, keys[7:10]).tolist() == [2, 2, 2]


def test_prefetch_over_the_cache_pins_what_fits_and_warns(device):
    tiered, storage = _cached_module(device, strict=False, bucket=CACHE_ROWS)  # one bucket
    first = torch.arange(0, 50, device=device)
    _prefetch(tiered, first)
    with pytest.warns(DynamicEmbWarning, match=r"3 keys cannot be pinned"):
        _prefetch(tiered, torch.arange(40, 67, device=device))  # 14 new fit, 3 do not
    assert storage.pinned(0) == CACHE_ROWS and storage.prefetch_skipped(0) == 3
    assert storage.pin_counts(0, torch.arange(40, 50, device=device)).tolist() == [2] * 10
    assert storage.pin_counts(0, torch.arange(64, 67, device=device)).tolist() == [0] * 3
    # a forward of keys that found no room is still served (from the host table), never by
    # evicting a pinned key
    late = torch.arange(300, 310, device=device)
    got = tiered(late, torch.tensor([0, late.numel()], device=device))
    want = tiered._new_rows(0, late)[:, :DIM].sum(0, keepdim=True)
    torch.testing.assert_close(got.detach(), want)
    assert bool(_in_cache(storage, first).all())
    assert not bool(_in_cache(storage, late).any())
    tiered.flush()  # writes every cached row back, pinned ones included
    found, rows, _ = storage.backing.find(0, torch.arange(0, 64))
    assert bool(found.all())
    torch.testing.assert_close(rows, tiered._new_rows(0, torch.arange(0, 64, device=device)).cpu())
    storage.release_pins()
    assert storage.pinned(0) == 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here")
@no_prefetch_warnings
def test_prefetch_on_a_side_stream_is_ordered_with_the_forward_stream():
    """TorchRec's prefetch pipeline prefetches on its own stream and passes the forward stream:
    the result equals the same pipeline on one stream (and the uncached twin)."""
    device = torch.device("cuda", torch.cuda.current_device())
    tiered, storage, plain = _pair(device)
    side, forward_stream = torch.cuda.Stream(device), torch.cuda.current_stream(device)
    batches = _batches(device, 10)

    def prefetch(keys):
        with torch.cuda.stream(side):
            tiered.prefetch(keys, _offsets(keys), forward_stream=forward_stream)

    prefetch(batches[0])
    for i, keys in enumerate(batches):
        if i + 1 < len(batches):
            prefetch(batches[i + 1])
        torch.testing.assert_close(_step(tiered, keys, i), _step(plain, keys, i))
    assert storage.pinned(0) == 0
    _assert_same_rows(tiered, plain, device)
