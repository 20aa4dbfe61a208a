"""Only the registry knows the engines by name (docs/architecture.md#semantics): outside
``engine/sched/registry.py`` no code compares a semantics name ("v0", "v1") with a literal,
however it is written, nor looks something up by one. What differs between the engines is a
property of the semantics object; a name written as data (a lesson's engine, a preset) is fine.

The names are read from the registry, so a new engine's name is checked too. test_layout.py's
check looks for expressions that mention ``semantics``; this one looks at the literals, so
``rules.name == "v1"`` or ``engines["v0"]`` are found whatever the variable is called."""
from __future__ import annotations

import ast
from pathlib import Path

from engine.sched.registry import SEMANTICS

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("app", "real_vllm", "analysis", "engine")
REGISTRY = ROOT / "engine" / "sched" / "registry.py"
NAMES = frozenset(SEMANTICS)
# calls that turn a name into the engine's rules: a literal argument picks an engine by name
LOOKUPS = frozenset({"semantics_of", "get"})


def _names_in(node: ast.AST | None) -> bool:
    """``node`` is a semantics name, or a tuple/list/set/dict keys holding one."""
    if isinstance(node, ast.Constant):
        return node.value in NAMES
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_names_in(e) for e in node.elts)
    if isinstance(node, ast.Dict):
        return any(_names_in(k) for k in node.keys)
    if isinstance(node, ast.IfExp):                 # semantics_of("v1" if real else name)
        return _names_in(node.body) or _names_in(node.orelse)
    return False


def _pattern_names(pattern: ast.pattern) -> bool:
    return any(isinstance(p, ast.MatchValue) and _names_in(p.value) for p in ast.walk(pattern))


def name_comparisons(source: str, where: str = "") -> list[str]:
    """Where ``source`` compares a semantics name literal (``==``, ``!=``, ``in``, ``not in``,
    ``is``), matches on one (``case "v1":``), subscripts by one (``d["v0"]``), calls a lookup
    with one (``semantics_of("v1")``, ``d.get("v0")``), or builds a dict keyed by them."""
    found = []

    def hit(node, text=None):
        found.append(f"{where}:{node.lineno}: {text or ast.unparse(node)}")

    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            if any(_names_in(o) for o in (node.left, *node.comparators)):
                hit(node)
        elif isinstance(node, ast.match_case):
            if _pattern_names(node.pattern):
                hit(node.pattern, f"case {ast.unparse(node.pattern)}")
        elif isinstance(node, ast.Subscript):
            if _names_in(node.slice):
                hit(node)
        elif isinstance(node, ast.Call):
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if called in LOOKUPS and node.args and _names_in(node.args[0]):
                hit(node)
        elif isinstance(node, ast.Dict):
            if _names_in(node):
                hit(node, "a dict keyed by semantics names")
    return found


def _sources():
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if path != REGISTRY:
                yield path


def test_no_code_outside_the_registry_compares_semantics_names():
    found = [h for path in _sources()
             for h in name_comparisons(path.read_text(), str(path.relative_to(ROOT)))]
    assert not found, ("a semantics name compared or looked up outside engine/sched/registry.py "
                       "(ask the semantics object instead):\n" + "\n".join(found))


def test_the_check_finds_every_spelling():
    source = ("def f(x, sem, s, d, rules):\n"
              "    a = x.name == 'v1'\n"                    # 2
              "    b = 'v1' == sem\n"                       # 3
              "    c = s.semantics in ('v0', 'v1')\n"       # 4
              "    e = rules.name != 'v0'\n"                # 5
              "    g = d['v0']\n"                           # 6
              "    h = d.get('v1')\n"                       # 7
              "    i = semantics_of('v1')\n"                # 8
              "    j = {'v0': 1, 'v1': 2}\n"                # 9
              "    q = semantics_of('v1' if x else sem)\n"  # 10
              "    match sem:\n"
              "        case 'v0' | 'other':\n"              # 12
              "            pass\n"
              "    k = x.name == other.name\n"              # no literal: fine
              "    m = f(semantics='v0')\n"                 # a name given as data: fine
              "    n = {'scenario': 1}\n"                   # another string: fine
              "    o = x in ('scenario', 'model')\n")
    lines = [int(h.split(":")[1]) for h in name_comparisons(source)]
    assert sorted(lines) == [2, 3, 4, 5, 6, 7, 8, 9, 10, 12], lines
