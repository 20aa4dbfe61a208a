"""Prefix-cache block hashes are vLLM v1's (sha256 over the pickle of (parent digest or
NONE_HASH, tuple of token ids, extra keys)), the full digest (a truncated one could collide and
silently serve another prefix's K/V), as a hex str everywhere they travel. Real vLLM's own
hashes are compared in tests/vllm_real."""
import hashlib
import json
import os
import pickle

from engine import Engine, EngineConfig, SamplingParams, StepSnapshot
from engine.core.hashing import hash_block
from tests.engine.helpers import run_all


def _sha(obj) -> bytes:
    return hashlib.sha256(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)).digest()


# vLLM 0.32's NONE_HASH: the hash of PYTHONHASHSEED when set, else of "vllm-none-hash"
NONE_HASH = _sha(os.environ.get("PYTHONHASHSEED", "vllm-none-hash"))


def sha(parent: str, tokens: list[int], extra=None) -> str:
    return _sha((bytes.fromhex(parent) if parent else NONE_HASH, tuple(tokens), extra)).hex()


def is_full_hex(h) -> bool:
    return isinstance(h, str) and len(h) == 64 and all(c in "0123456789abcdef" for c in h)


def test_hash_block_is_the_full_sha256_of_parent_and_tokens():
    first = hash_block("", [1, 2, 3, 4])
    assert first == sha("", [1, 2, 3, 4]) and is_full_hex(first)
    second = hash_block(first, [5, 6, 7, 8])
    assert second == sha(first, [5, 6, 7, 8]) and is_full_hex(second)


def test_a_cache_salt_is_a_tagged_key_of_the_first_block_only():
    from engine.core.hashing import block_extra_keys, event_extra_keys
    keys = block_extra_keys("alice", 0)
    assert keys == (("cache_salt", "alice"),) and block_extra_keys("alice", 1) is None
    assert hash_block("", [1, 2], keys) == sha("", [1, 2], (("cache_salt", "alice"),))
    assert hash_block("", [1, 2], keys) != hash_block("", [1, 2])
    assert event_extra_keys(keys) == ("alice",) and event_extra_keys(None) is None


def test_pythonhashseed_changes_the_first_parent(monkeypatch):
    monkeypatch.setenv("PYTHONHASHSEED", "7")
    assert hash_block("", [1, 2]) == _sha((_sha("7"), (1, 2), None)).hex()
    monkeypatch.delenv("PYTHONHASHSEED")
    assert hash_block("", [1, 2]) == _sha((_sha("vllm-none-hash"), (1, 2), None)).hex()


def test_different_prefixes_give_different_hashes():
    a, b = hash_block("", [1, 2, 3, 4]), hash_block("", [1, 2, 3, 5])
    assert a != b
    # the same block tokens after different prefixes: different hashes (the chain)
    assert hash_block(a, [9, 9, 9, 9]) != hash_block(b, [9, 9, 9, 9])


def test_engine_hashes_are_full_and_survive_json():
    # two requests share a 2-block prefix (prefix hits); a small pool forces evictions
    eng = Engine.length_only(EngineConfig(block_size=4, num_gpu_blocks=8,
                                          enable_prefix_caching=True),
                              detailed_snapshots=True)
    prefix = list(range(1, 9))
    params = SamplingParams(max_tokens=6, ignore_eos=True)
    eng.add_request(prefix + [20, 21, 22], params)
    run_all(eng)
    eng.add_request(prefix + [30, 31], params)
    eng.add_request(list(range(40, 56)), params)
    events = [e for r in run_all(eng) for e in r.events]
    hits = [e for e in events if e.kind == "prefix_hit"]
    evicts = [e for e in events if e.kind == "evict"]
    assert hits and evicts
    assert all(is_full_hex(e.block_hash) for e in hits + evicts)
    assert all(is_full_hex(h) for g in eng.groups.values() for s in g.all_seqs()
               for h in s.block_hashes)
    assert eng.bm.gpu.cached and all(is_full_hex(h) for h in eng.bm.gpu.cached)
    snap = eng.snapshot
    hashed = [b.block_hash for b in snap.blocks if b.block_hash]
    assert hashed and all(is_full_hex(h) for h in hashed)
    again = StepSnapshot.from_dict(json.loads(json.dumps(snap.to_dict())))
    assert [b.block_hash for b in again.blocks] == [b.block_hash for b in snap.blocks]
