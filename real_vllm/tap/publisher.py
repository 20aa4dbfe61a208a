"""The tap's ZeroMQ publisher: never blocks the engine loop, drops and counts instead.

Two modes. With a sender thread (the default): the engine thread appends the encoded message
to a deque bounded in messages and bytes (no lock, no wake-up per message), a daemon thread
sends every ``FLUSH_INTERVAL_S``; a full queue drops the message and counts it (``dropped``,
published in each Frame). Direct (``sender_thread=False``, PAGED_LAB_TAP_SENDER=direct): the
engine thread sends with ``NOBLOCK`` itself. Measured side by side (bench/tap_overhead.py,
this 2-core CPU) the direct sends cost the engine thread more (0.12 vs 0.05 ms per step at
batch 1, 1.2 vs 1.0 at 256), so the thread is the default.
The socket is an XPUB without ``XPUB_NODROP``, bounded per subscriber by SNDHWM messages and
SNDBUF bytes: a subscriber that stops reading loses messages at its own
high-water mark, silently for us, while the others keep theirs (with NODROP one stalled reader
stopped every reader: checked). Every message gets a sequence number, sent or not, so a
subscriber sees any loss as a gap and waits for the next keyframe. There is no replay buffer:
the keyframe (about once a second) is what a late or lagging subscriber needs. XPUB also says
when a subscriber joins (``joins()``), so the tap sends it a keyframe at once.
No vLLM import: the tests drive it alone.
"""
from __future__ import annotations

import itertools
import threading
import time
from collections import deque

from engine.kv_events.wire import offset_endpoint_port
from real_vllm.tap.frames import TapMessage, encode

FLUSH_INTERVAL_S = 0.005
MAX_QUEUE_MESSAGES = 256
MAX_QUEUE_BYTES = 32 << 20           # a burst of keyframes of a big pool, no more
SNDBUF_BYTES = 512 << 10             # the kernel's share per subscriber: bounded, not 4 MB


class TapPublisher:
    """Counters: ``published`` (sequence numbers given), ``sent`` (handed to ZeroMQ),
    ``dropped`` (queue full, or a send error); ``joins()``: subscribers that joined since the
    last call. ``endpoint``: the address really bound (rank offset applied, port 0 resolved)."""

    def __init__(self, endpoint: str, topic: str, data_parallel_rank: int = 0, *,
                 hwm: int = 64, sndbuf: int = SNDBUF_BYTES, sender_thread: bool = True,
                 max_queue_messages: int = MAX_QUEUE_MESSAGES,
                 max_queue_bytes: int = MAX_QUEUE_BYTES):
        import zmq
        self._zmq = zmq
        self._more = zmq.SNDMORE | zmq.NOBLOCK
        endpoint = offset_endpoint_port(endpoint, data_parallel_rank)
        if not endpoint.startswith(("tcp://", "ipc://", "inproc://")):
            raise ValueError(f"tap endpoint {endpoint!r}: tcp://, ipc:// or inproc:// only")
        self.topic = topic.encode()
        self.max_queue_messages, self.max_queue_bytes = max_queue_messages, max_queue_bytes
        self._queue: deque[tuple[int, bytes]] = deque()
        self._queued_bytes = 0                   # engine thread adds, sender subtracts (GIL)
        self._seqs = itertools.count()
        self.published = self.sent = self.dropped = 0
        self.subscribers_joined = 0
        self.last_size = 0                       # bytes of the last message published
        self._closing = threading.Event()
        self._sock = zmq.Context.instance().socket(zmq.XPUB)
        try:
            self._sock.setsockopt(zmq.SNDHWM, hwm)
            self._sock.setsockopt(zmq.SNDBUF, sndbuf)
            self._sock.setsockopt(zmq.LINGER, 500)       # the last messages (a TapOff) go out
            if endpoint.startswith("tcp://[") or "::" in endpoint:
                self._sock.setsockopt(zmq.IPV6, 1)
            self._sock.bind(endpoint)                    # the tap is the server: it binds
            self.endpoint = self._sock.getsockopt_string(zmq.LAST_ENDPOINT)
        except zmq.ZMQError as e:
            self._sock.close(0)
            raise ValueError(f"cannot bind the tap's socket {endpoint!r}: {e}") from None
        self._thread = None
        if sender_thread:
            self._thread = threading.Thread(target=self._loop, daemon=True,
                                            name="paged-lab-tap")
            self._thread.start()

    def publish(self, message: TapMessage) -> bool:
        """Encode and queue one message (engine thread); False if it was dropped."""
        payload = encode(message)
        self.last_size = len(payload)
        seq = next(self._seqs)
        self.published += 1
        if self._thread is None:
            return self._send_now(seq, payload)
        if (self._closing.is_set() or len(self._queue) >= self.max_queue_messages
                or self._queued_bytes + len(payload) > self.max_queue_bytes):
            self.dropped += 1
            return False
        self._queued_bytes += len(payload)
        self._queue.append((seq, payload))
        return True

    def _send_now(self, seq: int, payload: bytes) -> bool:
        """Direct mode: ZeroMQ's own I/O thread (C, no GIL) does the network; this is a
        ~10 us copy into its pipe, which never blocks on a PUB-style socket."""
        zmq, sock = self._zmq, self._sock
        if sock is None:
            self.dropped += 1
            return False
        try:                        # three sends: cheaper than send_multipart's wrapper
            sock.send(self.topic, self._more)
            sock.send(seq.to_bytes(8, "big"), self._more)
            sock.send(payload, zmq.NOBLOCK)
            self.sent += 1
            return True
        except zmq.ZMQError:
            self.dropped += 1
            return False

    def joins(self) -> int:
        """Subscribers that joined since the last call (direct mode reads the socket here)."""
        if self._thread is None and self._sock is not None:
            zmq, sock = self._zmq, self._sock
            try:                    # EVENTS: a flag read, not a Poller built per call
                while sock.getsockopt(zmq.EVENTS) & zmq.POLLIN:   # 1 = a subscriber joined
                    if sock.recv(zmq.NOBLOCK)[:1] == b"\x01":
                        self.subscribers_joined += 1
            except zmq.ZMQError:
                pass
        n, self.subscribers_joined = self.subscribers_joined, 0
        return n

    def _loop(self) -> None:
        zmq, sock, queue = self._zmq, self._sock, self._queue
        timeout_ms = int(FLUSH_INTERVAL_S * 1000)
        try:
            while True:
                closing = self._closing.is_set()
                if sock.poll(0 if closing else timeout_ms, zmq.POLLIN):
                    while sock.poll(0, zmq.POLLIN):      # subscription messages: 1 = join
                        msg = sock.recv()
                        if msg[:1] == b"\x01":
                            self.subscribers_joined += 1
                while queue:
                    seq, payload = queue.popleft()
                    self._queued_bytes -= len(payload)
                    try:                                 # PUB semantics: never blocks
                        sock.send_multipart((self.topic, seq.to_bytes(8, "big"), payload),
                                            zmq.NOBLOCK)
                        self.sent += 1
                    except zmq.ZMQError:
                        self.dropped += 1
                if closing:
                    break
        finally:
            sock.close()                                 # LINGER lets the last ones out

    def close(self, wait_s: float = 0.0) -> None:
        """Stop after sending what is queued. ``wait_s`` 0: return at once (the engine loop
        must not wait); the sender thread finishes and closes the socket by itself."""
        self._closing.set()
        if self._thread is None:
            if self._sock is not None:
                # returns at once; ZeroMQ's I/O thread sends what is left (a TapOff) for
                # up to LINGER (the context is never terminated, so nothing waits on it)
                self._sock.close(max(500, int(wait_s * 1000)))
                self._sock = None
        elif wait_s > 0:
            self._thread.join(wait_s)

    def flush(self, timeout_s: float = 2.0) -> bool:
        """Wait until the queue is empty (tests, the benchmark)."""
        deadline = time.monotonic() + timeout_s
        while self._queue and self._thread is not None and time.monotonic() < deadline:
            time.sleep(0.001)
        return not self._queue
