"""The block hash: the one place it is defined (docs/architecture.md#memory-rules).

A full block's hash chains its parent's: equal hashes mean equal whole prefixes, so a prefix
cache hit may reuse the block's K/V. It is vLLM v1's hash byte for byte (vLLM 0.32,
``hash_block_tokens`` in ``vllm/v1/core/kv_cache_utils.py`` with its default ``sha256`` from
``vllm/utils/hashing.py``; checked against the running vLLM by tests/vllm_real): the sha256
digest of ``pickle.dumps((parent digest, tuple(token ids), extra keys), HIGHEST_PROTOCOL)``,
a first block chained from ``NONE_HASH``. So our KV events carry the very hashes a vLLM server
would publish for the same tokens. The whole digest is kept, never truncated: a collision would
silently serve another prefix's K/V. Hashes travel as hex text (events, snapshots and traces stay
JSON-serialisable); ``hash_bytes`` gives the digest bytes vLLM's KV events carry,
``hash_int64`` the 64-bit integer vLLM sends by default, and ``short_hash`` the label the page
shows.
"""
from __future__ import annotations

import functools
import hashlib
import os
import pickle

NO_PARENT = ""          # the parent hash of a sequence's first block (chains from NONE_HASH)
NONE_HASH_SEED = "vllm-none-hash"     # vLLM's DEFAULT_NONE_HASH_SEED for sha256


@functools.lru_cache(maxsize=4)
def _none_hash(seed: str) -> bytes:
    return hashlib.sha256(pickle.dumps(seed, protocol=pickle.HIGHEST_PROTOCOL)).digest()


def none_hash() -> bytes:
    """vLLM's ``NONE_HASH`` (``init_none_hash``): sha256 of the seed, which is
    ``PYTHONHASHSEED`` when set, else the fixed "vllm-none-hash" (for sha256 vLLM no longer
    draws a random per-process seed)."""
    return _none_hash(os.environ.get("PYTHONHASHSEED", NONE_HASH_SEED))


def hash_block(parent_hash: str, token_ids: list[int], extra_keys: tuple | None = None) -> str:
    """Chained content hash of a full block, as 64 hex characters.

    ``parent_hash`` is ``NO_PARENT`` for a first block. ``extra_keys`` are vLLM's hash keys
    (``block_extra_keys``); None when there are none."""
    parent = bytes.fromhex(parent_hash) if parent_hash else none_hash()
    data = pickle.dumps((parent, tuple(token_ids), extra_keys), protocol=pickle.HIGHEST_PROTOCOL)
    return hashlib.sha256(data).hexdigest()


def block_extra_keys(cache_salt: str | None, logical: int) -> tuple | None:
    """vLLM's extra hash keys of a sequence's ``logical``-th block: its cache salt, tagged
    ``("cache_salt", salt)``, on the first block only (``generate_block_hash_extra_keys``; the
    chain carries it on), else None."""
    return (("cache_salt", cache_salt),) if logical == 0 and cache_salt else None


def event_extra_keys(extra_keys: tuple | None) -> tuple | None:
    """A block's extra keys as vLLM's KV events publish them: untagged (the salt itself),
    vLLM's ``to_event_extra_keys``."""
    if not extra_keys:
        return None
    return tuple(k[1:] if k[0] == "mm" else k[1] for k in extra_keys)


def hash_bytes(block_hash: str) -> bytes:
    """The digest behind a hex block hash (what vLLM's KV events carry with
    ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0``)."""
    return bytes.fromhex(block_hash)


def hash_int64(block_hash: str) -> int:
    """The integer vLLM's KV events carry by default: the digest's low 64 bits
    (``maybe_convert_block_hash``)."""
    return int(block_hash[-16:], 16)


def short_hash(block_hash: str, length: int = 12) -> str:
    """The leading hex digits of a hash, for labels (the full hash stays in the data)."""
    return block_hash[:length]
