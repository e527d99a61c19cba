"""Value-memory budgets as the seed defines them (issue 15 item 3).

- ``global_hbm_for_values = 0`` (the default) puts no value rows in device memory: a hybrid table
  with every row on the host (checked on the tier rule for a CUDA table; on CPU the device is the
  host).
- a budget below one bucket is rounded up to one bucket with a warning, not refused;
- every split the seed allows (nothing, under a bucket, part, all; ``MAX_BUCKET_CAPACITY``; a cache)
  plans and trains through the planner and DMP, matching an unsharded TorchRec twin step by step.
"""

from __future__ import annotations

import warnings
from typing import Dict, List

import pytest
import torch
from torchrec.modules.embedding_configs import EmbeddingBagConfig

from dynamicemb_core import MAX_BUCKET_CAPACITY, DynamicEmbTableOptions
from dynamicemb_core.lookup.placement import device_budget_bytes, tier_kind
from dynamicemb_core.planner import DynamicEmbParameterConstraints
from dynamicemb_core.planner.table_options import prepare_table_options
from dynamicemb_core.storage.table_views import CachedTableView, TableView
from dynamicemb_core.types import MemoryType, StorageTableSpec
from tests.shard.dist_harness import dynamic_kernels, run_workers, train_against_twin

DIM = 4
ROW = (DIM + 1) * 4  # EXACT_ROWWISE_ADAGRAD rows: embedding + one accumulator, float32
CONFIG = EmbeddingBagConfig(name="t", embedding_dim=DIM, num_embeddings=40, feature_names=["f"])
HYPER = {"learning_rate": 0.1, "eps": 1e-3, "beta1": 0.8, "beta2": 0.9}


def _spec() -> StorageTableSpec:
    return StorageTableSpec(name="t", dim=DIM, row_width=DIM + 1)


def _prepared(world: int = 2, **kw) -> DynamicEmbTableOptions:
    return prepare_table_options(DynamicEmbTableOptions(**kw), CONFIG, world)


CUDA = torch.device("cuda")  # only named: tier_kind decides without allocating


def test_default_budget_means_no_values_in_device_memory() -> None:
    opts = _prepared(bucket_capacity=16)
    assert opts.local_hbm_for_values == 0
    assert tier_kind(opts, _spec(), CUDA) == "hybrid"
    assert device_budget_bytes(opts, _spec()) == 0  # zero device rows, no warning


def test_budget_holding_the_whole_shard_is_a_device_table() -> None:
    opts = _prepared(bucket_capacity=16, global_hbm_for_values=2 * 32 * ROW)
    assert opts.max_capacity == 32
    assert tier_kind(opts, _spec(), CUDA) == "device"
    part = _prepared(bucket_capacity=16, global_hbm_for_values=2 * 16 * ROW)
    assert tier_kind(part, _spec(), CUDA) == "hybrid"


def test_budget_below_one_bucket_is_rounded_up_with_a_warning() -> None:
    opts = _prepared(bucket_capacity=16, global_hbm_for_values=2 * 3 * ROW)
    with pytest.warns(UserWarning, match=r"table 't': local_hbm_for_values=60 bytes .*one bucket"):
        assert device_budget_bytes(opts, _spec()) == 16 * ROW
    # with MAX_BUCKET_CAPACITY one bucket is the whole shard: the table goes to the device
    whole = _prepared(bucket_capacity=MAX_BUCKET_CAPACITY, global_hbm_for_values=2 * ROW)
    with pytest.warns(UserWarning, match="rounded up to one bucket"):
        assert tier_kind(whole, _spec(), CUDA) == "device"


def test_cpu_table_with_no_budget_is_a_plain_table() -> None:
    opts = _prepared(bucket_capacity=16)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert tier_kind(opts, _spec(), torch.device("cpu")) == "device"


def test_init_capacity_above_max_capacity_is_clamped_at_planning() -> None:
    opts = DynamicEmbTableOptions(init_capacity=1000, max_capacity=10, bucket_capacity=16)
    assert prepare_table_options(opts, CONFIG, 2).init_capacity == 32


# -- through the planner and DMP --------------------------------------------------------------

SPLITS: List[Dict] = [
    {"bucket_capacity": 16},  # nothing on the device (hybrid: all host)
    {"bucket_capacity": 16, "global_hbm_for_values": 2 * 5 * ROW},  # under one bucket: rounded up
    {"bucket_capacity": 16, "global_hbm_for_values": 2 * 16 * ROW},  # part
    {"bucket_capacity": 16, "global_hbm_for_values": 2 * 32 * ROW},  # all
    {"bucket_capacity": MAX_BUCKET_CAPACITY, "global_hbm_for_values": 2 * 8 * ROW},
    {"bucket_capacity": MAX_BUCKET_CAPACITY},
    {"bucket_capacity": 16, "caching": True, "global_hbm_for_values": 2 * 16 * ROW},
]
# the storage each split builds on a CPU rank: device-resident and hybrid tables train in the
# module's group (a TableView); "hybrid" when some of its rows are in host memory, "cached" a
# cache over a host table (a CachedTableView)
KINDS = [
    "device",  # a CPU rank's device memory is its host memory
    "hybrid",  # rounded up to one bucket of the shard's two
    "hybrid",
    "device",
    "device",  # rounded up to one bucket, which is the whole shard
    "device",
    "cached",
]


def _kind(tier) -> str:
    if isinstance(tier, CachedTableView):
        return "cached"
    if isinstance(tier, TableView):
        return "hybrid" if tier.device_rows(0) < tier.capacity(0) else "device"
    return type(tier).__name__


def _train_every_split(rank: int, world: int) -> None:
    for options, kind in zip(SPLITS, KINDS):
        constraints = {
            "t": DynamicEmbParameterConstraints(
                use_dynamicemb=True, dynamicemb_options=DynamicEmbTableOptions(**options)
            )
        }
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # the rounding warning is tested above
            model = train_against_twin(
                rank, world, True, [CONFIG], constraints, "exact_row_wise_adagrad", HYPER, 3
            )
        ((kernel, t),) = dynamic_kernels(model).values()
        tier = kernel.emb_module.tables[t]
        got = _kind(tier)
        assert got == kind, f"{options}: built {got}, expected {kind}"


def test_every_split_plans_and_trains_like_the_twin() -> None:
    run_workers(_train_every_split)


def test_all_host_hybrid_table_trains_like_a_device_table(monkeypatch) -> None:
    """What a zero budget builds on CUDA (a hybrid table with no device rows), built here on CPU:
    trained side by side with a plain table, it stores the same rows."""
    import dynamicemb_core.lookup.batched_tables as batched
    from tests.storage.test_tiers import _module, _opts, _train_and_compare

    plain_kind = batched.tier_kind
    # on CPU a zero budget is a device table: ask for the hybrid kind CUDA would pick
    monkeypatch.setattr(batched, "tier_kind", lambda options, spec, device: "hybrid")
    tiered = _module("cpu", _opts(init_capacity=256, local_hbm_for_values=0))
    monkeypatch.setattr(batched, "tier_kind", plain_kind)
    storage = tiered.tables[0]
    assert isinstance(storage, TableView) and storage.device_rows(0) == 0
    _train_and_compare("cpu", tiered)
    assert storage.table.capacity(0) > 256  # grew, every row still on the host
    assert storage.device_rows(0) == 0
    assert storage.memory_usage(MemoryType.DEVICE) == 0
