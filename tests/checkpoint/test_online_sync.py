"""examples/online_sync: the trainer and the replica commands over one directory."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLE = os.path.join(ROOT, "examples", "online_sync")


def _load(name: str):
    """Import an example script as a module (its own folder first on sys.path, as when run)."""
    sys.path.insert(0, EXAMPLE)
    try:
        spec = importlib.util.spec_from_file_location(
            f"online_sync_{name}", os.path.join(EXAMPLE, f"{name}.py")
        )
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(EXAMPLE)


def test_trainer_then_replica_commands_match_bit_for_bit(tmp_path):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    common = ["--dir", str(tmp_path)]
    trainer = subprocess.run(
        [
            sys.executable,
            "-W",
            "ignore",
            os.path.join(EXAMPLE, "trainer.py"),
            *common,
            "--steps",
            "7",
            "--dump-every",
            "3",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert trainer.returncode == 0, trainer.stderr
    assert "3 delta files" in trainer.stdout  # after steps 3 and 6, and once after the last step
    replica = subprocess.run(
        [sys.executable, "-W", "ignore", os.path.join(EXAMPLE, "replica.py"), *common],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert replica.returncode == 0, replica.stdout + replica.stderr
    assert "forward matches" in replica.stdout


def test_trainer_clears_stale_files_of_an_earlier_run(tmp_path):
    trainer, replica = _load("trainer"), _load("replica")
    assert (
        trainer.main(["--dir", str(tmp_path), "--steps", "12", "--dump-every", "2"]) == 0
    )  # files 0000..0005
    assert (
        trainer.main(["--dir", str(tmp_path), "--steps", "4", "--dump-every", "2"]) == 0
    )  # a shorter run
    assert sorted(p for p in os.listdir(tmp_path) if p.startswith("delta")) == [
        "delta_rank0_0000.pt",
        "delta_rank0_0001.pt",
    ]
    assert replica.main(["--dir", str(tmp_path)]) == 0


def test_replica_notices_a_missing_final_delta(tmp_path):
    trainer, replica = _load("trainer"), _load("replica")
    assert trainer.main(["--dir", str(tmp_path), "--steps", "5", "--dump-every", "2"]) == 0
    os.unlink(os.path.join(tmp_path, "delta_rank0_0002.pt"))  # the dump after the last step
    assert replica.main(["--dir", str(tmp_path)]) == 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
