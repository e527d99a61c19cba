"""``python -m dynamicemb_core demo``: the README's first command, the training demo.

It trains a small DLRM whose tables are dynamic, built through the planner and
DistributedModelParallel (:mod:`dynamicemb_core.demo.training_demo`). The table-only demo stays
available as ``python -m dynamicemb_core table-demo``.
"""

from __future__ import annotations

from typing import List, Optional

__all__ = ["main"]


def main(argv: Optional[List[str]] = None) -> int:
    """Run the training demo with command-line arguments ``argv``; return the process exit code."""
    from dynamicemb_core.demo.training_demo import main as training_demo_main

    return training_demo_main(argv)
