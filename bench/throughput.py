"""Engine output tokens/s vs transformers' generate, same model, same requests, same device.

Each round runs the same prompts (token ids) through our engine twice -- with observers off
(``EngineConfig(observe=False)``: plain generation, no snapshots or baselines) and on (what the
page runs: a snapshot and the contiguous baselines after every step) -- and through
transformers' generate (its own contiguous cache, one left-padded batch), interleaved so machine
noise hits all alike; every request generates exactly --max-tokens tokens (greedy, EOS
ignored). Also prints the engine's decode-step latency median / p90 (observers off).

Models: ``default`` (the embedded model), any local HF folder, or ``random-1b``: a random-weight
Llama with Llama-3.2-1B's shapes (2048 hidden, 16 layers, 32/8 heads, 128k vocabulary), built
from a config on the device and saved to a temporary folder (nothing is downloaded).

Usage: python bench/throughput.py [--model default random-1b] [--batch 1 8 64] [--max-tokens 64]
       [--rounds 3] [--device auto|cpu|cuda] [--dtype auto|float32|bfloat16] [--out FILE.json]
Writes bench/results/throughput.json (or --out).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):          # python bench/throughput.py: make the repo importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from bench.common import write_results  # noqa: E402
from engine import Engine, EngineConfig, SamplingParams  # noqa: E402
from engine.core.block_math import cdiv  # noqa: E402
from engine.models.loader import resolve_model_path  # noqa: E402

PROMPTS = ["ROMEO:\n", "JULIET:\nO Romeo, Romeo,", "HAMLET:\nTo be, or not to be:",
           "KING LEAR:\nBlow, winds,", "MACBETH:\nIs this a dagger", "PORTIA:\nThe quality of mercy",
           "OTHELLO:\nIt is the cause,", "PROSPERO:\nOur revels now are ended."]
RANDOM_1B = dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192,
                 num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
                 max_position_embeddings=4096, rope_theta=500000.0, tie_word_embeddings=True,
                 eos_token_id=None, bos_token_id=None, pad_token_id=None)


def build_random_1b(folder: Path, device: str) -> None:
    import transformers
    torch.manual_seed(0)
    with torch.device(device):
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**RANDOM_1B))
    model.to(torch.bfloat16).save_pretrained(str(folder))


def prompt_ids(model: str, path: str, batch: int) -> list[list[int]]:
    """The same prompts as token ids (random ids of the same lengths for a random model)."""
    lengths, ids = [], []
    from transformers import AutoTokenizer
    tok_path = path if model != "random-1b" else str(resolve_model_path("default"))
    tok = AutoTokenizer.from_pretrained(tok_path)
    for p in PROMPTS:
        ids.append(tok.encode(p, add_special_tokens=False))
        lengths.append(len(ids[-1]))
    if model == "random-1b":
        gen = torch.Generator().manual_seed(1)
        ids = [torch.randint(0, RANDOM_1B["vocab_size"], (n,), generator=gen).tolist()
               for n in lengths]
    return (ids * (batch // len(ids) + 1))[:batch]


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def run_engine(eng: Engine, prompts: list[list[int]], max_tokens: int) -> tuple[float, list[float]]:
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    for p in prompts:
        eng.add_request(p, params)
    steps = []
    sync(eng.device)
    t0 = time.perf_counter()
    while eng.has_unfinished_requests():
        r = eng.step()
        if r.kind == "decode":
            steps.append(r.step_time_s)
    sync(eng.device)
    return time.perf_counter() - t0, steps


def run_hf(model, prompts: list[list[int]], max_tokens: int, device: str, pad: int) -> float:
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
    sync(device)
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_tokens,
                             min_new_tokens=max_tokens, do_sample=False, pad_token_id=pad)
    sync(device)
    elapsed = time.perf_counter() - t0
    assert out.shape[1] - width == max_tokens
    return elapsed


def bench_model(model: str, args, device: str, dtype_name: str) -> list[dict]:
    from transformers import AutoModelForCausalLM

    tmp = None
    if model == "random-1b":
        tmp = tempfile.TemporaryDirectory(prefix="random-1b-")
        print(f"building a random Llama-3.2-1B-shaped model in {tmp.name} ...", flush=True)
        build_random_1b(Path(tmp.name), device)
        path = tmp.name
    else:
        path = str(resolve_model_path(model))
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype_name]
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()
    pad = 0
    total_tokens = max(len(p) for p in prompt_ids(model, path, 8)) + args.max_tokens
    blocks = max(args.batch) * cdiv(total_tokens, 16) + 64
    engines = {observe: Engine(EngineConfig(model=path, block_size=16, num_gpu_blocks=blocks,
                                            device=device, dtype=dtype_name, max_history=8,
                                            observe=observe))
               for observe in (False, True)}
    rows = []
    for batch in args.batch:
        prompts = prompt_ids(model, path, batch)
        for eng in engines.values():                     # warm-up: kernels compile / autotune
            run_engine(eng, prompts[:1], 2)
        run_hf(hf, prompts[:1], 2, device, pad)
        ours = {False: [], True: []}
        theirs, steps = [], []
        for _ in range(args.rounds):
            for observe, eng in engines.items():
                t, s = run_engine(eng, prompts, args.max_tokens)
                ours[observe].append(t)
                if not observe:
                    steps += s
            theirs.append(run_hf(hf, prompts, args.max_tokens, device, pad))
        tokens = batch * args.max_tokens
        row = {"model": model, "batch": batch,
               "engine_tok_s": tokens / statistics.median(ours[False]),
               "engine_observed_tok_s": tokens / statistics.median(ours[True]),
               "transformers_tok_s": tokens / statistics.median(theirs),
               "step_ms_median": 1e3 * statistics.median(steps),
               "step_ms_p90": 1e3 * sorted(steps)[int(0.9 * (len(steps) - 1))],
               "backend": engines[False].backend_label, "dtype": dtype_name}
        row["ratio"] = row["engine_tok_s"] / row["transformers_tok_s"]
        row["observed_ratio"] = row["engine_observed_tok_s"] / row["transformers_tok_s"]
        rows.append(row)
        print(f"{model:>10} {batch:>5} {row['engine_tok_s']:>13.1f} "
              f"{row['engine_observed_tok_s']:>14.1f} {row['transformers_tok_s']:>19.1f} "
              f"{row['ratio']:>6.2f} {row['observed_ratio']:>9.2f} "
              f"{row['step_ms_median']:>15.2f} {row['step_ms_p90']:>12.2f}", flush=True)
    del engines, hf
    if tmp is not None:
        tmp.cleanup()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", nargs="+", default=["default"])
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    device = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        print("bench/throughput.py: skipped (CUDA not available)")
        return
    dtype = args.dtype if args.dtype != "auto" else ("bfloat16" if device.startswith("cuda") else "float32")
    name = torch.cuda.get_device_name(0) if device.startswith("cuda") else "cpu"
    print(f"device={name} dtype={dtype} threads={torch.get_num_threads()} "
          f"max_tokens={args.max_tokens} rounds={args.rounds} (interleaved)")
    print(f"{'model':>10} {'batch':>5} {'engine tok/s':>13} {'observed tok/s':>14} "
          f"{'transformers tok/s':>19} {'ratio':>6} {'obs ratio':>9} {'step ms median':>15} "
          f"{'step ms p90':>12}")
    rows = []
    for model in args.model:
        rows += bench_model(model, args, device, dtype)
    payload = {"device": name, "dtype": dtype, "torch": torch.__version__,
               "max_tokens": args.max_tokens, "rounds": args.rounds, "rows": rows}
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(payload, indent=2))
        print(f"wrote {args.out}")
    else:
        write_results("throughput", payload)


if __name__ == "__main__":
    main()
