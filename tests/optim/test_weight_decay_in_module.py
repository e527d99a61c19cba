"""Row-wise Adagrad's and Adam's weight decay through the module, over several steps, against the
composed reference (FBGEMM's CPU build ignores these, see tests/lookup/test_against_fbgemm.py)."""

from __future__ import annotations

import pytest
import torch
from fbgemm_gpu.split_embedding_configs import EmbOptimType

try:  # fbgemm-gpu >= 1.8
    from fbgemm_gpu.tbe.config.optimizer_config import WeightDecayMode
except ImportError:  # fbgemm-gpu 1.6 (the GPU machine's CUDA build)
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import WeightDecayMode

from dynamicemb_core.config import DynamicEmbPoolingMode
from tests.lookup import oracle
from tests.optim import row_reference as ref

D, LR, EPS, WD = 4, 0.3, 1e-6, 0.05


def _module(device, optimizer, **kw):
    opts = oracle.debug_options(D, max_capacity=64, bucket_capacity=64)
    return oracle.one_table_module(
        opts,
        device,
        optimizer,
        DynamicEmbPoolingMode.NONE,
        learning_rate=LR,
        eps=EPS,
        weight_decay=WD,
        **kw,
    )


def _steps(m, device):
    keys = torch.tensor([3, 5, 3], device=device)
    g = torch.tensor(
        [[1.0, -2.0, 0.5, 3.0], [0.1, 0.2, 0.3, 0.4], [2.0, 1.0, -1.0, 0.0]], device=device
    )
    for _ in range(3):
        (m(keys, torch.tensor([0, 3], device=device)) * g).sum().backward()
    # key 3's gradient is the sum of its two occurrences, key 5's its one
    return torch.stack([g[0] + g[2], g[1]]).cpu()


@pytest.mark.parametrize(
    "mode", [WeightDecayMode.L2, WeightDecayMode.DECOUPLE], ids=lambda x: x.name
)
def test_rowwise_adagrad_weight_decay_matches_reference(device, mode):
    m = _module(device, EmbOptimType.EXACT_ROWWISE_ADAGRAD, weight_decay_mode=mode)
    grads = _steps(m, device)
    w, acc = torch.tensor([[3.0] * D, [5.0] * D]), torch.zeros(2)
    for _ in range(3):
        w, acc = ref.rowwise_adagrad(w, acc, grads, LR, EPS, WD, int(mode.value))
    _, rows, _ = m.tables[0].find(0, torch.tensor([3, 5], device=device))
    torch.testing.assert_close(rows[:, :D].cpu(), w)
    torch.testing.assert_close(rows[:, D].cpu(), acc)


def test_adam_weight_decay_and_global_step_match_reference(device):
    m = _module(device, EmbOptimType.ADAM)
    grads = _steps(m, device)
    w = torch.tensor([[3.0] * D, [5.0] * D])
    mom, var = torch.zeros(2, D), torch.zeros(2, D)
    for step in (1, 2, 3):
        w, mom, var = ref.adam(w, mom, var, grads, LR, EPS, 0.9, 0.999, WD, step)
    _, rows, _ = m.tables[0].find(0, torch.tensor([3, 5], device=device))
    torch.testing.assert_close(rows[:, :D].cpu(), w)
    torch.testing.assert_close(rows[:, D : 2 * D].cpu(), mom)
    assert m.step == 3
