"""The tree's architecture, checked (docs/architecture.md#layers): imports point down the
layers only, the engine's modules import each other without a circle, and only the registry
turns ``EngineConfig.semantics`` into behaviour."""
from __future__ import annotations

import ast
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


def imports(path: Path, module: str, is_package: bool) -> set[str]:
    """Modules ``path`` imports (anywhere in it, lazy imports included; type-checking-only
    imports left out). ``from pkg import name`` counts as ``pkg.name`` when that is a module."""
    tree = ast.parse(path.read_text())
    parents = {c: p for p in ast.walk(tree) for c in ast.iter_child_nodes(p)}
    out = set()
    for node in ast.walk(tree):
        if _type_checking_only(node, parents):
            continue
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:                      # relative: resolve against this module
                here = module.split(".") if is_package else module.split(".")[:-1]
                here = here[:len(here) - node.level + 1]
                base = ".".join(here + ([base] if base else []))
            for a in node.names:
                name = f"{base}.{a.name}"
                is_module = (ROOT / Path(*name.split("."))).with_suffix(".py").exists() \
                    or (ROOT / Path(*name.split(".")) / "__init__.py").exists()
                out.add(name if is_module else base)
    return out


@pytest.mark.parametrize("package", sorted(LAYERS))
def test_no_upward_import(package):
    upward = [f"{module} imports {name}"
              for module, path, pkg in modules(package)
              for name in imports(path, module, pkg)
              if name.split(".")[0] in LAYERS[package]]
    assert not upward, "\n".join(upward)


def test_the_engine_modules_import_each_other_without_a_circle():
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
