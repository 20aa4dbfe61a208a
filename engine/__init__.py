"""A small vLLM-like engine with a paged KV cache whose every memory change is observable.

The public face: ``Engine`` (add requests, step, generate), ``EngineConfig``,
``SamplingParams``, the outputs, ``StepResult`` / ``StepSnapshot``, and ``events`` (the memory
events a step emits). Inside, data flows core (blocks) -> sched (what runs) -> models (the
forward pass) -> processing (tokens out) -> observe / kv_events (what watches);
docs/architecture.md walks through it.

The names load on first use (PEP 562 ``__getattr__``): importing any ``engine.*`` module runs
this file first, and a light module such as ``engine.config`` must not pull in torch and the
schedulers through it. Modules inside ``engine/`` import the submodules, never this face.
"""
from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING

# public name -> the module that defines it (a name equal to the module's last part is the
# module itself)
_EXPORTS = {
    "Engine": "engine.llm_engine",
    "StepResult": "engine.llm_engine",
    "EngineConfig": "engine.config",
    "SamplingParams": "engine.sampling_params",
    "RequestOutput": "engine.outputs",
    "CompletionOutput": "engine.outputs",
    "StepSnapshot": "engine.observe.snapshot",
    "events": "engine.events",
}

if TYPE_CHECKING:       # the same names, for type checkers (tests/layout checks they agree)
    from engine import events
    from engine.config import EngineConfig
    from engine.llm_engine import Engine, StepResult
    from engine.observe.snapshot import StepSnapshot
    from engine.outputs import CompletionOutput, RequestOutput
    from engine.sampling_params import SamplingParams

__all__ = ["Engine", "EngineConfig", "SamplingParams", "StepResult", "StepSnapshot",
           "RequestOutput", "CompletionOutput", "events"]


def __getattr__(name: str):
    try:
        where = _EXPORTS[name]
    except KeyError:
        raise AttributeError(f"module 'engine' has no attribute {name!r}") from None
    module = import_module(where)
    value = module if where.rsplit(".", 1)[-1] == name else getattr(module, name)
    globals()[name] = value             # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
