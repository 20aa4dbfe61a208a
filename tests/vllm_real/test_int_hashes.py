"""vLLM's default KV events carry 64-bit integer hashes (the digest's low 64 bits); the
subscriber's decoder and the Watch view's cache model read them, and the cache they rebuild is
the one our engine holds, hash for hash (as integers) and token for token."""
from __future__ import annotations

from engine import Engine, EngineConfig, SamplingParams
from engine.core.hashing import hash_int64
from engine.kv_events.cache_view import PrefixCacheView
from engine.kv_events.subscriber import ReceivedBatch
from engine.kv_events.wire import decode_batch
from dataclasses import replace

from real_vllm.compare import first_difference
from real_vllm.lockstep import Lockstep
from tests.vllm_real.workloads import toks


def test_vllms_default_integer_hashes_rebuild_our_cache(vllm_ready, monkeypatch):
    monkeypatch.setenv("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", "1")
    ls = Lockstep.start(Engine(EngineConfig(semantics="v1", block_size=32, num_gpu_blocks=8,
                                            max_model_len=224)))
    try:
        for i, rid in enumerate("abcd"):
            ls.add_request(rid, toks(600 + 40 * i, 50 + 10 * i),
                           SamplingParams(max_tokens=40, ignore_eos=True))
        view = PrefixCacheView()
        seq = 0
        while ls.has_unfinished_requests():
            step = ls.step()
            # the hashes' form differs (ours digests, vLLM's integers); all else must not
            theirs, ours = step.theirs, step.ours
            assert first_difference(replace(ours, kv_events=[]),
                                    replace(theirs, kv_events=[])) is None
            assert len(ours.kv_events) == len(theirs.kv_events)
            for payload in step.theirs.kv_events:
                batch = decode_batch(payload)
                assert all(isinstance(h, int) for e in batch.events
                           for h in getattr(e, "block_hashes", ()))
                view.apply(ReceivedBatch(seq, batch.ts, tuple(batch.events), 0))
                seq += 1
        assert view.removed_total > 0                     # evictions were seen too
        pool = ls.engine.bm.gpu
        ours = {hash_int64(h): tuple(pool.tokens[b]) for b, h in enumerate(pool.block_hash) if h}
        theirs = {key[3]: block.token_ids for key, block in view.blocks.items()}
        assert theirs == ours and ours
    finally:
        ls.close()
