"""One browser session's lab: its own Engine (KV pool + history) or a loaded trace.

Nothing here imports Streamlit, so it is tested directly. Engines are replaced only after the new
settings were fully validated: a bad setting raises ValueError and the old engine stays.
Model weights are shared: ``engine.models.loader.load_model`` caches them per process, so every
session's Engine reuses one read-only copy and owns only its (small) KV pool.
A server hosts a class (app.hosting): a model outside the operator's list is refused before
anything is read, a checkpoint or KV cache over the limits before anything is allocated, and
a session idle past ``PAGED_LAB_IDLE_MINUTES`` is released (it gets a fresh engine on return).
Errors a person can fix are ValueErrors shown as they are (without server paths); anything
else is logged on the server and shown as one short line.
"""
from __future__ import annotations

import ctypes
import gc
import re
import logging
import os
import sys
import threading
import time
import weakref
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field

from engine import Engine, EngineConfig, SamplingParams, StepSnapshot
from engine.sched.registry import semantics_of
from analysis.block_size_sweep import block_size_sweep

from app import hosting
from app.failures import describe_failure
from app.compare import Comparison
from app.figure_cache import FigureCache
from app.turns import TURNS
from app.scenarios import DEFAULT_SCENARIO, SCENARIOS, Settings, preset

MAX_HISTORY = 400        # snapshots kept per session (bounded memory); older steps are dropped
MAX_PROMPTS = 12
MAX_POOL_BLOCKS = 1024   # keeps one session's KV pool small
_build_lock = threading.Lock()   # first load of a model happens once, even with many sessions
log = logging.getLogger(__name__)


def initial_model() -> str:
    return hosting.initial_model()


def parse_prompts(text: str) -> list[str]:
    prompts = [line.strip() for line in (text or "").splitlines() if line.strip()]
    if not prompts:
        raise ValueError("the prompt is empty: type at least one prompt (one per line)")
    if len(prompts) > MAX_PROMPTS:
        raise ValueError(f"{len(prompts)} prompts: at most {MAX_PROMPTS} (one per line)")
    return prompts


def make_config(s: Settings) -> EngineConfig:
    """Engine settings; a model this server does not offer is refused first, by name only.
    Under real vLLM (our v1 beside it) a step schedules at most as many sequences as its token
    budget, as vLLM requires (max_num_seqs <= max_num_batched_tokens)."""
    model = hosting.check_model_allowed(s.model)
    if s.num_gpu_blocks > MAX_POOL_BLOCKS or s.num_cpu_blocks > MAX_POOL_BLOCKS:
        raise ValueError(f"pool sizes are limited to {MAX_POOL_BLOCKS} blocks in the lab")
    # the step's token budget is the page's to choose only where prefills are chunked (v1);
    # elsewhere EngineConfig's large default stays (v0: whole prompts in one prefill step)
    budget = ({"max_num_batched_tokens": s.max_num_batched_tokens}
              if semantics_of(s.semantics).chunks_prefills else {})
    return EngineConfig(semantics=s.semantics, **budget, model=model, block_size=s.block_size,
                        num_gpu_blocks=s.num_gpu_blocks, num_cpu_blocks=s.num_cpu_blocks,
                        preemption_mode=s.preemption_mode,
                        enable_prefix_caching=s.enable_prefix_caching, seed=s.seed,
                        backend=s.backend, max_model_len=s.max_model_len,
                        max_history=MAX_HISTORY,
                        **({"max_num_seqs": min(EngineConfig.max_num_seqs,
                                                s.max_num_batched_tokens)}
                           if s.real_vllm and isinstance(s.max_num_batched_tokens, int)
                           and s.max_num_batched_tokens > 0 else {}))


def make_params(s: Settings) -> SamplingParams:
    beams = s.beam_width > 1           # the beam settings are refused without beams, and the
    return SamplingParams(             # sampling ones with them; the sidebar keeps both
        n=s.n, temperature=s.temperature, top_p=1.0 if beams else s.top_p,
        top_k=-1 if beams else s.top_k, max_tokens=s.max_tokens, beam_width=s.beam_width,
        length_penalty=s.length_penalty if beams else 1.0, ignore_eos=s.ignore_eos)


def build_engine(s: Settings, replacing=None, browser: str | None = None):
    """A fresh engine with the settings' requests queued; ValueError names the first problem.
    With ``s.real_vllm``, a ``VllmPageEngine`` (real vLLM, our v1 beside it); ``replacing``:
    the engine it will replace (not counted against PAGED_LAB_REAL_VLLM); ``browser``: the
    asking tab's browser (``Lab.browser``): its other tabs hand their real vLLM over."""
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
    return engine


# ---- real vLLM (the Engine choice "Real vLLM": real_vllm/page_engine.py) --------------------
_REAL_VLLM_ENGINES: "weakref.WeakSet" = weakref.WeakSet()    # this server's, open or closed
REAL_VLLM_OFF = ("Real vLLM is off on this server: it runs vLLM inside the server process (its "
                 "own copy of the weights, seconds to start), so the operator turns it on with "
                 "PAGED_LAB_REAL_VLLM=N, the number of sessions that may run it at once (1 for "
                 "one user: PAGED_LAB_REAL_VLLM=1 streamlit run app).")


def real_vllm_status() -> tuple[bool, str]:
    """(usable here, one line for the sidebar): vLLM's version, or why the choice is off."""
    from real_vllm.environment import vllm_status
    usable, line = vllm_status()
    if not usable:
        return False, line
    if not hosting.real_vllm_sessions():
        return False, REAL_VLLM_OFF
    return True, line


def check_real_vllm_allowed(replacing=None, browser: str | None = None) -> None:
    """ValueError unless vLLM is usable here, the server turned the choice on, and a real-vLLM
    slot is free (``replacing``, the session's own engine, does not hold one; another tab of
    the same ``browser`` hands its slot over)."""
    from real_vllm.environment import VllmUnavailable, import_vllm, vllm_status
    usable, why = vllm_status()          # not installed: the one command that adds it
    if not usable:
        raise ValueError(f"Real vLLM cannot start here: {why}")
    limit = hosting.real_vllm_sessions()
    if not limit:
        raise ValueError(REAL_VLLM_OFF)
    try:
        import_vllm()
    except VllmUnavailable as exc:
        raise ValueError(f"Real vLLM cannot start here: {exc}") from None
    busy = [e for e in list(_REAL_VLLM_ENGINES) if not e.closed and e is not replacing]
    if len(busy) >= limit:
        holders = [lab for lab in (ref() for ref in _LABS.valuerefs())
                   if lab is not None and lab.engine in busy]
        if hand_over_real_vllm(holders, browser):
            busy = [e for e in busy if not e.closed]
    if len(busy) >= limit:
        raise ValueError(real_vllm_busy(len(busy), limit, holders))


def hand_over_real_vllm(holders, browser: str | None) -> int:
    """Release the labs among ``holders`` shown in another tab of ``browser`` (a reloaded or
    closed tab kept the only slot for ~30 s, issue 38); a lab a script run holds right now is
    left alone. Returns how many were released."""
    if not browser:
        return 0
    released = 0
    for lab in holders:
        if lab.browser != browser or not lab._lock.acquire(blocking=False):
            continue
        try:
            if not lab.released:
                lab.release("handed over")
                released += 1
        finally:
            lab._lock.release()
    return released


def real_vllm_busy(n_busy: int, limit: int, holders, now: float | None = None) -> str:
    """Why no real-vLLM slot is free, and when one frees: a closed tab's lab is released
    PAGED_LAB_DISCONNECTED_SECONDS after the sweeper saw it go (every 5 s), an open one when
    it is closed or idle for PAGED_LAB_IDLE_MINUTES (issue 38: the message said neither)."""
    now = time.monotonic() if now is None else now
    gone = hosting.disconnected_seconds()
    waits = [max(0.0, gone - (now - lab.disconnected_since)) + 5.0 for lab in holders
             if lab.disconnected_since is not None and gone is not None]
    idle = hosting.idle_seconds()
    when = (f"a slot frees in about {min(waits):.0f} s (its tab was closed)" if waits else
            "it is held by an open tab: it frees when that tab is closed (about "
            f"{(gone or 0) + 10:.0f} s later)"
            + (f" or after {idle / 60:.0f} minutes without a click" if idle else ""))
    return (f"Real vLLM already runs in {n_busy} session(s) on this server, the most it allows "
            f"at once (PAGED_LAB_REAL_VLLM={limit}); {when}. Meanwhile choose our vLLM v1 "
            "engine (the same rules).")


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
    _REAL_VLLM_ENGINES.add(engine)
    try:
        for p in prompts:
            engine.add_request(p, params)
    except BaseException:
        engine.close()
        raise
    return engine


@dataclass
class Lab:
    """A session's state: live engine or replayed trace, which step is shown, play mode."""
    settings: Settings
    engine: Engine | None = None
    trace: list[StepSnapshot] | None = None     # a loaded trace replaces the engine's history
    trace_name: str = ""
    view: int | None = None                     # index into snapshots(); None = the latest
    playing: bool = False
    last_tick: float = 0.0
    error: str | None = None
    notice: str | None = None                   # e.g. why a preset runs under v0, not v1
    _token_text: dict[int, str] = field(default_factory=dict)
    _sweep: tuple | None = None                 # (settings, block-size sweep frame)
    _compare: Comparison | None = None          # the Compare view's v0 + v1 engines
    last_active: float = field(default_factory=time.monotonic)
    released: bool = False                      # idle: engine and history given back
    figures: FigureCache = field(default_factory=FigureCache)   # by the snapshots they draw
    session_id: str | None = None               # the Streamlit session showing this lab
    disconnected_since: float | None = None     # when the sweeper first saw it disconnected
    released_why: str = ""                      # "idle", "disconnected" or "handed over"
    browser: str | None = None                  # a digest of the browser's cookie: its tabs
    # the Watch vLLM tab's subscription (app/views/watch.py: anything with close(why)), held
    # here so it is closed with the engine, by the same sweep
    watch: object | None = None
    # held by a script run while it reads or changes the lab (re-entrant: a run's callbacks,
    # body and fragment take it in turn); the sweeper never releases a lab someone holds
    _lock: threading.RLock = field(default_factory=threading.RLock, repr=False, compare=False)

    def __post_init__(self):
        _LABS[id(self)] = self                   # weakly: a closed session's lab just goes

    @classmethod
    def create(cls, scenario: str = DEFAULT_SCENARIO, model: str | None = None) -> "Lab":
        """A lab with the scenario's engine, or (if that fails) no engine and the error."""
        lab = cls(preset(scenario, model or initial_model()))
        try:
            lab.engine = build_engine(lab.settings)
        except Exception as exc:       # the page must still open (e.g. default model missing)
            lab.error = _message(exc)
        return lab

    # ---- idle sessions -------------------------------------------------------------------
    def touch(self, now: float | None = None) -> None:
        """The session did something: it is not idle."""
        self.last_active = time.monotonic() if now is None else now

    @contextmanager
    def in_use(self):
        """Hold the lab for a part of a script run (a callback, the sidebar, the main view):
        it counts as activity, and the idle sweeper cannot release it halfway through."""
        # the process's turn first, then this lab (app/turns.py: one session works at a time)
        with TURNS if hosting.take_turns() else nullcontext(), self._lock:
            self.touch()
            try:
                yield self
            finally:
                self.touch()             # a long run (Run 200 steps) is activity to its end

    def release(self, why: str = "idle") -> None:
        """Give back the engine (KV pool, history), a replayed trace, the Compare engines and
        the Watch tab's subscription; ``why`` ("idle", "disconnected", "handed over") is what
        the note says when the session returns."""
        if self.engine is not None:
            self.engine.close()          # real vLLM's engine core, a KV event publisher
        self.engine, self._compare, self._sweep = None, None, None
        if self.watch is not None:
            self.watch.close(why)        # its sockets (the tab says why it stopped)
            self.watch = None
        self.figures.clear()
        self.trace, self.trace_name, self.view, self.playing = None, "", None, False
        self._token_text = {}
        self.released = True
        self.released_why = why

    def revive(self) -> None:
        """After ``release``: a fresh engine on the same settings, and a note saying why."""
        trace, name, view = self.trace, self.trace_name, self.view   # uploaded since then
        self.released = False
        self.disconnected_since = None
        if self.released_why == "handed over" and self.settings.real_vllm:
            # the newer tab keeps real vLLM (taking it back here would hand it to and fro):
            # this one runs our v1 engine, the same rules, until Real vLLM is chosen again
            self.settings = self.settings.replace(real_vllm=False)
        if self.apply(self.settings):
            if self.released_why == "handed over":
                self.notice = ("A newer tab of this browser took over this page's real vLLM "
                               "(one slot on this server): this tab now runs our vLLM v1 engine "
                               "on the same settings. Choose Real vLLM again to take it back.")
                why = None
            elif self.released_why == "disconnected":
                why = "This page was disconnected from the server for too long"
            else:
                minutes = (hosting.idle_seconds() or 0) / 60
                unit = "minute" if minutes == 1 else "minutes"
                why = f"This session was idle for more than {minutes:g} {unit}"
            if why is not None:
                self.notice = (f"{why}, so the server released its engine and history to "
                               "free memory: this is a fresh engine with your settings.")
        if trace is not None:
            self.load_trace(trace, name)
            self.view = view

    # ---- changing what runs --------------------------------------------------------------
    def apply(self, settings: Settings) -> bool:
        """Rebuild from ``settings``; on failure keep everything and set ``error``."""
        try:
            # real vLLM: the session's own engine does not count against the server's limit
            engine = (build_engine(settings, replacing=self.engine, browser=self.browser)
                      if settings.real_vllm else build_engine(settings))
        except Exception as exc:
            self.error = _message(exc)
            return False
        if self.engine is not None:
            self.engine.close()          # stops a KV event publisher, if it has one
        self.settings, self.engine, self.released = settings, engine, False
        self.trace, self.trace_name, self.view, self.playing = None, "", None, False
        self.error = self.notice = None
        self._token_text = {}
        self._compare = None
        self.figures.clear()
        return True

    def comparison(self, fresh: bool = False) -> Comparison:
        """The lab's engine and one under the other engine's rules, on the same requests
        (built on first use, the partner caught up to the lab's step)."""
        cmp = self._compare
        if fresh or cmp is None or cmp.main is None or \
                cmp.engines.get(cmp.main) is not self.engine or cmp.settings != \
                self.settings.replace(semantics="v0", real_vllm=False):
            self._compare = Comparison.build(self.settings, build_engine, main=self.engine)
        return self._compare

    def step_both(self) -> bool:
        """The Compare tab's Step both: the lab's step (its partner steps with it), or, once
        the lab's engine is done, the partner alone; False if neither had anything to do."""
        if not self.finished:
            return self.step()
        return self._compare is not None and self._compare.step_partners()

    def block_size_sweep(self):
        """The current requests at block sizes 1..128 (length-only engine, same pool capacity
        in slots), computed once per settings; None when replaying a trace."""
        if self.engine is None or self.replaying:
            return None
        key = self.settings
        if self._sweep is None or self._sweep[0] != key:
            params = make_params(self.settings)
            requests = [(len(self.engine.tokenize(p)), params)
                        for p in parse_prompts(self.settings.prompts)]
            capacity = self.settings.num_gpu_blocks * self.settings.block_size
            self._sweep = (key, block_size_sweep(requests, capacity,
                                                 max_model_len=self.engine.max_model_len))
        return self._sweep[1]

    def load_trace(self, snapshots: list[StepSnapshot], name: str) -> None:
        self.trace, self.trace_name, self.view, self.playing = snapshots, name, 0, False
        self.error = None

    def close_trace(self) -> None:
        self.trace, self.trace_name, self.view, self.playing = None, "", None, False

    # ---- what is shown -------------------------------------------------------------------
    @property
    def replaying(self) -> bool:
        return self.trace is not None

    def snapshots(self) -> list[StepSnapshot]:
        if self.trace is not None:
            return self.trace
        return list(self.engine.history) if self.engine is not None else []

    def index(self) -> int:
        n = len(self.snapshots())
        return n - 1 if self.view is None else max(0, min(self.view, n - 1))

    def current(self) -> StepSnapshot | None:
        snaps = self.snapshots()
        return snaps[self.index()] if snaps else None

    def previous(self) -> StepSnapshot | None:
        i = self.index()
        return self.snapshots()[i - 1] if i > 0 else None

    def show(self, index: int | None) -> None:
        n = len(self.snapshots())
        self.view = None if index is None or (index >= n - 1 and not self.replaying) \
            else max(0, min(index, n - 1))

    @property
    def at_latest(self) -> bool:
        """The newest recorded snapshot is shown."""
        return self.index() >= len(self.snapshots()) - 1

    @property
    def finished(self) -> bool:
        """Nothing more to step: the newest snapshot is shown and the engine is done (or the
        replay is at its last snapshot)."""
        if self.replaying or not self.at_latest:
            return self.at_latest
        return self.engine is None or not self.engine.has_unfinished_requests()

    # ---- stepping ------------------------------------------------------------------------
    def step(self) -> bool:
        """Forward one: through the recorded history while an older step is shown (Back, the
        slider), then one new engine step at its end (a replay: one snapshot forward); False
        if there was nothing to do."""
        if self.finished:
            return False
        if self.replaying or not self.at_latest:
            self.forward()
            return True
        self.engine.step()
        if self._compare is not None and self._compare.main is not None and \
                self._compare.engines.get(self._compare.main) is self.engine:
            self._compare.step_partners()    # the Compare tab's partner keeps in lockstep
        self.view = None                 # a new step shows the newest state
        return True

    def forward(self) -> None:
        """One recorded step forward, never a new engine step."""
        self.show(self.index() + 1)

    def back(self) -> None:
        self.view = max(0, self.index() - 1)

    def tick(self, interval_s: float) -> bool:
        """Auto-step for Play: at most one step per interval; stops playing when finished."""
        if not self.playing:
            return False
        now = time.monotonic()
        if now - self.last_tick < 0.8 * interval_s:
            return False
        self.last_tick = now
        stepped = self.step()
        if self.finished:
            self.playing = False
        return stepped

    # ---- text ----------------------------------------------------------------------------
    @property
    def decode(self):
        """Per-token text for the shown snapshots (None when replaying another model's trace)."""
        eng = self.engine
        if eng is None or eng.tokenizer is None:
            return None
        if self.replaying and self.trace and self.trace[0].model != eng.config.model:
            return None

        def decode(ids):
            ids = list(ids)
            missing = [t for t in ids if t not in self._token_text]
            if missing:
                self._token_text.update(zip(missing, eng.decode_tokens(missing)))
            return _whole_characters(ids, [self._token_text[t] for t in ids], eng.tokenizer)
        return decode


REPLACEMENT = "\ufffd"


def _whole_characters(ids: list[int], texts: list[str], tokenizer) -> list[str]:
    """Per-token texts where a character split over several byte tokens (é, 漢, an emoji) is
    shown whole, on the token that completes it, instead of as one � per token: each run of
    tokens that decode to � alone is decoded together."""
    out, i = list(texts), 0
    while i < len(ids):
        if REPLACEMENT not in texts[i]:
            i += 1
            continue
        for j in range(i + 1, min(len(ids), i + 8)):     # a UTF-8 character is <= 4 bytes
            joined = tokenizer.decode(ids[i:j + 1])
            if REPLACEMENT not in joined:
                out[i:j + 1] = [""] * (j - i) + [joined]
                i = j
                break
        i += 1
    return out


_LABS: "weakref.WeakValueDictionary[int, Lab]" = weakref.WeakValueDictionary()


def release_idle_labs(now: float | None = None, idle_s: float | None = None,
                      labs=None, is_connected=None, disconnected_s: float | None = None) -> int:
    """Release every lab (of this process, or ``labs``) idle for more than ``idle_s`` (default:
    PAGED_LAB_IDLE_MINUTES), and, given ``is_connected(session_id)``, every lab whose session
    has been disconnected for more than ``disconnected_s`` (default: PAGED_LAB_DISCONNECTED_SECONDS,
    which defaults to Streamlit's reconnect window); returns how many. A playing lab is never
    idle. Freed memory is handed back to the OS, so the server's RSS comes down too."""
    idle_s = hosting.idle_seconds() if idle_s is None else idle_s
    if is_connected is not None and disconnected_s is None:
        disconnected_s = hosting.disconnected_seconds()
    now = time.monotonic() if now is None else now
    if labs is None:        # the labs some Streamlit session shows (valuerefs: a C-level copy,
        # safe while another session's thread adds a lab)
        labs = [lab for lab in (ref() for ref in _LABS.valuerefs())
                if lab is not None and lab.session_id is not None]
    released = 0
    for lab in labs:
        if lab.released:
            continue
        if is_connected is not None and lab.session_id is not None:
            if is_connected(lab.session_id):
                lab.disconnected_since = None
            elif lab.disconnected_since is None:
                lab.disconnected_since = now
        gone = (lab.disconnected_since is not None and disconnected_s is not None
                and now - lab.disconnected_since > disconnected_s)
        if not (gone or _idle(lab, now, idle_s)):
            continue
        if not lab._lock.acquire(blocking=False):
            continue                     # a script run is using it right now: not idle
        try:                 # asked again: a run may have just touched it, the tab come
            if lab.released:     # back, or another sweep released it meanwhile
                continue
            gone = gone and not (is_connected is not None and is_connected(lab.session_id))
            if gone or _idle(lab, now, idle_s):
                lab.release("disconnected" if gone else "idle")
                released += 1
        finally:
            lab._lock.release()
    if released:
        log.info("released %d idle or disconnected session(s)", released)
        give_back_memory()
    return released


def _idle(lab: Lab, now: float, idle_s: float | None) -> bool:
    """Idle past the limit; a playing lab is never idle."""
    return bool(idle_s) and not lab.playing and now - lab.last_active > idle_s


def give_back_memory() -> None:
    """Collect, then return the C heap's free pages to the OS (glibc keeps them otherwise, so
    a released session's memory would stay in the server's RSS)."""
    gc.collect()
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None).malloc_trim(0)
        except Exception:                  # not glibc (musl has no malloc_trim): nothing to do
            pass


HEAP_ARENAS = 2            # glibc's malloc arenas: MALLOC_ARENA_MAX, unless the operator set it
_M_ARENA_MAX = -8          # mallopt's parameter number for it (glibc's malloc.h)


def limit_heap_arenas() -> None:
    """At most HEAP_ARENAS glibc heaps for this process's threads (unless MALLOC_ARENA_MAX is
    set). Each session runs its script in a thread of its own, and glibc gives busy threads
    heaps of their own (up to 8 per core); memory freed in them stays mapped. Measured with 50
    protocol-level sessions on one process (deploy/checks/class_load.py): RSS 45 s after they
    left was +12 % over before with glibc's default, +6.7 % with 2 arenas, at the same CPU per
    click within the runs' spread (docs/hosting.md, "A class of 100")."""
    global _arenas_limited
    if _arenas_limited or "MALLOC_ARENA_MAX" in os.environ \
            or not sys.platform.startswith("linux"):
        return
    _arenas_limited = True
    try:
        ctypes.CDLL(None).mallopt(_M_ARENA_MAX, HEAP_ARENAS)
    except Exception:                  # not glibc (musl has no mallopt arenas): nothing to do
        pass


_arenas_limited = False
_frozen = False


def freeze_long_lived() -> None:
    """Once per process, after the first lab is built (the model loaded, every module
    imported): move every object tracked by Python's cycle collector to its permanent
    generation (``gc.freeze``). A full collection then walks only what came after: with the
    server's ~440k start-up objects it took ~290 ms, holding every session of the process
    (measured in-process), and under a class's clicks it ran every few seconds. Frozen objects
    are still freed by reference counting; only cycles among them are never collected.
    Then the collector's first threshold is raised (GC_THRESHOLDS, below)."""
    global _frozen
    if not _frozen:
        _frozen = True
        gc.freeze()
        gc.set_threshold(*GC_THRESHOLDS)


# Python's default (700, 10, 10) starts a young collection every 700 net container allocations:
# under a class each one walked the young objects of every session's run in flight, every 10th
# also the middle generation, and every full one (131 ms on average) held the whole process.
# One process, 50 protocol students clicking every 2 s for 60 s (docs/hosting.md, "A class of
# 100"): 2694/242/20 collections, 5.0 s in all -> 143/11/1, 1.5 s; CPU per click 0.043 ->
# 0.029 s, click p90 3.2 -> 0.18 s. Cycles are still collected, only less often.
GC_THRESHOLDS = (10_000, 10, 10)
# ...but the full collections that came with it were rarer than once a minute, and in a
# 3-minute class the cyclic garbage waiting for them grew the heap: two
# processes, 100 students, RSS per student at peak 1.7 -> 4.9 MiB and 60 s after they left
# +4 % -> +22 %. So the idle sweeper also runs a full collection this often.
FULL_COLLECTION_S = 30.0


_sweeper: threading.Thread | None = None
_sweeper_lock = threading.Lock()


def start_idle_sweeper(interval_s: float = 5.0, is_connected=None) -> None:
    """Once per process: a daemon thread releasing idle and disconnected labs, so memory is
    given back even when no session is active to trigger the check. Every 5 s (a look at each
    lab's clock: microseconds): a tab gone for PAGED_LAB_DISCONNECTED_SECONDS (30) is released
    within 40 s, so a class's memory is back within a minute of it leaving. Once the
    collector's thresholds are raised (``freeze_long_lived``), it also runs a full collection
    every FULL_COLLECTION_S."""
    global _sweeper
    if _sweeper is not None:
        return
    with _sweeper_lock:
        if _sweeper is not None:
            return

        def sweep():
            collected = time.monotonic()
            while True:
                time.sleep(interval_s)
                try:
                    release_idle_labs(is_connected=is_connected)
                except Exception:                # a bad setting must not kill the thread
                    log.exception("idle-session sweep failed")
                if _frozen and time.monotonic() - collected >= FULL_COLLECTION_S:
                    collected = time.monotonic()
                    gc.collect()                 # GC_THRESHOLDS: cycles are freed this often
        _sweeper = threading.Thread(target=sweep, name="paged-lab-idle-sweeper", daemon=True)
        _sweeper.start()


# the engine's names (its Python API) -> the sidebar's labels, for messages shown on the page
PAGE_LABELS = {"max_num_batched_tokens": "token budget per step (v1)",
               "num_gpu_blocks": "GPU pool (blocks)", "num_cpu_blocks": "CPU pool (blocks)",
               "block_size": "block size", "max_tokens": "max tokens",
               "beam_width": "beam width", "top_p": "top-p", "top_k": "top-k",
               "length_penalty": "length penalty (beams)", "ignore_eos": "ignore EOS",
               "preemption_mode": "Preemption", "enable_prefix_caching": "Prefix caching"}
_API_NAME = re.compile(r"\b(" + "|".join(PAGE_LABELS) + r")\b")


_API_SEMANTICS = re.compile(r"""semantics\s*=\s*['"](\w+)['"]""")


def _engine_choice(m: re.Match) -> str:
    from engine.sched.registry import SEMANTICS
    rules = SEMANTICS.get(m.group(1))
    return f"the Engine “{rules.label}”" if rules is not None else m.group(0)


def page_words(text: str) -> str:
    """``text`` with the engine's setting names replaced by the sidebar's labels (and an
    engine named as the API does, ``semantics='v0'``, as the Engine choice names it)."""
    return _API_NAME.sub(lambda m: PAGE_LABELS[m.group(1)], _API_SEMANTICS.sub(_engine_choice, text))


def _message(exc: Exception) -> str:
    """What the page shows: a ValueError's reason (without server paths); for anything else a
    short line, with the traceback logged on the server."""
    if isinstance(exc, hosting.ModelNotOffered):
        return str(exc)                  # what the session typed, and the operator's list
    if isinstance(exc, ValueError):
        return page_words(hosting.public_message(str(exc)))
    log.error("unexpected error while building an engine", exc_info=exc)
    return unexpected_message(exc)


def unexpected_message(exc: BaseException) -> str:
    """One short line: the installed package a failure came from and the command that fixes
    it (app/failures.py), else that something went wrong (the traceback is in the log)."""
    described = describe_failure(exc)
    if described:
        return described
    return (f"Something went wrong on the server ({type(exc).__name__}); it was logged there. "
            "Try again, or change the settings.")


__all__ = ["Lab", "Settings", "SCENARIOS", "build_engine", "initial_model", "parse_prompts",
           "release_idle_labs", "start_idle_sweeper", "unexpected_message"]
