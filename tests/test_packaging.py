"""Packaging and CI wiring: the pinned lock, the install scripts, the README's two commands, the
pytest configuration, the plugin packages' metadata and the wheel's contents.

These guard the promises an install makes: torch and fbgemm are pinned to the CPU set and never
resolved, the CI runs exactly what the README tells a person to run, and `-m gpu` / `-m slow` select
what they say.
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
import re
import shutil
import stat
import subprocess
import sys
import sysconfig
import textwrap
import tomllib
import zipfile
from pathlib import Path
from typing import Dict, List

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
import build_docs  # noqa: E402  (scripts/ is not a package)
import freeze_lock  # noqa: E402
import layout as repo_layout  # noqa: E402
import run_tests as test_runner  # noqa: E402

# Distributions that come in CPU and CUDA builds: a package must never ask pip to resolve them.
_NEVER_RESOLVED = {"torch", "fbgemm-gpu", "fbgemm-gpu-cpu", "torchrec"}


def _pyproject(path: Path) -> Dict:
    with open(path, "rb") as f:
        return tomllib.load(f)


def _quick_start_commands() -> List[str]:
    """The commands of README's quick-start code block, comments stripped."""
    text = (REPO / "README.md").read_text()
    section = text.split("## Quick start", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.S)
    assert block, "README.md: no ```bash block under '## Quick start'"
    commands = [line.split("#", 1)[0].strip() for line in block.group(1).splitlines()]
    return [c for c in commands if c]


def _code_lines(path: Path) -> List[str]:
    """Non-empty, non-comment lines of a shell script, stripped."""
    lines = [line.strip() for line in path.read_text().splitlines()]
    return [line for line in lines if line and not line.startswith("#")]


# --- the lock ------------------------------------------------------------------------------------


def test_lock_pins_cpu_torch_set_exactly():
    pins = repo_layout.lock_pins()
    assert pins["torch"] == "2.13.0"
    assert pins["fbgemm-gpu-cpu"] == "1.8.0"
    assert pins["torchrec"] == "1.8.0"
    # The CUDA fbgemm build shares fbgemm-gpu-cpu's files: pinning both would break the import.
    assert "fbgemm-gpu" not in pins


def test_lock_takes_torch_from_torch_txt():
    lock_lines = _code_lines(repo_layout.LOCK)
    assert "-r torch.txt" in lock_lines
    assert _code_lines(repo_layout.TORCH_REQUIREMENTS) == ["torch==2.13.0"]
    assert not any(line.startswith("torch==") for line in lock_lines), "torch pinned twice"


def test_lock_parser_follows_includes_and_rejects_ranges(tmp_path):
    (tmp_path / "inner.txt").write_text("Foo_Bar==1.2  # comment\n")
    (tmp_path / "lock.txt").write_text("# header\n-r inner.txt\nbaz==3.0.1\n")
    assert repo_layout.lock_pins(tmp_path / "lock.txt") == {"foo-bar": "1.2", "baz": "3.0.1"}
    (tmp_path / "lock.txt").write_text("numpy>=1.26\n")
    with pytest.raises(ValueError, match=r"exact `name==version` pin, found 'numpy>=1.26'"):
        repo_layout.lock_pins(tmp_path / "lock.txt")


def test_running_environment_matches_lock():
    """The suite runs in the locked environment (./dev, nox and the dev venv all install it)."""
    mismatches = []
    for name, version in sorted(repo_layout.lock_pins().items()):
        try:
            installed = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            mismatches.append(f"{name}: pinned {version}, not installed")
            continue
        # `==2.13.0` admits the local build `2.13.0+cpu`, exactly as pip does when installing.
        if not SpecifierSet(f"=={version}").contains(installed, prereleases=True):
            mismatches.append(f"{name}: pinned {version}, installed {installed}")
    assert not mismatches, "environment differs from requirements/lock.txt:\n" + "\n".join(
        mismatches
    )


def test_lock_lists_every_package_of_running_environment():
    """Nothing was installed beside the lock: re-freezing this environment reproduces the file."""
    assert (
        freeze_lock.render(freeze_lock.frozen_pins(sys.executable)) == repo_layout.LOCK.read_text()
    )


def test_freeze_keeps_header_and_torch_include(tmp_path):
    lock = tmp_path / "lock.txt"
    lock.write_text("# how to install\n-r torch.txt\nold==1.0\n")
    assert (
        freeze_lock.render(["a==1", "b==2"], lock) == "# how to install\n-r torch.txt\na==1\nb==2\n"
    )


def test_cuda_fbgemm_not_installed_beside_cpu_build():
    """torchrec's metadata asks for `fbgemm-gpu`; a resolved install would overwrite the CPU build."""
    importlib.metadata.version("fbgemm-gpu-cpu")
    with pytest.raises(importlib.metadata.PackageNotFoundError):
        importlib.metadata.version("fbgemm-gpu")


def test_pin_lookup_names_known_pins_when_missing():
    assert repo_layout.pin("Ruff") == f"ruff=={repo_layout.lock_pins()['ruff']}"
    with pytest.raises(ValueError, match="no pin for 'no-such-package'"):
        repo_layout.pin("no-such-package")


def test_venv_is_outside_clone_and_named_after_lock_and_clone(tmp_path, monkeypatch):
    monkeypatch.setenv("DEMB_HOME", str(tmp_path / "home"))
    venv = repo_layout.venv_dir()
    key = repo_layout.lock_hash()
    assert venv == tmp_path / "home" / f"venv-{key}-{repo_layout.clone_key(REPO)}"
    assert repo_layout.base_dir() == tmp_path / "home" / f"base-{key}"
    assert REPO not in venv.parents
    other = repo_layout.venv_dir(tmp_path / "other-clone")
    assert other != venv and other.name.startswith(f"venv-{key}-")


def test_a_linked_venv_sees_the_base_packages_after_its_own(tmp_path):
    """link_base: the clone's virtualenv imports the base's modules, and its own ones first."""
    base, venv = tmp_path / "base", tmp_path / "venv"
    for folder, text in ((base, "base"), (venv, "venv")):
        packages = repo_layout.site_packages(folder)
        packages.mkdir(parents=True)
        (packages / "demb_probe_shared.py").write_text(f"WHERE = {text!r}\n")
    (repo_layout.site_packages(base) / "demb_probe_base_only.py").write_text("WHERE = 'base'\n")
    subprocess.run([sys._base_executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    repo_layout.link_base(venv, base)
    probe = "import demb_probe_shared as s, demb_probe_base_only as b; print(s.WHERE, b.WHERE)"
    done = subprocess.run(
        [str(venv / "bin" / "python"), "-c", probe], capture_output=True, text=True, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["venv", "base"]


def test_prune_removes_only_venvs_of_clones_that_are_gone(tmp_path):
    home, live = tmp_path / "home", tmp_path / "live-clone"
    live.mkdir()
    (live / "dev").write_text("")
    for name, clone in (("venv-a-1", live), ("venv-a-2", tmp_path / "gone-clone")):
        (home / name).mkdir(parents=True)
        (home / name / ".demb-clone").write_text(f"{clone}\n")
    (home / "venv-0123456789ab").mkdir()  # made by an older bootstrap: no marker, left alone
    assert repo_layout.prune_venvs(home) == [home / "venv-a-2"]
    assert sorted(p.name for p in home.iterdir() if p.is_dir()) == [
        "venv-0123456789ab",
        "venv-a-1",
    ]


def test_lock_hash_changes_with_any_requirements_file(tmp_path, monkeypatch):
    copy = tmp_path / "requirements"
    shutil.copytree(repo_layout.REQUIREMENTS, copy)
    monkeypatch.setattr(repo_layout, "REQUIREMENTS", copy)
    before = repo_layout.lock_hash()
    assert repo_layout.lock_hash() == before
    (copy / "torch.txt").write_text("torch==2.14.1\n")
    assert repo_layout.lock_hash() != before
    assert repo_layout.lock_hash("3.12") != repo_layout.lock_hash("3.11")


# --- install scripts: nothing is resolved ----------------------------------------------------------


def _joined_shell(path: Path) -> str:
    """A shell script with backslash-continued lines joined."""
    return path.read_text().replace("\\\n", " ")


def test_every_pip_install_in_scripts_uses_no_deps():
    installs = [
        line
        for line in _joined_shell(REPO / "scripts" / "bootstrap.sh").splitlines()
        if re.search(r"pip\[@\]\}\"? install", line)
    ]
    assert len(installs) >= 2, "expected the lock and the editable installs in bootstrap.sh"
    for line in installs:
        assert "--no-deps" in line, line
    editable = [line for line in installs if "editables" in line]
    assert editable and "--no-build-isolation" in editable[0]


def test_every_nox_install_uses_no_deps():
    source = (REPO / "noxfile.py").read_text()
    calls = re.findall(r"session\.install\(([^)]*)\)", source)
    assert len(calls) >= 3
    for args in calls:
        assert '"--no-deps"' in args, f"session.install({args}) may resolve dependencies"


def test_torch_source_check_is_a_dry_run_without_deps():
    source = Path(repo_layout.__file__).read_text()
    command = re.search(r'command = \[python, "-m", "pip", "install".*?\]\n.*?\]', source, re.S)
    assert command, "torch_source's pip command not found"
    for flag in ('"--dry-run"', '"--no-deps"', '"--report"'):
        assert flag in command.group(0)


def test_shell_scripts_parse_and_are_executable():
    for path in [REPO / "dev", REPO / ".ci" / "run", *sorted((REPO / "scripts").glob("*.sh"))]:
        subprocess.run(["bash", "-n", str(path)], check=True)
        assert path.stat().st_mode & stat.S_IXUSR, f"{path} is not executable"


# --- bootstrap: quiet on reuse, loud on errors ----------------------------------------------------


def _mirror_venv(home: Path) -> Path:
    """A base and this clone's virtualenv under ``home``, named as bootstrap.sh expects: the
    virtualenv's python sees the running environment's packages (its site-packages is a link to
    ours) and the stamps say that the lock and the editable installs are done: what a reused
    environment looks like."""
    base = home / f"base-{repo_layout.lock_hash()}"
    base.mkdir(parents=True)
    (base / ".demb-lock-installed").touch()
    venv = home / f"venv-{repo_layout.lock_hash()}-{repo_layout.clone_key()}"
    (venv / "bin").mkdir(parents=True)
    (venv / ".demb-base").write_text(f"{base}\n")
    (venv / ".demb-clone").write_text(f"{REPO}\n")
    interpreter = Path(os.path.realpath(sys.executable))
    version = ".".join(map(str, sys.version_info[:3]))
    (venv / "pyvenv.cfg").write_text(
        f"home = {interpreter.parent}\ninclude-system-site-packages = false\nversion = {version}\n"
    )
    (venv / "bin" / "python").symlink_to(interpreter)
    lib = venv / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}"
    lib.mkdir(parents=True)
    (lib / "site-packages").symlink_to(sysconfig.get_paths()["purelib"])
    (venv / ".demb-editables").write_text(repo_layout.editable_key() + "\n")
    return venv


def _bootstrap(env_update: Dict[str, str]) -> subprocess.CompletedProcess:
    env = {**os.environ, "DEMB_PYTHON": sys.executable, **env_update}
    return subprocess.run(
        ["bash", str(REPO / "scripts" / "bootstrap.sh")], capture_output=True, text=True, env=env
    )


def test_bootstrap_is_silent_when_it_reuses_everything(tmp_path):
    from dynamicemb_core.ops import loader

    loader.ensure_loaded()  # the ops library is in the cache, as after any earlier ./dev call
    venv = _mirror_venv(tmp_path / "home")
    done = _bootstrap({"DEMB_HOME": str(tmp_path / "home")})
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    assert done.stdout == f"{venv}\n"


def test_bootstrap_errors_are_shown(tmp_path):
    done = _bootstrap({"DEMB_HOME": str(tmp_path / "home"), "DEMB_PYTHON": "no-such-python3.11"})
    assert done.returncode != 0 and done.stdout == ""
    assert "[bootstrap] error: no Python interpreter 'no-such-python3.11' (set DEMB_PYTHON)" in (
        done.stderr
    )


def test_editable_key_changes_with_clone_path_and_plugin_metadata(tmp_path):
    clone = tmp_path / "clone"
    (clone / "plugins" / "demb_x").mkdir(parents=True)
    (clone / "pyproject.toml").write_text("[project]\nname = 'core'\n")
    plugin = clone / "plugins" / "demb_x" / "pyproject.toml"
    plugin.write_text("[project]\nname = 'demb-x'\n")
    key = repo_layout.editable_key(clone)
    assert repo_layout.editable_key(clone) == key
    plugin.write_text("[project]\nname = 'demb-x'\nversion = '2'\n")
    assert repo_layout.editable_key(clone) != key
    shutil.copytree(clone, tmp_path / "other")
    assert repo_layout.editable_key(tmp_path / "other") != repo_layout.editable_key(clone)


# --- cache locations: one rule -------------------------------------------------------------------


def test_cache_dirs_follow_variables_then_xdg_then_home(monkeypatch, tmp_path):
    from dynamicemb_core.ops import cache_dirs, loader

    for name in ("DEMB_HOME", "DYNAMICEMB_CACHE_DIR", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "user"))
    assert loader.cache_root() == tmp_path / "user" / ".cache" / "dynamicemb_core"
    assert repo_layout.demb_home() == tmp_path / "user" / ".cache" / "dynamicemb-core"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert loader.cache_root() == tmp_path / "xdg" / "dynamicemb_core"
    assert repo_layout.demb_home() == tmp_path / "xdg" / "dynamicemb-core"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/ignored")  # the XDG spec: relative is invalid
    assert loader.cache_root() == tmp_path / "user" / ".cache" / "dynamicemb_core"
    monkeypatch.setenv("DYNAMICEMB_CACHE_DIR", str(tmp_path / "build"))
    monkeypatch.setenv("DEMB_HOME", str(tmp_path / "home"))
    assert loader.cache_root() == tmp_path / "build"
    assert repo_layout.demb_home() == tmp_path / "home"
    with pytest.raises(ValueError, match="unknown kind 'venvs'; known: build, home"):
        cache_dirs.cache_dir("venvs")


# --- the API reference ---------------------------------------------------------------------------


def _sphinx_project(root: Path, body: str) -> Path:
    root.mkdir()
    (root / "conf.py").write_text("extensions = ['sphinx.ext.autodoc']\n")
    (root / "index.rst").write_text(body)
    return root


def test_docs_build_fails_on_any_warning(tmp_path, capfd):
    clean = _sphinx_project(tmp_path / "clean", "Title\n=====\n\nText.\n")
    assert build_docs.build(tmp_path / "out-clean", source=clean) == 0
    assert (tmp_path / "out-clean" / "index.html").is_file()
    broken = _sphinx_project(tmp_path / "broken", "Title\n=====\n\n.. automodule:: no_such_mod\n")
    assert build_docs.build(tmp_path / "out-broken", source=broken) != 0
    assert "no_such_mod" in capfd.readouterr().err


def test_run_tests_fails_when_reference_has_a_warning(tmp_path, capfd, monkeypatch):
    passing = _suite(tmp_path, "passing", "def test_a(): pass\n")
    broken = _sphinx_project(tmp_path / "broken", "Title\n=====\n\n`unclosed\n")  # a warning
    monkeypatch.setattr(build_docs, "SOURCE", broken)
    assert test_runner.main(["-q"], targets=[passing], docs=True) == 1
    out = capfd.readouterr().out
    assert re.search(r"API reference\s+FAILED \(sphinx exit \d+", out)
    assert out.rstrip().splitlines()[-1] == "total: 1 passed, 0 failed, 0 skipped"


def test_default_test_command_builds_reference_and_nox_has_docs_session():
    """./dev test (CI) and `./dev nox -s docs` run the same build: scripts/build_docs.py."""
    runner = (REPO / "scripts" / "run_tests.py").read_text()
    assert "build_docs.build(" in runner
    noxfile = (REPO / "noxfile.py").read_text()
    assert re.search(r"def docs\(session.*?build_docs\.py", noxfile, re.S)
    assert repo_layout.lock_pins()["sphinx"]


# --- README and CI -------------------------------------------------------------------------------


def test_readme_quick_start_is_two_dev_commands():
    commands = _quick_start_commands()
    assert len(commands) == 2, commands
    assert [c.split()[:2] for c in commands] == [["./dev", "demo"], ["./dev", "test"]]
    dev = (REPO / "dev").read_text()
    for command in commands:
        assert re.search(rf"^\s*{command.split()[1]}\)", dev, re.M), f"./dev has no '{command}'"


def _readme_dev_commands() -> List[List[str]]:
    """Every `./dev ...` line of README.md's ```bash blocks, split into words, comments dropped."""
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", (REPO / "README.md").read_text(), re.S):
        for line in block.splitlines():
            words = line.split("#", 1)[0].split()
            if words[:1] == ["./dev"]:
                commands.append(words)
    return commands


def test_readme_dev_commands_name_what_exists():
    """Each README command as written: a ./dev verb, a `python -m dynamicemb_core` command, a
    nox session, a pytest path (running them all is ./dev test's and CI's job)."""
    from dynamicemb_core.__main__ import _COMMANDS

    commands = _readme_dev_commands()
    assert len(commands) >= 8, commands
    dev = (REPO / "dev").read_text()
    noxfile = (REPO / "noxfile.py").read_text()
    for words in commands:
        verb = words[1]
        assert re.search(rf"^\s*{re.escape(verb)}\)", dev, re.M), f"./dev has no {verb!r}: {words}"
        if words[1:4] == ["python", "-m", "dynamicemb_core"]:
            assert words[4] in _COMMANDS, words
        if verb == "nox" and "-s" in words:
            session = words[words.index("-s") + 1]
            assert re.search(rf"^def {session}\(", noxfile, re.M), words
        if verb == "pytest":
            assert (REPO / words[2]).exists(), words


def test_ci_runs_readme_test_command_verbatim_as_last_command():
    test_command = _quick_start_commands()[1]
    lines = _code_lines(REPO / ".ci" / "run")
    assert lines[-1] == test_command, "the README's test command must be .ci/run's last command"
    assert (REPO / ".ci" / "run").read_text().startswith("#!/usr/bin/env bash")
    assert "set -euo pipefail" in lines


# --- plugins -------------------------------------------------------------------------------------


def _plugin_folders() -> List[Path]:
    root = REPO / "plugins"
    folders = sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []
    # A folder with no file (git keeps none) is not a plugin yet.
    return [
        p for p in folders if any(f.is_file() for f in p.rglob("*") if "__pycache__" not in f.parts)
    ]


def test_every_plugin_folder_has_pyproject():
    missing = [p.name for p in _plugin_folders() if not (p / "pyproject.toml").is_file()]
    assert not missing, f"plugins without pyproject.toml: {missing}"
    assert [p.name for p in repo_layout.plugin_dirs()] == [p.name for p in _plugin_folders()]


@pytest.mark.parametrize("folder", _plugin_folders(), ids=lambda p: p.name)
def test_plugin_metadata_follows_conventions(folder):
    project = _pyproject(folder / "pyproject.toml")["project"]
    assert folder.name.startswith("demb_")
    assert project["name"] == folder.name.replace("_", "-")
    requirements = [Requirement(r) for r in project.get("dependencies", [])]
    names = {repo_layout.normalize(r.name) for r in requirements}
    assert not names & _NEVER_RESOLVED, (
        f"{folder.name} asks pip to resolve {names & _NEVER_RESOLVED}"
    )
    core = [r for r in requirements if repo_layout.normalize(r.name) == "dynamicemb-core"]
    assert core, f"{folder.name} does not depend on dynamicemb-core"
    assert any(s.operator == "<" for s in core[0].specifier), "core dependency needs an upper bound"
    assert "dynamicemb" in project.get("entry-points", {}), "no entry point in group 'dynamicemb'"
    assert (folder / "tests").is_dir(), f"{folder.name} has no tests/ folder"


# --- the core's pyproject ------------------------------------------------------------------------


def test_core_dependencies_are_bounded_and_leave_torch_alone():
    config = _pyproject(REPO / "pyproject.toml")
    assert config["project"]["name"] == "dynamicemb-core"
    for spec in config["project"]["dependencies"]:
        requirement = Requirement(spec)
        assert repo_layout.normalize(requirement.name) not in _NEVER_RESOLVED, spec
        assert any(s.operator in ("<", "<=", "==") for s in requirement.specifier), (
            f"{spec}: no upper bound"
        )
    for spec in config["build-system"]["requires"]:
        assert repo_layout.normalize(Requirement(spec).name) not in _NEVER_RESOLVED, spec


def _collect(tmp_path: Path, *args: str) -> List[str]:
    """Test names that pytest, configured by the repo's pyproject.toml, selects in a sample file."""
    sample = tmp_path / "test_sample.py"
    sample.write_text(
        textwrap.dedent(
            """
            import pytest
            def test_plain(): pass
            @pytest.mark.slow
            def test_slow(): pass
            @pytest.mark.gpu
            def test_gpu(): pass
            @pytest.mark.gpu
            @pytest.mark.slow
            def test_gpu_slow(): pass
            """
        )
    )
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-c",
            str(REPO / "pyproject.toml"),
            "--rootdir",
            str(tmp_path),
        ]
        + ["-p", "no:cacheprovider", "--collect-only", "-q", str(sample), *args],
        capture_output=True,
        text=True,
        env={k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"},
    )
    assert done.returncode in (0, 5), done.stdout + done.stderr
    return sorted(re.findall(r"::(test_\w+)", done.stdout))


def test_pytest_deselects_slow_by_default(tmp_path):
    assert _collect(tmp_path) == ["test_gpu", "test_plain"]


def test_pytest_marker_flags_replace_default(tmp_path):
    assert _collect(tmp_path, "-m", "gpu") == ["test_gpu", "test_gpu_slow"]
    assert _collect(tmp_path, "-m", "slow") == ["test_gpu_slow", "test_slow"]


def test_pytest_rejects_unregistered_markers(tmp_path):
    (tmp_path / "test_typo.py").write_text(
        "import pytest\n@pytest.mark.sloww\ndef test_x(): pass\n"
    )
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-c",
            str(REPO / "pyproject.toml"),
            "--rootdir",
            str(tmp_path),
        ]
        + ["-p", "no:cacheprovider", "-q", str(tmp_path / "test_typo.py")],
        capture_output=True,
        text=True,
    )
    assert done.returncode != 0 and "sloww" in done.stdout + done.stderr


# --- the test command ----------------------------------------------------------------------------


def _suite(root: Path, name: str, body: str) -> repo_layout.SuiteTarget:
    folder = root / name
    folder.mkdir()
    if body:
        (folder / f"test_{name}.py").write_text(textwrap.dedent(body))
    return repo_layout.SuiteTarget(name, folder)


def test_run_tests_sums_suites_and_accepts_one_empty_suite(tmp_path, capfd):
    passing = _suite(
        tmp_path,
        "passing",
        """
        import pytest
        def test_a(): pass
        def test_b(): pass
        def test_c(): pytest.skip("shown as skipped")
        """,
    )
    empty = _suite(tmp_path, "empty", "")
    assert test_runner.main(["-q"], targets=[passing, empty]) == 0
    out = capfd.readouterr().out
    assert out.rstrip().splitlines()[-1] == "total: 2 passed, 0 failed, 1 skipped"
    assert "ok, no tests selected" in out


def test_run_tests_fails_when_a_suite_fails(tmp_path, capfd):
    passing = _suite(tmp_path, "passing", "def test_a(): pass\n")
    failing = _suite(tmp_path, "failing", "def test_b(): assert False\n")
    assert test_runner.main(["-q"], targets=[passing, failing]) == 1
    assert (
        capfd.readouterr().out.rstrip().splitlines()[-1] == "total: 1 passed, 1 failed, 0 skipped"
    )


def test_run_tests_fails_when_nothing_ran(tmp_path, capfd):
    only_slow = _suite(
        tmp_path, "only_slow", "import pytest\n@pytest.mark.slow\ndef test_s(): pass\n"
    )
    empty = _suite(tmp_path, "empty", "")
    assert test_runner.main(["-q"], targets=[only_slow, empty]) != 0
    assert "no test ran" in capfd.readouterr().err


def test_default_suites_are_core_then_each_plugin_with_tests():
    targets = repo_layout.suite_targets()
    assert targets[0] == repo_layout.SuiteTarget("core", REPO / "tests")
    expected = [p.name for p in repo_layout.plugin_dirs() if (p / "tests").is_dir()]
    assert [t.name for t in targets[1:]] == expected


# --- the wheel -----------------------------------------------------------------------------------


def test_plain_wheel_ships_csrc_and_declares_no_torch(tmp_path):
    """DYNAMICEMB_WHEEL_OPS=0: the wheel without a library (py3-none-any), compiled on first use;
    tests/test_wheels.py checks the one with the library."""
    source = tmp_path / "src"
    source.mkdir()
    for name in ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md"):
        shutil.copy2(REPO / name, source / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.so", "*.egg-info")
    for folder in ("dynamicemb_core", "csrc"):
        shutil.copytree(REPO / folder, source / folder, ignore=ignore)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation"]
        + ["--no-index", "--wheel-dir", str(tmp_path / "dist"), str(source)],
        check=True,
        capture_output=True,
        env={**os.environ, "DYNAMICEMB_WHEEL_OPS": "0"},
    )
    (wheel,) = (tmp_path / "dist").glob("dynamicemb_core-*.whl")
    assert wheel.name == "dynamicemb_core-0.1.0-py3-none-any.whl"
    names = set(zipfile.ZipFile(wheel).namelist())
    sources = [p for p in (REPO / "csrc").rglob("*") if p.suffix in (".h", ".cuh", ".cpp", ".cu")]
    assert sources, "no C++ sources found under csrc/"
    for path in sources:
        assert f"dynamicemb_core/csrc/{path.relative_to(REPO / 'csrc').as_posix()}" in names
    assert "dynamicemb_core/__init__.py" in names
    assert not any(n.endswith(".so") for n in names)
    metadata = next(n for n in names if n.endswith(".dist-info/METADATA"))
    requires = [
        line.split(":", 1)[1].strip()
        for line in zipfile.ZipFile(wheel).read(metadata).decode().splitlines()
        if line.startswith("Requires-Dist:")
    ]
    resolved = {repo_layout.normalize(Requirement(r).name) for r in requires}
    assert not resolved & _NEVER_RESOLVED


# --- nox -----------------------------------------------------------------------------------------


def test_nox_selects_plugins_by_env_and_logs_each_left_out(monkeypatch, caplog):
    import noxfile

    names = [p.name for p in repo_layout.plugin_dirs()]
    assert len(names) >= 2, "this test needs two plugins to select between"
    monkeypatch.setenv("PLUGINS", ",".join(names[:2]))
    monkeypatch.setenv("SKIP_PLUGINS", names[1])
    with caplog.at_level(logging.INFO, logger="nox"):
        selected = noxfile.select_plugins()
    assert list(selected) == names[:1]
    log = caplog.text
    assert f"plugin {names[1]}: left out, in SKIP_PLUGINS={names[1]}" in log
    for name in names[2:]:
        assert f"plugin {name}: left out, not in PLUGINS=" in log


def test_nox_rejects_unknown_plugin_names(monkeypatch):
    import noxfile

    monkeypatch.setenv("PLUGINS", "demb_nonexistent")
    monkeypatch.delenv("SKIP_PLUGINS", raising=False)
    with pytest.raises(
        ValueError, match="PLUGINS: no plugin folder named demb_nonexistent; plugins: "
    ):
        noxfile.select_plugins()


def test_nox_keeps_envs_outside_clone_and_reuses_them():
    import noxfile

    assert noxfile.nox.options.reuse_venv == "yes"
    assert REPO not in Path(noxfile.nox.options.envdir).parents


_IMPORT_EACH_FIRST = r"""
import os, pkgutil, sys
import torch  # noqa: F401  (loaded once, before the forks: the slow part of every import)
import dynamicemb_core as pkg
# ops.fake registers fake kernels for ops that must already exist: the loader imports it right
# after loading the library (csrc/ops.cpp names it), never before.
after_load = {"dynamicemb_core.ops.fake"}
names = sorted(
    m.name for m in pkgutil.walk_packages(pkg.__path__, "dynamicemb_core.") if m.name not in after_load
)
for mod in list(sys.modules):  # the children start from a package that is not imported yet
    if mod == "dynamicemb_core" or mod.startswith("dynamicemb_core."):
        del sys.modules[mod]
failed = []
for name in names:
    pid = os.fork()
    if pid == 0:
        try:
            __import__(name)
        except BaseException as e:
            print(f"{name}: {type(e).__name__}: {e}", flush=True)
            os._exit(1)
        os._exit(0)
    if os.waitpid(pid, 0)[1] != 0:
        failed.append(name)
print(f"{len(names)} modules, failed: {failed}")
sys.exit(1 if failed else 0)
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_every_module_imports_as_the_first_one():
    """Each module of the package imports in an interpreter where nothing of the package was
    imported yet: an import cycle between layers (storage importing from lookup, which imports
    storage) shows only when the lower module comes first, e.g. a test file run on its own."""
    res = subprocess.run(
        [sys.executable, "-c", _IMPORT_EACH_FIRST],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
