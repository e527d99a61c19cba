"""The batched module's (indices, offsets) checks name the feature and sample of a bad bag."""

from __future__ import annotations

import pytest
import torch

from dynamicemb_core.lookup.features import check_bag_lengths, validate_inputs


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
