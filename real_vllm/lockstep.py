"""Our v1 engine and real vLLM driven by the same calls, compared after every step.

``Lockstep`` applies each call (add a request, abort, reset the prefix cache, step) to both
engines; ``step()`` returns both views and their first difference (None when identical). The
differential suite (tests/vllm_real) and the page's real-vLLM engine (real_vllm/page_engine.py)
use it.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from engine.sched.registry import current_vllm

from real_vllm.adapter import RealVllmEngine, VllmSettings
from real_vllm.compare import first_difference
from real_vllm.ours import OurStepViewer
from real_vllm.state import StepView


@dataclass
class LockstepStep:
    ours: StepView
    theirs: StepView
    difference: str | None


@dataclass
class Lockstep:
    engine: object                       # our Engine, semantics "v1"
    vllm: RealVllmEngine
    steps: list[LockstepStep] = field(default_factory=list)

    @classmethod
    def start(cls, engine, logprobs: bool = False) -> "Lockstep":
        if not engine.semantics.is_current_vllm:
            raise ValueError(f"lockstep with real vLLM needs semantics='{current_vllm().name}' "
                             "(vLLM's current engine)")
        return cls(engine, RealVllmEngine(VllmSettings.from_engine(engine), logprobs))

    def __post_init__(self):
        self._viewer = OurStepViewer(self.engine)
        # how vLLM is stepped: its own step, or an observer's wrapper of it that also reads
        # its state (real_vllm/snapshots.py)
        self.step_vllm = self.vllm.step

    def add_request(self, request_id: str, prompt_token_ids: list[int], params,
                    cache_salt: str | None = None) -> None:
        self.engine.add_request(prompt_token_ids, params, request_id, cache_salt=cache_salt)
        self.vllm.add_request(request_id, prompt_token_ids, params, cache_salt)

    def abort_request(self, request_id: str) -> None:
        self.engine.abort_request(request_id)
        self.vllm.abort_request(request_id)

    def reset_prefix_cache(self, reset_running_requests: bool = False) -> tuple[bool, bool]:
        return (self.engine.reset_prefix_cache(reset_running_requests),
                self.vllm.reset_prefix_cache(reset_running_requests))

    def has_unfinished_requests(self) -> bool:
        return self.engine.has_unfinished_requests() or self.vllm.has_unfinished_requests()

    def step(self) -> LockstepStep:
        result = self.engine.step()
        self._viewer.drain()
        ours = self._viewer.view(result)
        theirs = self.step_vllm()
        done = LockstepStep(ours, theirs, first_difference(ours, theirs))
        self.steps.append(done)
        return done

    @property
    def ours_history(self):
        """Our engine's snapshots (its recorder's), the page's view of the partner."""
        return self.engine.history

    def summary(self) -> str:
        same = sum(1 for s in self.steps if s.difference is None)
        return f"identical for {same} of {len(self.steps)} steps"

    def close(self) -> None:
        self._viewer.detach()
        self.vllm.close()
