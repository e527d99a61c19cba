"""Loading the C++/CUDA ops library (``torch.ops.dynamicemb``) once: prebuilt, else built just in time.

A wheel built by setup.py carries the library compiled for the torch of its build environment in
``dynamicemb_core/ops/prebuilt/`` (``manifest.json`` names the torch, its CUDA, the Python and
whether the CUDA kernels are in it). When one matches the running torch it is loaded as is, with no
compiler needed (:func:`find_prebuilt`). Otherwise (a source tree, an editable install, a wheel for
another torch, which is said on stderr and by ``info``) the library is built just in time:

pip's build isolation would fetch a multi-GB CUDA torch, so the extension is compiled here, against
the torch that is already installed, with ``torch.utils.cpp_extension`` and ninja. The result is
cached in ``$DYNAMICEMB_CACHE_DIR`` (default ``$XDG_CACHE_HOME/dynamicemb_core``, else
``~/.cache/dynamicemb_core``) in a folder named by a hash
of every source under ``csrc/``, the torch version, the compiler flags and (for CUDA builds) the
target architectures, so an edited source or another torch gets its own build.

Concurrent first uses (several ranks, several test workers) each build in a private temporary
folder and then ``os.rename`` it into place; the first rename wins and the others load the winner's
library, so a half-written cache folder is never seen and a killed build leaves no lock behind.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import sys
import sysconfig
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import torch

from dynamicemb_core.ops.cache_dirs import cache_dir

__all__ = [
    "BuildPlan",
    "Prebuilt",
    "build_library",
    "build_plan",
    "cache_root",
    "ensure_loaded",
    "find_prebuilt",
    "is_loaded",
    "prebuilt_entry",
    "prune_builds",
]

logger = logging.getLogger(__name__)

LIBRARY_NAME = "dynamicemb_ops"
_SOURCE_SUFFIXES = (".cpp", ".h", ".cu", ".cuh")
_lock = threading.Lock()
_loaded_path: Optional[Path] = None
# Where a wheel keeps its prebuilt libraries (setup.py writes it; a source tree has none).
PREBUILT_DIR = Path(__file__).resolve().parent / "prebuilt"
# Old builds (other sources, flags or torch versions) are pruned once a new build lands: the newest
# KEEP_BUILDS by last use stay, and anything unused for less than PRUNE_AGE_S stays too, since another
# process (another venv, another checkout) may be about to load it.
KEEP_BUILDS = 4
PRUNE_AGE_S = 24 * 3600


def csrc_dir() -> Path:
    """The ``csrc`` folder: ``$DYNAMICEMB_CSRC_DIR``, else the one beside the package (source tree)."""
    override = os.environ.get("DYNAMICEMB_CSRC_DIR")
    if override:
        return Path(override)
    here = Path(__file__).resolve().parent
    for candidate in (here.parent / "csrc", here.parent.parent / "csrc"):
        if (candidate / "ops.cpp").is_file():
            return candidate
    raise FileNotFoundError(
        f"dynamicemb_core: cannot find csrc/ops.cpp beside {here.parent}; set DYNAMICEMB_CSRC_DIR "
        "to the csrc folder of a dynamicemb-core checkout"
    )


def cache_root() -> Path:
    """Folder holding built libraries: ``$DYNAMICEMB_CACHE_DIR``, else ``dynamicemb_core`` under
    ``$XDG_CACHE_HOME`` or ``~/.cache`` (the rule in :mod:`dynamicemb_core.ops.cache_dirs`)."""
    return cache_dir("build")


def cuda_build_enabled() -> bool:
    """CUDA sources are compiled only with a CUDA torch and a visible GPU."""
    return torch.version.cuda is not None and torch.cuda.is_available()


def _cuda_arch_list() -> str:
    env = os.environ.get("TORCH_CUDA_ARCH_LIST")
    if env:
        return env
    archs = {torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())}
    return ";".join(f"{major}.{minor}" for major, minor in sorted(archs))


@dataclass(frozen=True)
class BuildPlan:
    """Everything that decides one build: sources, flags, and the cache folder they hash to."""

    sources: List[Path]
    include_dirs: List[Path]
    cflags: List[str]
    cuda_cflags: List[str]
    ldflags: List[str]
    with_cuda: bool
    cuda_arch_list: str
    key: str

    @property
    def directory(self) -> Path:
        return cache_root() / f"{LIBRARY_NAME}-{self.key}"

    @property
    def library_path(self) -> Path:
        return self.directory / f"{LIBRARY_NAME}.so"


def build_plan(with_cuda: Optional[bool] = None) -> BuildPlan:
    """Collect sources (``ops.cpp``, ``cpu/*.cpp``, ``cuda/*.cu`` when CUDA is built) and the key.

    Args:
        with_cuda: compile the CUDA kernels too; default :func:`cuda_build_enabled` (setup.py asks
            for the C++-only library on a CUDA machine as well, for installs without a GPU).
    """
    root = csrc_dir()
    if with_cuda is None:
        with_cuda = cuda_build_enabled()
    sources = [root / "ops.cpp", *sorted((root / "cpu").glob("*.cpp"))]
    if with_cuda:
        sources += sorted((root / "cuda").glob("*.cu"))
    debug = os.environ.get("DYNAMICEMB_BUILD_DEBUG", "0") == "1"
    opt = ["-O0", "-g"] if debug else ["-O3"]
    # at::parallel_for is an inline template: without -fopenmp it silently runs serially, since
    # torch's CPU build uses the OpenMP backend (torch.__config__.parallel_info()).
    # -fno-math-errno: sqrtf then needs no errno branch, so the optimizer updates (ADAM, Adagrad)
    # vectorise; a vector square root rounds exactly as the scalar one (IEEE), so no bit changes.
    cflags = [*opt, "-fopenmp", "-fno-math-errno"]
    cuda_cflags = [*opt, "-lineinfo"] if with_cuda else []
    ldflags = ["-fopenmp"]
    arch = _cuda_arch_list() if with_cuda else ""
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.suffix in _SOURCE_SUFFIXES):
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    for part in (
        torch.__version__,
        str(torch.version.cuda),
        arch,
        sys.version,
        str(cflags),
        str(cuda_cflags),
        sysconfig.get_config_var("SOABI") or "",
    ):
        digest.update(part.encode())
    return BuildPlan(
        sources=sources,
        include_dirs=[root / "include"],
        cflags=cflags,
        cuda_cflags=cuda_cflags,
        ldflags=ldflags,
        with_cuda=with_cuda,
        cuda_arch_list=arch,
        key=digest.hexdigest()[:16],
    )


def _compile(plan: BuildPlan, verbose: bool) -> None:
    """Build into a private temp folder, then rename it to the cache folder (first one wins)."""
    from torch.utils import cpp_extension

    plan.directory.parent.mkdir(parents=True, exist_ok=True)
    message = (
        f"dynamicemb_core: building the C++{'/CUDA' if plan.with_cuda else ''} ops "
        f"({len(plan.sources)} sources) into {plan.directory}; this happens once per source/torch "
        "change and takes about a minute"
    )
    logger.info(message)
    print(message, file=sys.stderr, flush=True)
    start = time.monotonic()
    tmp = Path(tempfile.mkdtemp(prefix=f".{LIBRARY_NAME}-{plan.key}-", dir=plan.directory.parent))
    old_arch = os.environ.get("TORCH_CUDA_ARCH_LIST")
    try:
        if plan.with_cuda:
            os.environ["TORCH_CUDA_ARCH_LIST"] = plan.cuda_arch_list
        cpp_extension.load(
            name=LIBRARY_NAME,
            sources=[str(s) for s in plan.sources],
            extra_cflags=plan.cflags,
            extra_cuda_cflags=plan.cuda_cflags,
            extra_ldflags=plan.ldflags,
            extra_include_paths=[str(p) for p in plan.include_dirs],
            build_directory=str(tmp),
            verbose=verbose,
            with_cuda=plan.with_cuda,
            is_python_module=False,
        )
        try:
            os.rename(tmp, plan.directory)
        except OSError:  # another process finished first: keep its build
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        if plan.with_cuda:
            if old_arch is None:
                os.environ.pop("TORCH_CUDA_ARCH_LIST", None)
            else:
                os.environ["TORCH_CUDA_ARCH_LIST"] = old_arch
    logger.info("dynamicemb_core: build finished in %.1f s", time.monotonic() - start)


@dataclass(frozen=True)
class Prebuilt:
    """A library a wheel carries, and what it was built for (one entry of ``manifest.json``)."""

    path: Path
    torch: str
    torch_cuda: Optional[str]
    python: str
    with_cuda: bool

    def describe(self) -> str:
        kernels = "C++ and CUDA" if self.with_cuda else "C++ only"
        return f"torch {self.torch}, Python {self.python}, {kernels}"


def prebuilt_entry(plan: BuildPlan) -> Dict[str, object]:
    """The manifest fields of a library built by ``plan`` in this process (setup.py writes them)."""
    return {
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "python": "%d.%d" % sys.version_info[:2],
        "with_cuda": plan.with_cuda,
        "cuda_archs": plan.cuda_arch_list,
        "key": plan.key,
    }


def prebuilt_libraries(folder: Optional[Path] = None) -> List[Prebuilt]:
    """Every library listed in ``folder/manifest.json`` (default: this package's); [] without one."""
    folder = PREBUILT_DIR if folder is None else folder
    manifest = folder / "manifest.json"
    if not manifest.is_file():
        return []
    return [
        Prebuilt(
            path=folder / str(entry["file"]),
            torch=str(entry["torch"]),
            torch_cuda=entry.get("torch_cuda"),
            python=str(entry["python"]),
            with_cuda=bool(entry["with_cuda"]),
        )
        for entry in json.loads(manifest.read_text())["libraries"]
    ]


def find_prebuilt(folder: Optional[Path] = None) -> Tuple[Optional[Prebuilt], Optional[str]]:
    """(the prebuilt library to load, None) or (None, why none fits; None when there is none).

    A library fits when it was built for this exact torch version (the local part too: ``+cpu``
    and ``+cu130`` differ), this Python minor version, and with the CUDA kernels exactly when this
    process builds them (a CUDA torch with a GPU); a wheel built on a CUDA machine carries both.
    """
    libraries = prebuilt_libraries(folder)
    if not libraries:
        return None, None
    here = Prebuilt(
        path=Path(),
        torch=torch.__version__,
        torch_cuda=torch.version.cuda,
        python="%d.%d" % sys.version_info[:2],
        with_cuda=cuda_build_enabled(),
    )
    for library in libraries:
        if (library.torch, library.torch_cuda, library.python, library.with_cuda) == (
            here.torch,
            here.torch_cuda,
            here.python,
            here.with_cuda,
        ) and library.path.is_file():
            return library, None
    built_for = "; ".join(library.describe() for library in libraries)
    return None, f"the wheel's prebuilt ops library is for {built_for}; this is {here.describe()}"


def build_library(plan: BuildPlan, verbose: bool = False) -> Path:
    """The library of ``plan`` in the cache, compiled first when it is not there; its path."""
    if not plan.library_path.is_file():
        _compile(plan, verbose)
        for path in prune_builds(plan.directory.parent, plan.directory):
            logger.info("dynamicemb_core: removed an old build, %s", path)
    return plan.library_path


def ensure_loaded(verbose: bool = False) -> Path:
    """Load the ops library once per process (prebuilt, else built if needed); return its path.

    After loading, imports :mod:`dynamicemb_core.ops.fake` so every op also has a fake kernel
    (torch.compile / torch.export tracing).
    """
    global _loaded_path
    if _loaded_path is not None:
        return _loaded_path
    with _lock:
        if _loaded_path is not None:
            return _loaded_path
        prebuilt, why_not = find_prebuilt()
        if prebuilt is not None:
            path = prebuilt.path
            torch.ops.load_library(str(path))
        else:
            if why_not is not None:
                message = f"dynamicemb_core: {why_not}: building the ops from the packaged sources"
                logger.warning(message)
                print(message, file=sys.stderr, flush=True)
            plan = build_plan()
            path = build_library(plan, verbose)
            try:  # mark this build as used (prune_builds keeps the recently used ones)
                os.utime(plan.directory)
            except OSError:  # a read-only cache still loads
                pass
            # cpp_extension.load may already have loaded the library from the temp folder; loading
            # the same file again from its final path is then a no-op for the op registry.
            if not _registered():
                torch.ops.load_library(str(path))
        import dynamicemb_core.ops.fake  # noqa: F401  (registers fake kernels)

        _loaded_path = path
        logger.debug("dynamicemb_core: loaded %s", _loaded_path)
        return _loaded_path


def prune_builds(root: Path, current: Path, now: Optional[float] = None) -> List[Path]:
    """Delete old build folders under ``root`` (never ``current``); return what was deleted.

    A folder goes when it is not among the ``KEEP_BUILDS`` most recently used (its mtime, renewed at
    every load) and was last used over ``PRUNE_AGE_S`` ago; a temporary folder a killed build left
    behind goes once it is that old.
    """
    now = time.time() if now is None else now
    builds = sorted(
        (p for p in root.glob(f"{LIBRARY_NAME}-*") if p.is_dir() and p != current),
        key=lambda p: p.stat().st_mtime,
        reverse=True,
    )
    stale_temps = [p for p in root.glob(f".{LIBRARY_NAME}-*") if p.is_dir()]
    candidates = builds[max(KEEP_BUILDS - 1, 0) :] + stale_temps
    removed = []
    for path in candidates:
        if now - path.stat().st_mtime > PRUNE_AGE_S:
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def _registered() -> bool:
    try:
        torch.ops.dynamicemb.find.default  # noqa: B018
    except (AttributeError, RuntimeError):
        return False
    return True


def is_loaded() -> bool:
    """True once :func:`ensure_loaded` has run in this process."""
    return _loaded_path is not None
