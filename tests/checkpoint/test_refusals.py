"""Loads that cannot land every row are refused before writing; damaged folders give a CheckpointError
naming the file; a dump cleans up after a killed one and reports a full disk with the file's name.

Issue 28 items 3 and 9, issue 29 item 4.
"""

from __future__ import annotations

import dataclasses
import errno
import glob
import json
import os
import pickle
import shutil

import pytest
import torch

from dynamicemb_core.checkpoint import (
    CheckpointCorruptError,
    CheckpointError,
    CheckpointMismatchError,
    CheckpointWriteError,
    DynamicEmbDump,
    DynamicEmbLoad,
)
from dynamicemb_core.checkpoint.format import MAGIC, read_shard, read_shard_identity, write_shard
from dynamicemb_core.table.hashing import buckets_of_tensor
from tests.checkpoint.helpers import make_model, snapshot, train

BIG = {"max_capacity": 4096, "init_capacity": 4096}


def _contents(model):
    return {name: {k: s.rows[k].clone() for k in s.keys()} for name, s in snapshot(model).items()}


def _same(a, b):
    return a.keys() == b.keys() and all(
        a[n].keys() == b[n].keys() and all(torch.equal(a[n][k], b[n][k]) for k in a[n]) for n in a
    )


def _target():
    dst = make_model()  # max_capacity 256, 16 buckets of 16
    train(dst, 2, seed=9)
    return dst, _contents(dst)


@pytest.fixture(scope="module")
def big_dump(tmp_path_factory):
    """1,700+ rows per table (the issue's case): more than a 256-slot table holds."""
    src = make_model(**BIG)
    train(src, 20, key_range=100000, batch_size=48)
    root = str(tmp_path_factory.mktemp("big"))
    DynamicEmbDump(root, src, optim=True)
    return root, {n: set(s.keys()) for n, s in snapshot(src).items()}


# ---- item 3: a load lands every row or refuses before writing --------------------------------
def test_more_rows_than_max_capacity_is_refused_before_writing(big_dump):
    root, keys = big_dump
    assert all(len(k) > 1700 for k in keys.values())
    dst, before = _target()
    n0 = len(keys["model.ebc/t0"])
    with pytest.raises(
        CheckpointMismatchError,
        match=rf"table 'model.ebc/t0': the checkpoint brings {n0} keys .* do not fit its max_capacity of "
        "256 slots. Nothing was written",
    ):
        DynamicEmbLoad(root, dst, optim=True)
    assert _same(before, _contents(dst))


def test_a_table_that_must_grow_receives_every_row_and_the_counts_are_returned(big_dump):
    root, keys = big_dump
    dst = make_model(max_capacity=1 << 14, init_capacity=16)  # grows once per insert call
    counts = DynamicEmbLoad(root, dst, optim=True)
    assert counts == {n: (len(k), 0) for n, k in keys.items()}
    assert {n: set(s.keys()) for n, s in snapshot(dst).items()} == keys


@pytest.fixture(scope="module")
def crowded_dump(tmp_path_factory):
    """17 keys whose home bucket in a 16-bucket table is 0: they fit 256 slots, not one bucket of
    16 (the 256-bucket source holds them all)."""
    cand = torch.arange(1, 20000, dtype=torch.int64)
    crowd = cand[buckets_of_tensor(cand, 16) == 0][:17]
    src = make_model(**BIG)
    src(crowd, torch.tensor([0, 17, 17])).sum().backward()
    assert snapshot(src)["model.ebc/t0"].keys() == sorted(crowd.tolist())
    root = str(tmp_path_factory.mktemp("crowd"))
    DynamicEmbDump(root, src)
    return root, sorted(crowd.tolist())


def test_a_bucket_that_would_overflow_is_refused_before_writing(crowded_dump):
    root, _ = crowded_dump
    dst = make_model()  # 256 slots, no room to grow
    before = _contents(dst)
    with pytest.raises(
        CheckpointMismatchError,
        match=r"'model.ebc/t0'.*at 256 slots \(16 buckets of 16\) 1 keys would find no free slot",
    ):
        DynamicEmbLoad(root, dst)
    assert _same(before, _contents(dst))


def test_a_table_that_may_grow_grows_until_every_bucket_fits(crowded_dump):
    root, keys = crowded_dump
    dst = make_model(max_capacity=512)  # 17 keys are far below its load factor at 256 slots
    assert DynamicEmbLoad(root, dst)["model.ebc/t0"] == (17, 0)
    assert snapshot(dst)["model.ebc/t0"].keys() == keys


def test_the_keys_a_table_already_holds_count_in_its_buckets(tmp_path):
    # dst holds 10 keys of bucket 0; the checkpoint brings 7 more: 17 for 16 slots. Writing them
    # would evict keys of the table (or of the load); refused before writing.
    cand = torch.arange(1, 20000, dtype=torch.int64)
    crowd = cand[buckets_of_tensor(cand, 16) == 0][:17]
    src = make_model()
    src(crowd[10:], torch.tensor([0, 7, 7])).sum().backward()
    DynamicEmbDump(str(tmp_path), src)
    dst = make_model()
    dst(crowd[:10], torch.tensor([0, 10, 10])).sum().backward()
    before = _contents(dst)
    with pytest.raises(
        CheckpointMismatchError,
        match=r"brings 7 keys \(7 not in the table, which holds 10\).* 1 keys would find no free",
    ):
        DynamicEmbLoad(str(tmp_path), dst)
    assert _same(before, _contents(dst))


# ---- item 9: damaged manifests ---------------------------------------------------------------
@pytest.fixture
def dumped(tmp_path):
    src = make_model()
    train(src, 3)
    root = str(tmp_path / "ckpt")
    DynamicEmbDump(root, src, optim=True)
    return root, tmp_path


def _manifest(root):
    return os.path.join(root, "MANIFEST.json")


def _rewrite(root, edit):
    meta = json.load(open(_manifest(root)))
    edit(meta)
    with open(_manifest(root), "w") as f:
        json.dump(meta, f)


DAMAGES = {
    "unexpected entry field": (
        lambda m: m["files"][0].update(owner="x"),
        "unexpected field 'owner'",
    ),
    "missing files": (lambda m: m.pop("files"), "'files' is missing"),
    "unexpected top field": (lambda m: m.update(note=1), "unexpected field 'note'"),
    "size as text": (
        lambda m: m["files"][0].update(nbytes=str(m["files"][0]["nbytes"])),
        "'nbytes' is str, expected int",
    ),
    "rank as bool": (lambda m: m["files"][0].update(rank=False), "'rank' is bool, expected int"),
    "entry not an object": (
        lambda m: m["files"].append([1, 2]),
        r"files\[\d+\] is list, expected an object",
    ),
    "files not a list": (lambda m: m.update(files={"a": 1}), "'files' is dict, expected a list"),
    "missing dump id": (lambda m: m.pop("dump_id"), "'dump_id' is missing"),
    "missing entry field": (lambda m: m["files"][1].pop("crc32"), "'crc32' is missing"),
}


@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_a_damaged_manifest_names_the_file_and_changes_nothing(dumped, damage):
    root, _ = dumped
    edit, message = DAMAGES[damage]
    _rewrite(root, edit)
    dst, before = _target()
    with pytest.raises(CheckpointCorruptError, match=r"MANIFEST\.json.*" + message):
        DynamicEmbLoad(root, dst, optim=True)
    assert _same(before, _contents(dst))


@pytest.mark.parametrize(
    "blob,message",
    [
        (b"\x80\x04\x95binary\xff\xfe", "not UTF-8 text"),
        (b'{"format_version": 2, "files": [', "unreadable JSON"),
        (b"[1, 2]", "a manifest is a JSON object, this is list"),
    ],
    ids=["binary", "cut", "list"],
)
def test_an_unreadable_manifest_names_the_file(dumped, blob, message):
    root, _ = dumped
    with open(_manifest(root), "wb") as f:
        f.write(blob)
    dst, before = _target()
    with pytest.raises(CheckpointCorruptError, match=r"MANIFEST\.json: " + message):
        DynamicEmbLoad(root, dst)
    assert _same(before, _contents(dst))


def test_a_truncated_shard_gives_a_clear_error_even_when_the_manifest_agrees(dumped):
    root, _ = dumped
    (path,) = glob.glob(os.path.join(root, "model.ebc", "t1.*"))
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) - 100)
    _rewrite(
        root,
        lambda m: [
            e.update(nbytes=os.path.getsize(os.path.join(root, e["path"]))) for e in m["files"]
        ],
    )
    dst, before = _target()
    with pytest.raises(
        CheckpointCorruptError, match=r"t1\.rank0-of-1\.demb: truncated: \d+ bytes, header says"
    ):
        DynamicEmbLoad(root, dst, optim=True)
    assert _same(before, _contents(dst))


def test_a_header_rewritten_with_its_checksums_is_still_checked_before_writing(dumped):
    # Whoever rewrites a file can recompute every checksum; what the load applies after the rows
    # (the score clock) must still be checked before them.
    root, _ = dumped
    (path,) = glob.glob(os.path.join(root, "model.ebc", "t0.*"))
    header, payload = read_shard(path)
    write_shard(
        path, dataclasses.replace(header, extra={**header.extra, "score_clock": "x"}), payload
    )
    crc = read_shard_identity(path)[1]

    def edit(meta):
        for e in meta["files"]:
            if e["table"] == "t0":
                e.update(nbytes=os.path.getsize(path), crc32=crc)

    _rewrite(root, edit)
    dst, before = _target()
    with pytest.raises(CheckpointCorruptError, match=r"t0\.rank0-of-1\.demb: damaged header"):
        DynamicEmbLoad(root, dst, optim=True)
    assert _same(before, _contents(dst))


# ---- issue 29 item 4: paths stay inside the folder -------------------------------------------
def test_a_manifest_path_outside_the_folder_is_refused(dumped):
    root, tmp_path = dumped
    outside = str(tmp_path / "elsewhere")
    shutil.copytree(os.path.join(root, "model.ebc"), outside)  # valid files, out of the folder
    original = json.load(open(_manifest(root)))
    dst, before = _target()
    for path in (
        os.path.join(outside, "t0.rank0-of-1.demb"),  # absolute
        "../elsewhere/t0.rank0-of-1.demb",
        "model.ebc/../../elsewhere/t0.rank0-of-1.demb",
    ):
        files = [dict(original["files"][0], path=path)] + original["files"][1:]
        _rewrite(root, lambda m, files=files: m.update(files=files))
        with pytest.raises(CheckpointCorruptError, match="outside the checkpoint folder"):
            DynamicEmbLoad(root, dst)
    _rewrite(root, lambda m: m.update(original))
    shutil.rmtree(os.path.join(root, "model.ebc"))
    os.symlink(outside, os.path.join(root, "model.ebc"))  # the listed path, through a link
    with pytest.raises(
        CheckpointCorruptError, match="resolves to .*elsewhere.* outside the checkpoint folder"
    ):
        DynamicEmbLoad(root, dst)
    assert _same(before, _contents(dst))


def test_a_listed_path_must_be_the_one_its_entry_names(dumped):
    root, _ = dumped
    _rewrite(root, lambda m: m["files"][0].update(path="model.ebc/t1.rank0-of-1.demb"))
    with pytest.raises(
        CheckpointCorruptError, match="is listed for 'model.ebc/t0' rank 0 of 1, whose file is"
    ):
        DynamicEmbLoad(root, make_model())


# ---- files that would run code ----------------------------------------------------------------
class _Payload:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_a_crafted_pickle_in_place_of_a_file_runs_nothing(dumped):
    root, tmp_path = dumped
    marker = str(tmp_path / "ran")
    (shard,) = glob.glob(os.path.join(root, "model.ebc", "t0.*"))
    torch.save({"rows": _Payload(marker)}, shard)
    _rewrite(
        root,
        lambda m: [
            e.update(nbytes=os.path.getsize(os.path.join(root, e["path"]))) for e in m["files"]
        ],
    )
    dst, before = _target()
    with pytest.raises(
        CheckpointCorruptError, match=r"t0\.rank0-of-1\.demb: not a dynamicemb shard \(magic"
    ):
        DynamicEmbLoad(root, dst)
    with open(_manifest(root), "wb") as f:
        pickle.dump(_Payload(marker), f)
    with pytest.raises(CheckpointCorruptError, match=r"MANIFEST\.json: not UTF-8 text"):
        DynamicEmbLoad(root, dst)
    assert not os.path.exists(marker)
    assert _same(before, _contents(dst))


def test_every_file_a_dump_writes_is_json_or_a_raw_shard(dumped):
    root, _ = dumped
    files = [p for p in glob.glob(os.path.join(root, "**"), recursive=True) if os.path.isfile(p)]
    assert len(files) == 3
    for path in files:
        if path.endswith(".json"):
            json.load(open(path, encoding="utf-8"))
        else:
            assert open(path, "rb").read(8) == MAGIC
            read_shard(path)


# ---- writing: a full disk, a killed dump -------------------------------------------------------
def test_a_full_disk_names_the_file_and_leaves_no_partial_checkpoint(tmp_path, monkeypatch):
    src = make_model()
    train(src, 2)
    root = str(tmp_path / "ckpt")
    real = os.fsync

    def full(fd):  # the disk fills while the second table's file is written
        if ".t1.rank0-of-1.demb." in os.readlink(f"/proc/self/fd/{fd}"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd)

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(
        CheckpointWriteError,
        match=r"t1\.rank0-of-1\.demb failed: No space left on device \(errno 28\)",
    ) as info:
        DynamicEmbDump(root, src)
    assert info.value.errno == errno.ENOSPC and isinstance(info.value.__cause__, OSError)
    monkeypatch.setattr(os, "fsync", real)
    assert not glob.glob(os.path.join(root, "**", ".*.tmp"), recursive=True)
    with pytest.raises(CheckpointCorruptError, match="did not finish"):
        DynamicEmbLoad(root, make_model())


def test_a_dump_removes_the_temp_files_a_killed_dump_left(dumped):
    root, _ = dumped
    stale = [
        os.path.join(root, "model.ebc", ".t0.rank0-of-1.demb.k1l2e3d4.tmp"),
        os.path.join(root, ".MANIFEST.json.abcd1234.tmp"),
        os.path.join(root, "..manifest.rank0.json.x9y8.tmp"),
    ]
    mine = [os.path.join(root, "model.ebc", "notes.tmp"), os.path.join(root, "keep.txt")]
    for path in stale + mine:
        open(path, "wb").write(b"\0" * 64)
    src = make_model()
    train(src, 1)
    DynamicEmbDump(root, src, allow_overwrite=True)
    assert [os.path.exists(p) for p in stale] == [False] * 3
    assert all(os.path.exists(p) for p in mine)  # not of the dump's pattern: left alone
    DynamicEmbLoad(root, make_model())


def test_checkpoint_errors_are_value_errors():
    assert issubclass(CheckpointWriteError, CheckpointError) and issubclass(
        CheckpointError, ValueError
    )
