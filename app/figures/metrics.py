"""The metric strip: numbers read straight from a snapshot's PoolStats."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Metric:
    label: str
    value: str
    help: str


def _pct(a: int, b: int) -> str:
    return f"{100 * a / b:.0f}%" if b else "–"


def _bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def metrics(snapshot) -> list[Metric]:
    st = snapshot.stats
    bs = snapshot.block_size
    allocated_slots = st.used_blocks * bs
    saved = st.blocks_saved_by_sharing
    used = f"{st.used_blocks}/{st.total_blocks} · {_pct(st.used_blocks, st.total_blocks)}"
    filled = f"{st.used_token_slots}/{allocated_slots} · {_pct(st.used_token_slots, allocated_slots)}"
    return [
        Metric("blocks used", used,
               "physical blocks with refcount ≥ 1, out of the pool"),
        Metric("slots filled", filled,
               "slots holding a token's K/V, out of the slots of allocated blocks (the rest is "
               "last-block slack: paged attention's only waste)"),
        Metric("shared blocks", str(st.shared_blocks), "blocks referenced by more than one "
               "block table (refcount > 1)"),
        Metric("saved (sharing)", f"{saved} · {_pct(saved, st.logical_blocks)}",
               f"blocks saved ({_bytes(saved * st.bytes_per_block)} of KV): logical blocks (sum "
               f"of table lengths = {st.logical_blocks}, what copying would need) minus physical "
               "blocks in use"),
        *([Metric("prefix-cache hits", f"{st.prefix_cache_hits}/{st.prefix_cache_queries} tokens",
                  "prompt tokens found in the prefix cache, out of those looked up (vLLM's "
                  "prefix_cache_hits / prefix_cache_queries, tokens, so far)")]
          if st.prefix_cache_queries else []),
        Metric("step time", f"{1000 * snapshot.step_time_s:.0f} ms", "wall time of the engine step"),
        Metric("backend", snapshot.backend, "device and kernel backend that ran the step"),
    ]
