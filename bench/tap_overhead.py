"""What the scheduler tap (real_vllm/tap/scheduler.py) costs a real vLLM: tokens/s with and
without it, side by side in one run, the tap's own time per engine step, and the frame sizes.

One in-process vLLM (CPU build, the default model, ``scheduler_cls=TapScheduler``) serves
batches of 1, 32 and 256 requests; each repetition runs the batch with the tap on and with it
off (the tap object detached: vLLM's scheduler plus one attribute check per phase), the order
alternating, so machine noise falls on both alike. A subscriber in another process reads every
frame over TCP on 127.0.0.1 (the Watch tab's place). "tap ms/step": time inside the tap's two
emits per step (schedule + update), measured in the engine thread.

    python bench/tap_overhead.py [--reps 3] [--pool 16384]

Needs vLLM (the CPU build: the environment `bash deploy/install.sh --vllm` makes);
writes bench/results/tap_overhead.json.
"""
from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

if __package__ in (None, ""):          # python bench/tap_overhead.py: make the repo importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import ROOT, write_results  # noqa: E402

BATCHES = (1, 32, 256)
PROMPT_TOKENS, MAX_TOKENS = 32, 64
BLOCKS_PER_GIB = 16384            # the default model's blocks of 32 tokens per GiB (vLLM's log)

SUBSCRIBER = r"""
import sys, zmq
sys.path.insert(0, sys.argv[2])
from real_vllm.tap.frames import TapOff, decode
s = zmq.Context.instance().socket(zmq.SUB)
s.setsockopt(zmq.RCVHWM, 0); s.connect(sys.argv[1]); s.subscribe(b"")
n = nbytes = 0
while True:
    parts = s.recv_multipart()
    n += 1; nbytes += len(parts[2])
    if len(parts[2]) < 512 and isinstance(decode(parts[2]), TapOff):   # cheap: frames skip
        break
print(n, nbytes, flush=True)
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_batch(llm, sched, tap, batch: int, on: bool, tag: str) -> dict:
    from vllm import SamplingParams
    sched._tap = tap if on else None
    tap.tap_s, tap.frames_sent = 0.0, 0
    tap.sizes = {"keyframe": [0, 0, 0], "delta": [0, 0, 0]}
    tap.force_keyframe = True            # each run: a keyframe of this batch (sizes)
    params = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True, temperature=0)
    for i in range(batch):
        prompt = [300 + (7 * i + 13 * j) % 3700 for j in range(PROMPT_TOKENS)]
        llm.add_request(f"{tag}-{i}", {"prompt_token_ids": prompt}, params)
    steps, tokens = 0, 0
    t0, c0 = time.perf_counter(), time.process_time()
    while llm.has_unfinished_requests():
        for ro in llm.step():
            if ro.finished:
                tokens += len(ro.outputs[0].token_ids)
        steps += 1
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    sched._tap = tap
    # tokens per CPU second of this process (ZeroMQ's I/O thread included): what the tap
    # costs in work, much less moved by other processes' load than wall time
    return {"tok_s": tokens / wall, "tok_cpu_s": tokens / cpu, "steps": steps, "wall_s": wall,
            "tap_ms_per_step": 1000 * tap.tap_s / steps if on else 0.0,
            "sizes": {k: list(v) for k, v in tap.sizes.items()} if on else None}


def probe_keyframe(tap, sched) -> dict:
    """One keyframe and one delta of the pool as it is (time, bytes), built by the tap."""
    out = {}
    for kind in ("keyframe", "delta"):
        tap.force_keyframe = kind == "keyframe"
        tap.last_keyframe = time.time() if kind == "delta" else float("-inf")
        t0 = time.perf_counter()
        tap.emit("update", tap.step, {})
        out[kind] = {"ms": 1000 * (time.perf_counter() - t0), "bytes": tap.pub.last_size}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--sender", choices=("thread", "direct"), default="thread",
                    help="the publisher's mode (PAGED_LAB_TAP_SENDER)")
    ap.add_argument("--pool", type=int, default=BLOCKS_PER_GIB, help="blocks (null included)")
    args = ap.parse_args()
    port = free_port()
    endpoint = f"tcp://127.0.0.1:{port}"
    os.environ.update(VLLM_ENABLE_V1_MULTIPROCESSING="0", PAGED_LAB_TAP_ENDPOINT=endpoint,
                      PAGED_LAB_TAP_SENDER=args.sender,
                      VLLM_CPU_KVCACHE_SPACE=str(max(1, -(-args.pool // BLOCKS_PER_GIB))))
    import vllm
    from vllm import EngineArgs, LLMEngine
    llm = LLMEngine.from_engine_args(EngineArgs(
        model=str(ROOT / "assets" / "default-model"), block_size=32,
        num_gpu_blocks_override=args.pool, max_model_len=1024, max_num_seqs=256,
        max_num_batched_tokens=max(8192, 256 * PROMPT_TOKENS), dtype="float32",
        enforce_eager=True, seed=0, scheduler_cls="real_vllm.tap.scheduler.TapScheduler"))
    sched = llm.engine_core.engine_core.scheduler
    tap = sched._tap
    assert tap is not None, "the tap did not start (see the log above)"
    sub = subprocess.Popen([sys.executable, "-c", SUBSCRIBER, endpoint, str(ROOT)],
                           stdout=subprocess.PIPE, text=True)
    time.sleep(1.0)
    run_batch(llm, sched, tap, 8, True, "warm")              # warm-up, both paths
    run_batch(llm, sched, tap, 8, False, "warm2")
    rows, raw = [], {}
    for batch in BATCHES:
        runs = {True: [], False: []}
        for rep in range(args.reps):
            for on in ((True, False) if rep % 2 == 0 else (False, True)):
                runs[on].append(run_batch(llm, sched, tap, batch, on, f"b{batch}r{rep}{on}"))
        raw[batch] = {"on": runs[True], "off": runs[False]}
        best_on = max(r["tok_s"] for r in runs[True])
        best_off = max(r["tok_s"] for r in runs[False])
        med_on = statistics.median(r["tok_s"] for r in runs[True])
        med_off = statistics.median(r["tok_s"] for r in runs[False])
        cpu_on = statistics.median(r["tok_cpu_s"] for r in runs[True])
        cpu_off = statistics.median(r["tok_cpu_s"] for r in runs[False])
        tap_ms = statistics.median(r["tap_ms_per_step"] for r in runs[True])
        step_ms = statistics.median(1000 * r["wall_s"] / r["steps"] for r in runs[False])
        sizes = runs[True][-1]["sizes"]
        rows.append({"batch": batch, "tok_s_off": best_off, "tok_s_on": best_on,
                     "loss_best_pct": 100 * (1 - best_on / best_off),
                     "loss_median_pct": 100 * (1 - med_on / med_off),
                     "tok_cpu_s_off": cpu_off, "tok_cpu_s_on": cpu_on,
                     "loss_cpu_pct": 100 * (1 - cpu_on / cpu_off),
                     "step_ms_off": step_ms, "tap_ms_per_step": tap_ms,
                     "tap_pct_of_step": 100 * tap_ms / step_ms,
                     "keyframe_bytes_max": sizes["keyframe"][2],
                     "delta_bytes_mean": sizes["delta"][1] / max(1, sizes["delta"][0]),
                     "delta_bytes_max": sizes["delta"][2],
                     "frames": sizes["keyframe"][0] + sizes["delta"][0],
                     "keyframes": sizes["keyframe"][0]})
    # the pool's cost alone: a keyframe scans every block, a delta only the touched ones;
    # measured with 256 requests held mid-run
    from vllm import SamplingParams
    params = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True, temperature=0)
    for i in range(256):
        llm.add_request(f"probe-{i}", {"prompt_token_ids": [400 + (i * 5 + j) % 3000
                                                             for j in range(PROMPT_TOKENS)]},
                        params)
    for _ in range(20):
        llm.step()
    probe = probe_keyframe(tap, sched)
    while llm.has_unfinished_requests():
        llm.step()
    from real_vllm.tap.frames import TapOff
    tap.pub.publish(TapOff(reason="bench done"))
    tap.pub.flush()
    try:
        got = sub.communicate(timeout=20)[0].split()
    except subprocess.TimeoutExpired:
        sub.kill()
        got = []
    published = tap.pub.published
    llm.engine_core.shutdown()

    print(f"\nvLLM {vllm.__version__} CPU, default model, pool {args.pool} blocks of 32, "
          f"publisher {args.sender}, "
          f"prompt {PROMPT_TOKENS} + {MAX_TOKENS} tokens, best of {args.reps}")
    head = (f"{'batch':>5} {'tok/s off':>10} {'tok/s on':>9} {'loss best':>9} {'loss med':>8} "
            f"{'loss CPU':>8} {'step ms':>8} {'tap ms/step':>11} {'tap %':>6} {'keyframe B':>10} "
            f"{'delta B mean/max':>17}")
    print(head)
    for r in rows:
        print(f"{r['batch']:>5} {r['tok_s_off']:>10.0f} {r['tok_s_on']:>9.0f} "
              f"{r['loss_best_pct']:>8.1f}% {r['loss_median_pct']:>7.1f}% "
              f"{r['loss_cpu_pct']:>7.1f}% "
              f"{r['step_ms_off']:>8.2f} {r['tap_ms_per_step']:>11.3f} "
              f"{r['tap_pct_of_step']:>5.1f}% {r['keyframe_bytes_max']:>10} "
              f"{r['delta_bytes_mean']:>8.0f}/{r['delta_bytes_max']:<8}")
    print(f"pool {args.pool} blocks, 256 requests held: keyframe {probe['keyframe']['ms']:.2f} ms "
          f"{probe['keyframe']['bytes']} B, delta {probe['delta']['ms']:.3f} ms "
          f"{probe['delta']['bytes']} B")
    print(f"subscriber received {got[0] if got else '?'} of {published} messages "
          f"({got[1] if got else '?'} payload bytes); publisher dropped {tap.pub.dropped}")
    write_results("tap_overhead" if args.sender == "thread" else "tap_overhead_direct", {
        "vllm": vllm.__version__, "pool_blocks": args.pool, "sender": args.sender,
        "reps": args.reps,
        "prompt_tokens": PROMPT_TOKENS, "max_tokens": MAX_TOKENS, "rows": rows,
        "probe_256_held": probe, "raw": {str(k): v for k, v in raw.items()},
        "subscriber_messages": int(got[0]) if got else None, "published": published,
        "dropped": tap.pub.dropped})


if __name__ == "__main__":
    main()
