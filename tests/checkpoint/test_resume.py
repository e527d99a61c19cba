"""Resuming from a checkpoint: "train N, dump, load into a fresh process, train M" == "train N+M", bit for bit.

For every optimizer, with and without admission (FrequencyAdmissionStrategy counting in a KVCounter),
on STEP-scored tables. The resumed model is built in another process with *other* hyper-parameters
(the defaults), so what it trains with after ``DynamicEmbLoad(optim=True, counter=True)`` comes from
the checkpoint alone: rows, optimizer states, Adam's step count, learning rate, eps, betas, weight
decay, initial accumulator, admission counts and the STEP clock. Both runs seed torch's generator per
step (new keys' initial embeddings are random; the generator's state is not part of a checkpoint).
Compared: every stored key's row (embedding and optimizer state) and scores, the counters, the
module's step and the score clocks. Without ``counter=True`` the admission runs must come out
different (keys seen before and after the checkpoint are admitted late), so the test can fail.
"""

from __future__ import annotations

import multiprocessing
import os
from typing import Any, Dict, Tuple

import pytest
import torch

from dynamicemb_core.admission import FrequencyAdmissionStrategy, KVCounter
from dynamicemb_core.checkpoint import DynamicEmbDump, DynamicEmbLoad
from dynamicemb_core.checkpoint.state import counter_payload
from dynamicemb_core.config import DynamicEmbPoolingMode
from dynamicemb_core.incremental_dump import get_score
from tests.checkpoint.helpers import Holder, S, batch, snapshot, table_options

N, M = 3, 3
KEY_RANGE = 40
OPTIMIZERS = ("EXACT_SGD", "ADAM", "EXACT_ADAGRAD", "EXACT_ROWWISE_ADAGRAD")
CASES = [(opt, admission) for opt in OPTIMIZERS for admission in (False, True)]


def _hyper(optimizer: str) -> Dict[str, Any]:
    """Non-default hyper-parameters for the source run (the resumed model is built without them)."""
    from fbgemm_gpu.tbe.config.optimizer_config import WeightDecayMode

    return {
        "EXACT_SGD": dict(learning_rate=0.3),
        "ADAM": dict(learning_rate=0.05, beta1=0.8, beta2=0.95, eps=1e-4, weight_decay=0.01),
        "EXACT_ADAGRAD": dict(learning_rate=0.2, eps=1e-3, initial_accumulator_value=0.1),
        "EXACT_ROWWISE_ADAGRAD": dict(
            learning_rate=0.2, eps=1e-3, weight_decay=0.01, weight_decay_mode=WeightDecayMode.L2
        ),
    }[optimizer]


def _model(optimizer: str, admission: bool, hyper: Dict[str, Any]) -> Holder:
    from fbgemm_gpu.split_embedding_configs import EmbOptimType

    from dynamicemb_core.lookup import BatchedDynamicEmbeddingTables

    extra: Dict[str, Any] = {"score_strategy": S.STEP}
    if admission:
        extra["admit_strategy"] = FrequencyAdmissionStrategy(threshold=2)
        extra["admission_counter"] = KVCounter(capacity=1024, bucket_capacity=16)
    return Holder(
        BatchedDynamicEmbeddingTables(
            table_options=[table_options(d, **extra) for d in (8, 4)],
            table_names=["t0", "t1"],
            feature_table_map=[0, 1],
            pooling_mode=DynamicEmbPoolingMode.SUM,
            optimizer=getattr(EmbOptimType, optimizer),
            device="cpu",
            **hyper,
        )
    )


def _train(model: Holder, steps: range) -> None:
    model.train()
    for step in steps:
        torch.manual_seed(1000 + step)  # the initializer's draws, the same in both runs
        indices, offsets = batch(2, 6, KEY_RANGE, torch.Generator().manual_seed(step))
        model(indices, offsets).pow(2).sum().backward()


def _state(model: Holder) -> Dict[str, Any]:
    """Everything that decides later training, slot placement aside."""
    tables = {
        name: {k: (snap.rows[k], snap.scores[k]) for k in snap.keys()}
        for name, snap in snapshot(model).items()
    }
    counters = {}
    for name, adm in zip(model.ebc.table_names, model.ebc._admission, strict=True):
        if adm is not None:
            p = counter_payload(adm[1])
            counters[name] = dict(zip(p.keys.tolist(), p.scores[:, 0].tolist(), strict=True))
    return {
        "tables": tables,
        "counters": counters,
        "step": model.ebc.step,
        "clock": get_score(model),
        "lr": model.ebc.get_learning_rate(),
    }


def _case_dir(root: str, optimizer: str, admission: bool) -> str:
    return os.path.join(root, f"{optimizer}-{'admission' if admission else 'plain'}")


def _resume_all(root: str) -> None:
    """The fresh process: load each checkpoint into a default-built model and train M steps."""
    torch.set_num_threads(1)
    out = {}
    for optimizer, admission in CASES:
        path = _case_dir(root, optimizer, admission)
        model = _model(optimizer, admission, {})  # FBGEMM's defaults: all must come from the dump
        DynamicEmbLoad(path, model, optim=True, counter=True)
        _train(model, range(N, N + M))
        out[(optimizer, admission)] = _state(model)
        if admission:  # the same without the counters: must differ
            bare = _model(optimizer, admission, {})
            DynamicEmbLoad(path, bare, optim=True)
            _train(bare, range(N, N + M))
            out[(optimizer, admission, "no counters")] = _state(bare)
    torch.save(out, os.path.join(root, "resumed.pt"))


def _same(a: Dict[str, Any], b: Dict[str, Any]) -> Tuple[bool, str]:
    for key in ("step", "clock", "lr", "counters"):
        if a[key] != b[key]:
            return False, f"{key}: {a[key]} != {b[key]}"
    if a["tables"].keys() != b["tables"].keys():
        return False, "tables"
    for name, rows in a["tables"].items():
        other = b["tables"][name]
        if rows.keys() != other.keys():
            return False, f"{name}: keys {sorted(rows.keys() ^ other.keys())} differ"
        for k, (row, scores) in rows.items():
            if not torch.equal(row, other[k][0]) or scores != other[k][1]:
                return False, f"{name} key {k}: {row} {scores} != {other[k][0]} {other[k][1]}"
    return True, ""


def test_resume_in_a_fresh_process_equals_uninterrupted_training(tmp_path):
    root = str(tmp_path)
    expected = {}
    for optimizer, admission in CASES:
        model = _model(optimizer, admission, _hyper(optimizer))
        _train(model, range(N))
        DynamicEmbDump(_case_dir(root, optimizer, admission), model, optim=True, counter=True)
        _train(model, range(N, N + M))
        expected[(optimizer, admission)] = _state(model)
        if admission:
            assert expected[(optimizer, admission)]["counters"], "the test needs counted keys"
    child = multiprocessing.get_context("spawn").Process(target=_resume_all, args=(root,))
    child.start()
    child.join(timeout=240)
    assert child.exitcode == 0, f"the resuming process failed (exit code {child.exitcode})"
    resumed = torch.load(os.path.join(root, "resumed.pt"))
    for case, want in expected.items():
        same, why = _same(want, resumed[case])
        assert same, f"{case}: {why}"
        assert want["step"] == N + M and want["clock"] == {
            "model.ebc": {"t0": N + M + 1, "t1": N + M + 1}
        }
        if case[1]:
            same, _ = _same(want, resumed[case + ("no counters",)])
            assert not same, f"{case}: resuming without the counters should differ"


if __name__ == "__main__":  # pragma: no cover
    pytest.main([__file__, "-q"])
