"""One browser session's lab: its page engine (KV pool + history) or a loaded trace, the step
shown (app/playback.py), and its Compare partner.

Nothing here imports Streamlit, so it is tested directly. Engines are replaced only after the new
settings were fully validated: a bad setting raises ValueError and the old engine stays.
A server hosts a class (app.hosting): a session idle past ``PAGED_LAB_IDLE_MINUTES`` is
released (app/idle_sessions.py) and gets a fresh engine on return. Errors a person can fix are
ValueErrors shown as they are (without server paths); anything else is logged on the server and
shown as one short line (app/messages.py).
"""
from __future__ import annotations

import threading
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field

from engine import StepSnapshot
from engine.sched.registry import current_vllm
from analysis.block_size_sweep import block_size_sweep

from app import hosting, labs
from app.compare import Comparison
from app.engine_build import build_engine, make_params, parse_prompts
from app.figure_cache import FigureCache
from app.messages import page_message
from app.page_engine import PageEngine
from app.playback import Playback
from app.scenarios import DEFAULT_SCENARIO, Settings, preset
from app.token_text import TokenText
from app.turns import TURNS


def initial_model() -> str:
    return hosting.initial_model()


@dataclass
class Lab:
    """A session's state: live engine or replayed trace, which step is shown, play mode."""
    settings: Settings
    engine: PageEngine | None = None
    trace: list[StepSnapshot] | None = None     # a loaded trace replaces the engine's history
    trace_name: str = ""
    cursor: Playback = field(default_factory=Playback)
    error: str | None = None
    notice: str | None = None                   # e.g. why a preset runs under v0, not v1
    _tokens: TokenText = field(default_factory=TokenText)
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
        labs.register(self)                     # weakly: a closed session's lab just goes

    @classmethod
    def create(cls, scenario: str = DEFAULT_SCENARIO, model: str | None = None) -> "Lab":
        """A lab with the scenario's engine, or (if that fails) no engine and the error."""
        lab = cls(preset(scenario, model or initial_model()))
        try:
            lab.engine = build_engine(lab.settings)
        except Exception as exc:       # the page must still open (e.g. default model missing)
            lab.error = page_message(exc)
        return lab

    # the cursor's fields, as the page's controls and the tests read and set them
    view = property(lambda self: self.cursor.view,
                    lambda self, v: setattr(self.cursor, "view", v))
    playing = property(lambda self: self.cursor.playing,
                       lambda self, v: setattr(self.cursor, "playing", v))
    last_tick = property(lambda self: self.cursor.last_tick,
                         lambda self, v: setattr(self.cursor, "last_tick", v))

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
        self.trace, self.trace_name = None, ""
        self.cursor.stop()
        self._tokens = TokenText()
        self.released = True
        self.released_why = why

    def revive(self) -> None:
        """After ``release``: a fresh engine on the same settings, and a note saying why."""
        trace, name, view = self.trace, self.trace_name, self.view   # uploaded since then
        self.released = False
        self.disconnected_since = None
        if self.released_why == "handed over" and self.settings.real_vllm:
            # the newer tab keeps real vLLM (taking it back here would hand it to and fro):
            # this one runs our engine of real vLLM's rules until Real vLLM is chosen again
            self.settings = self.settings.replace(real_vllm=False)
        if self.apply(self.settings):
            if self.released_why == "handed over":
                self.notice = ("A newer tab of this browser took over this page's real vLLM "
                               "(one slot on this server): this tab now runs our "
                               f"{current_vllm().label} engine on the same settings. Choose "
                               "Real vLLM again to take it back.")
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
            self.error = page_message(exc)
            return False
        if self.engine is not None:
            self.engine.close()          # stops a KV event publisher, if it has one
        self.settings, self.engine, self.released = settings, engine, False
        self.trace, self.trace_name = None, ""
        self.cursor.stop()
        self.error = self.notice = None
        self._tokens = TokenText()
        self._compare = None
        self.figures.clear()
        return True

    def comparison(self, fresh: bool = False) -> Comparison:
        """The lab's engine and one under the other engine's rules, on the same requests
        (built on first use, the partner caught up to the lab's step)."""
        if fresh or self._compare is None or not self._compare.follows(self.engine,
                                                                        self.settings):
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
        self.trace, self.trace_name = snapshots, name
        self.cursor.stop(view=0)
        self.error = None

    def close_trace(self) -> None:
        self.trace, self.trace_name = None, ""
        self.cursor.stop()

    # ---- what is shown -------------------------------------------------------------------
    @property
    def replaying(self) -> bool:
        return self.trace is not None

    def snapshots(self) -> list[StepSnapshot]:
        if self.trace is not None:
            return self.trace
        return list(self.engine.history) if self.engine is not None else []

    def index(self) -> int:
        return self.cursor.index(len(self.snapshots()))

    def current(self) -> StepSnapshot | None:
        snaps = self.snapshots()
        return snaps[self.index()] if snaps else None

    def previous(self) -> StepSnapshot | None:
        i = self.index()
        return self.snapshots()[i - 1] if i > 0 else None

    def show(self, index: int | None) -> None:
        self.cursor.show(index, len(self.snapshots()), self.replaying)

    @property
    def at_latest(self) -> bool:
        """The newest recorded snapshot is shown."""
        return self.cursor.at_latest(len(self.snapshots()))

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
        if self._compare is not None:
            self._compare.step_with(self.engine)    # the Compare tab's partner keeps in lockstep
        self.view = None                 # a new step shows the newest state
        return True

    def forward(self) -> None:
        """One recorded step forward, never a new engine step."""
        self.show(self.index() + 1)

    def back(self) -> None:
        self.cursor.back(len(self.snapshots()))

    def tick(self, interval_s: float) -> bool:
        """Auto-step for Play: at most one step per interval; stops playing when finished."""
        if not self.cursor.due(interval_s):
            return False
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
        return self._tokens.decoder(eng)
