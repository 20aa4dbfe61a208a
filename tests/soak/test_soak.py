"""Soak: the differential test of tests/engine/test_differential.py, at scale (not in CI:
marked ``soak``, which tests/conftest.py deselects unless ``-m`` names it).

Many random programs of operations (a burst of arrivals, then a random mix of "add a request",
"step" and "abort a live request"; requests are greedy, seeded sampling with n = 1..4 and
temperature > 0, or beam search with width 2-3; prompts share prefixes) run in lockstep on
several engines. After every step and every abort each engine's ``check_invariants()`` runs;
after the program every engine is stepped until idle and must have leaked nothing (every GPU and
CPU block free). Two kinds of programs:

``model`` (a tiny random-weight Llama built from a config into a temp folder, float32 on the
CPU, nothing downloaded): a *roomy* engine (pool above the worst case of all requests together,
no prefix caching; it must never preempt) and a *small* one (pool a few blocks above the largest
single request, prefix caching, preemption by recompute or swap, its own block size). Outputs
must be equal: token ids, finish reasons and cumulative logprobs (to 1e-4) of every completion
of every non-aborted request. Wrong K/V bytes anywhere (CoW, fork, prefix hit, swap, recompute,
slot mapping) change the logits, so this checks cache *contents*, not only bookkeeping.

``length-only`` (``Engine.length_only``: the real block manager, scheduler, sampler and beam
search; no model). Its built-in runner draws the logits of the *whole batch* from one generator
seeded by ``EngineConfig.seed`` (``torch.rand(len(batch.seqs), vocab)``), so a sequence's
logits depend on which other sequences share its step and on how many steps ran before: two
engines with the same config and the same program give identical outputs (checked here, events
included), but a different pool (which batches differently, preempts, recomputes) legitimately
gives different tokens, so roomy-vs-small outputs are *not* comparable with that runner (the
``builtin differ`` column counts how many requests differ: informational, not an error). To
still compare outputs soundly across pools, the roomy and small length-only engines get a
content-addressed runner instead (``ContentRunner``: each row's logits are seeded by a hash of
that sequence's own token ids), which makes each sequence's next-token distribution a function
of its own history, as a real model's is; then preemption, swap, prefix caching, forks and beam
bookkeeping must not change any token. So per length-only program five engines run: roomy and
small with content logits (outputs compared), two identical small engines with the built-in
runner (compared exactly: determinism), and a roomy one with the built-in runner (differences
counted only).

Aborts: "abort" picks a request unfinished in *every* engine of the program and aborts it in all.
Since a small pool may be behind, the abort can land at different generation points, so aborted
requests are not compared for equality across pools; a non-beam aborted request's partial
outputs must still be prefix-consistent (one run's tokens a prefix of the other's, per
completion). Twin engines (identical configs) are compared on everything, aborted ones too.
A request the small pool rejects (could never fit) is skipped in every engine.

Usage: python -m pytest -m soak tests/soak     (about 160 s on 2 cores with the defaults)
It prints its table (and a progress bar) whatever pytest captures, and fails listing the first
failures. Settings, from the environment (defaults in brackets):
  SOAK_PROGRAMS [300]        length-only programs
  SOAK_MODEL_PROGRAMS [600]  tiny-Llama programs
  SOAK_OPS [40]              mean operations per program
  SOAK_SEED [0]
  SOAK_DEVICE [cpu]          the tiny Llama's device (cpu: float32)
  SOAK_OBSERVE [0]           1: keep snapshots/baselines on (slower; off where supported)
  SOAK_REPLAY [-]            KIND:INDEX: run that one program, print its operations
  SOAK_PROGRESS [1]          0: no progress bar
  SOAK_OUT [-]               FILE.json: also write the summary (counts, failures) there
Program ``i`` of a kind is generated from (seed, kind, i) alone, so a failure the test lists is
rerun with ``SOAK_SEED=S SOAK_REPLAY=KIND:I python -m pytest -m soak tests/soak``.
"""
from __future__ import annotations

import json
import math
import os
import random
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import torch

from engine import Engine, EngineConfig, SamplingParams
from engine.core.block_math import cdiv

try:                                   # optional: a progress bar
    from tqdm import tqdm
except ImportError:                    # pragma: no cover
    tqdm = None

pytestmark = pytest.mark.soak

BLOCK_SIZES = [1, 2, 4, 8, 16]
PROFILES = {   # vocabulary, longest prompt, largest max_tokens, model context
    "length-only": dict(vocab=64, max_prompt=40, max_tokens=24, max_model_len=128),
    "model": dict(vocab=96, max_prompt=24, max_tokens=12, max_model_len=256),
}
TINY_LLAMA = dict(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                  eos_token_id=3, bos_token_id=None, pad_token_id=None, initializer_range=0.1)
MAX_DRAIN_STEPS = 5000


# ---- programs ----------------------------------------------------------------------------
def random_request(rng: random.Random, prof: dict, bases: list[list[int]]):
    keep = rng.randint(0, prof["max_prompt"])
    tail = [rng.randrange(prof["vocab"]) for _ in range(rng.randint(0, 6))]
    prompt = (rng.choice(bases)[:keep] + tail)[:prof["max_prompt"]] or [5]
    kind = rng.choice(["greedy", "greedy", "sample", "n", "n", "beam", "beam"])
    kw = dict(max_tokens=rng.randint(1, prof["max_tokens"]), ignore_eos=rng.random() < 0.5)
    seed = rng.randrange(2 ** 31)
    if kind == "sample":
        kw.update(temperature=rng.choice([0.5, 0.8, 1.0, 1.3]), seed=seed,
                  top_k=rng.choice([-1, 8]), top_p=rng.choice([1.0, 0.9]))
    elif kind == "n":
        kw.update(n=rng.randint(2, 4), temperature=rng.choice([0.7, 1.0]), seed=seed,
                  top_p=rng.choice([1.0, 0.9]))
    elif kind == "beam":
        kw.update(beam_width=rng.randint(2, 3), length_penalty=rng.choice([1.0, 0.5]),
                  early_stopping=rng.choice([False, True, "never"]))
    return prompt, SamplingParams(**kw)


def random_program(seed: int, kind: str, index: int, num_ops: int) -> dict:
    """Program ``index`` of ``kind``: pool settings and a list of atomic operations."""
    rng = random.Random(f"{seed}:{kind}:{index}")
    prof = PROFILES[kind]
    bases = [[rng.randrange(4, prof["vocab"]) for _ in range(prof["max_prompt"])] for _ in range(3)]
    n = rng.randint(max(4, num_ops // 2), max(4, 3 * num_ops // 2))
    burst = rng.randint(2, 5)
    ops = [("add", random_request(rng, prof, bases)) for _ in range(burst)]
    while len(ops) < n:
        r = rng.random()
        if r < 0.3:
            ops.append(("add", random_request(rng, prof, bases)))
        elif r < 0.9:
            ops.append(("step", None))
        else:
            ops.append(("abort", rng.randrange(1000)))
    return dict(kind=kind, index=index, roomy_bs=rng.choice(BLOCK_SIZES),
                small_bs=rng.choice(BLOCK_SIZES), mode=rng.choice(["recompute", "swap"]),
                slack=rng.randint(0, 3), engine_seed=rng.randrange(1000), ops=ops)


def worst_case_blocks(prompt_len: int, params: SamplingParams, block_size: int) -> int:
    """The worst-case rule (docs/architecture.md#a-request-fits, Engine.blocks_needed_worst_case): the last sampled token's K/V is never
    written, so a sequence holds at most ceil((prompt + max_tokens - 1) / block_size) blocks."""
    shared = prompt_len // block_size
    per_seq = cdiv(prompt_len + params.max_tokens - 1, block_size) - shared
    return shared + params.width * per_seq


# ---- engines -----------------------------------------------------------------------------
class ContentRunner:
    """Length-only logits that depend only on each sequence's own token ids (and a seed)."""
    bytes_per_block = 0

    def __init__(self, vocab_size: int, seed: int):
        self.vocab_size = vocab_size
        self.seed = seed
        self.generator = torch.Generator()

    def execute(self, batch) -> torch.Tensor:
        out = torch.empty(len(batch.seqs), self.vocab_size)
        for i, s in enumerate(batch.seqs):
            h = hash((self.seed, tuple(s.token_ids))) & (2 ** 63 - 1)   # ints: not salted
            out[i] = torch.rand(self.vocab_size, generator=self.generator.manual_seed(h))
        return out


def engine_config(prog: dict, role: str, need: dict, observe: bool, **kw) -> EngineConfig:
    small = role == "small"
    bs = prog["small_bs" if small else "roomy_bs"]
    cfg = dict(block_size=bs, seed=prog["engine_seed"], **kw)
    if "observe" in EngineConfig.__dataclass_fields__:
        cfg["observe"] = observe
    if small:
        cfg.update(num_gpu_blocks=need["small"] + prog["slack"], enable_prefix_caching=True,
                   preemption_mode=prog["mode"],
                   num_cpu_blocks=need["small"] + 4 if prog["mode"] == "swap" else 0)
    else:
        cfg.update(num_gpu_blocks=need["roomy"])
    return EngineConfig(**cfg)


def build_engines(prog: dict, model: str | None, device: str, observe: bool) -> dict:
    """role -> Engine. Roles: roomy, small (compared); twin_a, twin_b (identical; compared
    exactly); roomy_builtin (length-only only; differences vs twin_a counted, not errors)."""
    reqs = [arg for op, arg in prog["ops"] if op == "add"]
    need = {"roomy": sum(worst_case_blocks(len(p), sp, prog["roomy_bs"]) for p, sp in reqs) + 2,
            "small": max(worst_case_blocks(len(p), sp, prog["small_bs"]) for p, sp in reqs)}
    if model is not None:
        kw = dict(model=model, device=device, dtype="float32")
        return {role: Engine(engine_config(prog, role, need, observe, **kw))
                for role in ("roomy", "small")}
    prof = PROFILES["length-only"]

    def length_only(role: str, content: bool) -> Engine:
        cfg = engine_config(prog, "small" if role.startswith(("small", "twin")) else "roomy",
                            need, observe)
        eng = Engine.length_only(cfg, max_model_len=prof["max_model_len"], vocab_size=prof["vocab"])
        if content:
            eng.runner = ContentRunner(prof["vocab"], prog["engine_seed"])
        return eng
    return {"roomy": length_only("roomy", True), "small": length_only("small", True),
            "twin_a": length_only("twin", False), "twin_b": length_only("twin", False),
            "roomy_builtin": length_only("roomy", False)}


# ---- one program -------------------------------------------------------------------------
class Abandon(Exception):
    """An engine failed a check mid-program: stop this program (its state is suspect)."""


def outputs_of(eng: Engine, rid: str):
    out = eng.get_output(rid)
    return [(c.token_ids, c.finish_reason, c.cumulative_logprob) for c in out.outputs]


def same_outputs(a, b, exact: bool) -> bool:
    if [(t, r) for t, r, _ in a] != [(t, r) for t, r, _ in b]:
        return False
    if exact:
        return [lp for *_, lp in a] == [lp for *_, lp in b]
    return all(math.isclose(x, y, rel_tol=1e-4, abs_tol=1e-4) for (*_, x), (*_, y) in zip(a, b))


def prefix_consistent(a, b) -> bool:
    if len(a) != len(b):        # n > 1 aborted before its first token in one run
        short = a if len(a) < len(b) else b
        return len(short) == 1 and not short[0][0]
    for (x, *_), (y, *_) in zip(a, b):
        n = min(len(x), len(y))
        if x[:n] != y[:n]:
            return False
    return True


def run_program(prog: dict, model: str | None, device: str, observe: bool) -> tuple[Counter, list]:
    stats: Counter = Counter(programs=1)
    failures: list[dict] = []
    engines = build_engines(prog, model, device, observe)
    events = {role: [] for role in engines}       # twins: every step's events, compared
    added: list[str] = []
    beams: dict[str, bool] = {}
    aborted: set[str] = set()

    def fail(what: str, detail: str, count: int = 1) -> None:
        stats[what] += count
        failures.append(dict(kind=prog["kind"], index=prog["index"], what=what, detail=detail[:500]))

    def checked(role: str, eng: Engine, label: str) -> None:
        try:
            eng.check_invariants()
        except AssertionError as e:
            fail("invariant violations", f"{role} after {label}: {e}")
            raise Abandon from e

    def step(role: str, eng: Engine) -> None:
        try:
            result = eng.step()
        except Exception as e:              # noqa: BLE001 - a soak counts every failure
            fail("errors", f"{role} step: {type(e).__name__}: {e}")
            raise Abandon from e
        stats["steps"] += 1
        kinds = Counter(e.kind for e in result.events)
        if role == "small":
            stats["preemptions"] += kinds["preempt"]
            stats["swap outs"] += kinds["swap_out"]
            stats["prefix hits"] += kinds["prefix_hit"]
            stats["cow copies"] += kinds["cow"]
        if role == "roomy" and kinds["preempt"]:
            fail("errors", "the roomy engine preempted (its pool is not roomy)")
            raise Abandon
        if role.startswith("twin"):
            events[role].append([e.to_dict() for e in result.events])
        checked(role, eng, f"step {eng.step_no}")

    try:
        for op, arg in prog["ops"]:
            stats["operations"] += 1
            if op == "add":
                prompt, params = arg
                try:
                    engines["small"].check_request(prompt, params)
                except ValueError:
                    stats["rejected (skipped)"] += 1
                    continue
                rid = str(len(added))
                for eng in engines.values():
                    eng.add_request(prompt, params, request_id=rid)
                added.append(rid)
                beams[rid] = params.use_beam_search
                stats["requests"] += 1
            elif op == "step":
                for role, eng in engines.items():
                    if eng.has_unfinished_requests():
                        step(role, eng)
            else:
                live = [r for r in added
                        if not any(e.get_output(r).finished for e in engines.values())]
                if live:
                    rid = live[arg % len(live)]
                    for role, eng in engines.items():
                        eng.abort_request(rid)
                        checked(role, eng, f"abort {rid}")
                    aborted.add(rid)
                    stats["aborts"] += 1
        for role, eng in engines.items():
            for _ in range(MAX_DRAIN_STEPS):
                if not eng.has_unfinished_requests():
                    break
                step(role, eng)
            if eng.has_unfinished_requests():
                fail("errors", f"{role}: no progress in {MAX_DRAIN_STEPS} steps")
                raise Abandon
            leaked = (eng.bm.gpu.num_blocks - eng.bm.gpu.num_free
                      + eng.bm.cpu.num_blocks - eng.bm.cpu.num_free)
            if leaked:
                fail("leaked blocks", f"{role}: {leaked} blocks not free at the end", leaked)
    except Abandon:
        stats["abandoned programs"] += 1
        return stats, failures

    exact = model is None
    for rid in added:
        a, b = outputs_of(engines["roomy"], rid), outputs_of(engines["small"], rid)
        if rid in aborted:
            if not beams[rid] and not prefix_consistent(a, b):
                fail("output mismatches", f"aborted request {rid}: roomy {a} vs small {b}")
        elif not same_outputs(a, b, exact):
            fail("output mismatches", f"request {rid}: roomy {a} vs small {b}")
        if "twin_a" in engines:
            ta, tb = outputs_of(engines["twin_a"], rid), outputs_of(engines["twin_b"], rid)
            if ta != tb:
                fail("determinism mismatches", f"request {rid}: twin {ta} vs twin {tb}")
            if rid not in aborted and not same_outputs(ta, outputs_of(engines["roomy_builtin"], rid),
                                                       True):
                stats["builtin differ"] += 1
    if "twin_a" in engines and events["twin_a"] != events["twin_b"]:
        fail("determinism mismatches", "twin engines' event streams differ")
    return stats, failures


# ---- driver ------------------------------------------------------------------------------
def build_tiny_llama(path: str, seed: int) -> str:
    import transformers

    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**TINY_LLAMA)).eval()
    model.save_pretrained(path)
    return path


COLUMNS = ["programs", "steps", "operations", "invariant violations", "leaked blocks",
           "output mismatches", "determinism mismatches", "errors"]
INFO = ["requests", "rejected (skipped)", "aborts", "preemptions", "swap outs", "prefix hits",
        "cow copies", "builtin differ", "abandoned programs"]


def print_table(per_kind: dict[str, Counter], walls: dict[str, float]) -> None:
    kinds = list(per_kind)
    total = sum(per_kind.values(), Counter())
    rows = [(k, per_kind[k], walls[k]) for k in kinds] + [("total", total, sum(walls.values()))]
    head = ["", *COLUMNS, "wall s"]
    table = [[name, *(str(c[col]) for col in COLUMNS), f"{w:.1f}"] for name, c, w in rows]
    widths = [max(len(str(r[i])) for r in [head] + table) for i in range(len(head))]
    for r in [head] + table:
        print("  ".join(str(x).rjust(w) for x, w in zip(r, widths)))
    print("coverage: " + ", ".join(f"{k} {total[k]}" for k in INFO))


def settings() -> dict:
    """The soak's settings from the environment (see the module docstring)."""
    env = os.environ.get
    return dict(programs=int(env("SOAK_PROGRAMS", "300")),
                model_programs=int(env("SOAK_MODEL_PROGRAMS", "600")),
                ops=int(env("SOAK_OPS", "40")), seed=int(env("SOAK_SEED", "0")),
                device=env("SOAK_DEVICE", "cpu"), observe=env("SOAK_OBSERVE", "0") == "1",
                replay=env("SOAK_REPLAY") or None, progress=env("SOAK_PROGRESS", "1") != "0",
                out=env("SOAK_OUT") or None)


def run_soak(args: dict, tmp: Path) -> dict:
    """Every program of the plan; prints the table; returns the summary (as the JSON holds)."""
    plan = [("length-only", i) for i in range(args["programs"])]
    plan += [("model", i) for i in range(args["model_programs"])]
    if args["replay"]:
        kind, _, index = args["replay"].partition(":")
        plan = [(kind, int(index))]
    per_kind = {k: Counter() for k in dict.fromkeys(k for k, _ in plan)}
    walls = dict.fromkeys(per_kind, 0.0)
    failures: list[dict] = []
    t_all = time.perf_counter()
    model = build_tiny_llama(str(tmp), args["seed"]) if "model" in per_kind else None
    bar = None
    if tqdm is not None and args["progress"]:
        bar = tqdm(total=len(plan), unit="program", file=sys.stderr)
    for n, (kind, i) in enumerate(plan, 1):
        prog = random_program(args["seed"], kind, i, args["ops"])
        if args["replay"]:
            for op in prog["ops"]:
                print(op)
        t0 = time.perf_counter()
        stats, fails = run_program(prog, model if kind == "model" else None, args["device"],
                                   args["observe"])
        walls[kind] += time.perf_counter() - t0
        per_kind[kind] += stats
        failures += fails
        if bar is not None:
            bar.update()
            bar.set_postfix(kind=kind, failures=len(failures), refresh=False)
        elif args["progress"] and (n % 20 == 0 or n == len(plan)):
            print(f"\rsoak: {n}/{len(plan)} programs, {len(failures)} failures", end="",
                  file=sys.stderr, flush=True)
    if bar is not None:
        bar.close()
    elif args["progress"]:
        print(file=sys.stderr)
    wall = time.perf_counter() - t_all
    print_table(per_kind, walls)
    for f in failures[:10]:
        print(f"FAIL {f['kind']}:{f['index']} {f['what']}: {f['detail']}")
    total = sum(per_kind.values(), Counter())
    return dict(args=args, wall_s=wall, per_kind={k: dict(c) for k, c in per_kind.items()},
                total=dict(total), failures=failures[:100], num_failures=len(failures),
                ok=not failures)


def test_soak(tmp_path, capsys):
    """Every program: no invariant violation, no leaked block, no output or determinism
    mismatch, no error (a failure lists its program: rerun it with SOAK_REPLAY)."""
    args = settings()
    threads = torch.get_num_threads()
    # tiny tensors: one intra-op thread is several times faster than a contended thread pool
    torch.set_num_threads(1)
    try:
        with capsys.disabled():                  # the table and the progress, always shown
            print()
            summary = run_soak(args, tmp_path)
    finally:
        torch.set_num_threads(threads)
    if args["out"]:
        Path(args["out"]).write_text(json.dumps(summary, indent=2))
        print(f"wrote {args['out']}")
    failures = summary["failures"]
    assert not failures, (
        f"{summary['num_failures']} failures, e.g.:\n"
        + "\n".join(f"{f['kind']}:{f['index']} {f['what']}: {f['detail']}" for f in failures[:10])
        + f"\n(rerun one: SOAK_SEED={args['seed']} SOAK_REPLAY=KIND:INDEX "
          "python -m pytest -m soak tests/soak)")
