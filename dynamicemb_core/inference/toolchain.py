"""A C++ toolchain that links libstdc++ statically into shared objects, and what AOTInductor needs there.

On the lent GPU machine (torch 2.11.0+cu130) the compiler that ``$CXX`` names, ``/opt/gcc/bin/g++``
(g++ 13.3), links libstdc++ statically: a shared object it links carries its own copy of the C++
runtime, needs no ``libstdc++.so.6`` and exports ``__cxa_throw`` (csrc/include/dynamicemb/check.h
tells how that was found; the probe below found the same there for the compiler Inductor uses).
Loaded into a Python process that already runs torch's shared libstdc++, such an object uses two
copies of the C++ runtime at once, and their iostream and locale state disagree. The ops library
avoids every iostream for that reason; an AOTInductor wrapper cannot (its runtime headers print and
format through iostreams), and a CUDA package compiled there died with SIGSEGV, without a message,
when it was loaded and run. Here, a wrapper forced to link libstdc++ statically
(``-static-libstdc++``) fails at load with ``std::bad_cast``.

The fix: a probe link with the compiler Inductor uses tells whether it does that. If it does,
:func:`inductor_configs` points Inductor at a small script that calls the same compiler and adds the
process's own ``libstdc++.so.6`` to every shared link. The linker then takes the C++ runtime from that
shared library, which comes before the implicit ``-lstdc++`` on the command line, so nothing of the
static archive is linked, and the loaded package shares torch's runtime. A toolchain that links
libstdc++ dynamically (the usual case, and this project's CI) is left alone.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shlex
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Optional

__all__ = ["inductor_configs", "links_cxx_runtime_statically", "process_libstdcxx"]

_PROBE = """#include <stdexcept>
extern "C" void dynamicemb_toolchain_probe(int fail) {
  if (fail) throw std::runtime_error("probe");
}
"""


def process_libstdcxx(maps: str = "/proc/self/maps") -> Optional[str]:
    """The path of the ``libstdc++.so`` mapped into this process (torch's), or None if there is none.

    Args:
        maps: the process's memory map (a parameter so tests can hand in their own).
    """
    try:
        text = Path(maps).read_text()
    except OSError:
        return None
    for line in text.splitlines():
        fields = line.split(maxsplit=5)
        path = fields[5] if len(fields) == 6 else ""
        if os.path.basename(path).startswith("libstdc++.so") and os.path.isfile(path):
            return os.path.realpath(path)
    return None


def _needed_libraries(shared_object: str) -> Optional[List[str]]:
    """The ``NEEDED`` entries of a shared object's dynamic section (readelf, else objdump)."""
    for tool, args in (("readelf", ["-d"]), ("objdump", ["-p"])):
        exe = shutil.which(tool)
        if exe is None:
            continue
        run = subprocess.run([exe, *args, shared_object], capture_output=True, text=True)
        if run.returncode != 0:
            continue
        needed = []
        for line in run.stdout.splitlines():
            if "NEEDED" in line:
                needed.append(line.split()[-1].strip("[]"))
        return needed
    return None


@functools.lru_cache(maxsize=None)
def links_cxx_runtime_statically(compiler: str) -> bool:
    """Whether ``compiler -shared`` puts the C++ runtime into the shared object it links.

    A probe that throws a C++ exception is linked as a shared object; if its dynamic section needs
    neither libstdc++ nor libc++, the runtime was linked in statically. False when the probe cannot
    be built or inspected (nothing is changed then).
    """
    with tempfile.TemporaryDirectory(prefix="demb_toolchain_") as tmp:
        source = os.path.join(tmp, "probe.cpp")
        target = os.path.join(tmp, "probe.so")
        Path(source).write_text(_PROBE)
        try:
            run = subprocess.run(
                [compiler, "-shared", "-fPIC", "-o", target, source],
                capture_output=True,
                text=True,
                timeout=120,
            )
        except (OSError, subprocess.TimeoutExpired):
            return False
        if run.returncode != 0:
            return False
        needed = _needed_libraries(target)
    if needed is None:
        return False
    return not any(n.startswith(("libstdc++", "libc++")) for n in needed)


def _wrapper_script(compiler: str, runtime: str) -> str:
    """Write (once) the script that runs ``compiler`` and adds ``runtime`` to shared links."""
    from dynamicemb_core.ops.cache_dirs import cache_dir

    body = (
        "#!/bin/sh\n"
        "# Written by dynamicemb_core.inference.toolchain: shared links take this libstdc++.\n"
        'for arg in "$@"; do\n'
        '  if [ "$arg" = "-shared" ]; then\n'
        f'    exec {shlex.quote(compiler)} "$@" {shlex.quote(runtime)}\n'
        "  fi\n"
        "done\n"
        f'exec {shlex.quote(compiler)} "$@"\n'
    )
    folder = cache_dir("build") / "toolchain"
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / f"cxx-{hashlib.sha256(body.encode()).hexdigest()[:16]}.sh"
    if not script.is_file():
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".cxx-")
        with os.fdopen(fd, "w") as f:
            f.write(body)
        os.chmod(tmp, 0o755)
        os.replace(tmp, script)
    return str(script)


def inductor_configs() -> Dict[str, Any]:
    """Inductor config overrides that make AOTInductor link the process's shared libstdc++.

    Empty when the compiler Inductor would use links libstdc++ dynamically (or cannot be probed).
    Otherwise ``{"cpp.cxx": (None, script)}`` with the script described in this module's docstring.
    """
    import torch._inductor.config as inductor_config

    compiler = shutil.which(str(inductor_config.cpp.cxx[1] or "g++"))
    runtime = process_libstdcxx()
    if compiler is None or runtime is None or not links_cxx_runtime_statically(compiler):
        return {}
    return {"cpp.cxx": (None, _wrapper_script(compiler, runtime))}
