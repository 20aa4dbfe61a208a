"""The tap's publisher (real_vllm/tap/publisher.py) alone, no vLLM: per-rank ports (vLLM's
rule: tcp port + data-parallel rank), the three-part messages, a keyframe request when a
subscriber joins, and a stalled subscriber or a full queue costing drops, never a wait."""
from __future__ import annotations

import time

import pytest

from real_vllm.tap.frames import Frame, TapOff, decode
from real_vllm.tap.publisher import TapPublisher
from tests.vllm_real.serve import free_port

zmq = pytest.importorskip("zmq")


def frame(i: int, n_requests: int = 0) -> Frame:
    return Frame(step=i, phase="schedule", ts=0.0, keyframe=False, num_free_blocks=1,
                 running=[f"cmpl-{j}" for j in range(n_requests)])


def sub_to(endpoint: str, hwm: int = 0):
    s = zmq.Context.instance().socket(zmq.SUB)
    s.setsockopt(zmq.RCVHWM, hwm)
    s.connect(endpoint)
    s.subscribe(b"tap")
    return s


@pytest.mark.parametrize("rank", [0, 1, 3])
def test_port_offset_by_data_parallel_rank(rank):
    port = free_port()
    pub = TapPublisher(f"tcp://127.0.0.1:{port}", "tap", rank)
    try:
        assert pub.endpoint == f"tcp://127.0.0.1:{port + rank}"
    finally:
        pub.close(1.0)


@pytest.mark.parametrize("sender_thread", [False, True], ids=["direct", "thread"])
def test_messages_and_join_notice(sender_thread):
    pub = TapPublisher("tcp://127.0.0.1:0", "tap", sender_thread=sender_thread)
    sub = sub_to(pub.endpoint)
    try:
        time.sleep(0.3)
        assert pub.joins() == 1, "the tap learns that a subscriber joined"
        assert pub.joins() == 0
        for i in range(3):
            assert pub.publish(frame(i))
        pub.publish(TapOff(reason="test"))
        got = [sub.recv_multipart() for _ in range(4)]
        assert [g[0] for g in got] == [b"tap"] * 4
        assert [int.from_bytes(g[1], "big") for g in got] == [0, 1, 2, 3]
        assert [type(decode(g[2])).__name__ for g in got] == ["Frame"] * 3 + ["TapOff"]
    finally:
        sub.close(0)
        pub.close(1.0)


def test_full_queue_drops_and_counts_without_waiting():
    pub = TapPublisher("tcp://127.0.0.1:0", "tap", sender_thread=True, max_queue_messages=4)
    try:
        t0 = time.perf_counter()
        results = [pub.publish(frame(i)) for i in range(1000)]   # faster than the sender
        took = time.perf_counter() - t0
        assert took < 1.0 and pub.published == 1000
        assert pub.dropped == results.count(False) and pub.dropped > 0
    finally:
        pub.close(1.0)


@pytest.mark.parametrize("sender_thread", [False, True], ids=["direct", "thread"])
def test_stalled_subscriber_costs_nothing_and_sees_gaps(sender_thread):
    """A subscriber that never reads: publishing stays fast, the sender thread never blocks
    (its messages beyond the high-water marks are dropped by ZeroMQ), and what the stalled one
    reads at last has gaps in the sequence. (With high-water marks this small a reader that
    falls behind loses some too: each subscriber's loss is its own, seen as gaps.)"""
    pub = TapPublisher("tcp://127.0.0.1:0", "tap", hwm=4, sndbuf=8192,
                       sender_thread=sender_thread)
    stalled = zmq.Context.instance().socket(zmq.SUB)
    stalled.setsockopt(zmq.RCVHWM, 1)
    stalled.setsockopt(zmq.RCVBUF, 4096)
    stalled.connect(pub.endpoint)
    stalled.subscribe(b"tap")
    reader = sub_to(pub.endpoint)
    try:
        time.sleep(0.3)
        n, got = 3000, []
        t0 = time.perf_counter()
        for i in range(n):
            pub.publish(frame(i, 50))                # ~0.5 KB each
            while reader.poll(0):
                got.append(int.from_bytes(reader.recv_multipart()[1], "big"))
            if i % 50 == 0:
                time.sleep(0.002)                    # the engine's step, roughly
        took = time.perf_counter() - t0
        assert pub.flush(5.0)
        while reader.poll(300):
            got.append(int.from_bytes(reader.recv_multipart()[1], "big"))
        seqs = []
        while stalled.poll(300):
            seqs.append(int.from_bytes(stalled.recv_multipart()[1], "big"))
        assert took < 5.0
        assert got and pub.dropped == 0 and pub.sent == n   # ZeroMQ dropped, not the tap
        assert len(seqs) < n and any(b - a > 1 for a, b in zip(seqs, seqs[1:]))
    finally:
        stalled.close(0)
        reader.close(0)
        pub.close(1.0)
