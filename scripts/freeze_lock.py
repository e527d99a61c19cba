"""Rewrite requirements/lock.txt from the packages installed in a virtualenv.

    python scripts/freeze_lock.py /path/to/venv/bin/python [--check]

How to change a pin: in a venv built from the lock (`./dev venv` prints it), install the new version
with `pip install --no-deps name==version`, run the tests, then run this script with that venv's
python. The header comment and the `-r torch.txt` line are kept; torch itself stays in torch.txt,
and editable installs (this package, the plugins) are left out. With --check nothing is written and
the exit code says whether the lock already matches the venv (0) or not (1).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path
from typing import List

sys.path.insert(0, str(Path(__file__).resolve().parent))
from layout import LOCK, normalize

_FROM_TORCH_TXT = {"torch"}


def frozen_pins(python: str) -> List[str]:
    """Sorted `name==version` lines of every non-editable package in ``python``'s environment."""
    output = subprocess.check_output(
        [
            python,
            "-m",
            "pip",
            "freeze",
            "--all",
            "--exclude-editable",
            "--disable-pip-version-check",
        ],
        text=True,
    )
    pins = []
    for line in output.splitlines():
        if "==" not in line or line.startswith("#"):
            continue
        name, version = line.split("==", 1)
        if normalize(name) not in _FROM_TORCH_TXT:
            pins.append(f"{normalize(name)}=={version.strip()}")
    return sorted(pins, key=lambda pin: pin.split("==", 1)[0])


def render(pins: List[str], lock: Path = LOCK) -> str:
    """The new lock text: the current file's leading comments and includes, then ``pins``."""
    header = []
    for line in lock.read_text().splitlines():
        if line.startswith("#") or line.startswith("-r ") or not line.strip():
            header.append(line)
        else:
            break
    return "\n".join(header + pins) + "\n"


def main(argv: List[str]) -> int:
    """Write (or with --check, compare) the lock; return the process exit code."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("python", help="the python of the virtualenv to freeze")
    parser.add_argument("--check", action="store_true", help="compare only, write nothing")
    args = parser.parse_args(argv)
    text = render(frozen_pins(args.python))
    if args.check:
        same = text == LOCK.read_text()
        print("lock matches the venv" if same else "lock differs from the venv", file=sys.stderr)
        return 0 if same else 1
    LOCK.write_text(text)
    print(f"wrote {LOCK}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
