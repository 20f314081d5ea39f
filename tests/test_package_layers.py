"""The Python package is arranged in layers: each module imports, at module
level, only modules below it, so the relative imports form no cycle and no
import has to hide inside a function. Today, from the bottom:

    errors, _progress (and the compiled _lazyvault)
    _arrays, _tagged, _pinned
    _layout, _source, _display
    record
    _frame, _arrow, _dataset, _dask
    store
    _archive, _pickling, _interop, _export, dask
    _cli, __init__, __main__

A module a layer up that a lower one needs at run time plugs itself in when
imported (``record.plug_pickling``, ``store.plug_pickling``,
``store.plug_file_opener``); annotations name upper modules under
``TYPE_CHECKING`` only. And no module reads another module's private
attributes: ``record.entry_of(rec)``, not ``rec._record``.

These tests read the source with ``ast`` (nothing is imported).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "pybind" / "python" / "lazyvault"

#: Imports inside functions that stay, each with its reason:
#: ``(module, imported module) -> why``.
IMPORTS_IN_FUNCTIONS = {
    # optional or heavy third-party modules, imported when a feature runs
    ("_frame", "pandas"): "optional dependency, for to_pandas() only",
    ("_arrow", "pyarrow"): "optional dependency (lazyvault[arrow]), for to_arrow() and to_pandas()",
    ("_arrow", "pyarrow.compute"): "optional dependency, for to_pandas() over Arrow",
    ("_arrow", "polars"): "optional dependency (lazyvault[polars]), for to_polars() only",
    ("_dask", "dask"): "optional dependency, for the to_dask_* methods only",
    ("_dask", "dask.array"): "optional dependency, for to_dask_array() only",
    ("_dask", "dask.dataframe"): "optional dependency, for to_dask_dataframe() only",
    ("_dask", "dask.bag"): "optional dependency, for to_dask_bag() only",
    ("_dask", "pandas"): "optional dependency, in the tasks of to_dask_dataframe()",
    ("_progress", "tqdm.auto"): "imported only when a progress bar is shown",
    # lazyvault/dask.py (module "dask") imports the third-party dask when write() runs
    ("dask", "dask"): "optional dependency (lazyvault[dask]), for lazyvault.dask.write only",
    ("dask", "dask.bag"): "optional dependency (lazyvault[dask]), for lazyvault.dask.write only",
}

#: Private names of other modules a module still uses:
#: ``(module, private name) -> why``.
PRIVATE_REACH_INS = {}


def _modules() -> dict[str, ast.Module]:
    return {p.stem: ast.parse(p.read_text(encoding="utf-8"), str(p)) for p in PACKAGE.glob("*.py")}


#: The compiled core, a module with no imports of the package's (its stub).
COMPILED = {p.stem for p in PACKAGE.glob("*.pyi")}


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(body: list[ast.stmt], in_function: bool = False) -> Iterator[tuple[ast.stmt, bool]]:
    """Every import statement under ``body`` with whether it runs inside a
    function; imports under ``if TYPE_CHECKING:`` (annotations only) are
    left out."""
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node, in_function
        elif isinstance(node, ast.If) and _is_type_checking(node):
            yield from _imports(node.orelse, in_function)
        else:
            inner = in_function or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            for field in ("body", "orelse", "finalbody", "handlers", "cases"):
                children = getattr(node, field, None)
                if isinstance(children, list):
                    yield from _imports([c for c in children if isinstance(c, ast.AST)], inner)


def _targets(node: ast.stmt, modules: dict[str, ast.Module]) -> list[str]:
    """The modules ``node`` imports: package modules by their name (what
    ``from . import name`` takes from the package itself is ``__init__``),
    others by their dotted name."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        assert isinstance(node, ast.ImportFrom)
        if node.level == 0 and not (node.module or "").startswith("lazyvault"):
            return [node.module or ""]
        module = (node.module or "").removeprefix("lazyvault").lstrip(".")
        if node.level > 1:
            return [f"{'.' * node.level}{module}"]
        if module:
            return [module.split(".")[0]]
        return [
            a.name if a.name in modules or a.name in COMPILED else "__init__" for a in node.names
        ]
    return [
        n.removeprefix("lazyvault.").split(".")[0] if n.startswith("lazyvault.") else n
        for n in names
    ]


def _graph() -> dict[str, set[str]]:
    """Module-level imports between the package's modules."""
    modules = _modules()
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for name, tree in modules.items():
        for node, in_function in _imports(tree.body):
            if not in_function:
                graph[name].update(t for t in _targets(node, modules) if t in modules)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan),
    and modules importing themselves."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or v in graph[v]:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_package_is_where_these_tests_look() -> None:
    modules = _modules()
    assert {"__init__", "record", "store", "_layout"} <= set(modules)


def test_module_level_imports_form_no_cycle() -> None:
    graph = _graph()
    cycles = _cycles(graph)
    assert not cycles, "import cycles among module-level relative imports: " + "; ".join(
        " <-> ".join(c) for c in cycles
    )


def test_no_imports_inside_functions_but_the_allowed() -> None:
    modules = _modules()
    found: dict[tuple[str, str], list[int]] = {}
    for name, tree in modules.items():
        for node, in_function in _imports(tree.body):
            if in_function:
                for target in _targets(node, modules):
                    found.setdefault((name, target), []).append(node.lineno)
    unexpected = {k: v for k, v in found.items() if k not in IMPORTS_IN_FUNCTIONS}
    assert not unexpected, (
        "imports inside functions (import at module level, from a lower layer; "
        "a module a layer up plugs itself in): "
        + ", ".join(f"{m}.py:{lines} imports {t}" for (m, t), lines in sorted(unexpected.items()))
    )
    stale = sorted(set(IMPORTS_IN_FUNCTIONS) - set(found))
    assert not stale, f"IMPORTS_IN_FUNCTIONS lists imports that are gone: {stale}"


def _own_private_names(tree: ast.Module) -> set[str]:
    """The private names a module defines: its functions, classes and
    globals, and the attributes and methods of its classes (``self._x =``,
    ``__slots__``, ``def _x``)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__slots__" for t in node.targets
        ):
            for elt in ast.walk(node.value):
                if isinstance(elt, ast.Constant) and isinstance(elt.value, str):
                    names.add(elt.value)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
    return {n for n in names if n.startswith("_") and not n.startswith("__")}


def test_no_module_reads_the_private_names_of_another() -> None:
    found: dict[tuple[str, str], list[int]] = {}
    for name, tree in _modules().items():
        own = _own_private_names(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute):
                attr, lineno = node.attr, node.lineno
                if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                    continue
            elif isinstance(node, ast.ImportFrom) and node.level == 1 and node.module:
                for alias in node.names:
                    if alias.name.startswith("_") and not alias.name.startswith("__"):
                        found.setdefault((name, alias.name), []).append(node.lineno)
                continue
            else:
                continue
            if attr.startswith("_") and not attr.startswith("__") and attr not in own:
                found.setdefault((name, attr), []).append(lineno)
    unexpected = {k: v for k, v in found.items() if k not in PRIVATE_REACH_INS}
    assert not unexpected, "private names of other modules read: " + ", ".join(
        f"{m}.py:{lines} reads {a}" for (m, a), lines in sorted(unexpected.items())
    )
    stale = sorted(set(PRIVATE_REACH_INS) - set(found))
    assert not stale, f"PRIVATE_REACH_INS lists reach-ins that are gone: {stale}"
