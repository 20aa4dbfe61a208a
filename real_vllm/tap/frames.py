"""The scheduler tap's wire format (issue 40): what a running vLLM's scheduler publishes each
step, and what the Watch tab reads. No vLLM import here: the page decodes frames without vLLM.

A ZeroMQ message is three frames, as vLLM's KV events are (engine/kv_events/wire.py): topic,
the frame's sequence number (8 bytes, big-endian, 0, 1, 2 … per publisher, i.e. per
data-parallel rank), and the msgpack payload of one ``TapMessage``:

- ``Hello`` first (and again with every keyframe, so a late subscriber learns the pool);
- ``Frame`` after each scheduler phase: ``"schedule"`` (what ``Scheduler.schedule`` decided) and
  ``"update"`` (after ``update_from_output``: finished requests, freed blocks). Under
  asynchronous scheduling vLLM runs ``schedule`` of step N+1 before ``update`` of step N; the
  ``step`` field pairs them. A ``keyframe`` carries every live request and every block whose
  state is not the idle one (ref count 0, no hash); a delta carries only what changed since the
  previous frame of that rank, and ``gone`` names the requests that left;
- ``TapOff`` when the tap turns itself off after an error (vLLM keeps serving).

Request ids are vLLM's engine-core ids (``cmpl-…-0-<8 random>`` under the OpenAI server).
"""
from __future__ import annotations

import msgspec

TAP_VERSION = 1
DEFAULT_TOPIC = "tap"
DEFAULT_ENDPOINT = "tcp://127.0.0.1:5570"   # the tap binds it (rank r: port + r)
ENDPOINT_ENV = "PAGED_LAB_TAP_ENDPOINT"
TOPIC_ENV = "PAGED_LAB_TAP_TOPIC"
PHASES = ("schedule", "update")

BlockHash = bytes | int | None              # vLLM's digest, or its low 64 bits as an int


class TapMessage(msgspec.Struct, tag_field="type", omit_defaults=True, gc=False):
    """Base of the messages; the class's tag names it under the map's "type" key."""


class Hello(TapMessage, tag="hello"):
    vllm_version: str
    rank: int                         # data-parallel rank (0 without data parallelism)
    num_blocks: int                   # the pool, the null block included
    null_block: int | None            # vLLM v1: block 0, never handed out
    block_size: int
    max_model_len: int
    kv_cache_groups: list[str]        # each group's spec kind, e.g. "FullAttentionSpec"
    async_scheduling: bool
    prefix_caching: bool
    keyframe_every_s: float
    tap_version: int = TAP_VERSION


class RequestState(msgspec.Struct, array_like=True, gc=False):
    """One request as the scheduler holds it after the phase."""
    request_id: str
    status: str                       # "running", "waiting" or "preempted"
    num_computed_tokens: int
    num_prompt_tokens: int
    num_output_tokens: int
    num_preemptions: int
    block_ids: list[list[int]]        # its block table, one list per KV cache group


class BlockState(msgspec.Struct, array_like=True, gc=False):
    block_id: int
    ref_cnt: int
    block_hash: BlockHash = None      # set while the block is in the prefix cache


class Frame(TapMessage, tag="frame"):
    step: int                         # the scheduler's step (schedule calls so far, from 0)
    phase: str                        # one of PHASES
    ts: float                         # time.time() at the end of the phase
    keyframe: bool
    num_free_blocks: int
    scheduled: dict[str, int] = {}    # request id -> tokens scheduled this step ("schedule")
    preempted: list[str] = []         # in the order vLLM preempted them this phase
    finished: list[str] = []
    running: list[str] = []           # the queues in their order, after the phase
    waiting: list[str] = []
    requests: list[RequestState] = []  # keyframe: every live request; delta: the changed ones
    gone: list[str] = []              # delta: requests no longer held
    blocks: list[BlockState] = []     # keyframe: every non-idle block; delta: the changed ones
    dropped: int = 0                  # frames the publisher dropped so far (slow subscriber)


class TapOff(TapMessage, tag="off"):
    reason: str                       # why the tap stopped (vLLM serves on)


_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(Hello | Frame | TapOff)


def encode(message: TapMessage) -> bytes:
    return _ENCODER.encode(message)


def decode(payload: bytes) -> Hello | Frame | TapOff:
    """One payload; msgspec.DecodeError / ValidationError for anything else."""
    return _DECODER.decode(payload)
