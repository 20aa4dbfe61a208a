"""CPU time of one engine decode step (batch 1 and 8) and prefill time per token.

Prints a table (median and p90 over repeated steps) and writes JSON to bench/results/.
Usage: python bench/step_latency.py [--model default] [--block-size 16] [--steps 32]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine import Engine, EngineConfig, SamplingParams  # noqa: E402


def percentile(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def measure(model: str, batch: int, prompt_len: int, steps: int, block_size: int) -> dict:
    eng = Engine(EngineConfig(model=model, block_size=block_size, num_gpu_blocks=1024))
    vocab = eng.spec.vocab_size
    for i in range(batch):
        prompt = [(17 * i + 31 * j) % (vocab - 10) + 5 for j in range(prompt_len)]
        eng.add_request(prompt, SamplingParams(max_tokens=steps + 1, ignore_eos=True))
    t0 = time.perf_counter()
    first = eng.step()
    prefill_s = time.perf_counter() - t0
    assert first.kind == "prefill"
    decode = []
    for _ in range(steps):
        t0 = time.perf_counter()
        r = eng.step()
        decode.append(time.perf_counter() - t0)
        assert r.kind == "decode"
    return {"batch": batch, "prompt_len": prompt_len, "prefill_ms_per_token":
            1e3 * prefill_s / (batch * prompt_len), "decode_step_ms_median":
            1e3 * statistics.median(decode), "decode_step_ms_p90": 1e3 * percentile(decode, 0.9),
            "decode_tokens_per_s": batch / statistics.median(decode)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="default")
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--prompt-len", type=int, default=64)
    args = ap.parse_args()
    rows = [measure(args.model, b, args.prompt_len, args.steps, args.block_size) for b in (1, 8)]
    eng_label = Engine(EngineConfig(model=args.model)).backend_label
    print(f"model={args.model} backend={eng_label} block_size={args.block_size} "
          f"prompt_len={args.prompt_len} steps={args.steps}")
    print(f"{'batch':>5} {'decode median ms':>17} {'decode p90 ms':>14} {'tok/s':>8} "
          f"{'prefill ms/token':>17}")
    for r in rows:
        print(f"{r['batch']:>5} {r['decode_step_ms_median']:>17.2f} {r['decode_step_ms_p90']:>14.2f} "
              f"{r['decode_tokens_per_s']:>8.1f} {r['prefill_ms_per_token']:>17.3f}")
    out = Path(__file__).resolve().parent / "results" / "step_latency.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"model": args.model, "backend": eng_label, "rows": rows}, indent=2))
    print(f"wrote {out.relative_to(Path.cwd()) if out.is_relative_to(Path.cwd()) else out}")


if __name__ == "__main__":
    main()
