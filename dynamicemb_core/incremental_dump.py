"""``dynamicemb_core.incremental_dump``: the seed API's import path for incremental dump and replay.

Code written against NVIDIA DynamicEmb's ``dynamicemb.incremental_dump`` ports by renaming the package.
This module holds no logic; everything lives in :mod:`dynamicemb_core.checkpoint`.
"""

from dynamicemb_core.checkpoint.delta import get_score, incremental_dump, set_score
from dynamicemb_core.checkpoint.delta_file import load_deltas, save_deltas
from dynamicemb_core.checkpoint.evicted import erase
from dynamicemb_core.checkpoint.replay import replay_increment
from dynamicemb_core.checkpoint.types import DeltaDumpResult, ReplayContent

__all__ = [
    "DeltaDumpResult",
    "ReplayContent",
    "erase",
    "get_score",
    "incremental_dump",
    "load_deltas",
    "replay_increment",
    "save_deltas",
    "set_score",
]
