"""This engine's prefix-cache changes, published as vLLM KV cache events over ZeroMQ.

After every step with prefix-cache changes the publisher sends one ``KVEventBatch`` (vLLM sends
none for a step without changes), translated from the engine's own events:

- ``Cached`` -> ``BlockStored``: consecutive Cached events of one sequence whose hashes chain
  become one BlockStored with several hashes (vLLM emits one per request and step);
- ``Evict`` -> ``BlockRemoved``, one per block as vLLM does. vLLM evicts while it allocates a
  request's blocks, before it caches that request's blocks (``allocate_slots``: get_new_blocks,
  then cache_full_blocks), request after request. So an eviction for the request whose
  BlockStored is being built is moved ahead of it, unless that BlockStored already holds the
  evicted hash (then order matters and is kept); an eviction for another request (the one the
  next allocation names) follows it: R(A) S(A) R(B) S(B), as vLLM sends them;
- ``CacheReset`` -> ``AllBlocksCleared``, sent first in the next step's batch: vLLM's
  ``reset_prefix_cache`` only queues it, and the scheduler publishes its queued events when it
  processes a step's output (``Scheduler.update_from_output``). Likewise an abort between steps
  publishes nothing by itself.

Hashes go out as bytes (the sha256 digest behind the engine's hex text), medium "GPU",
``lora_id`` / ``lora_name`` None, ``group_idx`` 0 (one KV cache group), kv_cache_spec_kind
"full_attention". Sockets follow vLLM's ``ZmqEventPublisher`` (vllm/distributed/kv_events.py):
a PUB socket that binds a wildcard / ipc / inproc address and connects to any other; an optional
ROUTER replay socket (always bound) that answers a start sequence number with the buffered
batches from there, then (seq -1, empty payload); ports offset by the data-parallel rank.

The step never waits for the network: ``on_step`` encodes the batch and appends it to a
bounded queue (a deque: no lock, no thread wake-up per step); a daemon thread owns the sockets,
wakes every ``FLUSH_INTERVAL_S`` and sends what is queued, so the thread hand-over is paid per
interval, not per step. Where vLLM's ``publish`` blocks on a full queue, this one drops the
batch and counts it (``dropped``). Its sequence number is used up all the same, so subscribers
see the loss as a gap that replay cannot fill, rather than a cache picture that silently
diverges.
"""
from __future__ import annotations

import itertools
import operator
import threading
import time
from collections import deque

import msgspec

from engine.core.hashing import event_extra_keys, hash_bytes
from engine.kv_events.wire import (END_SEQ, MEDIUM_GPU, AllBlocksCleared, BlockRemoved,
                                   BlockStored, KVEventBatch, binds, check_endpoint,
                                   offset_endpoint_port, wants_ipv6)
from engine.observe.observers import Observer, StepRecord

FULL_ATTENTION = "full_attention"
FLUSH_INTERVAL_S = 0.01
_KV_KINDS = frozenset({"cached", "evict", "cache_reset"})
_kind = operator.attrgetter("kind")
_END_FRAME = END_SEQ.to_bytes(8, "big", signed=True)   # the replay's last answer


def to_kv_events(events, block_size: int, medium: str = MEDIUM_GPU, engine=None) -> list:
    """The engine events of one step (in order) as vLLM KV cache events (see the module doc).

    With ``engine``, a stored block's extra hash keys (its cache salt) are read from its pool."""
    out: list = []
    if _KV_KINDS.isdisjoint(map(_kind, events)):      # most decode steps: a C-speed scan
        return out
    run: BlockStored | None = None     # the BlockStored being built
    run_at = 0                         # its index in ``out``
    run_seq = None
    extra_keys_of = None
    # an eviction is for the request of the next event that names one (its Alloc / SwapIn)
    owner: dict[int, int | None] = {}
    next_seq = None
    for i in range(len(events) - 1, -1, -1):
        e = events[i]
        if e.kind == "evict":
            owner[i] = next_seq
        else:
            next_seq = getattr(e, "seq_id", next_seq)
    for i, e in enumerate(events):
        kind = e.kind
        if kind not in _KV_KINDS:
            continue
        if kind == "cached":
            h = hash_bytes(e.block_hash)
            parent = hash_bytes(e.parent_hash) if e.parent_hash else None
            if extra_keys_of is None:
                extra_keys_of = _extra_keys_reader(engine)
            keys = extra_keys_of(e)
            if run is not None and run_seq == e.seq_id and run.block_hashes[-1] == parent:
                run.block_hashes.append(h)
                run.token_ids.extend(e.token_ids)
                run.extra_keys.append(keys)
            else:
                # positional (faster): lora_id, medium, lora_name, extra_keys, group_idx, kind
                run = BlockStored([h], parent, list(e.token_ids), block_size, None, medium, None,
                                  [keys], 0, FULL_ATTENTION)
                run_at, run_seq = len(out), e.seq_id
                out.append(run)
        elif kind == "evict":
            h = hash_bytes(e.block_hash)
            removed = BlockRemoved([h], medium, 0)
            if run is not None and run_seq == owner[i] and h not in run.block_hashes:
                out.insert(run_at, removed)
                run_at += 1
            else:
                out.append(removed)
                run = None
        elif kind == "cache_reset":
            out.append(AllBlocksCleared())
            run = None
    return out


def _no_extra_keys(e) -> None:
    return None


def _extra_keys_reader(engine):
    """Reads a cached block's extra keys from the engine's device pool, if it has one."""
    pool = getattr(getattr(engine, "bm", None), "gpu", None)
    if pool is None or not hasattr(pool, "extra_keys"):
        return _no_extra_keys

    def extra_keys_of(e):
        if 0 <= e.physical < len(pool.block_hash) and pool.block_hash[e.physical] == e.block_hash:
            return event_extra_keys(pool.extra_keys[e.physical])
        return None
    return extra_keys_of


class KVEventBatcher(Observer):
    """Turns each step's engine events into the batch vLLM would publish for it (see the module
    doc: one batch per step with events; a reset's or an abort's events are held and go first
    in the next step's batch, as vLLM publishes queued events in ``update_from_output``).
    Subclasses say what to do with a batch (``publish``): send it (``KVEventPublisher``) or
    keep it (``KVEventRecorder``)."""

    def __init__(self, block_size: int = 16, medium: str = MEDIUM_GPU):
        self.block_size, self.medium = block_size, medium
        self._closed = False
        self._held: list = []         # KV events of a reset or an abort, sent with the next step

    def on_step(self, engine, record: StepRecord) -> None:
        if record.kind == "reset":               # a reset between steps: held (see above)
            self._hold(engine, record.events)
        else:
            self._publish_step(engine, record.events)

    def on_abort(self, engine, request_id: str, events) -> None:
        self._hold(engine, events)

    def _hold(self, engine, events) -> None:
        if not self._closed:
            self._held += to_kv_events(events, self.block_size, self.medium, engine)

    def _publish_step(self, engine, events) -> None:
        if self._closed:
            return
        kv = to_kv_events(events, self.block_size, self.medium, engine)
        if self._held:                           # a reset's or abort's, first (see above)
            kv, self._held = self._held + kv, []
        if kv:                                   # vLLM publishes only steps with events
            self.publish(kv)

    def publish(self, events: list):
        raise NotImplementedError


class KVEventRecorder(KVEventBatcher):
    """Keeps the batches instead of sending them: ``batches`` holds (step, events) for every
    step that had KV events (the step number is the engine's after that step)."""

    def __init__(self, block_size: int = 16, medium: str = MEDIUM_GPU):
        super().__init__(block_size, medium)
        self.batches: list[tuple[int, list]] = []
        self._step = 0

    def on_step(self, engine, record: StepRecord) -> None:
        self._step = engine.step_no
        super().on_step(engine, record)

    def publish(self, events: list) -> None:
        self.batches.append((self._step, events))


class KVEventPublisher(KVEventBatcher):
    """Publishes the engine's KV cache events (vLLM's ZmqEventPublisher, non-blocking).

    Counters: ``published`` (batches given a sequence number), ``sent``, ``dropped`` (queue
    full), ``send_errors``; ``sender_cpu_s``: the sender thread's CPU time so far (updated
    after each round of sends). ``endpoint`` / ``replay_endpoint`` are the addresses really
    used (after the rank offset; a bound port 0 resolved)."""

    def __init__(self, endpoint: str, *, topic: str = "", replay_endpoint: str | None = None,
                 buffer_steps: int = 10_000, queue_size: int = 100_000, block_size: int = 16,
                 data_parallel_rank: int = 0, hwm: int = 100_000, medium: str = MEDIUM_GPU):
        import zmq
        self._zmq = zmq
        for name, v in (("buffer_steps", buffer_steps), ("queue_size", queue_size),
                        ("block_size", block_size), ("hwm", hwm)):
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
        if not isinstance(data_parallel_rank, int) or data_parallel_rank < 0:
            raise ValueError(f"data_parallel_rank must be an integer >= 0, "
                             f"got {data_parallel_rank!r}")
        endpoint = offset_endpoint_port(check_endpoint(endpoint, "KV events endpoint", bind=True),
                                        data_parallel_rank)
        if replay_endpoint is not None:
            replay_endpoint = offset_endpoint_port(
                check_endpoint(replay_endpoint, "KV events replay endpoint", bind=True),
                data_parallel_rank)
        super().__init__(block_size, medium)
        self.topic = topic
        self.data_parallel_rank = data_parallel_rank
        self._topic = topic.encode()
        self._encoder = msgspec.msgpack.Encoder()
        self._queue: deque[tuple[int, bytes]] = deque()   # engine thread appends, sender pops
        self.queue_size = queue_size
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)  # sender thread only
        self._seqs = itertools.count()
        self.published = self.sent = self.dropped = self.send_errors = 0
        self.sender_cpu_s = 0.0
        self.last_error: str | None = None
        self._closing = threading.Event()
        self._abort = False
        # sockets are made here, so a bad or busy address fails the engine's construction, then
        # handed to the sender thread, which alone uses them (starting a thread is a barrier)
        ctx = zmq.Context.instance()
        self._pub = self._replay = None
        try:
            self._pub = ctx.socket(zmq.PUB)
            self._pub.setsockopt(zmq.SNDHWM, hwm)
            self._pub.setsockopt(zmq.LINGER, 200)       # a moment to flush the last batches
            if wants_ipv6(endpoint):
                self._pub.setsockopt(zmq.IPV6, 1)
            if binds(endpoint):
                self._pub.bind(endpoint)
                endpoint = self._pub.getsockopt_string(zmq.LAST_ENDPOINT)
            else:
                self._pub.connect(endpoint)
            if replay_endpoint is not None:
                self._replay = ctx.socket(zmq.ROUTER)
                self._replay.setsockopt(zmq.LINGER, 0)
                # room for a whole buffer's answer: at the default 1000 a ROUTER drops the rest
                self._replay.setsockopt(zmq.SNDHWM, buffer_steps + 1)
                if wants_ipv6(replay_endpoint):
                    self._replay.setsockopt(zmq.IPV6, 1)
                self._replay.bind(replay_endpoint)
                replay_endpoint = self._replay.getsockopt_string(zmq.LAST_ENDPOINT)
        except zmq.ZMQError as e:
            bad = replay_endpoint if self._replay is not None else endpoint
            self._close_sockets()
            raise ValueError(f"cannot open the KV events socket {bad!r}: {e}") from None
        self.endpoint, self.replay_endpoint = endpoint, replay_endpoint
        self._thread = threading.Thread(target=self._send_loop, daemon=True,
                                        name="kv-event-publisher")
        self._thread.start()

    @classmethod
    def from_config(cls, config) -> "KVEventPublisher":
        return cls(config.kv_events_endpoint, topic=config.kv_events_topic,
                   replay_endpoint=config.kv_events_replay_endpoint,
                   buffer_steps=config.kv_events_buffer_steps,
                   queue_size=config.kv_events_queue_size, block_size=config.block_size)

    # ---- publishing --------------------------------------------------------------------
    def publish(self, events: list) -> int | None:
        """Encode and queue one batch; returns its sequence number, or None if dropped."""
        if self._closed:
            raise RuntimeError("the KV event publisher is closed")
        batch = KVEventBatch(time.time(), events, self.data_parallel_rank)
        seq = next(self._seqs)
        self.published += 1
        if len(self._queue) >= self.queue_size:
            self.dropped += 1
            return None
        self._queue.append((seq, self._encoder.encode(batch)))
        return seq

    def _send_loop(self) -> None:
        replay, pending = self._replay, self._queue
        wait_ms = int(FLUSH_INTERVAL_S * 1000)
        while not self._abort:
            closing = self._closing.is_set()
            if replay is not None:               # the replay socket's poll is the timer
                if replay.poll(0 if closing else wait_ms):
                    while replay.poll(0):
                        self._serve_replay(replay)
            elif not closing:
                self._closing.wait(FLUSH_INTERVAL_S)
            if pending:
                self._send_pending()
                self.sender_cpu_s = time.thread_time()
            elif closing:
                break

    def _send_pending(self) -> None:
        zmq, pending = self._zmq, self._queue
        send, more, topic = self._pub.send, zmq.SNDMORE, self._topic
        while pending and not self._abort:
            seq, payload = pending.popleft()
            self._buffer.append((seq, payload))
            try:                                 # three sends: a third of send_multipart's cost
                send(topic, more)
                send(seq.to_bytes(8, "big"), more)
                send(payload)
                self.sent += 1
            except zmq.ZMQError as e:            # the batch stays replayable from the buffer
                self.send_errors += 1
                self.last_error = str(e)

    def _serve_replay(self, replay) -> None:
        frames = replay.recv_multipart()
        if len(frames) != 3 or len(frames[2]) != 8:   # [identity, b"", start seq]
            return
        client, _, start = frames
        start_seq = int.from_bytes(start, "big")
        for seq, payload in list(self._buffer):
            if seq >= start_seq:
                replay.send_multipart((client, b"", self._topic, seq.to_bytes(8, "big"), payload))
        replay.send_multipart((client, b"", b"", _END_FRAME, b""))

    def flush(self, timeout_s: float = 2.0) -> bool:
        """Wait until every queued batch was handed to ZeroMQ; False on timeout."""
        deadline = time.monotonic() + timeout_s
        while self.sent + self.send_errors + self.dropped < self.published:
            if time.monotonic() > deadline or not self._thread.is_alive():
                return False
            time.sleep(0.001)
        return True

    def close(self, timeout_s: float = 2.0) -> None:
        """Send what is queued (up to ``timeout_s``), stop the thread, close the sockets."""
        if self._closed:
            return
        self._closed = True
        self._closing.set()
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            self._abort = True
            self._thread.join(1.0)
        if not self._thread.is_alive():
            self._close_sockets()

    def _close_sockets(self) -> None:
        for s in (self._pub, self._replay):
            if s is not None:
                s.close()
        self._pub = self._replay = None
