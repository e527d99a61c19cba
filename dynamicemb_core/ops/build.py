"""``python -m dynamicemb_core build`` and ``python -m dynamicemb_core info``.

``build`` compiles (or finds in the cache) the ops library ahead of time, so that the first training
step does not pay for it; ``info`` prints the versions, the device and where the library lives.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from typing import List, Optional

import torch

from dynamicemb_core.ops import loader

__all__ = ["info_main", "main"]


def main(argv: Optional[List[str]] = None) -> int:
    """Build and load the ops library; print its path and the time it took.

    Args:
        argv: command-line arguments after ``build`` (``-v`` shows the compiler commands).

    Returns:
        0 on success (a build failure raises with the compiler's output).
    """
    parser = argparse.ArgumentParser(
        prog="python -m dynamicemb_core build",
        description="Compile csrc/ against the installed torch.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="show compiler commands")
    args = parser.parse_args(argv)
    start = time.monotonic()
    path = loader.ensure_loaded(verbose=args.verbose)
    print(f"dynamicemb ops library: {path} ({time.monotonic() - start:.1f} s)")
    return 0


def info_main(argv: Optional[List[str]] = None) -> int:
    """Print versions, devices, the build key and whether the library is already built.

    Args:
        argv: command-line arguments after ``info`` (none are accepted).

    Returns:
        0.
    """
    argparse.ArgumentParser(prog="python -m dynamicemb_core info").parse_args(argv)
    import dynamicemb_core

    plan = loader.build_plan()
    lines = [
        ("dynamicemb_core", dynamicemb_core.__version__),
        ("python", sys.version.split()[0]),
        ("platform", platform.platform()),
        ("torch", torch.__version__),
        ("torch CUDA", str(torch.version.cuda)),
        ("CUDA available", str(torch.cuda.is_available())),
        ("CPU threads", str(torch.get_num_threads())),
        ("csrc", str(loader.csrc_dir())),
        ("sources", str(len(plan.sources))),
        ("build with CUDA", str(plan.with_cuda)),
        ("CUDA archs", plan.cuda_arch_list or "-"),
        ("library", str(plan.library_path)),
        ("built", str(plan.library_path.is_file())),
    ]
    if torch.cuda.is_available():
        lines.append(("GPU", torch.cuda.get_device_name()))
    width = max(len(k) for k, _ in lines)
    for key, value in lines:
        print(f"{key:<{width}}  {value}")
    return 0
