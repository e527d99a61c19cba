"""TableMetricsWriter: the scalars read back from the event file are table_metrics' values.

The event file is read with TensorBoard's own reader (EventAccumulator, what `tensorboard --logdir`
serves), and every scalar at every written step is compared with what table_metrics and the
tables' size / capacity said at that step.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Dict, Tuple

import pytest
import torch
from fbgemm_gpu.split_embedding_configs import EmbOptimType
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from dynamicemb_core import table_metrics
from dynamicemb_core.config import (
    DynamicEmbCheckMode,
    DynamicEmbPoolingMode,
    DynamicEmbTableOptions,
)
from dynamicemb_core.lookup import BatchedDynamicEmbeddingTables
from dynamicemb_core.tracking.tensorboard import SCALARS, TableMetricsWriter
from dynamicemb_core.types import DynamicEmbWarning
from tests.lookup import oracle

TABLES = ("t0", "t1")
EVERY = 2
STEPS = 7


def _module() -> BatchedDynamicEmbeddingTables:
    """Two tables of 32 slots: batches of 40 distinct keys from 119 fill them and evict."""
    opts = [
        DynamicEmbTableOptions(
            dim=4,
            max_capacity=32,
            bucket_capacity=16,
            safe_check_mode=DynamicEmbCheckMode.IGNORE,
            **oracle.device_resident({}),
        )
        for _ in TABLES
    ]
    return BatchedDynamicEmbeddingTables(
        opts,
        list(TABLES),
        list(range(len(TABLES))),
        DynamicEmbPoolingMode.NONE,
        EmbOptimType.EXACT_SGD,
        torch.device("cpu"),
        learning_rate=0.1,
    )


def _train_step(m: BatchedDynamicEmbeddingTables, step: int) -> None:
    g = torch.Generator().manual_seed(step)
    keys = [torch.randperm(119, generator=g)[: 20 + 5 * t] + 1 for t in range(len(TABLES))]
    offsets = torch.tensor([0, len(keys[0]), len(keys[0]) + len(keys[1])])
    m(torch.cat(keys), offsets).sum().backward()


def _read_back(log_dir: Path) -> Dict[str, Dict[int, float]]:
    """{tag: {step: value}} of every scalar in the log, as TensorBoard reads it."""
    (event_file,) = log_dir.glob("events.out.tfevents.*")
    acc = EventAccumulator(str(log_dir))
    acc.Reload()
    return {tag: {e.step: e.value for e in acc.Scalars(tag)} for tag in acc.Tags()["scalars"]}


def test_logged_scalars_are_table_metrics_values(tmp_path: Path) -> None:
    m = _module()
    writer = TableMetricsWriter(str(tmp_path / "tb"), every=EVERY)
    expected: Dict[Tuple[str, int], float] = {}
    last_evicted = dict.fromkeys(TABLES, 0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DynamicEmbWarning)
        for step in range(1, STEPS + 1):
            _train_step(m, step)
            written = writer.step(m, step)
            if step % EVERY:
                assert written is None
                continue
            ((collection, metrics),) = table_metrics(m).items()  # one module: "model"
            stats = {s["name"]: s for s in m.table_stats()}
            for t in TABLES:
                tag = f"dynamicemb/{collection}/{t}"
                for name, value in metrics[t].items():
                    expected[(f"{tag}/{name}", step)] = value
                size, capacity = stats[t]["size"], stats[t]["capacity"]
                expected[(f"{tag}/size", step)] = size
                expected[(f"{tag}/capacity", step)] = capacity
                expected[(f"{tag}/occupancy", step)] = size / capacity
                evicted = metrics[t]["evicted"]
                expected[(f"{tag}/eviction_rate", step)] = (evicted - last_evicted[t]) / EVERY
                last_evicted[t] = evicted
                looked_up = metrics[t]["hits"] + metrics[t]["misses"]
                expected[(f"{tag}/hit_rate", step)] = metrics[t]["hits"] / looked_up
            now = {tag: v for (tag, s), v in expected.items() if s == step}
            assert written == pytest.approx(now)
    writer.close()
    assert all(last_evicted.values()), "the steps must evict, or eviction_rate is not tested"
    logged = _read_back(tmp_path / "tb")
    assert set(logged) == {f"dynamicemb/model/{t}/{name}" for t in TABLES for name in SCALARS}
    for tag, by_step in logged.items():
        assert sorted(by_step) == list(range(EVERY, STEPS + 1, EVERY)), tag
        for step, value in by_step.items():
            # event files hold float32: exact for these counts, 1e-7 relative for the ratios
            assert value == pytest.approx(expected[(tag, step)], rel=1e-6), (tag, step)


def test_every_must_be_positive(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="every must be at least 1, got 0"):
        TableMetricsWriter(str(tmp_path), every=0)
