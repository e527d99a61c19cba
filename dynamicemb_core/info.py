"""``python -m dynamicemb_core info``: check an installation and say what it found.

Prints one line per fact a user needs before training: Python, torch and its CUDA, FBGEMM (CPU or
CUDA build), TorchRec, where the C++ ops library is (built or not, how many ops it registers) and
the plugins found. Exits 1, after a ``problems:`` list, when something the package needs is missing
or broken (FBGEMM or TorchRec does not import, the built library does not load, a plugin fails to
load); an ops library not built yet is not a problem (it compiles on first use, or ahead of time
with ``python -m dynamicemb_core build``).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata as metadata
import platform
import sys
from dataclasses import dataclass, field
from typing import Callable, List, Optional, Sequence, TextIO, Tuple

import torch

from dynamicemb_core.redaction import redact_text

__all__ = ["Report", "collect", "main", "package_version"]

# (distribution names to try, in order; the module to import). FBGEMM has a CPU and a CUDA build
# under different distribution names that install the same module.
FBGEMM = (("fbgemm-gpu", "fbgemm-gpu-cpu", "fbgemm-gpu-nightly"), "fbgemm_gpu")
TORCHREC = (("torchrec", "torchrec-nightly"), "torchrec")


@dataclass
class Report:
    """The rows to print and the problems found (an empty list: the install is usable)."""

    rows: List[Tuple[str, str]] = field(default_factory=list)
    problems: List[str] = field(default_factory=list)

    def add(self, key: str, value: str) -> None:
        self.rows.append((key, value))

    def format(self) -> str:
        """Aligned ``key  value`` lines, then the problems (or ``status  ok``).

        URL passwords are redacted (:mod:`dynamicemb_core.redaction`): a plugin's load error may
        quote the URL it was configured with.
        """
        rows = self.rows + [("status", "ok" if not self.problems else "PROBLEMS (see below)")]
        width = max(len(key) for key, _ in rows)
        lines = [f"{key:<{width}}  {value}" for key, value in rows]
        if self.problems:
            lines.append("problems:")
            lines.extend(f"  - {problem}" for problem in self.problems)
        return redact_text("\n".join(lines))


def package_version(
    distributions: Sequence[str],
    module: str,
    importer: Callable[[str], object] = importlib.import_module,
) -> Tuple[str, Optional[str]]:
    """(``"<distribution> <version>"``, error) for the first installed distribution of ``module``.

    The module is imported too, since an installed package that does not import (FBGEMM built for
    another torch fails with undefined symbols) is the common failure. ``error`` is None when it
    imports.
    """
    found = ""
    for name in distributions:
        try:
            found = f"{name} {metadata.version(name)}"
            break
        except metadata.PackageNotFoundError:
            continue
    try:
        importer(module)
    except Exception as error:  # any import failure is the thing to report
        label = found or "not installed"
        what = (
            "is not installed"
            if not found
            else f"does not import ({type(error).__name__}: {error})"
        )
        return label, f"{module} {what}"
    return found or f"{module} (no distribution metadata)", None


def _ops_rows(report: Report) -> None:
    """Where the library is, whether it is built, and how many ops it registers once loaded."""
    from dynamicemb_core.ops import loader

    plan = loader.build_plan()
    prebuilt, why_not = loader.find_prebuilt()
    report.add("ops sources", f"{loader.csrc_dir()} ({len(plan.sources)} files)")
    report.add("ops build", f"{'C++ and CUDA' if plan.with_cuda else 'C++ (CPU)'}")
    if plan.with_cuda:
        report.add("ops CUDA archs", plan.cuda_arch_list or "-")
    if prebuilt is not None:
        report.add("ops library", str(prebuilt.path))
        report.add("ops origin", f"prebuilt in the wheel, for {prebuilt.describe()}")
    else:
        report.add("ops library", str(plan.library_path))
        report.add("ops origin", f"built just in time{f' ({why_not})' if why_not else ''}")
    if prebuilt is None and not plan.library_path.is_file():
        report.add(
            "ops built", "no: compiles on first use, or run `python -m dynamicemb_core build`"
        )
        return
    try:
        loader.ensure_loaded()
    except Exception as error:
        report.add("ops built", "yes, but it does not load")
        report.problems.append(f"the ops library does not load: {type(error).__name__}: {error}")
        return
    names = sorted(n for n in torch._C._dispatch_get_all_op_names() if n.startswith("dynamicemb::"))
    report.add("ops built", f"yes, {len(names)} ops in torch.ops.dynamicemb")


def _plugin_rows(report: Report) -> None:
    """Every plugin the registry loaded (the core's built-ins included), or why loading failed."""
    from dynamicemb_core.plugins.registry import get_registry

    try:
        infos = get_registry().plugins()
    except Exception as error:
        report.add("plugins", "failed to load")
        report.problems.append(f"plugins failed to load: {type(error).__name__}: {error}")
        return
    listed = [f"{i.name} ({i.distribution}{' ' + i.version if i.version else ''})" for i in infos]
    report.add("plugins", f"{len(infos)}: " + ", ".join(listed) if listed else "none")


def collect() -> Report:
    """Gather every row; failures become problems rather than exceptions."""
    import dynamicemb_core

    report = Report()
    report.add("dynamicemb_core", f"{dynamicemb_core.__version__} ({dynamicemb_core.__file__})")
    report.add("python", f"{sys.version.split()[0]} ({sys.executable})")
    report.add("platform", platform.platform())
    report.add("torch", torch.__version__)
    report.add("torch CUDA", str(torch.version.cuda) if torch.version.cuda else "none (CPU build)")
    cuda = torch.cuda.is_available()
    gpus = (
        f"yes, {torch.cuda.device_count()} GPU(s): {torch.cuda.get_device_name()}" if cuda else "no"
    )
    report.add("CUDA available", gpus)
    report.add("CPU threads", str(torch.get_num_threads()))
    for label, (distributions, module) in (("FBGEMM", FBGEMM), ("TorchRec", TORCHREC)):
        value, problem = package_version(distributions, module)
        report.add(label, value)
        if problem:
            report.problems.append(problem)
    _ops_rows(report)
    _plugin_rows(report)
    return report


def main(argv: Optional[List[str]] = None, out: TextIO = sys.stdout) -> int:
    """Print the report; return 0 when the install is usable, 1 when it found problems."""
    argparse.ArgumentParser(
        prog="python -m dynamicemb_core info",
        description="Check the installation: torch, CUDA, FBGEMM, TorchRec, the ops, the plugins.",
    ).parse_args(argv)
    report = collect()
    out.write(report.format() + "\n")
    return 1 if report.problems else 0
