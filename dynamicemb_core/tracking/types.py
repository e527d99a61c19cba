"""Tracker enums and result type: TorchRec's own where the installed torchrec has them.

Using TorchRec's ``TrackingMode``, ``UpdateMode``, ``UniqueRows`` and ``DeltaTrackerConfig`` lets a
config written for TorchRec's ModelDeltaTracker drive the dynamic-table tracker unchanged. torchrec
1.6 - 1.9 all ship them; the fallbacks below only keep ``import dynamicemb_core.tracking`` working
without torchrec.
"""

from __future__ import annotations

try:  # torchrec >= 1.5
    from torchrec.distributed.model_tracker.types import (
        DeltaTrackerConfig,
        TrackingMode,
        UniqueRows,
        UpdateMode,
    )
except ImportError:  # pragma: no cover - exercised only without torchrec
    import enum
    from dataclasses import dataclass, field
    from typing import List, Optional

    import torch

    class TrackingMode(enum.Enum):  # type: ignore[no-redef]
        """What the tracker records with each id."""

        ID_ONLY = "id_only"  # ids only
        EMBEDDING = "embedding"  # ids and their embedding rows as first looked up

    class UpdateMode(enum.Enum):  # type: ignore[no-redef]
        """Which state is kept for an id seen in several batches."""

        NONE = "none"  # no state
        FIRST = "first"  # the earliest
        LAST = "last"  # the latest

    @dataclass
    class UniqueRows:  # type: ignore[no-redef]
        """Unique ids and, per id, one state row."""

        ids: torch.Tensor
        states: Optional[torch.Tensor]

    @dataclass
    class DeltaTrackerConfig:  # type: ignore[no-redef]
        """Tracker settings, as TorchRec names them."""

        tracking_mode: TrackingMode = TrackingMode.ID_ONLY
        consumers: Optional[List[str]] = None
        delete_on_read: bool = True
        auto_compact: bool = False
        fqns_to_skip: List[str] = field(default_factory=list)


__all__ = ["DeltaTrackerConfig", "TrackingMode", "UniqueRows", "UpdateMode"]
