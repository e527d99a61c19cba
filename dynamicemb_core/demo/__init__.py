"""``python -m dynamicemb_core demo``: the README's first command.

For now it runs the table demo (:mod:`dynamicemb_core.demo.table_demo`); the training demo replaces
it here later and keeps this entry point.
"""

from __future__ import annotations

from typing import List, Optional

__all__ = ["main"]


def main(argv: Optional[List[str]] = None) -> int:
    """Run the demo with command-line arguments ``argv``; return the process exit code."""
    from dynamicemb_core.demo.table_demo import main as table_demo_main

    return table_demo_main(argv)
