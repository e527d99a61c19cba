"""Ship csrc/ inside the wheel as dynamicemb_core/csrc/, where the JIT loader looks for it.

Everything else about the package is declared in pyproject.toml. In the source tree (and in an
editable install) the loader finds ../csrc beside the package; an installed wheel has no source
tree, so the C++/CUDA sources travel as package files. Nothing is compiled here: the extension is
built just-in-time against the installed torch (dynamicemb_core/ops/loader.py).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

_CSRC = Path(__file__).resolve().parent / "csrc"
_SOURCE_SUFFIXES = (".h", ".hpp", ".cuh", ".cpp", ".cc", ".cu")


class BuildPyWithCsrc(build_py):
    """build_py that also copies csrc/'s sources to <build_lib>/dynamicemb_core/csrc/."""

    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return  # an editable install keeps using the checkout's csrc/
        target = Path(self.build_lib) / "dynamicemb_core" / "csrc"
        for source in sorted(_CSRC.rglob("*")):
            if source.is_file() and source.suffix in _SOURCE_SUFFIXES:
                destination = target / source.relative_to(_CSRC)
                destination.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, destination)


setup(cmdclass={"build_py": BuildPyWithCsrc})
