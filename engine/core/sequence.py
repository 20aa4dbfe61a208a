"""Sequences (one stream of tokens with its own block table) and request groups."""
from __future__ import annotations

import enum
from dataclasses import dataclass, field

import torch

from engine.sampling_params import SamplingParams


class SeqStatus(str, enum.Enum):
    WAITING = "waiting"      # not admitted yet, or preempted by recompute
    RUNNING = "running"
    SWAPPED = "swapped"      # preempted by swap: its blocks live in the CPU pool
    FINISHED = "finished"
    PRUNED = "pruned"        # a beam that lost


@dataclass
class Sequence:
    seq_id: int
    request_id: str
    token_ids: list[int]
    prompt_len: int
    parent_seq_id: int | None = None
    born_step: int = 0
    status: SeqStatus = SeqStatus.WAITING
    # physical block ids, logical order, in the pool named by block_device (CPU while SWAPPED)
    block_table: list[int] = field(default_factory=list)
    # the pool block_table points into, "gpu" or "cpu". Set only by the BlockManager, with the
    # table itself; the pool is never inferred from ``status``, which the scheduler may change
    # at a different moment than it moves the blocks.
    block_device: str = "gpu"
    # tokens whose K/V are in the cache. Invariant while it holds blocks:
    # len(block_table) == ceil(num_computed / block_size) (the newest sampled token's K/V is
    # written by the next step, which also allocates or copies-on-write the block for it).
    num_computed: int = 0
    # chained hashes (full sha256 hex) of the full blocks of token_ids (prefix caching)
    block_hashes: list[str] = field(default_factory=list)
    cumulative_logprob: float = 0.0
    output_text: str = ""
    # vLLM's cache_salt: only sequences with the same salt share prefix-cache blocks
    cache_salt: str | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None      # vLLM's: the stop string or stop token id
    # times the v1 scheduler preempted it (vLLM v1's Request.num_preemptions): its later
    # prefix-cache lookups are counted apart (KVCacheManager._count_query)
    num_preemptions: int = 0

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        """len(output_token_ids) without copying them (per-step code uses this)."""
        return len(self.token_ids) - self.prompt_len

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.prompt_len:]

    @property
    def is_finished(self) -> bool:
        return self.status in (SeqStatus.FINISHED, SeqStatus.PRUNED)


@dataclass
class SequenceGroup:
    """One request: its live sequences (1, n samples, or beams) and their finished siblings."""
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    arrival: int
    generator: torch.Generator
    seqs: list[Sequence] = field(default_factory=list)          # live (not finished/pruned)
    done_seqs: list[Sequence] = field(default_factory=list)     # finished, pruned, beam hyps
    forked: bool = False        # n > 1 / beam: the first sampling step has fanned out
    cache_salt: str | None = None
    # vLLM's num_cached_tokens: prompt tokens found in the prefix cache when the request was
    # first scheduled (a later recompute after preemption does not change it); None until then
    num_cached_tokens: int | None = None
    finish_order: int = -1      # when it finished, among the engine's requests (-1: not yet)

    @property
    def is_finished(self) -> bool:
        return not self.seqs

    def all_seqs(self) -> list[Sequence]:
        return self.seqs + self.done_seqs
