"""One grouped pass for tables that do not all train alike.

A module's device-resident tables form one group even when some do not train (``training=False``)
or gate new keys behind an admission strategy. Each table must then behave as it does alone: these
tests drive a three-table module (trains / does not train / admits at a threshold) and check every
table against what its own options promise, and against twin single-table modules.
"""

from __future__ import annotations

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
