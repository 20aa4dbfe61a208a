"""The Watch vLLM tab's "Scheduler tap" mode (issue 40): a running ``vllm serve``'s block tables,
pool, queues and preemptions, live, drawn by the page's own figures.

The tap (real_vllm/tap/: vLLM's scheduler publishing a frame per phase) is followed by a
``TapFollower`` (real_vllm/tap/follower.py), which turns each engine step into a
``StepSnapshot``; this view only draws them: block tables and pool (app/figures/block_tables.py,
pool_grid.py), metrics, timeline and narration, as the Memory tab draws our engine's. As in the
KV events mode (app/views/watch.py): one subscription per session, held by the lab (closed when
it is released), endpoints checked by ``hosting.check_watch_allowed`` before any socket exists,
a live fragment on a timer, fixed heights so the view does not move while it redraws (issue 38,
finding 16). Pausing freezes the steps received so far (the follower keeps receiving, so no
frame is lost meanwhile) and the slider scrubs them; Live follows the newest again.
"""
from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import dataclass, field

import streamlit as st

from engine.kv_events.wire import shown
from real_vllm.tap import frames
from real_vllm.tap.follower import MAX_RANKS, TapFollower, unknown_tokens

from app import hosting, narration, trace_io
from app.figure_cache import FigureCache
from app.figures import block_tables, metrics, pool_grid, timeline
from app.views import watch
from app.views.common import chart

STATE, ERROR, ENDED = "tap_watch", "tap_watch_error", "tap_watch_ended"
FIELD_NAMES = {"endpoint": "Tap endpoint", "replay_endpoint": "Replay endpoint",
               "bind": "Listen", "data_parallel_size": "Data-parallel ranks"}
ALL_RANKS = "all, side by side"
# fixed heights (issue 38, finding 16): the block tables grow by a row per request, the
# narration by a sentence per event; in a box of their own they scroll instead of moving the page
STATUS_PX = 84
NARRATION_PX = 120
FIGURE_PX = 560
SLIDER_PX = 90

HELP = f"""\
The **scheduler tap** publishes what vLLM's scheduler holds after each phase of each step --
every request's block table, every block's ref count and hash, the queues, the preemptions --
so the figures below are the server's own memory, not a replay. Start the server with the tap
(real_vllm/tap/; it binds `tcp://*:5570`, rank *r* on port 5570 + *r*), then enter
**tcp://HOST:5570** here (the host it runs on), the same **topic** (`{frames.DEFAULT_TOPIC}` by
default) and the number of **data-parallel ranks**. Request ids are the server's (`cmpl-…`);
token ids are not sent, so tokens show as `?`.

A late start is fine: the tap sends a keyframe (the whole state) every few seconds, and the view
waits for one. Frames lost in transit are counted as gaps (the view then waits for the next
keyframe); frames that contradict themselves (a ref count that no table explains, a free count
that does not add up) are counted as invariant violations. **Pause** freezes the steps received
so far: scrub them with the slider, or download them as a trace (the trace upload in the
sidebar replays it). On a shared server only the operator's endpoints can be watched
(`PAGED_LAB_WATCH_ENDPOINTS`, as for KV events).
"""


@dataclass
class TapWatch:
    """What one session follows: the follower and, while paused, the steps frozen."""
    follower: TapFollower
    since: float = field(default_factory=time.monotonic)     # when Connect was pressed
    figures: FigureCache = field(default_factory=lambda: FigureCache(capacity=8))
    ended: str = ""
    frozen: dict[int, list] | None = None      # rank -> its snapshots when Pause was pressed
    pauses: int = 0                            # numbers each pause's slider (a fresh widget)

    def close(self, why: str = "") -> None:
        """Close the sockets (also from the idle sweeper's thread: ``Lab.release``)."""
        self.ended = why
        self.follower.close()


def close() -> None:
    """Close the session's tap subscription, if any."""
    w = st.session_state.pop(STATE, None)
    lab = watch._lab()
    if lab is not None and lab.watch is w:
        lab.watch = None
    if w is not None:
        w.close()


def _disconnect() -> None:
    close()
    watch._retime()


def _connect() -> None:
    lab = watch._lab()
    with lab.in_use() if lab is not None else nullcontext():
        _start()


def _start() -> None:
    """Close the session's subscriptions (a session holds one), then follow the tap the
    fields name, if this server allows it: the check runs before any socket exists."""
    ss = st.session_state
    watch._close()
    close()
    ss[ERROR], ss[ENDED] = None, ""
    ss["w_tap_live"] = True            # a new subscription starts live (nothing frozen)
    ranks = ss.get("w_tap_ranks", 1)
    if not isinstance(ranks, (int, float)) or isinstance(ranks, bool) or ranks != int(ranks) \
            or not 1 <= ranks <= MAX_RANKS:          # refused as typed, never clamped
        got = f", got {ranks:g}" if isinstance(ranks, (int, float)) else ""
        ss[ERROR] = (f"Cannot watch: Data-parallel ranks must be a whole number from 1 to "
                     f"{MAX_RANKS}{got}")
        return
    topic = ss.get("w_tap_topic", frames.DEFAULT_TOPIC)
    if not isinstance(topic, str):
        ss[ERROR] = "Cannot watch: the Topic must be text"
        return
    try:
        endpoint, _ = hosting.check_watch_allowed(
            ss.get("w_tap_endpoint", frames.DEFAULT_ENDPOINT), None,
            data_parallel_size=int(ranks), names=FIELD_NAMES)
        follower = TapFollower(endpoint, topic, data_parallel_size=int(ranks))
    except ValueError as e:
        ss[ERROR] = f"Cannot watch: {e}"
    except Exception as e:              # a socket problem we did not foresee: say it, no trace
        ss[ERROR] = f"Cannot watch ({type(e).__name__}): {e}"
    else:
        w = TapWatch(follower)
        ss[STATE] = w
        lab = watch._lab()
        if lab is not None:
            lab.watch = w


def _current() -> TapWatch | None:
    """The session's tap subscription; one the server closed (idle, disconnected) is dropped,
    and the tab says why."""
    ss = st.session_state
    w = ss.get(STATE)
    if w is not None and w.follower.closed:
        ss.pop(STATE, None)
        ss[ENDED] = w.ended or "idle"
        return None
    return w


def _pause_changed() -> None:
    """Live on: follow the newest step; off: freeze what arrived, for the slider."""
    w = _current()
    if w is not None:
        if st.session_state.get("w_tap_live", True):
            w.frozen = None
        else:
            w.frozen = {r: m.snapshots for r, m in w.follower.models.items()}
            w.pauses += 1


def status(w: TapWatch, now: float | None = None) -> str:
    """What has really arrived, in three lines that only grow by digits (issue 38, 16)."""
    f = w.follower
    where = f"`{shown(f.endpoint)}`" + (f" (+{f.data_parallel_size - 1} ranks)"
                                        if f.data_parallel_size > 1 else "")
    if not f.received:
        waited = (time.monotonic() if now is None else now) - w.since
        if waited < watch.NO_PUBLISHER_AFTER_S:
            return f"waiting for the tap at {where}: nothing received yet"
        return (f"no tap reached yet at {where} ({waited:.0f} s, nothing received). Check that "
                "the server runs with the scheduler tap, that HOST:PORT is its address (it "
                "binds `tcp://*:PORT`; connect to the host it runs on) and that the topic "
                "matches (empty: all)")
    wall = time.time()
    ranks = []
    for r, m in f.models.items():
        if m.last_ts is None:
            ranks.append(f"rank {r}: nothing yet")
        elif not m.synced:
            ranks.append(f"rank {r}: waiting for a keyframe ({m.held_back} frames held back)")
        else:
            step = m.last_frame.step if m.last_frame else "–"
            ranks.append(f"rank {r}: step {step}, last frame {max(0.0, wall - m.last_ts):.0f} s "
                         f"ago")
    counts = (f"dropped by the server {f.total('dropped')} · gaps {f.total('gaps')} "
              f"({f.total('lost')} frames) · invariant violations {f.total('violations')}")
    off = [f"rank {r}: {m.off_reason}" for r, m in f.models.items() if m.off_reason]
    if off:
        counts += " · tap off: " + "; ".join(off)[:160]
    head = f"receiving from {where} · topic `{f.topic or '(all)'}`"
    return "  \n".join([head, " · ".join(ranks)[:300], counts])


def _rank_of(models) -> list[int]:
    """The ranks drawn: the one chosen, or all of them side by side."""
    choice = st.session_state.get("w_tap_rank", 0)
    if choice == ALL_RANKS:
        return list(models)
    return [choice if choice in models else 0]


def _draw_rank(w: TapWatch, rank: int, snaps: list, pos: int, narrow: bool) -> None:
    snap = snaps[pos]
    prev = snaps[pos - 1] if pos > 0 else None
    with st.container(height=NARRATION_PX, border=False):
        # the narration names seq ids and block numbers only; the server's request ids are in
        # the figures
        st.info(narration.narrate(snap, prev, unknown_tokens, cue=False))
    st.caption(" · ".join(f"{m.label} **{m.value}**" for m in metrics.metrics(snap)))
    cols = [st.container()] if narrow else st.columns(2, gap="medium")
    with cols[0].container(height=FIGURE_PX, border=False):
        chart(w.figures, block_tables.block_table_figure, snap, unknown_tokens,
              key=f"fig_tap_tables_r{rank}")
    with (cols[0] if narrow else cols[1]).container(height=FIGURE_PX, border=False):
        chart(w.figures, pool_grid.pool_figure, snap, unknown_tokens, True, False,
              key=f"fig_tap_pool_r{rank}")
    chart(w.figures, timeline.timeline_figure, snaps, snap.step,
          key=f"fig_tap_timeline_r{rank}")


def live_view() -> None:
    """Drain the follower and draw the step chosen; runs as a fragment."""
    w = _current()
    if w is None:
        st.info("Not watching: enter the tap's endpoint above and press **Connect**.")
        if st.session_state.get(ENDED):
            st.warning(watch._ended_note(st.session_state[ENDED]))
        return
    st.button("↻ Refresh", key="tap_refresh_btn", help="take what arrived since the last look")
    f = w.follower
    f.poll(watch.DRAIN_TIMEOUT_S)            # paused too: the frames keep being applied
    cols = st.columns(6)
    cols[0].metric("steps", sum(m.history.recorded for m in f.models.values()),
                   help="engine steps received (update frames), every rank")
    cols[1].metric("frames", f.total("frames"), help="frames applied, every rank")
    cols[2].metric("dropped", f.total("dropped"),
                   help="frames the server dropped for a slow subscriber (its own count)")
    cols[3].metric("gaps", f.total("gaps"),
                   help="holes in the sequence numbers: the view waits for the next keyframe")
    cols[4].metric("violations", f.total("violations"),
                   help="frames whose state breaks an invariant of vLLM's block pool")
    cols[5].metric("malformed", f.malformed_count, help="messages that were not tap messages")
    st.container(height=STATUS_PX, border=False).caption(status(w))
    by_rank = w.frozen if w.frozen is not None else \
        {r: m.snapshots for r, m in f.models.items()}
    ranks = _rank_of(f.models)
    first = by_rank.get(ranks[0], [])
    with st.container(height=SLIDER_PX, border=False):
        if w.frozen is not None and len(first) > 1:
            pos = st.slider("Step received (paused)", 0, len(first) - 1, len(first) - 1,
                            key=f"w_tap_pos_{w.pauses}", format="%d",
                            help="scrub through the steps received before Pause")
            st.caption(f"step {first[pos].step} · {len(first)} steps kept")
        elif first:
            pos = len(first) - 1
            st.caption(("Paused" if w.frozen is not None else "Live") +
                       f": step {first[pos].step} · {len(first)} steps kept (the last "
                       f"{f.models[ranks[0]].max_history})")
        else:
            pos = None
            st.caption("no step received yet: the figures appear with the first keyframe's step")
    if pos is not None:
        step = first[pos].step
        narrow = len(ranks) > 1
        places = st.columns(len(ranks)) if narrow else [st.container()]
        for place, rank in zip(places, ranks):
            snaps = by_rank.get(rank, [])
            if not snaps:
                place.caption(f"rank {rank}: no step received yet")
                continue
            # other ranks: their newest step at or before the one chosen
            at = pos if rank == ranks[0] else max(
                (i for i, s in enumerate(snaps) if s.step <= step), default=len(snaps) - 1)
            with place:
                if narrow:
                    st.markdown(f"**Rank {rank}**")
                _draw_rank(w, rank, snaps, at, narrow)
        for rank in ranks:
            snaps = by_rank.get(rank, [])
            if snaps:
                st.download_button(
                    f"Download rank {rank}'s {len(snaps)} steps as a trace (gzip JSON; the "
                    "trace upload replays it)", data=lambda s=snaps: trace_io.trace_gzip(s),
                    file_name=f"vllm-tap-rank{rank}.json.gz", mime="application/gzip",
                    on_click="ignore", key=f"tap_export_r{rank}")
    # what appears only sometimes comes last: above the figures it moved them when it appeared
    off = [(r, m.off_reason) for r, m in f.models.items() if m.off_reason]
    for r, reason in off:
        st.warning(f"The tap of rank {r} turned itself off (vLLM serves on): {reason}")
    reasons = [x for m in f.models.values() for x in m.violation_reasons]
    if reasons:
        with st.expander(f"{f.total('violations')} invariant violations (latest)"):
            st.code("\n".join(reasons[-10:]), language=None)
    if f.malformed_count:
        with st.expander(f"{f.malformed_count} malformed messages (latest reasons)"):
            st.code("\n".join(list(f.malformed)[-10:]), language=None)


def draw() -> None:
    """The tap mode's fields and its live view."""
    with st.expander("How to point this at a vLLM server's scheduler tap"):
        st.markdown(HELP)
    c = st.columns([3, 1.3, 1.2, 1.5])
    c[0].text_input("Tap endpoint (the server's PUB socket)", value=frames.DEFAULT_ENDPOINT,
                    key="w_tap_endpoint")
    c[1].text_input("Topic", value=frames.DEFAULT_TOPIC, key="w_tap_topic",
                    help="empty: every topic")
    c[2].number_input("Data-parallel ranks", value=1, step=1, key="w_tap_ranks",
                      help=f"1 to {MAX_RANKS}: rank r publishes on the base port + r")
    w = _current()
    watching = w is not None
    if watching and w.follower.data_parallel_size > 1:
        c[3].selectbox("Rank shown", [ALL_RANKS, *range(w.follower.data_parallel_size)],
                       index=1, key="w_tap_rank")
    b = st.columns([1, 1, 1.6, 1.4, 3])
    b[0].button("Connect" if not watching else "Reconnect", type="primary",
                key="tap_connect_btn", on_click=_connect)
    b[1].button("Disconnect", key="tap_disconnect_btn", on_click=_disconnect,
                disabled=not watching)
    auto = b[2].toggle("Auto-refresh", value=True, key="w_tap_auto", on_change=watch._retime,
                       help=f"redraw every {watch.REFRESH_S:g} s")
    # its default through session state: Connect sets it back on (a new subscription is live)
    st.session_state.setdefault("w_tap_live", True)
    b[3].toggle("Live", key="w_tap_live", on_change=_pause_changed,
                       disabled=not watching,
                       help="on: follow the newest step; off: pause, and scrub what arrived")
    if st.session_state.get(ERROR):
        st.error(st.session_state[ERROR].replace("*", "\\*"))
    # paused too: the timer keeps draining the sockets (a SUB socket left alone fills up and
    # drops frames), while the figures stay on the frozen steps
    st.fragment(live_view, run_every=watch.REFRESH_S if auto and watching else None)()
