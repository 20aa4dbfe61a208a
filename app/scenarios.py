"""Scenario presets, as plain data: each one makes its point within ~20 steps.

A preset is a complete ``Settings`` (everything the sidebar can edit). Small blocks (4 or 8
tokens) and small pools keep every block visible on one screen.
"""
from __future__ import annotations

from dataclasses import dataclass

from engine.sched.registry import SEMANTICS, current_vllm, semantics_of
from real_vllm.adapter import CPU_BLOCK_MULTIPLE as REAL_VLLM_BLOCK_MULTIPLE

from app.page_settings import Settings

# The Engine choice that runs the real vLLM (its v1 engine, in this process: real_vllm/), beside
# our engine's semantics names ("v0", "v1"). Settings keep ``semantics="v1"`` and
# ``real_vllm=True`` for it: our v1 engine runs the same requests in lockstep.
REAL_VLLM = "vllm"
ENGINE_CHOICES = (*SEMANTICS, REAL_VLLM)


@dataclass(frozen=True)
class Scenario:
    key: str
    label: str
    point: str                       # what to watch, one sentence
    settings: Settings
    # the same point under the real vLLM: 32-token blocks (its CPU attention's rule), prompts
    # long enough to fill them; None where real vLLM cannot run it (beam search)
    real_vllm: Settings | None = None


_JULIET = "ROMEO: But soft, what light through yonder window breaks? It is the east,"
_PREFIX = "First Citizen: Before we proceed any further, hear me speak. All: Speak, speak."
# 69 tokens of the default model: two full 32-token blocks of shared prefix for real vLLM
_LONG_PREFIX = (_PREFIX + " First Citizen: You are all resolved rather to die than to famish? "
                "All: Resolved. resolved. First Citizen: We are accounted poor citizens, the "
                "patricians good.")
_ROMEO_LONG = ("ROMEO: But soft, what light through yonder window breaks? It is the east, "
               "and Juliet is the sun. Arise, fair sun,")
_MIXED = ("ROMEO: My lord, I come", "JULIET: Good night, good night! Parting is",
          "HAMLET: To be, or not to be", "MACBETH: Tomorrow, and tomorrow, and",
          "KING LEAR: Blow, winds, and crack")

SCENARIOS: dict[str, Scenario] = {s.key: s for s in (
    Scenario("single", "Single sequence",
             "One sequence grows token by token: a new block is allocated only when the last one "
             "is full, so at most one block is partly empty.",
             Settings("single", prompts="ROMEO: But soft, what light", max_tokens=20,
                      block_size=4, num_gpu_blocks=16, max_model_len=32,
                      max_num_batched_tokens=4),
             Settings("single", prompts=_ROMEO_LONG, max_tokens=60, block_size=32,
                      num_gpu_blocks=8, max_model_len=128, max_num_batched_tokens=16)),
    Scenario("parallel", "Parallel sampling (n=4)",
             "After the prefill the 4 samples share every prompt block (refcount 4). On the first "
             "decode step each writes into the shared, partly filled last block: copy-on-write "
             "gives three of them a private copy; the full blocks stay shared.",
             Settings("parallel", prompts=_JULIET, n=4, temperature=0.8, max_tokens=16,
                      block_size=8, num_gpu_blocks=32, max_model_len=48),
             # temperature > 0: a budget no prompt is chunked under (real_vllm/page_engine.py says why)
             Settings("parallel", prompts=_ROMEO_LONG, n=4, temperature=0.8, max_tokens=40,
                      block_size=32, num_gpu_blocks=24, max_model_len=128,
                      max_num_batched_tokens=512)),
    Scenario("beam", "Beam search (width 3: transformers' scoring, vLLM v0 memory)",
             "Each step keeps the 3 best candidates: a surviving beam forks (sharing all blocks of "
             "its parent), a pruned beam frees its blocks, and a fork that writes into a shared "
             "block triggers copy-on-write.",
             Settings("beam", prompts="To be, or not to be, that is the", beam_width=3,
                      max_tokens=16, ignore_eos=False, block_size=4, num_gpu_blocks=48,
                      max_model_len=32)),
    Scenario("prefix", "Shared prefix (prefix caching)",
             "Three requests start with the same 20+ tokens: the full blocks of the common prefix "
             "are computed once and found by hash (prefix_hit) by the others, so they are shared.",
             Settings("prefix", prompts="\n".join(f"{_PREFIX} {w}" for w in
                                                  ("First", "Second", "Citizen")),
                      max_tokens=12, block_size=4, num_gpu_blocks=48,
                      enable_prefix_caching=True, max_model_len=40),
             Settings("prefix", prompts="\n".join(f"{_LONG_PREFIX} {w}" for w in
                                                  ("First", "Second", "Citizen")),
                      max_tokens=12, block_size=32, num_gpu_blocks=32,
                      enable_prefix_caching=True, max_model_len=160,
                      max_num_batched_tokens=64)),
    Scenario("mixed", "Mixed workload (preemption)",
             "Five requests compete for a pool that cannot hold them all at full length: when it "
             "runs dry the newest sequence is preempted (recompute: blocks freed, prefill again "
             "later; swap: blocks moved to the CPU pool and back).",
             Settings("mixed", prompts="\n".join(_MIXED),
                      temperature=0.8, max_tokens=24, block_size=4, num_gpu_blocks=24,
                      num_cpu_blocks=24, preemption_mode="recompute", max_model_len=40),
             Settings("mixed", prompts="\n".join(_MIXED), temperature=0.8, max_tokens=70,
                      block_size=32, num_gpu_blocks=10, max_model_len=96,
                      max_num_batched_tokens=480, enable_prefix_caching=True)),
)}

DEFAULT_SCENARIO = "single"

# What the Compare view (v0 and v1 in lockstep on the same requests) should make you notice.
COMPARE_NOTES: dict[str, str] = {
    "single": "v0 computes the whole prompt in one prefill step; v1 spends at most the token "
              "budget per step, so a prompt longer than the budget takes several chunks before "
              "the first token is sampled. v1 never hands out block 0 (the null block), so its "
              "pool has one block less.",
    "parallel": "v0 prefills the prompt once, then forks: the 4 samples share every prompt block "
                "and the partly filled last block is copied on write. v1 has no fork and no "
                "copy-on-write: the 4 samples are 4 child requests; the 2nd, 3rd and 4th find "
                "the prompt's full blocks in the prefix cache (refcount 4) and each computes "
                "the partial last block itself.",
    "beam": "v0 runs beam search inside the engine (forks, pruned beams, copy-on-write). vLLM "
            "v1 moved beam search out of the engine core, so the v1 side refuses it and says "
            "why.",
    "prefix": "Both find the shared prefix by hash. v0 looks it up once per prefill; v1 looks it "
              "up for every waiting request and counts queries and hits in tokens (vLLM's "
              "prefix_cache_queries / prefix_cache_hits). Both free a request's last block first: "
              "a block with no hash goes to the front of the free queue (reused first), a "
              "cached one to the back, so its prefix is evicted last.",
    "mixed": "Under pressure v0 preempts the newest sequence (recompute or swap) during a decode "
             "step; v1 preempts the most recently admitted request by recompute only (it has no "
             "swap) and admits nobody in that step. v1 steps also mix decode tokens and prompt "
             "chunks, where v0 alternates prefill steps and decode steps.",
}


def preset(key: str, model: str | None = None) -> Settings:
    """The scenario's settings (with ``model`` substituted if given)."""
    s = SCENARIOS[key].settings
    return s.replace(model=model) if model else s


# where a scenario's point reads differently under rules without fork and copy-on-write
# (vLLM v1's: n > 1 runs as child requests, beam search is not in the engine)
POINTS_WITHOUT_FORK: dict[str, str] = {
    "parallel": "The 4 samples are 4 child requests (v1 has no fork and no copy-on-write): the "
                "first computes the prompt; the others find its full blocks in the prefix cache "
                "(refcount 4), and each computes the partly filled last block itself.",
    "beam": "Beam search is not part of vLLM v1's engine: this scenario runs under vLLM v0.",
}


def scenario_point(key: str, choice: str) -> str:
    """The one-sentence point of scenario ``key`` under the Engine choice ``choice``."""
    if not rules_of_choice(choice).forks_sequences and key in POINTS_WITHOUT_FORK:
        return POINTS_WITHOUT_FORK[key]
    return SCENARIOS[key].point


def engine_choice(s: Settings) -> str:
    """The Engine choice ``s`` runs under: "v0", "v1" or REAL_VLLM."""
    return REAL_VLLM if s.real_vllm else s.semantics


def rules_of_choice(name: str):
    """The rules an Engine choice follows (real vLLM: those of the installed vLLM's engine)."""
    return current_vllm() if name == REAL_VLLM else semantics_of(name)


def under_engine(s: Settings, name: str) -> Settings:
    """``s`` run by the engine ``name`` (an ENGINE_CHOICES name): with the settings that engine
    always has (read from the engine's registry: v1 caches prefixes and preempts by recompute);
    a prefix-caching setting the engine does not fix is the one the scenario's preset has.
    Real vLLM runs v1's rules; where ``s`` has blocks real vLLM's CPU attention refuses, the
    scenario's real-vLLM preset is taken (same model and kernels)."""
    if name == REAL_VLLM:
        ours = current_vllm().name           # our engine that runs real vLLM's rules
        base = under_engine(s, ours).replace(real_vllm=True)
        vllm_preset = SCENARIOS[s.scenario].real_vllm
        if base.block_size % REAL_VLLM_BLOCK_MULTIPLE and vllm_preset is not None:
            return under_engine(vllm_preset.replace(model=s.model, backend=s.backend),
                                ours).replace(real_vllm=True)
        return base
    fixed = dict(semantics_of(name).fixed_settings)
    fixed.setdefault("enable_prefix_caching", SCENARIOS[s.scenario].settings.enable_prefix_caching)
    return s.replace(semantics=name, real_vllm=False, **fixed)
