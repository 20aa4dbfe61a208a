"""vLLM's KV cache events on the wire: the batch and event structs, their encodings, endpoints.

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
before #42892), so the page can watch older servers too. This engine's publisher is in
``publisher.py``, the subscriber in ``subscriber.py``, the Watch view's cache model in
``cache_view.py``.
"""
from __future__ import annotations

import re
from typing import Any

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


def shown(endpoint: str, width: int = 60) -> str:
    """An address as messages echo it: whole up to ``width`` characters, else its start and
    its end (a pasted paragraph is not repeated back)."""
    return endpoint if len(endpoint) <= width else f"{endpoint[:width - 16]}…{endpoint[-12:]}"


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
            raise ValueError(f"the {what} {shown(ep)!r} is not tcp://HOST:PORT (e.g. {EXAMPLE})")
        port = int(m["port"])
        if port > 65535 or (port == 0 and not bind):
            raise ValueError(f"the {what} {shown(ep)!r} has port {port}: use 1-65535")
        if m["host"] == "*" and not bind:
            raise ValueError(f"the {what} {shown(ep)!r} has the wildcard host '*', which a server binds "
                             f"but nobody can connect to: use the server's address, e.g. "
                             f"tcp://127.0.0.1:{port}")
        return ep
    if scheme in ("ipc", "inproc"):
        if not ep.split("://", 1)[1]:
            raise ValueError(f"the {what} {shown(ep)!r} names no {scheme} path")
        return ep
    raise ValueError(f"the {what} {shown(ep)!r} must start with tcp://, ipc:// or inproc:// "
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


END_SEQ = -1                           # the replay's end marker (a sequence number)


class MalformedMessage(ValueError):
    """A ZeroMQ message that is not (topic, 8-byte sequence number, payload); says what it is."""


def live_message(parts: list[bytes], *, signed: bool) -> tuple[int, bytes]:
    """(sequence number, payload) of a live PUB message: vLLM's KV events publisher
    (``vllm/distributed/kv_events.py``, ``ZmqEventPublisher``) sends topic, the sequence number
    as 8 big-endian bytes (signed: the replay's end marker is -1), payload; the scheduler tap
    sends the same three parts (real_vllm/tap/publisher.py, unsigned)."""
    if len(parts) != 3:
        raise MalformedMessage(f"a message of {len(parts)} parts (expected topic, sequence "
                               f"number, payload)")
    _, seq_bytes, payload = parts
    if len(seq_bytes) != 8:
        raise MalformedMessage(f"a {len(seq_bytes)}-byte sequence number (expected 8)")
    return int.from_bytes(seq_bytes, "big", signed=signed), payload
