"""The scheduler tap's follower (real_vllm/tap/follower.py), without vLLM: frames built from
real_vllm/tap/frames.py's structs, published by the test on 127.0.0.1, describing a small
consistent scenario (two requests sharing a prefix block, a preemption, a finish), become the
page's StepSnapshots; inconsistencies, gaps, malformed messages and TapOff are counted and
shown, never raised; and the snapshots save as a trace the upload replays."""
from __future__ import annotations

import time

import pytest
import zmq

from app import trace_io
from real_vllm.tap import frames as fr
from real_vllm.tap.follower import RankModel, TapFollower

DEADLINE_S = 10.0
A, B = "cmpl-aaaa-0-1111", "cmpl-bbbb-0-2222"
H1, H2 = b"\x01" * 32, b"\x02" * 32


def hello(rank: int = 0) -> fr.Hello:
    return fr.Hello("0.11.0", rank, num_blocks=10, null_block=0, block_size=4,
                    max_model_len=64, kv_cache_groups=["FullAttentionSpec"],
                    async_scheduling=False, prefix_caching=True, keyframe_every_s=1.0)


def req(rid, status, computed, prompt, out, blocks, preemptions=0) -> fr.RequestState:
    return fr.RequestState(rid, status, computed, prompt, out, preemptions, [blocks])


def scenario() -> list[fr.TapMessage]:
    """Step 0: A's prompt (8 tokens, blocks 1 2), both blocks cached. Step 1: B (6 tokens)
    finds block 1 in the prefix cache (ref count 2) and gets 3; A decodes into 4. Step 2: B is
    preempted (block 3 freed, block 1 back to 1), A finishes (1 2 stay cached, 4 freed)."""
    return [
        hello(),
        fr.Frame(0, "schedule", 1.0, True, num_free_blocks=7, scheduled={A: 8}, running=[A],
                 requests=[req(A, "running", 8, 8, 0, [1, 2])],
                 blocks=[fr.BlockState(1, 1), fr.BlockState(2, 1)]),
        fr.Frame(0, "update", 1.1, False, num_free_blocks=7, running=[A],
                 requests=[req(A, "running", 8, 8, 1, [1, 2])],
                 blocks=[fr.BlockState(1, 1, H1), fr.BlockState(2, 1, H2)]),
        fr.Frame(1, "schedule", 1.2, False, num_free_blocks=5, scheduled={A: 1, B: 2},
                 running=[A, B],
                 requests=[req(A, "running", 9, 8, 1, [1, 2, 4]),
                           req(B, "running", 6, 6, 0, [1, 3])],
                 blocks=[fr.BlockState(1, 2, H1), fr.BlockState(3, 1), fr.BlockState(4, 1)]),
        fr.Frame(1, "update", 1.3, False, num_free_blocks=5, running=[A, B],
                 requests=[req(A, "running", 9, 8, 2, [1, 2, 4]),
                           req(B, "running", 6, 6, 1, [1, 3])]),
        fr.Frame(2, "schedule", 1.4, False, num_free_blocks=6, scheduled={A: 1},
                 preempted=[B], running=[A], waiting=[B],
                 requests=[req(A, "running", 10, 8, 2, [1, 2, 4]),
                           req(B, "preempted", 0, 6, 1, [], preemptions=1)],
                 blocks=[fr.BlockState(1, 1, H1), fr.BlockState(3, 0)]),
        fr.Frame(2, "update", 1.5, False, num_free_blocks=9, finished=[A], waiting=[B],
                 gone=[A], blocks=[fr.BlockState(1, 0, H1), fr.BlockState(2, 0, H2),
                                   fr.BlockState(4, 0)]),
    ]


def fed(messages, model: RankModel | None = None, first_seq: int = 0) -> RankModel:
    model = model or RankModel(0)
    for i, m in enumerate(messages):
        model.receive(first_seq + i, m)
    return model


def check_scenario(model: RankModel) -> None:
    snaps = model.snapshots
    assert [s.step for s in snaps] == [0, 1, 2]
    s0, s1, s2 = snaps
    tables = {s.request_id: s.block_table for s in s1.sequences}
    assert tables == {A: (1, 2, 4), B: (1, 3)}             # the server's request ids
    rc = {b.block_id: b.ref_count for b in s1.blocks}
    assert rc[1] == 2 and s1.blocks[1].state == "shared" and rc[3] == rc[4] == 1
    assert s1.stats.free_blocks == 5 and s1.stats.shared_blocks == 1
    assert s0.blocks[1].block_hash == H1.hex() and s0.kind == "prefill"
    assert s1.kind == "mixed"
    hits = [e for e in s1.events if e.kind == "prefix_hit"]
    assert [(e.logical, e.physical) for e in hits] == [(0, 1)]
    assert s2.stats.free_blocks == 9 and s2.stats.cached_free_blocks == 2
    assert {b.block_id for b in s2.blocks if b.state == "cached"} == {1, 2}
    by_id = {s.request_id: s for s in s2.sequences}
    assert by_id[A].status == "finished" and by_id[B].status == "waiting"
    assert by_id[B].block_table == ()
    assert [e.kind for e in s2.events if e.kind in ("preempt", "finish")] == ["preempt", "finish"]
    assert model.preemption_order() == [B] and s2.stats.num_preemptions == 1
    assert model.violations == 0, list(model.violation_reasons)
    assert model.gaps == 0 and model.held_back == 0
    assert s2.stats.null_blocks == 1 and s2.blocks[0].state == "null"


def test_a_consistent_scenario_becomes_the_pages_snapshots():
    model = fed(scenario())
    check_scenario(model)
    # the trace saved from them loads back: every snapshot passes the upload's checks
    data = trace_io.trace_gzip(model.snapshots)
    loaded = trace_io.load_trace(data)
    assert [s.step for s in loaded] == [0, 1, 2]
    assert loaded[1].blocks[1].ref_count == 2


def test_the_narration_and_figures_draw_them():
    from app.figures import block_tables, metrics, pool_grid, timeline
    from app.narration import narrate
    from real_vllm.tap.follower import unknown_tokens
    snaps = fed(scenario()).snapshots
    text = narrate(snaps[2], snaps[1])
    assert "preempted" in text and "Finished" in text
    assert "Prefix cache hit" in narrate(snaps[1], snaps[0])
    fig = block_tables.block_table_figure(snaps[1], unknown_tokens)
    assert any(A in str(y) for y in fig.data[0].y) and any(B in str(y) for y in fig.data[0].y)
    pool_grid.pool_figure(snaps[1], unknown_tokens)
    timeline.timeline_figure(snaps, snaps[-1].step)
    assert metrics.metrics(snaps[1])


def test_an_inconsistent_frame_is_a_violation_not_a_crash():
    msgs = scenario()[:3]
    # block 2's ref count says 2, but only A's table holds it; and the free count is off
    msgs.append(fr.Frame(1, "schedule", 1.2, False, num_free_blocks=3,
                         blocks=[fr.BlockState(2, 2, H2)], running=[A]))
    msgs.append(fr.Frame(1, "update", 1.3, False, num_free_blocks=7, running=[A],
                         blocks=[fr.BlockState(2, 1, H2)]))
    msgs.append(fr.Frame(2, "schedule", 1.4, False, num_free_blocks=7, running=[A],
                         requests=[req(B, "preempted", 0, 6, 0, [5])],
                         blocks=[fr.BlockState(5, 1)]))
    model = fed(msgs)
    reasons = list(model.violation_reasons)
    assert any("block 2 has ref count 2 but 1 table entries" in r for r in reasons)
    assert any("3 free blocks" in r for r in reasons)
    assert any(f"preempted request {B} holds 1 block" in r for r in reasons)
    assert model.violations == 4        # 2 in the first frame, 2 (held, free count) in the last
    assert len(model.snapshots) == 2


def test_deltas_before_the_first_keyframe_wait_for_one():
    msgs = scenario()
    late = [msgs[0]] + msgs[2:5]                     # joined after the keyframe: deltas only
    model = fed(late, first_seq=10)
    assert model.snapshots == [] and model.held_back == 3
    key = fr.Frame(2, "schedule", 1.4, True, num_free_blocks=6, scheduled={A: 1},
                   preempted=[B], running=[A], waiting=[B],
                   requests=[req(A, "running", 10, 8, 2, [1, 2, 4]),
                             req(B, "preempted", 0, 6, 1, [], preemptions=1)],
                   blocks=[fr.BlockState(1, 1, H1), fr.BlockState(2, 1, H2),
                           fr.BlockState(4, 1)])
    fed([msgs[0], key, msgs[6]], model, first_seq=14)
    assert [s.step for s in model.snapshots] == [2]
    s = model.snapshots[0]
    assert s.stats.free_blocks == 9 and model.violations == 0 and model.gaps == 0


def test_a_gap_is_counted_and_the_state_waits_for_the_next_keyframe():
    msgs = scenario()
    model = RankModel(0)
    for seq, m in [(0, msgs[0]), (1, msgs[1]), (2, msgs[2]), (5, msgs[5])]:
        model.receive(seq, m)
    assert model.gaps == 1 and model.lost == 2
    assert model.held_back == 1 and len(model.snapshots) == 1
    model.receive(3, msgs[0])                        # numbering went back: a restart
    assert model.restarts == 1 and not model.synced


def test_frames_the_publisher_dropped_make_the_model_wait_for_a_keyframe():
    msgs = scenario()
    model = fed(msgs[:3])
    late = fr.Frame(1, "schedule", 1.2, False, num_free_blocks=7, running=[A], dropped=2)
    fed([late, msgs[4]], model, first_seq=3)
    assert model.dropped == 2 and not model.synced and model.held_back == 2
    assert model.gaps == 0 and len(model.snapshots) == 1


def test_the_tap_turning_itself_off_is_surfaced():
    model = fed(scenario() + [fr.TapOff("the tap failed: boom")])
    assert model.off_reason == "the tap failed: boom"
    assert len(model.snapshots) == 3


# ---- over ZeroMQ ----------------------------------------------------------------------------
@pytest.fixture
def publisher():
    """An XPUB on a random port: it says when the follower's subscription arrived."""
    sock = zmq.Context.instance().socket(zmq.XPUB)
    sock.setsockopt(zmq.LINGER, 0)
    sock.bind("tcp://127.0.0.1:0")
    yield sock, sock.getsockopt_string(zmq.LAST_ENDPOINT)
    sock.close()


def publish(sock, messages, topic: bytes = b"tap", first_seq: int = 0) -> None:
    for i, m in enumerate(messages):
        sock.send_multipart([topic, (first_seq + i).to_bytes(8, "big"), fr.encode(m)])


def subscribed(sock) -> None:
    assert sock.poll(int(DEADLINE_S * 1000)) and sock.recv()[0] == 1


def poll_until(follower: TapFollower, done, what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not done():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        follower.poll(0.05)


def test_the_follower_receives_a_publisher_and_counts_what_is_malformed(publisher):
    sock, endpoint = publisher
    follower = TapFollower(endpoint, "tap")
    try:
        subscribed(sock)
        sock.send_multipart([b"tap", b"\x00" * 8, b"\xc1garbage"])      # not msgpack
        sock.send_multipart([b"tap", b"\x00" * 4, fr.encode(hello())])  # a 4-byte seq
        sock.send_multipart([b"tap", fr.encode(hello())])               # two parts
        publish(sock, scenario() + [fr.TapOff("stopped")])
        model = follower.models[0]
        poll_until(follower, lambda: model.off_reason is not None, "the TapOff")
        assert follower.malformed_count == 3 and len(follower.malformed) == 3
        check_scenario(model)
        assert model.off_reason == "stopped"
    finally:
        follower.close()
    assert follower.closed and follower.poll() == 0


def test_each_rank_is_its_own_port(publisher):
    sock, endpoint = publisher
    second = zmq.Context.instance().socket(zmq.XPUB)
    second.setsockopt(zmq.LINGER, 0)
    port = int(endpoint.rsplit(":", 1)[1])
    try:
        try:
            second.bind(f"tcp://127.0.0.1:{port + 1}")
        except zmq.ZMQError:
            pytest.skip("the next port is taken")
        follower = TapFollower(endpoint, "tap", data_parallel_size=2)
        try:
            subscribed(sock)
            subscribed(second)
            publish(sock, scenario())
            publish(second, [hello(1)] + scenario()[1:3])
            poll_until(follower, lambda: len(follower.models[0].snapshots) == 3
                       and len(follower.models[1].snapshots) == 1, "both ranks")
            assert "rank 1" in follower.models[1].snapshots[0].backend
            assert follower.malformed_count == 0
        finally:
            follower.close()
    finally:
        second.close()


def test_a_bad_endpoint_is_a_clear_error():
    with pytest.raises(ValueError, match="tcp://"):
        TapFollower("localhost:5570")
    with pytest.raises(ValueError, match="from 1 to 64"):
        TapFollower("tcp://127.0.0.1:5570", data_parallel_size=0)


# ---- the Watch tab in tap mode (streamlit.testing.v1) ----------------------------------------
def tap_watch_page():
    from app.views import watch
    watch.draw()


@pytest.fixture
def tap_page(monkeypatch):
    """The Watch view, hosted defaults (the shell's settings cleared), tap mode chosen."""
    from streamlit.testing.v1 import AppTest
    for name in ("PAGED_LAB_WATCH_ENDPOINTS", "PAGED_LAB_WATCH_LISTEN", "PAGED_LAB_WATCH_IPC"):
        monkeypatch.delenv(name, raising=False)
    at = AppTest.from_function(tap_watch_page, default_timeout=30)
    at.run()
    at.radio(key="w_watch_mode").set_value("Scheduler tap").run()
    assert not at.exception, at.exception
    yield at
    w = at.session_state["tap_watch"] if "tap_watch" in at.session_state else None
    if w is not None:
        w.close()


def rerun_until(at, done, what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not done(at):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        at.run()
        assert not at.exception, at.exception


def plotly(at, key: str) -> dict:
    import json
    for el in at.get("plotly_chart"):
        if el.proto.id.endswith(key):
            return json.loads(el.proto.spec)
    raise AssertionError(f"no chart {key}")


def metric(at, label: str) -> str:
    return next(m.value for m in at.metric if m.label == label)


def test_the_watch_tab_draws_the_tap_with_the_pages_figures(tap_page, publisher, monkeypatch):
    at = tap_page
    sock, endpoint = publisher
    monkeypatch.setenv("PAGED_LAB_WATCH_ENDPOINTS", endpoint)
    at.text_input(key="w_tap_endpoint").input(endpoint)
    at.button(key="tap_connect_btn").click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert "waiting for the tap at" in at.caption[0].value
    subscribed(sock)
    publish(sock, scenario())
    rerun_until(at, lambda a: metric(a, "steps") == "3", "three steps")
    assert metric(at, "violations") == "0" and metric(at, "gaps") == "0"
    status = at.caption[0].value
    assert status.startswith(f"receiving from `{endpoint}`") and "rank 0: step 2" in status
    tables = plotly(at, "fig_tap_tables_r0")        # step 2: A finished, B waits (preempted)
    assert "no block table yet: 1 sequence(s)" in str(tables["layout"]["annotations"])
    plotly(at, "fig_tap_pool_r0")
    plotly(at, "fig_tap_timeline_r0")
    assert any("preempted" in i.value for i in at.info)      # the narration
    # pause, scrub back to step 1: both requests' tables, the shared block drawn ×2
    at.toggle(key="w_tap_live").set_value(False).run()
    slider = at.slider(key="w_tap_pos_1")
    slider.set_value(1).run()
    labels = " ".join(map(str, plotly(at, "fig_tap_tables_r0")["data"][0]["y"]))
    assert A in labels and B in labels
    assert "×2" in str(plotly(at, "fig_tap_tables_r0")["data"][0]["text"])
    assert at.get("download_button")
    # the tap turns itself off: said on the page
    publish(sock, [fr.TapOff("the tap failed: boom")], first_seq=len(scenario()))
    rerun_until(at, lambda a: any("boom" in w.value for w in a.warning), "the TapOff")
    follower = at.session_state["tap_watch"].follower
    at.button(key="tap_disconnect_btn").click().run()
    assert follower.closed and "tap_watch" not in at.session_state
    assert any("Not watching" in i.value for i in at.info)


def test_the_tap_endpoint_is_checked_like_the_kv_ones(tap_page):
    at = tap_page
    at.text_input(key="w_tap_endpoint").input("tcp://10.0.0.1:5570")
    at.button(key="tap_connect_btn").click().run()
    message = at.error[0].value
    assert message.startswith("Cannot watch: this server does not let sessions watch the "
                              "Tap endpoint 'tcp://10.0.0.1:5570'")
    assert "PAGED_LAB_WATCH_ENDPOINTS" in message and "tap_watch" not in at.session_state
    at.text_input(key="w_tap_endpoint").input("localhost:5570")
    at.button(key="tap_connect_btn").click().run()
    assert "must start with tcp://" in at.error[0].value
    at.number_input(key="w_tap_ranks").set_value(0)
    at.button(key="tap_connect_btn").click().run()
    assert "Data-parallel ranks must be a whole number from 1 to 64" in at.error[0].value
    # the default endpoint is on the default list: Connect opens the follower
    at.number_input(key="w_tap_ranks").set_value(1)
    at.text_input(key="w_tap_endpoint").input(fr.DEFAULT_ENDPOINT)
    at.button(key="tap_connect_btn").click().run()
    assert not at.error and "tap_watch" in at.session_state
    # back to KV cache events: the tap's subscription is closed (one per session)
    follower = at.session_state["tap_watch"].follower
    at.radio(key="w_watch_mode").set_value("KV cache events").run()
    assert follower.closed and "tap_watch" not in at.session_state
    assert at.text_input(key="w_kv_endpoint").value == "tcp://127.0.0.1:5557"


def test_two_ranks_side_by_side(tap_page, publisher, monkeypatch):
    at = tap_page
    sock, endpoint = publisher
    port = int(endpoint.rsplit(":", 1)[1])
    second = zmq.Context.instance().socket(zmq.XPUB)
    second.setsockopt(zmq.LINGER, 0)
    try:
        try:
            second.bind(f"tcp://127.0.0.1:{port + 1}")
        except zmq.ZMQError:
            pytest.skip("the next port is taken")
        monkeypatch.setenv("PAGED_LAB_WATCH_ENDPOINTS", "*")
        at.text_input(key="w_tap_endpoint").input(endpoint)
        at.number_input(key="w_tap_ranks").set_value(2)
        at.button(key="tap_connect_btn").click().run()
        assert not at.error, [e.value for e in at.error]
        subscribed(sock)
        subscribed(second)
        publish(sock, scenario())
        publish(second, [hello(1)] + scenario()[1:3])
        rerun_until(at, lambda a: metric(a, "steps") == "4", "both ranks' steps")
        plotly(at, "fig_tap_tables_r0")                  # rank 0 alone by default
        with pytest.raises(AssertionError):
            plotly(at, "fig_tap_tables_r1")
        at.selectbox(key="w_tap_rank").set_value("all, side by side").run()
        assert not at.exception, at.exception
        assert "rank 1: step 0" in at.caption[0].value
        labels = " ".join(map(str, plotly(at, "fig_tap_tables_r1")["data"][0]["y"]))
        assert A in labels and B not in labels          # rank 1's own step 0
        plotly(at, "fig_tap_pool_r0")
    finally:
        second.close()
