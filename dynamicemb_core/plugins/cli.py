"""``python -m dynamicemb_core plugins``: what is installed, its version, its hooks and names."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from typing import List, Optional, TextIO

from dynamicemb_core.plugins.registry import (
    AUTOLOAD_ENV,
    PluginInfo,
    autoload_disabled,
    get_registry,
)
from dynamicemb_core.plugins.types import PluginKind

__all__ = ["format_plugins", "main"]


def format_plugins(infos: List[PluginInfo]) -> str:
    """Plain-text report: one block per plugin, then one table of names per kind."""
    lines = []
    for info in infos:
        version = f" {info.version}" if info.version else ""
        lines.append(f"{info.name}: {info.distribution}{version}")
        lines.append(f"  hooks: {', '.join(info.hooks) or '(none)'}")
    registry = get_registry()
    for kind in PluginKind:
        entries = registry.entries(kind)
        lines.append("")
        lines.append(f"{kind.option_field} ({len(entries)}):")
        for name in sorted(entries):
            entry = entries[name]
            lines.append(f"  {name:<16} {entry.plugin:<18} {entry.description}")
    if autoload_disabled():
        lines.append("")
        lines.append(f"note: {AUTOLOAD_ENV} is set; third-party plugins were not loaded")
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None, out: TextIO = sys.stdout) -> int:
    """Print the installed plugins; ``--json`` prints a machine-readable list instead."""
    parser = argparse.ArgumentParser(
        prog="python -m dynamicemb_core plugins",
        description="List dynamicemb plugins: name, distribution, version, hooks and names.",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    args = parser.parse_args(argv)
    infos = get_registry().plugins()
    if args.json:
        out.write(json.dumps([asdict(info) for info in infos], indent=2) + "\n")
    else:
        out.write(format_plugins(infos) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
