"""The package's layering (docs/interfaces.md): imports flow one way, and no set of modules imports itself in a loop.

    base (errors, atomic, version) → model → data → algorithm → runtime → outputs → api → cli → the package root

The package root (spatialfed/__init__.py) is the public facade: it loads the estimator on first use, so it sits on
top and no module of the package imports it.

A module may import from its own layer or a lower one, never a higher one; `model` and `algorithm` import no
execution framework (Dask). Every import counts, including those inside functions and those by name
(``importlib.import_module("spatialfed.x")``, ``__import__``, an f-string's literal prefix): a lazy import that runs up
the layers is still a dependency. Run it alone with ``python -m pytest tests/test_layers.py``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "spatialfed"
LAYERS = (
    ("base", ("spatialfed.errors", "spatialfed.atomic", "spatialfed.version")),
    ("model", ("spatialfed.model",)),
    ("data", ("spatialfed.data",)),
    ("algorithm", ("spatialfed.algorithm",)),
    ("runtime", ("spatialfed.runtime",)),
    ("outputs", ("spatialfed.outputs",)),
    ("api", ("spatialfed.api", "spatialfed.demo")),
    ("cli", ("spatialfed.cli", "spatialfed.__main__")),
    ("facade", ("spatialfed",)),
)
#: third-party packages a layer must not import (the algorithm knows nothing of how it is run)
FORBIDDEN = {"model": ("dask", "distributed", "bokeh"), "algorithm": ("dask", "distributed", "bokeh", "zarr")}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def layer_of(name: str) -> int:
    """Index in LAYERS of the most specific prefix naming `name`."""
    best, index = "", None
    for i, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            inside = name == prefix or (prefix != "spatialfed" and name.startswith(prefix + "."))
            if inside and len(prefix) > len(best):
                best, index = prefix, i
    if index is None:
        raise AssertionError(f"{name} is in no layer of tests/test_layers.py: add it to LAYERS")
    return index


#: calls that import a module named by their first argument
BY_NAME = ("import_module", "__import__")


def imported_by_name(node: ast.Call, known: set[str]) -> str | None:
    """The module a call such as ``importlib.import_module("spatialfed.api")`` imports: a string constant, or an
    f-string's literal prefix resolved to the longest module it names (``f"spatialfed.api.{x}"`` → spatialfed.api)."""
    func = node.func
    called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    if called not in BY_NAME or not node.args:
        return None
    arg = node.args[0]
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return arg.value
    if isinstance(arg, ast.JoinedStr) and arg.values and isinstance(arg.values[0], ast.Constant):
        prefix = str(arg.values[0].value).rstrip(".")
        while prefix and prefix not in known and "." in prefix:
            prefix = prefix.rpartition(".")[0]
        return prefix or None
    return None


def imports(name: str, path: Path, known: set[str]) -> list[tuple[str, int]]:
    """(imported name, line) for every import in the file, by statement or by name: project modules resolved,
    third-party by top package."""
    out = []
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call) and (target := imported_by_name(node, known)):
            out.append((target, node.lineno))
        elif isinstance(node, ast.Import):
            out += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                full = f"{base}.{alias.name}"
                out.append((full if full in known else base, node.lineno))
    return out


def import_graph() -> dict[str, list[tuple[str, int]]]:
    mods = modules()
    known = set(mods)
    return {name: imports(name, path, known) for name, path in mods.items()}


def graph() -> dict[str, list[tuple[str, int]]]:
    """import_graph() computed in a fresh interpreter: CPython 3.11's AST recursion bookkeeping can be left corrupt
    by an earlier RecursionError in the test process ("AST constructor recursion depth mismatch")."""
    import json
    import subprocess
    import sys

    code = ("import json, sys; sys.path.insert(0, sys.argv[1]); import test_layers as t; "
            "print(json.dumps(t.import_graph()))")
    out = subprocess.run([sys.executable, "-c", code, str(Path(__file__).parent)], capture_output=True, text=True,
                         check=True).stdout
    return {name: [(dep, line) for dep, line in deps] for name, deps in json.loads(out).items()}


def test_every_module_sits_in_a_layer():
    for name in modules():
        layer_of(name)


def test_imports_never_run_up_the_layers():
    bad = []
    for name, deps in graph().items():
        deps = sorted(set(deps), key=lambda d: d[1])
        own = layer_of(name)
        for dep, line in deps:
            if dep.split(".")[0] == "spatialfed" and layer_of(dep) > own:
                bad.append(f"{name}:{line} imports {dep} ({LAYERS[own][0]} → {LAYERS[layer_of(dep)][0]})")
            elif dep.split(".")[0] in FORBIDDEN.get(LAYERS[own][0], ()):
                bad.append(f"{name}:{line} imports {dep} (the {LAYERS[own][0]} layer runs on no framework)")
    assert not bad, "imports that run up the layers:\n" + "\n".join(bad)


def strongly_connected(edges: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm: the components with more than one module (import loops)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_no_import_loops():
    g = graph()
    edges = {name: {dep for dep, _ in deps if dep in g and dep != name and not name.startswith(dep + ".")}
             for name, deps in g.items()}
    loops = strongly_connected(edges)
    assert not loops, "modules that import each other in a loop: " + "; ".join(" ↔ ".join(c) for c in loops)


@pytest.mark.parametrize("source, expected", [
    ("from spatialfed.api import FederatedGP\n", "spatialfed.api"),
    ("from spatialfed.runtime import virtual\n", "spatialfed.runtime.virtual"),
    ("import importlib\ndef f():\n    return importlib.import_module('spatialfed.api')\n", "spatialfed.api"),
    ("from importlib import import_module\ndef f(x):\n    return import_module(f'spatialfed.runtime.{x}')\n",
     "spatialfed.runtime"),
    ("def f():\n    return __import__('spatialfed.cli')\n", "spatialfed.cli"),
    ("import spatialfed\n", "spatialfed"),
])
def test_the_check_sees_an_upward_import(tmp_path, source, expected):
    """The checker itself: a model module importing the api or a runtime is caught."""
    path = tmp_path / "spatialfed" / "model" / "bad.py"
    path.parent.mkdir(parents=True)
    path.write_text(source)
    known = set(modules())
    deps = [d for d, _ in imports("spatialfed.model.bad", path, known) if d.startswith("spatialfed")]
    assert deps == [expected] and layer_of(expected) > layer_of("spatialfed.model.bad")


def test_the_check_sees_a_loop():
    assert strongly_connected({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_package_root_loads_the_estimator_only_when_asked():
    """``from spatialfed import FederatedGP`` is the public facade (PEP 562 ``__getattr__``, the one documented way
    the base layer names the api): importing spatialfed or a lower layer must not load the api, scikit-learn or Dask."""
    import subprocess
    import sys

    code = ("import sys, spatialfed, spatialfed.model.local, spatialfed.algorithm.server; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('dask', 'distributed', 'sklearn') "
            "or m.startswith('spatialfed.api')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out
    code = "import spatialfed; print(spatialfed.FederatedGP.__module__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "spatialfed.api.estimator"


#: the house rule: a module that grows past this is split by concern (one concept per module)
MAX_LINES = 500


def test_no_module_is_over_the_line_limit():
    over = {name: n for name, path in modules().items() if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert not over, f"modules over {MAX_LINES} lines (split them by concern): {over}"
