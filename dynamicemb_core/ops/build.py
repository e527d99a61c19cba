"""``python -m dynamicemb_core build``: compile (or find in the cache) the ops library ahead of
time, so that the first training step does not pay for it (``python -m dynamicemb_core info``,
in dynamicemb_core/info.py, says where it is and whether it is built).
"""

from __future__ import annotations

import argparse
import time
from typing import List, Optional

from dynamicemb_core.ops import loader

__all__ = ["main"]


def main(argv: Optional[List[str]] = None) -> int:
    """Build and load the ops library; print its path and the time it took.

    Args:
        argv: command-line arguments after ``build`` (``-v`` shows the compiler commands, ``-q``
            prints nothing when the library was already built).

    Returns:
        0 on success (a build failure raises with the compiler's output).
    """
    parser = argparse.ArgumentParser(
        prog="python -m dynamicemb_core build",
        description="Compile csrc/ against the installed torch.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="show compiler commands")
    parser.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        help="print nothing when the library is already built (scripts/bootstrap.sh on reuse)",
    )
    args = parser.parse_args(argv)
    start = time.monotonic()
    prebuilt, _ = loader.find_prebuilt()
    cached = prebuilt is not None or loader.build_plan().library_path.is_file()
    path = loader.ensure_loaded(verbose=args.verbose)
    if not (args.quiet and cached):
        action = "found in the cache" if cached else "built"
        if prebuilt is not None:
            action = f"prebuilt in the wheel for {prebuilt.describe()}"
        print(f"dynamicemb ops library: {path} ({action}, {time.monotonic() - start:.1f} s)")
    return 0
