"""The import structure of ``dynamicemb_core``: its circles and the arrows that run back up the layers.

Reads every ``.py`` file under ``dynamicemb_core/`` with :mod:`ast` (nothing is imported) and builds two
graphs:

* the **file graph**: one node per module, one arrow per ``import``/``from ... import`` of another module
  of the package. ``from pkg import name`` points at ``pkg/name.py`` when that is a module, else at
  ``pkg/__init__.py``; importing a submodule does not add arrows to its parent packages (as grimp and
  import-linter count). Its strongly connected components of two or more files are the **circles**: each
  is reported with the files and lines that make its arrows.
* the **room graph**: a room is a subpackage (``dynamicemb_core/<sub>/``) or a top-level module
  (``config.py``, ``types.py``, ...; the package's own ``__init__.py`` is the room ``dynamicemb_core``).
  An arrow between two rooms exists when some file of one imports some file of the other.

Imports inside a function or method (**lazy** imports) run later, but they still make the arrow: a
circle closed by a lazy import is a circle of the design, so they count in both graphs and are also
counted on their own. Imports under ``if TYPE_CHECKING:`` never run and are left out (counted apart).

**Layers.** An arrow **runs back up** when it goes from a room of a lower layer to a room of a higher
one, in this order (lowest first; rooms of one layer may import each other; from ARCHITECTURE.md's
layout: the plugin surface and the options are the floor, the kernels and the table above them, the
storage (the group) above the table, the lookup module that composes them above that, the TorchRec
integration, checkpoint and inference above the module, and the tools on top):

0. ``_weak``, ``nvtx``, ``redaction``, ``devices``, ``dtypes``, ``environment``, ``_lazy_exports``:
   leaves
1. ``types``, ``config``: the ABCs (Storage, Counter, AdmissionStrategy) and the options
2. ``ops``: loading the compiled library and its typed wrappers
3. ``table``: ScoredHashTable, score policies, key hashing and ownership
4. ``optim``, ``admission``: optimizer state layout; KVCounter (a ScoredHashTable) and strategies
5. ``storage``: the group, its cache and backing stores, the storage contract toolkit
6. ``plugins``: the registry that resolves names to the objects of layers 1-5
7. ``lookup``: the batched tables module and its step
8. ``planner``, ``shard``, ``checkpoint``, ``tracking``, ``batched_dynamicemb_tables``, ``optimizer``:
   the TorchRec integration, dump/load, the delta tracker of sharded models
9. ``inference``, ``dump_load``, ``incremental_dump``, ``dynamicemb_config``, ``embedding_admission``:
   served models and the seed's module paths (re-exports)
10. ``testing``, ``demo``, ``info``, ``dynamicemb_core`` (the public ``__init__``), ``__main__``: tools
    and the public face

Usage::

    python scripts/import_graph.py [PACKAGE_DIR]   # default: dynamicemb_core/ beside this script
    python scripts/import_graph.py --json [PACKAGE_DIR]

``tests/test_import_graph.py`` runs :func:`analyse` and holds the package to its limits.
"""

from __future__ import annotations

import ast
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Set, Tuple

PACKAGE = "dynamicemb_core"
ROOT_ROOM = PACKAGE

LAYERS: Tuple[Tuple[str, ...], ...] = (
    ("_weak", "nvtx", "redaction", "devices", "dtypes", "environment", "_lazy_exports"),
    ("types", "config"),
    ("ops",),
    ("table",),
    ("optim", "admission"),
    ("storage",),
    ("plugins",),
    ("lookup",),
    ("planner", "shard", "checkpoint", "tracking", "batched_dynamicemb_tables", "optimizer"),
    ("inference", "dump_load", "incremental_dump", "dynamicemb_config", "embedding_admission"),
    ("testing", "demo", "info", ROOT_ROOM, "__main__"),
)
LAYER_OF: Dict[str, int] = {room: i for i, rooms in enumerate(LAYERS) for room in rooms}


@dataclass(frozen=True)
class Arrow:
    """One import of a module of the package by another: where it is written and how it runs."""

    source: str  # importing module, dotted
    target: str  # imported module, dotted
    path: str  # importing file, relative to the package's parent
    line: int
    lazy: bool  # inside a function or method


@dataclass
class Report:
    """What :func:`analyse` finds; see the module docstring for the definitions."""

    modules: List[str]
    arrows: List[Arrow]
    type_checking_imports: int
    circles: List[List[str]]  # file-level SCCs of 2+ modules, sorted
    circle_arrows: List[List[Arrow]]  # the arrows inside each circle
    room_arrows: Dict[Tuple[str, str], List[Arrow]]
    back_up: Dict[Tuple[str, str], List[Arrow]]
    lines_of_python: int
    unlayered_rooms: List[str] = field(default_factory=list)

    @property
    def files_in_circles(self) -> int:
        return sum(len(c) for c in self.circles)

    @property
    def lazy_arrows(self) -> int:
        return sum(1 for a in self.arrows if a.lazy)

    def summary(self) -> Dict[str, object]:
        """The counts, as a small JSON-able dict."""
        return {
            "modules": len(self.modules),
            "rooms": len({room_of(m) for m in self.modules}),
            "file_arrows": len(self.arrows),
            "lazy_arrows": self.lazy_arrows,
            "type_checking_imports": self.type_checking_imports,
            "room_arrows": len(self.room_arrows),
            "arrows_back_up": len(self.back_up),
            "circles": len(self.circles),
            "files_in_circles": self.files_in_circles,
            "circle_members": self.circles,
            "back_up": sorted(f"{s} -> {t}" for s, t in self.back_up),
            "lines_of_python": self.lines_of_python,
        }


def room_of(module: str) -> str:
    """The room of a dotted module name: its first component below the package, or the package itself."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ROOT_ROOM


def _module_name(package_dir: Path, path: Path) -> str:
    rel = path.relative_to(package_dir.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.Module) -> Iterable[Tuple[ast.stmt, bool, bool]]:
    """Yield (import statement, lazy, under TYPE_CHECKING) for every import in the tree."""

    def walk(node: ast.AST, lazy: bool, typing_only: bool) -> Iterable[Tuple[ast.stmt, bool, bool]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                yield child, lazy, typing_only
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                yield from walk(child, True, typing_only)
            elif isinstance(child, ast.If) and _is_type_checking(child.test):
                for stmt in child.body:
                    yield from walk(ast.Module(body=[stmt], type_ignores=[]), lazy, True)
                for stmt in child.orelse:
                    yield from walk(ast.Module(body=[stmt], type_ignores=[]), lazy, typing_only)
            else:
                yield from walk(child, lazy, typing_only)

    yield from walk(tree, False, False)


def _targets(stmt: ast.stmt, module: str, is_package: bool, known: Set[str]) -> Iterable[str]:
    """The package modules one import statement loads (grimp's rule, see the module docstring)."""
    if isinstance(stmt, ast.Import):
        for alias in stmt.names:
            name = alias.name
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name:
                yield name
        return
    assert isinstance(stmt, ast.ImportFrom)
    if stmt.level:
        base_parts = module.split(".")
        if not is_package:
            base_parts = base_parts[:-1]
        if stmt.level > 1:
            base_parts = base_parts[: len(base_parts) - (stmt.level - 1)]
        base = ".".join(base_parts + ([stmt.module] if stmt.module else []))
    else:
        base = stmt.module or ""
    if base.split(".")[0] != PACKAGE:
        return
    for alias in stmt.names:
        sub = f"{base}.{alias.name}"
        if sub in known:
            yield sub
            continue
        name = base
        while name and name not in known:
            name = name.rpartition(".")[0]
        if name:
            yield name


def _sccs(nodes: List[str], edges: Dict[str, Set[str]]) -> List[List[str]]:
    """Tarjan's strongly connected components (iterative), each sorted, of two or more nodes."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    on_stack: Set[str] = set()
    stack: List[str] = []
    out: List[List[str]] = []
    counter = 0
    for root in nodes:
        if root in index:
            continue
        work: List[Tuple[str, Iterable[str]]] = [(root, iter(sorted(edges.get(root, ()))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            advanced = False
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                    advanced = True
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    comp.append(member)
                    if member == node:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return sorted(out)


def analyse(package_dir: Optional[Path] = None) -> Report:
    """Build the file and room graphs of the package at ``package_dir`` and find circles and back-up arrows."""
    if package_dir is None:
        package_dir = Path(__file__).resolve().parent.parent / PACKAGE
    package_dir = Path(package_dir)
    files = sorted(p for p in package_dir.rglob("*.py") if "__pycache__" not in p.parts)
    by_module = {_module_name(package_dir, p): p for p in files}
    known = set(by_module)
    arrows: List[Arrow] = []
    type_checking = 0
    lines = 0
    for module, path in sorted(by_module.items()):
        source = path.read_text(encoding="utf-8")
        lines += len(source.splitlines())
        tree = ast.parse(source, filename=str(path))
        for stmt, lazy, typing_only in _imports(tree):
            targets = [
                t for t in _targets(stmt, module, path.name == "__init__.py", known) if t != module
            ]
            if typing_only:
                type_checking += len(targets)
                continue
            rel = str(path.relative_to(package_dir.parent))
            for target in dict.fromkeys(targets):
                arrows.append(Arrow(module, target, rel, stmt.lineno, lazy))

    edges: Dict[str, Set[str]] = {}
    for a in arrows:
        edges.setdefault(a.source, set()).add(a.target)
    circles = _sccs(sorted(known), edges)
    circle_arrows = []
    for comp in circles:
        members = set(comp)
        circle_arrows.append([a for a in arrows if a.source in members and a.target in members])

    room_arrows: Dict[Tuple[str, str], List[Arrow]] = {}
    for a in arrows:
        s, t = room_of(a.source), room_of(a.target)
        if s != t:
            room_arrows.setdefault((s, t), []).append(a)
    rooms = {room_of(m) for m in known}
    unlayered = sorted(r for r in rooms if r not in LAYER_OF)
    back_up = {
        k: v
        for k, v in room_arrows.items()
        if k[0] in LAYER_OF and k[1] in LAYER_OF and LAYER_OF[k[0]] < LAYER_OF[k[1]]
    }
    return Report(
        modules=sorted(known),
        arrows=arrows,
        type_checking_imports=type_checking,
        circles=circles,
        circle_arrows=circle_arrows,
        room_arrows=room_arrows,
        back_up=back_up,
        lines_of_python=lines,
        unlayered_rooms=unlayered,
    )


def _where(a: Arrow) -> str:
    return f"{a.path}:{a.line}{' (lazy)' if a.lazy else ''}"


def format_report(report: Report) -> str:
    """The human-readable report: counts first, then each circle and each arrow back up with its lines."""
    s = report.summary()
    out = [
        f"{s['modules']} modules in {s['rooms']} rooms, {s['lines_of_python']} lines of Python",
        f"{s['file_arrows']} file arrows ({s['lazy_arrows']} lazy, "
        f"{s['type_checking_imports']} TYPE_CHECKING-only left out), {s['room_arrows']} room arrows",
        f"circles: {s['circles']}, files in circles: {s['files_in_circles']}",
        f"arrows back up: {s['arrows_back_up']}",
    ]
    if report.unlayered_rooms:
        out.append(f"rooms with no layer (add them to LAYERS): {', '.join(report.unlayered_rooms)}")
    for comp, comp_arrows in zip(report.circles, report.circle_arrows):
        out.append(f"\ncircle of {len(comp)} files: {', '.join(comp)}")
        for a in sorted(comp_arrows, key=lambda a: (a.path, a.line)):
            out.append(f"  {a.source} -> {a.target}  ({_where(a)})")
    if report.back_up:
        out.append("\narrows back up (lower layer -> higher layer):")
        for (src, dst), arrs in sorted(report.back_up.items()):
            out.append(f"  {src} [{LAYER_OF[src]}] -> {dst} [{LAYER_OF[dst]}]")
            for a in sorted(arrs, key=lambda a: (a.path, a.line)):
                out.append(f"    {a.source} -> {a.target}  ({_where(a)})")
    return "\n".join(out)


def main(argv: List[str]) -> int:
    as_json = "--json" in argv
    args = [a for a in argv if a != "--json"]
    report = analyse(Path(args[0]) if args else None)
    if as_json:
        print(json.dumps(report.summary(), indent=2))
    else:
        print(format_report(report))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
