"""Immutable, JSON-serialisable pictures of the engine's memory after each step.

The UI draws only from these (and the events in them), never from engine internals.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from engine.observe.accounting import Accounting, Slab, paged_accounting
from engine.core.kv_cache_base import KVCacheBase
from engine.core.block_pool import BlockPool
from engine.events import Event, event_from_dict
from engine.core.sequence import SequenceGroup


@dataclass(frozen=True)
class SeqState:
    seq_id: int
    request_id: str
    parent_seq_id: int | None
    born_step: int
    status: str
    token_ids: tuple[int, ...]
    prompt_len: int
    num_computed: int              # tokens whose K/V are in the cache
    block_table: tuple[int, ...]   # physical ids (CPU pool ids while swapped)
    device: str                    # "gpu" or "cpu" (where the table's blocks live)
    text: str
    cumulative_logprob: float
    finish_reason: str | None
    is_beam: bool

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)


@dataclass(frozen=True)
class BlockState:
    block_id: int
    device: str
    ref_count: int
    filled: int                    # slots holding a token's K/V
    seq_ids: tuple[int, ...]       # sequences whose table points here
    block_hash: str | None
    token_ids: tuple[int, ...]
    state: str                     # free / used / shared / cached (free, reusable by hash) / null


@dataclass(frozen=True)
class PoolStats:
    total_blocks: int
    free_blocks: int
    used_blocks: int
    shared_blocks: int             # ref_count > 1
    cached_free_blocks: int
    used_token_slots: int          # slots holding K/V in used blocks
    token_capacity: int
    bytes_per_block: int
    cpu_total_blocks: int
    cpu_used_blocks: int
    num_waiting: int
    num_running: int
    num_swapped: int
    logical_blocks: int            # sum of table lengths: blocks needed without sharing
    # vLLM's metric names: kv_cache_usage_perc = 1 - free / usable blocks (cached-but-free
    # blocks count as free; v1's null block is not usable); the prefix cache's queries and
    # hits in tokens; requests preempted so far
    kv_cache_usage_perc: float = 0.0
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    num_preemptions: int = 0
    null_blocks: int = 0           # v1: block 0, never handed out
    # v1: lookups by requests preempted before (vLLM's PrefixCacheStats.preempted_queries /
    # preempted_hits, tokens), not in the two prefix_cache_* counts above
    prefix_cache_preempted_queries: int = 0
    prefix_cache_preempted_hits: int = 0

    @property
    def blocks_saved_by_sharing(self) -> int:
        return self.logical_blocks - self.used_blocks - self.cpu_used_blocks


@dataclass(frozen=True)
class StepSnapshot:
    step: int
    kind: str                      # prefill / decode / mixed / idle, or init / abort / reset
    model: str
    backend: str
    device: str
    block_size: int
    sequences: tuple[SeqState, ...]
    blocks: tuple[BlockState, ...]
    cpu_blocks: tuple[BlockState, ...]
    stats: PoolStats
    events: tuple[Event, ...]
    step_time_s: float
    accounting: tuple[Accounting, ...]   # paged first, then each contiguous baseline
    # position among every snapshot the engine recorded (init = 0): unique even when an abort
    # records a snapshot between two steps (with the step number of the step before it)
    index: int = 0
    # every running request's extent in each contiguous baseline's address space (by start)
    slabs: tuple[Slab, ...] = ()
    semantics: str = "v0"          # which vLLM engine's rules made this step: v0 or v1

    def to_dict(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        for key in ("sequences", "blocks", "cpu_blocks", "accounting", "slabs"):
            d[key] = [dataclasses.asdict(x) for x in d[key]]
        d["stats"] = dataclasses.asdict(self.stats)
        d["events"] = [e.to_dict() for e in self.events]
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "StepSnapshot":
        """Inverse of ``to_dict``: a saved trace becomes real snapshots again."""
        def tuples(x: dict) -> dict:
            return {k: tuple(v) if isinstance(v, list) else v for k, v in x.items()}
        try:
            return cls(
                **{k: d[k] for k in ("step", "kind", "model", "backend", "device", "block_size",
                                     "step_time_s")},
                index=int(d.get("index", 0)),
                semantics=str(d.get("semantics", "v0")),
                sequences=tuple(SeqState(**tuples(x)) for x in d["sequences"]),
                blocks=tuple(BlockState(**tuples(x)) for x in d["blocks"]),
                cpu_blocks=tuple(BlockState(**tuples(x)) for x in d["cpu_blocks"]),
                stats=PoolStats(**d["stats"]),
                events=tuple(event_from_dict(e) for e in d["events"]),
                accounting=tuple(Accounting(**a) for a in d["accounting"]),
                slabs=tuple(Slab(**x) for x in d.get("slabs", ())))
        except (KeyError, TypeError) as exc:
            raise ValueError(f"not a PagedAttention Lab snapshot: {exc}") from exc

    def seq(self, seq_id: int) -> SeqState:
        return next(s for s in self.sequences if s.seq_id == seq_id)


def _blocks(pool: BlockPool, owners: dict[int, list[int]], cache: dict) -> tuple[BlockState, ...]:
    """One BlockState per block; an unchanged block (same version, same owners) is reused."""
    out = []
    for b in range(pool.num_blocks):
        seq_ids = tuple(owners.get(b, ()))
        key = (pool.version[b], seq_ids)
        hit = cache.get((pool.device, b))
        if hit is not None and hit[0] == key:
            out.append(hit[1])
            continue
        rc = pool.ref_count[b]
        h = pool.block_hash[b]
        state = ("null" if b == pool.null_block else "shared" if rc > 1 else "used" if rc == 1
                 else "cached" if h else "free")
        block = BlockState(b, pool.device, rc, len(pool.tokens[b]), seq_ids, h,
                           tuple(pool.tokens[b]), state)
        cache[(pool.device, b)] = (key, block)
        out.append(block)
    return tuple(out)


NO_SWAP_SPACE = BlockPool(0, 1, "cpu")      # what a manager without swap shows: no CPU blocks


def build_snapshot(*, step: int, kind: str, groups: list[SequenceGroup], bm: KVCacheBase,
                   queues: tuple[int, int, int], events: tuple[Event, ...], step_time_s: float,
                   model: str, backend: str, device: str, bytes_per_block: int,
                   running_seqs: int, finished: int, baselines: tuple[Accounting, ...],
                   detailed: bool = True, done_cache: dict | None = None,
                   block_cache: dict | None = None, index: int = 0,
                   slabs: tuple = (), semantics: str = "v0",
                   num_preemptions: int = 0) -> StepSnapshot:
    """``detailed=False`` (large length-only simulations) leaves out sequences and blocks.
    ``done_cache`` (seq_id -> SeqState) lets finished sequences be built once, not every step."""
    done_cache = {} if done_cache is None else done_cache
    block_cache = {} if block_cache is None else block_cache
    gpu_owners: dict[int, list[int]] = {}
    cpu_owners: dict[int, list[int]] = {}
    seqs = []
    logical = sum(len(s.block_table) for g in groups for s in g.seqs)   # live sequences
    for g in groups if detailed else ():
        for s in sorted(g.all_seqs(), key=lambda s: s.seq_id):
            if s.seq_id in done_cache:          # finished sequences never change again
                seqs.append(done_cache[s.seq_id])
                continue
            swapped = s.block_device == "cpu"       # the pool its table points into
            for b in s.block_table:
                (cpu_owners if swapped else gpu_owners).setdefault(b, []).append(s.seq_id)
            state = SeqState(s.seq_id, s.request_id, s.parent_seq_id, s.born_step,
                             s.status.value, tuple(s.token_ids), s.prompt_len, s.num_computed,
                             tuple(s.block_table), "cpu" if swapped else "gpu",
                             s.output_text, s.cumulative_logprob, s.finish_reason,
                             g.params.use_beam_search)
            if s.is_finished:
                done_cache[s.seq_id] = state
            seqs.append(state)
    gpu = bm.gpu
    cpu = bm.pools.get("cpu", NO_SWAP_SPACE)
    cache = bm.prefix_cache_stats()
    used = [b for b in range(gpu.num_blocks) if gpu.ref_count[b]]
    stats = PoolStats(
        total_blocks=gpu.num_blocks, free_blocks=gpu.num_free, used_blocks=len(used),
        shared_blocks=sum(1 for b in used if gpu.ref_count[b] > 1),
        cached_free_blocks=sum(1 for b in gpu.free_queue if gpu.block_hash[b]),
        used_token_slots=sum(len(gpu.tokens[b]) for b in used),
        token_capacity=gpu.num_blocks * gpu.block_size, bytes_per_block=bytes_per_block,
        cpu_total_blocks=cpu.num_blocks, cpu_used_blocks=cpu.num_blocks - cpu.num_free,
        num_waiting=queues[0], num_running=queues[1], num_swapped=queues[2],
        logical_blocks=logical,
        kv_cache_usage_perc=1 - gpu.num_free / gpu.num_usable if gpu.num_usable else 0.0,
        prefix_cache_queries=cache.queries, prefix_cache_hits=cache.hits,
        num_preemptions=num_preemptions, null_blocks=gpu.num_blocks - gpu.num_usable,
        prefix_cache_preempted_queries=cache.preempted_queries,
        prefix_cache_preempted_hits=cache.preempted_hits)
    accounting = (paged_accounting(stats, gpu.block_size, running_seqs, finished),) + baselines
    return StepSnapshot(step, kind, model, backend, device, gpu.block_size, tuple(seqs),
                        _blocks(gpu, gpu_owners, block_cache) if detailed else (),
                        _blocks(cpu, cpu_owners, block_cache) if detailed else (), stats, events,
                        step_time_s, accounting, index, tuple(slabs), semantics)
