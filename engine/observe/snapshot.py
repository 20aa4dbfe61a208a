"""Immutable, JSON-serialisable pictures of the engine's memory after each step, and the one
builder that makes them.

The UI draws only from these (and the events in them), never from engine internals. The
builder (``block_states``, ``pool_stats``, ``step_snapshot``) takes plain values only -- a
pool's refcounts, hashes, tokens and free queue as lists, the sequences as ``SeqState``s --
so our recorder (engine/observe/observers.py, from our engine's objects) and real vLLM's
(real_vllm/snapshots.py, from vLLM's objects) fill the same snapshot by the same rules.
``SnapshotHistory`` is what both keep of them.
"""
from __future__ import annotations

import dataclasses
from collections import Counter, deque
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass

from engine.observe.accounting import Accounting, Slab, paged_accounting
from engine.events import Event, event_from_dict


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


@dataclass(frozen=True)
class PoolContents:
    """One block pool as plain values, indexed by block id: our ``BlockPool``'s own lists
    (passed as they are, not copied) or what was read off vLLM's blocks."""
    device: str                                  # "gpu" or "cpu"
    block_size: int
    ref_counts: Sequence[int]
    block_hashes: Sequence[str | None]           # None: not cached
    tokens: Sequence[Sequence[int]]              # the tokens whose K/V each block holds
    free_queue: Collection[int]                  # the free blocks (their count is what matters)
    num_usable: int                              # blocks that can be handed out (v1: all but 0)
    null_block: int | None = None                # v1's block 0
    # a counter per block that changes whenever the block does (our BlockPool.version): lets
    # an unchanged block's BlockState be reused; None builds every block afresh
    versions: Sequence[int] | None = None

    @property
    def num_blocks(self) -> int:
        return len(self.ref_counts)


@dataclass(frozen=True)
class PrefixCacheCounts:
    """vLLM's PrefixCacheStats, in tokens, summed since the start."""
    queries: int = 0
    hits: int = 0
    preempted_queries: int = 0
    preempted_hits: int = 0


def block_state_word(block_id: int, ref_count: int, block_hash: str | None,
                     null_block: int | None) -> str:
    """What the pool figure colours a block by."""
    if block_id == null_block:
        return "null"
    return ("shared" if ref_count > 1 else "used" if ref_count == 1
            else "cached" if block_hash else "free")


def block_owners(sequences: Iterable[SeqState]) -> dict[str, dict[int, list[int]]]:
    """device -> block -> the sequences whose table points there, in the sequences' order
    (a finished sequence's table is empty: its blocks were freed)."""
    owners: dict[str, dict[int, list[int]]] = {"gpu": {}, "cpu": {}}
    for s in sequences:
        for b in s.block_table:
            owners[s.device].setdefault(b, []).append(s.seq_id)
    return owners


def block_states(pool: PoolContents, owners: dict[int, list[int]],
                 cache: dict | None = None) -> tuple[BlockState, ...]:
    """One BlockState per block. With ``cache`` and ``pool.versions``, an unchanged block
    (same version, same owners) is reused rather than rebuilt (large pools, every step)."""
    out = []
    versions = pool.versions if cache is not None else None
    for b in range(pool.num_blocks):
        seq_ids = tuple(owners.get(b, ()))
        if versions is not None:
            key = (versions[b], seq_ids)
            hit = cache.get((pool.device, b))
            if hit is not None and hit[0] == key:
                out.append(hit[1])
                continue
        rc = pool.ref_counts[b]
        h = pool.block_hashes[b]
        tokens = tuple(pool.tokens[b])
        block = BlockState(b, pool.device, rc, len(tokens), seq_ids, h, tokens,
                           block_state_word(b, rc, h, pool.null_block))
        if versions is not None:
            cache[(pool.device, b)] = (key, block)
        out.append(block)
    return tuple(out)


def pool_stats(gpu: PoolContents, cpu: PoolContents | None, *, queues: tuple[int, int, int],
               logical_blocks: int, bytes_per_block: int, prefix_cache: PrefixCacheCounts,
               num_preemptions: int) -> PoolStats:
    """The pool's numbers. ``queues``: (waiting, running, swapped) requests;
    ``logical_blocks``: the live sequences' table lengths summed; ``cpu``: v0's swap pool,
    None where there is none."""
    rc, hashes = gpu.ref_counts, gpu.block_hashes
    used = [b for b in range(gpu.num_blocks) if rc[b] and b != gpu.null_block]
    num_free = len(gpu.free_queue)
    cpu_total = cpu.num_blocks if cpu is not None else 0
    cpu_free = len(cpu.free_queue) if cpu is not None else 0
    return PoolStats(
        total_blocks=gpu.num_blocks, free_blocks=num_free, used_blocks=len(used),
        shared_blocks=sum(1 for b in used if rc[b] > 1),
        cached_free_blocks=sum(1 for b in gpu.free_queue if hashes[b]),
        used_token_slots=sum(len(gpu.tokens[b]) for b in used),
        token_capacity=gpu.num_blocks * gpu.block_size, bytes_per_block=bytes_per_block,
        cpu_total_blocks=cpu_total, cpu_used_blocks=cpu_total - cpu_free,
        num_waiting=queues[0], num_running=queues[1], num_swapped=queues[2],
        logical_blocks=logical_blocks,
        kv_cache_usage_perc=1 - num_free / gpu.num_usable if gpu.num_usable else 0.0,
        prefix_cache_queries=prefix_cache.queries, prefix_cache_hits=prefix_cache.hits,
        num_preemptions=num_preemptions, null_blocks=gpu.num_blocks - gpu.num_usable,
        prefix_cache_preempted_queries=prefix_cache.preempted_queries,
        prefix_cache_preempted_hits=prefix_cache.preempted_hits)


def step_snapshot(*, step: int, kind: str, index: int, model: str, backend: str, device: str,
                  semantics: str, sequences: tuple[SeqState, ...], gpu: PoolContents,
                  cpu: PoolContents | None, queues: tuple[int, int, int], logical_blocks: int,
                  bytes_per_block: int, prefix_cache: PrefixCacheCounts, num_preemptions: int,
                  running_seqs: int, finished: int, baselines: tuple[Accounting, ...] = (),
                  slabs: tuple[Slab, ...] = (), events: tuple[Event, ...] = (),
                  step_time_s: float = 0.0, detailed: bool = True,
                  block_cache: dict | None = None) -> StepSnapshot:
    """The snapshot of one step from plain values. ``detailed=False`` (large length-only
    simulations) leaves out the blocks (pass no sequences then either); ``baselines`` /
    ``slabs``: the contiguous baselines' accounting and extents (ContiguousBaselines)."""
    stats = pool_stats(gpu, cpu, queues=queues, logical_blocks=logical_blocks,
                       bytes_per_block=bytes_per_block, prefix_cache=prefix_cache,
                       num_preemptions=num_preemptions)
    accounting = (paged_accounting(stats, gpu.block_size, running_seqs, finished),) + \
        tuple(baselines)
    blocks = cpu_blocks = ()
    if detailed:
        owners = block_owners(sequences)
        blocks = block_states(gpu, owners["gpu"], block_cache)
        if cpu is not None:
            cpu_blocks = block_states(cpu, owners["cpu"], block_cache)
    return StepSnapshot(step, kind, model, backend, device, gpu.block_size, tuple(sequences),
                        blocks, cpu_blocks, stats, tuple(events), step_time_s, accounting,
                        index, tuple(slabs), semantics)


class SnapshotHistory:
    """The snapshots a recorder keeps: the last ``max_history`` (the page scrubs them), every
    step's accounting (small; kept beyond max_history) and the event totals. ``recorded``
    numbers them (a snapshot's ``index``)."""

    NOT_STEPS = ("init", "abort", "reset")      # snapshots that are not an engine step

    def __init__(self, max_history: int):
        self.history: deque[StepSnapshot] = deque(maxlen=max_history)
        self.accounting_log: list[tuple[int, tuple]] = []
        self.event_counts: Counter[str] = Counter()
        self.recorded = 0

    def keep(self, snap: StepSnapshot) -> StepSnapshot:
        self.recorded += 1
        if snap.kind not in self.NOT_STEPS:
            self.accounting_log.append((snap.step, snap.accounting))
        self.event_counts.update(e.kind for e in snap.events)
        self.history.append(snap)
        return snap

    def renew_init(self, record_init: Callable[[], object]) -> None:
        """Before the first step, the init snapshot shows the requests queued so far (step 0
        then says what is waiting, not an empty engine): a request added then replaces it by
        ``record_init()``'s."""
        if self.recorded == 1 and self.history and self.history[-1].kind == "init":
            self.history.pop()
            self.recorded = 0
            record_init()

    @property
    def snapshot(self) -> StepSnapshot:
        return self.history[-1]
