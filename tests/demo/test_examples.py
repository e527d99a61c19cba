"""examples/torchrec_to_dynamic.py runs as a user would run it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_torchrec_to_dynamic_example_runs(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "torchrec_to_dynamic.py")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    # the native table is in state_dict, the dynamic one is not
    assert "embedding_bags.country.weight" in proc.stdout
    assert "embedding_bags.user.weight" not in proc.stdout
    loss = float(re.search(r"last loss (\S+)", proc.stdout).group(1))
    assert loss > 0
