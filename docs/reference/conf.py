"""Sphinx configuration of the API reference (docs/reference/), built from the package's docstrings.

Build it with ``./dev nox -s docs`` (HTML under build/docs/reference/) or as one step of
``./dev test``; both call scripts/build_docs.py, which runs Sphinx with warnings as errors.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

project = "dynamicemb-core"
author = "the dynamicemb-core developers"
copyright = "the dynamicemb-core developers"

extensions = ["sphinx.ext.autodoc", "sphinx.ext.napoleon"]

# Google-style sections (Args:, Returns:, Raises:) as the project's docstrings write them.
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False

autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": True, "show-inheritance": True}
# Lazy re-exports (dynamicemb_core.__init__) resolve to their defining modules; document each object
# where it is defined, not again where it is re-exported.
autodoc_inherit_docstrings = True

html_theme = "alabaster"
html_title = "dynamicemb-core API reference"
exclude_patterns = ["_build"]
