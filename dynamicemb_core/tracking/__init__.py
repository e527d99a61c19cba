"""Delta tracking for dynamic tables: which raw keys (and embeddings) changed since a consumer last read.

:class:`DynamicEmbDeltaTracker` follows TorchRec's ModelDeltaTracker API and semantics; the enums and
``DeltaTrackerConfig`` are TorchRec's own, re-exported here.
"""

from dynamicemb_core.tracking.delta_tracker import DynamicEmbDeltaTracker
from dynamicemb_core.tracking.types import DeltaTrackerConfig, TrackingMode, UniqueRows, UpdateMode

__all__ = [
    "DeltaTrackerConfig",
    "DynamicEmbDeltaTracker",
    "TrackingMode",
    "UniqueRows",
    "UpdateMode",
]
