"""torch.export and AOTInductor packages of models holding inference collections, and replay.

Oracle: the trainer's eval forward. After a replay of the trainer's ``incremental_dump``, the served
module, its exported program and its AOTInductor package (attached to the live buffers) must all
give exactly what the trainer gives.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import torch
from torch import nn

from dynamicemb_core.checkpoint import get_score, incremental_dump
from dynamicemb_core.config import DynamicEmbPoolingMode
from dynamicemb_core.inference import (
    InferenceEmbeddingBagCollection,
    LookupModule,
    attach,
    compile_package,
    export_model,
)
from tests.inference import helpers as H

P = DynamicEmbPoolingMode


class Ranker(nn.Module):
    """Sparse lookup then a small MLP: a model that contains an inference collection."""

    def __init__(self, sparse: nn.Module, width: int) -> None:
        super().__init__()
        torch.manual_seed(1)
        self.sparse = sparse
        self.mlp = nn.Sequential(nn.Linear(width, 8), nn.ReLU(), nn.Linear(8, 1))

    def forward(self, values: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.sparse.lookup(values, offsets)).squeeze(-1)


def _changed_trainer(trainer: nn.Module, device) -> dict:
    """Train more and return the delta of what changed (the trainer keeps training meanwhile)."""
    threshold = get_score(trainer)
    H.train(trainer, range(50, 54), key_space=500)
    return incremental_dump(trainer, threshold)


def test_exported_model_matches_and_follows_replay(device: torch.device) -> None:
    trainer = H.trained_tables(P.SUM, device=device)
    served = InferenceEmbeddingBagCollection.from_model(trainer)
    width = sum(H.DIMS[t] for t in H.FEATURE_TABLE_MAP)
    model = Ranker(served, width).to(device)
    indices, offsets, _ = H.batch(500, 16, 600, device)
    program = export_model(model, (indices, offsets))
    exported = program.module()
    other = H.batch(501, 3, 600, device)[:2]  # another batch size: the sizes are dynamic
    for batch in ((indices, offsets), other):
        want = model.mlp(H.reference(trainer, *batch)).squeeze(-1)
        assert torch.equal(model(*batch), want)
        assert torch.equal(exported(*batch), want)

    before = exported(indices, offsets)
    served.replay(_changed_trainer(trainer, device))
    after = model.mlp(H.reference(trainer, indices, offsets)).squeeze(-1)
    assert not torch.equal(after, before)  # the replay changed what the batch reads
    assert torch.equal(served.lookup(indices, offsets), H.reference(trainer, indices, offsets))
    assert torch.equal(exported(indices, offsets), after)  # the program holds the same buffers


_SERVE = """
import json, sys, torch
from dynamicemb_core.inference.runtime import load_package
model = load_package(sys.argv[1])
batch = torch.load(sys.argv[2])
out = model(*[t.to(sys.argv[4]) for t in batch])
torch.save(out.cpu(), sys.argv[3])
training = [m for m in sys.modules if m.split(".")[0] in ("torchrec", "fbgemm_gpu")
            or m.startswith(("dynamicemb_core.lookup", "dynamicemb_core.table",
                             "dynamicemb_core.checkpoint", "dynamicemb_core.optim",
                             "dynamicemb_core.storage", "dynamicemb_core.inference.collection"))]
print(json.dumps(training))
"""


def test_aoti_package_serves_and_follows_replay(device: torch.device, tmp_path) -> None:
    trainer = H.trained_tables(P.SUM, device=device)
    served = LookupModule(InferenceEmbeddingBagCollection.from_model(trainer))
    indices, offsets, _ = H.batch(600, 16, 600, device)
    package = compile_package(
        export_model(served, (indices, offsets)), str(tmp_path / "served.pt2"), fast_compile=True
    )

    # 1. a fresh process with only torch and the ops library serves the package as exported
    other = H.batch(601, 5, 600, device)[:2]
    torch.save([t.cpu() for t in other], tmp_path / "batch.pt")
    run = subprocess.run(
        [
            sys.executable,
            "-c",
            _SERVE,
            package,
            str(tmp_path / "batch.pt"),
            str(tmp_path / "out.pt"),
            str(device),
        ],
        capture_output=True,
        text=True,
        env=dict(os.environ),
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert json.loads(run.stdout.strip().splitlines()[-1]) == []  # no training code imported
    served_out = torch.load(tmp_path / "out.pt")
    assert torch.equal(served_out, H.reference(trainer, *other).cpu())

    # 2. attached to the live module, the package sees a replay without being rebuilt
    from dynamicemb_core.inference.runtime import load_package

    compiled = load_package(package)
    attach(compiled, served)
    before = compiled(indices, offsets)
    assert torch.equal(before, H.reference(trainer, indices, offsets))
    served.collection.replay(_changed_trainer(trainer, device))
    after = compiled(indices, offsets)
    want = H.reference(trainer, indices, offsets)
    assert not torch.equal(want, before)
    assert torch.equal(after, want)


def test_package_without_constants_serves_the_attached_module(tmp_path) -> None:
    """``embed_constants=False`` leaves the tables out of the package; attached, it serves the live
    module and follows its replays (CPU; the bench takes this path on CUDA and checks its output)."""
    from dynamicemb_core.inference.runtime import load_package

    trainer = H.trained_tables(P.SUM, device="cpu")
    served = LookupModule(InferenceEmbeddingBagCollection.from_model(trainer))
    indices, offsets, _ = H.batch(700, 16, 600, "cpu")
    package = compile_package(
        export_model(served, (indices, offsets)),
        str(tmp_path / "bare.pt2"),
        fast_compile=True,
        embed_constants=False,
    )
    compiled = load_package(package)
    assert attach(compiled, served) > 0
    before = compiled(indices, offsets)
    assert torch.equal(before, H.reference(trainer, indices, offsets))
    served.collection.replay(_changed_trainer(trainer, "cpu"))
    want = H.reference(trainer, indices, offsets)
    assert not torch.equal(want, before)
    assert torch.equal(compiled(indices, offsets), want)


def test_online_sync_replica_serves_an_exported_program(tmp_path) -> None:
    import importlib.util

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    example = os.path.join(root, "examples", "online_sync")
    sys.path.insert(0, example)
    try:
        mods = {}
        for name in ("trainer", "replica"):
            spec = importlib.util.spec_from_file_location(f"sync_{name}", f"{example}/{name}.py")
            mods[name] = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mods[name])
    finally:
        sys.path.remove(example)
    assert mods["trainer"].main(["--dir", str(tmp_path), "--steps", "6", "--dump-every", "2"]) == 0
    # the program is exported after the first of three deltas and must follow the other two
    assert mods["replica"].main(["--dir", str(tmp_path), "--export"]) == 0
