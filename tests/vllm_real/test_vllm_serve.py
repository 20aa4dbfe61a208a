"""A real ``vllm serve`` (vLLM 0.32's OpenAI-compatible server, CPU build, the default model)
publishing KV cache events over ZeroMQ on 127.0.0.1, watched with our subscriber and the Watch
view's cache model. Completions go through its OpenAI API, one after another; the same
requests run through our v1 engine with the same settings. The cache the Watch view rebuilds
from the server's stream must equal ours: every cached hash with its token ids, every removal
in order, and the stream's events themselves -- with vLLM's default 64-bit integer hashes and
with digest hashes (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0), two servers started together."""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from engine import Engine, EngineConfig, SamplingParams
from engine.core.hashing import hash_int64
from engine.kv_events.cache_view import PrefixCacheView
from engine.kv_events.publisher import KVEventRecorder
from engine.kv_events.subscriber import KVEventSubscriber, ReceivedBatch
from engine.kv_events.wire import BlockRemoved, BlockStored
from tests.vllm_real.serve import VllmServe, free_port, start_all
from tests.vllm_real.workloads import toks

SETTINGS = dict(block_size=32, num_gpu_blocks=8, max_model_len=224)
PREFIX = toks(700, 64)
PROMPTS = [PREFIX + toks(900, 6), PREFIX + toks(950, 20), toks(1000, 100), toks(1100, 90),
           PREFIX + toks(1200, 3), toks(1300, 80)]
MAX_TOKENS = 20
TOPIC = "kv"


class Server(VllmServe):
    def __init__(self, int_hashes: bool, log_dir: Path):
        self.events, self.replay = free_port(), free_port()
        config = {"enable_kv_cache_events": True, "publisher": "zmq", "topic": TOPIC,
                  "endpoint": f"tcp://127.0.0.1:{self.events}",
                  "replay_endpoint": f"tcp://127.0.0.1:{self.replay}"}
        super().__init__(
            log_dir / f"vllm-serve-{'int' if int_hashes else 'bytes'}.log",
            ["--block-size", str(SETTINGS["block_size"]),
             "--num-gpu-blocks-override", str(SETTINGS["num_gpu_blocks"]),
             "--max-model-len", str(SETTINGS["max_model_len"]), "--enable-prefix-caching",
             "--kv-events-config", json.dumps(config)],
            VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES="1" if int_hashes else "0")

    def complete(self, prompt: list[int]) -> list[int]:
        return self.completion(prompt, MAX_TOKENS, return_token_ids=True)[
            "choices"][0]["token_ids"]


@pytest.fixture(scope="module")
def servers(vllm_ready, tmp_path_factory):
    log_dir = tmp_path_factory.mktemp("vllm-serve")
    yield from start_all({mode: Server(mode == "int", log_dir) for mode in ("int", "bytes")})


def ours() -> tuple[list[list[int]], list[list]]:
    """Our v1 engine on the same requests, one after another: outputs and KV event batches."""
    eng = Engine(EngineConfig(semantics="v1", **SETTINGS))
    recorder = KVEventRecorder(SETTINGS["block_size"])
    eng.observers.append(recorder)
    outputs = []
    for prompt in PROMPTS:
        rid = eng.add_request(prompt, SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True))
        while eng.has_unfinished_requests():
            eng.step()
        outputs.append(eng.get_output(rid).outputs[0].token_ids)
    return outputs, [events for _, events in recorder.batches]


def as_int(events: list) -> list:
    """Our events with vLLM's default integer hashes (the digest's low 64 bits)."""
    def conv(h):
        return None if h is None else hash_int64(h.hex())
    out = []
    for e in events:
        if isinstance(e, BlockStored):
            e = BlockStored([conv(h) for h in e.block_hashes], conv(e.parent_block_hash),
                            e.token_ids, e.block_size, e.lora_id, e.medium, e.lora_name,
                            e.extra_keys, e.group_idx, e.kv_cache_spec_kind)
        elif isinstance(e, BlockRemoved):
            e = BlockRemoved([conv(h) for h in e.block_hashes], e.medium, e.group_idx)
        out.append(e)
    return out


@pytest.mark.parametrize("mode", ["int", "bytes"])
def test_the_watch_view_rebuilds_what_vllm_serve_stored(servers, mode):
    server = servers[mode]
    expected_outputs, expected_batches = ours()
    if mode == "int":
        expected_batches = [as_int(b) for b in expected_batches]
    sub = KVEventSubscriber(f"tcp://127.0.0.1:{server.events}", TOPIC,
                            f"tcp://127.0.0.1:{server.replay}")
    try:
        got_outputs = [server.complete(p) for p in PROMPTS]
        received: list[ReceivedBatch] = []
        deadline = time.monotonic() + 60
        while len(received) < len(expected_batches) and time.monotonic() < deadline:
            received += sub.receive(timeout_s=1.0)
        received += sub.receive(timeout_s=1.0)           # nothing more may come
    finally:
        sub.close()
    assert got_outputs == expected_outputs
    assert not sub.gaps, sub.gaps
    assert [list(b.events) for b in received] == expected_batches
    view, mine = PrefixCacheView(), PrefixCacheView()
    view.apply_all(received)
    mine.apply_all(ReceivedBatch(i, 0.0, tuple(events), 0)
                   for i, events in enumerate(expected_batches))
    assert view.removed_total > 0 and view.stored_total > 0
    theirs_blocks = {k[3]: b.token_ids for k, b in view.blocks.items()}
    assert theirs_blocks == {k[3]: b.token_ids for k, b in mine.blocks.items()}
    assert [b.block_hash for b in view.removed] == [b.block_hash for b in mine.removed]
    kind = int if mode == "int" else bytes
    assert all(isinstance(h, kind) for h in theirs_blocks)
    print(f"\nvllm serve ({mode} hashes): {len(received)} batches, {view.stored_total} blocks "
          f"stored, {view.removed_total} removed, {len(theirs_blocks)} cached: equal to ours")
