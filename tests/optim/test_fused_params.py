"""FBGEMM fused parameters the optimizer has no field for: done as FBGEMM does, or refused; never
dropped silently (issue 15 item 8)."""

from __future__ import annotations

import pytest
import torch
from fbgemm_gpu.split_embedding_configs import EmbOptimType, SparseType
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from dynamicemb_core.config import (
    DynamicEmbInitializerArgs,
    DynamicEmbInitializerMode,
    DynamicEmbPoolingMode,
    DynamicEmbTableOptions,
)
from dynamicemb_core.lookup import BatchedDynamicEmbeddingTables
from dynamicemb_core.planner import DynamicEmbParameterConstraints
from tests.shard.dist_harness import run_workers, shard_model


def _module(**kw):
    return BatchedDynamicEmbeddingTables(
        [
            DynamicEmbTableOptions(
                dim=4,
                max_capacity=64,
                bucket_capacity=16,
                initializer_args=DynamicEmbInitializerArgs(mode=DynamicEmbInitializerMode.DEBUG),
            )
        ],
        ["t"],
        [0],
        DynamicEmbPoolingMode.SUM,
        EmbOptimType.EXACT_SGD,
        torch.device("cpu"),
        learning_rate=0.1,
        **kw,
    )


def test_gradient_clipping_is_refused_with_a_clear_error():
    with pytest.raises(ValueError, match="gradient_clipping=True is not supported"):
        _module(gradient_clipping=True, max_gradient=0.5)


def test_fbgemm_defaults_are_accepted_as_the_update_they_describe():
    # FBGEMM without clipping reads no max_gradient; fp32 rows are never stochastically rounded
    _module(gradient_clipping=False, max_gradient=1.0, stochastic_rounding=True)


@pytest.mark.parametrize(
    "kw,match",
    [
        ({"max_gradient": -1.0}, "max_gradient must be a positive number"),
        ({"gradient_clipping": "yes"}, "gradient_clipping must be a bool"),
        ({"output_dtype": SparseType.INT8}, "output_dtype: dynamic tables produce"),
        ({"clip": 1.0}, "unknown hyper-parameter 'clip'"),
    ],
)
def test_bad_fused_parameters_are_named(kw, match):
    with pytest.raises(ValueError, match=match):
        _module(**kw)


@pytest.mark.parametrize("dtype", [SparseType.FP16, torch.bfloat16, "FP32"])
def test_output_dtype_is_the_output_dtype(dtype):
    ref = _module()
    m = _module(output_dtype=dtype)
    keys, offsets = torch.tensor([1, 2, 3, 1]), torch.tensor([0, 2, 4])
    want = ref(keys, offsets)
    got = m(keys, offsets)
    expected = {
        SparseType.FP16: torch.float16,
        torch.bfloat16: torch.bfloat16,
        "FP32": torch.float32,
    }
    assert got.dtype == expected[dtype]
    torch.testing.assert_close(got.float(), want, atol=1e-2, rtol=1e-2)
    got.float().sum().backward()  # the cast is differentiable: the rows train


CONFIG = EmbeddingBagConfig(name="t", embedding_dim=4, num_embeddings=32, feature_names=["f"])


def _constraints():
    return {
        "t": DynamicEmbParameterConstraints(
            use_dynamicemb=True, dynamicemb_options=DynamicEmbTableOptions(bucket_capacity=16)
        )
    }


def _through_the_sharder(rank: int, world: int) -> None:
    fused = {"optimizer": EmbOptimType.EXACT_SGD, "learning_rate": 0.1}
    with pytest.raises(ValueError, match="gradient_clipping=True is not supported"):
        shard_model(True, [CONFIG], _constraints(), {**fused, "gradient_clipping": True}, world)
    model = shard_model(
        True, [CONFIG], _constraints(), {**fused, "output_dtype": SparseType.FP16}, world
    )
    kjt = KeyedJaggedTensor(keys=["f"], values=torch.arange(8) + rank, lengths=torch.full((4,), 2))
    out = model(kjt)
    assert out.dtype == torch.float16
    out.float().sum().backward()


def test_sharder_fused_params_refuse_clipping_and_honour_output_dtype():
    run_workers(_through_the_sharder)
