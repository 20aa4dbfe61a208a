"""A subscriber to a KV event stream (a vLLM server's, or this engine's publisher): live
batches in sequence order, gaps repaired through the replay socket, restarts noticed.

The wire format it decodes is in ``wire.py``; what it hands out (``ReceivedBatch``) feeds the
socket-free cache model in ``cache_view.py``.
"""
from __future__ import annotations

import threading
import time
import weakref
from collections import deque
from dataclasses import dataclass
from typing import Any

from engine.kv_events.wire import (END_SEQ, KVEventBatch, MalformedMessage, check_endpoint,
                                   decode_batch, live_message, shown,
                                   offset_endpoint_port, wants_ipv6)

REPLAY_TIMEOUT_S = 2.0
MAX_REPLAY_ROUNDS = 20                 # asks again from the first hole of a partial answer
MAX_GAPS = 1000


@dataclass(frozen=True)
class ReceivedBatch:
    """One decoded batch with its sequence number; ``restart``: the publisher's numbering went
    back (a restarted server: its cache starts empty)."""
    seq: int
    ts: float
    events: tuple
    data_parallel_rank: int
    source: str = "live"               # live / replay
    restart: bool = False


@dataclass(frozen=True)
class Gap:
    """Batches ``first``..``last`` of a rank's stream that never arrived, and why."""
    rank: int
    first: int
    last: int
    reason: str

    @property
    def size(self) -> int:
        return self.last - self.first + 1


class _RankStream:
    """Ordering and gap repair for one publisher (one data-parallel rank)."""

    def __init__(self, rank: int):
        self.rank = rank
        self.last_seq = -1             # the last sequence number handed out (-1: none yet)
        self.last_live = -1            # the last one that came on the live socket
        self.restarted = False         # mark the next batch handed out as a restart
        self.joined_at: int | None = None
        self.replaying = False
        self.replay_from = 0
        self.replay_rounds = 0
        self.replay_deadline = 0.0
        self.quiet_since = time.monotonic()   # the last time this rank sent or was asked
        self.replayed: dict[int, KVEventBatch | None] = {}   # None: seen but malformed
        self.held: list[tuple[int, KVEventBatch]] = []       # live batches during a replay


class KVEventSubscriber:
    """Receives a KV event stream (a vLLM server's, or this engine's publisher).

    A SUB socket connects to ``endpoint`` (``bind=True`` listens there instead, for a publisher
    configured with a connect address). ``data_parallel_size`` > 1 also connects to each rank's
    port (vLLM offsets ports by rank); sequence numbers are tracked per rank.

    With ``replay_endpoint`` (the server's ROUTER socket), a gap in the sequence numbers is
    filled from the server's replay buffer, and with ``catch_up`` the buffered history from
    seq 0 is fetched on connect -- which also makes the ZeroMQ slow-joiner problem (a PUB drops
    what it sends before a subscription arrives) harmless. A PUB's last messages can vanish the
    same way with nothing after them to reveal the gap, so when a rank has been quiet for
    ``probe_idle_s`` the subscriber asks the replay socket for anything after the last sequence
    number it has (an idle server answers with just the end marker). A long answer can lose
    messages (vLLM's ROUTER keeps ZeroMQ's default limit of 1000 queued), so an answer with
    holes is asked for again from its first hole. What cannot be recovered is in ``gaps``.
    Malformed messages are counted (``malformed_count``, reasons in ``malformed``) and skipped;
    ``receive`` never raises for what arrives on the wire.
    """

    def __init__(self, endpoint: str, topic: str = "", replay_endpoint: str | None = None, *,
                 bind: bool = False, data_parallel_size: int = 1, catch_up: bool = True,
                 replay_timeout_s: float = REPLAY_TIMEOUT_S, probe_idle_s: float | None = 1.0):
        import zmq
        self._zmq = zmq
        endpoint = check_endpoint(endpoint, "endpoint", bind=bind)
        if replay_endpoint is not None and not str(replay_endpoint).strip():
            replay_endpoint = None
        if replay_endpoint is not None:
            replay_endpoint = check_endpoint(replay_endpoint, "replay endpoint")
        if not isinstance(topic, str):
            raise ValueError(f"the topic must be a string, got {topic!r}")
        if not isinstance(data_parallel_size, int) or not 1 <= data_parallel_size <= 64:
            raise ValueError(f"data_parallel_size must be an integer 1-64, "
                             f"got {data_parallel_size!r}")
        self.endpoint, self.topic, self.replay_endpoint = endpoint, topic, replay_endpoint
        self.bind = bind
        self.data_parallel_size = data_parallel_size
        self.replay_timeout_s, self.probe_idle_s = replay_timeout_s, probe_idle_s
        self.recovered = 0             # batches that came from the replay socket
        self.received = 0              # batches handed out
        self.restarts = 0
        self.duplicates = 0            # live batches already handed out from a replay
        self.gaps: list[Gap] = []      # the latest MAX_GAPS unrecoverable gaps
        self.lost = 0                  # batches in all of them
        self.malformed_count = 0
        self.malformed: deque[str] = deque(maxlen=100)
        self._lock = threading.Lock()
        self._ctx = zmq.Context.instance()
        self._sockets: list = []
        self._streams = {r: _RankStream(r) for r in range(data_parallel_size)}
        self._replay_sockets: dict[int, Any] = {}
        self._poller = zmq.Poller()
        try:
            self._sub = self._socket(zmq.SUB, endpoint)
            self._sub.setsockopt(zmq.SUBSCRIBE, topic.encode())
            for r in range(data_parallel_size):
                ep = offset_endpoint_port(endpoint, r)
                (self._sub.bind if bind else self._sub.connect)(ep)
            self._poller.register(self._sub, zmq.POLLIN)
            if replay_endpoint is not None:
                for r in range(data_parallel_size):
                    self._new_replay_socket(r)
                    if catch_up:
                        self._request_replay(self._streams[r], 0)
        except zmq.ZMQError as e:
            self.close()
            how = "bind" if bind else "connect to"
            raise ValueError(f"cannot {how} {shown(endpoint)!r}: {e}") from None
        except ValueError:                   # an endpoint with no per-rank form
            self.close()
            raise
        self._finalizer = weakref.finalize(self, _close_all, self._sockets)

    # ---- sockets -----------------------------------------------------------------------
    def _socket(self, kind, endpoint: str):
        s = self._ctx.socket(kind)
        s.setsockopt(self._zmq.LINGER, 0)
        if wants_ipv6(endpoint):
            s.setsockopt(self._zmq.IPV6, 1)
        self._sockets.append(s)
        return s

    def _new_replay_socket(self, rank: int) -> None:
        """A DEALER per rank (vLLM's ROUTER takes REQ-style frames: empty delimiter, start).
        Replaced after a timed-out replay, so late answers go to a dead identity."""
        old = self._replay_sockets.pop(rank, None)
        if old is not None:
            self._poller.unregister(old)
            old.close(linger=0)
            self._sockets.remove(old)
        ep = offset_endpoint_port(self.replay_endpoint, rank)
        s = self._socket(self._zmq.DEALER, ep)
        s.setsockopt(self._zmq.RCVHWM, 0)      # take a long replay answer as fast as it comes
        s.connect(ep)
        self._poller.register(s, self._zmq.POLLIN)
        self._replay_sockets[rank] = s

    def _request_replay(self, stream: _RankStream, start: int, again: bool = False) -> None:
        """Ask for every buffered batch from ``start``; ``again`` keeps what the previous
        round of the same replay brought."""
        self._replay_sockets[stream.rank].send_multipart([b"", start.to_bytes(8, "big")])
        stream.replaying = True
        stream.quiet_since = time.monotonic()
        stream.replay_deadline = stream.quiet_since + self.replay_timeout_s
        if not again:
            stream.replayed, stream.replay_from, stream.replay_rounds = {}, start, 0
        stream.replay_rounds += 1

    @staticmethod
    def _first_hole(stream: _RankStream) -> int | None:
        """The first sequence number missing between the first and last ones replayed."""
        if not stream.replayed:
            return None
        seqs = stream.replayed
        lo = max(stream.replay_from, stream.last_seq + 1, min(seqs))
        return next((s for s in range(lo, max(seqs)) if s not in seqs), None)

    def close(self) -> None:
        """Close every socket; safe from another thread (a server's idle sweeper) while one
        is in ``receive``: it waits for that to finish (ZeroMQ sockets are not thread-safe)."""
        with self._lock:
            _close_all(self._sockets)

    @property
    def closed(self) -> bool:
        return not self._sockets

    # ---- receiving ---------------------------------------------------------------------
    def receive(self, timeout_s: float = 0.0, max_batches: int = 10_000) -> list[ReceivedBatch]:
        """Batches received so far, in sequence order per rank (replayed ones filled in).

        Waits at most ``timeout_s`` for the first one, then takes what is already there."""
        with self._lock:
            if self.closed:
                return []
            deadline = time.monotonic() + max(0.0, timeout_s)
            out: list[ReceivedBatch] = []
            while len(out) < max_batches:
                wait_ms = 0 if out else max(0.0, deadline - time.monotonic()) * 1000
                ready = dict(self._poller.poll(wait_ms))
                if self._sub in ready:
                    out += self._drain_live(max_batches - len(out))
                for rank, s in list(self._replay_sockets.items()):
                    if s in ready:
                        out += self._drain_replay(self._streams[rank], s)
                out += self._expire_replays()
                self._probe_quiet_ranks()
                if not ready and (out or time.monotonic() >= deadline):
                    break
            self.received += len(out)
            return out

    def _gap(self, gap: Gap) -> None:
        self.lost += gap.size
        self.gaps.append(gap)
        del self.gaps[:-MAX_GAPS]

    def _bad(self, reason: str) -> None:
        self.malformed_count += 1
        self.malformed.append(reason)

    def _drain_live(self, limit: int) -> list[ReceivedBatch]:
        out = []
        for _ in range(limit):
            try:
                frames = self._sub.recv_multipart(self._zmq.NOBLOCK)
            except self._zmq.Again:
                break
            try:
                seq, payload = live_message(frames, signed=True)
            except MalformedMessage as e:
                self._bad(f"live message: {e}")
                continue
            try:
                batch = decode_batch(payload)
            except ValueError as e:
                self._bad(f"live batch {seq}: {e}")
                continue
            rank = batch.data_parallel_rank or 0
            stream = self._streams.get(rank)
            if stream is None:
                stream = self._streams[rank] = _RankStream(rank)
            if seq <= stream.last_live and not stream.replaying:
                # a live stream only counts up: this is a new publisher (a restarted server)
                self.restarts += 1
                stream.last_seq = stream.last_live = -1
                stream.joined_at, stream.restarted = None, True
            stream.last_live = max(stream.last_live, seq)
            out += self._on_live(stream, seq, batch)
        return out

    def _on_live(self, stream: _RankStream, seq: int, batch: KVEventBatch) -> list[ReceivedBatch]:
        if stream.replaying:
            stream.held.append((seq, batch))
            return []
        if stream.last_seq < 0:                          # the first batch of this stream
            if seq > 0 and stream.rank in self._replay_sockets:
                stream.held.append((seq, batch))         # fetch what came before it, if kept
                self._request_replay(stream, 0)
                return []
            stream.joined_at = seq
            return [self._deliver(stream, seq, batch, "live")]
        if seq == stream.last_seq + 1:
            return [self._deliver(stream, seq, batch, "live")]
        if seq <= stream.last_seq:                       # a replay already handed it out
            self.duplicates += 1
            return []
        if stream.rank in self._replay_sockets:          # a gap: fill it from the replay buffer
            stream.held.append((seq, batch))
            self._request_replay(stream, stream.last_seq + 1)
            return []
        self._gap(Gap(stream.rank, stream.last_seq + 1, seq - 1, "no replay endpoint"))
        return [self._deliver(stream, seq, batch, "live")]

    def _drain_replay(self, stream: _RankStream, sock) -> list[ReceivedBatch]:
        out = []
        while True:
            try:
                frames = sock.recv_multipart(self._zmq.NOBLOCK)
            except self._zmq.Again:
                return out
            if frames and frames[0] == b"":
                frames = frames[1:]                      # the REQ-style delimiter
            if len(frames) not in (2, 3):               # (seq, payload) or (topic, seq, payload)
                self._bad(f"replay answer with {len(frames)} frames")
                continue
            seq_bytes, payload = frames[-2], frames[-1]
            if len(seq_bytes) != 8:
                self._bad(f"replay answer with a {len(seq_bytes)}-byte sequence number")
                continue
            seq = int.from_bytes(seq_bytes, "big", signed=True)
            if seq == END_SEQ or not payload:
                if stream.replaying:
                    hole = self._first_hole(stream)
                    if hole is not None and stream.replay_rounds < MAX_REPLAY_ROUNDS:
                        self._request_replay(stream, hole, again=True)
                    else:
                        out += self._finish_replay(stream, "not in the publisher's replay buffer")
                continue
            if not stream.replaying:
                continue                                 # an answer nobody waits for
            try:
                stream.replayed[seq] = decode_batch(payload)
            except ValueError as e:
                self._bad(f"replayed batch {seq}: {e}")
                stream.replayed[seq] = None

    def _probe_quiet_ranks(self) -> None:
        if self.probe_idle_s is None:
            return
        now = time.monotonic()
        for rank in self._replay_sockets:
            stream = self._streams[rank]
            if not stream.replaying and now - stream.quiet_since > self.probe_idle_s:
                self._request_replay(stream, stream.last_seq + 1)

    def _expire_replays(self) -> list[ReceivedBatch]:
        out = []
        now = time.monotonic()
        for stream in self._streams.values():
            if stream.replaying and now > stream.replay_deadline:
                self._new_replay_socket(stream.rank)
                out += self._finish_replay(stream, "replay timed out")
        return out

    def _finish_replay(self, stream: _RankStream, missing_reason: str) -> list[ReceivedBatch]:
        """Hand out replayed then held batches in order; what is still missing is a gap (or,
        before the first batch ever seen, history from before this subscriber joined)."""
        stream.replaying = False
        replayed = sorted(stream.replayed.items())
        held, stream.held, stream.replayed = stream.held, [], {}
        out = []
        for source, items in (("replay", replayed), ("live", held)):
            for seq, batch in items:
                if seq <= stream.last_seq:
                    continue                             # already handed out
                if stream.last_seq < 0:
                    stream.joined_at = seq
                elif seq > stream.last_seq + 1:
                    self._gap(Gap(stream.rank, stream.last_seq + 1, seq - 1, missing_reason))
                if batch is None:                        # malformed (already counted)
                    stream.last_seq = seq
                    continue
                out.append(self._deliver(stream, seq, batch, source))
        return out

    def _deliver(self, stream: _RankStream, seq: int, batch: KVEventBatch,
                 source: str) -> ReceivedBatch:
        restart, stream.restarted = stream.restarted, False
        stream.last_seq = seq
        stream.quiet_since = time.monotonic()
        self.recovered += source == "replay"
        return ReceivedBatch(seq, batch.ts, tuple(batch.events),
                             stream.rank if batch.data_parallel_rank is None
                             else batch.data_parallel_rank, source, restart)

    def last_seqs(self) -> dict[int, int]:
        """rank -> the last sequence number handed out (ranks that sent something)."""
        return {r: s.last_seq for r, s in self._streams.items() if s.last_seq >= 0}

    def joined_at(self) -> dict[int, int]:
        """rank -> the first sequence number this subscriber has (> 0: it joined late and the
        publisher no longer buffered what came before)."""
        return {r: s.joined_at for r, s in self._streams.items() if s.joined_at is not None}


def _close_all(sockets: list) -> None:
    while sockets:
        sockets.pop().close(linger=0)
