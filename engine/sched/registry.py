"""``EngineConfig.semantics`` -> the engine generation's rules, which build its scheduler and
cache manager (as vLLM picks its scheduler class from its config). The only place that turns
the name into behaviour; one line per engine."""
from __future__ import annotations

from engine.sched.interface import EngineSemantics
from engine.sched.v0 import V0Semantics
from engine.sched.v1 import V1Semantics

SEMANTICS: dict[str, EngineSemantics] = {s.name: s for s in (V0Semantics(), V1Semantics())}


def semantics_of(name: str) -> EngineSemantics:
    """The rules of the engine named ``name`` ("v0" or "v1")."""
    try:
        return SEMANTICS[name]
    except (KeyError, TypeError):
        raise ValueError(f"semantics must be {' or '.join(map(repr, SEMANTICS))}, "
                         f"got {name!r}") from None


def current_vllm() -> EngineSemantics:
    """The rules the installed vLLM's engine follows (the page's "Real vLLM" runs them)."""
    return next(s for s in SEMANTICS.values() if s.is_current_vllm)
