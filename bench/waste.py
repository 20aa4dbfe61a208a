"""KV memory waste: the paged engine vs contiguous Orca-style allocators, same requests.

For each synthetic workload (ShareGPT-like, Alpaca-like; see analysis/workloads.py) at one fixed
KV budget, the length-only engine (the real block manager and scheduler, no model) serves the
trace while the Max / Pow2 / Oracle baselines serve the very same request stream in lockstep.
Prints, per allocator, the time-averaged share of non-free KV memory in each of the paper's
Fig. 2 categories, the mean running batch, requests finished in the same steps, and the paper's
numbers beside ours. Writes bench/results/waste.{json,csv}.

By default the table comes from the length replay (analysis/length_replay.py: the engine's rules
on lengths only, about 10^5 steps per second instead of a few hundred); every run first serves
the first 200 requests of each trace on both the engine and the replay and stops unless their
accounting agrees row for row. ``--engine engine`` runs the whole traces on the engine instead.

Usage: python bench/waste.py [--requests 300] [--blocks 1024] [--block-size 16]
                             [--engine replay|engine]
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import time
from typing import Callable

import pandas as pd
import torch

if __package__ in (None, ""):          # python bench/X.py: make the repo importable
    import sys as _sys
    from pathlib import Path as _Path
    _sys.path.insert(0, str(_Path(__file__).resolve().parents[1]))

from bench.common import Progress, write_results  # noqa: E402
from engine import Engine, EngineConfig, SamplingParams
from analysis.block_size_sweep import block_size_sweep
from engine.observe.accounting import summarize
from analysis.length_replay import replay_trace
from analysis.workloads import WORKLOADS, run_trace, synthetic_trace

# vLLM paper Fig. 2 (OPT-13B, ShareGPT-like): share of KV memory holding token states
PAPER_TOKEN_SHARE = {"max": 20.4, "pow2": 26.8, "oracle": 38.2, "paged": 96.3}
# and the mean number of batched requests it reports for the same setup (vLLM vs Orca variants)
PAPER_BATCH = {"paged": 30.42, "oracle": 13.62, "pow2": 9.81, "max": 7.00}
CHECK_REQUESTS = 200         # each run checks the replay against the engine on this many


def engine_config(blocks: int, block_size: int, seed: int, max_model_len: int) -> EngineConfig:
    return EngineConfig(block_size=block_size, num_gpu_blocks=blocks, seed=seed, max_history=1,
                        max_model_len=max_model_len)


def serve(trace: pd.DataFrame, config: EngineConfig, max_model_len: int, engine: str,
          label: str | None = None) -> tuple[pd.DataFrame, int, int]:
    """(accounting frame, steps, preemptions) of the trace on the engine or the replay."""
    if engine == "replay":
        frame, info = replay_trace(trace, config, max_model_len=max_model_len)
        return frame, info["steps"], info["preemptions"]
    eng = Engine.length_only(config, max_model_len=max_model_len)
    steps = run_trace(eng, trace, on_step=Progress(label) if label else None)
    return eng.accounting_frame(), steps, eng.event_counts["preempt"]


def check_one(trace: pd.DataFrame, config: EngineConfig, max_model_len: int) -> dict:
    """The trace on the engine and on the replay: their sizes, or how they disagree."""
    want, steps, preempted = serve(trace, config, max_model_len, "engine")
    got, _, got_preempted = serve(trace, config, max_model_len, "replay")
    try:
        pd.testing.assert_frame_equal(got, want)
        assert got_preempted == preempted, f"{got_preempted} vs {preempted} preemptions"
    except AssertionError as exc:
        return {"error": str(exc)}
    return {"requests": len(trace), "steps": steps, "preemptions": preempted}


def start_check(traces: dict[str, pd.DataFrame], config: EngineConfig,
                max_model_len: int) -> Callable[[], dict]:
    """Check the replay against the engine on the first CHECK_REQUESTS requests of each trace.
    The first (longest) check runs in a forked process while this one replays the whole
    traces; the returned function runs the others, waits, prints the verdict and stops the
    run with an error unless every accounting row and the preemption count agree."""
    t0 = time.perf_counter()
    heads = {w: t.head(CHECK_REQUESTS) for w, t in traces.items()}
    forked = {}
    if "fork" in mp.get_all_start_methods():      # nothing to re-import in the child
        ctx = mp.get_context("fork")
        first = next(iter(heads))
        recv, send = ctx.Pipe(duplex=False)

        def child() -> None:
            try:
                send.send(check_one(heads[first], config, max_model_len))
            except BaseException as exc:          # reported by the parent
                send.send({"error": f"{type(exc).__name__}: {exc}"})

        proc = ctx.Process(target=child, daemon=True)
        proc.start()
        forked[first] = (proc, recv)

    def finish() -> dict:
        done = {w: check_one(h, config, max_model_len) for w, h in heads.items()
                if w not in forked}
        for w, (proc, recv) in forked.items():
            try:
                done[w] = recv.recv()
            except EOFError:
                done[w] = {"error": f"the check process died (exit code {proc.exitcode})"}
            proc.join()
        done = {w: done[w] for w in heads}
        for w, d in done.items():
            if "error" in d:
                raise SystemExit(f"replay check failed: the length replay and the engine on "
                                 f"the first {len(heads[w])} {w} requests:\n{d['error']}")
        seconds = time.perf_counter() - t0
        print("replay check: the engine and the length replay agree row for row on the first "
              + ", ".join(f"{d['requests']} {w} requests ({d['steps']} steps, "
                          f"{d['preemptions']} preemptions)" for w, d in done.items())
              + f" [{seconds:.1f} s]")
        return {"seconds": seconds, **done}
    return finish


def run(workload: str, trace: pd.DataFrame, config: EngineConfig, max_model_len: int,
        engine: str):
    t0 = time.perf_counter()
    frame, steps, preemptions = serve(trace, config, max_model_len, engine, label=workload)
    elapsed = time.perf_counter() - t0
    summary = summarize(frame)
    summary["paper_token_states_%"] = [PAPER_TOKEN_SHARE[a] for a in summary.index]
    summary.insert(0, "workload", workload)
    info = {"workload": workload, "requests": len(trace), "steps": steps, "seconds": elapsed,
            "kv_slots": config.num_gpu_blocks * config.block_size,
            "block_size": config.block_size, "engine": engine,
            "mean_prompt": float(trace.prompt_len.mean()), "mean_output": float(trace.output_len.mean()),
            "preemptions": preemptions}
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
    ap.add_argument("--engine", choices=("replay", "engine"), default="replay",
                    help="replay: the length replay, checked against the engine on the first "
                         f"{CHECK_REQUESTS} requests of each trace; engine: the engine throughout")
    ap.add_argument("--block-sizes", action="store_true",
                    help="also sweep block sizes 1..128 on the same traces (token-state share of "
                         "allocated KV, mean running requests)")
    args = ap.parse_args()
    # the length-only engine's tensors are tiny: a second intra-op thread only contends (on a
    # busy 2-core machine it made the engine several times slower)
    torch.set_num_threads(1)
    t_all = time.perf_counter()
    config = engine_config(args.blocks, args.block_size, args.seed, args.max_model_len)
    traces = {w: synthetic_trace(WORKLOADS[w], args.requests, rate_per_step=args.rate,
                                 seed=args.seed) for w in ("sharegpt", "alpaca")}
    finish_check = (start_check(traces, config, args.max_model_len)
                    if args.engine == "replay" else None)
    tables, infos = [], []
    for workload, trace in traces.items():
        summary, info = run(workload, trace, config, args.max_model_len, args.engine)
        tables.append(summary)
        infos.append(info)
    check = finish_check() if finish_check else None    # before anything is printed
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
    print(f"wall time for both traces: {time.perf_counter() - t_all:.1f} s"
          + (f" (including the replay check, {check['seconds']:.1f} s)" if check else ""))
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
        how = "length replay" if args.engine == "replay" else "length-only engine"
        print(f"\nblock-size sweep, same traces, KV budget {capacity} slots ({how})")
        for workload, trace in traces.items():
            requests = [(int(p), SamplingParams(max_tokens=int(o), ignore_eos=True))
                        for p, o in zip(trace.prompt_len, trace.output_len)]
            t0 = time.perf_counter()
            frame = block_size_sweep(requests, capacity, max_model_len=args.max_model_len,
                                     arrivals=[int(a) for a in trace.arrival_step],
                                     replay=args.engine == "replay")
            frame.insert(0, "workload", workload)
            sweeps[workload] = frame
            print(frame.to_string(index=False, formatters={
                "token_state_share": lambda v: f"{100 * v:6.1f}%",
                "mean_running_requests": lambda v: f"{v:7.1f}"}))
            print(f"({time.perf_counter() - t0:.1f} s)")
    write_results("waste", {"runs": infos, "replay_check": check,
                            "table": table.reset_index().to_dict(orient="records"),
                            "block_size_sweep": {w: f.to_dict(orient="records")
                                                 for w, f in sweeps.items()}}, table)


if __name__ == "__main__":
    main()
