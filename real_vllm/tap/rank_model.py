"""One data-parallel rank's vLLM scheduler, rebuilt from the scheduler tap's frames
(real_vllm/tap/frames.py), one ``StepSnapshot`` per engine step, drawn by the page's own
figures; socket-free (real_vllm/tap/follower.py feeds it, tests feed it directly).

No vLLM import and no Streamlit: the frames are plain msgspec structs, and the snapshots come
from the one builder (engine/observe/snapshot.py), as real_vllm/snapshots.py fills it in-process.

Sequence numbers: a hole is a gap (counted; the state is then unknown until the next keyframe),
a number that goes back is a restarted server. Frames before the first keyframe (or after a
gap, or after the publisher says it dropped some) are held back -- counted and dropped -- until
a keyframe arrives. Each applied frame is checked (a block's ref count = the table entries
holding it; free = pool - null - held; a preempted request holds no blocks); a violation is
counted, never raised. Each ``"update"`` frame (the end of a step; its ``"schedule"`` frame
pairs with it by ``step``) becomes a snapshot, its events read off what changed (the tap sends
no tokens: token ids are -1).

Cost: the builder makes a BlockState per block per step (unchanged ones reused, but still
visited), about 40 ms per step for a pool of 50,000 blocks on one core: a large pool stepping
fast is followed with a lag.
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from engine import events as ev
from engine.core.block_math import slot_of
from engine.kv_events.wire import hash_hex
from engine.observe.snapshot import PoolContents, PrefixCacheCounts, SeqState, \
    SnapshotHistory, StepSnapshot, step_snapshot
from real_vllm.tap import frames as fr

MAX_HISTORY = 2000             # snapshots kept per rank (the view scrubs them)
# ... within this many block entries and token slots per rank (~8 bytes each: a snapshot of a
# large pool or of long requests is big, and a server runs for days), the oldest dropped first
HISTORY_BUDGET = 8_000_000
MAX_REASONS = 100              # malformed / violation reasons kept (the latest)
UNKNOWN_TOKEN = -1             # the tap sends lengths, not tokens
SEMANTICS = "vllm"             # drawn under real vLLM's label (app/views/common.py)
PREEMPT_RULE = ("vLLM preempted the last request of its running queue (the most recently "
                "admitted) by recompute: blocks freed, back to the front of the waiting queue")
# a preempted request is back in vLLM's waiting queue: the figures know it as waiting
SHOWN_STATUS = {"running": "running", "waiting": "waiting", "preempted": "waiting"}


def unknown_tokens(token_ids) -> list[str]:
    """The figures' ``decode`` for the tap: it carries no token ids, so each shows as "?"."""
    return ["?" for _ in token_ids]


class _Tokens:
    """The blocks' tokens as the builder reads them: ``fill[b]`` unknown tokens (shared
    tuples; the tap sends how full a block is, not what it holds)."""

    def __init__(self, fill: list[int], block_size: int):
        self._fill = fill
        self._tuples = [(UNKNOWN_TOKEN,) * k for k in range(block_size + 1)]

    def __getitem__(self, b: int) -> tuple:
        return self._tuples[self._fill[b]]

    def __len__(self) -> int:
        return len(self._fill)


@dataclass
class _Request:
    state: fr.RequestState
    seq_id: int
    born_step: int


@dataclass
class RankModel:
    """One rank's scheduler, rebuilt from its frames; snapshots in ``history``."""
    rank: int
    max_history: int = MAX_HISTORY
    hello: fr.Hello | None = None
    synced: bool = False                       # a keyframe was applied since the last gap
    last_seq: int = -1
    requests: dict[str, _Request] = field(default_factory=dict)
    blocks: dict[int, tuple[int, fr.BlockHash]] = field(default_factory=dict)  # id -> (ref, hash)
    running: list[str] = field(default_factory=list)
    waiting: list[str] = field(default_factory=list)
    num_free_blocks: int = 0
    dropped: int = 0                           # frames the publisher dropped (its count)
    preemptions: deque = field(default_factory=lambda: deque(maxlen=1000))  # (step, request id)
    num_preemptions: int = 0
    num_finished: int = 0
    frames: int = 0                            # frames applied
    held_back: int = 0                         # frames ignored while waiting for a keyframe
    gaps: int = 0                              # holes in the sequence numbers
    lost: int = 0                              # frames in them
    restarts: int = 0
    violations: int = 0
    violation_reasons: deque = field(default_factory=lambda: deque(maxlen=MAX_REASONS))
    off_reason: str | None = None              # the tap's TapOff
    last_frame: fr.Frame | None = None
    last_ts: float | None = None               # wall clock when the last frame arrived
    _schedule: dict[int, fr.Frame] = field(default_factory=dict)   # step -> its schedule frame
    _tables_before: dict[str, tuple[int, ...]] = field(default_factory=dict)
    _blocks_before: dict[int, tuple[int, fr.BlockHash]] = field(default_factory=dict)
    # the pool as the builder reads it, kept up to date block by block (a large pool is not
    # rebuilt each step): ref counts, hashes (hex), slots filled, a version per block (an
    # unchanged block's BlockState is reused: block_states' cache), the free blocks
    _ref: list[int] = field(default_factory=list)
    _hash: list[str | None] = field(default_factory=list)
    _fill: list[int] = field(default_factory=list)
    _version: list[int] = field(default_factory=list)
    _free: set[int] = field(default_factory=set)
    _block_cache: dict = field(default_factory=dict)
    _sizes: deque = field(default_factory=deque)               # each kept snapshot's size
    _tokens_of_length: dict[int, tuple] = field(default_factory=dict)
    _done: dict[str, SeqState] = field(default_factory=dict)   # finished this step
    _seen: dict[str, _Request] = field(default_factory=dict)   # left with this frame
    _next_seq_id: int = 0
    _last_update_ts: float | None = None

    def __post_init__(self):
        self.history = SnapshotHistory(self.max_history)

    # ---- the wire ------------------------------------------------------------------------
    def receive(self, seq: int, message: fr.Hello | fr.Frame | fr.TapOff,
                now: float | None = None) -> StepSnapshot | None:
        """One decoded message with its sequence number; the snapshot it made, if any."""
        if self.last_seq >= 0 and seq <= self.last_seq:
            self.restarts += 1                 # numbering went back: a new publisher
            self._forget()
        elif self.last_seq >= 0 and seq > self.last_seq + 1:
            self.gaps += 1
            self.lost += seq - self.last_seq - 1
            self.synced = False                # what changed in the hole is unknown
        self.last_seq = seq
        self.last_ts = time.time() if now is None else now
        if isinstance(message, fr.Hello):
            self.hello = message
            return None
        if isinstance(message, fr.TapOff):
            self.off_reason = message.reason
            return None
        return self.apply(message)

    def _forget(self) -> None:
        self.synced = False
        self.requests.clear()
        self.blocks.clear()
        self._schedule.clear()
        self._tables_before.clear()
        self._blocks_before.clear()
        self._ref = []
        self.off_reason = None

    # ---- frames --------------------------------------------------------------------------
    def apply(self, f: fr.Frame) -> StepSnapshot | None:
        if f.phase not in fr.PHASES:
            self.violation(f, f"unknown phase {f.phase!r}")
            return None
        if not f.keyframe and f.dropped > self.dropped:
            # the publisher dropped frames since the last one (whether or not they were
            # numbered): the state is unknown until the next keyframe
            self.synced = False
            self.dropped = f.dropped
        if not f.keyframe and not self.synced or f.keyframe and self.hello is None:
            self.held_back += 1                # a delta of a state we do not have yet
            return None
        self._remember_leaving(f)
        if f.keyframe:
            self._keyframe(f)
        else:
            self._delta(f)
        self.frames += 1
        self.last_frame = f
        self.running, self.waiting = list(f.running), list(f.waiting)
        self.num_free_blocks = f.num_free_blocks
        self.dropped = f.dropped
        for rid in f.preempted:
            self.preemptions.append((f.step, rid))
        self.num_preemptions += len(f.preempted)
        self.check(f)
        if f.phase == "schedule":
            self._schedule[f.step] = f
            return None
        return self._snapshot(f)

    def _keyframe(self, f: fr.Frame) -> None:
        born = {rid: r for rid, r in self.requests.items()}
        self.requests = {}
        for r in f.requests:
            self._put(r, f.step, born.get(r.request_id))
        self.blocks = {b.block_id: (b.ref_cnt, b.block_hash) for b in f.blocks
                       if b.ref_cnt or b.block_hash is not None}
        self._reset_pool()
        for b, (rc, h) in self.blocks.items():
            self._set_block(b, rc, h)
        if not self.synced:                    # nothing to compare the first snapshot with
            self._tables_before = {rid: self._table(r.state) for rid, r in self.requests.items()}
            self._blocks_before = dict(self.blocks)
        self.synced = True

    def _delta(self, f: fr.Frame) -> None:
        for r in f.requests:
            self._put(r, f.step, self.requests.get(r.request_id))
        for rid in f.gone:
            self.requests.pop(rid, None)
        for b in f.blocks:
            if b.ref_cnt or b.block_hash is not None:
                self.blocks[b.block_id] = (b.ref_cnt, b.block_hash)
            else:                              # back to the idle state
                self.blocks.pop(b.block_id, None)
            self._set_block(b.block_id, b.ref_cnt, b.block_hash)

    # ---- the pool arrays -----------------------------------------------------------------
    def _reset_pool(self) -> None:
        n, null = self.hello.num_blocks, self.hello.null_block
        versions = self._version
        self._ref, self._hash, self._fill = [0] * n, [None] * n, [0] * n
        # versions go on from the old ones: a cached BlockState never matches a rebuilt block
        start = max(versions, default=0) + 1
        self._version = [start] * n
        self._free = {b for b in range(n) if b != null}
        self._block_cache.clear()

    def _set_block(self, b: int, rc: int, h: fr.BlockHash) -> None:
        if not 0 <= b < len(self._ref) or b == self.hello.null_block:
            return                             # out of the pool: check() counts it
        hx = hash_hex(h) if h is not None else None
        old_rc, old_hash = self._ref[b], self._hash[b]
        if (rc, hx) == (old_rc, old_hash):
            return
        if rc <= 0:                            # free: a cached block keeps a full block's K/V
            fill = self.hello.block_size if hx else 0
        elif hx is None and (old_rc == 0 or old_hash is not None):
            fill = 0                           # handed out afresh (or evicted and reused)
        else:
            fill = self._fill[b]
        self._ref[b], self._hash[b], self._fill[b] = rc, hx, fill
        self._version[b] += 1
        if rc <= 0:
            self._free.add(b)
        else:
            self._free.discard(b)

    def _filled(self, b: int, filled: int) -> None:
        """A table holding ``b`` has computed ``filled`` of its slots."""
        if 0 <= b < len(self._fill) and b != self.hello.null_block:
            new = max(filled, self._fill[b])
            if new != self._fill[b]:
                self._fill[b] = new
                self._version[b] += 1

    def _placeholder(self, n: int) -> tuple:
        """n unknown tokens, one tuple per length (requests as long share it)."""
        memo = self._tokens_of_length
        t = memo.get(n)
        if t is None:
            if len(memo) > 512:
                memo.clear()
            t = memo[n] = (UNKNOWN_TOKEN,) * n
        return t

    def _put(self, r: fr.RequestState, step: int, known: _Request | None) -> None:
        if known is None:
            known = _Request(r, self._next_seq_id, step)
            self._next_seq_id += 1
        self.requests[r.request_id] = _Request(r, known.seq_id, known.born_step)

    def _table(self, r: fr.RequestState) -> tuple[int, ...]:
        """Its blocks, every KV cache group's in turn (the null block holds nothing)."""
        null = self.hello.null_block if self.hello else None
        return tuple(b for group in r.block_ids for b in group if b != null)

    # ---- invariants ----------------------------------------------------------------------
    def violation(self, f: fr.Frame, reason: str) -> None:
        self.violations += 1
        self.violation_reasons.append(f"step {f.step} {f.phase}: {reason}")

    def check(self, f: fr.Frame) -> None:
        """The scheduler's invariants on the state after ``f``: counted, never raised."""
        hello = self.hello
        null = hello.null_block
        held: dict[int, int] = {}
        for rid, r in self.requests.items():
            table = self._table(r.state)
            if r.state.status == "preempted" and table:
                self.violation(f, f"preempted request {rid} holds {len(table)} block(s)")
            for b in table:
                if not 0 <= b < hello.num_blocks:
                    self.violation(f, f"request {rid} holds block {b}, outside the pool of "
                                      f"{hello.num_blocks}")
                held[b] = held.get(b, 0) + 1
        for b in sorted(set(held) | set(self.blocks)):
            if b == null:
                continue
            rc = self.blocks.get(b, (0, None))[0]
            if rc != held.get(b, 0):
                self.violation(f, f"block {b} has ref count {rc} but {held.get(b, 0)} table "
                                  f"entries hold it")
                break                          # one line per frame is enough to look
        in_use = sum(1 for b, (rc, _) in self.blocks.items() if rc > 0 and b != null)
        expected = hello.num_blocks - (null is not None) - in_use
        if f.num_free_blocks != expected:
            self.violation(f, f"{f.num_free_blocks} free blocks, but the pool of "
                              f"{hello.num_blocks} less the null block and {in_use} held "
                              f"leaves {expected}")

    # ---- snapshots -----------------------------------------------------------------------
    def _snapshot(self, update: fr.Frame) -> StepSnapshot:
        hello = self.hello
        bs, n, null = hello.block_size, hello.num_blocks, hello.null_block
        sched = self._schedule.pop(update.step, None)
        for old in [s for s in self._schedule if s < update.step]:
            del self._schedule[old]            # a schedule whose update never came
        scheduled = sched.scheduled if sched is not None else {}
        preempted = (list(sched.preempted) if sched is not None else []) + list(update.preempted)
        finished = list(update.finished)
        tables = {rid: self._table(r.state) for rid, r in self.requests.items()}
        events = self._events(update, scheduled, preempted, finished, tables)
        kinds = {e.kind for e in events if e.kind in ("prefill", "append")}
        kind = ("idle" if not kinds else "mixed" if len(kinds) == 2
                else "prefill" if "prefill" in kinds else "decode")
        running = set(self.running)
        seqs = []
        for rid, r in self.requests.items():
            s = r.state
            status = SHOWN_STATUS.get(s.status, "waiting")
            if rid in running:
                status = "running"
            num_tokens = s.num_prompt_tokens + s.num_output_tokens
            computed = min(s.num_computed_tokens, num_tokens)
            seqs.append(SeqState(r.seq_id, rid, None, r.born_step, status,
                                 self._placeholder(num_tokens), s.num_prompt_tokens, computed,
                                 tables[rid], "gpu", "", 0.0, None, False))
            for logical, b in enumerate(tables[rid]):
                self._filled(b, max(0, min(bs, computed - logical * bs)))
        for rid in finished:                   # shown in the step they finished, then gone
            if rid in self._done:
                seqs.append(self._done[rid])
        self.num_finished += len(finished)
        gpu = PoolContents("gpu", bs, self._ref, self._hash, _Tokens(self._fill, bs),
                           self._free, n - (null is not None), null, self._version)
        step_time = (update.ts - self._last_update_ts) if self._last_update_ts else 0.0
        self._last_update_ts = update.ts
        self._tables_before = tables
        self._blocks_before = dict(self.blocks)
        num_running = sum(1 for s in seqs if s.status == "running")
        snap = step_snapshot(
            step=update.step, kind=kind, index=self.history.recorded, model="vllm serve",
            backend=f"vLLM {hello.vllm_version} (scheduler tap, rank {self.rank})",
            device="gpu", semantics=SEMANTICS, sequences=tuple(seqs), gpu=gpu, cpu=None,
            queues=(len(self.waiting), len(self.running), 0),
            logical_blocks=sum(len(t) for t in tables.values()), bytes_per_block=0,
            prefix_cache=PrefixCacheCounts(), num_preemptions=self.num_preemptions,
            running_seqs=num_running, finished=self.num_finished, events=tuple(events),
            step_time_s=max(0.0, step_time), block_cache=self._block_cache)
        return self._keep(snap)

    def _keep(self, snap: StepSnapshot) -> StepSnapshot:
        """Kept within MAX_HISTORY snapshots and HISTORY_BUDGET entries, the oldest dropped."""
        history = self.history
        if len(history.history) == history.history.maxlen:
            self._sizes.popleft()              # the deque drops its oldest itself
        history.keep(snap)
        self._sizes.append(len(snap.blocks) + sum(len(s.token_ids) for s in snap.sequences))
        total = sum(self._sizes)
        while len(self._sizes) > 1 and total > HISTORY_BUDGET:
            total -= self._sizes.popleft()
            history.history.popleft()
        del history.accounting_log[:-len(history.history)]   # not kept beyond the history
        return snap

    def _events(self, update: fr.Frame, scheduled: dict[str, int], preempted: list[str],
                finished: list[str], tables: dict[str, tuple[int, ...]]) -> list[ev.Event]:
        """The step's events, read off what changed since the last update (the tap sends
        state, not a log): preemptions in vLLM's order, new table entries (a hit when the
        block already had a hash), the tokens scheduled, hashes set (cached) or replaced
        (evicted), blocks back at ref count 0 (freed), finished requests."""
        bs = self.hello.block_size
        seq_of = {rid: r.seq_id for rid, r in self.requests.items()}
        done = self._done
        done.clear()
        out: list[ev.Event] = []
        for rid in preempted:
            if rid in seq_of:
                out.append(ev.Preempt(seq_of[rid], "recompute", PREEMPT_RULE))
        before = self._blocks_before
        for rid, table in tables.items():
            old = self._tables_before.get(rid, ())
            for logical, b in enumerate(table):
                if logical < len(old) and old[logical] == b:
                    continue
                had = before.get(b, (0, None))[1]
                if had is not None:
                    out.append(ev.PrefixHit(seq_of[rid], logical, b, hash_hex(had)))
                else:
                    out.append(ev.Alloc(seq_of[rid], logical, b))
        for rid, n in scheduled.items():
            r = self.requests.get(rid)
            if r is None or n <= 0:
                continue
            s, table = r.state, tables.get(rid, ())
            end = s.num_computed_tokens
            start = max(0, end - n)
            if n == 1 and start >= s.num_prompt_tokens and table and start // bs < len(table):
                out.append(ev.Append(seq_of[rid], UNKNOWN_TOKEN, start // bs,
                                     table[start // bs], slot_of(list(table), start, bs)))
            else:
                out.append(ev.Prefill(seq_of[rid], start, end, s.num_prompt_tokens))
        owner = {b: rid for rid, t in tables.items() for b in t}
        for b in sorted(set(before) | set(self.blocks)):
            rc0, h0 = before.get(b, (0, None))
            rc1, h1 = self.blocks.get(b, (0, None))
            if h0 is not None and h1 != h0:
                out.append(ev.Evict(b, hash_hex(h0)))
            if h1 is not None and h1 != h0:
                rid = owner.get(b)
                out.append(ev.Cached(seq_of.get(rid, -1), b, hash_hex(h1), "", ()))
            if rc0 > 0 and rc1 == 0 and b != self.hello.null_block:
                out.append(ev.Free(b, h1 is not None))
        for rid in finished:
            r = self._gone_request(rid)
            if r is None:
                continue
            s = r.state
            n_tok = s.num_prompt_tokens + s.num_output_tokens
            done[rid] = SeqState(r.seq_id, rid, None, r.born_step, "finished",
                                 (UNKNOWN_TOKEN,) * n_tok, s.num_prompt_tokens,
                                 min(s.num_computed_tokens, n_tok), (), "gpu", "", 0.0,
                                 "finished", False)
            out.append(ev.Finish(r.seq_id, "finished"))
        return out

    def _gone_request(self, rid: str) -> _Request | None:
        """A finished request: still held (freed later), or gone in this frame (the last state
        the model had of it)."""
        r = self.requests.get(rid)
        return r if r is not None else self._seen.get(rid)

    def _remember_leaving(self, f: fr.Frame) -> None:
        """Requests ``f`` drops (``gone``, or missing from a keyframe): kept until the next
        frame, so the Finish of a request freed in the same update can name it."""
        seen = self._seen
        seen.clear()
        for rid in f.gone:
            if rid in self.requests:
                seen[rid] = self.requests[rid]
        if f.keyframe:
            live = {r.request_id for r in f.requests}
            for rid, r in self.requests.items():
                if rid not in live:
                    seen[rid] = r

    # ---- what the view reads -------------------------------------------------------------
    @property
    def snapshots(self) -> list[StepSnapshot]:
        return list(self.history.history)

    def preemption_order(self) -> list[str]:
        return [rid for _, rid in self.preemptions]
