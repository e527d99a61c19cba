"""DynamicEmbeddingShardingPlanner: validation, the three preparation steps, and the plan it emits."""

from __future__ import annotations

import dataclasses
import math
from typing import Dict, List

import pytest
import torch
from torchrec.distributed.embedding_types import EmbeddingComputeKernel
from torchrec.distributed.types import ShardingType
from torchrec.modules.embedding_configs import EmbeddingBagConfig, EmbeddingConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection

from dynamicemb_core import (
    MAX_BUCKET_CAPACITY,
    DynamicEmbInitializerArgs,
    DynamicEmbInitializerMode,
    DynamicEmbTableOptions,
)
from dynamicemb_core.dynamicemb_config import complete_initializer_args
from dynamicemb_core.planner import (
    DynamicEmbeddingEnumerator,
    DynamicEmbeddingShardingPlanner,
    DynamicEmbParameterConstraints,
    DynamicEmbParameterSharding,
)
from dynamicemb_core.planner.planner import default_topology
from dynamicemb_core.shard import (
    DynamicEmbeddingBagCollectionSharder,
    DynamicEmbeddingCollectionSharder,
)

WORLD = 2


def _bag_configs() -> List[EmbeddingBagConfig]:
    return [
        EmbeddingBagConfig(name="dyn", embedding_dim=8, num_embeddings=1000, feature_names=["f0"]),
        EmbeddingBagConfig(name="native", embedding_dim=8, num_embeddings=64, feature_names=["f1"]),
    ]


def _constraints(**dyn_options) -> Dict[str, DynamicEmbParameterConstraints]:
    return {
        "dyn": DynamicEmbParameterConstraints(
            use_dynamicemb=True, dynamicemb_options=DynamicEmbTableOptions(**dyn_options)
        ),
        "native": DynamicEmbParameterConstraints(sharding_types=[ShardingType.TABLE_WISE.value]),
    }


def _planner(configs, constraints) -> DynamicEmbeddingShardingPlanner:
    return DynamicEmbeddingShardingPlanner(
        eb_configs=configs, topology=default_topology(WORLD, "cpu"), constraints=constraints
    )


# -- validation -----------------------------------------------------------------------------------


def test_constraint_for_unknown_table_raises_naming_it() -> None:
    constraints = _constraints()
    constraints["ghost"] = DynamicEmbParameterConstraints()
    with pytest.raises(ValueError, match=r"\['ghost'\].*not in eb_configs"):
        _planner(_bag_configs(), constraints)


def test_missing_constraint_raises_naming_table() -> None:
    constraints = _constraints()
    del constraints["native"]
    with pytest.raises(ValueError, match=r"no entry for table\(s\) \['native'\]"):
        _planner(_bag_configs(), constraints)


def test_repeated_config_name_raises() -> None:
    configs = _bag_configs() + [_bag_configs()[0]]
    with pytest.raises(ValueError, match=r"repeated: \['dyn'\]"):
        _planner(configs, _constraints())


def test_unknown_dist_type_raises_at_construction_and_at_planning() -> None:
    with pytest.raises(ValueError, match=r"dist_type must be one of .*got 'modulo'"):
        DynamicEmbTableOptions(dist_type="modulo")
    constraints = _constraints()
    constraints["dyn"].dynamicemb_options.dist_type = "modulo"  # set after construction
    with pytest.raises(ValueError, match=r"table 'dyn': dist_type must be one of .*got 'modulo'"):
        _planner(_bag_configs(), constraints)


def test_unaligned_bucket_capacity_raises_naming_table_and_value() -> None:
    constraints = _constraints()
    constraints["dyn"].dynamicemb_options.bucket_capacity = 100  # set after construction
    with pytest.raises(ValueError, match=r"table 'dyn'.*bucket_capacity.*got 100"):
        _planner(_bag_configs(), constraints)


def test_hbm_budget_smaller_than_one_bucket_is_planned_not_refused() -> None:
    # the seed rounds it up to one bucket when the table is built (tests/planner/test_budgets.py)
    constraints = _constraints(global_hbm_for_values=8000)
    _planner(_bag_configs(), constraints)
    assert constraints["dyn"].dynamicemb_options.local_hbm_for_values == 4000


def test_dim_disagreeing_with_config_is_overwritten_with_a_warning() -> None:
    constraints = _constraints(dim=4)
    with pytest.warns(
        UserWarning, match=r"table 'dyn': dynamicemb_options.dim=4 .*embedding_dim=8"
    ):
        _planner(_bag_configs(), constraints)
    assert constraints["dyn"].dynamicemb_options.dim == 8


def test_failed_validation_leaves_every_options_object_untouched() -> None:
    configs = _bag_configs() + [
        EmbeddingBagConfig(name="bad", embedding_dim=8, num_embeddings=10, feature_names=["f2"])
    ]
    constraints = _constraints()
    constraints["bad"] = DynamicEmbParameterConstraints(
        use_dynamicemb=True, dynamicemb_options=DynamicEmbTableOptions()
    )
    constraints["bad"].dynamicemb_options.dist_type = "nope"  # set after construction
    before = constraints["dyn"].dynamicemb_options
    with pytest.raises(ValueError, match="table 'bad'"):
        _planner(configs, constraints)
    assert constraints["dyn"].dynamicemb_options is before
    assert before.max_capacity is None


def test_no_topology_and_no_process_group_raises() -> None:
    with pytest.raises(ValueError, match="pass a topology"):
        DynamicEmbeddingShardingPlanner(eb_configs=_bag_configs(), constraints=_constraints())


# -- preparation ----------------------------------------------------------------------------------


def test_preparation_fills_initializer_layout_capacity_and_hbm_share() -> None:
    constraints = _constraints(init_capacity=100, global_hbm_for_values=100_001)
    _planner(_bag_configs(), constraints)
    opts = constraints["dyn"].dynamicemb_options
    bound = math.sqrt(1 / 1000)
    assert opts.initializer_args.lower == pytest.approx(-bound)
    assert opts.initializer_args.upper == pytest.approx(bound)
    assert (opts.bucket_capacity, opts.max_capacity) == (128, 512)  # ceil(1000/2)=500 -> 4 buckets
    assert opts.init_capacity == 128  # 100 aligned up to one bucket
    assert opts.local_hbm_for_values == 50_001  # ceil(100001 / 2)
    assert opts.dim == 8 and opts.embedding_dtype == torch.float32


def test_init_capacity_is_clamped_to_max_capacity() -> None:
    constraints = _constraints(init_capacity=400, max_capacity=None)
    configs = _bag_configs()
    configs[0] = EmbeddingBagConfig(
        name="dyn", embedding_dim=8, num_embeddings=300, feature_names=["f0"]
    )
    _planner(configs, constraints)
    opts = constraints["dyn"].dynamicemb_options
    assert opts.max_capacity == 256  # ceil(300/2)=150 -> 2 buckets of 128
    assert opts.init_capacity == 256  # 400 aligned = 512, clamped


def test_max_bucket_capacity_becomes_one_bucket_per_rank() -> None:
    constraints = _constraints(bucket_capacity=MAX_BUCKET_CAPACITY)
    _planner(_bag_configs(), constraints)
    opts = constraints["dyn"].dynamicemb_options
    assert opts.bucket_capacity == 512 and opts.max_capacity == 512  # 500 aligned to 16


def test_preparation_is_idempotent() -> None:
    constraints = _constraints(init_capacity=100, bucket_capacity=MAX_BUCKET_CAPACITY)
    _planner(_bag_configs(), constraints)
    first = constraints["dyn"].dynamicemb_options
    _planner(_bag_configs(), constraints)
    again = constraints["dyn"].dynamicemb_options
    # every field, not just the grouping key that == compares
    assert {f.name: getattr(again, f.name) for f in dataclasses.fields(again)} == {
        f.name: getattr(first, f.name) for f in dataclasses.fields(first)
    }


@pytest.mark.parametrize(
    "args,config,expected",
    [
        (DynamicEmbInitializerArgs(), None, (0.0, 1.0)),
        (DynamicEmbInitializerArgs(lower=-0.5), None, (-0.5, 1.0)),
        (DynamicEmbInitializerArgs(), "n=400", (-0.05, 0.05)),
    ],
)
def test_complete_initializer_args_fills_only_missing_uniform_bounds(
    args, config, expected
) -> None:
    cfg = (
        EmbeddingConfig(name="t", embedding_dim=4, num_embeddings=400, feature_names=["f"])
        if config
        else None
    )
    out = complete_initializer_args(args, cfg)
    assert (out.lower, out.upper) == pytest.approx(expected)
    assert args.lower in (None, -0.5) and args.upper is None  # input unchanged


def test_complete_initializer_args_leaves_other_modes_alone() -> None:
    args = DynamicEmbInitializerArgs(mode=DynamicEmbInitializerMode.NORMAL)
    assert complete_initializer_args(args) is args


def test_truncated_normal_bounds_default_to_the_tables_uniform_bounds() -> None:
    # the seed's initializer_args field: UNIFORM and TRUNCATED_NORMAL bounds default to ±1/sqrt(N)
    cfg = EmbeddingConfig(name="t", embedding_dim=4, num_embeddings=400, feature_names=["f"])
    args = DynamicEmbInitializerArgs(mode=DynamicEmbInitializerMode.TRUNCATED_NORMAL, std_dev=0.1)
    out = complete_initializer_args(args, cfg)
    assert (out.lower, out.upper) == pytest.approx((-0.05, 0.05))
    assert complete_initializer_args(args) is args  # no config: mean ± 2 std_dev at the table
    constraints = _constraints(initializer_args=args)
    _planner(_bag_configs(), constraints)
    planned = constraints["dyn"].dynamicemb_options.initializer_args
    assert (planned.lower, planned.upper) == pytest.approx((-math.sqrt(1e-3), math.sqrt(1e-3)))


# -- planning -------------------------------------------------------------------------------------


@pytest.mark.parametrize("dist_type", ["continuous", "roundrobin", "hash_roundrobin"])
def test_plan_marks_dynamic_table_row_wise_with_our_kernel(dist_type: str) -> None:
    ebc = EmbeddingBagCollection(tables=_bag_configs(), device=torch.device("meta"))
    constraints = _constraints(dist_type=dist_type)
    plan = _planner(_bag_configs(), constraints).plan(
        ebc, [DynamicEmbeddingBagCollectionSharder(fused_params={"optimizer": "exact_sgd"})]
    )
    dyn = plan.plan[""]["dyn"]
    assert isinstance(dyn, DynamicEmbParameterSharding)
    assert dyn.sharding_type == ShardingType.ROW_WISE.value
    assert dyn.compute_kernel == EmbeddingComputeKernel.CUSTOMIZED_KERNEL.value
    assert dyn.dist_type == dist_type
    assert dyn.dynamicemb_options is constraints["dyn"].dynamicemb_options
    assert dyn.ranks == [0, 1]
    native = plan.plan[""]["native"]
    assert not isinstance(native, DynamicEmbParameterSharding)
    assert native.sharding_type == ShardingType.TABLE_WISE.value


def test_enumerator_offers_dynamic_table_one_option_with_no_memory() -> None:
    configs = [
        EmbeddingConfig(name="dyn", embedding_dim=8, num_embeddings=10**9, feature_names=["f0"])
    ]
    constraints = {"dyn": DynamicEmbParameterConstraints(use_dynamicemb=True)}
    enumerator = DynamicEmbeddingEnumerator(default_topology(WORLD, "cpu"), constraints=constraints)
    ec = EmbeddingCollection(tables=configs, device=torch.device("meta"))
    options = enumerator.enumerate(ec, [DynamicEmbeddingCollectionSharder()])
    assert len(options) == 1
    assert options[0].sharding_type == ShardingType.ROW_WISE.value
    assert all(s.storage.hbm == 0 and s.storage.ddr == 0 for s in options[0].shards)
    # a billion-row dynamic table plans on a machine that could not hold it densely
    plan = DynamicEmbeddingShardingPlanner(
        configs, topology=default_topology(WORLD, "cpu"), constraints=constraints
    ).plan(ec, [DynamicEmbeddingCollectionSharder()])
    assert plan.plan[""]["dyn"].dynamicemb_options.max_capacity == 500_000_000


def test_each_constraint_gets_its_own_default_options() -> None:
    a, b = DynamicEmbParameterConstraints(), DynamicEmbParameterConstraints()
    assert a.dynamicemb_options is not b.dynamicemb_options
