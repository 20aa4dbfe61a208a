"""Engine output tokens/s vs transformers' generate, same model, same requests, one run.

Each round runs the same prompts through our engine (paged KV cache, continuous batching)
and through transformers' generate (its own contiguous cache, one padded batch), interleaved
so machine noise hits both alike; every request generates exactly --max-tokens tokens in both.
Also prints the engine's decode-step latency median / p90. Writes bench/results/engine.json.

Usage: python bench/engine.py [--model default] [--batch 1 8] [--max-tokens 64] [--rounds 3]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from common import write_results  # noqa: F401  (sets sys.path)
from engine import Engine, EngineConfig, SamplingParams
from engine.models.loader import resolve_model_path

PROMPTS = ["ROMEO:\n", "JULIET:\nO Romeo, Romeo,", "HAMLET:\nTo be, or not to be:",
           "KING LEAR:\nBlow, winds,", "MACBETH:\nIs this a dagger", "PORTIA:\nThe quality of mercy",
           "OTHELLO:\nIt is the cause,", "PROSPERO:\nOur revels now are ended."]


def run_engine(eng: Engine, prompts: list[str], max_tokens: int) -> tuple[float, list[float]]:
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    for p in prompts:
        eng.add_request(p, params)
    steps = []
    t0 = time.perf_counter()
    while eng.has_unfinished_requests():
        r = eng.step()
        if r.kind == "decode":
            steps.append(r.snapshot.step_time_s)
    return time.perf_counter() - t0, steps


def run_hf(model, tok, prompts: list[str], max_tokens: int) -> float:
    enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(**enc, max_new_tokens=max_tokens, min_new_tokens=max_tokens,
                             do_sample=False, pad_token_id=tok.pad_token_id)
    elapsed = time.perf_counter() - t0
    assert out.shape[1] - enc["input_ids"].shape[1] == max_tokens
    return elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="default")
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = str(resolve_model_path(args.model))
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(path)
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    eng = Engine(EngineConfig(model=args.model, block_size=16, num_gpu_blocks=512))
    rows = []
    for batch in args.batch:
        prompts = (PROMPTS * (batch // len(PROMPTS) + 1))[:batch]
        ours, theirs, steps = [], [], []
        for _ in range(args.rounds):
            t, s = run_engine(eng, prompts, args.max_tokens)
            ours.append(t)
            steps += s
            theirs.append(run_hf(hf, tok, prompts, args.max_tokens))
        tokens = batch * args.max_tokens
        row = {"batch": batch, "engine_tok_s": tokens / statistics.median(ours),
               "transformers_tok_s": tokens / statistics.median(theirs),
               "step_ms_median": 1e3 * statistics.median(steps),
               "step_ms_p90": 1e3 * sorted(steps)[int(0.9 * (len(steps) - 1))]}
        row["ratio"] = row["engine_tok_s"] / row["transformers_tok_s"]
        rows.append(row)
    print(f"model={args.model} backend={eng.backend_label} threads={torch.get_num_threads()} "
          f"max_tokens={args.max_tokens} rounds={args.rounds} (interleaved)")
    print(f"{'batch':>5} {'engine tok/s':>13} {'transformers tok/s':>19} {'ratio':>6} "
          f"{'step ms median':>15} {'step ms p90':>12}")
    for r in rows:
        print(f"{r['batch']:>5} {r['engine_tok_s']:>13.1f} {r['transformers_tok_s']:>19.1f} "
              f"{r['ratio']:>6.2f} {r['step_ms_median']:>15.2f} {r['step_ms_p90']:>12.2f}")
    write_results("engine", {"model": args.model, "backend": eng.backend_label, "rows": rows})


if __name__ == "__main__":
    main()
