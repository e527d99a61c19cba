"""Where dynamicemb-core keeps files outside a clone: one rule for every cache location.

Two locations, each overridable by its own variable and otherwise under the user's cache home
(``$XDG_CACHE_HOME``, else ``~/.cache``, as the XDG base-directory spec says):

- ``build``: the compiled ops library (ops/loader.py), ``$DYNAMICEMB_CACHE_DIR``, default
  ``<cache home>/dynamicemb_core``;
- ``home``: the development tools' virtualenvs and nox environments (scripts/layout.py),
  ``$DEMB_HOME``, default ``<cache home>/dynamicemb-core``.

Standard library only: scripts/layout.py loads this file by path before any virtualenv exists.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Dict, Mapping, Optional, Tuple

__all__ = ["CACHE_DIRS", "cache_dir", "user_cache_home"]

# kind -> (the variable that overrides it, the folder under the cache home)
CACHE_DIRS: Dict[str, Tuple[str, str]] = {
    "build": ("DYNAMICEMB_CACHE_DIR", "dynamicemb_core"),
    "home": ("DEMB_HOME", "dynamicemb-core"),
}


def user_cache_home(environ: Optional[Mapping[str, str]] = None) -> Path:
    """``$XDG_CACHE_HOME`` when it is set to an absolute path, else ``~/.cache``.

    The XDG spec says a relative value is invalid and must be ignored.
    """
    env = os.environ if environ is None else environ
    xdg = env.get("XDG_CACHE_HOME", "")
    return Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".cache"


def cache_dir(kind: str, environ: Optional[Mapping[str, str]] = None) -> Path:
    """The folder for ``kind`` (``"build"`` or ``"home"``): its variable, else the default.

    Raises:
        ValueError: for a kind not in :data:`CACHE_DIRS`.
    """
    if kind not in CACHE_DIRS:
        raise ValueError(f"cache_dir: unknown kind {kind!r}; known: {', '.join(CACHE_DIRS)}")
    env = os.environ if environ is None else environ
    variable, folder = CACHE_DIRS[kind]
    override = env.get(variable, "")
    return Path(override) if override else user_cache_home(env) / folder
