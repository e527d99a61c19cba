"""The batched module's (indices, offsets) checks name the feature and sample of a bad bag."""

from __future__ import annotations

import pytest
import torch

from dynamicemb_core.lookup.features import (
    OffsetsCheck,
    check_bag_lengths,
    validate_batch,
    validate_inputs,
)


def test_decreasing_offsets_name_the_feature_and_sample() -> None:
    indices = torch.arange(6)
    offsets = torch.tensor([0, 1, 2, 4, 3, 6])  # F=5 features of B=1 sample
    with pytest.raises(ValueError, match=r"offsets\[3\]=4 > offsets\[4\]=3 \(feature 3 sample 0\)"):
        validate_inputs(indices, offsets, None, 5, torch.device("cpu"), True)
    offsets = torch.tensor([0, 2, 1, 3, 4, 6])  # F=1 feature of B=5 samples
    with pytest.raises(ValueError, match=r"\(feature 0 sample 1\)"):
        validate_inputs(indices, offsets, None, 1, torch.device("cpu"), True)


def test_bag_lengths_rule() -> None:
    check_bag_lengths(torch.tensor([1, 0, 2, 3]), 6, 2, "here", ["x", "y"])
    with pytest.raises(ValueError, match=r"here: feature 'y' sample 0 has length -2"):
        check_bag_lengths(torch.tensor([1, 0, -2, 3]), 2, 2, "here", ["x", "y"])
    with pytest.raises(
        ValueError, match=r"lengths sum to 6 but there are 5 values.*'x': 1, 'y': 5"
    ):
        check_bag_lengths(torch.tensor([1, 0, 2, 3]), 5, 2, "here", ["x", "y"])
    with pytest.raises(ValueError, match="no bags but 3 values"):
        check_bag_lengths(torch.tensor([], dtype=torch.int64), 3, 2, "here")


def test_offsets_check_raises_at_verify(device) -> None:
    """The offsets' values are checked by ``verify``, on every device (after the lookup's dedup,
    whose ``bag_unique`` op counts the check's numbers: no synchronisation of its own on
    CUDA, no torch ops of its own on the CPU); ``validate_batch`` checks only what the host
    knows."""
    indices = torch.arange(6, device=device)
    device = indices.device  # "cuda" -> "cuda:0": the module compares its own, indexed device
    offsets = torch.tensor([0, 1, 2, 4, 3, 6], device=device)
    bad = r"offsets\[3\]=4 > offsets\[4\]=3 \(feature 3 sample 0\)"
    batch, check = validate_batch(indices, offsets, None, 5, device, True)
    assert batch == 1
    with pytest.raises(ValueError, match=bad):
        check.verify()
    check.verify()  # checked once: a second call returns
    ends = torch.tensor([0, 1, 2, 3, 4, 7], device=device)
    _, check = validate_batch(indices, ends, None, 5, device, True)
    with pytest.raises(ValueError, match=r"end at len\(indices\)=6, got first=0, last=7"):
        check.verify()
    _, check = validate_batch(
        indices, torch.tensor([0, 1, 2, 3, 4, 6], device=device), None, 5, device, True
    )
    check.verify()


def test_offsets_check_reads_its_flags_once() -> None:
    """An OffsetsCheck made on any device verifies the same rule (here on the CPU)."""
    check = OffsetsCheck(torch.tensor([1, 2, 3]), 3, 1)
    with pytest.raises(ValueError, match="start at 0 and end at len\\(indices\\)=3, got first=1"):
        check.verify()
    check.verify()
    OffsetsCheck(torch.tensor([0, 2, 2, 3]), 3, 3).verify()


def test_offsets_check_given_numbers_decide_as_its_own() -> None:
    """Numbers read back by the caller (``give``: the grouped lookup's unique readback on CUDA)
    decide as the check's own would: the same errors, once."""
    bad_start = OffsetsCheck(torch.tensor([1, 2, 3]), 3, 1)
    bad_start.give([1, 3, 0])
    with pytest.raises(ValueError, match="start at 0 and end at len\\(indices\\)=3, got first=1"):
        bad_start.verify()
    bad_start.verify()
    decreasing = OffsetsCheck(torch.tensor([0, 2, 1, 3]), 3, 1)
    decreasing.give([0, 3, 1])
    with pytest.raises(ValueError, match="offsets\\[1\\]=2 > offsets\\[2\\]=1"):
        decreasing.verify()
    good = OffsetsCheck(torch.tensor([0, 2, 2, 3]), 3, 3)
    good.give([0, 3, 0])
    good.verify()


def test_kjt_lengths_that_do_not_fit_features_by_batch_are_named() -> None:
    """Issue 28 item 10: 3 lengths for 2 features x batch 1 raised TorchRec's bare
    ``shape '[2, 1]' is invalid for input of size 3``; the lookup's entry names the problem (a shape
    check: no readback)."""
    from types import SimpleNamespace

    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    from dynamicemb_core.inference.collection import InferenceEmbeddingBagCollection
    from dynamicemb_core.lookup.features import check_kjt, check_kjt_shape

    bad = KeyedJaggedTensor(
        keys=["a", "b"], values=torch.tensor([1, 2, 3]), lengths=torch.tensor([1, 1, 1])
    )
    message = r"3 lengths, but its 2 features \['a', 'b'\] x batch size 1 need 2"
    for check in (check_kjt_shape, check_kjt):
        with pytest.raises(ValueError, match=r"where: KeyedJaggedTensor has " + message):
            check(bad, "where")
    served = SimpleNamespace(feature_names=["a", "b"])
    with pytest.raises(ValueError, match=message):
        InferenceEmbeddingBagCollection._kjt_tensors(served, bad)
    good = KeyedJaggedTensor(
        keys=["a", "b"], values=torch.tensor([1, 2, 3]), lengths=torch.tensor([1, 0, 1, 1])
    )
    check_kjt(good, "where")
    variable = KeyedJaggedTensor(
        keys=["a", "b"],
        values=torch.tensor([1, 2, 3]),
        lengths=torch.tensor([1, 1, 1]),
        stride_per_key_per_rank=[[1], [1]],
    )
    with pytest.raises(ValueError, match=r"per-feature batch sizes \[1, 1\] need 2"):
        check_kjt_shape(variable, "where")
