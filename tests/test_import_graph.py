"""The package's import structure stays a stack (issue 30): no import circle but the plugin registry's
own registry <-> builtins pair, and at most :data:`MAX_ARROWS_BACK_UP` room arrows running back up
the layer order of scripts/import_graph.py. Lazy (function-level) imports count.

At main 81da4eb the analysis found 2 circles (14 files: table, storage, plugins, admission; types,
config, plugins/storage_checks) and 8 arrows back up; after issue 30's moves, 1 circle (the registry
pair) and 3 arrows back up (lookup -> checkpoint, plugins -> the package's ``__init__``,
plugins -> testing).
"""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parent.parent
MAX_ARROWS_BACK_UP = 3
ALLOWED_CIRCLE = ["dynamicemb_core.plugins.builtins", "dynamicemb_core.plugins.registry"]
# Old import paths kept for code written against them; they re-export and hold no logic.
REEXPORTS = [
    "dynamicemb_core/plugins/row_codec.py",
    "dynamicemb_core/plugins/storage_adapter.py",
    "dynamicemb_core/plugins/storage_checks.py",
    "dynamicemb_core/shard/ownership.py",
]


def _tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("import_graph", REPO / "scripts/import_graph.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their module while being created
    spec.loader.exec_module(module)
    return module


def test_no_circle_but_the_plugin_registry_pair() -> None:
    tool = _tool()
    report = tool.analyse(REPO / "dynamicemb_core")
    assert report.circles == [ALLOWED_CIRCLE], tool.format_report(report)


def test_few_arrows_run_back_up_and_every_room_has_a_layer() -> None:
    tool = _tool()
    report = tool.analyse(REPO / "dynamicemb_core")
    assert not report.unlayered_rooms, tool.format_report(report)
    assert len(report.back_up) <= MAX_ARROWS_BACK_UP, tool.format_report(report)


def test_the_tool_sees_a_lazy_circle_and_an_arrow_back_up(tmp_path: Path) -> None:
    """The analysis itself: a circle closed by a function-level import, and a low room importing a
    high one, are found; an import under ``if TYPE_CHECKING:`` is not an arrow."""
    pkg = tmp_path / "dynamicemb_core"
    (pkg / "table").mkdir(parents=True)
    (pkg / "plugins").mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "types.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from dynamicemb_core.plugins import registry\n"
    )
    (pkg / "table" / "__init__.py").write_text("from dynamicemb_core.table.spec import TableSpec\n")
    (pkg / "table" / "spec.py").write_text(
        "from dynamicemb_core import types\n"
        "class TableSpec:\n    def f(self):\n        from dynamicemb_core.plugins import resolve\n"
    )
    (pkg / "plugins" / "__init__.py").write_text("")
    (pkg / "plugins" / "registry.py").write_text("")
    (pkg / "plugins" / "resolve.py").write_text("from dynamicemb_core.table import TableSpec\n")
    tool = _tool()
    report = tool.analyse(pkg)
    assert report.circles == [
        [
            "dynamicemb_core.plugins.resolve",
            "dynamicemb_core.table",
            "dynamicemb_core.table.spec",
        ]
    ]
    assert sorted(report.back_up) == [("table", "plugins")]
    assert report.type_checking_imports == 1 and report.lazy_arrows == 1


def test_old_import_paths_only_re_export() -> None:
    for rel in REEXPORTS:
        tree = ast.parse((REPO / rel).read_text(encoding="utf-8"))
        body = tree.body[1:] if ast.get_docstring(tree) else tree.body
        for node in body:
            is_all = isinstance(node, ast.Assign) and [
                getattr(t, "id", None) for t in node.targets
            ] == ["__all__"]
            assert isinstance(node, ast.ImportFrom) or is_all, (
                f"{rel}:{node.lineno}: a re-export module holds imports and __all__ only"
            )
