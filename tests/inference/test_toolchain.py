"""The C++ toolchain probe and the link fix AOTInductor gets (dynamicemb_core.inference.toolchain).

Oracle: the dynamic section the linker wrote. A compiler that links libstdc++ statically into shared
objects (here g++ with ``-static-libstdc++`` on every shared link, what the GPU machine's g++ does on
its own) must be detected, and the script :func:`inductor_configs` hands to Inductor must link
shared objects that need the shared libstdc++ again.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch

from dynamicemb_core.inference import toolchain
from tests.inference import helpers as H


def test_process_libstdcxx_is_read_from_the_memory_map(tmp_path: Path) -> None:
    lib = tmp_path / "libstdc++.so.6.0.33"
    lib.write_bytes(b"")
    maps = tmp_path / "maps"
    maps.write_text(
        "7f00-7f01 r--p 00000000 08:01 12 /usr/lib/libc.so.6\n"
        "7f01-7f02 rw-p 00000000 00:00 0\n"
        f"7f02-7f03 r-xp 00000000 08:01 13 {lib}\n"
    )
    assert toolchain.process_libstdcxx(str(maps)) == os.path.realpath(lib)
    maps.write_text("7f00-7f01 r--p 00000000 08:01 12 /usr/lib/libc.so.6\n")
    assert toolchain.process_libstdcxx(str(maps)) is None
    assert toolchain.process_libstdcxx(str(tmp_path / "absent")) is None
    # torch itself runs on libstdc++, so this process has one mapped
    assert os.path.basename(toolchain.process_libstdcxx() or "").startswith("libstdc++.so")


def test_the_probe_tells_a_static_cxx_runtime_from_a_shared_one(tmp_path: Path) -> None:
    assert toolchain.links_cxx_runtime_statically(shutil.which("g++") or "g++") is False
    assert toolchain.links_cxx_runtime_statically(H.static_cxx_runtime_compiler(tmp_path)) is True
    assert toolchain.links_cxx_runtime_statically(str(tmp_path / "no-such-compiler")) is False


def test_inductor_links_the_shared_runtime_through_a_static_toolchain(
    tmp_path: Path, monkeypatch
) -> None:
    import torch._inductor.config as inductor_config

    monkeypatch.setenv("DYNAMICEMB_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(inductor_config.cpp, "cxx", (None, shutil.which("g++")))
    assert toolchain.inductor_configs() == {}  # a toolchain that links it dynamically is left alone

    monkeypatch.setattr(inductor_config.cpp, "cxx", (None, H.static_cxx_runtime_compiler(tmp_path)))
    configs = toolchain.inductor_configs()
    assert set(configs) == {"cpp.cxx"}
    script = configs["cpp.cxx"][1]
    assert Path(script).parent == tmp_path / "cache" / "toolchain"
    assert toolchain.links_cxx_runtime_statically(script) is False
    assert toolchain.inductor_configs() == configs  # one script per (compiler, runtime)
    # the runtime handed to the linker is the one this process (torch) runs on
    assert toolchain.process_libstdcxx() in Path(script).read_text()


@pytest.mark.slow
def test_a_package_from_a_static_runtime_toolchain_loads_and_serves(
    tmp_path: Path, monkeypatch
) -> None:
    """End to end through a g++ that links libstdc++ statically: compile_package must relink the
    package against the shared runtime, else loading it fails (std::bad_cast with g++ 12 here,
    SIGSEGV on the GPU machine). Slow: Inductor builds its precompiled header anew for the compiler
    (minutes on a loaded 2-core machine)."""
    import torch._inductor.config as inductor_config

    from dynamicemb_core.config import DynamicEmbPoolingMode
    from dynamicemb_core.inference import (
        InferenceEmbeddingBagCollection,
        LookupModule,
        attach,
        compile_package,
        export_model,
    )
    from dynamicemb_core.inference.runtime import load_package

    monkeypatch.setenv("DYNAMICEMB_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(inductor_config.cpp, "cxx", (None, H.static_cxx_runtime_compiler(tmp_path)))
    trainer = H.trained_tables(DynamicEmbPoolingMode.SUM, device="cpu")
    served = LookupModule(InferenceEmbeddingBagCollection.from_model(trainer))
    indices, offsets, _ = H.batch(800, 16, 600, "cpu")
    package = compile_package(
        export_model(served, (indices, offsets)),
        str(tmp_path / "relinked.pt2"),
        fast_compile=True,
        embed_constants=False,
    )
    compiled = load_package(package)
    attach(compiled, served)
    assert torch.equal(compiled(indices, offsets), H.reference(trainer, indices, offsets))
