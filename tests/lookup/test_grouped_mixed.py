"""One grouped pass for tables that do not all train alike.

A module's device-resident tables form one group even when some do not train (``training=False``)
or gate new keys behind an admission strategy. Each table must then behave as it does alone: these
tests drive a three-table module (trains / does not train / admits at a threshold) and check every
table against what its own options promise, and against twin single-table modules.
"""

from __future__ import annotations

import pytest
import torch
from fbgemm_gpu.split_embedding_configs import EmbOptimType

from dynamicemb_core.admission import FrequencyAdmissionStrategy, KVCounter
from dynamicemb_core.config import (
    DynamicEmbInitializerArgs,
    DynamicEmbInitializerMode,
    DynamicEmbPoolingMode,
    DynamicEmbTableOptions,
)
from dynamicemb_core.lookup import BatchedDynamicEmbeddingTables
from dynamicemb_core.storage.table_views import CachedTableView, TableView
from tests.lookup import oracle

CONST = DynamicEmbInitializerMode.CONSTANT


def _opts(**kw) -> DynamicEmbTableOptions:
    return DynamicEmbTableOptions(
        dim=4,
        max_capacity=256,
        bucket_capacity=128,
        initializer_args=DynamicEmbInitializerArgs(mode=DynamicEmbInitializerMode.DEBUG),
        **oracle.device_resident(kw),
    )


def _mixed(device, pooling=DynamicEmbPoolingMode.NONE, optimizer=EmbOptimType.EXACT_SGD):
    frozen = _opts(
        training=False,
        eval_initializer_args=DynamicEmbInitializerArgs(mode=CONST, value=-3.0),
    )
    gated = _opts(
        admit_strategy=FrequencyAdmissionStrategy(
            3, DynamicEmbInitializerArgs(mode=CONST, value=0.5)
        ),
        admission_counter=KVCounter(capacity=64, bucket_capacity=16, device=device),
    )
    return BatchedDynamicEmbeddingTables(
        [_opts(), frozen, gated],
        ["plain", "frozen", "gated"],
        [0, 1, 2],
        pooling,
        optimizer,
        device,
        learning_rate=0.1,
    )


def _batch(device, plain, frozen, gated):
    """One bag per feature (sequence output: row i is index i)."""
    keys = torch.tensor(plain + frozen + gated, dtype=torch.int64, device=device)
    lengths = torch.tensor([len(plain), len(frozen), len(gated)])
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)]).to(device)
    return keys, offsets


def test_mixed_tables_share_one_group(device):
    m = _mixed(device)
    assert m._group is not None
    assert [t.table_id for t in m.tables] == [0, 1, 2]
    # the table that does not train holds no optimizer state, the others do (SGD: none either)
    assert m.tables[1].tables[0].row_width == 4


def test_each_table_keeps_its_own_rules_in_one_pass(device):
    m = _mixed(device)
    # seed the frozen table with one stored row
    m.tables[1].insert(
        0,
        torch.tensor([7], device=device),
        torch.full((1, 4), 9.0, device=device),
        torch.zeros((1, 1), dtype=torch.int64, device=device),
    )
    keys, offsets = _batch(device, [1, 2], [7, 8], [5, 5, 9])
    out = m(keys, offsets)
    col = out[:, 0].cpu().tolist()
    assert col[:2] == [1.0, 2.0]  # plain: DEBUG rows, inserted
    assert col[2:4] == [9.0, -3.0]  # frozen: stored row, missing key reads the eval initializer
    assert col[4:] == [0.5, 0.5, 0.5]  # gated: 5 counted twice, 9 once; none admitted
    out.sum().backward()
    assert [t.size(0) for t in m.tables] == [2, 1, 0]
    found, rows, _ = m.tables[0].find(0, torch.tensor([1, 2], device=device))
    assert bool(found.all())
    torch.testing.assert_close(rows[:, 0].cpu(), torch.tensor([1.0 - 0.1, 2.0 - 0.1]))
    _, rows, _ = m.tables[1].find(0, torch.tensor([7], device=device))
    assert rows[0, 0].item() == 9.0  # no update for a table that does not train
    # key 5 reaches the threshold (2 + 2): admitted with the table's initializer, then trained
    out = m(*_batch(device, [1], [8], [5, 5, 9]))
    torch.testing.assert_close(out[:, 0].cpu(), torch.tensor([0.9, -3.0, 5.0, 5.0, 0.5]))
    out.sum().backward()
    assert [t.size(0) for t in m.tables] == [2, 1, 1]
    _, rows, _ = m.tables[2].find(0, torch.tensor([5], device=device))
    torch.testing.assert_close(rows[0, 0].cpu(), torch.tensor(5.0 - 0.2))


def test_eval_forward_of_a_mixed_group_reads_without_inserting(device):
    m = _mixed(device)
    m(*_batch(device, [1], [7], [5, 5, 5])).sum().backward()
    sizes = [t.size(0) for t in m.tables]
    m.eval()
    out = m(*_batch(device, [1, 3], [7], [5, 6]))
    # misses read each table's eval initializer
    torch.testing.assert_close(out[:, 0].cpu(), torch.tensor([0.9, 0.0, -3.0, 5.0 - 0.3, 0.0]))
    assert [t.size(0) for t in m.tables] == sizes


def test_mixed_group_matches_single_table_twins(device):
    """Pooled, ADAM: each table of the mixed module trains exactly as a module of that table alone."""
    adam = EmbOptimType.ADAM
    pooling = DynamicEmbPoolingMode.SUM
    m = _mixed(device, pooling, adam)
    twins = [
        BatchedDynamicEmbeddingTables([opts], ["t"], [0], pooling, adam, device, learning_rate=0.1)
        for opts in _mixed(device, pooling, adam).table_options
    ]
    g = torch.Generator().manual_seed(3)
    for _ in range(6):
        B = 4
        lengths = torch.randint(0, 4, (3 * B,), generator=g)
        keys = torch.randint(0, 12, (int(lengths.sum()),), generator=g)
        offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
        out = m(keys.to(device), offsets.to(device))
        out.square().sum().backward()
        for t, twin in enumerate(twins):
            lo, hi = int(offsets[t * B]), int(offsets[(t + 1) * B])
            sub = offsets[t * B : (t + 1) * B + 1] - lo
            got = twin(keys[lo:hi].to(device), sub.to(device))
            got.square().sum().backward()
            torch.testing.assert_close(out[:, 4 * t : 4 * t + 4], got)
    for t, twin in enumerate(twins):
        assert m.tables[t].size(0) == twin.tables[0].size(0)
        probe = torch.arange(12, device=device)
        f1, r1, _ = m.tables[t].find(0, probe)
        f2, r2, _ = twin.tables[0].find(0, probe)
        assert torch.equal(f1, f2)
        torch.testing.assert_close(r1[f1], r2[f2])


def test_prefetch_places_only_keys_that_train_or_are_admitted(device):
    m = _mixed(device)
    keys, offsets = _batch(device, [1, 2], [7], [5])
    m.prefetch(keys, offsets)
    assert [t.size(0) for t in m.tables] == [2, 0, 0]


def test_device_and_hybrid_tables_share_one_group_and_train_like_device_tables(device):
    """Mixed dims, MEAN pooling, ROWWISE_ADAGRAD, tables growing under load: a group holding one
    device table and two hybrid tables (part of their rows in host memory) matches a group of the
    same tables all in device memory, output by output and row by row."""
    optimizer = EmbOptimType.EXACT_ROWWISE_ADAGRAD
    pooling = DynamicEmbPoolingMode.MEAN
    dims = [4, 8, 6]
    row_bytes = [(d + 1) * 4 for d in dims]  # embedding + one accumulator, float32

    def module(budgets):
        opts = [
            DynamicEmbTableOptions(
                dim=d,
                init_capacity=64,
                max_capacity=1024,
                bucket_capacity=16,
                initializer_args=DynamicEmbInitializerArgs(mode=DynamicEmbInitializerMode.DEBUG),
                **oracle.device_resident({} if b is None else {"local_hbm_for_values": b}),
            )
            for d, b in zip(dims, budgets)
        ]
        return BatchedDynamicEmbeddingTables(
            opts, ["a", "b", "c"], [0, 1, 2, 1], pooling, optimizer, device, learning_rate=0.05
        )

    hybrid = module([None, 48 * row_bytes[1], 16 * row_bytes[2]])
    plain = module([None, None, None])
    assert hybrid._group is not None and plain._group is not None
    assert [t.device_rows(0) for t in hybrid.tables] == [64, 48, 16]
    g = torch.Generator().manual_seed(5)
    B = 8
    for _ in range(8):
        lengths = torch.randint(0, 6, (4 * B,), generator=g)
        keys = torch.randint(0, 400, (int(lengths.sum()),), generator=g).to(device)
        offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)]).to(device)
        want, got = plain(keys, offsets), hybrid(keys, offsets)
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
        coeff = torch.randn(want.shape, generator=g).to(device)
        (want * coeff).sum().backward()
        (got * coeff).sum().backward()
    for t in range(3):
        assert hybrid.tables[t].capacity(0) == plain.tables[t].capacity(0)
        assert hybrid.tables[t].device_rows(0) <= [1024, 48, 16][t]
        probe = torch.arange(400, device=device)
        f1, r1, _ = plain.tables[t].find(0, probe)
        f2, r2, _ = hybrid.tables[t].find(0, probe)
        assert torch.equal(f1, f2)
        torch.testing.assert_close(r2[f2], r1[f1], rtol=1e-6, atol=1e-6)
    assert hybrid.tables[2].capacity(0) > 64  # grew: its rows moved across the device/host split


def _kinds_module(device, pooling, optimizer, kinds, dims):
    """Tables of the given storage kinds ("device", "hybrid", "cached"); features 0..T-1 read
    tables 0..T-1, then feature T reads table 0 again."""
    row_bytes = 3 * max(dims) * 4  # ADAM: embedding + two moments, float32
    extra = {
        "device": {},
        "hybrid": {"local_hbm_for_values": 32 * row_bytes},
        "cached": {"caching": True, "local_hbm_for_values": 64 * row_bytes},
    }
    opts = [
        DynamicEmbTableOptions(
            dim=d,
            init_capacity=64,
            max_capacity=1024,
            bucket_capacity=16,
            initializer_args=DynamicEmbInitializerArgs(mode=DynamicEmbInitializerMode.DEBUG),
            **oracle.device_resident(dict(extra[k])),
        )
        for k, d in zip(kinds, dims)
    ]
    names = [f"t{i}" for i in range(len(kinds))]
    features = list(range(len(kinds))) + [0]
    return BatchedDynamicEmbeddingTables(
        opts, names, features, pooling, optimizer, device, learning_rate=0.05
    )


@pytest.mark.parametrize(
    "pooling,weighted",
    [
        (DynamicEmbPoolingMode.SUM, True),
        (DynamicEmbPoolingMode.MEAN, False),
        (DynamicEmbPoolingMode.NONE, False),
    ],
)
def test_module_with_grouped_and_cached_tables_trains_like_an_all_device_module(
    device, pooling, weighted
):
    """A cached table beside device and hybrid tables: the module splits each batch by feature
    between the group (device + hybrid) and the cached table, and joins the outputs in feature
    order; outputs, weight gradients and stored rows match a module whose tables are all in
    device memory."""
    kinds = ["device", "cached", "hybrid"]
    dims = [4, 6, 5] if pooling is not DynamicEmbPoolingMode.NONE else [4, 4, 4]
    optimizer = EmbOptimType.ADAM
    mixed = _kinds_module(device, pooling, optimizer, kinds, dims)
    plain = _kinds_module(device, pooling, optimizer, ["device"] * 3, dims)
    assert isinstance(mixed.tables[0], TableView) and isinstance(mixed.tables[2], TableView)
    assert isinstance(mixed.tables[1], CachedTableView)
    assert mixed.tables[2].device_rows(0) < mixed.tables[2].capacity(0)
    g = torch.Generator().manual_seed(11)
    B = 6
    for _ in range(6):
        lengths = torch.randint(0, 5, (4 * B,), generator=g)
        n = int(lengths.sum())
        keys = torch.randint(0, 300, (n,), generator=g).to(device)
        offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)]).to(device)
        w = torch.rand(n, generator=g).to(device) if weighted else None
        w1 = None if w is None else w.clone().requires_grad_(True)
        w2 = None if w is None else w.clone().requires_grad_(True)
        want, got = plain(keys, offsets, w1), mixed(keys, offsets, w2)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        coeff = torch.randn(want.shape, generator=g).to(device)
        (want * coeff).sum().backward()
        (got * coeff).sum().backward()
        if weighted:
            torch.testing.assert_close(w2.grad, w1.grad, rtol=1e-5, atol=1e-5)
    assert mixed.step == plain.step == 6
    # the grouped tables count placements as the all-device module does; the cached one counts too
    got, want = mixed.metrics(), plain.metrics()
    assert got["t0"] == want["t0"] and got["t2"] == want["t2"]
    assert got["t1"]["hits"] + got["t1"]["misses"] > 0
    mixed.flush()
    probe = torch.arange(300, device=device)
    for t in range(3):
        f1, r1, _ = plain.tables[t].find(0, probe)
        f2, r2, _ = mixed.tables[t].find(0, probe)
        assert torch.equal(f1, f2)
        torch.testing.assert_close(r2[f2], r1[f1], rtol=1e-5, atol=1e-5)
    # a prefetch places each kind's keys (one key in the first bag of each feature)
    keys = torch.tensor([1000, 1001, 1002, 1003], device=device)
    lengths = torch.zeros(4 * B, dtype=torch.int64)
    lengths[::B] = 1
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)]).to(device)
    mixed.prefetch(keys, offsets)
    assert bool(mixed.tables[0].find(0, keys[[0, 3]])[0].all())
    assert bool(mixed.tables[1].cached(keys[1:2]).all())
    assert bool(mixed.tables[2].find(0, keys[2:3])[0].all())
