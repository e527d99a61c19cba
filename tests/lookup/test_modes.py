"""Training vs eval, training=False tables, initializers, safe_check_mode and bad input."""

from __future__ import annotations

import warnings

import pytest
import torch
from fbgemm_gpu.split_embedding_configs import EmbOptimType

from dynamicemb_core.config import (
    DynamicEmbCheckMode,
    DynamicEmbInitializerArgs,
    DynamicEmbInitializerMode,
    DynamicEmbPoolingMode,
    DynamicEmbTableOptions,
)
from dynamicemb_core.lookup import BatchedDynamicEmbeddingTables
from dynamicemb_core.lookup.initializers import DEBUG_MODULUS, initialize_embeddings
from dynamicemb_core.types import DynamicEmbError, DynamicEmbWarning
from tests.lookup import oracle

SEQ = DynamicEmbPoolingMode.NONE


def _module(device, opts, pooling=SEQ, optimizer=EmbOptimType.EXACT_SGD, **kw):
    return BatchedDynamicEmbeddingTables(
        opts,
        [f"t{i}" for i in range(len(opts))],
        list(range(len(opts))),
        pooling,
        optimizer,
        device,
        learning_rate=0.1,
        **kw,
    )


def _debug(**kw):
    return DynamicEmbTableOptions(
        dim=4,
        max_capacity=256,
        bucket_capacity=128,
        initializer_args=DynamicEmbInitializerArgs(mode=DynamicEmbInitializerMode.DEBUG),
        **oracle.device_resident(kw),
    )


def _seq(keys, device):
    keys = torch.tensor(keys, dtype=torch.int64, device=device)
    return keys, torch.tensor([0, keys.numel()], dtype=torch.int64, device=device)


def test_training_inserts_new_keys_with_initializer(device):
    m = _module(device, [_debug()])
    out = m(*_seq([7, 123456, 7], device))
    torch.testing.assert_close(out[:, 0].cpu(), torch.tensor([7.0, 123456 % DEBUG_MODULUS, 7.0]))
    assert m.tables[0].size(0) == 2


def test_eval_reads_missing_keys_as_eval_initializer_without_inserting(device):
    opts = _debug(
        eval_initializer_args=DynamicEmbInitializerArgs(
            mode=DynamicEmbInitializerMode.CONSTANT, value=2.5
        )
    )
    m = _module(device, [opts])
    m(*_seq([1], device))  # trains key 1 in
    m.eval()
    out = m(*_seq([1, 99], device))
    assert out[0, 0].item() == 1.0  # stored row (DEBUG value of key 1)
    assert torch.all(out[1] == 2.5)
    assert m.tables[0].size(0) == 1
    out.sum().backward()  # eval backward applies nothing
    m.train()
    assert m(*_seq([1], device))[0, 0].item() == 1.0


def test_eval_default_reads_missing_keys_as_zeros(device):
    m = _module(device, [_debug()])
    m.eval()
    assert torch.all(m(*_seq([5, 6], device)) == 0)


def test_table_with_training_false_holds_no_state_and_does_not_insert(device):
    m = _module(device, [_debug(training=False)], optimizer=EmbOptimType.ADAM)
    assert m.tables[0].tables[0].row_width == 4
    out = m(*_seq([3], device))
    assert torch.all(out == 0)
    assert m.tables[0].size(0) == 0


def test_backward_updates_only_rows_of_the_batch(device):
    m = _module(device, [_debug()])
    m(*_seq([1, 2], device)).sum().backward()
    m(*_seq([1], device)).sum().backward()
    _, rows, _ = m.tables[0].find(0, torch.tensor([1, 2], device=device))
    torch.testing.assert_close(rows[:, 0].cpu(), torch.tensor([1.0 - 0.2, 2.0 - 0.1]))


@pytest.mark.parametrize(
    "mode",
    [
        DynamicEmbInitializerMode.UNIFORM,
        DynamicEmbInitializerMode.NORMAL,
        DynamicEmbInitializerMode.TRUNCATED_NORMAL,
    ],
)
def test_random_initializers_follow_their_distribution(device, mode):
    args = DynamicEmbInitializerArgs(mode=mode, mean=1.0, std_dev=0.5, lower=-0.2, upper=0.6)
    torch.manual_seed(0)
    rows = initialize_embeddings(args, torch.arange(20000, device=device), 8).cpu()
    if mode is DynamicEmbInitializerMode.UNIFORM:
        assert rows.min() >= -0.2 and rows.max() < 0.6
        assert abs(rows.mean().item() - 0.2) < 0.01
    elif mode is DynamicEmbInitializerMode.NORMAL:
        assert abs(rows.mean().item() - 1.0) < 0.01 and abs(rows.std().item() - 0.5) < 0.01
    else:
        assert rows.min() >= -0.2 and rows.max() <= 0.6
        # N(1, 0.5) restricted to [-0.2, 0.6] piles up toward the upper bound
        assert rows.mean().item() > 0.25


def test_constant_initializer(device):
    args = DynamicEmbInitializerArgs(mode=DynamicEmbInitializerMode.CONSTANT, value=-3.0)
    assert torch.all(initialize_embeddings(args, torch.arange(5, device=device), 3) == -3.0)


def _full_bucket_module(device, mode):
    # One bucket of 16 slots: a batch of 20 distinct keys cannot all be placed.
    opts = DynamicEmbTableOptions(dim=4, max_capacity=16, bucket_capacity=16, safe_check_mode=mode)
    return _module(device, [opts])


def test_safe_check_error_raises_naming_the_table(device):
    m = _full_bucket_module(device, DynamicEmbCheckMode.ERROR)
    with pytest.raises(DynamicEmbError, match=r"table 't0': 4 key\(s\)"):
        m(*_seq(list(range(20)), device))


def test_safe_check_warning_warns_and_still_returns(device):
    m = _full_bucket_module(device, DynamicEmbCheckMode.WARNING)
    with pytest.warns(DynamicEmbWarning, match="could not be inserted"):
        out = m(*_seq(list(range(20)), device))
    assert out.shape == (20, 4)


def test_safe_check_ignore_warns_once_then_is_silent(device):
    m = _full_bucket_module(device, DynamicEmbCheckMode.IGNORE)
    with pytest.warns(DynamicEmbWarning, match="given once per table"):
        m(*_seq(list(range(20)), device)).sum().backward()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        m(*_seq(list(range(20)), device)).sum().backward()
    assert m.metrics()["t0"]["unplaced"] == 8


# ---- bad input ---------------------------------------------------------------------------------
def test_int32_indices_are_rejected(device):
    m = _module(device, [_debug()])
    keys, offsets = _seq([1, 2], device)
    with pytest.raises(TypeError, match="indices must be int64"):
        m(keys.int(), offsets)


def test_offsets_that_do_not_match_are_rejected(device):
    m = _module(device, [_debug()])
    keys, _ = _seq([1, 2], device)
    with pytest.raises(ValueError, match="end at len\\(indices\\)=2"):
        m(keys, torch.tensor([0, 3], device=device))
    m2 = _module(device, [_debug(), _debug()])
    with pytest.raises(ValueError, match="F\\*B\\+1 elements with F=2"):
        m2(keys, torch.tensor([0, 1, 1, 2], device=device))


def test_decreasing_offsets_are_rejected_before_any_lookup(device):
    """The module checks the whole batch's offsets once; its ops then run unchecked."""
    m = _module(device, [_debug()])
    keys = torch.tensor([1, 2, 3], dtype=torch.int64, device=device)
    offsets = torch.tensor([0, 2, 1, 3], dtype=torch.int64, device=device)
    with pytest.raises(ValueError, match=r"non-decreasing, got offsets\[1\]=2 > offsets\[2\]=1"):
        m(keys, offsets)
    assert m.table_stats()[0]["size"] == 0  # nothing was inserted


def test_indices_on_wrong_device_are_rejected():
    m = _module("cpu", [_debug()])
    keys, offsets = _seq([1], "cpu")
    with pytest.raises(ValueError, match="offsets must be on cpu, got meta"):
        m(keys, offsets.to("meta"))


def test_feature_mapped_to_no_table_is_rejected():
    with pytest.raises(ValueError, match="feature 1 maps to table 3"):
        BatchedDynamicEmbeddingTables(
            [_debug()], ["t0"], [0, 3], SEQ, EmbOptimType.EXACT_SGD, "cpu"
        )


def test_unsupported_optimizer_is_rejected():
    with pytest.raises(ValueError, match="LAMB"):
        _module("cpu", [_debug()], optimizer=EmbOptimType.LAMB)


def test_unknown_hyper_parameter_is_rejected():
    with pytest.raises(ValueError, match="unknown hyper-parameter 'beta3'"):
        _module("cpu", [_debug()], optimizer=EmbOptimType.ADAM, beta3=0.1)


def test_missing_dim_and_capacity_are_rejected_naming_the_table():
    with pytest.raises(ValueError, match="table 't0': dim must be"):
        _module("cpu", [DynamicEmbTableOptions(max_capacity=16)])
    with pytest.raises(ValueError, match="table 't0': max_capacity must be set"):
        _module("cpu", [DynamicEmbTableOptions(dim=4)])


def test_sequence_mode_with_mixed_dims_is_rejected():
    opts = [_debug(), DynamicEmbTableOptions(dim=8, max_capacity=256)]
    with pytest.raises(ValueError, match="one embedding dim for all tables"):
        _module("cpu", opts)


def test_per_sample_weights_rejected_outside_sum(device):
    m = _module(device, [_debug()], pooling=DynamicEmbPoolingMode.MEAN)
    keys, offsets = _seq([1], device)
    with pytest.raises(ValueError, match="only supported with DynamicEmbPoolingMode.SUM"):
        m(keys, offsets, torch.ones(1, device=device))


def test_output_dtype_half_trains(device):
    opts = DynamicEmbTableOptions(
        dim=4,
        max_capacity=64,
        initializer_args=DynamicEmbInitializerArgs(mode=DynamicEmbInitializerMode.DEBUG),
    )
    m = BatchedDynamicEmbeddingTables(
        [opts],
        ["t"],
        [0],
        DynamicEmbPoolingMode.SUM,
        EmbOptimType.EXACT_SGD,
        device,
        output_dtype=torch.float16,
        learning_rate=0.5,
    )
    keys, offsets = _seq([2, 2], device)
    out = m(keys, offsets)
    assert out.dtype == torch.float16 and out[0, 0].item() == 4.0
    out.float().sum().backward()
    _, rows, _ = m.tables[0].find(0, keys[:1])
    assert rows[0, 0].item() == 2.0 - 0.5 * 2  # two occurrences: gradient 2
    assert m.optimizer_kind.name == "SGD"


def test_training_is_deterministic(device):
    def run() -> torch.Tensor:
        torch.manual_seed(7)
        opts = [DynamicEmbTableOptions(dim=8, max_capacity=256, bucket_capacity=128)] * 2
        m = BatchedDynamicEmbeddingTables(
            opts,
            ["a", "b"],
            [0, 1, 1],
            DynamicEmbPoolingMode.SUM,
            EmbOptimType.ADAM,
            device,
            learning_rate=0.1,
        )
        g = torch.Generator().manual_seed(0)
        for _ in range(3):
            keys = torch.randint(0, 50, (60,), generator=g).to(device)
            offsets = torch.arange(0, 61, 5).to(device)
            (m(keys, offsets) ** 2).sum().backward()
        return m.tables[1].find(0, torch.arange(50, device=device))[1]

    assert torch.equal(run(), run())
