"""The block hash: the one place it is defined (docs/architecture.md#memory-rules).

A full block's hash chains its parent's: equal hashes mean equal whole prefixes, so a prefix
cache hit may reuse the block's K/V. The whole sha256 digest is kept, never truncated: a
collision would silently serve another prefix's K/V, and a 64-bit truncation leaves only a
~2^32-block birthday bound. Hashes travel as hex text (events, snapshots and traces stay
JSON-serialisable); ``hash_bytes`` gives the digest bytes vLLM's KV events carry and
``short_hash`` the label the page shows.
"""
from __future__ import annotations

import hashlib
from array import array

NO_PARENT = ""          # the parent hash of a sequence's first block


def hash_block(parent_hash: str, token_ids: list[int], extra_keys: tuple | None = None) -> str:
    """Chained content hash of a full block, as 64 hex characters.

    ``parent_hash`` is ``NO_PARENT`` for a first block. ``extra_keys`` (vLLM v1's name: the
    request's ``cache_salt`` on its first block) go into the digest, so requests with
    different salts never share a block; None hashes as no keys."""
    data = parent_hash.encode() + array("q", token_ids).tobytes()
    if extra_keys:
        data += b"\x00extra:" + repr(tuple(extra_keys)).encode()
    return hashlib.sha256(data).hexdigest()


def block_extra_keys(cache_salt: str | None, logical: int) -> tuple | None:
    """Extra hash keys of a sequence's ``logical``-th block: its cache salt, on the first block
    only (vLLM v1 kv_cache_utils.generate_block_hash_extra_keys; the chain carries it on)."""
    return (cache_salt,) if logical == 0 and cache_salt else None


def hash_bytes(block_hash: str) -> bytes:
    """The digest behind a hex block hash (what vLLM's KV events carry)."""
    return bytes.fromhex(block_hash)


def short_hash(block_hash: str, length: int = 12) -> str:
    """The leading hex digits of a hash, for labels (the full hash stays in the data)."""
    return block_hash[:length]
