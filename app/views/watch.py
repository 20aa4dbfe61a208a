"""The "Watch vLLM" tab: a live view of a KV cache event stream -- a vLLM server's
(``--kv-events-config``) or this engine's publisher (``EngineConfig.kv_events_endpoint``).

One subscriber per browser session lives in st.session_state (Connect closes the one before);
every run of the live fragment drains it briefly and feeds a PrefixCacheView, which the figures
draw (app/figures/prefix_tree.py, app/figures/kv_event_charts.py). The "Scheduler tap" mode (a
server's block tables drawn by the page's own figures) is app/views/watch_tap.py. Nothing here
talks to the page's own engine. The session's lab holds the subscription too (``Lab.watch``), so an idle or
disconnected session's is closed with its engine, by the same sweep (app/idle_sessions.py).

On a shared server a visitor must not make it connect anywhere, listen, or create socket files:
``hosting.check_watch_allowed`` checks what was typed against the operator's settings
(PAGED_LAB_WATCH_ENDPOINTS, _LISTEN, _IPC) before any socket exists.

The figures go through the figure cache like every other (one per watch): the view is one object
that changes as batches arrive, so they are keyed by it and by its batch count, and a refresh
that received nothing draws the figures it built before.
"""
from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import dataclass, field

import streamlit as st

from engine.kv_events.cache_view import PrefixCacheView
from engine.kv_events.subscriber import KVEventSubscriber
from engine.kv_events.wire import shown

from app import hosting
from app.figure_cache import FigureCache
from app.figures import kv_event_charts, prefix_tree
from app.views.common import chart

DEFAULT_ENDPOINT = "tcp://127.0.0.1:5557"
REFRESH_S = 1.0
DRAIN_TIMEOUT_S = 0.05                 # how long one run waits for the first new batch
STATE, ERROR, ENDED = "kv_watch", "kv_watch_error", "kv_watch_ended"
# the fields' labels, for the allowlist check's messages (hosting.check_watch_allowed)
FIELD_NAMES = {"endpoint": "Endpoint", "replay_endpoint": "Replay endpoint", "bind": "Listen",
               "data_parallel_size": "Data-parallel ranks"}
CHART = {"displayModeBar": False, "displaylogo": False}

HELP = """\
Start vLLM with prefix caching and KV cache events on, publishing over ZeroMQ:

```bash
vllm serve MODEL --enable-prefix-caching \\
  --kv-events-config '{"enable_kv_cache_events": true, "publisher": "zmq",
                       "endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5558",
                       "topic": "kv"}'
```

Then enter **tcp://HOST:5557** here (the server binds `*`; you connect to its address), the
same **topic** (`kv` here and in the README; empty = every topic), and, optionally, the **replay endpoint**
`tcp://HOST:5558`: with it, batches missed in transit -- and the history the server still
buffers when you connect -- are fetched again, so the tree below is complete.

**Data parallelism:** each of *N* ranks publishes on its own port, the base port + rank
(5557, 5558, … and the replay ports likewise). With one rank the usual pair is 5557 and
replay 5558 (as in the README); with *N* > 1 ranks the live ports 5557…5557+N−1 would run into
replay 5558, so give the server's replay endpoint another base (e.g. 6557) and enter the same
here. Set *data-parallel ranks* to *N* to watch all of them.

**This engine:** `EngineConfig(kv_events_endpoint="tcp://*:5557")` publishes the same format.
A publisher given a *connect* address (`tcp://127.0.0.1:5557`) pushes to a listener instead:
tick *Listen* here for that.

**On a shared server** you can watch only the endpoints its operator lists
(`PAGED_LAB_WATCH_ENDPOINTS`; by default a vLLM on the server itself: `127.0.0.1` or
`localhost`, ports 5557–5564 and 6557–6564), and *Listen* and `ipc://` endpoints are off unless
the operator allows them (`PAGED_LAB_WATCH_LISTEN=1`, `PAGED_LAB_WATCH_IPC=1`). A refused
endpoint says which setting would allow it.
"""


@dataclass
class Watch:
    """What one session watches: its subscriber and the cache rebuilt from what it received."""
    subscriber: KVEventSubscriber
    view: PrefixCacheView = field(default_factory=PrefixCacheView)
    since: float = field(default_factory=time.monotonic)     # when Connect was pressed
    figures: FigureCache = field(default_factory=lambda: FigureCache(capacity=3))
    ended: str = ""                    # why the server closed it ("idle", "disconnected")

    def poll(self, timeout_s: float = DRAIN_TIMEOUT_S) -> int:
        batches = self.subscriber.receive(timeout_s)
        self.view.apply_all(batches)
        return len(batches)

    def close(self, why: str = "") -> None:
        """Close the sockets (also from the idle sweeper's thread: ``Lab.release``)."""
        self.ended = why
        self.subscriber.close()


# the live view's figures, from the view as it is after ``batches`` batches (the cache's key)
LIVE_TREE_PX = 560         # fixed: a figure that grew with each batch moved the page under the
LIVE_TABLE_PX = 388        # reader's eyes (issue 38, finding 16); the table: header + 10 rows
STATUS_PX = 84             # the status's three caption lines


def _tree_figure(view: PrefixCacheView, batches: int):
    return prefix_tree.prefix_tree_figure(view.blocks.values(), height=LIVE_TREE_PX)


def _rate_figure(view: PrefixCacheView, batches: int):
    return kv_event_charts.event_rate_figure(view.series_frame())


def _cached_figure(view: PrefixCacheView, batches: int):
    return kv_event_charts.cached_blocks_figure(view.series_frame())


def _lab():
    """The session's lab (the page always has one; the Watch view alone, in tests, may not)."""
    return st.session_state.get("lab")


def _hold(w: Watch) -> None:
    """The session's one subscription: the tab draws it, the lab closes it when released."""
    st.session_state[STATE] = w
    lab = _lab()
    if lab is not None:
        lab.watch = w


def _close() -> None:
    w = st.session_state.pop(STATE, None)
    lab = _lab()
    if lab is not None and lab.watch is w:
        lab.watch = None
    if w is not None:
        w.close()


def _disconnect() -> None:
    _close()
    _retime()


def _retime() -> None:
    """The live view's timer changes (off, or on): rerun the whole page. This tab is drawn in
    the main view's fragment, and Streamlit keeps a redrawn fragment's old timer running when
    only that fragment reruns (measured: with Auto-refresh off or after Disconnect the view
    still redrew every second)."""
    st.rerun(scope="app")


MAX_RANKS = 64
NO_PUBLISHER_AFTER_S = 5.0       # nothing received this long after Connect: say what to check


def _connect() -> None:
    lab = _lab()
    with lab.in_use() if lab is not None else nullcontext():   # not released halfway through
        _start_watch()


def _start_watch() -> None:
    """Close the session's subscription, then open the one the fields ask for, if this server
    allows it: the check runs before any socket exists."""
    from app.views import watch_tap
    ss = st.session_state
    _close()
    watch_tap.close()                  # a session holds one subscription, of either mode
    ss[ERROR], ss[ENDED] = None, ""
    ranks = ss.get("w_kv_ranks", 1)
    if not isinstance(ranks, (int, float)) or ranks != int(ranks) or \
            not 1 <= ranks <= MAX_RANKS:             # refused as typed, never clamped
        ss[ERROR] = (f"Cannot watch: Data-parallel ranks must be a whole number from 1 to "
                     f"{MAX_RANKS}, got {ranks:g}" if isinstance(ranks, (int, float)) else
                     f"Cannot watch: Data-parallel ranks must be a whole number from 1 to "
                     f"{MAX_RANKS}")
        return
    bind = bool(ss.get("w_kv_bind", False))
    try:
        endpoint, replay = hosting.check_watch_allowed(
            ss.get("w_kv_endpoint", DEFAULT_ENDPOINT), ss.get("w_kv_replay") or None,
            bind=bind, data_parallel_size=int(ranks), names=FIELD_NAMES)
        sub = KVEventSubscriber(endpoint, topic=ss.get("w_kv_topic", ""),
                                replay_endpoint=replay, bind=bind,
                                data_parallel_size=int(ranks))
    except ValueError as e:
        ss[ERROR] = f"Cannot watch: {e}"
    except Exception as e:              # a socket problem we did not foresee: say it, no trace
        ss[ERROR] = f"Cannot watch ({type(e).__name__}): {e}"
    else:
        _hold(Watch(sub))


def _status(w: Watch, now: float | None = None) -> str:
    """What the subscriber has really seen, in at most three lines: ZeroMQ connects in the
    background, so until a batch arrives nothing says a publisher is there."""
    sub, view = w.subscriber, w.view
    seqs = sub.last_seqs()
    if not seqs:
        waited = (time.monotonic() if now is None else now) - w.since
        where = f"`{shown(sub.endpoint)}`"
        if waited < NO_PUBLISHER_AFTER_S:
            return (f"{'listening on' if sub.bind else 'waiting for a publisher at'} {where}: "
                    "nothing received yet")
        return (f"no publisher reached yet at {where} ({waited:.0f} s, nothing received). "
                "Check that the server runs with KV events on (`--kv-events-config`, publisher "
                "`zmq`), that HOST:PORT is its address (it binds `tcp://*:PORT`; connect to "
                "the host it runs on), that the topic matches its `topic` (empty: all), and "
                "that it has had requests to publish about")
    mode = "listening on" if sub.bind else "receiving from"
    where = " · ".join([f"{mode} `{shown(sub.endpoint)}`", f"topic `{sub.topic or '(all)'}`",
                        f"replay `{shown(sub.replay_endpoint)}`" if sub.replay_endpoint
                        else "no replay endpoint"])
    arrived = "last batch " + ", ".join(f"rank {r}: seq {s}" for r, s in sorted(seqs.items()))
    if sub.recovered:
        arrived += f" · {sub.recovered} batches fetched by replay"
    history = []
    late = {r: s for r, s in sub.joined_at().items() if s > 0}
    if late:
        history.append("joined late (history before " + ", ".join(
            f"rank {r} seq {s}" for r, s in sorted(late.items())) + " not shown)")
    if view.unknown_removed:
        history.append(f"{view.unknown_removed} removals of blocks stored before watching")
    # always three lines, each growing only by digits: a line that appeared or wrapped midway
    # moved everything below it on each refresh (issue 38, finding 16)
    return "  \n".join([where, arrived, " · ".join(history) or "whole history since seq 0"])


def _ended_note(why: str) -> str:
    if why == "handed over":
        cause = "a newer tab of this browser took over this page's real vLLM"
    elif why == "disconnected":
        cause = "this page was disconnected from the server for too long"
    else:
        minutes = (hosting.idle_seconds() or 0) / 60
        cause = f"this session was idle for more than {minutes:g} minute{'s' * (minutes != 1)}"
    return (f"The server stopped watching because {cause}, to free what the session held. "
            "Press **Connect** to watch again.")


def _current() -> Watch | None:
    """The session's subscription; one the server closed (released with the lab: idle,
    disconnected) is dropped, and the tab says why."""
    ss = st.session_state
    w: Watch | None = ss.get(STATE)
    if w is not None and w.subscriber.closed:
        ss.pop(STATE, None)
        ss[ENDED] = w.ended or "idle"
        return None
    return w


def live_view() -> None:
    """Drain the subscriber and draw; runs as a fragment (alone, on its timer or Refresh)."""
    # a subscription closed meanwhile does not rerun the whole page to stop the timer: that
    # would revive the idle lab's engine; the next whole-page run stops it
    w = _current()
    if w is None:
        st.info("Not watching: enter an endpoint above and press **Connect**.")
        if st.session_state.get(ENDED):
            st.warning(_ended_note(st.session_state[ENDED]))
        return
    st.button("↻ Refresh", key="kv_refresh_btn", help="take what arrived since the last look")
    w.poll()
    sub, view = w.subscriber, w.view
    cols = st.columns(6)
    cols[0].metric("cached blocks", len(view.blocks))
    cols[1].metric("batches", view.batches)
    cols[2].metric("blocks stored", view.stored_total)
    cols[3].metric("blocks removed", view.removed_total)
    # short labels: six metrics share the row, and a longer one was cut ("malformed messa…")
    cols[4].metric("malformed", sub.malformed_count,
                   help="messages that were not KV event batches: counted and skipped")
    cols[5].metric("lost batches", sub.lost,
                   help="sequence numbers that never arrived and replay could not fill")
    # a fixed height: the status's length changes while the view redraws every second
    st.container(height=STATUS_PX, border=False).caption(_status(w))
    chart(w.figures, _tree_figure, view, view.batches, key="fig_kv_tree", config=CHART)
    left, right = st.columns(2)
    with left:
        chart(w.figures, _rate_figure, view, view.batches, key="fig_kv_rate", config=CHART)
    with right:
        chart(w.figures, _cached_figure, view, view.batches, key="fig_kv_cached", config=CHART)
    st.markdown("**Latest events** (newest first)")
    st.dataframe(view.events_frame(50), hide_index=True, key="kv_events_table",
                 height=LIVE_TABLE_PX)
    # what appears only sometimes comes last: above the figures it moved them when it appeared
    if sub.gaps:
        st.warning("Missing batches: " + "; ".join(
            f"rank {g.rank} seq {g.first}–{g.last} ({g.reason})" for g in sub.gaps[-5:]))
    if sub.malformed_count:
        with st.expander(f"{sub.malformed_count} malformed messages (latest reasons)"):
            st.code("\n".join(list(sub.malformed)[-10:]), language=None)


KV_EVENTS, TAP = "KV cache events", "Scheduler tap"


def _mode_changed() -> None:
    """A session holds one subscription: the other mode's is closed, not left to fill up."""
    from app.views import watch_tap
    _close()
    watch_tap.close()
    _retime()


def draw(_shown=None) -> None:
    """The tab (it draws a stream, not the lab: nothing of ``Shown`` is used): the KV cache
    events mode below, or the scheduler tap's (app/views/watch_tap.py)."""
    mode = st.radio("Watch", (KV_EVENTS, TAP), horizontal=True, key="w_watch_mode",
                    on_change=_mode_changed,
                    help="KV cache events: the prefix cache of any vLLM server with "
                         "--kv-events-config. Scheduler tap: its block tables, pool and queues, "
                         "from a server running the tap")
    if mode == TAP:
        from app.views import watch_tap
        st.markdown("Watch a **vLLM server**'s block tables, pool and queues live, from its "
                    "scheduler tap, drawn by this page's own figures.")
        watch_tap.draw()
        return
    st.markdown("Watch the prefix cache of a **vLLM server** live, from the KV cache events it "
                "publishes over ZeroMQ (or this engine's publisher: same format).")
    with st.expander("How to point this at a vLLM deployment"):
        st.markdown(HELP)
    c = st.columns([3, 1.3, 3, 1, 1])
    c[0].text_input("Endpoint (the server's PUB socket)", value=DEFAULT_ENDPOINT,
                    key="w_kv_endpoint")
    c[1].text_input("Topic", value="", key="w_kv_topic", help="empty: every topic")
    c[2].text_input("Replay endpoint (optional)", value="", key="w_kv_replay",
                    placeholder="tcp://127.0.0.1:5558",
                    help="the server's replay_endpoint: refetches missed batches")
    c[3].number_input("Data-parallel ranks", value=1, step=1, key="w_kv_ranks",
                      help=f"1 to {MAX_RANKS}: vLLM publishes rank r on the base port + r")
    c[4].checkbox("Listen", value=False, key="w_kv_bind",
                  help="bind the endpoint instead of connecting (for a publisher that connects)")
    watching = _current() is not None
    b = st.columns([1, 1, 2, 4])
    b[0].button("Connect" if not watching else "Reconnect", type="primary", key="kv_connect_btn",
                on_click=_connect)
    b[1].button("Disconnect", key="kv_disconnect_btn", on_click=_disconnect, disabled=not watching)
    auto = b[2].toggle("Auto-refresh", value=True, key="w_kv_auto", on_change=_retime,
                       help=f"redraw every {REFRESH_S:g} s")
    if st.session_state.get(ERROR):
        # as typed, never Markdown: the endpoint is the visitor's (app/plain_text.py)
        from app.plain_text import plain
        st.error(plain(st.session_state[ERROR]))
    st.fragment(live_view, run_every=REFRESH_S if auto and watching else None)()
