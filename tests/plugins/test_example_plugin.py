"""The example third-party package, pip-installed into a temporary directory, works through the registry.

This is the path a plugin author takes: build and install the package, and the core finds it by its
entry point with no import or configuration in the core. The package's own tests (a discovery test
and the conformance suites) then run against the installed copy, in a fresh interpreter.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "demb_example_plugin"


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Directory the example was pip-installed into (a wheel built from the source tree)."""
    target = tmp_path_factory.mktemp("site")
    build = tmp_path_factory.mktemp("build")
    source = (
        build / "src"
    )  # setuptools writes build/ and egg-info next to the sources: not in the repo
    shutil.copytree(
        EXAMPLE, source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__")
    )
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "--disable-pip-version-check",
            "--quiet",
            "--target",
            str(target),
            str(source),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "TMPDIR": str(build)},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert (target / "demb_example_plugin" / "plugin.py").exists()
    return target


def _python(installed: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(installed), str(REPO)])}
    env.pop("DYNAMICEMB_DISABLE_PLUGIN_AUTOLOAD", None)
    return subprocess.run(
        [sys.executable, *args], cwd=str(REPO), env=env, capture_output=True, text=True, timeout=300
    )


def test_installed_example_is_listed_and_resolved_by_name(installed: Path) -> None:
    code = textwrap.dedent(
        """
        import torch, demb_example_plugin
        from dynamicemb_core.config import DynamicEmbTableOptions
        from dynamicemb_core.plugins import get_registry, resolve_storage
        from dynamicemb_core.types import StorageTableSpec
        print(demb_example_plugin.__file__)
        info = {p.name: p for p in get_registry().plugins()}["example"]
        print(info.distribution, info.version, ",".join(info.hooks))
        storage = resolve_storage(DynamicEmbTableOptions(external_storage="example_array"),
                                  [StorageTableSpec("t", dim=2, row_width=2)], "cpu")
        t0 = torch.tensor([0])
        storage.insert(torch.tensor([7]), t0, torch.tensor([[1.0, 2.0]]), torch.tensor([[3]]))
        found = storage.find(torch.tensor([7, 8]), torch.tensor([0, 0]))[0].tolist()
        print(type(storage).__name__, type(storage.inner).__name__, found)
        """
    )
    result = _python(installed, "-c", code)
    assert result.returncode == 0, result.stderr
    path, plugin, storage = result.stdout.splitlines()
    assert path.startswith(str(installed))  # the installed copy, not the source tree
    assert (
        plugin
        == "demb-example-plugin 0.1.0 dynamicemb_register_admission_strategies,dynamicemb_register_storages"
    )
    assert storage == "PerTableAdapter ArrayStorage [True, False]"  # split by the adapter


def test_installed_example_passes_its_own_tests(installed: Path) -> None:
    result = _python(
        installed, "-m", "pytest", "-p", "no:cacheprovider", "-q", str(EXAMPLE / "tests")
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert (
        " passed" in result.stdout
        and "failed" not in result.stdout
        and "skipped" not in result.stdout
    )


def test_cli_lists_the_installed_example(installed: Path) -> None:
    result = _python(installed, "-m", "dynamicemb_core", "plugins")
    assert result.returncode == 0, result.stderr
    assert "example: demb-example-plugin 0.1.0" in result.stdout
    assert "example_array" in result.stdout and "example_hash_sample" in result.stdout
