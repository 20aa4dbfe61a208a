"""Our v0 engine beside vLLM v0's own scheduler and block manager (vLLM 0.8.5), on one
workload: both produce one view per step (``v0_reference.py`` documents the view); the first
difference is named.

Both run on lengths only (prefix caching off: no decision depends on token values), with
recompute preemption, which is what vLLM v0's scheduler does for one-sequence groups.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from engine import Engine, EngineConfig, SamplingParams
from real_vllm.v0_reference import IMPORT_FAILED


class V0Unavailable(RuntimeError):
    """vLLM 0.8.5's scheduler cannot be imported here (the message says what is missing)."""

V0_DIR_ENV = "VLLM_V0_DIR"
DEFAULT_V0_DIR = Path(__file__).resolve().parent.parent / ".vllm-v0" / "0.8.5"


def v0_dir() -> Path | None:
    """Where vLLM 0.8.5's files were unpacked (deploy/install_vllm.sh), or None."""
    d = Path(os.environ.get(V0_DIR_ENV, DEFAULT_V0_DIR))
    return d if (d / "vllm" / "core" / "scheduler.py").is_file() else None


def run_reference(workload: dict | list[dict], where: Path, timeout_s: float = 300) -> list:
    """vLLM v0's views of a workload (of each, for a list: one process for all)."""
    done = subprocess.run([sys.executable, "-m", "real_vllm.v0_reference", str(where)],
                          input=json.dumps(workload), capture_output=True, text=True,
                          timeout=timeout_s, cwd=Path(__file__).resolve().parent.parent)
    if done.returncode == IMPORT_FAILED:
        raise V0Unavailable(done.stderr.strip().splitlines()[-1])
    if done.returncode != 0:
        raise RuntimeError(f"vLLM v0's scheduler failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout)


def run_ours(workload: dict) -> list[dict]:
    c = workload["config"]
    eng = Engine.length_only(EngineConfig(
        semantics="v0", block_size=c["block_size"], num_gpu_blocks=c["num_gpu_blocks"],
        num_cpu_blocks=c["num_cpu_blocks"], max_num_seqs=c["max_num_seqs"],
        max_num_batched_tokens=c["max_num_batched_tokens"], max_model_len=c["max_model_len"],
        enable_prefix_caching=False), max_model_len=c["max_model_len"], detailed_snapshots=False)
    requests = sorted(workload["requests"], key=lambda r: r["arrival_step"])
    views, step = [], 0
    while step < workload.get("max_steps", 500):
        for r in requests:
            if r["arrival_step"] == step:
                n = r["n"]
                eng.add_request(list(r["prompt"]), SamplingParams(
                    max_tokens=r["max_tokens"], ignore_eos=True, n=n,
                    temperature=1.0 if n > 1 else 0.0, seed=0 if n > 1 else None), r["id"])
        if not eng.has_unfinished_requests() and all(r["arrival_step"] < step for r in requests):
            break
        result = eng.step()
        # after the step: its forks are known too (a group keeps its finished sequences)
        rid = {s.seq_id: g.request_id for g in eng.groups.values() for s in g.all_seqs()}
        scheduled: dict[str, int] = {}
        for e in result.events:
            if e.kind == "prefill":
                scheduled.setdefault(rid[e.seq_id], e.end - e.start)
            elif e.kind == "append":
                scheduled.setdefault(rid[e.seq_id], 1)
        preempted = list(dict.fromkeys(rid[e.seq_id] for e in result.events
                                       if e.kind == "preempt"))
        tables = {}
        for g in eng.groups.values():
            ordered = sorted(g.all_seqs(), key=lambda s: s.seq_id)
            for i, s in enumerate(ordered):
                if s in g.seqs and s.block_table and s.block_device == "gpu":
                    tables[f"{g.request_id}/{i}"] = list(s.block_table)
        step += 1
        views.append({"step": step, "kind": result.kind,
                      "scheduled": [[r, n] for r, n in scheduled.items()],
                      "preempted": preempted, "block_tables": tables,
                      "free_blocks": eng.bm.gpu.num_free,
                      "swap_out": sorted([list(m) for e in result.events if e.kind == "swap_out"
                                          for m in e.mapping]),
                      "swap_in": sorted([list(m) for e in result.events if e.kind == "swap_in"
                                         for m in e.mapping]),
                      "copies": sorted([[e.src, e.dst] for e in result.events
                                        if e.kind == "cow"])})
    return views


def first_difference(ours: list[dict], theirs: list[dict]) -> str | None:
    for a, b in zip(ours, theirs):
        for key in ("kind", "scheduled", "preempted", "block_tables", "free_blocks", "copies",
                    "swap_out", "swap_in"):
            if a[key] != b[key]:
                return f"step {a['step']}: {key}: ours {a[key]}, vLLM v0 {b[key]}"
    if len(ours) != len(theirs):
        return f"steps: ours {len(ours)}, vLLM v0 {len(theirs)}"
    return None
