"""The ``--small`` option every ``bench_*.py`` shares: one preset of tiny sizes, applied one way.

``nox -s bench`` runs each benchmark with ``--small`` to check that it still works end to end; the
figures it prints are not measurements. A preset only replaces options the caller left at their
defaults, so ``--small --dim 64`` keeps dim 64.
"""

from __future__ import annotations

import argparse
from typing import Any, Dict


def add_small_flag(parser: argparse.ArgumentParser) -> None:
    """Add ``--small`` to ``parser`` (the flag `nox -s bench` looks for)."""
    parser.add_argument(
        "--small",
        action="store_true",
        help="tiny sizes and one or two repeats: a smoke run in seconds, not a measurement",
    )


def apply_small(
    parser: argparse.ArgumentParser, args: argparse.Namespace, preset: Dict[str, Any]
) -> argparse.Namespace:
    """With ``args.small``, set each ``preset`` option that is still at its default; return ``args``.

    Raises:
        KeyError: when ``preset`` names an option ``parser`` does not define (a stale preset).
    """
    if not args.small:
        return args
    for name, value in preset.items():
        if not hasattr(args, name):
            raise KeyError(f"--small preset: the parser has no option {name!r}")
        if getattr(args, name) == parser.get_default(name):
            setattr(args, name, value)
    return args
