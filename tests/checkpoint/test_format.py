"""The shard file format and the manifest: round trips, and refusal of every kind of damaged file."""

from __future__ import annotations

import dataclasses
import json
import os

import pytest
import torch

from dynamicemb_core.checkpoint.errors import CheckpointCorruptError, CheckpointMismatchError
from dynamicemb_core.checkpoint.format import (
    ShardHeader,
    ShardPayload,
    check_header,
    read_shard,
    read_shard_header,
    verify_shard,
    write_shard,
)
from dynamicemb_core.checkpoint.manifest import (
    merge_rank_manifests,
    read_manifest,
    remove_manifest,
    write_entry,
    write_rank_manifest,
)


def _shard(
    n: int = 37, dim: int = 5, opt: int = 1, dtype: torch.dtype = torch.float32, scores: int = 2
):
    g = torch.Generator().manual_seed(n * 31 + dim)
    header = ShardHeader(
        table_name="t0",
        collection="model.ec",
        num_rows=n,
        dim=dim,
        optimizer_width=opt,
        dtype=dtype,
        score_columns=("LFU", "TIMESTAMP")[:scores],
        rank=1,
        world_size=2,
        extra={"optimizer": "adagrad"},
    )
    payload = ShardPayload(
        keys=torch.randint(-(2**62), 2**62, (n,), generator=g, dtype=torch.int64),
        embeddings=torch.randn(n, dim, generator=g).to(dtype),
        optimizer_states=torch.rand(n, opt, generator=g).to(dtype),
        scores=torch.randint(0, 2**40, (n, scores), generator=g, dtype=torch.int64),
    )
    return header, payload


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("n,opt,scores", [(37, 1, 2), (0, 0, 1), (1000, 3, 1)])
def test_roundtrip_preserves_every_section_bitwise(tmp_path, dtype, n, opt, scores):
    header, payload = _shard(n=n, opt=opt, dtype=dtype, scores=scores)
    path = str(tmp_path / "s.demb")
    size = write_shard(path, header, payload)
    assert size == os.path.getsize(path)
    got_header, got = read_shard(path)
    assert got_header == header
    assert read_shard_header(path) == header
    assert verify_shard(path, chunk_bytes=7) == header
    for name, tensor in payload.sections():
        out = getattr(got, name)
        assert out.dtype == tensor.dtype and out.shape == tensor.shape
        assert torch.equal(out.view(torch.uint8), tensor.view(torch.uint8))


def test_write_rejects_payload_that_disagrees_with_header(tmp_path):
    header, payload = _shard()
    payload.embeddings = payload.embeddings[:, :4]
    path = str(tmp_path / "s.demb")
    with pytest.raises(ValueError, match="embeddings.*shape"):
        write_shard(path, header, payload)
    assert not os.path.exists(path)
    assert os.listdir(tmp_path) == []  # no temp file left behind


READERS = [
    read_shard,
    lambda path: verify_shard(path, chunk_bytes=5),
]  # tiny chunks: many crc updates


@pytest.mark.parametrize("reader", READERS, ids=["read", "verify"])
@pytest.mark.parametrize("keep", [0, 7, 20, 200, -1])
def test_truncated_file_is_rejected(tmp_path, keep, reader):
    header, payload = _shard()
    path = str(tmp_path / "s.demb")
    write_shard(path, header, payload)
    data = open(path, "rb").read()
    cut = len(data) - 1 if keep == -1 else keep
    with open(path, "wb") as f:
        f.write(data[:cut])
    with pytest.raises(CheckpointCorruptError, match="truncated|not a dynamicemb"):
        reader(path)


def test_trailing_bytes_are_rejected(tmp_path):
    header, payload = _shard()
    path = str(tmp_path / "s.demb")
    write_shard(path, header, payload)
    with open(path, "ab") as f:
        f.write(b"\0")
    with pytest.raises(CheckpointCorruptError, match="trailing"):
        read_shard_header(path)


@pytest.mark.parametrize("reader", READERS, ids=["read", "verify"])
def test_every_flipped_byte_is_detected(tmp_path, reader):
    header, payload = _shard(n=3, dim=2, opt=1, scores=2)
    path = str(tmp_path / "s.demb")
    write_shard(path, header, payload)
    clean = open(path, "rb").read()
    header_end = 20 + int.from_bytes(clean[12:16], "little")
    # Padding between sections is not covered by a checksum; every byte the reader interprets is.
    meaningful = list(range(0, header_end))
    meta = json.loads(clean[20:header_end])
    for sec in meta["sections"]:
        meaningful += range(header_end + sec["offset"], header_end + sec["offset"] + sec["nbytes"])
    for i in meaningful:
        broken = bytearray(clean)
        broken[i] ^= 0x5A
        with open(path, "wb") as f:
            f.write(broken)
        with pytest.raises(CheckpointCorruptError):
            reader(path)


def test_wrong_magic_and_version_are_rejected(tmp_path):
    header, payload = _shard()
    path = str(tmp_path / "s.demb")
    write_shard(path, header, payload)
    data = bytearray(open(path, "rb").read())
    data[8] = 99  # version field
    open(path, "wb").write(data)
    with pytest.raises(CheckpointCorruptError, match="format version 99"):
        read_shard(path)
    open(path, "wb").write(b"PK\x03\x04" + bytes(100))
    with pytest.raises(CheckpointCorruptError, match="magic"):
        read_shard(path)


@pytest.mark.parametrize(
    "kwargs,field",
    [
        ({"dim": 6}, "dim"),
        ({"dtype": torch.float16}, "dtype"),
        ({"score_columns": ("TIMESTAMP", "LFU")}, "score columns"),
        ({"optimizer_width": 2}, "optimizer state width"),
    ],
)
def test_check_header_names_the_mismatched_field(kwargs, field):
    header, _ = _shard()
    with pytest.raises(CheckpointMismatchError, match=f"{field} expected .* file has"):
        check_header(header, where="target", **kwargs)
    check_header(
        header, dim=5, dtype=torch.float32, score_columns=("LFU", "TIMESTAMP"), optimizer_width=1
    )


def _entry(root, rank, world, table="t0", dump_id="d0"):
    header, payload = _shard(n=4 + rank)
    header = dataclasses.replace(
        header, table_name=table, rank=rank, world_size=world, dump_id=dump_id
    )
    return write_entry(root, header, payload)


def test_manifest_lists_all_ranks_and_drops_stale_shards(tmp_path):
    root = str(tmp_path)
    stale = _entry(root, 2, 3)  # an older dump by 3 ranks
    remove_manifest(root)
    for rank in range(2):
        write_rank_manifest(root, rank, [_entry(root, rank, 2)])
    with pytest.raises(CheckpointCorruptError, match="no MANIFEST"):
        read_manifest(root)  # fragments alone are not a checkpoint
    merge_rank_manifests(root, 2)
    entries = read_manifest(root)
    assert sorted(e.rank for e in entries) == [0, 1]
    assert not os.path.exists(os.path.join(root, stale.path))
    assert not [p for p in os.listdir(root) if p.startswith(".manifest")]


def test_manifest_merge_refuses_missing_rank(tmp_path):
    root = str(tmp_path)
    write_rank_manifest(root, 0, [_entry(root, 0, 2)])
    with pytest.raises(CheckpointCorruptError, match="rank 1 of 2 did not finish"):
        merge_rank_manifests(root, 2)
    with pytest.raises(CheckpointCorruptError, match="no MANIFEST"):
        read_manifest(root)


def test_manifest_detects_truncated_or_missing_file(tmp_path):
    root = str(tmp_path)
    entry = _entry(root, 0, 1)
    write_rank_manifest(root, 0, [entry])
    merge_rank_manifests(root, 1)
    full = os.path.join(root, entry.path)
    with open(full, "r+b") as f:
        f.truncate(entry.nbytes - 3)
    with pytest.raises(CheckpointCorruptError, match="manifest says"):
        read_manifest(root)
    os.unlink(full)
    with pytest.raises(CheckpointCorruptError, match="missing"):
        read_manifest(root)


def _with_slots(n: int = 37):
    from dynamicemb_core.checkpoint.format import SlotLayout

    header, payload = _shard(n=n)
    layout = SlotLayout(capacity=256, bucket_capacity=16, row_capacity=256, packed=None)
    slots = torch.randperm(256, generator=torch.Generator().manual_seed(n))[:n]
    return dataclasses.replace(header, slot_layout=layout), dataclasses.replace(
        payload, slots=slots
    )


def test_slots_and_their_layout_round_trip_and_are_checksummed(tmp_path):
    from dynamicemb_core.checkpoint.format import read_shard_section

    header, payload = _with_slots()
    path = str(tmp_path / "s.demb")
    write_shard(path, header, payload)
    got_header, got = read_shard(path)
    assert got_header.slot_layout == header.slot_layout
    assert torch.equal(got.slots, payload.slots)
    assert torch.equal(read_shard_section(path, "slots"), payload.slots)
    raw = bytearray(open(path, "rb").read())
    raw[-1] ^= 0x5A  # the last byte of the slots section, the file's last section
    open(path, "wb").write(bytes(raw))
    with pytest.raises(CheckpointCorruptError, match="section 'slots' checksum mismatch"):
        read_shard(path)


def test_a_damaged_slot_layout_or_slots_without_one_are_refused(tmp_path):
    header, payload = _with_slots()
    with pytest.raises(ValueError, match="slots section goes with a slot_layout"):
        write_shard(
            str(tmp_path / "a.demb"), dataclasses.replace(header, slot_layout=None), payload
        )
    path = str(tmp_path / "s.demb")
    bad = dataclasses.replace(header.slot_layout, bucket_capacity=15)  # 256 is no multiple of 15
    write_shard(path, dataclasses.replace(header, slot_layout=bad), payload)
    with pytest.raises(CheckpointCorruptError, match="damaged header: slot_layout"):
        read_shard_header(path)
