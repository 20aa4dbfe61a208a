"""A class on one server: a session may use only the operator's models (refused before any file
or network access), checkpoints, KV caches and traces are bounded, idle sessions are released,
and an unexpected exception shows one short line, never a traceback or a server path."""
from __future__ import annotations

import json
import os
import sys
import threading

import pytest
import torch
from streamlit.testing.v1 import AppTest

from engine.models import runner as model_runner
from engine.models.memory_plan import kv_cache_bytes
from engine import Engine, EngineConfig
from engine.models import loader

import app.engine_build
import app.idle_sessions
import app.lab
from app import hosting
from app.scenarios import preset
from app.engine_build import MAX_HISTORY, build_engine
from app.idle_sessions import release_idle_labs
from app.lab import Lab
from app.our_engine import OurPageEngine

from .conftest import MODEL, ROOT, needs_model


def _length_only_engine() -> OurPageEngine:
    return OurPageEngine(Engine.length_only(EngineConfig(block_size=4, num_gpu_blocks=16),
                                            max_model_len=64))


def _lab() -> Lab:
    """A lab whose engine needs no weights (fast, and nothing is loaded)."""
    return Lab(preset("single"), engine=_length_only_engine())


def _forbid(monkeypatch, *names):
    def refuse(*args, **kwargs):
        raise AssertionError(f"must not be called for a refused model: {args}")
    for owner, name in names:
        monkeypatch.setattr(owner, name, refuse)


# ---- reads and opens, recorded while a refused model is asked for --------------------------
_opened: list | None = None


def _audit(event, args):
    if _opened is not None and event in ("open", "os.listdir", "os.scandir", "os.stat"):
        _opened.append((event, args[0] if args else None))


sys.addaudithook(_audit)


def _record_stats(monkeypatch):
    """os.stat has no audit event: record it too (pathlib's is_dir / exists call it)."""
    for name in ("stat", "lstat"):
        real = getattr(os, name)

        def recorded(path, *args, _real=real, _name=name, **kwargs):
            if _opened is not None:
                _opened.append((f"os.{_name}", path))
            return _real(path, *args, **kwargs)
        monkeypatch.setattr(os, name, recorded)


@pytest.fixture
def allowlist(monkeypatch, tmp_path):
    allowed = tmp_path / "allowed-model"
    allowed.mkdir()
    monkeypatch.setenv("PAGED_LAB_MODELS", f"{allowed}, someone/allowed-hub-model")
    monkeypatch.delenv("PAGED_LAB_MODEL", raising=False)
    return allowed


@pytest.mark.parametrize("asked", ["/etc", "/", "OUTSIDE", "someone/unknown-model",
                                   "ALLOWED/../../etc", "~/.ssh", "*", " /etc "])
def test_a_model_off_the_list_is_refused_before_any_file_is_read(allowlist, monkeypatch,
                                                                 tmp_path, asked):
    global _opened
    asked = (asked.replace("OUTSIDE", str(tmp_path / "outside"))
             .replace("ALLOWED", str(allowlist)))
    _forbid(monkeypatch, (loader, "resolve_model_path"), (loader, "load_model"),
            (loader, "_load_model"), (loader, "read_spec"), (loader, "checkpoint_bytes"),
            (model_runner, "load_model"))
    lab = _lab()
    engine, settings = lab.engine, lab.settings
    _record_stats(monkeypatch)
    _opened = []
    try:
        applied = lab.apply(settings.replace(model=asked))
        with pytest.raises(ValueError, match="PAGED_LAB_MODELS"):
            build_engine(settings.replace(model=asked))
        opened = list(_opened)
    finally:
        _opened = None
    assert not applied
    assert "is not offered on this server" in lab.error and "PAGED_LAB_MODELS" in lab.error
    assert lab.engine is engine and lab.settings == settings
    assert opened == []                              # no file or folder was touched


def test_the_recorder_sees_a_lookup(allowlist, monkeypatch):
    """(The check above would notice: asking for an allowed folder does look at it.)"""
    global _opened
    _record_stats(monkeypatch)
    _opened = []
    try:
        assert not _lab().apply(preset("single").replace(model=str(allowlist)))
        opened = list(_opened)
    finally:
        _opened = None
    assert any(str(allowlist) in str(path) for _, path in opened), opened


def test_the_list_always_holds_default_and_the_start_model(monkeypatch):
    monkeypatch.setenv("PAGED_LAB_MODEL", "/srv/models/start")
    monkeypatch.setenv("PAGED_LAB_MODELS", " /srv/models/a ,, someone/b ,default")
    assert hosting.allowed_models() == ["default", "/srv/models/start", "/srv/models/a",
                                        "someone/b"]
    assert hosting.check_model_allowed(" someone/b ") == "someone/b"
    assert hosting.check_model_allowed("") == "default"
    monkeypatch.delenv("PAGED_LAB_MODELS")
    assert hosting.allowed_models() == ["default", "/srv/models/start"]
    monkeypatch.setenv("PAGED_LAB_MODELS", "*")      # one user on their own machine
    assert hosting.allowed_models() is None
    assert hosting.check_model_allowed("/any/folder") == "/any/folder"


def test_bad_operator_settings_name_themselves(monkeypatch):
    monkeypatch.setenv("PAGED_LAB_MAX_KV_MB", "lots")
    with pytest.raises(ValueError, match="PAGED_LAB_MAX_KV_MB must be a number > 0"):
        hosting.max_kv_bytes()
    monkeypatch.setenv("PAGED_LAB_MAX_MODELS", "0")
    with pytest.raises(ValueError, match="PAGED_LAB_MAX_MODELS must be an integer >= 1"):
        loader.max_loaded_models()
    monkeypatch.setenv("PAGED_LAB_IDLE_MINUTES", "0")
    assert hosting.idle_seconds() is None            # 0 = never release


def test_defaults(monkeypatch):
    for name in ("PAGED_LAB_MAX_MODELS", "PAGED_LAB_MAX_CHECKPOINT_MB", "PAGED_LAB_MAX_KV_MB",
                 "PAGED_LAB_MAX_TRACE_SNAPSHOTS", "PAGED_LAB_IDLE_MINUTES"):
        monkeypatch.delenv(name, raising=False)
    assert loader.max_loaded_models() == 2
    assert hosting.max_checkpoint_bytes() == 1024 * 2**20
    assert hosting.max_kv_bytes() == 64 * 2**20
    assert hosting.max_trace_snapshots() == 2000 >= MAX_HISTORY   # the page's traces load back
    assert hosting.idle_seconds() == 30 * 60


# ---- loaded models, checkpoints ------------------------------------------------------------
def test_the_model_cache_keeps_the_configured_number(monkeypatch):
    monkeypatch.setattr(loader, "_LOADED", type(loader._LOADED)())
    monkeypatch.setattr(loader, "_load_model", lambda model, device, dtype: f"weights of {model}")
    monkeypatch.setenv("PAGED_LAB_MAX_MODELS", "2")
    for name in ("a", "b", "a", "c"):                # "a" used again: "b" is the oldest
        assert loader.load_model(name, "cpu", torch.float32) == f"weights of {name}"
    assert [k[0] for k in loader.loaded_models()] == ["a", "c"]
    monkeypatch.setenv("PAGED_LAB_MAX_MODELS", "1")
    loader.load_model("d", "cpu", torch.float32)
    assert [k[0] for k in loader.loaded_models()] == ["d"]


def _tiny_checkpoint(folder, tensors):
    from safetensors.torch import save_file
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({
        "model_type": "llama", "hidden_size": 16, "intermediate_size": 32,
        "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
        "vocab_size": 32, "max_position_embeddings": 64}))
    save_file(tensors, str(folder / "model.safetensors"))
    return folder


def test_a_checkpoint_over_the_limit_is_refused_from_its_header(monkeypatch, tmp_path):
    import safetensors
    import safetensors.torch
    folder = _tiny_checkpoint(tmp_path / "big", {"w": torch.zeros(64, 64),
                                                 "h": torch.zeros(10, dtype=torch.bfloat16)})
    assert loader.checkpoint_bytes(folder) == 64 * 64 * 4 + 10 * 2   # dtype x shape, per tensor
    monkeypatch.setenv("PAGED_LAB_MODELS", str(folder))
    monkeypatch.setenv("PAGED_LAB_MAX_CHECKPOINT_MB", "0.01")      # 10 KiB < 16 KiB of weights
    _forbid(monkeypatch, (safetensors.torch, "load_file"), (safetensors.torch, "load"),
            (safetensors, "safe_open"), (loader, "_read_state_dict"),
            (model_runner, "load_model"), (app.engine_build, "Engine"))
    with pytest.raises(ValueError, match=r"weights: this server loads checkpoints up to "
                                         r".*\(PAGED_LAB_MAX_CHECKPOINT_MB\)"):
        build_engine(preset("single").replace(model=str(folder)))


def test_a_broken_safetensors_header_is_a_clear_error(tmp_path):
    folder = tmp_path / "broken"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"\xff" * 8 + b"{}")
    with pytest.raises(ValueError, match="model.safetensors is not a safetensors file"):
        loader.checkpoint_bytes(folder)


# ---- the KV cache --------------------------------------------------------------------------
@needs_model
def test_block_1024_with_a_1024_block_pool_is_refused_by_the_kv_limit(model, monkeypatch):
    monkeypatch.delenv("PAGED_LAB_MAX_KV_MB", raising=False)
    lab = Lab.create("single", model)
    engine, settings = lab.engine, lab.settings
    lab.step()

    def no_engine(config):
        raise AssertionError("the KV cache must be refused before an Engine is built")
    monkeypatch.setattr(app.engine_build, "Engine", no_engine)
    assert not lab.apply(settings.replace(block_size=1024, num_gpu_blocks=1024,
                                          max_model_len=None))
    assert "PAGED_LAB_MAX_KV_MB" in lab.error and "at most 64 MiB" in lab.error, lab.error
    assert lab.engine is engine and lab.settings == settings and len(lab.snapshots()) == 2
    spec = engine.engine.spec
    per_slot = 2 * spec.num_layers * spec.num_kv_heads * spec.head_dim * 4    # K+V, fp32 on CPU
    assert f"{per_slot:,} bytes per token slot" in lab.error
    assert kv_cache_bytes(spec, 4, 1024, 1024) == per_slot * 1024 * 1024


@needs_model
def test_the_kv_bytes_checked_are_the_bytes_the_engine_allocates(model):
    s = preset("mixed", model).replace(preemption_mode="swap", num_cpu_blocks=8)
    runner = build_engine(s).engine.runner
    allocated = runner.kv_cache.nbytes + runner.cpu_kv_cache.nbytes
    assert allocated == kv_cache_bytes(runner.spec, runner.kv_cache.element_size(),
                                               s.block_size, s.num_gpu_blocks + s.num_cpu_blocks)


# ---- idle sessions -------------------------------------------------------------------------
def test_an_idle_session_is_released_and_comes_back_fresh(monkeypatch):
    monkeypatch.setenv("PAGED_LAB_IDLE_MINUTES", "1")
    lab, playing = _lab(), _lab()
    lab.step()
    lab.touch(now=1000.0)
    playing.touch(now=1000.0)
    playing.playing = True                           # a playing session is never idle
    assert release_idle_labs(now=1059.0, labs=[lab, playing]) == 0 and lab.engine is not None
    assert release_idle_labs(now=1061.0, labs=[lab, playing]) == 1
    assert lab.released and lab.engine is None and lab.snapshots() == []
    assert not lab.step()                            # a click before the page redraws is harmless
    assert playing.engine is not None
    fresh = _length_only_engine()
    monkeypatch.setattr(app.lab, "build_engine", lambda settings: fresh)
    lab.revive()
    assert lab.engine is fresh and not lab.released and len(lab.snapshots()) == 1
    assert "idle for more than 1 minute," in lab.notice and "fresh engine" in lab.notice
    monkeypatch.setenv("PAGED_LAB_IDLE_MINUTES", "0")
    assert release_idle_labs(now=10**9, labs=[lab]) == 0


def test_a_lab_in_use_is_not_released_halfway_through_a_run(monkeypatch):
    """The sweeper runs in its own thread: a lab a script run holds (a callback, the main
    view being drawn) is left alone, and a run that just touched it makes it not idle."""
    monkeypatch.setenv("PAGED_LAB_IDLE_MINUTES", "1")
    lab = _lab()
    lab.touch(now=0.0)
    holding, done = threading.Event(), threading.Event()

    def draw():
        with lab._lock:                  # a run in progress (in_use without the touch)
            holding.set()
            done.wait(10)
    t = threading.Thread(target=draw)
    t.start()
    holding.wait(10)
    try:
        assert release_idle_labs(now=10**7, labs=[lab]) == 0 and lab.engine is not None
    finally:
        done.set()
        t.join()
    with lab.in_use():                   # a new run: the lab is active again
        assert release_idle_labs(now=lab.last_active + 30, labs=[lab]) == 0
    assert release_idle_labs(now=lab.last_active + 61, labs=[lab]) == 1 and lab.engine is None


def test_the_sweeper_thread_starts_once(monkeypatch):
    monkeypatch.setattr(app.idle_sessions, "_sweeper", None)
    before = threading.active_count()
    app.idle_sessions.start_idle_sweeper(interval_s=3600)
    app.idle_sessions.start_idle_sweeper(interval_s=3600)
    assert threading.active_count() == before + 1 and app.idle_sessions._sweeper.daemon


def test_messages_hide_server_paths(monkeypatch):
    monkeypatch.setenv("PAGED_LAB_MODELS", "/srv/models/offered")
    text = ("no weights in /home/teacher/lab/assets/default-model. Also ~/x/y, "
            "/srv/models/offered and nobody/hub-id, https://example.org/a/b")
    assert hosting.public_message(text) == (
        "no weights in …/default-model. Also …/y, /srv/models/offered and nobody/hub-id, "
        "https://example.org/a/b")
    monkeypatch.setenv("PAGED_LAB_MODELS", "*")      # the user is the operator: all shown
    assert hosting.public_message(text) == text


# ---- the page ------------------------------------------------------------------------------
@pytest.fixture
def page(monkeypatch):
    monkeypatch.setenv("PAGED_LAB_MODEL", MODEL)
    monkeypatch.setenv("PAGED_LAB_MODELS", "/srv/no-such-offered-model, someone/offered")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")

    def run(**patches):
        for (owner, name), value in patches.get("patch", {}).items():
            monkeypatch.setattr(owner, name, value)
        at = AppTest.from_file(str(ROOT / "app" / "streamlit_app.py"), default_timeout=120)
        return at.run()
    return run


def _page_text(at) -> str:
    parts = [e.value for kind in ("error", "warning", "info", "markdown", "caption")
             for e in getattr(at, kind)]
    return "\n".join(str(p) for p in parts) + "\n".join(str(e.value) for e in at.exception)


@needs_model
def test_the_model_field_offers_only_the_allowed_models(page):
    at = page()
    assert not at.exception
    assert at.selectbox(key="w_model").options == list(dict.fromkeys(
        ["default", MODEL, "/srv/no-such-offered-model", "someone/offered"]))
    assert not [t for t in at.sidebar.text_input if t.key == "w_model"]
    lab = at.session_state["lab"]
    engine = lab.engine
    lab.settings = lab.settings.replace(model="/etc")    # set around the field: still refused
    at.button(key="reset_btn").click().run()
    assert not at.exception
    assert any("PAGED_LAB_MODELS" in e.value for e in at.error), [e.value for e in at.error]
    assert at.session_state["lab"].engine is engine


def _boom(*args, **kwargs):
    raise RuntimeError("secret detail in /home/teacher/lab/engine/x.py")


@needs_model
def test_an_unexpected_exception_in_a_figure_shows_one_short_line(page):
    import app.figures.pool_grid
    at = page(patch={(app.figures.pool_grid, "pool_figure"): _boom})
    assert not at.exception
    errors = [e.value for e in at.error]
    assert any(e.startswith("The Memory tab could not be drawn") and "RuntimeError" in e
               for e in errors), errors
    text = _page_text(at)
    assert "/home/teacher" not in text and "secret detail" not in text
    assert "Traceback" not in text
    assert at.subheader[0].value                     # the rest of the page is still drawn


@needs_model
def test_an_unexpected_exception_in_a_callback_shows_one_short_line(page, monkeypatch):
    at = page()
    monkeypatch.setattr(Lab, "step", _boom)
    at.button(key="step_btn").click().run()
    assert not at.exception
    assert any("Something went wrong on the server (RuntimeError)" in e.value for e in at.error)
    assert "/home/teacher" not in _page_text(at)


@needs_model
def test_a_deeply_nested_upload_is_a_clear_error(page):
    at = page()
    at.sidebar.file_uploader[0].upload("deep.json", b"[" * 100_000, "application/json").run()
    assert not at.exception
    assert any("could not load deep.json: not a trace: JSON nested deeper" in e.value
               for e in at.error), [e.value for e in at.error]
    big = b"[" + b"0," * (3 * 2**20) + b"0]"            # 6 MiB > server.maxUploadSize (5)
    at.sidebar.file_uploader[0].upload("big.json", big, "application/json").run()
    assert any("server.maxUploadSize" in e.value for e in at.error), [e.value for e in at.error]
    assert "Traceback" not in _page_text(at)


@needs_model
def test_a_returning_student_gets_a_fresh_engine_and_a_note(page, monkeypatch):
    monkeypatch.setenv("PAGED_LAB_IDLE_MINUTES", "1")
    at = page()
    at.button(key="step_btn").click().run()
    lab = at.session_state["lab"]
    old = lab.engine
    lab.touch(now=lab.last_active - 120)             # two minutes without a click
    assert release_idle_labs(labs=[lab]) == 1 and lab.engine is None
    at.run()                                         # the student comes back
    assert not at.exception
    assert lab.engine is not None and lab.engine is not old and lab.engine.snapshot.step == 0
    assert any("idle for more than 1 minute," in w.value for w in at.warning)


@needs_model
def test_a_model_that_left_the_list_is_refused_with_the_message(page, monkeypatch):
    at = page()
    engine = at.session_state["lab"].engine
    at.selectbox(key="w_model").set_value("someone/offered")
    monkeypatch.setenv("PAGED_LAB_MODELS", "")         # the operator shrank the list meanwhile
    at.form_submit_button[0].click().run()
    assert not at.exception
    assert any("'someone/offered' is not offered on this server" in e.value
               and "PAGED_LAB_MODELS" in e.value for e in at.error), [e.value for e in at.error]
    assert at.selectbox(key="w_model").value == at.session_state["lab"].settings.model
    assert at.session_state["lab"].engine is engine


def test_a_disconnected_session_is_released_after_the_reconnect_window(monkeypatch):
    """A session whose browser went away keeps its lab for PAGED_LAB_DISCONNECTED_SECONDS
    (default: Streamlit's reconnect window), then it is released like an idle one; a session
    that is still connected, or that came back in time, keeps it."""
    monkeypatch.setenv("PAGED_LAB_DISCONNECTED_SECONDS", "30")
    # idle release off: these labs have session ids and made-up clocks, so the process's own
    # sweeper thread (started by an earlier page test, on the real clock) would otherwise find
    # them idle for hours and release them while this test runs
    monkeypatch.setenv("PAGED_LAB_IDLE_MINUTES", "0")
    gone, here, back = _lab(), _lab(), _lab()
    for lab, sid in ((gone, "a"), (here, "b"), (back, "c")):
        lab.session_id = sid
        lab.touch(now=1000.0)
    connected = {"a": False, "b": True, "c": False}
    sweep = lambda now: release_idle_labs(now=now, labs=[gone, here, back],  # noqa: E731
                                          is_connected=connected.__getitem__)
    assert sweep(1001.0) == 0                        # first seen disconnected: the clock starts
    connected["c"] = True                            # c reconnects within the window
    assert sweep(1020.0) == 0
    assert sweep(1032.0) == 1
    assert gone.released and gone.engine is None
    assert here.engine is not None and back.engine is not None and back.disconnected_since is None
    fresh = _length_only_engine()
    monkeypatch.setattr(app.lab, "build_engine", lambda settings: fresh)
    gone.revive()
    assert gone.engine is fresh and "disconnected from the server for too long" in gone.notice
    monkeypatch.setenv("PAGED_LAB_DISCONNECTED_SECONDS", "0")       # 0: only idle releases
    monkeypatch.setenv("PAGED_LAB_IDLE_MINUTES", "0")
    connected["b"] = False
    assert sweep(2000.0) == 0 and sweep(10**6) == 0 and here.engine is not None


def test_a_tab_that_came_back_is_not_released_by_a_stale_reading(monkeypatch):
    """Past the window by the first reading, but connected again when the sweeper holds the
    lab: it is asked again under the lock and kept."""
    monkeypatch.setenv("PAGED_LAB_DISCONNECTED_SECONDS", "30")
    lab = _lab()
    lab.session_id = "s"
    lab.touch(now=1000.0)
    assert release_idle_labs(now=1001.0, labs=[lab], is_connected=lambda sid: False) == 0
    answers = iter([False, True])                    # gone at first look, back under the lock
    assert release_idle_labs(now=1040.0, labs=[lab], is_connected=lambda sid: next(answers)) == 0
    assert not lab.released and lab.engine is not None
    assert release_idle_labs(now=1041.0, labs=[lab], is_connected=lambda sid: False) == 1


def test_a_gone_tab_keeps_its_lab_30_s_or_streamlits_window_if_shorter(monkeypatch):
    import streamlit as st
    monkeypatch.delenv("PAGED_LAB_DISCONNECTED_SECONDS", raising=False)
    assert st.get_option("server.disconnectedSessionTTL") == 120
    assert hosting.disconnected_seconds() == 30.0
    st.config.set_option("server.disconnectedSessionTTL", 10)
    try:
        assert hosting.disconnected_seconds() == 10.0
    finally:
        st.config.set_option("server.disconnectedSessionTTL", 120)
    monkeypatch.setenv("PAGED_LAB_DISCONNECTED_SECONDS", "soon")
    with pytest.raises(ValueError, match="PAGED_LAB_DISCONNECTED_SECONDS"):
        hosting.disconnected_seconds()


def test_the_sweep_of_all_labs_leaves_labs_no_session_shows(monkeypatch):
    """The process-wide sweep (the sweeper thread, any visit) looks only at labs a Streamlit
    session shows; a lab used directly (a script, a test) is released only when passed in."""
    monkeypatch.setenv("PAGED_LAB_IDLE_MINUTES", "1")
    shown, direct = _lab(), _lab()
    shown.session_id = "s"
    for lab in (shown, direct):
        lab.touch(now=0.0)
    assert release_idle_labs(now=10**7) >= 1
    assert shown.released and not direct.released and direct.engine is not None
    assert shown.released_why == "idle"
