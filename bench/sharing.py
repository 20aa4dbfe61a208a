"""Memory saved by sharing KV blocks: parallel sampling (n = 2, 4, 6) and beam search (2, 4, 6).

For every step we count the physical blocks in use (with sharing) and the blocks the same
block tables would need if nothing were shared (sum of table lengths); the saving is
1 - sum(used) / sum(unshared) over the run. Two sets, in one run:
- real generation on a model (default: the embedded one) with a few short prompts, and
- a large Alpaca-like synthetic trace on the length-only engine (random logits, real allocator).
The vLLM paper's Alpaca numbers (Fig. 15) are printed beside ours.

Usage: python bench/sharing.py [--model default] [--requests 200]
"""
from __future__ import annotations

import argparse

import pandas as pd

if __package__ in (None, ""):          # python bench/X.py: make the repo importable
    import sys as _sys
    from pathlib import Path as _Path
    _sys.path.insert(0, str(_Path(__file__).resolve().parents[1]))

from bench.common import Progress, write_results  # noqa: E402
from engine import Engine, EngineConfig, SamplingParams
from analysis.workloads import ALPACA, run_trace, synthetic_trace

PAPER_ALPACA = {("parallel", 2): 6.09, ("parallel", 4): 8.53, ("parallel", 6): 9.79,
                ("beam", 2): 37.56, ("beam", 4): 53.13, ("beam", 6): 55.16}
PROMPTS = ["ROMEO:\nBut soft, what light through yonder window breaks?\n",
           "JULIET:\nO Romeo, Romeo, wherefore art thou Romeo?\n",
           "HAMLET:\nTo be, or not to be, that is the question:\n",
           "KING LEAR:\nBlow, winds, and crack your cheeks! rage! blow!\n"]


def params_for(mode: str, width: int, max_tokens: int, ignore_eos: bool) -> SamplingParams:
    if mode == "parallel":
        return SamplingParams(n=width, temperature=0.8, top_p=0.95, max_tokens=max_tokens,
                              ignore_eos=ignore_eos)
    return SamplingParams(beam_width=width, max_tokens=max_tokens, ignore_eos=ignore_eos)


def saving(step_stats: list) -> dict:
    used = sum(u for u, _ in step_stats)
    unshared = sum(n for _, n in step_stats)
    return {"blocks_used_avg": used / len(step_stats), "blocks_unshared_avg": unshared / len(step_stats),
            "saving_%": 100 * (1 - used / unshared) if unshared else 0.0}


def collect(eng: Engine) -> list:
    stats = []
    while eng.has_unfinished_requests():
        s = eng.step().snapshot.stats
        if s.logical_blocks:
            stats.append((s.used_blocks + s.cpu_used_blocks, s.logical_blocks))
    return stats


def real_set(model: str, mode: str, width: int) -> dict:
    eng = Engine(EngineConfig(model=model, block_size=16, num_gpu_blocks=512, seed=0))
    for p in PROMPTS:
        eng.add_request(p, params_for(mode, width, 58, ignore_eos=False))
    return saving(collect(eng))


def synthetic_set(mode: str, width: int, requests: int) -> dict:
    eng = Engine.length_only(EngineConfig(block_size=16, num_gpu_blocks=4096, seed=0,
                                          max_num_seqs=1024, max_history=1), max_model_len=2048)
    trace = synthetic_trace(ALPACA, requests, rate_per_step=4.0, seed=1)
    stats = []

    def record(result) -> None:
        s = result.snapshot.stats
        if s.logical_blocks:
            stats.append((s.used_blocks + s.cpu_used_blocks, s.logical_blocks))
    run_trace(eng, trace, lambda out: params_for(mode, width, int(out), ignore_eos=True),
              on_step=Progress(f"{mode} {width}"), on_result=record)
    return saving(stats)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="default")
    ap.add_argument("--requests", type=int, default=200)
    args = ap.parse_args()
    rows = []
    for mode in ("parallel", "beam"):
        for width in (2, 4, 6):
            real = real_set(args.model, mode, width)
            syn = synthetic_set(mode, width, args.requests)
            rows.append({"mode": mode, "width": width,
                         "real_saving_%": real["saving_%"], "synthetic_saving_%": syn["saving_%"],
                         "paper_alpaca_%": PAPER_ALPACA[(mode, width)],
                         "real_blocks_used": real["blocks_used_avg"],
                         "real_blocks_unshared": real["blocks_unshared_avg"],
                         "synthetic_blocks_used": syn["blocks_used_avg"],
                         "synthetic_blocks_unshared": syn["blocks_unshared_avg"]})
    table = pd.DataFrame(rows).set_index(["mode", "width"])
    pd.set_option("display.width", 200)
    pd.set_option("display.float_format", lambda v: f"{v:8.2f}")
    print(f"real set: {len(PROMPTS)} prompts on model {args.model!r}, up to 58 new tokens, "
          f"block 16; synthetic set: {args.requests} Alpaca-like requests, length-only engine")
    print(table.to_string())
    write_results("sharing", {"model": args.model, "rows": table.reset_index().to_dict(orient="records")},
                  table)


if __name__ == "__main__":
    main()
