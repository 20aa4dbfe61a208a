"""The scheduler tap in a real ``vllm serve assets/default-model --scheduler-cls
real_vllm.tap.scheduler.TapScheduler`` (vLLM 0.32, CPU build; engine core in its own process),
on 127.0.0.1, completions through its OpenAI API. Frames arrive with the server's request ids
(``cmpl-…``), tables are held while a request runs, the invariants hold on the rebuilt state;
the server serves on with no subscriber, with one that stops reading, and with an error
injected into the tap (a TapOff arrives). Two servers, started together, shared by the module."""
from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from real_vllm.tap.frames import Frame, Hello, TapOff, decode
from tests.vllm_real.serve import VllmServe, free_port, start_all
from tests.vllm_real.test_tap import Rebuilt, check_invariants
from tests.vllm_real.workloads import toks

FAIL_AT_STEP = 5


class Server(VllmServe):
    def __init__(self, name: str, log_dir: Path, **tap_env):
        self.tap = free_port()
        super().__init__(
            log_dir / f"vllm-serve-{name}.log",
            ["--block-size", "32", "--num-gpu-blocks-override", "24", "--max-model-len", "512",
             "--enforce-eager", "--scheduler-cls", "real_vllm.tap.scheduler.TapScheduler"],
            PAGED_LAB_TAP_ENDPOINT=f"tcp://127.0.0.1:{self.tap}", **tap_env)

    def complete(self, prompt: list[int], max_tokens: int = 16) -> dict:
        return self.completion(prompt, max_tokens)

    def complete_many(self, prompts: list[list[int]], max_tokens: int = 16) -> list[dict]:
        out: list = [None] * len(prompts)

        def one(i):
            out[i] = self.complete(prompts[i], max_tokens)
        threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(180)
        return out

    def subscriber(self):
        import zmq
        sub = zmq.Context.instance().socket(zmq.SUB)
        sub.setsockopt(zmq.RCVHWM, 0)
        sub.connect(f"tcp://127.0.0.1:{self.tap}")
        sub.subscribe(b"tap")
        time.sleep(0.5)                         # the subscription reaches the tap
        return sub


def receive(sub, quiet_s: float = 1.5, max_s: float = 30) -> list[tuple[int, object]]:
    """Everything until the stream is quiet for ``quiet_s`` (an idle server schedules
    nothing, so its tap sends nothing), at most ``max_s``."""
    out = []
    deadline = time.monotonic() + max_s
    while time.monotonic() < deadline and sub.poll(int(quiet_s * 1000)):
        _, seq, payload = sub.recv_multipart()
        out.append((int.from_bytes(seq, "big"), decode(payload)))
    return out


@pytest.fixture(scope="module")
def servers(vllm_ready, tmp_path_factory):
    log_dir = tmp_path_factory.mktemp("vllm-serve-tap")
    yield from start_all({"tap": Server("tap", log_dir),
                          "failing": Server("failing", log_dir,
                                            PAGED_LAB_TAP_FAIL_AT_STEP=str(FAIL_AT_STEP))})


def test_frames_from_vllm_serve(servers):
    """Six concurrent completions on a 24-block pool: frames with cmpl-… ids, non-empty tables
    while they run, invariants on every frame rebuilt from a keyframe on."""
    s = servers["tap"]
    sub = s.subscriber()
    try:
        prompts = [toks(100 + 41 * i, 90) for i in range(6)]
        answers = s.complete_many(prompts, max_tokens=40)
        assert all(a and len(a["choices"][0]["text"]) > 0 for a in answers)
        messages = receive(sub)
    finally:
        sub.close(0)
    state, frames, started = Rebuilt(), [], False
    seen_ids, held_tables = set(), 0
    for _, m in messages:
        if isinstance(m, Hello):
            state.hello = m
        elif isinstance(m, Frame):
            if not started and not m.keyframe:
                continue                        # a subscriber starts at a keyframe
            started = True
            state.apply(m)
            check_invariants(state, m)
            frames.append(m)
            seen_ids.update(m.scheduled)
            held_tables += sum(1 for r in state.requests.values()
                               if r.status == "running" and any(r.block_ids))
    assert state.hello is not None and state.hello.num_blocks == 24
    assert len(frames) > 40
    assert [m for _, m in messages if isinstance(m, TapOff)] == []
    assert len(seen_ids) == 6 and all(r.startswith("cmpl-") for r in seen_ids), seen_ids
    assert held_tables > 0
    seqs = [q for q, _ in messages]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs))) and frames[-1].dropped == 0


def test_serves_with_no_subscriber_and_a_stalled_one(servers):
    """No subscriber: completions succeed. A subscriber that stops reading: completions still
    succeed in about the time they take unwatched, a second subscriber gets its frames all the
    while, and the stalled one, read at last, gets frames in order (any loss a gap)."""
    import zmq
    s = servers["tap"]
    prompts = [toks(3000 + 13 * i, 200) for i in range(8)]
    # 8 x 500 tokens on a 768-token pool: preemptions, thousands of frames
    t0 = time.monotonic()
    assert all(a["choices"][0]["text"] for a in s.complete_many(prompts, max_tokens=300))
    unwatched = time.monotonic() - t0
    stalled = zmq.Context.instance().socket(zmq.SUB)
    stalled.setsockopt(zmq.RCVHWM, 1)
    stalled.setsockopt(zmq.RCVBUF, 4096)
    stalled.connect(f"tcp://127.0.0.1:{s.tap}")
    stalled.subscribe(b"tap")
    watcher = s.subscriber()
    try:
        got: list = []
        reading = threading.Thread(target=lambda: got.extend(receive(watcher, 3.0, 240)))
        reading.start()
        t0 = time.monotonic()
        answers = s.complete_many([p[::-1] for p in prompts], max_tokens=300)
        stalled_took = time.monotonic() - t0
        reading.join(30)
        assert all(a["choices"][0]["text"] for a in answers)
        assert stalled_took < 2 * unwatched + 5, (stalled_took, unwatched)
        frames = [m for _, m in got if isinstance(m, Frame)]
        assert len(frames) > 200 and all(m.dropped == 0 for m in frames)
        seqs = []
        while stalled.poll(500):
            seqs.append(int.from_bytes(stalled.recv_multipart()[1], "big"))
        # what it lost (if anything: the kernel's buffers hold ~1 MB of frames) shows as
        # gaps; the tap's counters and drops at the high-water mark: test_tap_publisher.py
        assert seqs and seqs == sorted(seqs) and len(seqs) <= len(got)
    finally:
        stalled.close(0)
        watcher.close(0)


def test_tap_error_in_vllm_serve(servers):
    """PAGED_LAB_TAP_FAIL_AT_STEP: the tap fails at that step, sends a TapOff and stops; the
    server answers every completion, before and after."""
    s = servers["failing"]
    sub = s.subscriber()
    try:
        answers = [s.complete(toks(400 + 17 * i, 30), max_tokens=8) for i in range(3)]
        messages = receive(sub)
    finally:
        sub.close(0)
    assert all(len(a["choices"][0]["text"]) > 0 for a in answers)
    offs = [m for _, m in messages if isinstance(m, TapOff)]
    assert len(offs) == 1 and f"={FAIL_AT_STEP}" in offs[0].reason
    assert isinstance(messages[-1][1], TapOff)
    assert s.complete(toks(900, 30), max_tokens=8)["choices"][0]["text"]
    assert "paged-lab tap off after an error" in s.log.read_text()


TAP_TABLES_JS = """() => {
  for (const el of document.querySelectorAll('.js-plotly-plot')) {
    const t = el.layout && el.layout.title && el.layout.title.text || '';
    if (t.startsWith('Block tables') && el.offsetParent !== null && el.data.length)
      return {title: t, rows: [...(el.data[0].y || []), ...(el.layout.yaxis.ticktext || [])],
              z: (el.data[0].z || []).flat().filter(v => v !== null && v !== undefined)};
  }
  return null;
}"""


@pytest.mark.browser
def test_the_watch_tab_draws_a_live_vllm_serve(servers, tmp_path):
    """The page (`streamlit run app`, the tap's endpoint on its allowlist) in Chromium: Watch
    vLLM → Scheduler tap → Connect, then a completion on the server: the block-table figure
    draws the server's request (its cmpl-… id) holding physical blocks, live."""
    from app.screenshots import (exceptions_on, launch, open_lab, start_server, stop_server,
                                 wait_healthy)
    from tests.app.conftest import browser_missing
    missing = browser_missing()
    if missing:
        pytest.skip(f"browser tests: {missing}")
    import playwright.sync_api as pw
    s = servers["tap"]
    port = free_port()
    page_log = tmp_path / "streamlit.log"
    proc = start_server(port, "default", str(page_log),
                        env={"PAGED_LAB_WATCH_ENDPOINTS": f"tcp://127.0.0.1:{s.tap}"})
    answer: list = []
    stop = threading.Event()
    try:
        wait_healthy(port, proc)
        with pw.sync_playwright() as p:
            ctx = launch(p, {"width": 1440, "height": 900})
            page = ctx.new_page()
            open_lab(page, f"http://127.0.0.1:{port}")
            page.get_by_role("tab", name="Watch vLLM").click()
            page.get_by_text("Scheduler tap", exact=True).click()
            page.get_by_label("Tap endpoint (the server's PUB socket)").fill(
                f"tcp://127.0.0.1:{s.tap}")
            page.get_by_role("button", name="Connect", exact=True).click()
            time.sleep(2)                            # the subscription reaches the tap
            def load():                              # completions until the figure is seen
                i = 0
                while not stop.is_set():
                    answer.extend(s.complete_many(
                        [toks(5000 + 97 * (i + j), 90) for j in range(4)], max_tokens=300))
                    i += 4
            long = threading.Thread(target=load)
            long.start()
            drawn, deadline = None, time.monotonic() + 90
            while time.monotonic() < deadline:
                fig = page.evaluate(TAP_TABLES_JS)
                rows = [r for r in (fig or {}).get("rows", []) if "cmpl-" in str(r)]
                if rows and fig["z"]:                    # a cmpl-… row holding blocks
                    drawn = fig
                    break
                time.sleep(0.5)
            stop.set()
            assert drawn is not None, "the block tables never showed the server's request"
            shot = os.environ.get("PAGED_LAB_TAP_SCREENSHOT") or str(tmp_path / "tap.png")
            try:                     # a picture for the docs, not the check: a loaded machine
                page.locator(".gtitle", has_text="Block tables").first \
                    .scroll_into_view_if_needed(timeout=10_000)
                page.screenshot(path=shot, timeout=20_000)
                print(f"\nthe Watch tab drawing the live server: {shot}")
            except pw.TimeoutError:
                print("\nno screenshot: the page did not settle within 20 s")
            print(f"drawn: {drawn['title']}: {drawn['rows']}")
            assert not exceptions_on(page)
            ctx.close()
        long.join(180)
        assert answer and all(a["choices"][0]["text"] for a in answer)
    finally:
        stop.set()
        stop_server(proc)
