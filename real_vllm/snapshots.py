"""Real vLLM's state after each step as the page's ``StepSnapshot``s, so every figure of the
lab (block tables, pool, narration, metrics, waste, timeline, trace export) draws vLLM itself.

An observer of a ``RealVllmEngine`` (real_vllm/adapter.py): after each step it reads vLLM's
own objects (its requests, ``req_to_blocks``, every block's ``ref_cnt`` and ``block_hash``,
the free queue, the scheduler's output, the KV event batches it published, its
``PrefixCacheStats``) and gives those values to the builder our recorder uses
(engine/observe/snapshot.py: block states, pool stats, the snapshot, its history), with the
same contiguous baselines (``ContiguousBaselines``): our view, filled from vLLM's objects. Where vLLM keeps no record of a change (it logs no "block
allocated"), the step's events are read off its state, from schedule's return to the step's
end (docs/vllm-fidelity.md, "Real vLLM on the page"):
- ``Alloc`` / ``PrefixHit``: a block new in a request's table right after ``schedule``; a hit
  when vLLM's block already had a hash (a cached block found by ``find_longest_cache_hit``);
- ``Prefill`` / ``Append``: the tokens ``schedule`` gave each request;
- ``Preempt``: each ``_preempt_request`` call, in order;
- ``Cached`` / ``Evict`` / ``CacheReset``: vLLM's own KV events (BlockStored, BlockRemoved,
  AllBlocksCleared) of the step;
- ``Free``: a block whose ``ref_cnt`` went to 0 (cached if it kept its hash);
- ``Sample`` / ``Finish``: the step's outputs (the sampled tokens' logprobs as vLLM computed
  them).
Sequence ids number the requests in the order they were added (an n > 1 request's children
in index order), as our engine numbers its sequences. A block's tokens are those of the
requests whose tables hold it, up to their computed tokens; a cached free block keeps its
tokens (vLLM keeps its K/V), any other free block holds none.
"""
from __future__ import annotations

import time

from engine import events as ev
from engine.core.block_math import slot_of
from engine.kv_events.cache_view import PrefixCacheView
from engine.kv_events.subscriber import ReceivedBatch
from engine.kv_events.wire import AllBlocksCleared, BlockRemoved, BlockStored, decode_batch, \
    hash_hex
from engine.observe.observers import ContiguousBaselines
from engine.observe.snapshot import PoolContents, PrefixCacheCounts, SeqState, \
    SnapshotHistory, StepSnapshot, step_snapshot
from engine.processing.parallel_sampling import child_request_ids
from real_vllm.state import StepView

SEMANTICS = "vllm"          # the snapshots' engine: real vLLM (its label: app/views/common.py)
PREEMPT_RULE = ("real vLLM preempted the last request of its running queue (the most recently "
                "admitted) by recompute: blocks freed, computed tokens reset, back to the front "
                "of the waiting queue")


class VllmSnapshots(SnapshotHistory):
    """Snapshots of ``vllm`` (a RealVllmEngine), one per step, kept in ``history``."""

    def __init__(self, vllm, *, model: str, max_model_len: int, max_history: int = 400):
        super().__init__(max_history)
        self.vllm = vllm
        self.model = model
        self.block_size = bs = vllm.settings.block_size
        self.num_blocks = len(vllm.pool.blocks)
        self.null_block = vllm.pool.null_block.block_id
        kv_config = vllm.scheduler.kv_cache_config
        self.bytes_per_block = sum(t.size for t in kv_config.kv_cache_tensors) // \
            max(1, kv_config.num_blocks)
        from real_vllm.environment import installed_version
        self.backend = f"real vLLM {installed_version()}"
        self.device = str(getattr(vllm.llm.vllm_config.device_config, "device_type", "cpu"))
        self._seq_ids: dict[str, int] = {}           # request id -> sequence id, in add order
        self._born: dict[str, int] = {}
        self._prompts: dict[str, list[int]] = {}
        self._max_tokens: dict[str, int] = {}
        self._done: dict[str, SeqState] = {}
        self._tables: dict[str, list[int]] = {}
        self._tokens: dict[int, tuple[int, ...]] = {}  # block -> the tokens whose K/V it holds
        self._ref_counts = [0] * self.num_blocks
        self._hash_to_block: dict[str, int] = {}
        self._hashes: dict[int, str] = {}
        self.num_finished = 0
        self.num_preemptions = 0
        self.baselines = ContiguousBaselines((self.num_blocks - 1) * bs, max_model_len)
        # real vLLM's prefix cache rebuilt from the KV event batches it published, as the
        # Watch view rebuilds a vllm serve's (the prefix tree draws it)
        self.cache_view = PrefixCacheView()
        self.record(vllm.view(), "init", (), 0.0)

    # ---- requests ------------------------------------------------------------------------
    def on_add(self, request_id: str, prompt_token_ids: list[int], params) -> None:
        """A request was added to vLLM (an n > 1 request: each child, as vLLM splits it)."""
        for rid in child_request_ids(request_id, params.n) or [request_id]:
            self._seq_ids[rid] = len(self._seq_ids)
            self._born[rid] = self.vllm.step_no
            self._prompts[rid] = list(prompt_token_ids)
            self._max_tokens[rid] = params.max_tokens
            self.baselines.add(rid, len(prompt_token_ids), params.max_tokens, 1)
        self.renew_init(lambda: self.record(self.vllm.view(), "init", (), 0.0))

    # ---- steps ---------------------------------------------------------------------------
    def step(self) -> StepView:
        """One vLLM step, its view, and the snapshot of it (appended to ``history``)."""
        t0 = time.perf_counter()
        view = self.vllm.step()
        elapsed = time.perf_counter() - t0
        batches = [decode_batch(payload) for payload in view.kv_events]   # once per step
        events = self._events(view, batches)
        for batch in batches:
            self.cache_view.apply(ReceivedBatch(self.cache_view.batches, float(view.step),
                                                tuple(batch.events),
                                                batch.data_parallel_rank or 0))
        kinds = {e.kind for e in events if e.kind in ("prefill", "append")}
        kind = ("idle" if not kinds else "mixed" if len(kinds) == 2
                else "prefill" if "prefill" in kinds else "decode")
        for rid in view.finished:
            self.baselines.finish(rid, len(self.vllm.completions[rid].token_ids),
                                  self._max_tokens[rid])
        self.baselines.step()
        self.record(view, kind, tuple(events), elapsed)
        return view

    def _events(self, view: StepView, batches: list) -> list[ev.Event]:
        seq = self._seq_ids
        vllm = self.vllm
        out: list[ev.Event] = []
        freed = set()
        for rid in view.preempted:                 # its blocks are freed, last block first
            out.append(ev.Preempt(seq[rid], "recompute", PREEMPT_RULE))
            for b in reversed(self._tables.pop(rid, [])):
                if self._ref_counts[b] == 1:
                    cached = b in self._hashes
                    out.append(ev.Free(b, cached))
                    freed.add(b)
                    if not cached:
                        self._tokens[b] = ()
        for batch in batches:                      # evictions precede the allocations
            for e in batch.events:
                if isinstance(e, BlockRemoved):
                    for h in e.block_hashes:
                        b = self._hash_to_block.get(hash_hex(h), -1)
                        out.append(ev.Evict(b, hash_hex(h)))
                        self._tokens.pop(b, None)
                        self._hashes.pop(b, None)
        computed_by: dict[int, str] = {}           # block -> the request computing into it
        bs = self.block_size
        for rid, (table, computed, num_tokens) in vllm.scheduled_requests.items():
            before = self._tables.get(rid, [])
            n = view.scheduled.get(rid, 0)
            start = computed - n                   # after this step's prefix-cache hits
            for logical, b in enumerate(table):
                if (logical + 1) * bs > start:
                    computed_by.setdefault(b, rid)
                if logical < len(before) and before[logical] == b:
                    continue
                if (logical + 1) * bs <= start:    # its tokens were found, not computed
                    out.append(ev.PrefixHit(seq[rid], logical, b, view.block_hashes.get(b, "")))
                else:
                    out.append(ev.Alloc(seq[rid], logical, b))
                    self._tokens[b] = ()
            self._tables[rid] = table
            tokens = self._token_ids(rid)
            if n == 1 and start >= len(self._prompts[rid]):
                out.append(ev.Append(seq[rid], tokens[start], start // bs, table[start // bs],
                                     slot_of(table, start, bs)))
            elif n:
                out.append(ev.Prefill(seq[rid], start, computed, num_tokens))
            self._fill(table, tokens[:computed])
        hashes_now = view.block_hashes
        for b, (before, now) in enumerate(zip(self._ref_counts, view.ref_counts)):
            if before and not now and b != self.null_block and b not in freed:
                cached = b in hashes_now
                out.append(ev.Free(b, cached))
                if not cached:
                    self._tokens[b] = ()
        owner = dict(computed_by)
        block_of = {hx: blk for blk, hx in hashes_now.items()}
        for batch in batches:
            for e in batch.events:
                if isinstance(e, BlockStored):
                    parent = hash_hex(e.parent_block_hash)
                    for i, h in enumerate(e.block_hashes):
                        b = block_of.get(hash_hex(h), -1)
                        toks = tuple(e.token_ids[i * self.block_size:(i + 1) * self.block_size])
                        rid = owner.get(b)
                        out.append(ev.Cached(seq[rid] if rid in seq else -1, b, hash_hex(h),
                                             parent, toks))
                        parent = hash_hex(h)
                elif isinstance(e, AllBlocksCleared):
                    out.append(ev.CacheReset())
        for rid, tokens in view.new_tokens.items():
            lps = self.vllm.completions[rid].logprobs if rid in self.vllm.completions else []
            for i, t in enumerate(tokens):
                k = len(lps) - len(tokens) + i
                out.append(ev.Sample(seq[rid], t, lps[k] if 0 <= k < len(lps) else 0.0))
        for rid, reason in view.finished.items():
            out.append(ev.Finish(seq[rid], reason))
        return out

    def _token_ids(self, rid: str) -> list[int]:
        r = self._request(rid)
        if r is not None:
            return list(r.all_token_ids)
        done = self.vllm.completions.get(rid)
        return self._prompts[rid] + (list(done.token_ids) if done else [])

    def _request(self, rid: str):
        return self.vllm.request(rid)

    def _fill(self, table: list[int], computed: list[int]) -> None:
        bs = self.block_size
        for logical, b in enumerate(table):
            toks = tuple(computed[logical * bs:(logical + 1) * bs])
            if len(toks) >= len(self._tokens.get(b, ())):
                self._tokens[b] = toks

    # ---- the snapshot --------------------------------------------------------------------
    def record(self, view: StepView, kind: str, events: tuple, step_time: float) -> StepSnapshot:
        running = set(view.running)
        seqs = []
        for rid, sid in self._seq_ids.items():
            if rid in self._done:
                seqs.append(self._done[rid])
                continue
            r = self._request(rid)
            table = tuple(view.block_tables.get(rid, ()))
            done = self.vllm.completions.get(rid)
            if r is not None:
                tokens, computed = tuple(r.all_token_ids), r.num_computed_tokens
                status, finish = ("running" if rid in running else "waiting"), None
                self._fill(list(table), list(tokens[:computed]))
            else:
                tokens, computed = tuple(self._token_ids(rid)), 0
                status = "finished"
                finish = done.finish_reason if done else "abort"
            text = done.text if done else ""
            cum = sum(done.logprobs) if done else 0.0
            state = SeqState(sid, rid, None, self._born[rid], status, tokens,
                             len(self._prompts[rid]), computed, table, "gpu", text, cum,
                             finish, False)
            if status == "finished":
                self._done[rid] = state
                self.num_finished += 1
            seqs.append(state)
        hashes = view.block_hashes
        for b, rc in enumerate(view.ref_counts):   # a free block without a hash holds nothing
            if rc == 0 and not hashes.get(b):
                self._tokens[b] = ()
        n = self.num_blocks
        gpu = PoolContents("gpu", self.block_size, list(view.ref_counts),
                           [hashes.get(b) for b in range(n)],
                           [self._tokens.get(b, ()) for b in range(n)], view.free_queue,
                           n - 1, self.null_block)
        self._ref_counts = list(view.ref_counts)
        self._hashes = dict(hashes)
        self._hash_to_block = {h: b for b, h in hashes.items()}
        for rid in list(self._tables):
            if rid not in view.block_tables:
                del self._tables[rid]
        self._tables.update({rid: list(t) for rid, t in view.block_tables.items()})
        self.num_preemptions += len(view.preempted)
        pc = self.vllm.prefix_cache
        return self.keep(step_snapshot(
            step=self.vllm.step_no, kind=kind, index=self.recorded, model=self.model,
            backend=self.backend, device=self.device, semantics=SEMANTICS,
            sequences=tuple(seqs), gpu=gpu, cpu=None,
            queues=(len(view.waiting), len(view.running), 0),
            logical_blocks=sum(len(t) for t in view.block_tables.values()),
            bytes_per_block=self.bytes_per_block,
            prefix_cache=PrefixCacheCounts(pc["queries"], pc["hits"], pc["preempted_queries"],
                                           pc["preempted_hits"]),
            num_preemptions=self.num_preemptions, running_seqs=len(view.running),
            finished=self.num_finished, baselines=self.baselines.accounting(),
            slabs=self.baselines.slabs(), events=events, step_time_s=step_time))
