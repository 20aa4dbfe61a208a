"""vLLM's KV cache events: the wire format, a subscriber, and a socket-free model of the cache.

vLLM (``--kv-events-config``) publishes every change to its prefix cache -- a full block stored
under its hash, a cached block evicted, the whole cache reset -- as msgpack-encoded batches over
a ZeroMQ PUB socket. The format here follows vLLM's ``vllm/distributed/kv_events.py`` (and the
map encoding of its events, vllm-project/vllm#42892) field for field:

- the batch ``[ts, events, data_parallel_rank]`` is a msgspec Struct with ``array_like=True,
  omit_defaults=True, gc=False``: a positional msgpack array;
- each event is a msgspec Struct with ``omit_defaults=True, gc=False, tag=True``: a msgpack *map*
  whose ``"type"`` key names the class (``BlockStored`` / ``BlockRemoved`` / ``AllBlocksCleared``);
- a ZeroMQ message is three frames: topic, the batch's sequence number (8 bytes, big-endian,
  0, 1, 2, ... per publisher), payload. A ROUTER "replay" socket answers a start sequence number
  (8 bytes) with every buffered (topic, seq, payload) from there, then seq -1 and an empty payload.

The subscriber also decodes the older all-positional encoding (events as tagged arrays, vLLM
before #42892), so the page can watch older servers too. This engine's publisher lives in
``engine/kv_event_publisher.py`` and is re-exported here as ``KVEventPublisher``.
"""
from __future__ import annotations

import re
import threading
import time
import weakref
from collections import Counter, deque
from dataclasses import dataclass
from typing import Any, Iterable

import msgspec

MEDIUM_GPU = "GPU"
ExternalBlockHash = bytes | int        # vLLM: bytes (the hash digest), or int with
                                       # VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES

# ---- the wire format (vllm/distributed/kv_events.py) -------------------------------------


class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class KVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    """Base of the event kinds; ``tag=True`` puts the class name under the map's "type" key."""


class BlockStored(KVCacheEvent):
    """Full blocks entered the prefix cache: ``block_hashes`` in chain order, the first chained
    from ``parent_block_hash`` (None for a prompt's first block); ``token_ids`` are all their
    tokens, ``block_size`` per block."""
    block_hashes: list[ExternalBlockHash]
    parent_block_hash: ExternalBlockHash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None                # deprecated in vLLM in favour of lora_name
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None = None    # one entry per block
    group_idx: int | None = None                               # KV cache group (hybrid models)
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None


class BlockRemoved(KVCacheEvent):
    """Cached blocks were evicted (their physical blocks reused)."""
    block_hashes: list[ExternalBlockHash]
    medium: str | None
    group_idx: int | None = None


class AllBlocksCleared(KVCacheEvent):
    """The whole prefix cache was reset."""


class KVEventBatch(EventBatch):
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]


# ---- older encodings, decoded and converted to the classes above -------------------------


class _LegacyBlockStored(msgspec.Struct, array_like=True, tag="BlockStored"):
    # positional: fields were only ever appended, so later ones default for older servers
    block_hashes: list[ExternalBlockHash]
    parent_block_hash: ExternalBlockHash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None = None
    medium: str | None = None
    lora_name: str | None = None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None


class _LegacyBlockRemoved(msgspec.Struct, array_like=True, tag="BlockRemoved"):
    block_hashes: list[ExternalBlockHash]
    medium: str | None = None
    group_idx: int | None = None


class _LegacyAllBlocksCleared(msgspec.Struct, array_like=True, tag="AllBlocksCleared"):
    pass


class _LegacyBatch(msgspec.Struct, array_like=True):
    ts: float
    events: list[_LegacyBlockStored | _LegacyBlockRemoved | _LegacyAllBlocksCleared]
    data_parallel_rank: int | None = None


class _MapBatch(msgspec.Struct):
    # in case a server sends the batch itself as a map (one vLLM revision's EventBatch had no
    # array_like); its events are the current map-shaped ones
    ts: float
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]
    data_parallel_rank: int | None = None


_CURRENT = {_LegacyBlockStored: BlockStored, _LegacyBlockRemoved: BlockRemoved,
            _LegacyAllBlocksCleared: AllBlocksCleared}
_DECODE_CURRENT = msgspec.msgpack.Decoder(KVEventBatch)
_DECODE_LEGACY = msgspec.msgpack.Decoder(_LegacyBatch)
_DECODE_MAP = msgspec.msgpack.Decoder(_MapBatch)


def encode_batch(batch: KVEventBatch) -> bytes:
    return msgspec.msgpack.encode(batch)


def decode_batch(payload: bytes) -> KVEventBatch:
    """A payload in vLLM's current encoding, or an older one; ValueError names what is wrong."""
    if not payload:
        raise ValueError("empty payload")
    try:
        return _DECODE_CURRENT.decode(payload)
    except msgspec.DecodeError as current_error:
        first = payload[0]
        try:
            if 0x80 <= first <= 0x8F or first in (0xDE, 0xDF):     # a msgpack map
                b = _DECODE_MAP.decode(payload)
                return KVEventBatch(b.ts, b.events, b.data_parallel_rank)
            b = _DECODE_LEGACY.decode(payload)
        except msgspec.DecodeError:
            raise ValueError(f"not a KV event batch: {current_error}") from None
        events = [_CURRENT[type(e)](**msgspec.structs.asdict(e)) for e in b.events]
        return KVEventBatch(b.ts, events, b.data_parallel_rank)


# ---- endpoints ---------------------------------------------------------------------------

_TCP = re.compile(r"tcp://(?P<host>\*|\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.\-]+"   # *, [v6], name
                  r"|[0-9A-Fa-f:]*::[0-9A-Fa-f:]*):(?P<port>[0-9]+)")
EXAMPLE = "tcp://127.0.0.1:5557"


def check_endpoint(text, what: str = "endpoint", *, bind: bool = False) -> str:
    """A ZeroMQ address, stripped; ValueError saying what is wrong with it otherwise.

    ``bind`` allows the wildcard host (``tcp://*:5557``) and port 0; an address to connect to
    must name a host and a port."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"the {what} is empty: enter a ZeroMQ address such as {EXAMPLE}")
    ep = text.strip()
    scheme = ep.split("://", 1)[0] if "://" in ep else ""
    if scheme == "tcp":
        m = _TCP.fullmatch(ep)
        if m is None:
            raise ValueError(f"the {what} {ep!r} is not tcp://HOST:PORT (e.g. {EXAMPLE})")
        port = int(m["port"])
        if port > 65535 or (port == 0 and not bind):
            raise ValueError(f"the {what} {ep!r} has port {port}: use 1-65535")
        if m["host"] == "*" and not bind:
            raise ValueError(f"the {what} {ep!r} has the wildcard host '*', which a server binds "
                             f"but nobody can connect to: use the server's address, e.g. "
                             f"tcp://127.0.0.1:{port}")
        return ep
    if scheme in ("ipc", "inproc"):
        if not ep.split("://", 1)[1]:
            raise ValueError(f"the {what} {ep!r} names no {scheme} path")
        return ep
    raise ValueError(f"the {what} {ep!r} must start with tcp://, ipc:// or inproc:// "
                     f"(e.g. {EXAMPLE})")


def offset_endpoint_port(endpoint: str | None, data_parallel_rank: int) -> str | None:
    """vLLM gives data-parallel rank r its own sockets: tcp port + r, inproc name + "_dp{r}"."""
    if not endpoint or data_parallel_rank == 0:
        return endpoint
    if endpoint.startswith("inproc://"):
        return f"{endpoint}_dp{data_parallel_rank}"
    if endpoint.startswith("tcp://"):
        base, _, port = endpoint.rpartition(":")
        return endpoint if int(port) == 0 else f"{base}:{int(port) + data_parallel_rank}"
    raise ValueError(f"cannot offset {endpoint!r} by data-parallel rank {data_parallel_rank}: "
                     f"only tcp:// and inproc:// endpoints have a per-rank form")


def binds(endpoint: str) -> bool:
    """vLLM's rule for the PUB socket: bind a wildcard / IPv6 / ipc / inproc address, else
    connect (a publisher can push to a subscriber that binds)."""
    return ("*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://")))


def wants_ipv6(endpoint: str) -> bool:
    return endpoint.startswith("tcp://[") or "::" in endpoint


def hash_hex(h: ExternalBlockHash | None) -> str:
    """A block hash as hex text (bytes digest, or int), "" for none."""
    if h is None:
        return ""
    return h.hex() if isinstance(h, (bytes, bytearray)) else format(h, "x")


END_SEQ = -1                           # the replay's end marker
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
            raise ValueError(f"cannot {how} {endpoint!r}: {e}") from None
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
            if len(frames) != 3:
                self._bad(f"live message with {len(frames)} frames (expected topic, sequence "
                          f"number, payload)")
                continue
            _, seq_bytes, payload = frames
            if len(seq_bytes) != 8:
                self._bad(f"live message with a {len(seq_bytes)}-byte sequence number "
                          f"(expected 8)")
                continue
            seq = int.from_bytes(seq_bytes, "big", signed=True)
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


# ---- the cache, as the events describe it (no sockets) ------------------------------------


@dataclass(frozen=True)
class CachedBlock:
    """A block in the prefix cache as a KV event stream describes it."""
    block_hash: ExternalBlockHash
    parent_hash: ExternalBlockHash | None
    token_ids: tuple[int, ...] | None   # None when the event carried no (or too few) tokens
    block_size: int
    rank: int
    medium: str | None
    group: int
    seq: int                            # the batch that stored it
    ts: float
    stores: int                         # times this hash was stored so far (this one included)

    @property
    def key(self) -> tuple:
        return (self.rank, self.group, self.medium, self.block_hash)

    @property
    def parent_key(self) -> tuple | None:
        if self.parent_hash is None:
            return None
        return (self.rank, self.group, self.medium, self.parent_hash)


def split_tokens(token_ids, n_blocks: int, block_size: int) -> list[tuple[int, ...] | None]:
    """A multi-block BlockStored's tokens, one tuple per block (None where they run short)."""
    out = []
    for i in range(n_blocks):
        chunk = tuple(token_ids[i * block_size:(i + 1) * block_size])
        out.append(chunk if len(chunk) == block_size else None)
    return out


class PrefixCacheView:
    """The prefix cache rebuilt from KV event batches: what is cached now, how often each hash
    was stored, what was removed, and per-batch counts over time. Pure: feed it batches."""

    def __init__(self, max_points: int = 20_000, max_log: int = 500, max_removed: int = 1000):
        self.blocks: dict[tuple, CachedBlock] = {}
        # live copies per hash: vLLM v1 caches a recomputed block whose hash is cached already
        # (a BlockStored for each copy) and removes them one by one (a BlockRemoved each), so a
        # hash stays cached until its last copy is removed
        self.copies: Counter = Counter()
        self.cached_per_rank: Counter = Counter()
        self.store_counts: Counter = Counter()
        self.removed: deque[CachedBlock] = deque(maxlen=max_removed)
        self.series: deque[dict] = deque(maxlen=max_points)
        self.log: deque[dict] = deque(maxlen=max_log)
        self.batches = 0
        self.stored_total = self.removed_total = self.cleared_total = 0
        self.unknown_removed = 0       # removals of hashes stored before we joined

    def apply_all(self, batches: Iterable[ReceivedBatch]) -> None:
        for b in batches:
            self.apply(b)

    def apply(self, batch: ReceivedBatch) -> None:
        rank = batch.data_parallel_rank
        if batch.restart:
            self._clear(rank)
        stored = removed = cleared = 0
        for e in batch.events:
            if isinstance(e, BlockStored):
                stored += self._store(e, batch)
            elif isinstance(e, BlockRemoved):
                removed += self._remove(e, batch)
            elif isinstance(e, AllBlocksCleared):
                cleared += 1
                self.cleared_total += 1
                self._clear(rank)
                self._log(batch, "AllBlocksCleared", 0, None, None, None, None)
        self.batches += 1
        self.series.append({"seq": batch.seq, "ts": batch.ts, "rank": rank, "stored": stored,
                            "removed": removed, "cleared": cleared,
                            "cached": self.cached_per_rank[rank]})

    def _store(self, e: BlockStored, batch: ReceivedBatch) -> int:
        group = e.group_idx or 0
        tokens = split_tokens(e.token_ids, len(e.block_hashes), e.block_size)
        parent = e.parent_block_hash
        for h, toks in zip(e.block_hashes, tokens):
            key = (batch.data_parallel_rank, group, e.medium, h)
            self.store_counts[key] += 1
            self.copies[key] += 1
            self.cached_per_rank[key[0]] += key not in self.blocks
            self.blocks[key] = CachedBlock(h, parent, toks, e.block_size, batch.data_parallel_rank,
                                           e.medium, group, batch.seq, batch.ts,
                                           self.store_counts[key])
            parent = h
        self.stored_total += len(e.block_hashes)
        self._log(batch, "BlockStored", len(e.block_hashes), e.block_hashes[0] if e.block_hashes
                  else None, e.parent_block_hash, e.token_ids, e.medium)
        return len(e.block_hashes)

    def _remove(self, e: BlockRemoved, batch: ReceivedBatch) -> int:
        group = e.group_idx or 0
        for h in e.block_hashes:
            key = (batch.data_parallel_rank, group, e.medium, h)
            if key not in self.blocks:
                self.unknown_removed += 1
                continue
            self.copies[key] -= 1
            if self.copies[key] > 0:
                continue                   # another copy still holds this hash
            del self.copies[key]
            block = self.blocks.pop(key)
            self.removed.append(block)
            self.cached_per_rank[block.rank] -= 1
        self.removed_total += len(e.block_hashes)
        self._log(batch, "BlockRemoved", len(e.block_hashes),
                  e.block_hashes[0] if e.block_hashes else None, None, None, e.medium)
        return len(e.block_hashes)

    def _clear(self, rank: int) -> None:
        for key in [k for k in self.blocks if k[0] == rank]:
            del self.blocks[key]
            self.copies.pop(key, None)
        self.cached_per_rank[rank] = 0

    def _log(self, batch, kind, n, first, parent, tokens, medium) -> None:
        shown = " ".join(map(str, tokens[:16])) + (" …" if len(tokens) > 16 else "") if tokens \
            else ""
        self.log.append({"seq": batch.seq, "ts": batch.ts, "rank": batch.data_parallel_rank,
                         "event": kind, "blocks": n, "first hash": hash_hex(first)[:12],
                         "parent": hash_hex(parent)[:12], "tokens": shown,
                         "medium": medium or "", "source": batch.source})

    # ---- tables ------------------------------------------------------------------------
    def series_frame(self):
        """One row per batch: seq, time, rank, blocks stored / removed, clears, and the rank's
        cached blocks after it."""
        import pandas as pd
        frame = pd.DataFrame(list(self.series),
                             columns=["seq", "ts", "rank", "stored", "removed", "cleared",
                                      "cached"])
        frame["time"] = pd.to_datetime(frame["ts"], unit="s")
        return frame

    def events_frame(self, n: int = 50):
        """The latest ``n`` events, newest first."""
        import pandas as pd
        rows = list(self.log)[-n:][::-1]
        frame = pd.DataFrame(rows, columns=["seq", "ts", "rank", "event", "blocks", "first hash",
                                            "parent", "tokens", "medium", "source"])
        frame.insert(1, "time", pd.to_datetime(frame.pop("ts"), unit="s").dt.strftime("%H:%M:%S.%f")
                     .str[:-3])
        return frame


def __getattr__(name: str):
    # lazy: the publisher imports this module's format classes
    if name == "KVEventPublisher":
        from engine.kv_event_publisher import KVEventPublisher
        return KVEventPublisher
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
