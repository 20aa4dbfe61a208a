"""A small vLLM-like engine with a paged KV cache whose every memory change is observable."""
from engine.config import EngineConfig
from engine.llm_engine import Engine, StepResult
from engine.outputs import CompletionOutput, RequestOutput
from engine.sampling_params import SamplingParams
from engine.observe.snapshot import StepSnapshot

__all__ = ["Engine", "EngineConfig", "SamplingParams", "StepResult", "StepSnapshot",
           "RequestOutput", "CompletionOutput"]
