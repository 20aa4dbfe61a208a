"""Settings -> the page's engine (app/page_engine.py): our engine, or real vLLM with our engine
of its rules beside it. Every setting goes through the table (app/page_settings.py); a bad
setting raises ValueError naming the first problem before anything is loaded.
Model weights are shared: ``engine.models.loader.load_model`` caches them per process, so every
session's Engine reuses one read-only copy and owns only its (small) KV pool. A model outside
the operator's list is refused before anything is read, a checkpoint or KV cache over the
limits before anything is allocated (app/hosting.py)."""
from __future__ import annotations

import threading

from engine import Engine, EngineConfig, SamplingParams

from app import hosting
from app.messages import page_words
from app.our_engine import OurPageEngine
from app.page_settings import OMIT, SETTINGS, Settings
from app.real_vllm_slots import check_real_vllm_allowed, holds_slot

MAX_HISTORY = 400        # snapshots kept per session (bounded memory); older steps are dropped
MAX_PROMPTS = 12
_build_lock = threading.Lock()   # first load of a model happens once, even with many sessions


def parse_prompts(text: str) -> list[str]:
    prompts = [line.strip() for line in (text or "").splitlines() if line.strip()]
    if not prompts:
        raise ValueError("the prompt is empty: type at least one prompt (one per line)")
    if len(prompts) > MAX_PROMPTS:
        raise ValueError(f"{len(prompts)} prompts: at most {MAX_PROMPTS} (one per line)")
    return prompts


def _engine_values(s: Settings, target: str) -> dict:
    values = {row.name: row.engine_value(s) for row in SETTINGS if row.target == target}
    return {k: v for k, v in values.items() if v is not OMIT}


def make_config(s: Settings) -> EngineConfig:
    """Engine settings; a model this server does not offer is refused first, by name only.
    Under real vLLM (our v1 beside it) a step schedules at most as many sequences as its token
    budget, as vLLM requires (max_num_seqs <= max_num_batched_tokens)."""
    model = hosting.check_model_allowed(s.model)
    for row in SETTINGS:
        if row.at_most is not None and getattr(s, row.name) > row.at_most:
            raise ValueError(row.too_big)
    budget = s.max_num_batched_tokens
    return EngineConfig(**{**_engine_values(s, "config"), "model": model},
                        semantics=s.semantics, max_history=MAX_HISTORY,
                        **({"max_num_seqs": min(EngineConfig.max_num_seqs, budget)}
                           if s.real_vllm and isinstance(budget, int) and budget > 0 else {}))


def make_params(s: Settings) -> SamplingParams:
    return SamplingParams(**_engine_values(s, "params"))


def build_engine(s: Settings, replacing=None, browser: str | None = None):
    """A fresh page engine with the settings' requests queued; ValueError names the first
    problem. With ``s.real_vllm``, a ``VllmPageEngine`` (real vLLM, our v1 beside it);
    ``replacing``: the engine it will replace (not counted against PAGED_LAB_REAL_VLLM);
    ``browser``: the asking tab's browser (``Lab.browser``): its other tabs hand their real
    vLLM over."""
    config = make_config(s)          # cheap checks first: nothing is loaded if these fail
    params = make_params(s)
    prompts = parse_prompts(s.prompts)
    if s.real_vllm:
        check_real_vllm_allowed(replacing, browser)
    hosting.check_resources(config)  # config.json + weight headers only; nothing allocated yet
    with _build_lock:
        engine = Engine(config)
    for i, p in enumerate(prompts):
        try:
            engine.check_request(p, params)
        except ValueError as exc:
            raise ValueError(f"prompt {i + 1}: {exc}" if len(prompts) > 1 else str(exc)) from None
    if s.real_vllm:
        return _start_real_vllm(engine, s, params, prompts)
    for p in prompts:
        engine.add_request(p, params)
    return OurPageEngine(engine)


def _start_real_vllm(ours: Engine, s: Settings, params, prompts):
    """Real vLLM on ``ours``'s settings, refused (ValueError, nothing started) where vLLM
    would refuse or crash; then the requests, queued in both."""
    from real_vllm.page_engine import VllmPageEngine, page_settings_problems
    problems = page_settings_problems(ours, [params] * len(prompts))
    if problems:
        ours.close()
        raise ValueError(page_words("Real vLLM cannot run these settings: "
                                    + "; ".join(problems)))
    with _build_lock:
        engine = VllmPageEngine(ours, seed=s.seed)
    holds_slot(engine)
    try:
        for p in prompts:
            engine.add_request(p, params)
    except BaseException:
        engine.close()
        raise
    return engine
