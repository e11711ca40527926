"""The package's layering (docs/interfaces.md): imports flow one way, and no set of modules imports itself in a loop.

    base (errors, atomic) → model → data → algorithm → runtime → outputs → api → cli

A module may import from its own layer or a lower one, never a higher one; `model` and `algorithm` import no
execution framework (Dask). Every import counts, including those inside functions and those made by name
(`importlib.import_module("spatialfed.x")`, `__import__`, an f-string's literal head): a lazy import that runs up
the layers is still a dependency. The one upward import allowed is listed in FACADE. Run it alone with ``python -m pytest tests/test_layers.py``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "spatialfed"
LAYERS = (
    ("base", ("spatialfed", "spatialfed.errors", "spatialfed.atomic")),
    ("model", ("spatialfed.model",)),
    ("data", ("spatialfed.data",)),
    ("algorithm", ("spatialfed.algorithm",)),
    ("runtime", ("spatialfed.runtime",)),
    ("outputs", ("spatialfed.outputs",)),
    ("api", ("spatialfed.api", "spatialfed.demo")),
    ("cli", ("spatialfed.cli", "spatialfed.__main__")),
)
#: the package root's lazy PEP 562 facade (``from spatialfed import FederatedGP``): the one upward import, loaded
#: only on first use (test_the_package_root_loads_the_estimator_only_when_asked)
FACADE = {("spatialfed", "spatialfed.api")}
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


def imports(name: str, path: Path, known: set[str]) -> list[tuple[str, int]]:
    """(imported name, line) for every import in the file: project modules resolved, third-party by top package."""
    out = []
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                full = f"{base}.{alias.name}"
                out.append((full if full in known else base, node.lineno))
        elif isinstance(node, ast.Call) and (target := named_import(node)) is not None:
            out.append((known_prefix(target, known), node.lineno))
    return out


def named_import(call: ast.Call) -> str | None:
    """The module an ``importlib.import_module(...)`` or ``__import__(...)`` call names by a literal (a string, or
    an f-string's literal head such as "spatialfed.api." of f"spatialfed.api.{name}"), else None."""
    func = call.func
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
    if name not in ("import_module", "__import__") or not call.args:
        return None
    arg = call.args[0]
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return arg.value
    if isinstance(arg, ast.JoinedStr) and arg.values and isinstance(arg.values[0], ast.Constant):
        return str(arg.values[0].value).rstrip(".") or None
    return None


def known_prefix(target: str, known: set[str]) -> str:
    """`target` or its longest prefix that is a module of the package (third-party names as they are)."""
    parts = target.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in known:
            return ".".join(parts[:n])
    return target


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
            if dep.split(".")[0] == "spatialfed" and layer_of(dep) > own and (name, dep) not in FACADE:
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
    ("import importlib\ndef __getattr__(name):\n    return importlib.import_module('spatialfed.api.estimator')\n",
     "spatialfed.api.estimator"),
    ("def f(name):\n    return __import__(f'spatialfed.runtime.{name}')\n", "spatialfed.runtime"),
])
def test_the_check_sees_an_upward_import(tmp_path, source, expected):
    """The checker itself: a model module importing the api or a runtime is caught."""
    path = tmp_path / "spatialfed" / "model" / "bad.py"
    path.parent.mkdir(parents=True)
    path.write_text(source)
    known = set(modules())
    deps = imports("spatialfed.model.bad", path, known)
    assert [d for d, _ in deps if d != "importlib"] == [expected]
    assert layer_of(expected) > layer_of("spatialfed.model.bad")


def test_the_package_root_is_checked_and_its_facade_seen():
    """The root's lazy ``importlib.import_module("spatialfed.api")`` is an edge of the graph (allowed by FACADE
    alone): without the allowance it would be reported like any other upward import."""
    deps = {dep for dep, _ in graph()["spatialfed"]}
    assert "spatialfed.api" in deps and layer_of("spatialfed.api") > layer_of("spatialfed")
    assert all(edge[1] in {dep for dep, _ in graph()[edge[0]]} for edge in FACADE)  # no stale allowance


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
