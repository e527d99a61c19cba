"""The stored-row byte layout shared by the Redis and RocksDB plugins."""

from __future__ import annotations

import struct

import pytest
import torch

from dynamicemb_core.plugins.row_codec import (
    DTYPE_CODES,
    HEADER_BYTES,
    ROW_FORMAT_VERSION,
    RowCodec,
    RowFormatError,
    decode_keys,
    encode_keys,
)
from dynamicemb_core.testing.storage_suite import bits, make_rows
from dynamicemb_core.types import StorageTableSpec


@pytest.mark.parametrize("dtype", list(DTYPE_CODES), ids=str)
@pytest.mark.parametrize("num_scores", [1, 2])
def test_encode_then_decode_is_bitwise_identity(dtype: torch.dtype, num_scores: int) -> None:
    spec = StorageTableSpec("t", dim=3, row_width=7, dtype=dtype, num_scores=num_scores)
    codec = RowCodec(spec)
    rows, scores = make_rows(spec, 50, seed=0)
    values = codec.encode(rows, scores)
    assert len(values) == 50 and all(len(v) == codec.value_bytes for v in values)
    found, got_rows, got_scores = codec.decode(values)
    assert (
        found.all() and torch.equal(bits(got_rows), bits(rows)) and torch.equal(got_scores, scores)
    )


def test_layout_matches_the_documented_bytes() -> None:
    spec = StorageTableSpec("t", dim=2, row_width=3, dtype=torch.float16, num_scores=2)
    rows = torch.tensor([[1.0, -2.0, 0.5]], dtype=torch.float16)
    scores = torch.tensor([[-5, 2**40]])
    (value,) = RowCodec(spec).encode(rows, scores)
    expected = struct.pack("<BBBBI", ROW_FORMAT_VERSION, 2, 2, 0, 3) + struct.pack("<qq", -5, 2**40)
    expected += struct.pack("<eee", 1.0, -2.0, 0.5)
    assert value == expected and HEADER_BYTES == 8


def test_missing_values_decode_as_not_found_with_zero_rows() -> None:
    spec = StorageTableSpec("t", dim=2, row_width=2)
    codec = RowCodec(spec)
    rows, scores = make_rows(spec, 3, seed=1)
    values = codec.encode(rows, scores)
    found, got_rows, got_scores = codec.decode([values[0], None, values[2]])
    assert found.tolist() == [True, False, True]
    assert (
        torch.equal(bits(got_rows[2]), bits(rows[2]))
        and not got_rows[1].any()
        and not got_scores[1].any()
    )
    found, got_rows, _ = codec.decode([None, None])
    assert not found.any() and tuple(got_rows.shape) == (2, 2)


@pytest.mark.parametrize(
    "writer",
    [
        StorageTableSpec("t", dim=2, row_width=6),  # another width (e.g. another optimizer)
        StorageTableSpec("t", dim=2, row_width=4, dtype=torch.float16, num_scores=1),
        StorageTableSpec("t", dim=2, row_width=4, num_scores=2),  # compound strategy
    ],
    ids=["width", "dtype", "num_scores"],
)
def test_reader_refuses_rows_of_another_layout_naming_the_key(writer: StorageTableSpec) -> None:
    reader = RowCodec(StorageTableSpec("t", dim=2, row_width=4), context="my table")
    rows, scores = make_rows(writer, 2, seed=2)
    values = RowCodec(writer).encode(rows, scores)
    with pytest.raises(
        RowFormatError,
        match=r"my table key 11: .*this reader expects version 1, dtype torch.float32, num_scores 1, row_width 4",
    ):
        reader.decode([None, values[1]], torch.tensor([10, 11]))


def test_same_length_but_another_version_is_refused() -> None:
    spec = StorageTableSpec("t", dim=2, row_width=4)
    codec = RowCodec(spec)
    (value,) = codec.encode(*make_rows(spec, 1, seed=3))
    with pytest.raises(RowFormatError, match="stored header differs .*version 9"):
        codec.decode([bytes([9]) + value[1:]])


def test_keys_round_trip_with_and_without_prefix() -> None:
    keys = torch.tensor([-(2**63), -1, 0, 1, 2**63 - 1])
    raw = encode_keys(keys)
    assert raw[1] == b"\xff" * 8 and raw[3] == b"\x01" + b"\x00" * 7
    assert torch.equal(decode_keys(raw), keys)
    prefixed = encode_keys(keys, b"tbl\x00")
    assert all(k.startswith(b"tbl\x00") and len(k) == 12 for k in prefixed)
    assert torch.equal(decode_keys(prefixed, 4), keys)
    assert encode_keys(torch.empty(0, dtype=torch.int64)) == [] and decode_keys([]).numel() == 0


def test_unsupported_dtype_is_rejected_naming_the_table() -> None:
    with pytest.raises(TypeError, match="table 'ints': dtype torch.int32 has no stored-row code"):
        RowCodec(StorageTableSpec("ints", dim=2, row_width=2, dtype=torch.int32))
