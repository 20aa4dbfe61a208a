"""Real vLLM beside our engine: step the real thing in-process and read its own state.

- ``environment``: which vLLM is installed, the settings it needs on these machines, and the
  clear reason when it cannot be used;
- ``state``: ``StepView``, the plain data one scheduler iteration leaves (per-request block
  tables, ref counts, hashes, free queue, queues, what was scheduled and preempted, KV event
  batches, outputs), the same for either engine;
- ``adapter``: ``RealVllmEngine``, one vLLM ``LLMEngine`` stepped one iteration at a time,
  read into ``StepView``s;
- ``ours``: the same ``StepView`` read from our engine;
- ``compare``: the first difference between two views, named in words;
- ``lockstep``: both engines driven by the same calls, compared after every step;
- ``v0_reference`` / ``v0_lockstep``: vLLM 0.8.5's own v0 scheduler and block manager, driven
  on lengths in a subprocess, beside our v0 engine.

vLLM is optional: nothing here imports it until an engine is built (docs/vllm-fidelity.md).
The page does not use this package yet.
"""
from real_vllm.environment import SUPPORTED_VERSIONS, VllmUnavailable, vllm_status

__all__ = ["SUPPORTED_VERSIONS", "VllmUnavailable", "vllm_status"]
