"""Which prebuilt library a wheel's manifest offers this process (ops/loader.py find_prebuilt).

A library is loaded without a compiler only when it was built for exactly this torch (CUDA build
and local version label included), this Python and this process's choice of CUDA kernels;
otherwise the loader says why and builds just in time. tests/test_wheels.py loads a real one.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Dict

import torch

from dynamicemb_core.ops import loader


def _entry(**changes: object) -> Dict[str, object]:
    entry: Dict[str, object] = {
        "file": "cpu/dynamicemb_ops.so",
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "python": "%d.%d" % sys.version_info[:2],
        "with_cuda": loader.cuda_build_enabled(),
        "cuda_archs": "",
        "key": "0" * 16,
    }
    entry.update(changes)
    return entry


def _manifest(folder: Path, *entries: Dict[str, object]) -> Path:
    for entry in entries:
        library = folder / str(entry["file"])
        library.parent.mkdir(parents=True, exist_ok=True)
        library.write_bytes(b"")
    (folder / "manifest.json").write_text(json.dumps({"libraries": list(entries)}))
    return folder


def test_no_manifest_means_no_prebuilt_and_nothing_to_say(tmp_path: Path) -> None:
    assert loader.find_prebuilt(tmp_path) == (None, None)


def test_the_library_built_for_this_torch_is_chosen(tmp_path: Path) -> None:
    other = _entry(file="old/dynamicemb_ops.so", torch="2.11.0+cu130", torch_cuda="13.0")
    folder = _manifest(tmp_path, other, _entry())
    found, why_not = loader.find_prebuilt(folder)
    assert why_not is None and found is not None
    assert found.path == folder / "cpu" / "dynamicemb_ops.so"
    assert found.torch == torch.__version__


def test_another_torch_falls_back_and_says_so(tmp_path: Path) -> None:
    folder = _manifest(tmp_path, _entry(torch="2.11.0+cu130", torch_cuda="13.0"))
    found, why_not = loader.find_prebuilt(folder)
    assert found is None
    assert why_not is not None
    assert why_not.startswith("the wheel's prebuilt ops library is for torch 2.11.0+cu130, ")
    assert f"; this is torch {torch.__version__}, " in why_not


def test_same_version_without_or_with_cuda_kernels_does_not_fit(tmp_path: Path) -> None:
    folder = _manifest(tmp_path, _entry(with_cuda=not loader.cuda_build_enabled()))
    assert loader.find_prebuilt(folder)[0] is None
    folder = _manifest(tmp_path / "py", _entry(python="3.99"))
    assert loader.find_prebuilt(folder)[0] is None
