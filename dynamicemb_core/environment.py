"""The environment variables the table and its ops read, each read in exactly one place.

``DYNAMICEMB_CSTM_SCORE_CHECK`` (seed API): "0" silences the warning :meth:`ScoredHashTable.set_score`
gives when a CUSTOMIZED score goes down. ``DEMB_DETERMINISM_MODE`` (seed API): set (to anything
but "", "0" or "false"), CUDA inserts run the bucket-ordered engine, slot-for-slot the CPU kernels'
result and bit-identical on replay; unset (the default, as upstream, where determinism is off by
default), "0" or "false" selects the key-parallel engine, whose choice of which new key takes which
free or evicted slot of a bucket (and, in an oversubscribed bucket, which new keys get in) depends
on the schedule. The CPU kernels are deterministic always. A ScoredHashTable reads it once, when it
is built (docs/table_design.md, "CUDA insert engines").
"""

from __future__ import annotations

import os

__all__ = ["custom_score_check_enabled", "determinism_mode"]


def custom_score_check_enabled() -> bool:
    """False when ``DYNAMICEMB_CSTM_SCORE_CHECK=0`` (default: warn on a decreasing custom score)."""
    return os.environ.get("DYNAMICEMB_CSTM_SCORE_CHECK", "1").strip() != "0"


def determinism_mode() -> bool:
    """True when ``DEMB_DETERMINISM_MODE`` is set to anything but "", "0" or "false": CUDA inserts
    then run the deterministic engine. Unset, the key-parallel engine runs (docs/table_design.md)."""
    value = os.environ.get("DEMB_DETERMINISM_MODE", "").strip().lower()
    return value not in ("", "0", "false")
