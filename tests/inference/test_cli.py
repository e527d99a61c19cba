"""``python -m dynamicemb_core export``: dump -> exported program, against the trainer's forward."""

from __future__ import annotations

import json

import pytest
import torch

from dynamicemb_core.__main__ import main
from dynamicemb_core.checkpoint import DynamicEmbDump, DynamicEmbLoad
from dynamicemb_core.config import DynamicEmbPoolingMode
from tests.inference import helpers as H


def _one_feature_per_table_batch(step: int, batch_size: int):
    gen = torch.Generator().manual_seed(step)
    lengths = torch.randint(0, 4, (len(H.NAMES) * batch_size,), generator=gen)
    values = torch.randint(0, 500, (int(lengths.sum()),), generator=gen)
    return values, torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(lengths, 0)])


@pytest.mark.parametrize("with_spec", [False, True])
def test_export_command_writes_a_program_that_serves_the_dump(tmp_path, with_spec: bool) -> None:
    from dynamicemb_core.lookup import BatchedDynamicEmbeddingTables

    trained = H.trained_tables(DynamicEmbPoolingMode.MEAN)
    # a one-feature-per-table view of the same tables: the command serves one feature per table
    dump = tmp_path / "dump"
    DynamicEmbDump(str(dump), trained)
    out = tmp_path / "model.pt2"
    argv = ["export", "--dump", str(dump), "--out", str(out), "--pooling", "MEAN", "--program"]
    if with_spec:
        spec = {
            "tables": [
                {
                    "name": n,
                    "features": [f"{n}_id"],
                    "options": {"max_capacity": 512, "bucket_capacity": 32},
                }
                for n in H.NAMES
            ]
        }
        (tmp_path / "spec.json").write_text(json.dumps(spec))
        argv += ["--spec", str(tmp_path / "spec.json")]
    assert main(argv) == 0
    meta = json.loads((tmp_path / "model.pt2.json").read_text())
    names = [f"{n}_id" for n in H.NAMES] if with_spec else list(H.NAMES)
    assert meta["features"] == names
    assert meta["tables"] == {s["name"]: s["size"] for s in trained.table_stats()}

    program = torch.export.load(str(out)).module()
    assert isinstance(trained, BatchedDynamicEmbeddingTables)
    single = BatchedDynamicEmbeddingTables(
        table_options=trained.table_options,
        table_names=trained.table_names,
        feature_table_map=[0, 1, 2],
        pooling_mode=DynamicEmbPoolingMode.MEAN,
        optimizer=trained.optimizer,
        device="cpu",
    )
    DynamicEmbLoad(str(dump), single)  # the trained rows, read through a one-feature-per-table map
    values, offsets = _one_feature_per_table_batch(3, 10)
    assert torch.equal(program(values, offsets), H.reference(single, values, offsets))


def test_export_command_names_a_missing_table(tmp_path) -> None:
    DynamicEmbDump(str(tmp_path / "dump"), H.trained_tables())
    (tmp_path / "spec.json").write_text(json.dumps({"tables": [{"name": "clicks"}]}))
    with pytest.raises(SystemExit, match="no table \\['clicks'\\]"):
        main(
            [
                "export",
                "--dump",
                str(tmp_path / "dump"),
                "--out",
                str(tmp_path / "m.pt2"),
                "--spec",
                str(tmp_path / "spec.json"),
            ]
        )
