"""Engine settings (vLLM-shaped names), validated before anything is built.

A leaf: it imports no engine module when it is imported. The semantics' rules live with the
schedulers (engine/sched/registry.py), which import torch and most of the engine, so they are
looked up only when a config is built or asked (as vLLM's ``SchedulerConfig.get_scheduler_cls``
loads its scheduler class only when asked).
"""
from __future__ import annotations

from dataclasses import dataclass

PREEMPTION_MODES = ("recompute", "swap")
DTYPES = ("auto", "float32", "float16", "bfloat16")


@dataclass(frozen=True)
class EngineConfig:
    # which vLLM engine's memory semantics to follow: "v0" (separate prefill/decode steps, fork
    # + copy-on-write, swap) or "v1" (one token budget per step with chunked prefill, n > 1 as
    # child requests sharing through the prefix cache, recompute-only preemption, null block)
    semantics: str = "v0"
    model: str = "default"          # embedded model in assets/, a local HF folder, or a hub id
    block_size: int = 16            # tokens per KV block
    num_gpu_blocks: int = 64        # size of the (device) block pool; the name is kept on CPU
    num_cpu_blocks: int = 0         # swap space in blocks; 0 disables swap
    preemption_mode: str = "recompute"
    # None = each engine's default, as in vLLM: off in v0, on in v1
    enable_prefix_caching: bool | None = None
    device: str = "auto"            # "cuda" if available, else "cpu"
    dtype: str = "auto"             # float32 on CPU, bfloat16 on CUDA
    backend: str = "auto"           # kernel backend: auto / torch / triton (paged_kernels.BACKENDS)
    kernel_fallback: bool = True    # a Triton op that fails to compile/launch falls back to torch
    seed: int = 0
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 4096     # v1: the token budget of one step
    # v1: the most prompt tokens one request may compute in a step (vLLM's name; 0 = no cap)
    long_prefill_token_threshold: int = 0
    # vLLM's max_model_len: the longest prompt + output one sequence may reach (default: the
    # model's context); also the slab the contiguous Max baseline reserves for every sequence
    max_model_len: int | None = None
    max_history: int = 2000         # snapshots kept for stepping back (oldest dropped)
    observe: bool = True            # snapshots, history and contiguous baselines after each step
    # vLLM's KV cache events (--kv-events-config): a ZeroMQ PUB endpoint; None = off. Binds when
    # the address has a wildcard ("tcp://*:5557"), else connects, as vLLM's publisher does.
    kv_events_endpoint: str | None = None
    kv_events_topic: str = ""
    kv_events_replay_endpoint: str | None = None   # ROUTER socket serving missed batches
    kv_events_buffer_steps: int = 10_000           # batches kept for replay
    kv_events_queue_size: int = 100_000            # batches waiting for the sender thread

    @property
    def prefix_caching(self) -> bool:
        """Whether prefix caching is on: the setting, or the engine's default (v1: on)."""
        if self.enable_prefix_caching is None:
            from engine.sched.registry import semantics_of      # lazy: see the module's doc
            return semantics_of(self.semantics).prefix_caching_default
        return self.enable_prefix_caching

    def __post_init__(self):
        from engine.sched.registry import semantics_of          # lazy: see the module's doc
        from paged_kernels.dispatch import BACKENDS             # imports torch: lazy too
        problems = []
        try:
            problems += semantics_of(self.semantics).config_problems(self)
        except ValueError as exc:
            problems.append(str(exc))
        if self.enable_prefix_caching not in (None, True, False):
            problems.append(f"enable_prefix_caching must be None, True or False, "
                            f"got {self.enable_prefix_caching!r}")
        t = self.long_prefill_token_threshold
        if not isinstance(t, int) or isinstance(t, bool) or t < 0:
            problems.append(f"long_prefill_token_threshold must be an integer >= 0 (0 = no cap), "
                            f"got {t!r}")
        ep = self.kv_events_endpoint
        if ep is not None and (not isinstance(ep, str) or "://" not in ep):
            problems.append(f"kv_events_endpoint must be a ZeroMQ address such as "
                            f"'tcp://*:5557', got {ep!r}")
        rep = self.kv_events_replay_endpoint
        if rep is not None and (not isinstance(rep, str) or "://" not in rep):
            problems.append(f"kv_events_replay_endpoint must be a ZeroMQ address such as "
                            f"'tcp://*:5558', got {rep!r}")
        if not isinstance(self.kv_events_topic, str):
            problems.append(f"kv_events_topic must be a string, got {self.kv_events_topic!r}")
        bs = self.block_size
        if not isinstance(bs, int) or bs < 1 or bs & (bs - 1):
            problems.append(f"block_size must be a positive power of two, got {bs!r}")
        if not isinstance(self.num_gpu_blocks, int) or self.num_gpu_blocks < 1:
            problems.append(f"num_gpu_blocks must be an integer >= 1, got {self.num_gpu_blocks!r}")
        if not isinstance(self.num_cpu_blocks, int) or self.num_cpu_blocks < 0:
            problems.append(f"num_cpu_blocks must be an integer >= 0, got {self.num_cpu_blocks!r}")
        if self.preemption_mode not in PREEMPTION_MODES:
            problems.append(f"preemption_mode must be one of {PREEMPTION_MODES}, "
                            f"got {self.preemption_mode!r}")
        elif self.preemption_mode == "swap" and self.num_cpu_blocks == 0:
            problems.append("preemption_mode='swap' needs swap space: set num_cpu_blocks > 0")
        if self.device not in ("auto", "cpu", "cuda") and not str(self.device).startswith("cuda:"):
            problems.append(f"device must be 'auto', 'cpu' or 'cuda', got {self.device!r}")
        mml = self.max_model_len
        if mml is not None and (not isinstance(mml, int) or isinstance(mml, bool) or mml < 2):
            problems.append(f"max_model_len must be None (the model's context) or an integer "
                            f">= 2 (one prompt token and one new token), got {mml!r}")
        if not isinstance(self.observe, bool):
            problems.append(f"observe must be True or False, got {self.observe!r}")
        if not isinstance(self.kernel_fallback, bool):
            problems.append(f"kernel_fallback must be True or False, got {self.kernel_fallback!r}")
        backends = ("auto", *BACKENDS)
        if self.backend not in backends:
            why = (" (the first Triton kernels are no backend any more: bench/kernel_bench.py "
                   "measures them as its baseline)" if self.backend == "triton-legacy" else "")
            problems.append(f"unknown kernel backend {self.backend!r}: backend must be one of "
                            f"{backends}{why}")
        if self.dtype not in DTYPES:
            problems.append(f"dtype must be one of {DTYPES}, got {self.dtype!r}")
        for name in ("max_num_seqs", "max_num_batched_tokens", "max_history",
                     "kv_events_buffer_steps", "kv_events_queue_size"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                problems.append(f"{name} must be an integer >= 1, got {v!r}")
        if problems:
            raise ValueError("invalid EngineConfig: " + "; ".join(problems))
