"""KV cache events, vLLM's format over real ZeroMQ sockets on 127.0.0.1.

- The engine's publisher and our subscriber: the BlockStored events carry exactly the blocks the
  engine cached (hashes chained through parent_block_hash, tokens, block size), in order, one
  batch per step with changes; evictions arrive as BlockRemoved; a cache reset as
  AllBlocksCleared; the rebuilt cache equals the engine's.
- The wire format is vLLM's: payloads decode with a msgspec schema written here from the field
  lists of vllm/distributed/kv_events.py (independently of engine/kv_events/wire.py), and payloads
  written with that schema decode with ours; frames, sequence numbers and the replay protocol
  are checked with raw sockets.
- Gaps are filled from the replay socket or reported; malformed messages are counted, skipped.

The ZeroMQ slow-joiner problem (a PUB drops what it sends before a subscription arrives) is
handled without sleeps: the engine tests fetch the history through the replay socket; the raw
tests use an XPUB socket, which tells when the subscription has arrived.
"""
from __future__ import annotations

import socket
import time
from typing import Any

import msgspec
import pytest
import zmq

from engine import Engine, EngineConfig, SamplingParams
from engine import events as ev
from engine.kv_events.publisher import to_kv_events
from engine.kv_events import (AllBlocksCleared, BlockRemoved, BlockStored, Gap, KVEventBatch,
                              KVEventPublisher, KVEventSubscriber, PrefixCacheView, ReceivedBatch,
                              check_endpoint, decode_batch, encode_batch, offset_endpoint_port)
from engine.models.loader import DEFAULT_MODEL_DIR
from tests.ports import free_port

DEADLINE_S = 10.0
BS = 4


# ---- vLLM's schema, written here from vllm/distributed/kv_events.py ------------------------

class VEventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class VKVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    pass


class VBlockStored(VKVCacheEvent, tag="BlockStored"):
    block_hashes: list[bytes | int]
    parent_block_hash: bytes | int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None


class VBlockRemoved(VKVCacheEvent, tag="BlockRemoved"):
    block_hashes: list[bytes | int]
    medium: str | None
    group_idx: int | None = None


class VAllBlocksCleared(VKVCacheEvent, tag="AllBlocksCleared"):
    pass


class VKVEventBatch(VEventBatch):
    events: list[VBlockStored | VBlockRemoved | VAllBlocksCleared]


V_DECODER = msgspec.msgpack.Decoder(VKVEventBatch)
END = (-1).to_bytes(8, "big", signed=True)


# ---- helpers ------------------------------------------------------------------------------

def receive_until(sub: KVEventSubscriber, done, what: str) -> list[ReceivedBatch]:
    got: list[ReceivedBatch] = []
    deadline = time.monotonic() + DEADLINE_S
    while not done(got):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}: got seqs {[b.seq for b in got]}, "
                                 f"gaps {sub.gaps}, malformed {list(sub.malformed)}")
        got += sub.receive(0.05)
    return got


def receive_until_replay_asked(sub: KVEventSubscriber, router) -> list[ReceivedBatch]:
    """Receive until the subscriber has sent its replay request (it does so inside receive)."""
    got: list[ReceivedBatch] = []
    deadline = time.monotonic() + DEADLINE_S
    while not router.poll(0):
        assert time.monotonic() < deadline, f"no replay request; got {[b.seq for b in got]}"
        got += sub.receive(0.02)
    return got


def stored_blocks(batches) -> list[tuple[str, str, tuple]]:
    """(hash, parent hash, tokens) per block of every BlockStored, parents chained in-event."""
    out = []
    for b in batches:
        for e in b.events:
            if isinstance(e, BlockStored):
                parent = e.parent_block_hash.hex() if e.parent_block_hash else ""
                for i, h in enumerate(e.block_hashes):
                    out.append((h.hex(), parent, tuple(e.token_ids[i * BS:(i + 1) * BS])))
                    parent = h.hex()
    return out


# ---- the engine's publisher -> our subscriber --------------------------------------------

@pytest.fixture(scope="module")
def engine_run():
    """A prefix-caching run on a small pool (cached blocks get evicted), then a cache reset,
    then one more request (vLLM sends the reset's AllBlocksCleared with the next step's batch).

    The publisher connects to tcp://127.0.0.1:P, where the subscriber listens; its replay
    socket serves the history the PUB sent before the subscription arrived."""
    port, replay = free_port(), free_port()
    eng = Engine.length_only(EngineConfig(
        block_size=BS, num_gpu_blocks=12, enable_prefix_caching=True, seed=0,
        kv_events_endpoint=f"tcp://127.0.0.1:{port}", kv_events_topic="kv",
        kv_events_replay_endpoint=f"tcp://127.0.0.1:{replay}"), max_model_len=256)
    sub = KVEventSubscriber(f"tcp://127.0.0.1:{port}", topic="kv",
                            replay_endpoint=f"tcp://127.0.0.1:{replay}", bind=True,
                            probe_idle_s=0.1)
    try:
        common = list(range(1, 13))                  # 3 full blocks shared by every prompt
        steps = []
        for i in range(6):
            eng.add_request(common + [20 + i] * 6, SamplingParams(max_tokens=6, ignore_eos=True))
        while eng.has_unfinished_requests():
            steps.append(eng.step().events)
        cached_before_reset = {h: tuple(eng.bm.gpu.tokens[b]) for h, b in eng.bm.gpu.cached.items()}
        pub = eng.publishers[0]
        before_reset = pub.published
        assert eng.reset_prefix_cache()
        assert pub.published == before_reset                # held for the next step
        eng.add_request(list(range(40, 49)), SamplingParams(max_tokens=2, ignore_eos=True))
        after = []
        while eng.has_unfinished_requests():
            after.append(eng.step().events)
        assert pub.flush()
        total = pub.published
        batches = receive_until(sub, lambda got: len(got) == total, f"{total} batches")
        yield dict(steps=steps, after=after, batches=batches, sub=sub, pub=pub, eng=eng,
                   before_reset=before_reset, cached_before_reset=cached_before_reset)
    finally:
        eng.close()
        sub.close()


def test_block_stored_events_are_the_engines_cached_blocks_in_order(engine_run):
    cached = [(e.block_hash, e.parent_hash, e.token_ids)
              for events in engine_run["steps"] + engine_run["after"] for e in events
              if e.kind == "cached"]
    assert len(cached) > 10
    assert stored_blocks(engine_run["batches"]) == cached
    stores = [e for b in engine_run["batches"] for e in b.events if isinstance(e, BlockStored)]
    assert any(len(e.block_hashes) > 1 for e in stores)     # one event per request and step
    for e in stores:
        assert (e.block_size, e.medium, e.lora_id, e.lora_name, e.group_idx) == (BS, "GPU", None,
                                                                                  None, 0)
        assert len(e.token_ids) == BS * len(e.block_hashes)
        assert e.extra_keys == [None] * len(e.block_hashes)
        assert all(isinstance(h, bytes) and len(h) == 32 for h in e.block_hashes)


def test_evictions_arrive_as_block_removed_and_a_reset_as_all_blocks_cleared(engine_run):
    evicted = [e.block_hash for events in engine_run["steps"] for e in events if e.kind == "evict"]
    assert len(evicted) >= 3                                # the small pool forced evictions
    removed = [h.hex() for b in engine_run["batches"] for e in b.events
               if isinstance(e, BlockRemoved) for h in e.block_hashes]
    assert removed == evicted
    assert all(len(e.block_hashes) == 1 and e.medium == "GPU" for b in engine_run["batches"]
               for e in b.events if isinstance(e, BlockRemoved))     # vLLM: one per block
    first_after = engine_run["batches"][engine_run["before_reset"]]
    assert [type(e) for e in first_after.events] == [AllBlocksCleared, BlockStored]


def test_one_batch_per_step_with_changes_numbered_from_zero(engine_run):
    with_changes = [events for events in engine_run["steps"] + engine_run["after"]
                    if any(e.kind in ("cached", "evict") for e in events)]
    batches = engine_run["batches"]
    assert len(batches) == len(with_changes)                # the reset rode with the next step
    assert [b.seq for b in batches] == list(range(len(batches)))
    assert all(b.data_parallel_rank == 0 and b.ts > 0 for b in batches)
    assert engine_run["sub"].gaps == [] and engine_run["sub"].malformed_count == 0
    assert engine_run["pub"].dropped == 0


def test_the_rebuilt_cache_equals_the_engines(engine_run):
    view = PrefixCacheView()
    n = engine_run["before_reset"]
    view.apply_all(engine_run["batches"][:n])               # before the reset
    rebuilt = {b.block_hash.hex(): b.token_ids for b in view.blocks.values()}
    assert rebuilt == engine_run["cached_before_reset"]
    view.apply_all(engine_run["batches"][n:])               # the reset, then the new request
    eng = engine_run["eng"]
    assert view.cleared_total == 1 and {b.block_hash.hex(): b.token_ids
                                        for b in view.blocks.values()} == {
        h: tuple(eng.bm.gpu.tokens[b]) for h, b in eng.bm.gpu.cached.items()}
    frame = view.series_frame()
    assert list(frame["seq"]) == [b.seq for b in engine_run["batches"]]
    assert frame["stored"].sum() == view.stored_total == len(stored_blocks(engine_run["batches"]))


def test_v1_semantics_publish_the_same_way():
    port, replay = free_port(), free_port()
    eng = Engine.length_only(EngineConfig(
        semantics="v1", block_size=BS, num_gpu_blocks=16, seed=0,   # v1: caching on by default
        kv_events_endpoint=f"tcp://127.0.0.1:{port}",
        kv_events_replay_endpoint=f"tcp://127.0.0.1:{replay}"), max_model_len=256)
    sub = KVEventSubscriber(f"tcp://127.0.0.1:{port}", replay_endpoint=f"tcp://127.0.0.1:{replay}",
                            bind=True, probe_idle_s=0.1)
    try:
        cached = []
        for i in range(5):
            eng.add_request(list(range(1, 13)) + [20 + i] * 5,
                            SamplingParams(max_tokens=5, ignore_eos=True))
        while eng.has_unfinished_requests():
            cached += [(e.block_hash, e.parent_hash, e.token_ids) for e in eng.step().events
                       if e.kind == "cached"]
        pub = eng.publishers[0]
        assert pub.flush()
        batches = receive_until(sub, lambda got: len(got) == pub.published, "the batches")
        assert stored_blocks(batches) == cached
        view = PrefixCacheView()
        view.apply_all(batches)
        assert {b.block_hash.hex() for b in view.blocks.values()} == set(eng.bm.gpu.cached)
    finally:
        eng.close()
        sub.close()


def test_the_real_model_engine_publishes_its_cached_blocks(monkeypatch):
    if not (DEFAULT_MODEL_DIR / "config.json").is_file():
        pytest.skip("the default model is not in assets/")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    port, replay = free_port(), free_port()
    eng = Engine(EngineConfig(model="default", block_size=16, num_gpu_blocks=32,
                              enable_prefix_caching=True,
                              kv_events_endpoint=f"tcp://127.0.0.1:{port}",
                              kv_events_replay_endpoint=f"tcp://127.0.0.1:{replay}"))
    sub = KVEventSubscriber(f"tcp://127.0.0.1:{port}", replay_endpoint=f"tcp://127.0.0.1:{replay}",
                            bind=True, probe_idle_s=0.1)
    try:
        eng.generate(["ROMEO: " * 12, "ROMEO: " * 12 + "JULIET"], SamplingParams(max_tokens=4))
        pub = eng.publishers[0]
        assert pub.flush() and pub.published > 0
        batches = receive_until(sub, lambda got: len(got) == pub.published, "the batches")
        view = PrefixCacheView()
        view.apply_all(batches)
        assert {b.block_hash.hex(): b.token_ids for b in view.blocks.values()} == {
            h: tuple(eng.bm.gpu.tokens[b]) for h, b in eng.bm.gpu.cached.items()}
    finally:
        eng.close()
        sub.close()


# ---- the wire format is vLLM's -------------------------------------------------------------

def test_live_frames_and_payload_are_vllms_format_and_a_wildcard_endpoint_binds():
    port = free_port()
    pub = KVEventPublisher(f"tcp://*:{port}", topic="kv-events", block_size=BS)
    ctx = zmq.Context.instance()
    raw = ctx.socket(zmq.SUB)
    raw.setsockopt(zmq.LINGER, 0)
    raw.setsockopt(zmq.SUBSCRIBE, b"kv-events")
    raw.connect(f"tcp://127.0.0.1:{port}")
    try:
        h0, h1 = bytes(range(32)), bytes(range(32, 64))
        stored = BlockStored([h0, h1], None, list(range(8)), BS, None, "GPU", None, [None, None],
                             0, "full_attention")
        frames, deadline = None, time.monotonic() + DEADLINE_S
        while frames is None:                    # publish until the subscription has arrived
            assert time.monotonic() < deadline, "the SUB socket never received anything"
            pub.publish([stored, BlockRemoved([h1], "GPU", 0), AllBlocksCleared()])
            if raw.poll(20):
                frames = raw.recv_multipart()
        assert len(frames) == 3 and frames[0] == b"kv-events" and len(frames[1]) == 8
        pub.publish([AllBlocksCleared()])        # numbers count up by one per batch
        assert raw.poll(int(DEADLINE_S * 1000))
        assert int.from_bytes(raw.recv_multipart()[1], "big") == int.from_bytes(frames[1],
                                                                                "big") + 1
        batch = V_DECODER.decode(frames[2])          # vLLM's schema, written above
        assert batch.data_parallel_rank == 0
        assert [type(e) for e in batch.events] == [VBlockStored, VBlockRemoved, VAllBlocksCleared]
        s = batch.events[0]
        assert (s.block_hashes, s.parent_block_hash, s.token_ids, s.block_size, s.medium,
                s.kv_cache_spec_kind) == ([h0, h1], None, list(range(8)), BS, "GPU",
                                          "full_attention")
        # the raw msgpack shape: the batch positional, the events tagged maps
        plain = msgspec.msgpack.decode(frames[2])
        assert isinstance(plain, list) and len(plain) == 3 and plain[2] == 0
        assert plain[1][0]["type"] == "BlockStored" and plain[1][2] == {"type": "AllBlocksCleared"}
        assert set(plain[1][0]) == {"type", "block_hashes", "parent_block_hash", "token_ids",
                                    "block_size", "lora_id", "medium", "lora_name", "extra_keys",
                                    "group_idx", "kv_cache_spec_kind"}   # None defaults omitted
    finally:
        raw.close()
        pub.close()


def test_payloads_written_with_vllms_schema_decode_with_ours():
    h = (7).to_bytes(32, "big")
    payload = msgspec.msgpack.encode(VKVEventBatch(ts=12.5, data_parallel_rank=3, events=[
        VBlockStored([h, 2**63 + 5], 99, [1, 2, 3, 4, 5, 6, 7, 8], 4, 7, "GPU", "adapter",
                     extra_keys=[("salt",), None], group_idx=1, kv_cache_spec_kind="sliding_window",
                     kv_cache_spec_sliding_window=128),
        VBlockRemoved([h], "CPU", group_idx=1), VAllBlocksCleared()]))
    batch = decode_batch(payload)
    assert (batch.ts, batch.data_parallel_rank) == (12.5, 3)
    stored, removed, cleared = batch.events
    assert msgspec.structs.asdict(stored) == {
        "block_hashes": [h, 2**63 + 5], "parent_block_hash": 99, "token_ids": list(range(1, 9)),
        "block_size": 4, "lora_id": 7, "medium": "GPU", "lora_name": "adapter",
        "extra_keys": [("salt",), None], "group_idx": 1, "kv_cache_spec_kind": "sliding_window",
        "kv_cache_spec_sliding_window": 128}
    assert (removed.block_hashes, removed.medium, removed.group_idx) == ([h], "CPU", 1)
    assert isinstance(cleared, AllBlocksCleared)
    # and ours encodes to bytes vLLM's schema reads back identically
    assert V_DECODER.decode(encode_batch(batch)) == msgspec.msgpack.decode(payload,
                                                                            type=VKVEventBatch)


def test_the_newest_schema_with_typed_extra_keys_decodes_too():
    """vLLM's newest kv_events.py adds event_version, locality and ownership, and types each
    extra key as a tagged struct (a cache salt: {"type": "cache_salt", "salt": ...}); the
    subscriber still reads such a batch (unknown fields ignored, a typed key kept as a map)."""
    class ExtraKey(msgspec.Struct, frozen=True, tag=True):
        pass

    class CacheSaltKey(ExtraKey, frozen=True, tag="cache_salt"):
        salt: str

    class NewBlockStored(msgspec.Struct, omit_defaults=True, tag="BlockStored"):
        block_hashes: list[Any]
        parent_block_hash: Any
        token_ids: list[int]
        block_size: int
        lora_id: int | None
        medium: str | None
        lora_name: str | None
        event_version: int = 1
        extra_keys: list[tuple[CacheSaltKey, ...] | None] | None = None
        group_idx: int | None = None
        locality: str | None = None
        ownership: str | None = None

    h = (9).to_bytes(32, "big")
    payload = msgspec.msgpack.encode([3.0, [NewBlockStored(
        [h], None, [1, 2, 3, 4], 4, None, "GPU", None, event_version=2,
        extra_keys=[(CacheSaltKey("alice"),)], locality="LOCAL", ownership="tier2")], 0])
    stored = decode_batch(payload).events[0]
    assert isinstance(stored, BlockStored) and stored.block_hashes == [h]
    assert stored.extra_keys == [({"type": "cache_salt", "salt": "alice"},)]


def test_older_positional_payloads_still_decode():
    # vLLM before #42892: events as tagged arrays, the fields it had then
    old = msgspec.msgpack.encode([1.0, [["BlockStored", [11, 12], None, [1, 2, 3, 4], 2, None],
                                        ["BlockRemoved", [11], "GPU"], ["AllBlocksCleared"]]])
    batch = decode_batch(old)
    assert batch.data_parallel_rank is None
    assert batch.events[0] == BlockStored([11, 12], None, [1, 2, 3, 4], 2, None, None, None)
    assert batch.events[1] == BlockRemoved([11], "GPU")
    assert isinstance(batch.events[2], AllBlocksCleared)
    with pytest.raises(ValueError, match="not a KV event batch"):
        decode_batch(msgspec.msgpack.encode({"hello": 1}))


def test_replay_answers_from_the_start_sequence_number_then_the_end_marker():
    replay_port = free_port()
    pub = KVEventPublisher("inproc://kv-replay-test", topic="t", block_size=BS,
                           replay_endpoint=f"tcp://127.0.0.1:{replay_port}")
    dealer = zmq.Context.instance().socket(zmq.DEALER)   # what a REQ socket sends, by hand
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(f"tcp://127.0.0.1:{replay_port}")
    try:
        for i in range(4):
            pub.publish([BlockRemoved([bytes([i]) * 32], "GPU", 0)])
        assert pub.flush()
        dealer.send_multipart([b"", (2).to_bytes(8, "big")])
        answers = []
        while True:
            assert dealer.poll(int(DEADLINE_S * 1000)), "no replay answer"
            answers.append(dealer.recv_multipart())
            if answers[-1][-2] == END:
                break
        assert answers[-1] == [b"", b"", END, b""]
        assert [(f[1], int.from_bytes(f[2], "big")) for f in answers[:-1]] == [(b"t", 2), (b"t", 3)]
        assert [V_DECODER.decode(f[3]).events[0].block_hashes for f in answers[:-1]] == [
            [bytes([2]) * 32], [bytes([3]) * 32]]
    finally:
        dealer.close()
        pub.close()


# ---- gaps and malformed messages, against raw sockets -----------------------------------

@pytest.fixture
def raw_server():
    """An XPUB (tells when the subscriber's subscription arrived) and a ROUTER replay socket,
    both bound on 127.0.0.1, with the subscriber connected to them."""
    ctx = zmq.Context.instance()
    pub, router = ctx.socket(zmq.XPUB), ctx.socket(zmq.ROUTER)
    for s in (pub, router):
        s.setsockopt(zmq.LINGER, 0)
        s.bind("tcp://127.0.0.1:0")
    sub = KVEventSubscriber(pub.getsockopt_string(zmq.LAST_ENDPOINT), topic="",
                            replay_endpoint=router.getsockopt_string(zmq.LAST_ENDPOINT),
                            catch_up=False, probe_idle_s=None, replay_timeout_s=0.5)
    assert pub.poll(int(DEADLINE_S * 1000)), "the subscription never arrived"
    assert pub.recv() == b"\x01"                    # subscribe, to every topic
    yield pub, router, sub
    sub.close()
    pub.close()
    router.close()


def batch_bytes(seq: int) -> bytes:
    return encode_batch(KVEventBatch(float(seq), [BlockRemoved([bytes([seq]) * 32], "GPU", 0)], 0))


def send(pub, seq: int, payload: bytes | None = None) -> None:
    pub.send_multipart([b"", seq.to_bytes(8, "big"), payload or batch_bytes(seq)])


def answer_replay(router, have: dict[int, bytes]) -> int:
    """Serve one replay request as vLLM does; returns the start sequence number asked for."""
    assert router.poll(int(DEADLINE_S * 1000)), "no replay request"
    client, empty, start = router.recv_multipart()
    assert empty == b"" and len(start) == 8
    start_seq = int.from_bytes(start, "big")
    for seq in sorted(have):
        if seq >= start_seq:
            router.send_multipart([client, b"", b"", seq.to_bytes(8, "big"), have[seq]])
    router.send_multipart([client, b"", b"", END, b""])
    return start_seq


def test_a_dropped_batch_is_filled_from_the_replay_socket(raw_server):
    pub, router, sub = raw_server
    send(pub, 0)
    send(pub, 2)                                     # seq 1 lost in transit
    got = receive_until_replay_asked(sub, router)
    assert [b.seq for b in got] == [0]               # 2 is held until the gap is filled
    # by the time it answers, the publisher has also sent 3: the buffer has it
    assert answer_replay(router, {i: batch_bytes(i) for i in (1, 2, 3)}) == 1
    got += receive_until(sub, lambda new: len(new) >= 3, "the replayed batches")
    assert [(b.seq, b.source) for b in got] == [(0, "live"), (1, "replay"), (2, "replay"),
                                                (3, "replay")]
    assert [b.events[0].block_hashes for b in got] == [[bytes([i]) * 32] for i in range(4)]
    send(pub, 3)                                     # its live copy arrives after the replay
    send(pub, 4)
    got += receive_until(sub, lambda new: len(new) >= 1, "seq 4")
    assert [b.seq for b in got] == [0, 1, 2, 3, 4]
    assert sub.gaps == [] and sub.duplicates == 1 and sub.recovered == 3


def test_a_replay_answer_with_holes_is_asked_for_again_from_the_first_hole(raw_server):
    pub, router, sub = raw_server
    send(pub, 0)
    send(pub, 5)
    got = receive_until_replay_asked(sub, router)
    # the answer loses 2 and 4 on the way (a ROUTER at its high-water mark drops)
    assert answer_replay(router, {i: batch_bytes(i) for i in (1, 3, 5)}) == 1
    got += receive_until_replay_asked(sub, router)
    assert answer_replay(router, {i: batch_bytes(i) for i in (2, 3, 4, 5)}) == 2
    got += receive_until(sub, lambda new: len(new) >= 5, "the repaired replay")
    assert [b.seq for b in got] == [0, 1, 2, 3, 4, 5] and sub.gaps == []


def test_a_batch_replay_no_longer_has_is_reported_as_a_gap(raw_server):
    pub, router, sub = raw_server
    for seq in (0, 3):
        send(pub, seq)
    got = receive_until_replay_asked(sub, router)
    answer_replay(router, {2: batch_bytes(2), 3: batch_bytes(3)})    # 1 fell out of the buffer
    got += receive_until(sub, lambda new: len(new) >= 2, "the rest")
    assert [b.seq for b in got] == [0, 2, 3]
    assert sub.gaps == [Gap(0, 1, 1, "not in the publisher's replay buffer")]


def test_a_replay_that_never_answers_times_out_into_a_gap(raw_server):
    pub, router, sub = raw_server
    send(pub, 0)
    send(pub, 5)
    got = receive_until(sub, lambda g: len(g) >= 2, "both batches")   # router stays silent
    assert [b.seq for b in got] == [0, 5]
    assert sub.gaps == [Gap(0, 1, 4, "replay timed out")]


def test_malformed_messages_are_counted_and_skipped(raw_server):
    pub, router, sub = raw_server
    pub.send_multipart([b"", b"\x00" * 8])                           # 2 frames
    pub.send_multipart([b"", b"\x00\x01", batch_bytes(0)])           # 2-byte sequence number
    send(pub, 0, b"\xc1 not msgpack")
    send(pub, 1, msgspec.msgpack.encode({"ts": "x"}))                # msgpack, not a batch
    send(pub, 2)
    got = receive_until(sub, lambda g: len(g) >= 1, "the good batch")
    assert [b.seq for b in got] == [2]
    assert sub.malformed_count == 4
    reasons = list(sub.malformed)
    assert "2 parts" in reasons[0] and "2-byte sequence number" in reasons[1]
    assert reasons[2].startswith("live batch 0:") and reasons[3].startswith("live batch 1:")
    send(pub, 3)
    assert [b.seq for b in receive_until(sub, lambda g: len(g) >= 1, "seq 3")] == [3]


def test_a_publisher_restart_is_flagged_and_clears_its_blocks(raw_server):
    pub, router, sub = raw_server
    stored = KVEventBatch(0.0, [BlockStored([b"a" * 32], None, [1, 2, 3, 4], 4, None, "GPU",
                                            None)], 0)
    send(pub, 0, encode_batch(stored))
    send(pub, 1)
    send(pub, 0)                                      # a new publisher numbers from 0 again
    got = receive_until(sub, lambda g: len(g) >= 3, "three batches")
    assert [(b.seq, b.restart) for b in got] == [(0, False), (1, False), (0, True)]
    view = PrefixCacheView()
    view.apply_all(got[:2])
    assert len(view.blocks) == 1
    view.apply(got[2])
    assert view.blocks == {} and sub.restarts == 1 and sub.gaps == []


def two_rank_publishers() -> tuple[int, int, list[KVEventPublisher]]:
    """Ranks 0 and 1 on base, base + 1 (replay: rbase, rbase + 1): retried until both free."""
    for _ in range(50):
        base, rbase, pubs = free_port(), free_port(), []
        try:
            for r in (0, 1):
                pubs.append(KVEventPublisher(f"tcp://*:{base}", data_parallel_rank=r,
                                             replay_endpoint=f"tcp://127.0.0.1:{rbase}",
                                             block_size=BS))
            return base, rbase, pubs
        except ValueError:                           # base + 1 or rbase + 1 was taken
            for p in pubs:
                p.close()
    raise AssertionError("no two consecutive free ports")


def test_data_parallel_ranks_publish_on_offset_ports_and_are_tracked_apart():
    base, rbase, pubs = two_rank_publishers()
    try:
        assert [p.endpoint.rsplit(":", 1)[1] for p in pubs] == [str(base), str(base + 1)]
        sub = KVEventSubscriber(f"tcp://127.0.0.1:{base}",
                                replay_endpoint=f"tcp://127.0.0.1:{rbase}", data_parallel_size=2,
                                probe_idle_s=0.1)
        for i in range(3):
            for p in pubs:
                p.publish([BlockRemoved([bytes([i]) * 32], "GPU", 0)])
        got = receive_until(sub, lambda g: len(g) >= 6, "3 batches from each rank")
        assert sorted((b.data_parallel_rank, b.seq) for b in got) == [(r, s) for r in (0, 1)
                                                                      for s in range(3)]
        assert sub.last_seqs() == {0: 2, 1: 2} and sub.gaps == []
        sub.close()
    finally:
        for p in pubs:
            p.close()


# ---- the publisher's own rules ---------------------------------------------------------------

def test_a_full_queue_drops_and_counts_never_blocks():
    pub = KVEventPublisher("inproc://kv-full-queue", queue_size=2, block_size=BS)
    try:
        t0 = time.perf_counter()
        seqs = [pub.publish([AllBlocksCleared()]) for _ in range(500)]
        assert time.perf_counter() - t0 < 0.5
        assert pub.published == 500 and pub.dropped == seqs.count(None) > 0
        kept = [s for s in seqs if s is not None]
        assert kept == sorted(kept) and kept[0] == 0   # a dropped batch's number stays used
        assert pub.flush() and pub.sent == len(kept)
    finally:
        pub.close()
    with pytest.raises(RuntimeError, match="closed"):
        pub.publish([AllBlocksCleared()])


def test_engine_events_translate_like_vllm_groups_them():
    h = [f"{i:064x}" for i in range(1, 6)]
    events = [ev.Alloc(1, 0, 0), ev.Cached(1, 0, h[0], "", (1, 2, 3, 4)),
              ev.Evict(1, h[4]), ev.Alloc(1, 1, 1), ev.Cached(1, 1, h[1], h[0], (5, 6, 7, 8)),
              ev.Cached(2, 2, h[2], "", (9, 9, 9, 9)),        # another sequence: a new event
              ev.Evict(3, h[2]),                              # evicts what was just stored
              ev.Cached(1, 3, h[3], h[1], (1, 1, 1, 1)), ev.CacheReset()]
    out = to_kv_events(events, BS)
    b = bytes.fromhex
    assert [type(e).__name__ for e in out] == ["BlockRemoved", "BlockStored", "BlockStored",
                                               "BlockRemoved", "BlockStored", "AllBlocksCleared"]
    assert out[0].block_hashes == [b(h[4])]            # moved ahead: vLLM evicts, then caches
    assert (out[1].block_hashes, out[1].parent_block_hash, out[1].token_ids) == (
        [b(h[0]), b(h[1])], None, [1, 2, 3, 4, 5, 6, 7, 8])
    assert out[2].block_hashes == [b(h[2])] and out[3].block_hashes == [b(h[2])]   # order kept
    assert (out[4].block_hashes, out[4].parent_block_hash) == ([b(h[3])], b(h[1]))
    assert to_kv_events([ev.Alloc(1, 0, 0), ev.Free(0)], BS) == []


def test_two_requests_in_one_step_send_their_events_request_by_request():
    """vLLM's allocate_slots evicts a request's new blocks, then caches its full blocks, one
    request after the other: R(A) S(A) R(B) S(B). An eviction for the next request must not be
    moved ahead of the previous request's BlockStored."""
    from engine.core.kv_cache_manager import KVCacheManager
    from engine.core.sequence import Sequence
    events: list = []
    kv = KVCacheManager(5, BS, True, events.append)      # 4 usable blocks (block 0 is null)
    for i, toks in enumerate([range(100, 108), range(200, 208)]):     # fill the cache, free
        seq = Sequence(i, str(i), list(toks), len(toks))
        kv.allocate_slots(seq, 8)
        kv.free(seq)
    old = {e.block_hash for e in events if e.kind == "cached"}
    events.clear()
    stored = []
    for i, toks in enumerate([range(300, 305), range(400, 405)], start=10):   # one step
        seq = Sequence(i, str(i), list(toks), len(toks))
        assert kv.allocate_slots(seq, 5, kv.get_computed_blocks(seq))
        stored.append([e.block_hash for e in events if e.kind == "cached"
                       and e.seq_id == i])
    out = to_kv_events(events, BS)
    assert [type(e).__name__ for e in out] == ["BlockRemoved", "BlockRemoved", "BlockStored",
                                               "BlockRemoved", "BlockRemoved", "BlockStored"]
    assert [out[2].block_hashes, out[5].block_hashes] == [
        [bytes.fromhex(h) for h in hs] for hs in stored]
    assert {h.hex() for e in out if isinstance(e, BlockRemoved) for h in e.block_hashes} <= old


def test_prefix_cache_view_splits_tokens_and_counts():
    view = PrefixCacheView()
    a, b2 = b"a" * 32, b"b" * 32
    stored = BlockStored([a, b2], None, list(range(8)), 4, None, "GPU", None)
    view.apply(ReceivedBatch(0, 1.0, (stored,), 0))
    assert {k[3]: (v.parent_hash, v.token_ids) for k, v in view.blocks.items()} == {
        a: (None, (0, 1, 2, 3)), b2: (a, (4, 5, 6, 7))}
    view.apply(ReceivedBatch(1, 2.0, (BlockRemoved([a, b"z" * 32], "GPU"),), 0))
    assert list(k[3] for k in view.blocks) == [b2] and view.unknown_removed == 1
    view.apply(ReceivedBatch(2, 3.0, (stored,), 0))
    assert [v.stores for v in view.blocks.values()] == [2, 2]
    short = BlockStored([b"c" * 32], None, [], 4, None, "GPU", None)   # no tokens carried
    view.apply(ReceivedBatch(3, 4.0, (short,), 0))
    assert view.blocks[(0, 0, "GPU", b"c" * 32)].token_ids is None
    assert list(view.series_frame()["cached"]) == [2, 1, 2, 3]
    assert list(view.events_frame(2)["event"]) == ["BlockStored", "BlockStored"]


def test_prefix_cache_view_reads_vllm_default_integer_hashes():
    """vLLM sends block hashes as 64-bit integers by default (VLLM_KV_EVENTS_USE_INT_BLOCK_
    HASHES=1): decoded off the wire, they chain and are removed like digests."""
    a, b2 = 15760518052499183552, 2**64 - 1
    batch = KVEventBatch(1.0, [BlockStored([a], None, [1, 2, 3, 4], 4, None, "GPU", None),
                               BlockStored([b2], a, [5, 6, 7, 8], 4, None, "GPU", None)], 0)
    dec = decode_batch(encode_batch(batch))
    assert [e.block_hashes for e in dec.events] == [[a], [b2]]
    view = PrefixCacheView()
    view.apply(ReceivedBatch(7, dec.ts, tuple(dec.events), dec.data_parallel_rank))
    assert {k[3]: v.parent_hash for k, v in view.blocks.items()} == {a: None, b2: a}
    view.apply(ReceivedBatch(8, 2.0, (BlockRemoved([a], "GPU"),), 0))
    assert [k[3] for k in view.blocks] == [b2] and view.unknown_removed == 0


def test_bad_endpoints_get_clear_errors():
    with pytest.raises(ValueError, match="must start with tcp://"):
        check_endpoint("http://x:1")
    with pytest.raises(ValueError, match="wildcard host"):
        KVEventSubscriber("tcp://*:5557")
    with pytest.raises(ValueError, match="is empty"):
        KVEventSubscriber("  ")
    with pytest.raises(ValueError, match="not tcp://HOST:PORT"):
        check_endpoint("tcp://127.0.0.1")
    with pytest.raises(ValueError, match="port 70000"):
        check_endpoint("tcp://127.0.0.1:70000")
    assert offset_endpoint_port("tcp://*:5557", 2) == "tcp://*:5559"
    assert offset_endpoint_port("inproc://kv", 1) == "inproc://kv_dp1"
    with pytest.raises(ValueError, match="per-rank form"):
        offset_endpoint_port("ipc:///tmp/kv", 1)
    with socket.socket() as busy:                      # a bound port: the engine says so
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(ValueError, match="cannot open the KV events socket"):
            Engine.length_only(EngineConfig(kv_events_endpoint="tcp://127.0.0.1:5557",
                                            kv_events_replay_endpoint=f"tcp://127.0.0.1:{port}"))


def test_a_hash_stays_cached_in_the_view_until_its_last_copy_is_removed():
    """vLLM v1 caches a recomputed block under a hash that is cached already and publishes a
    BlockStored for each copy, then a BlockRemoved for each copy it evicts."""
    view = PrefixCacheView()
    a = b"a" * 32
    stored = BlockStored([a], None, [1, 2, 3, 4], 4, None, "GPU", None)
    view.apply(ReceivedBatch(0, 1.0, (stored, stored), 0))
    view.apply(ReceivedBatch(1, 2.0, (BlockRemoved([a], "GPU"),), 0))
    assert list(k[3] for k in view.blocks) == [a] and not view.removed
    view.apply(ReceivedBatch(2, 3.0, (BlockRemoved([a], "GPU"),), 0))
    assert not view.blocks and len(view.removed) == 1 and view.unknown_removed == 0
    assert list(view.series_frame()["cached"]) == [1, 1, 0]


def test_the_engines_copies_are_published_and_the_view_follows_them():
    """The engine's own stream with a copy: the same prompt twice, then an eviction of the
    first copy; the view rebuilt from the KV events still holds that hash, as the engine does."""
    eng = Engine.length_only(EngineConfig(semantics="v1", block_size=4, num_gpu_blocks=6),
                             vocab_size=1000)
    events = []
    for prompt in (list(range(8)), list(range(8)), list(range(100, 112))):
        eng.add_request(prompt, SamplingParams(max_tokens=1, ignore_eos=True))
        while eng.has_unfinished_requests():
            events.extend(eng.step().events)
    out = to_kv_events(events, 4)
    h = bytes.fromhex(eng.bm.gpu.block_hash[3])
    assert sum(h in e.block_hashes for e in out if isinstance(e, BlockStored)) == 2
    assert sum(h in e.block_hashes for e in out if isinstance(e, BlockRemoved)) == 1
    view = PrefixCacheView()
    view.apply(ReceivedBatch(0, 1.0, tuple(out), 0))
    assert {k[3].hex() for k in view.blocks} == set(eng.bm.gpu.cached)
