"""KV memory waste: the paged engine vs contiguous Orca-style allocators, same requests.

For each synthetic workload (ShareGPT-like, Alpaca-like; see engine/workloads.py) at one fixed
KV budget, the length-only engine (the real block manager and scheduler, no model) serves the
trace while the Max / Pow2 / Oracle baselines serve the very same request stream in lockstep.
Prints, per allocator, the time-averaged share of non-free KV memory in each of the paper's
Fig. 2 categories, the mean running batch, requests finished in the same steps, and the paper's
numbers beside ours. Writes bench/results/waste.{json,csv}.

Usage: python bench/waste.py [--requests 300] [--blocks 1024] [--block-size 16]
"""
from __future__ import annotations

import argparse
import time

import pandas as pd

if __package__ in (None, ""):          # python bench/X.py: make the repo importable
    import sys as _sys
    from pathlib import Path as _Path
    _sys.path.insert(0, str(_Path(__file__).resolve().parents[1]))

from bench.common import Progress, write_results  # noqa: E402
from engine import Engine, EngineConfig, SamplingParams
from engine.block_size_sweep import block_size_sweep
from engine.accounting import summarize
from engine.workloads import WORKLOADS, run_trace, synthetic_trace

# vLLM paper Fig. 2 (OPT-13B, ShareGPT-like): share of KV memory holding token states
PAPER_TOKEN_SHARE = {"max": 20.4, "pow2": 26.8, "oracle": 38.2, "paged": 96.3}
# and the mean number of batched requests it reports for the same setup (vLLM vs Orca variants)
PAPER_BATCH = {"paged": 30.42, "oracle": 13.62, "pow2": 9.81, "max": 7.00}


def run(workload: str, requests: int, blocks: int, block_size: int, rate: float, seed: int,
        max_model_len: int = 2048):
    spec = WORKLOADS[workload]
    trace = synthetic_trace(spec, requests, rate_per_step=rate, seed=seed)
    eng = Engine.length_only(EngineConfig(block_size=block_size, num_gpu_blocks=blocks, seed=seed,
                                          max_history=1, max_model_len=max_model_len),
                             max_model_len=max_model_len)
    t0 = time.perf_counter()
    steps = run_trace(eng, trace, on_step=Progress(workload))
    elapsed = time.perf_counter() - t0
    summary = summarize(eng.accounting_frame())
    summary["paper_token_states_%"] = [PAPER_TOKEN_SHARE[a] for a in summary.index]
    summary.insert(0, "workload", workload)
    info = {"workload": workload, "requests": requests, "steps": steps, "seconds": elapsed,
            "kv_slots": blocks * block_size, "block_size": block_size,
            "mean_prompt": float(trace.prompt_len.mean()), "mean_output": float(trace.output_len.mean()),
            "preemptions": eng.event_counts["preempt"]}
    return summary, info


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--blocks", type=int, default=1024, help="KV budget in blocks (paged pool; "
                    "the baselines get the same number of slots)")
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--rate", type=float, default=2.0, help="Poisson arrivals per engine step")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-model-len", type=int, default=2048,
                    help="the Max baseline's slab per sequence (the paper's Orca reserves 2048)")
    ap.add_argument("--block-sizes", action="store_true",
                    help="also sweep block sizes 1..128 on the same traces (token-state share of "
                         "allocated KV, mean running requests)")
    args = ap.parse_args()
    t_all = time.perf_counter()
    tables, infos = [], []
    for workload in ("sharegpt", "alpaca"):
        summary, info = run(workload, args.requests, args.blocks, args.block_size, args.rate,
                            args.seed, args.max_model_len)
        tables.append(summary)
        infos.append(info)
    table = pd.concat(tables)
    pd.set_option("display.width", 200)
    pd.set_option("display.float_format", lambda v: f"{v:8.1f}")
    for info in infos:
        print(f"{info['workload']}: {info['requests']} requests (mean prompt {info['mean_prompt']:.1f}, "
              f"mean output {info['mean_output']:.1f} tokens), KV budget {info['kv_slots']} slots, "
              f"block {info['block_size']}, {info['steps']} steps in {info['seconds']:.1f} s "
              f"({info['steps'] / max(info['seconds'], 1e-9):.0f} steps/s), "
              f"{info['preemptions']} preemptions (paged)")
    print(table.to_string())
    print(f"wall time for both traces: {time.perf_counter() - t_all:.1f} s")
    paper = PAPER_BATCH["paged"]
    print(f"vLLM paper (OPT-13B on ShareGPT, mean batched requests): paged/oracle = "
          f"{paper / PAPER_BATCH['oracle']:.2f}x, paged/pow2 = {paper / PAPER_BATCH['pow2']:.2f}x, "
          f"paged/max = {paper / PAPER_BATCH['max']:.2f}x ({PAPER_BATCH})")
    for workload in ("sharegpt", "alpaca"):
        t = table[table.workload == workload]
        paged = t.loc["paged", "mean_running_batch"]
        print(f"{workload}: mean running batch paged/oracle = {paged / t.loc['oracle', 'mean_running_batch']:.2f}x, "
              f"paged/pow2 = {paged / t.loc['pow2', 'mean_running_batch']:.2f}x, "
              f"paged/max = {paged / t.loc['max', 'mean_running_batch']:.2f}x")
    sweeps = {}
    if args.block_sizes:
        capacity = args.blocks * args.block_size
        print(f"\nblock-size sweep, same traces, KV budget {capacity} slots (length-only engine)")
        for workload in ("sharegpt", "alpaca"):
            trace = synthetic_trace(WORKLOADS[workload], args.requests, rate_per_step=args.rate,
                                    seed=args.seed)
            requests = [(int(p), SamplingParams(max_tokens=int(o), ignore_eos=True))
                        for p, o in zip(trace.prompt_len, trace.output_len)]
            t0 = time.perf_counter()
            frame = block_size_sweep(requests, capacity, max_model_len=args.max_model_len,
                                     arrivals=[int(a) for a in trace.arrival_step])
            frame.insert(0, "workload", workload)
            sweeps[workload] = frame
            print(frame.to_string(index=False, formatters={
                "token_state_share": lambda v: f"{100 * v:6.1f}%",
                "mean_running_requests": lambda v: f"{v:7.1f}"}))
            print(f"({time.perf_counter() - t0:.1f} s)")
    write_results("waste", {"runs": infos, "table": table.reset_index().to_dict(orient="records"),
                            "block_size_sweep": {w: f.to_dict(orient="records")
                                                 for w, f in sweeps.items()}}, table)


if __name__ == "__main__":
    main()
