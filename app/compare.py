"""The Compare view's state: a vLLM v0 and a vLLM v1 engine on the same requests, in lockstep.

Nothing here imports Streamlit. Both engines are built from one ``Settings`` (only
``semantics`` differs); an engine that cannot run these requests (v1 refuses beam search) is
None with its reason, and the other one still steps. With ``main`` (the lab's own engine) one
of the two *is* the lab's engine: the page's Step, keys and narration then step and tell the
same run the Compare tab shows, and its partner is caught up to the same step when built.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from engine import StepSnapshot
from engine.sched.registry import SEMANTICS

from app.hosting import public_message
from app.page_engine import PageEngine
from app.scenarios import Settings


@dataclass
class Comparison:
    settings: Settings                            # each engine replaces its semantics
    engines: dict[str, PageEngine | None] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    main: str | None = None                       # which engine is the lab's own

    @classmethod
    def build(cls, settings: Settings, build_engine, main: PageEngine | None = None
              ) -> "Comparison":
        cmp = cls(settings.replace(real_vllm=False))
        if main is not None:
            cmp.main = main.semantics.name
        for sem, rules in SEMANTICS.items():      # each with the settings its engine fixes
            if sem == cmp.main:
                cmp.engines[sem] = main
                continue
            s = settings.replace(semantics=sem, real_vllm=False, **rules.fixed_settings)
            try:
                cmp.engines[sem] = build_engine(s)
            except ValueError as exc:      # shown on the page: no server paths
                cmp.engines[sem], cmp.errors[sem] = None, public_message(str(exc))
        if main is not None:               # the partner catches up to the lab's step
            for _ in range(main.step_no):
                if not cmp.step_partners():
                    break
        return cmp

    def follows(self, engine: PageEngine | None, settings: Settings) -> bool:
        """Still the comparison ``engine`` (the lab's own) is one side of, on ``settings``'
        requests and settings (under whichever engine's rules)."""
        return self._is_main(engine) and \
            settings.replace(semantics=self.settings.semantics, real_vllm=False) == self.settings

    def step_with(self, engine: PageEngine) -> bool:
        """``engine`` just stepped: if it is this comparison's own, its partners step too,
        so the Compare tab stays in lockstep; False if none stepped."""
        return self._is_main(engine) and self.step_partners()

    def _is_main(self, engine) -> bool:
        return self.main is not None and engine is not None and \
            self.engines.get(self.main) is engine

    def step_partners(self) -> bool:
        """One step of every engine but the lab's that still has work; False if none had."""
        stepped = False
        for sem, e in self.live().items():
            if sem != self.main and e.has_unfinished_requests():
                e.step()
                stepped = True
        return stepped

    def live(self) -> dict[str, PageEngine]:
        return {sem: e for sem, e in self.engines.items() if e is not None}

    @property
    def finished(self) -> bool:
        return not any(e.has_unfinished_requests() for e in self.live().values())

    def step(self) -> bool:
        """One step of every engine that still has work; False if none had any."""
        stepped = False
        for e in self.live().values():
            if e.has_unfinished_requests():
                e.step()
                stepped = True
        return stepped

    def snapshot(self, sem: str) -> StepSnapshot | None:
        e = self.engines.get(sem)
        return e.snapshot if e is not None else None


def _count(engine: PageEngine, kind: str) -> int:
    return engine.event_counts.get(kind, 0)


def compare_table(cmp: Comparison) -> pd.DataFrame:
    """What each engine has done so far, side by side (rows: measures, columns: v0 / v1);
    every number is read from that engine's snapshot or event counts."""
    rows = {}
    for e in cmp.live().values():
        st = e.snapshot.stats
        rows[e.semantics.label] = {
            "steps": e.snapshot.step,
            "requests finished": e.num_finished,
            "blocks in use": f"{st.used_blocks} of {st.total_blocks - st.null_blocks}",
            "shared blocks now": st.shared_blocks,
            "KV cache usage": f"{100 * st.kv_cache_usage_perc:.0f}%",
            "forks": _count(e, "fork"),
            "copy-on-write copies": _count(e, "cow"),
            "prefill chunks": _count(e, "prefill"),
            "prefix-cache hits (blocks, every lookup)": _count(e, "prefix_hit"),
            "prefix_cache_queries / hits (tokens)":
                f"{st.prefix_cache_queries} / {st.prefix_cache_hits}",
            # v1 counts a preempted request's lookups apart, as vLLM does (its cache manager
            # has these counters); v0 counts them above
            "preempted requests' queries / hits (tokens)":
                f"{st.prefix_cache_preempted_queries} / {st.prefix_cache_preempted_hits}"
                if e.semantics.counts_preempted_lookups_apart else "counted above",
            "preemptions": st.num_preemptions,
            "swaps out": _count(e, "swap_out"),
        }
    return pd.DataFrame(rows)
