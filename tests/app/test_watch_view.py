"""The "Watch vLLM" view, headless (streamlit.testing.v1.AppTest): pointed at this engine's KV
event publisher over ZeroMQ on 127.0.0.1, it shows exactly the blocks the engine cached; bad
endpoints get a clear st.error, malformed messages are counted on the page, Disconnect closes.
On a hosted server (the default) only the operator's endpoints may be watched, Listen and
ipc:// are off, and a refused endpoint opens no socket; a session holds one subscription, closed
when its lab is released (idle, disconnected).

The engine publishes on tcp://*:PORT (it binds, as vLLM does) with a replay socket; the view
connects to tcp://127.0.0.1:PORT and fetches the history through the replay socket, so it does
not matter that the engine ran before the view's subscription arrived.
"""
from __future__ import annotations

import base64
import json
import re
import time

import numpy as np
import pytest
import zmq
from streamlit.testing.v1 import AppTest

from app.figures.kv_event_charts import binned, cached_blocks_figure, event_rate_figure
from app.figures.prefix_tree import keep_newest, prefix_tree_figure, tree_layout
from engine import Engine, EngineConfig, SamplingParams
from engine.kv_events import (BlockStored, CachedBlock, KVEventBatch, PrefixCacheView,
                              ReceivedBatch, encode_batch)

from .conftest import MODEL, ROOT, needs_model
from tests.ports import free_port

DEADLINE_S = 10.0


def watch_page():
    from app.views import watch
    watch.draw()


WATCH_SETTINGS = ("PAGED_LAB_WATCH_ENDPOINTS", "PAGED_LAB_WATCH_LISTEN", "PAGED_LAB_WATCH_IPC")


@pytest.fixture(autouse=True)
def hosted(monkeypatch):
    """The lab's default: a hosted server (whatever the shell running the tests has set)."""
    for name in WATCH_SETTINGS:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def allow(monkeypatch, *endpoints: str) -> None:
    """The operator lists these endpoints (``*``: any)."""
    monkeypatch.setenv("PAGED_LAB_WATCH_ENDPOINTS", ",".join(endpoints))


@pytest.fixture
def page():
    at = AppTest.from_function(watch_page, default_timeout=30)
    at.run()
    assert not at.exception
    yield at
    watch = at.session_state["kv_watch"] if "kv_watch" in at.session_state else None
    if watch is not None:
        watch.subscriber.close()


def connect(at, endpoint: str, replay: str = "") -> None:
    at.text_input(key="w_kv_endpoint").input(endpoint)
    at.text_input(key="w_kv_replay").input(replay)
    at.button(key="kv_connect_btn").click().run()
    assert not at.exception, at.exception
    assert not at.error, [e.value for e in at.error]


def shown(element) -> str:
    """A message's text as the page shows it: Markdown's escapes (app/plain_text.py) read."""
    return re.sub(r"\\(.)", r"\1", element.value)


def metric(at, label: str) -> str:
    return next(m.value for m in at.metric if m.label == label)


def rerun_until(at, done, what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not done(at):
        assert time.monotonic() < deadline, (f"timed out waiting for {what}: "
                                             f"{[(m.label, m.value) for m in at.metric]}")
        at.run()
        assert not at.exception, at.exception


def chart(at, key: str) -> dict:
    for el in at.get("plotly_chart"):
        if el.proto.id.endswith(key):
            return json.loads(el.proto.spec)
    raise AssertionError(f"no chart {key}")


def values(array) -> list:
    """A figure's data array: a list, or plotly's typed array {"dtype", "bdata"}."""
    if isinstance(array, dict):
        return np.frombuffer(base64.b64decode(array["bdata"]), dtype=array["dtype"]).tolist()
    return list(array)


@pytest.fixture
def engine(monkeypatch):
    port, replay = free_port(), free_port()
    allow(monkeypatch, f"tcp://127.0.0.1:{port}", f"tcp://127.0.0.1:{replay}")
    eng = Engine.length_only(EngineConfig(
        block_size=4, num_gpu_blocks=24, enable_prefix_caching=True, seed=0,
        kv_events_endpoint=f"tcp://*:{port}", kv_events_replay_endpoint=f"tcp://*:{replay}"),
        max_model_len=256)
    yield eng, f"tcp://127.0.0.1:{port}", f"tcp://127.0.0.1:{replay}"
    eng.close()


def test_the_view_shows_the_blocks_the_engine_cached(page, engine):
    eng, endpoint, replay = engine
    common = list(range(1, 13))                       # 3 shared blocks, then a branch each
    for i in range(3):
        eng.add_request(common + [30 + i] * 5, SamplingParams(max_tokens=4, ignore_eos=True))
    n_cached = 0
    while eng.has_unfinished_requests():
        n_cached += sum(e.kind == "cached" for e in eng.step().events)
    pub = eng.publishers[0]
    assert pub.flush()
    cached = {h: tuple(eng.bm.gpu.tokens[b]) for h, b in eng.bm.gpu.cached.items()}

    connect(page, endpoint, replay)
    rerun_until(page, lambda at: metric(at, "batches") == str(pub.published), "every batch")
    assert metric(page, "cached blocks") == str(len(cached))
    assert metric(page, "malformed") == "0" and metric(page, "lost batches") == "0"
    assert metric(page, "blocks stored") == str(n_cached)

    tree = chart(page, "fig_kv_tree")
    nodes = [t for t in tree["data"] if t.get("mode", "").startswith("markers")]
    shown = {h: text for t in nodes for h, text in zip(t["customdata"], t["hovertext"])}
    assert set(shown) == set(cached)                  # every cached block, nothing else
    for h, tokens in cached.items():                  # token ids on hover
        assert "tokens: " + " ".join(map(str, tokens)) in shown[h]
    roots = [h for h, b in eng.bm.gpu.cached.items() if eng.bm.gpu.parent_hash[b] == ""]
    assert len(roots) == 1 and "parent none (a first block)" in shown[roots[0]]
    # the shared first block: every other cached block extends its prefix
    assert f"{len(cached) - 1} cached blocks extend this prefix" in shown[roots[0]]

    table = page.dataframe[0].value
    assert set(table["event"]) <= {"BlockStored", "BlockRemoved"} and len(table) > 0
    assert values(chart(page, "fig_kv_cached")["data"][0]["y"])[-1] == len(cached)

    # a cache reset reaches the page as AllBlocksCleared, with the next step's batch (as vLLM
    # sends it); that step's request fills no block: the tree empties
    assert eng.reset_prefix_cache()
    eng.add_request([7, 8], SamplingParams(max_tokens=1, ignore_eos=True))
    while eng.has_unfinished_requests():
        eng.step()
    assert pub.flush()
    rerun_until(page, lambda at: metric(at, "cached blocks") == "0", "the reset")
    assert "AllBlocksCleared" in set(page.dataframe[0].value["event"])


def test_a_bad_endpoint_is_a_clear_error_not_a_traceback(page):
    for text, words in [("localhost:5557", "must start with tcp://"),
                        ("tcp://*:5557", "wildcard host"),
                        ("tcp://127.0.0.1:99999", "port 99999"),
                        ("", "is empty")]:
        page.text_input(key="w_kv_endpoint").input(text)
        page.button(key="kv_connect_btn").click().run()
        assert not page.exception
        assert len(page.error) == 1 and words in shown(page.error[0]), page.error
        assert "kv_watch" not in page.session_state
    page.text_input(key="w_kv_endpoint").input("tcp://127.0.0.1:5557")
    page.text_input(key="w_kv_replay").input("tcp://127.0.0.1")
    page.button(key="kv_connect_btn").click().run()
    assert "the Replay endpoint 'tcp://127.0.0.1'" in shown(page.error[0])


def test_malformed_messages_are_counted_on_the_page_and_disconnect_closes(page, monkeypatch):
    xpub = zmq.Context.instance().socket(zmq.XPUB)    # says when the view has subscribed
    xpub.setsockopt(zmq.LINGER, 0)
    xpub.bind("tcp://127.0.0.1:0")
    allow(monkeypatch, xpub.getsockopt_string(zmq.LAST_ENDPOINT))
    try:
        connect(page, xpub.getsockopt_string(zmq.LAST_ENDPOINT))
        assert xpub.poll(int(DEADLINE_S * 1000)) and xpub.recv() == b"\x01"
        xpub.send_multipart([b"", (0).to_bytes(8, "big"), b"\xc1garbage"])
        good = KVEventBatch(time.time(), [BlockStored([b"k" * 32], None, [5, 6, 7, 8], 4, None,
                                                      "GPU", None)], 0)
        xpub.send_multipart([b"", (1).to_bytes(8, "big"), encode_batch(good)])
        rerun_until(page, lambda at: metric(at, "batches") == "1", "the good batch")
        assert metric(page, "malformed") == "1"
        assert metric(page, "cached blocks") == "1"
        assert any("malformed" in e.label for e in page.expander)
        sub = page.session_state["kv_watch"].subscriber
        page.button(key="kv_disconnect_btn").click().run()
        assert sub.closed and "kv_watch" not in page.session_state
        assert any("Not watching" in i.value for i in page.info)
    finally:
        xpub.close()


@needs_model
def test_the_pages_watch_tab_watches_an_engine(monkeypatch, engine):
    eng, endpoint, replay = engine
    eng.add_request(list(range(1, 14)), SamplingParams(max_tokens=3, ignore_eos=True))
    while eng.has_unfinished_requests():
        eng.step()
    assert eng.publishers[0].flush()
    monkeypatch.setenv("PAGED_LAB_MODEL", MODEL)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    at = AppTest.from_file(str(ROOT / "app" / "streamlit_app.py"), default_timeout=180)
    at.run()
    at.session_state["w_tab"] = "Watch vLLM"
    at.run()
    assert not at.exception, at.exception
    try:
        connect(at, endpoint, replay)
        n = len(eng.bm.gpu.cached)
        rerun_until(at, lambda a: metric(a, "cached blocks") == str(n), f"{n} cached blocks")
        nodes = [t for t in chart(at, "fig_kv_tree")["data"] if t.get("mode", "").startswith("markers")]
        assert {h for t in nodes for h in t["customdata"]} == set(eng.bm.gpu.cached)
    finally:
        at.session_state["kv_watch"].subscriber.close()


def block(h: bytes, parent: bytes | None, seq: int) -> CachedBlock:
    return CachedBlock(h, parent, (1, 2), 2, 0, "GPU", 0, seq, float(seq), 1)


def test_the_tree_builders_lay_out_prefixes_and_survive_a_corrupt_stream():
    blocks = [block(b"r", None, 0), block(b"c", b"r", 1), block(b"d", b"r", 2),
              block(b"e", b"c", 3), block(b"o", b"gone", 4),      # parent evicted
              block(b"A", b"B", 5), block(b"B", b"A", 6)]         # a loop of parent hashes
    layout = tree_layout(blocks)
    assert len(layout) == len(blocks)
    depth = {k[3]: v[0] for k, v in layout.items()}
    below = {k[3]: v[2] for k, v in layout.items()}
    assert (depth[b"r"], depth[b"c"], depth[b"e"], depth[b"o"]) == (0, 1, 2, 0)
    assert below[b"r"] == 3 and below[b"c"] == 1
    assert layout[blocks[1].key][1] < layout[blocks[0].key][1] < layout[blocks[2].key][1]
    fig = prefix_tree_figure(blocks)
    orphans = next(t for t in fig.data if "parent not cached" in t.name)
    assert list(orphans.customdata) == [b"o".hex()]
    # newest first, each with its ancestors; chains that no longer fit are skipped
    newest = keep_newest(blocks, 4)
    assert {b.block_hash for b in newest} == {b"B", b"A", b"o", b"r"}
    assert "newest 4 of 7" in prefix_tree_figure(blocks, max_blocks=4).layout.title.text
    assert "no cached blocks" in prefix_tree_figure([]).layout.annotations[0].text


def test_the_event_charts_bin_a_long_stream():
    view = PrefixCacheView()
    for i in range(500):
        stored = BlockStored([i.to_bytes(32, "big")], None, [1, 2], 2, None, "GPU", None)
        view.apply(ReceivedBatch(i, 1000.0 + i, (stored,), 0))
    frame = view.series_frame()
    bins = binned(frame, max_bins=50)
    assert len(bins) <= 51 and bins["stored"].sum() == 500
    assert len(binned(frame.head(10))) == 10          # few batches: one bar each
    assert len(event_rate_figure(frame).data) == 2
    assert cached_blocks_figure(frame).data[0].y[-1] == 500
    assert "no KV event batches" in event_rate_figure(frame.head(0)).layout.annotations[0].text


def test_the_status_tells_what_was_really_seen(page, monkeypatch):
    """Where nothing publishes, the status never says "connected": first "waiting", then, after
    a few seconds, "no publisher reached yet" with what to check. Ranks out of range are
    refused as typed; a long endpoint is not echoed whole."""
    from app.views import watch
    allow(monkeypatch, "*")
    for typed in (0, 100):
        page.number_input(key="w_kv_ranks").set_value(typed)
        page.button(key="kv_connect_btn").click().run()
        assert not page.exception
        assert "Data-parallel ranks must be a whole number from 1 to 64" in shown(page.error[0])
        assert "kv_watch" not in page.session_state
    page.number_input(key="w_kv_ranks").set_value(1)
    long = "tcp://" + "a" * 300 + ":5557"
    page.text_input(key="w_kv_endpoint").input(long)
    page.button(key="kv_connect_btn").click().run()
    status = watch._status(page.session_state["kv_watch"])
    assert "a" * 100 not in status and "…" in status
    page.text_input(key="w_kv_endpoint").input(long.replace(":5557", ":99999"))
    page.button(key="kv_connect_btn").click().run()  # refused: the message shortens it too
    assert "port 99999" in page.error[0].value and "a" * 100 not in shown(page.error[0])
    page.text_input(key="w_kv_endpoint").input(f"tcp://127.0.0.1:{free_port()}")
    page.button(key="kv_connect_btn").click().run()
    w = page.session_state["kv_watch"]
    now = watch._status(w)
    assert "waiting for a publisher at" in now and "nothing received yet" in now
    assert "connected" not in now
    later = watch._status(w, now=w.since + 6)
    assert later.startswith("no publisher reached yet at") and "--kv-events-config" in later


# ---- a shared server: what a visitor may watch ---------------------------------------------
REFUSED_BY_DEFAULT = [  # (endpoint, Listen, the setting the message must name)
    ("tcp://10.0.0.1:5557", False, "tcp://10.0.0.1:5557 in PAGED_LAB_WATCH_ENDPOINTS"),
    ("tcp://*:6000", True, "PAGED_LAB_WATCH_LISTEN=1"),
    ("ipc:///etc/x", False, "PAGED_LAB_WATCH_IPC=1"),
]


@pytest.fixture
def sockets_made(monkeypatch):
    """Every ZeroMQ socket and subscriber the Watch view makes from now on."""
    from app.views import watch
    made = []
    real_socket, real_subscriber = zmq.Context.socket, watch.KVEventSubscriber

    def socket_spy(ctx, *args, **kwargs):
        made.append(("socket", args))
        return real_socket(ctx, *args, **kwargs)

    def subscriber_spy(*args, **kwargs):
        made.append(("subscriber", args))
        return real_subscriber(*args, **kwargs)
    monkeypatch.setattr(zmq.Context, "socket", socket_spy)
    monkeypatch.setattr(watch, "KVEventSubscriber", subscriber_spy)
    return made


@pytest.mark.parametrize("endpoint, listen, setting", REFUSED_BY_DEFAULT)
def test_the_check_refuses_what_a_hosted_server_does_not_allow(endpoint, listen, setting,
                                                               sockets_made):
    from app.hosting import WatchNotAllowed, check_watch_allowed
    with pytest.raises(WatchNotAllowed) as e:
        check_watch_allowed(endpoint, bind=listen)
    message = str(e.value)
    assert f"the endpoint {endpoint!r}" in message and setting in message   # the API's words
    assert ("bind=True (binding it on this server) is off" in message) == listen
    assert sockets_made == []


def test_the_operators_settings_allow_them(monkeypatch):
    from app.hosting import WatchNotAllowed, check_watch_allowed
    # the default: a local vllm serve, its replay socket, and its ranks' ports (5557 + rank)
    assert check_watch_allowed(" tcp://localhost:5557 ", "tcp://localhost:5558") == (
        "tcp://localhost:5557", "tcp://localhost:5558")
    assert check_watch_allowed("tcp://127.0.0.1:5557", "tcp://127.0.0.1:6557",
                               data_parallel_size=8)[1] == "tcp://127.0.0.1:6557"
    with pytest.raises(WatchNotAllowed, match="with data_parallel_size 9 it also watches "
                                              "tcp://127.0.0.1:5565, which is not on"):
        check_watch_allowed("tcp://127.0.0.1:5557", data_parallel_size=9)
    with pytest.raises(WatchNotAllowed, match="the replay_endpoint 'tcp://10.0.0.1:5558'"):
        check_watch_allowed("tcp://127.0.0.1:5557", "tcp://10.0.0.1:5558")
    allow(monkeypatch, "tcp://10.0.0.1:5557")                     # an allowlisted endpoint
    assert check_watch_allowed("tcp://10.0.0.1:5557")[0] == "tcp://10.0.0.1:5557"
    with pytest.raises(WatchNotAllowed, match="tcp://10.0.0.2:5557 in PAGED_LAB"):
        check_watch_allowed("tcp://10.0.0.2:5557")
    monkeypatch.setenv("PAGED_LAB_WATCH_LISTEN", "1")             # Listen on, but not listed
    with pytest.raises(WatchNotAllowed) as e:
        check_watch_allowed("tcp://*:6000", bind=True)
    assert "PAGED_LAB_WATCH_LISTEN" not in str(e.value)
    assert "tcp://*:6000 in PAGED_LAB_WATCH_ENDPOINTS" in str(e.value)
    allow(monkeypatch, "*")                                       # one user on their own machine
    assert check_watch_allowed("tcp://10.0.0.1:5557")[0] == "tcp://10.0.0.1:5557"
    assert check_watch_allowed("tcp://*:6000", bind=True)[0] == "tcp://*:6000"
    with pytest.raises(WatchNotAllowed, match="PAGED_LAB_WATCH_IPC=1") as e:
        check_watch_allowed("ipc:///etc/x")                       # `*` does not turn ipc on
    assert "PAGED_LAB_WATCH_ENDPOINTS" not in str(e.value)
    monkeypatch.setenv("PAGED_LAB_WATCH_IPC", "1")
    assert check_watch_allowed("ipc:///etc/x")[0] == "ipc:///etc/x"
    monkeypatch.setenv("PAGED_LAB_WATCH_IPC", "yes")
    with pytest.raises(ValueError, match="PAGED_LAB_WATCH_IPC must be 0 or 1, got 'yes'"):
        check_watch_allowed("ipc:///etc/x")


@pytest.mark.parametrize("endpoint, listen, setting", REFUSED_BY_DEFAULT)
def test_the_page_refuses_them_before_any_socket_exists(endpoint, listen, setting, page,
                                                        sockets_made):
    page.text_input(key="w_kv_endpoint").input(endpoint)
    page.checkbox(key="w_kv_bind").set_value(listen)
    page.button(key="kv_connect_btn").click().run()
    assert not page.exception
    assert len(page.error) == 1
    message = shown(page.error[0])
    assert message.startswith(f"Cannot watch: this server does not let sessions watch the "
                              f"Endpoint {endpoint!r}")                   # the page's words
    assert setting in message
    assert ("Listen (binding it on this server) is off" in message) == listen
    assert "kv_watch" not in page.session_state and sockets_made == []


def test_listening_on_an_ipc_file_is_refused_and_creates_no_file(page, sockets_made, tmp_path,
                                                                 monkeypatch):
    path = tmp_path / "kv.sock"
    page.text_input(key="w_kv_endpoint").input(f"ipc://{path}")
    page.checkbox(key="w_kv_bind").check()
    page.button(key="kv_connect_btn").click().run()
    message = shown(page.error[0])
    assert "PAGED_LAB_WATCH_IPC=1 and PAGED_LAB_WATCH_LISTEN=1" in message
    assert not path.exists() and sockets_made == []
    # the operator allows it: the same click binds the file
    for name in ("PAGED_LAB_WATCH_IPC", "PAGED_LAB_WATCH_LISTEN"):
        monkeypatch.setenv(name, "1")
    allow(monkeypatch, f"ipc://{path}")
    page.button(key="kv_connect_btn").click().run()
    assert not page.error and path.exists()
    assert page.session_state["kv_watch"].subscriber.bind


def test_the_page_watches_what_the_operator_allows(page, monkeypatch):
    port = free_port()
    allow(monkeypatch, f"tcp://127.0.0.1:{port}")
    connect(page, f"tcp://127.0.0.1:{port}")
    assert page.session_state["kv_watch"].subscriber.endpoint == f"tcp://127.0.0.1:{port}"
    allow(monkeypatch, "*")
    connect(page, f"tcp://127.0.0.1:{free_port()}")
    monkeypatch.setenv("PAGED_LAB_WATCH_LISTEN", "1")
    page.checkbox(key="w_kv_bind").check()
    connect(page, f"tcp://127.0.0.1:{free_port()}")
    assert page.session_state["kv_watch"].subscriber.bind
    assert "listening on" in page.caption[0].value


# ---- one subscription per session, released with the session -------------------------------
@pytest.fixture
def lab_page(monkeypatch):
    """The Watch view in a session that has a lab (the page always has one): no engine needed."""
    from app.scenarios import DEFAULT_SCENARIO, preset
    from app.lab import Lab
    allow(monkeypatch, "*")
    lab = Lab(preset(DEFAULT_SCENARIO))
    at = AppTest.from_function(watch_page, default_timeout=30)
    at.session_state["lab"] = lab
    at.run()
    assert not at.exception
    yield at, lab
    if lab.watch is not None:
        lab.watch.close()


def test_a_session_holds_one_subscription(lab_page, monkeypatch):
    from app.views import watch
    at, lab = lab_page
    made = []
    real = watch.KVEventSubscriber
    monkeypatch.setattr(watch, "KVEventSubscriber",
                        lambda *a, **k: made.append(real(*a, **k)) or made[-1])
    for _ in range(3):
        connect(at, f"tcp://127.0.0.1:{free_port()}")
    assert [s.closed for s in made] == [True, True, False]    # each Connect closed the one before
    assert at.session_state["kv_watch"].subscriber is made[-1] and lab.watch.subscriber is made[-1]
    at.text_input(key="w_kv_endpoint").input("tcp://127.0.0.1:99999")
    at.button(key="kv_connect_btn").click().run()             # refused: and the old one is closed
    assert "port 99999" in shown(at.error[0])
    assert made[-1].closed and lab.watch is None and "kv_watch" not in at.session_state
    connect(at, f"tcp://127.0.0.1:{free_port()}")
    at.button(key="kv_disconnect_btn").click().run()
    assert made[-1].closed and lab.watch is None and len(made) == 4


def test_an_idle_sessions_subscription_is_closed_with_its_engine(lab_page, monkeypatch):
    from app.idle_sessions import release_idle_labs
    at, lab = lab_page
    monkeypatch.setenv("PAGED_LAB_IDLE_MINUTES", "1")
    connect(at, f"tcp://127.0.0.1:{free_port()}")
    sub = lab.watch.subscriber
    assert release_idle_labs(now=lab.last_active + 30, labs=[lab]) == 0 and not sub.closed
    assert release_idle_labs(now=lab.last_active + 61, labs=[lab]) == 1
    assert sub.closed and lab.watch is None
    at.run()                                                  # the tab says why
    assert "kv_watch" not in at.session_state
    assert any("Not watching" in i.value for i in at.info)
    assert "idle for more than 1 minute," in at.warning[0].value
    connect(at, f"tcp://127.0.0.1:{free_port()}")             # Connect again: a new one
    assert not lab.watch.subscriber.closed and not at.warning


def test_a_disconnected_sessions_subscription_is_closed_after_the_window(lab_page, monkeypatch):
    from app.idle_sessions import release_idle_labs
    at, lab = lab_page
    monkeypatch.setenv("PAGED_LAB_IDLE_MINUTES", "0")         # only the disconnection counts
    connect(at, f"tcp://127.0.0.1:{free_port()}")
    sub = lab.watch.subscriber
    lab.session_id = "gone"
    t = time.monotonic()
    sweep = lambda now: release_idle_labs(now=now, labs=[lab],  # noqa: E731
                                          is_connected=lambda sid: False, disconnected_s=30)
    assert sweep(t + 1) == 0 and sweep(t + 20) == 0 and not sub.closed
    assert sweep(t + 32) == 1 and sub.closed and lab.watch is None
    lab.session_id = None                  # not a session the process's own sweeper may sweep
    at.run()
    assert "disconnected from the server for too long" in at.warning[0].value


def test_the_sweeper_closes_a_subscription_while_the_view_polls_it():
    """Lab.release runs in the sweeper's thread: closing waits for a receive in progress
    (ZeroMQ sockets are not thread-safe), and a receive after it gets nothing."""
    import threading
    from engine.kv_events.subscriber import KVEventSubscriber
    sub = KVEventSubscriber(f"tcp://127.0.0.1:{free_port()}")
    got = []
    polling = threading.Thread(target=lambda: got.append(sub.receive(timeout_s=0.5)))
    polling.start()
    time.sleep(0.1)
    sub.close()                                               # waits for the receive to end
    assert not polling.is_alive() and got == [[]] and sub.closed
    assert sub.receive(timeout_s=0.1) == []
