"""What the engine needs from a scheduler, and the rules that tell vLLM v0 from v1.

The engine's step loop (``engine/llm_engine.py``) talks to a ``Scheduler`` and reads an
``EngineSemantics``; it never asks which engine it runs. Each engine (``v0.py``, ``v1.py``)
provides both, and ``registry.py`` maps ``EngineConfig.semantics`` to them, as vLLM picks its
scheduler class. To add a scheduler: implement both here-described interfaces in a new module
and add one line to the registry (docs/architecture.md#add-a-scheduler).
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, ClassVar, Mapping

import engine.events as ev
from engine.core.sequence import Sequence, SequenceGroup

if TYPE_CHECKING:
    from engine.config import EngineConfig
    from engine.core.kv_cache_base import KVCacheBase
    from engine.sampling_params import SamplingParams


@dataclass(frozen=True)
class ScheduledSeq:
    """One sequence's part of a step: it computes tokens [start, end) (a prompt, a prompt
    chunk, or one decode token). One record per sequence, so what runs and how much of it can
    never fall out of step (vLLM's ``SchedulerOutput.num_scheduled_tokens`` is one dict too)."""
    group: SequenceGroup
    seq: Sequence
    start: int
    end: int

    @property
    def num_tokens(self) -> int:
        """Tokens scheduled for this sequence in this step."""
        return self.end - self.start

    @property
    def is_decode(self) -> bool:
        """One token past the prompt: the newest sampled token, fed back (else a prompt, a
        prompt chunk or a recompute)."""
        return self.num_tokens == 1 and self.start >= self.seq.prompt_len


@dataclass
class ScheduledBatch:
    """One step's plan: the sequences that compute (``scheduled``, in order; the model runner
    stores their K/V at ``slot_mapping``) and the block copies to make first."""
    kind: str                                   # "prefill", "decode", "mixed" or "idle"
    scheduled: list[ScheduledSeq] = field(default_factory=list)
    slot_mapping: list[int] = field(default_factory=list)  # flat slot of every computed token
    is_prefill: bool = False                    # the attention path: queries of several tokens
    copies: list[tuple[int, int]] = field(default_factory=list)     # CoW src -> dst
    swap_in: list[tuple[int, int]] = field(default_factory=list)    # cpu -> gpu
    swap_out: list[tuple[int, int]] = field(default_factory=list)   # gpu -> cpu

    def add(self, group: SequenceGroup, seq: Sequence, start: int, end: int) -> None:
        self.scheduled.append(ScheduledSeq(group, seq, start, end))

    @property
    def seqs(self) -> list[Sequence]:
        return [r.seq for r in self.scheduled]

    @property
    def groups(self) -> list[SequenceGroup]:
        """The groups that run, each once, in the order they were scheduled."""
        by_id = {id(r.group): r.group for r in self.scheduled}     # groups are not hashable
        return list(by_id.values())


class Scheduler(ABC):
    """A continuous-batching scheduler over one cache manager: everything the engine, the
    invariant checker and the observers ask of it (as vLLM's ``SchedulerInterface``)."""
    waiting: list[SequenceGroup]
    running: list[SequenceGroup]
    num_preemptions: int                        # requests preempted so far (vLLM's metric)

    @abstractmethod
    def add(self, group: SequenceGroup) -> None:
        """Queue a new request."""

    @abstractmethod
    def remove(self, group: SequenceGroup) -> None:
        """Take a finished or aborted request out of every queue."""

    @abstractmethod
    def has_unfinished(self) -> bool: ...

    @abstractmethod
    def num_running_seqs(self) -> int: ...

    @abstractmethod
    def queues(self) -> dict[str, list[SequenceGroup]]:
        """Every queue a request can be in, by name ("waiting", "running", "swapped")."""

    @abstractmethod
    def schedule(self) -> ScheduledBatch:
        """This step's plan, its memory allocated; nothing is left pending afterwards."""

    @abstractmethod
    def preempt_all_running(self) -> None:
        """Preempt every running request (``reset_prefix_cache(reset_running_requests=True)``);
        raise ValueError if this engine does not (``EngineSemantics.reset_running_refusal``)."""


class EngineSemantics(ABC):
    """The rules of one vLLM engine generation: how it is built, which requests and settings it
    takes, and the few places where its behaviour differs (each named here, not tested by
    comparing names)."""
    name: ClassVar[str]                  # EngineConfig.semantics
    label: ClassVar[str]                 # how pages name it
    prefix_caching_default: ClassVar[bool]
    # settings this engine always has, whatever else is chosen (a page applies them)
    fixed_settings: ClassVar[Mapping[str, object]]
    has_swap: ClassVar[bool]
    has_beam_search: ClassVar[bool]
    # the step's token budget (max_num_batched_tokens) is a chunked-prefill budget worth
    # choosing; without chunking it only limits a prompt's length
    chunks_prefills: ClassVar[bool]
    # stop strings count only once the output is longer than min_tokens (v1's detokenizer),
    # instead of from min_tokens on (v0's StopChecker)
    stop_strings_after_min_tokens: ClassVar[bool]
    # prefix-cache lookups by requests preempted before are counted apart (vLLM v1's
    # PrefixCacheStats.preempted_queries / _hits)
    counts_preempted_lookups_apart: ClassVar[bool]
    # why reset_prefix_cache(reset_running_requests=True) is refused (None: it is offered)
    reset_running_refusal: ClassVar[str | None]
    # n > 1 and beams fork a table (blocks shared, copy-on-write); without, n > 1 runs as child
    # requests that share the prompt's full blocks through the prefix cache
    forks_sequences: ClassVar[bool]
    # the installed vLLM's own engine follows these rules (the page runs it beside this one)
    is_current_vllm: ClassVar[bool]

    @abstractmethod
    def build(self, config: EngineConfig, emit: Callable[[ev.Event], None]
              ) -> tuple[KVCacheBase, Scheduler]:
        """The cache manager and the scheduler over it."""

    def config_problems(self, config: EngineConfig) -> list[str]:
        """What in ``config`` this engine cannot run (EngineConfig collects them)."""
        return []

    def check_prompt(self, config: EngineConfig, num_prompt_tokens: int) -> None:
        """Raise ValueError if this engine could never take a prompt this long (checked before
        the sampling settings)."""

    @abstractmethod
    def check_request(self, config: EngineConfig, num_prompt_tokens: int,
                      params: SamplingParams) -> None:
        """Raise ValueError if this engine could never run the request (its pool rule, and
        what it does not offer)."""

    def child_request_ids(self, request_id: str, params: SamplingParams) -> list[str]:
        """The requests a request runs as, when it is split (v1's parallel sampling); [] when
        it runs as itself."""
        return []
