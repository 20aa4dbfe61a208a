"""The arithmetic of blocks: how many blocks hold n tokens, and where a token's K/V goes.

A leaf (no imports), so the page, the analysis and the benchmarks can use it too."""
from __future__ import annotations


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for integers, without floats (exact for any size)."""
    return -(-a // b)


def slot_of(block_table: list[int], position: int, block_size: int) -> int:
    """The flat slot of token ``position``: its block's physical number times the block size,
    plus its offset in the block."""
    return block_table[position // block_size] * block_size + position % block_size
