"""Bad input is rejected with a clear error before anything is written.

Each case snapshots the whole table (state tensors, value rows, growth) first and checks it is
unchanged after the error, both through the Python class and straight through the ops.
"""

from __future__ import annotations

from typing import List

import pytest
import torch

from dynamicemb_core.config import DynamicEmbScoreStrategy as S
from dynamicemb_core.ops import table_ops
from dynamicemb_core.table import ScoredHashTable, TableSpec


def lfu_score(scores, cur_timestamp):
    return 1.0 * scores[0]


def _table(device: torch.device) -> ScoredHashTable:
    specs = [
        TableSpec("user", row_width=2, init_capacity=16, max_capacity=64, bucket_capacity=16),
        TableSpec(
            "item",
            row_width=2,
            init_capacity=32,
            max_capacity=32,
            bucket_capacity=16,
            score_strategy=(S.TIMESTAMP, S.LFU),
        ),
    ]
    table = ScoredHashTable(specs, device)
    keys = torch.arange(6, device=device)
    table.insert(
        keys,
        0,
        rows=torch.ones(6, 2, device=device),
        scores=torch.ones(6, 1, dtype=torch.int64, device=device),
    )
    return table


def _snapshot(table: ScoredHashTable) -> List[torch.Tensor]:
    return [t.clone() for t in table.state] + [
        table.values(t).clone() for t in range(table.num_tables)
    ]


def _assert_unchanged(table: ScoredHashTable, before: List[torch.Tensor]) -> None:
    after = _snapshot(table)
    assert len(after) == len(before)
    for a, b in zip(after, before):
        assert torch.equal(a, b)


def _i64(values, device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64, device=device)


CASES = {
    # name: (call, exception, message fragment)
    "keys_int32": (
        lambda t, d: t.insert(torch.arange(3, dtype=torch.int32, device=d), 0),
        TypeError,
        "table 'user': keys must be int64 on",
    ),
    "keys_wrong_device": (
        lambda t, d: t.find_or_insert(torch.arange(3, device="meta"), 0),
        ValueError,
        "keys must be int64 on",
    ),
    "keys_not_tensor": (lambda t, d: t.insert([1, 2], 0), TypeError, "keys must be a torch.Tensor"),
    "table_ids_length": (
        lambda t, d: t.insert_and_evict(_i64([1, 2, 3], d), _i64([0, 1], d)),
        ValueError,
        "table_ids must have 3 entries like keys, got 2",
    ),
    "unknown_table_id": (
        lambda t, d: t.insert(_i64([1, 2], d), _i64([0, 2], d)),
        ValueError,
        "table_ids contains 2, not a table id in [0, 2)",
    ),
    "unknown_table_int": (lambda t, d: t.erase(_i64([1], d), 5), ValueError, "table_ids=5"),
    "rows_shape": (
        lambda t, d: t.insert(_i64([1, 2], d), 0, rows=torch.ones(2, 3, device=d)),
        ValueError,
        "rows must be (2, 2)",
    ),
    "rows_dtype": (
        lambda t, d: t.insert(
            _i64([1, 2], d), 0, rows=torch.ones(2, 2, dtype=torch.float64, device=d)
        ),
        TypeError,
        "rows must be torch.float32",
    ),
    "scores_width": (
        lambda t, d: t.insert(_i64([1], d), 1, scores=_i64([[1]], d)),
        ValueError,
        "scores must be (1, 2)",
    ),
    "write_rows_width": (
        lambda t, d: t.write_rows(0, _i64([0], d), torch.ones(1, 5, device=d)),
        ValueError,
        "rows must be (1, 2)",
    ),
    "read_rows_table": (
        lambda t, d: t.read_rows(3, _i64([0], d)),
        ValueError,
        "table_id must be an int in [0, 2)",
    ),
    "set_score_wrong_policy": (
        lambda t, d: t.set_score(0, 3),
        ValueError,
        "needs a CUSTOMIZED or STEP table",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_call_raises_and_leaves_the_table_unchanged(device: torch.device, case: str) -> None:
    call, exc, fragment = CASES[case]
    table = _table(device)
    before = _snapshot(table)
    with pytest.raises(
        exc, match=fragment.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")
    ):
        call(table, device)
    _assert_unchanged(table, before)


def test_insert_at_with_a_bad_slot_raises_before_writing(device: torch.device) -> None:
    from dynamicemb_core.types import DynamicEmbError

    table = _table(device)
    before = _snapshot(table)
    with pytest.raises(DynamicEmbError, match="key 100 at slot 99"):
        own = table.find(_i64([5], device)).slots.item()  # key 5 may stay where it is
        table.insert_at(0, _i64([5, 100], device), _i64([own, 99], device))
    _assert_unchanged(table, before)
    # distinct=True (the caller checked the batch for duplicates) keeps the kernel's check
    with pytest.raises(DynamicEmbError, match="key 100 at slot 99"):
        table.insert_at(0, _i64([5, 100], device), _i64([own, 99], device), distinct=True)
    _assert_unchanged(table, before)


OP_CASES = {
    "keys_int32": (
        lambda s, d, z: table_ops.insert(
            torch.arange(2, dtype=torch.int32, device=d), z(2), s, z(2), z(2)
        ),
        TypeError,
        "keys must be Long, got Int",
    ),
    "table_id_range": (
        lambda s, d, z: table_ops.find_or_insert(z(2), _i64([0, 7], d), s, z(2), z(2)),
        IndexError,
        "table_ids[1] = 7 is not a table id",
    ),
    "length": (lambda s, d, z: table_ops.erase(z(3), z(2), s), ValueError, "same length"),
    "cur_scores": (
        lambda s, d, z: table_ops.insert_and_evict(z(2), z(2), s, z(2), z(3)),
        ValueError,
        "cur_scores must be (2,)",
    ),
    "input_scores": (
        lambda s, d, z: table_ops.insert(z(2), z(2), s, z(2), z(2), z(2)),
        ValueError,
        "input_scores must be 2-D",
    ),
    "column": (
        lambda s, d, z: table_ops.export_if(s, z(2), 2),
        ValueError,
        "column must be 0 or 1",
    ),
    "gather_slot": (
        lambda s, d, z: table_ops.gather_rows(torch.ones(4, 2, device=d), _i64([4], d)),
        IndexError,
        "slots[0] = 4 is outside [-1, 4)",
    ),
}


@pytest.mark.parametrize("case", sorted(OP_CASES))
def test_bad_op_call_raises_before_writing(device: torch.device, case: str) -> None:
    """The kernels' own checks (TORCH_CHECK_VALUE/TYPE/INDEX) fire before any write."""
    call, exc, fragment = OP_CASES[case]
    table = _table(device)
    before = _snapshot(table)

    def zeros(n: int) -> torch.Tensor:
        return torch.zeros(n, dtype=torch.int64, device=device)

    with pytest.raises(
        exc, match=fragment.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")
    ):
        call(table.state, device, zeros)
    _assert_unchanged(table, before)


def test_unchecked_op_call_skips_bad_ids_on_cuda_and_still_raises_on_cpu(
    device: torch.device,
) -> None:
    """``check=False`` drops only the device-synchronising data check: on CUDA a table id outside
    [0, T) is a missing key that is never placed and a slot outside [-1, capacity) reads as zeros;
    the CPU kernels check always. Either way the table is unchanged."""
    table = _table(device)
    before = _snapshot(table)
    zeros = torch.zeros(1, dtype=torch.int64, device=device)
    values = torch.ones(4, 2, device=device)
    if device.type == "cpu":
        with pytest.raises(IndexError, match="is not a table id"):
            table_ops.find_or_insert(
                zeros, _i64([7], device), table.state, zeros.repeat(2), zeros.repeat(2), check=False
            )
        with pytest.raises(IndexError, match="is outside"):
            table_ops.gather_rows(values, _i64([4], device), check=False)
    else:
        slots, is_new = table_ops.find_or_insert(
            zeros, _i64([7], device), table.state, zeros.repeat(2), zeros.repeat(2), check=False
        )
        assert slots.tolist() == [-1] and is_new.tolist() == [False]
        rows = table_ops.gather_rows(values, _i64([4, 0], device), check=False)
        assert rows.tolist() == [[0.0, 0.0], [1.0, 1.0]]
    _assert_unchanged(table, before)


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        (
            {"bucket_capacity": 24},
            "bucket_capacity must be a positive multiple of BUCKET_ALIGNMENT (16)",
        ),
        (
            {"init_capacity": 128, "max_capacity": 64},
            "init_capacity (128) must not exceed max_capacity (64)",
        ),
        (
            {"score_strategy": S.LFU, "score_function": lfu_score},
            "score_function is only supported with the compound",
        ),
        ({"max_load_factor": 0.0}, "max_load_factor must be in (0, 1]"),
        ({"row_width": -1}, "row_width must be >= 0"),
        ({"score_strategy": (S.STEP, S.LFU)}, "only single strategies or the compound"),
    ],
)
def test_bad_spec_names_the_table_and_field(kwargs: dict, fragment: str) -> None:
    with pytest.raises(ValueError) as info:
        TableSpec("emb_t", **kwargs)
    assert "table 'emb_t'" in str(info.value) and fragment in str(info.value)


def test_duplicate_table_names_are_rejected() -> None:
    with pytest.raises(ValueError, match="names must be unique"):
        ScoredHashTable([TableSpec("a"), TableSpec("a")])


def test_customized_score_going_down_warns_and_still_applies(device: torch.device) -> None:
    from dynamicemb_core.types import DynamicEmbWarning

    table = ScoredHashTable(
        [
            TableSpec(
                "c",
                score_strategy=S.CUSTOMIZED,
                bucket_capacity=16,
                init_capacity=16,
                max_capacity=16,
            )
        ],
        device,
    )
    table.set_score(0, 5)
    with pytest.warns(DynamicEmbWarning, match="table 'c': CUSTOMIZED score goes down from 5 to 4"):
        table.set_score(0, 4)
    assert table.get_score(0) == 4
