"""The page's engines meet one protocol (app/page_engine.py), and the page asks it, never
probes an engine for attributes."""
from __future__ import annotations

import ast
import inspect
from pathlib import Path

from engine import Engine, EngineConfig

from app.our_engine import OurPageEngine
from app.page_engine import LockstepPartner, PageEngine
from real_vllm.lockstep import Lockstep
from real_vllm.page_engine import VllmPageEngine

ROOT = Path(__file__).resolve().parents[2]


def _members(protocol) -> set[str]:
    names = set(getattr(protocol, "__annotations__", {}))
    names |= {n for n, v in vars(protocol).items()
              if not n.startswith("_") and (callable(v) or isinstance(v, property))}
    return names


def _offers(cls, name: str) -> bool:
    """``cls`` defines ``name`` (class attribute, property or method), or sets it in
    ``__init__`` (instance attributes such as VllmPageEngine.lockstep)."""
    if any(name in vars(k) or name in vars(k).get("__annotations__", {}) for k in cls.__mro__):
        return True
    try:
        return f"self.{name} =" in inspect.getsource(cls.__init__)
    except (OSError, TypeError):         # a generated __init__ (a dataclass): fields above
        return False


def test_both_page_engines_offer_everything_the_protocol_names():
    for cls in (OurPageEngine, VllmPageEngine):
        missing = sorted(n for n in _members(PageEngine) if not _offers(cls, n))
        assert not missing, f"{cls.__name__} lacks {missing}"
    missing = sorted(n for n in _members(LockstepPartner) if not _offers(Lockstep, n))
    assert not missing, f"Lockstep lacks {missing}"


def test_our_page_engine_is_a_page_engine():
    page = OurPageEngine(Engine.length_only(EngineConfig(block_size=4, num_gpu_blocks=16),
                                            max_model_len=64))
    assert isinstance(page, PageEngine)
    assert not page.is_real_vllm and page.lockstep is None and page.cache_view is None
    page.add_request([1, 2, 3], None)
    page.step()
    assert page.snapshot.step == page.step_no == 1 and len(page.history) == 2


def test_the_page_never_probes_an_engine_for_attributes():
    found = []
    for path in sorted((ROOT / "app").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", "") in ("hasattr",
                                                                               "getattr"):
                if node.func.id == "hasattr" or "engine" in ast.unparse(node.args[0]):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}")
    assert not found, "ask the PageEngine protocol instead:\n" + "\n".join(found)
