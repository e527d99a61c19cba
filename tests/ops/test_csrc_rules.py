"""Source rules of csrc/ that no compiler enforces.

No iostreams in the extension: on the GPU machine an extension built there links libstdc++
statically, and constructing a std::ostringstream inside it crashed the process (see
csrc/include/dynamicemb/check.h). TORCH_CHECK and c10::str format through one, so checks use
DEMB_CHECK_* instead.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

CSRC = Path(__file__).resolve().parents[2] / "csrc"
FORBIDDEN = {
    "TORCH_CHECK": re.compile(r"\bTORCH_CHECK\w*\s*\("),
    "TORCH_WARN": re.compile(r"\bTORCH_WARN\w*\s*\("),
    "TORCH_INTERNAL_ASSERT": re.compile(r"\bTORCH_INTERNAL_ASSERT\w*\s*\("),
    "c10::str": re.compile(r"\bc10::str\s*\("),
    "ostringstream": re.compile(r"\b(std::)?o?stringstream\b"),
    "<sstream>/<iostream>": re.compile(r"#\s*include\s*<(sstream|iostream)>"),
}
SOURCES = sorted(p for p in CSRC.rglob("*") if p.suffix in {".cpp", ".cu", ".cuh", ".h"})


def _code(path: Path) -> str:
    """The file without comments (the rules name the forbidden things in prose)."""
    text = path.read_text()
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def test_there_are_sources_to_check() -> None:
    assert len(SOURCES) >= 10, SOURCES


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(CSRC)))
def test_no_iostream_formatting_in_the_extension(path: Path) -> None:
    code = _code(path)
    found = [name for name, rx in FORBIDDEN.items() if rx.search(code)]
    assert not found, f"{path.relative_to(CSRC)} uses {found}; use DEMB_CHECK_* (check.h)"
