"""PEP 562 lazy public names: one implementation for every package ``__init__`` that re-exports.

A package lists ``{public name: defining module}`` and gets ``__getattr__`` / ``__dir__`` that import the
defining module on first access only, so importing a package never builds the C++ extension or pulls
TorchRec in before a name that needs it is used.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, Dict, List, MutableMapping, Tuple


def lazy_exports(
    package: str, exports: Dict[str, str], namespace: MutableMapping[str, Any]
) -> Tuple[Callable[[str], Any], Callable[[], List[str]]]:
    """Return ``(__getattr__, __dir__)`` for ``package`` resolving ``exports`` lazily.

    Args:
        package: the package's ``__name__`` (for the AttributeError text).
        exports: public name -> module that defines it.
        namespace: the package's ``globals()``; a resolved name is cached there.
    """

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    def __dir__() -> List[str]:
        return sorted(set(namespace.get("__all__", exports)))

    return __getattr__, __dir__
