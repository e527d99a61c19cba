"""``python -m dynamicemb_core <command>``: build, info, plugins, demo, export.

Each command lives in its own module with a ``main(argv) -> int``; this file only dispatches.
"""

from __future__ import annotations

import importlib
import sys
from typing import Dict, List, Optional

_COMMANDS: Dict[str, str] = {
    "build": "dynamicemb_core.ops.build",  # compile csrc/ ahead of time
    "info": "dynamicemb_core.info",  # checks the install: torch, CUDA, FBGEMM, TorchRec, ops, plugins
    "plugins": "dynamicemb_core.plugins.cli",  # installed plugins, versions, hooks
    "demo": "dynamicemb_core.demo",  # the training demo (README's first command)
    "table-demo": "dynamicemb_core.demo.table_demo",  # inserts past capacity under each strategy
    "export": "dynamicemb_core.inference.cli",  # a DynamicEmbDump -> a served AOTInductor package
}


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in _COMMANDS:
        print("usage: python -m dynamicemb_core {" + ",".join(_COMMANDS) + "} [args]")
        return 0 if not argv or argv[0] in ("-h", "--help") else 2
    command = argv.pop(0)
    module = importlib.import_module(_COMMANDS[command])
    return int(module.main(argv) or 0)


if __name__ == "__main__":
    sys.exit(main())
