"""The Watch tab's side of the scheduler tap (issue 40): ``TapFollower`` follows what a running
``vllm serve`` publishes, one SUB socket per data-parallel rank (rank r publishes on port + r,
as engine/kv_events/wire.py's ``offset_endpoint_port`` numbers them; a socket per rank, because
a ``Frame`` does not say its rank), each rank's state in a ``RankModel``
(real_vllm/tap/rank_model.py). ``poll()`` drains what arrived without blocking. Malformed
messages are counted and skipped; what arrives never raises.
"""
from __future__ import annotations

import time
from collections import deque

import msgspec

from engine.kv_events.wire import MalformedMessage, check_endpoint, live_message, \
    offset_endpoint_port, shown, wants_ipv6
from real_vllm.tap import frames as fr
from real_vllm.tap.rank_model import MAX_HISTORY, MAX_REASONS, RankModel, unknown_tokens

__all__ = ["MAX_RANKS", "RCV_HWM", "TapFollower", "unknown_tokens"]

MAX_RANKS = 64
RCV_HWM = 10_000


class TapFollower:
    """Follows a scheduler tap: one SUB socket per data-parallel rank, ``poll()`` drains them.

    ``endpoint`` is checked as the KV events subscriber checks its own (``check_endpoint``);
    on a shared server the page first runs ``app.hosting.check_watch_allowed`` on it."""

    def __init__(self, endpoint: str = fr.DEFAULT_ENDPOINT, topic: str = fr.DEFAULT_TOPIC, *,
                 data_parallel_size: int = 1, max_history: int = MAX_HISTORY):
        import zmq
        self._zmq = zmq
        endpoint = check_endpoint(endpoint, "endpoint")
        if not isinstance(topic, str):
            raise ValueError(f"the topic must be a string, got {topic!r}")
        if not isinstance(data_parallel_size, int) or isinstance(data_parallel_size, bool) or \
                not 1 <= data_parallel_size <= MAX_RANKS:
            raise ValueError(f"data_parallel_size must be a whole number from 1 to {MAX_RANKS}, "
                             f"got {data_parallel_size!r}")
        self.endpoint, self.topic = endpoint, topic
        self.data_parallel_size = data_parallel_size
        self.models = {r: RankModel(r, max_history) for r in range(data_parallel_size)}
        self.malformed_count = 0
        self.malformed: deque[str] = deque(maxlen=MAX_REASONS)
        self.received = 0
        self.since = time.monotonic()
        ctx = zmq.Context.instance()
        self._sockets: dict[int, object] = {}
        self._poller = zmq.Poller()
        try:
            for r in range(data_parallel_size):
                ep = offset_endpoint_port(endpoint, r)
                s = ctx.socket(zmq.SUB)
                s.setsockopt(zmq.LINGER, 0)
                # room for a few seconds of a busy server's frames between two polls of the
                # page (ZeroMQ's default 1000 lost most of them at ~1000 frames/s); still
                # bounded, a lost frame is a gap the next keyframe repairs
                s.setsockopt(zmq.RCVHWM, RCV_HWM)
                if wants_ipv6(ep):
                    s.setsockopt(zmq.IPV6, 1)
                self._sockets[r] = s
                s.setsockopt(zmq.SUBSCRIBE, topic.encode())
                s.connect(ep)
                self._poller.register(s, zmq.POLLIN)
        except zmq.ZMQError as e:
            self.close()
            raise ValueError(f"cannot connect to {shown(endpoint)!r}: {e}") from None
        except ValueError:                     # an endpoint with no per-rank form
            self.close()
            raise

    @property
    def closed(self) -> bool:
        return not self._sockets

    def close(self) -> None:
        while self._sockets:
            _, s = self._sockets.popitem()
            s.close(linger=0)

    def poll(self, timeout_s: float = 0.0, max_messages: int = 10_000) -> int:
        """Apply what arrived (waiting at most ``timeout_s`` for the first message); the number
        of messages taken. Never raises for what came on the wire."""
        if self.closed:
            return 0
        zmq = self._zmq
        taken = 0
        wait_ms = max(0.0, timeout_s) * 1000
        while taken < max_messages:
            ready = dict(self._poller.poll(0 if taken else wait_ms))
            if not ready:
                break
            for rank, s in list(self._sockets.items()):
                if s not in ready:
                    continue
                while taken < max_messages:
                    try:
                        parts = s.recv_multipart(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    taken += 1
                    self._take(rank, parts)
        self.received += taken
        return taken

    def _bad(self, reason: str) -> None:
        self.malformed_count += 1
        self.malformed.append(reason)

    def _take(self, rank: int, parts: list[bytes]) -> None:
        try:
            seq, payload = live_message(parts, signed=False)
        except MalformedMessage as e:
            self._bad(f"rank {rank}: {e}")
            return
        try:
            message = fr.decode(payload)
        except (msgspec.DecodeError, msgspec.ValidationError) as e:
            self._bad(f"rank {rank} seq {seq}: not a tap message ({e})")
            return
        model = self.models[rank]
        if isinstance(message, fr.Hello) and message.rank != rank:
            self._bad(f"rank {rank} seq {seq}: a Hello of rank {message.rank} on rank "
                      f"{rank}'s port")
            return
        try:
            model.receive(seq, message)
        except (ValueError, TypeError, IndexError, KeyError) as e:
            # a frame the model cannot use (values out of every range): counted, not raised
            self._bad(f"rank {rank} seq {seq}: {type(e).__name__}: {e}")

    # ---- totals for the status line -------------------------------------------------------
    def total(self, name: str) -> int:
        return sum(getattr(m, name) for m in self.models.values())
