"""A small vLLM-like engine with a paged KV cache whose every memory change is observable.

The public face: ``Engine`` (add requests, step, generate), ``EngineConfig``,
``SamplingParams``, the outputs, ``StepResult`` / ``StepSnapshot``, and ``events`` (the memory
events a step emits). Inside, data flows core (blocks) -> sched (what runs) -> models (the
forward pass) -> processing (tokens out) -> observe / kv_events (what watches);
docs/architecture.md walks through it.
"""
from engine import events
from engine.config import EngineConfig
from engine.llm_engine import Engine, StepResult
from engine.observe.snapshot import StepSnapshot
from engine.outputs import CompletionOutput, RequestOutput
from engine.sampling_params import SamplingParams

__all__ = ["Engine", "EngineConfig", "SamplingParams", "StepResult", "StepSnapshot",
           "RequestOutput", "CompletionOutput", "events"]
