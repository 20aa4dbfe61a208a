"""The tree's architecture, checked (docs/architecture.md#layers): imports point down the
layers only, the engine's modules import each other without a circle (and never through the
package face), engine/config.py is a leaf, the ``Scheduler`` interface lists what the engine
asks of a scheduler, and only the registry turns ``EngineConfig.semantics`` into behaviour."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# each top-level package and the packages it must never import (the layers above it)
LAYERS = {
    "paged_kernels": {"engine", "analysis", "real_vllm", "app", "bench", "deploy", "tests"},
    "engine": {"analysis", "real_vllm", "app", "bench", "deploy", "tests"},
    "analysis": {"real_vllm", "app", "bench", "deploy", "tests"},
    # real vLLM beside the engine: reads our engine like analysis does (the page may use it)
    "real_vllm": {"analysis", "app", "bench", "deploy", "tests"},
    "app": {"bench", "deploy", "tests"},
}


def modules(package: str):
    for path in sorted((ROOT / package).rglob("*.py")):
        rel = path.relative_to(ROOT).with_suffix("")
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        yield ".".join(parts), path, rel.name == "__init__"


def _type_checking_only(node: ast.AST, parents: dict) -> bool:
    while node in parents:
        node = parents[node]
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            return True
    return False


def _in_function(node: ast.AST, parents: dict) -> bool:
    while node in parents:
        node = parents[node]
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            return True
    return False


def _is_module(name: str) -> bool:
    where = ROOT / Path(*name.split("."))
    return where.with_suffix(".py").exists() or (where / "__init__.py").exists()


def _is_package(name: str) -> bool:
    return (ROOT / Path(*name.split(".")) / "__init__.py").exists()


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute module an ``ImportFrom`` names (relative ones resolved against ``module``)."""
    base = node.module or ""
    if node.level:
        here = module.split(".") if is_package else module.split(".")[:-1]
        here = here[:len(here) - node.level + 1]
        base = ".".join(here + ([base] if base else []))
    return base


def reexport_source(package: str, name: str, seen: frozenset = frozenset()) -> set[str]:
    """The modules ``package/__init__.py`` takes ``name`` from: its ``from X import name``
    statements (type-checking ones included: a face that loads its names lazily lists them
    there, and ``test_the_lazy_face_lists_what_it_loads`` checks the two agree), followed
    through packages that re-export it in turn."""
    if not _is_package(package) or package in seen:
        return set()
    path = ROOT / Path(*package.split(".")) / "__init__.py"
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = _resolve(package, True, node)
            for a in node.names:
                if (a.asname or a.name) != name:
                    continue
                full = f"{base}.{a.name}"
                if _is_module(full):
                    out.add(full)
                else:
                    out.add(base)
                    out |= reexport_source(base, a.name, seen | {package})
    return out


def imports(path: Path, module: str, is_package: bool, lazy: bool = True) -> set[str]:
    """Modules ``path`` imports at run time (anywhere in it; ``lazy=False`` leaves out imports
    inside functions; type-checking-only imports are always left out).

    ``from pkg import name`` counts as ``pkg.name`` when that is a module (Python imports the
    submodule itself, even while ``pkg/__init__.py`` is still running). Any other name is read
    from ``pkg``'s namespace, so it counts as ``pkg`` (its ``__init__.py`` must have run that
    far) and as the module ``pkg/__init__.py`` re-exports it from."""
    tree = ast.parse(path.read_text())
    parents = {c: p for p in ast.walk(tree) for c in ast.iter_child_nodes(p)}
    out = set()
    for node in ast.walk(tree):
        if _type_checking_only(node, parents) or (not lazy and _in_function(node, parents)):
            continue
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(module, is_package, node)
            for a in node.names:
                name = f"{base}.{a.name}"
                if _is_module(name):
                    out.add(name)
                else:
                    out.add(base)
                    out |= reexport_source(base, a.name)
    return out


@pytest.mark.parametrize("package", sorted(LAYERS))
def test_no_upward_import(package):
    upward = [f"{module} imports {name}"
              for module, path, pkg in modules(package)
              for name in imports(path, module, pkg)
              if name.split(".")[0] in LAYERS[package]]
    assert not upward, "\n".join(upward)


def test_the_engine_modules_import_each_other_without_a_circle():
    # lazy imports inside functions count too (none closes a circle, so none needs leaving out)
    graph = {module: {n for n in imports(path, module, pkg) if n.split(".")[0] == "engine"}
             for module, path, pkg in modules("engine")}
    # Tarjan's strongly connected components: a component of more than one module is a circle
    index, low, stack, on_stack, circles = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in graph:
                continue
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
            if len(component) > 1 or v in graph.get(v, ()):
                circles.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    assert not circles, circles


def test_the_import_count_sees_names_read_from_a_package(tmp_path):
    source = tmp_path / "probe.py"
    source.write_text("from engine import Engine\n"            # a name: the face and its source
                      "from engine import events\n"            # a module: the module only
                      "from engine.observe.baselines import POLICIES\n"
                      "def f():\n    import engine.config\n"
                      "if TYPE_CHECKING:\n    from engine.outputs import RequestOutput\n")
    found = imports(source, "probe", False)
    assert found == {"engine", "engine.llm_engine", "engine.events", "engine.observe.baselines",
                     "engine.observe.baselines.contiguous", "engine.config"}
    assert "engine.config" not in imports(source, "probe", False, lazy=False)


def test_no_engine_module_imports_the_package_face():
    """``engine/__init__.py`` is for users; inside the engine, ``from engine import X`` runs
    through a module that imports everything, so each module names the real submodule."""
    found = []
    for module, path, _ in modules("engine"):
        if module == "engine":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found += [f"{module}:{node.lineno}: import engine"
                          for a in node.names if a.name == "engine"]
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module == "engine":
                found.append(f"{module}:{node.lineno}: {ast.unparse(node)}")
    assert not found, "import the submodule, not the package face:\n" + "\n".join(found)


def _face_exports() -> tuple[dict[str, str], dict[str, str]]:
    """engine/__init__.py's lazy map, and what its type-checking imports say."""
    tree = ast.parse((ROOT / "engine" / "__init__.py").read_text())
    lazy = next(ast.literal_eval(n.value) for n in tree.body
                if isinstance(n, ast.Assign) and ast.unparse(n.targets[0]) == "_EXPORTS")
    listed = {}
    block = next(n for n in tree.body
                 if isinstance(n, ast.If) and "TYPE_CHECKING" in ast.unparse(n.test))
    for node in ast.walk(block):
        if isinstance(node, ast.ImportFrom):
            for a in node.names:
                full = f"{node.module}.{a.name}"
                listed[a.asname or a.name] = full if _is_module(full) else node.module
    return lazy, listed


def test_the_lazy_face_lists_what_it_loads():
    import engine
    lazy, listed = _face_exports()
    assert lazy == listed
    assert set(lazy) == set(engine.__all__)
    for name in engine.__all__:
        value = getattr(engine, name)
        assert getattr(value, "__name__", None) == lazy[name] or value.__module__ == lazy[name]


def test_the_config_is_a_leaf():
    """engine/config.py imports no engine module when it is imported (the semantics' rules are
    looked up inside the functions that need them), so nothing it imports can import it back
    half-built."""
    path = ROOT / "engine" / "config.py"
    eager = {n for n in imports(path, "engine.config", False, lazy=False)
             if n.split(".")[0] == "engine"}
    assert not eager, eager


def test_importing_the_config_loads_neither_torch_nor_a_scheduler():
    code = ("import sys, engine.config; "
            "print(' '.join(m for m in ('torch', 'engine.sched.v0', 'engine.sched.v1', "
            "'engine.sched.registry') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [], f"import engine.config loaded {done.stdout.split()}"


def _mentions_semantics(node: ast.AST) -> bool:
    return "semantics" in ast.unparse(node)


def _is_string(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str)
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_is_string(e) for e in node.elts)
    return False


def semantics_string_comparisons(source: str, where: str = "") -> list[str]:
    """Comparisons (``==``, ``!=``, ``in``, ``match``) of an expression naming semantics with a
    string."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            named = [o for o in operands if _mentions_semantics(o) and not _is_string(o)]
            if named and any(map(_is_string, operands)):
                found.append(f"{where}:{node.lineno}: {ast.unparse(node)}")
        elif isinstance(node, ast.Match) and _mentions_semantics(node.subject):
            found.append(f"{where}:{node.lineno}: match {ast.unparse(node.subject)}")
    return found


REGISTRY = ROOT / "engine" / "sched" / "registry.py"


def test_only_the_registry_turns_semantics_into_behaviour():
    found = [hit for package in ("engine", "analysis", "app", "bench", "deploy")
             for _, path, _ in modules(package) if path != REGISTRY
             for hit in semantics_string_comparisons(path.read_text(), path.relative_to(ROOT))]
    assert not found, "compare semantics through engine.sched.registry:\n" + "\n".join(found)


def test_the_semantics_check_finds_what_it_looks_for():
    source = ("def f(config, s, fields):\n"
              "    a = config.semantics == 'v1'\n"
              "    b = 'v0' != s.w_semantics\n"
              "    c = config.semantics in ('v0', 'v1')\n"
              "    d = fields not in ('scenario', 'semantics')\n"     # a name, not a value
              "    e = config.semantics == other.semantics\n")      # no string
    assert [h.split(':')[1] for h in semantics_string_comparisons(source)] == ["2", "3", "4"]


def test_the_scheduler_interface_lists_what_the_engine_asks():
    """Everything read from ``<engine>.scheduler`` is declared by ``Scheduler`` (an ABC, so a
    scheduler missing a method cannot even be built)."""
    import re

    from engine.sched.interface import Scheduler
    declared = {*Scheduler.__annotations__, *(n for n in vars(Scheduler) if not n.startswith("_"))}
    asked = {m.group(1) for package in ("engine", "analysis", "app")
             for _, path, _ in modules(package)
             for m in re.finditer(r"\bscheduler\.(\w+)", path.read_text())}
    asked.discard("py")                                     # "scheduler.py" in comments
    assert asked and asked <= declared, asked - declared
    assert not Scheduler.__abstractmethods__ - declared
