"""Moves that must be refused, and leave the destination's rows as they were (design/row-ledger.md).

Two tables of one shape (``t0``, ``t1``: a file of one fits the other), a dump of a trained model, and
a destination that already holds rows of its own. A dump with one file swapped, renamed or taken from
another model's dump must be refused by ``DynamicEmbLoad`` (the destination's ledger unchanged) and by
``from_dump`` (no collection built).
"""

from __future__ import annotations

import os
import shutil
from typing import Callable, List

import pytest
import torch

from dynamicemb_core.checkpoint import DynamicEmbDump, DynamicEmbLoad
from dynamicemb_core.checkpoint.errors import CheckpointError
from dynamicemb_core.testing import row_ledger as RL
from tests.checkpoint.helpers import make_model


def _model(seed: int):
    """Both tables hold the same keys (so their files have one size) with rows of their own; every
    seed gives the same keys and other rows."""
    torch.manual_seed(seed)
    model = make_model(dims=(4, 4))
    gen = torch.Generator().manual_seed(0)
    model.train()
    for _ in range(3):
        keys = torch.randint(0, 200, (8,), generator=gen)
        out = model(torch.cat([keys, keys]), torch.arange(17))
        out.square().sum().backward()
    return model


def _shard(folder: str, table: str) -> str:
    (name,) = [
        f for f in os.listdir(os.path.join(folder, "model.ebc")) if f.startswith(table + ".")
    ]
    return os.path.join(folder, "model.ebc", name)


def _swap(folder: str, other: str) -> None:
    a, b = _shard(folder, "t0"), _shard(folder, "t1")
    tmp = a + ".swap"
    os.rename(a, tmp)
    os.rename(b, a)
    os.rename(tmp, b)


def _rename(folder: str, other: str) -> None:
    """t1's file under t0's name (t0's own file gone)."""
    a, b = _shard(folder, "t0"), _shard(folder, "t1")
    os.unlink(a)
    shutil.copyfile(b, a)


def _foreign(folder: str, other: str) -> None:
    """t0's file from another model's dump of the same tables."""
    shutil.copyfile(_shard(other, "t0"), _shard(folder, "t0"))


TAMPER: List[Callable[[str, str], None]] = [_swap, _rename, _foreign]


@pytest.mark.parametrize("tamper", TAMPER, ids=[t.__name__.strip("_") for t in TAMPER])
def test_a_tampered_dump_is_refused_and_changes_nothing(tmp_path, tamper) -> None:
    from torchrec.modules.embedding_configs import EmbeddingBagConfig

    from dynamicemb_core.inference import InferenceEmbeddingBagCollection
    from tests.checkpoint.helpers import table_options

    folder, other = str(tmp_path / "dump"), str(tmp_path / "other")
    DynamicEmbDump(folder, _model(0), optim=True)
    DynamicEmbDump(other, _model(1), optim=True)
    tamper(folder, other)
    destination = _model(2)
    RL.check_refused(
        lambda: DynamicEmbLoad(folder, destination, optim=True),
        lambda: RL.ledger_of_model(destination),
        (CheckpointError,),
        what=f"DynamicEmbLoad of a dump with {tamper.__name__.strip('_')}",
    )
    configs = [
        EmbeddingBagConfig(name=t, embedding_dim=4, num_embeddings=1000, feature_names=[t])
        for t in ("t0", "t1")
    ]
    options = {t: table_options(4) for t in ("t0", "t1")}
    with pytest.raises(CheckpointError):
        InferenceEmbeddingBagCollection.from_dump(folder, configs, options)
