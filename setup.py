"""The wheel's two extras beyond pyproject.toml: the C++/CUDA sources, and the compiled ops library.

Everything else about the package is declared in pyproject.toml. A wheel (``python -m build
--no-isolation``, or ``pip wheel --no-build-isolation``; scripts/build_wheels.py builds them all)
carries:

- ``dynamicemb_core/csrc/``: the sources, so an install for another torch can still compile them
  just in time (the source tree and an editable install use the checkout's ../csrc instead);
- ``dynamicemb_core/ops/prebuilt/``: the ops library compiled against the torch of the build
  environment (the C++ build; on a machine with a CUDA torch and a GPU, the C++/CUDA build as well),
  with ``manifest.json`` saying which torch each was built for. ops/loader.py loads the one that
  matches the running torch, with no compiler, and falls back to the just-in-time build otherwise.
  The library is taken from the build cache ($DYNAMICEMB_CACHE_DIR) when it already holds a build
  of these sources for this torch, else compiled there once.

Such a wheel is named for what it carries: its version gets a local label with the torch it was
built for (``0.1.0+torch2.13.0cpu``) and a platform tag (``cp311-cp311-linux_x86_64``), since a
compiled library is only good for that torch on that platform. ``DYNAMICEMB_WHEEL_OPS=0`` builds
the plain wheel instead (``py3-none-any``, sources only, compiled on first use); so does a build
environment without torch. Editable installs never bundle a library (scripts/bootstrap.sh sets
``DYNAMICEMB_WHEEL_OPS=0`` for them).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Optional

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py

_ROOT = Path(__file__).resolve().parent
_CSRC = _ROOT / "csrc"
_SOURCE_SUFFIXES = (".h", ".hpp", ".cuh", ".cpp", ".cc", ".cu")
_INIT = (_ROOT / "dynamicemb_core" / "__init__.py").read_text()
_VERSION = re.search(r'^__version__ = "([^"]+)"', _INIT, re.M).group(1)  # the one version


def _torch_version() -> Optional[str]:
    """The installed torch's version (``2.13.0+cpu``), read from its metadata; None without torch."""
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return None


def _bundle_torch() -> Optional[str]:
    """The torch version to bundle an ops library for, or None for the plain wheel.

    A source distribution is never for one torch: `python -m build` makes it first (setuptools'
    `sdist` command), then the wheel from it, which is where the library goes.
    """
    if os.environ.get("DYNAMICEMB_WHEEL_OPS", "1") == "0" or "sdist" in sys.argv:
        return None
    version = _torch_version()
    if version is None:
        print("setup.py: torch is not installed here: a plain wheel, compiled on first use")
    return version


def local_label(torch_version: str) -> str:
    """``torch2.13.0cpu`` for ``2.13.0+cpu``: the version label naming the torch a wheel is for."""
    return "torch" + re.sub(r"[^0-9A-Za-z.]", "", torch_version)


_BUNDLE_FOR = _bundle_torch()

# A small program run in a fresh interpreter per variant: it builds (or finds in the cache) one
# library and prints its manifest entry. Fresh, because two variants cannot both load in one
# process (they register the same op names).
_BUILD_ONE = """
import json, sys
from dynamicemb_core.ops import loader
with_cuda = {"cpu": False, "cuda": True}[sys.argv[1]]
plan = loader.build_plan(with_cuda=with_cuda)
path = loader.build_library(plan)
print(json.dumps({"library": str(path), **loader.prebuilt_entry(plan)}))
"""


def _variants() -> List[str]:
    """``cpu`` always; ``cuda`` too when this machine can build the CUDA kernels."""
    probe = "from dynamicemb_core.ops import loader; print(loader.cuda_build_enabled())"
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, env=_child_env(), cwd=_ROOT
    )
    if done.returncode != 0:
        raise RuntimeError(f"setup.py: cannot import the ops loader:\n{done.stderr}")
    return ["cpu", "cuda"] if done.stdout.strip() == "True" else ["cpu"]


def _child_env() -> Dict[str, str]:
    """This source tree's package and csrc/ first, whatever else is installed."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(_ROOT) + (
        os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else ""
    )
    env["DYNAMICEMB_CSRC_DIR"] = str(_CSRC)
    return env


def _bundle_ops(target: Path) -> None:
    """Build (or reuse) each variant's library and copy it, with manifest.json, under ``target``."""
    entries = []
    for variant in _variants():
        done = subprocess.run(
            [sys.executable, "-c", _BUILD_ONE, variant],
            stdout=subprocess.PIPE,
            text=True,
            env=_child_env(),
            cwd=_ROOT,
        )
        if done.returncode != 0:
            raise RuntimeError(f"setup.py: building the {variant} ops library failed (see above)")
        entry = json.loads(done.stdout.strip().splitlines()[-1])
        library = Path(entry.pop("library"))
        destination = target / variant / library.name
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(library, destination)
        entries.append({"file": f"{variant}/{library.name}", **entry})
        print(
            f"setup.py: bundled the {variant} ops library for torch {entry['torch']} from {library}"
        )
    (target / "manifest.json").write_text(json.dumps({"libraries": entries}, indent=2) + "\n")


class BuildPyWithOps(build_py):
    """build_py that also copies csrc/ to <build_lib>/dynamicemb_core/csrc/ and, for a bundling
    build, the compiled ops library to <build_lib>/dynamicemb_core/ops/prebuilt/."""

    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return  # an editable install keeps using the checkout's csrc/ and the build cache
        target = Path(self.build_lib) / "dynamicemb_core" / "csrc"
        for source in sorted(_CSRC.rglob("*")):
            if source.is_file() and source.suffix in _SOURCE_SUFFIXES:
                destination = target / source.relative_to(_CSRC)
                destination.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, destination)
        prebuilt = Path(self.build_lib) / "dynamicemb_core" / "ops" / "prebuilt"
        shutil.rmtree(prebuilt, ignore_errors=True)  # never a library left by an earlier build
        if _BUNDLE_FOR is not None:
            _bundle_ops(prebuilt)


class BinaryDistribution(Distribution):
    """A distribution carrying a compiled library: the wheel gets a platform tag, not any."""

    def has_ext_modules(self) -> bool:
        return True


if _BUNDLE_FOR is None:
    setup(version=_VERSION, cmdclass={"build_py": BuildPyWithOps})
else:
    setup(
        version=f"{_VERSION}+{local_label(_BUNDLE_FOR)}",
        cmdclass={"build_py": BuildPyWithOps},
        distclass=BinaryDistribution,
    )
