"""The differential suite's workloads: settings for both engines and a script of calls.

A script is a list of calls applied to both engines in lockstep: ("add", id, prompt ids,
SamplingParams kwargs[, cache_salt]), ("step", k), ("run",) (step until both are idle),
("abort", id), ("reset", reset_running_requests). Prompts are token ids of the default model's
vocabulary (4096); greedy unless a workload says otherwise.
"""
from __future__ import annotations

from dataclasses import dataclass, field


def toks(start: int, n: int, stride: int = 7) -> list[int]:
    """n distinct-looking token ids (deterministic), words of the vocabulary: away from the
    special ids and the byte tokens (a prompt ending inside a UTF-8 character is detokenized
    differently: docs/vllm-fidelity.md)."""
    return [300 + (start + i * stride) % 3700 for i in range(n)]


P64 = toks(10, 64)
G = dict(ignore_eos=True)          # greedy, run to max_tokens


@dataclass
class Workload:
    name: str
    script: list
    settings: dict = field(default_factory=dict)

    def config(self) -> dict:
        base = dict(semantics="v1", block_size=32, num_gpu_blocks=16, max_num_seqs=8,
                    max_num_batched_tokens=128, max_model_len=256)
        base.update(self.settings)
        return base


WORKLOADS = [
    Workload("shared_prefix", [
        ("add", "a", P64 + toks(500, 20), dict(max_tokens=8, **G)),
        ("add", "b", P64 + toks(900, 9), dict(max_tokens=8, **G)), ("run",),
        ("add", "c", P64 + toks(1300, 40), dict(max_tokens=5, **G)), ("run",)]),
    Workload("same_prompt_twice_block_aligned", [
        ("add", "a", P64, dict(max_tokens=6, **G)), ("run",),
        ("add", "b", P64, dict(max_tokens=6, **G)), ("run",)]),
    Workload("same_prompt_twice_unaligned_together", [
        ("add", "a", toks(20, 70), dict(max_tokens=10, **G)),
        ("add", "b", toks(20, 70), dict(max_tokens=10, **G)), ("run",)]),
    Workload("parallel_sampling_n4", [
        ("add", "p", toks(40, 45), dict(n=4, temperature=1.0, seed=3, max_tokens=12,
                                        ignore_eos=True)), ("run",)]),
    Workload("chunked_prefill_budget_32", [
        ("add", "a", toks(60, 100), dict(max_tokens=5, **G)),
        ("add", "b", toks(70, 40), dict(max_tokens=5, **G)), ("run",)],
        dict(max_num_batched_tokens=32)),
    Workload("chunked_prefill_threshold_32_budget_96", [
        ("add", "a", toks(80, 90), dict(max_tokens=4, **G)),
        ("add", "b", toks(90, 75), dict(max_tokens=4, **G)),
        ("add", "c", toks(95, 20), dict(max_tokens=4, **G)), ("run",)],
        dict(max_num_batched_tokens=96, long_prefill_token_threshold=32)),
    Workload("lone_long_prompt_threshold", [
        ("add", "a", toks(100, 80), dict(max_tokens=4, **G)), ("run",)],
        dict(max_num_batched_tokens=64, long_prefill_token_threshold=32)),
    Workload("memory_pressure_recompute_and_eviction", [
        ("add", "a", toks(110, 40), dict(max_tokens=60, **G)),
        ("add", "b", toks(120, 40), dict(max_tokens=60, **G)),
        ("add", "c", toks(130, 40), dict(max_tokens=60, **G)), ("run",),
        ("add", "d", toks(140, 70), dict(max_tokens=10, **G)), ("run",)],
        dict(num_gpu_blocks=8, max_model_len=224)),
    Workload("whole_prompt_must_fit_to_be_admitted", [
        ("add", "a", toks(150, 64), dict(max_tokens=30, **G)),
        ("add", "b", toks(160, 100), dict(max_tokens=2, **G)), ("run",)],
        dict(num_gpu_blocks=6, max_num_batched_tokens=80, max_model_len=160)),
    Workload("abort_mid_decode", [
        ("add", "a", toks(170, 50), dict(max_tokens=20, **G)),
        ("add", "b", toks(180, 33), dict(max_tokens=20, **G)), ("step", 4),
        ("abort", "a"), ("run",)]),
    Workload("abort_mid_prefill", [
        ("add", "a", toks(190, 120), dict(max_tokens=8, **G)),
        ("add", "b", toks(200, 30), dict(max_tokens=8, **G)), ("step", 1),
        ("abort", "a"), ("run",)],
        dict(max_num_batched_tokens=48)),
    Workload("reset_prefix_cache_idle", [
        ("add", "a", P64 + toks(210, 5), dict(max_tokens=4, **G)), ("run",),
        ("reset", False),
        ("add", "b", P64 + toks(220, 5), dict(max_tokens=4, **G)), ("run",)]),
    Workload("reset_prefix_cache_running", [
        ("add", "a", toks(230, 70), dict(max_tokens=12, **G)),
        ("add", "b", toks(240, 40), dict(max_tokens=12, **G)), ("step", 3),
        ("reset", True), ("run",)]),
    Workload("stop_token_ids_and_min_tokens", [
        ("add", "a", toks(250, 30), dict(max_tokens=20, min_tokens=3, stop_token_ids=[14])),
        ("add", "b", toks(260, 30), dict(max_tokens=20, stop_token_ids=[14, 293])), ("run",)]),
    Workload("cache_salts", [
        ("add", "a", P64 + [5], dict(max_tokens=3, **G), "alice"), ("run",),
        ("add", "b", P64 + [6], dict(max_tokens=3, **G), "bob"),
        ("add", "c", P64 + [7], dict(max_tokens=3, **G), "alice"),
        ("add", "d", P64 + [8], dict(max_tokens=3, **G)), ("run",)]),
    Workload("max_num_seqs_2", [
        *[("add", f"r{i}", toks(300 + 10 * i, 20 + 5 * i), dict(max_tokens=6, **G))
          for i in range(5)], ("run",)],
        dict(max_num_seqs=2)),
    Workload("prompt_plus_max_tokens_beyond_max_model_len", [
        ("add", "a", toks(400, 100), dict(max_tokens=50, **G)), ("run",)],
        dict(max_model_len=128, num_gpu_blocks=8)),
    Workload("max_model_len_exactly_reached", [
        ("add", "a", toks(410, 100), dict(max_tokens=28, **G)),
        ("add", "b", toks(420, 127), dict(max_tokens=1, **G)), ("run",)],
        dict(max_model_len=128, num_gpu_blocks=10)),
    Workload("seeded_top_k_top_p", [
        ("add", "a", toks(450, 20), dict(temperature=0.8, top_k=20, seed=1, max_tokens=15,
                                         ignore_eos=True)),
        ("add", "b", toks(460, 20), dict(temperature=1.2, top_p=0.9, seed=2, max_tokens=15,
                                         ignore_eos=True)),
        ("add", "c", toks(470, 20), dict(temperature=1.0, top_p=0.8, top_k=50, seed=3,
                                         max_tokens=15)), ("run",)]),
    Workload("greedy_beside_seeded_n2_min_tokens", [
        ("add", "a", toks(480, 33), dict(max_tokens=8)),
        ("add", "b", toks(480, 33), dict(n=2, temperature=0.7, seed=9, max_tokens=8,
                                         min_tokens=4, stop_token_ids=[400])), ("run",)]),
    Workload("no_prefix_caching_under_pressure", [
        *[("add", f"r{i}", toks(100 + 30 * i, 40 + 7 * i), dict(max_tokens=40, **G))
          for i in range(4)], ("run",)],
        dict(num_gpu_blocks=8, max_model_len=224, enable_prefix_caching=False)),
    Workload("block_size_64", [
        ("add", "a", P64 + toks(5, 70), dict(max_tokens=30, **G)),
        ("add", "b", P64 + toks(9, 10), dict(max_tokens=30, **G)), ("run",)],
        dict(block_size=64, num_gpu_blocks=8, max_model_len=448)),
    Workload("decode_heavy_batch_of_8", [
        *[("add", f"r{i}", toks(200 + 11 * i, 5 + i), dict(max_tokens=50, **G))
          for i in range(8)], ("run",)],
        dict(num_gpu_blocks=12, max_model_len=256, max_num_batched_tokens=64)),
    Workload("late_arrivals_with_threshold", [
        ("add", "a", toks(1, 50), dict(max_tokens=30, **G)), ("step", 3),
        ("add", "b", toks(1, 50), dict(max_tokens=10, **G)), ("step", 2),
        ("add", "c", toks(7, 90), dict(max_tokens=10, **G)), ("run",)],
        dict(num_gpu_blocks=10, max_model_len=256, max_num_batched_tokens=48,
             long_prefill_token_threshold=16)),
    Workload("eos_allowed_beside_ignore_eos", [
        ("add", "a", toks(430, 12), dict(max_tokens=40)),
        ("add", "b", toks(440, 12), dict(max_tokens=40, ignore_eos=True)), ("run",)]),
]
