"""A checkpoint file names its dump, collection, table, kind and rank, and the load checks them.

Two tables of one shape (same dim, same row count, so their files have the same size) make a mix-up
invisible to every shape check: only the identity fields (and the manifest's header checksum) can
tell ``t0``'s file from ``t1``'s, or from ``t0``'s file of another model's dump. Each case must raise
a CheckpointMismatchError naming the file and the field, with the target model unchanged.
"""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch

from dynamicemb_core.checkpoint import (
    CheckpointCorruptError,
    CheckpointMismatchError,
    DynamicEmbDump,
    DynamicEmbLoad,
)
from tests.checkpoint.helpers import Holder, batched, make_model, snapshot, train


def _twins(**kwargs):
    """A model with two tables of one shape, trained on a small key range so both hold every key."""
    model = make_model(dims=(8, 8), **kwargs)
    train(model, 12, key_range=24, batch_size=16)
    return model


def _contents(model):
    return {
        name: (sorted(s.keys()), [s.rows[k].clone() for k in sorted(s.keys())])
        for name, s in snapshot(model).items()
    }


def _same(a, b):
    return a.keys() == b.keys() and all(
        a[n][0] == b[n][0] and all(torch.equal(x, y) for x, y in zip(a[n][1], b[n][1])) for n in a
    )


def _file(root, table, kind=""):
    return os.path.join(root, "model.ebc", f"{table}.rank0-of-1{kind}.demb")


def _edit_manifest(root, edit):
    path = os.path.join(root, "MANIFEST.json")
    meta = json.load(open(path))
    edit(meta)
    with open(path, "w") as f:
        json.dump(meta, f)


def _match_sizes(root):
    """What someone hiding a swap would do: set every listed size to the file's real size."""

    def edit(meta):
        for e in meta["files"]:
            e["nbytes"] = os.path.getsize(os.path.join(root, e["path"]))

    _edit_manifest(root, edit)


@pytest.fixture
def setup(tmp_path):
    src = _twins()
    root = str(tmp_path / "ckpt")
    DynamicEmbDump(root, src, optim=True)
    assert os.path.getsize(_file(root, "t0")) == os.path.getsize(_file(root, "t1"))
    dst = make_model(dims=(8, 8))
    train(dst, 2, seed=7)
    return root, dst, _contents(dst), tmp_path


def test_a_file_of_another_table_of_the_same_size_is_refused(setup):
    root, dst, before, _ = setup
    shutil.copyfile(_file(root, "t1"), _file(root, "t0"))
    with pytest.raises(
        CheckpointMismatchError, match=r"t0\.rank0-of-1\.demb.*table: manifest 't0', file 't1'"
    ):
        DynamicEmbLoad(root, dst, optim=True)
    assert _same(before, _contents(dst))


def test_swapped_files_are_refused(setup):
    root, dst, before, _ = setup
    a, b = _file(root, "t0"), _file(root, "t1")
    os.rename(a, a + ".x")
    os.rename(b, a)
    os.rename(a + ".x", b)
    with pytest.raises(CheckpointMismatchError, match="table: manifest 't0', file 't1'"):
        DynamicEmbLoad(root, dst, optim=True)
    assert _same(before, _contents(dst))


def test_another_size_with_the_manifest_edited_to_match_is_refused(setup):
    root, dst, before, tmp_path = setup
    other = make_model(dims=(8, 8))
    train(other, 3, key_range=200)  # another row count: another file size
    DynamicEmbDump(str(tmp_path / "other"), other, optim=True)
    shutil.copyfile(_file(str(tmp_path / "other"), "t1"), _file(root, "t0"))
    _match_sizes(root)
    with pytest.raises(CheckpointMismatchError, match="table: manifest 't0', file 't1'.*row count"):
        DynamicEmbLoad(root, dst)  # rows only: no optimizer step to disagree on
    assert _same(before, _contents(dst))


def test_the_same_table_of_another_models_dump_is_refused(setup):
    root, dst, before, tmp_path = setup
    other = _twins()  # same names, same shape, same keys: only the dump differs
    DynamicEmbDump(str(tmp_path / "other"), other, optim=True)
    shutil.copyfile(_file(str(tmp_path / "other"), "t0"), _file(root, "t0"))
    _match_sizes(root)
    with pytest.raises(CheckpointMismatchError, match="dump id: manifest '[0-9a-f]{32}', file"):
        DynamicEmbLoad(root, dst, optim=True)
    assert _same(before, _contents(dst))
    # Rewriting the entry's dump id too makes the manifest disagree with itself.
    foreign = json.load(open(os.path.join(str(tmp_path / "other"), "MANIFEST.json")))
    _edit_manifest(root, lambda m: m["files"][0].update(dump_id=foreign["dump_id"]))
    with pytest.raises(
        CheckpointMismatchError, match="is of dump '[0-9a-f]{32}', the manifest of dump"
    ):
        DynamicEmbLoad(root, dst, optim=True)
    assert _same(before, _contents(dst))


def test_the_same_table_of_another_collection_is_refused(setup):
    root, dst, before, tmp_path = setup

    class Other(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.user = batched(dims=(8, 8))

    other = Other()
    DynamicEmbDump(str(tmp_path / "other"), other)
    shutil.copyfile(
        os.path.join(str(tmp_path / "other"), "model.user", "t0.rank0-of-1.demb"), _file(root, "t0")
    )
    _match_sizes(root)
    with pytest.raises(
        CheckpointMismatchError, match="collection: manifest 'model.ebc', file 'model.user'"
    ):
        DynamicEmbLoad(root, dst)
    assert _same(before, _contents(dst))


def test_a_manifest_listing_a_rank_twice_or_missing_one_is_refused(setup):
    root, dst, before, _ = setup

    def duplicate(meta):
        meta["files"].append(dict(meta["files"][0]))

    _edit_manifest(root, duplicate)
    with pytest.raises(CheckpointCorruptError, match="lists ranks \\[0, 0\\]"):
        DynamicEmbLoad(root, dst, optim=True)
    _edit_manifest(root, lambda m: m["files"].pop())
    _edit_manifest(root, lambda m: m.update(world_size=2))
    with pytest.raises(CheckpointCorruptError, match="written by 1 ranks, the manifest says 2"):
        DynamicEmbLoad(root, dst, optim=True)
    assert _same(before, _contents(dst))


def test_a_checkpoint_of_the_previous_format_is_refused_clearly(setup):
    root, dst, before, _ = setup
    _edit_manifest(root, lambda m: m.update(format_version=1))
    with pytest.raises(
        CheckpointCorruptError, match="format version 1; this build reads versions 2, 3.*re-dump"
    ):
        DynamicEmbLoad(root, dst)
    assert _same(before, _contents(dst))


def test_an_intact_dump_loads_and_the_files_say_who_they_are(setup):
    root, dst, _, _ = setup
    from dynamicemb_core.checkpoint.format import read_shard_identity

    meta = json.load(open(os.path.join(root, "MANIFEST.json")))
    for e in meta["files"]:
        header, crc = read_shard_identity(os.path.join(root, e["path"]))
        assert (header.collection, header.table_name, header.kind, header.dump_id, crc) == (
            e["collection"],
            e["table"],
            e["kind"],
            meta["dump_id"],
            e["crc32"],
        )
    fresh = make_model(dims=(8, 8))
    DynamicEmbLoad(root, fresh, optim=True)
    assert all(len(s.keys()) == 24 for s in snapshot(fresh).values())


def test_holder_is_the_collection_path():  # the tests above rely on the collection being "model.ebc"
    from dynamicemb_core.checkpoint.discovery import find_tables

    assert {h.collection for h in find_tables(Holder(batched()))} == {"model.ebc"}
