"""The environment variables the table reads, each read in exactly one place.

``DYNAMICEMB_CSTM_SCORE_CHECK`` (seed API): "0" silences the warning :meth:`ScoredHashTable.set_score`
gives when a CUSTOMIZED score goes down. ``DEMB_DETERMINISM_MODE`` (seed API): when set, CUDA
inserts resolve equal-score victims and same-bucket races exactly as the CPU does; the CPU kernels
are deterministic always (they process each bucket's keys in input order).
"""

from __future__ import annotations

import os

__all__ = ["custom_score_check_enabled", "determinism_mode"]


def custom_score_check_enabled() -> bool:
    """False when ``DYNAMICEMB_CSTM_SCORE_CHECK=0`` (default: warn on a decreasing custom score)."""
    return os.environ.get("DYNAMICEMB_CSTM_SCORE_CHECK", "1").strip() != "0"


def determinism_mode() -> bool:
    """True when ``DEMB_DETERMINISM_MODE`` is set to anything but "", "0" or "false"."""
    value = os.environ.get("DEMB_DETERMINISM_MODE", "").strip().lower()
    return value not in ("", "0", "false")
