"""The protocol-level load client (deploy/checks/protocol_session.py, class_load.py): real
sessions of a real `streamlit run app`, driven over Streamlit's websocket with its own protobuf
messages, and checked against Chromium (deploy/checks/protocol_validation.py)."""
from __future__ import annotations

import asyncio

import pytest

from app.scenarios import SCENARIOS
from app.screenshots import free_port, start_server, stop_server, wait_healthy
from deploy.checks.protocol_session import ProtocolSession, RunSeen
from tests.app.conftest import MODEL, browser_missing, needs_model

pytestmark = needs_model
MIXED, PARALLEL = SCENARIOS["mixed"].label, SCENARIOS["parallel"].label


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    port = free_port()
    proc = start_server(port, MODEL, str(tmp_path_factory.mktemp("streamlit") / "server.log"))
    try:
        wait_healthy(port, proc)
        yield f"http://127.0.0.1:{port}"
    finally:
        stop_server(proc)


def test_two_sessions_over_the_websocket_each_see_only_their_own_run(server):
    async def both():
        async with ProtocolSession(server) as a, ProtocolSession(server) as b:
            first = await a.first_page()
            await b.first_page()
            assert first.status == "FINISHED_SUCCESSFULLY" and first.step == 0
            assert a.session_id and a.session_id != b.session_id
            assert MIXED in (await a.choose("w_scenario", MIXED)).headings
            assert PARALLEL in (await b.choose("w_scenario", PARALLEL)).headings
            runs = {"a": [], "b": []}
            for who, s in [("a", a)] * 3 + [("b", b)] * 5 + [("a", a)]:
                runs[who].append(await s.click("step_btn"))
            return runs
    runs = asyncio.run(both())
    for who, label, steps in (("a", MIXED, 4), ("b", PARALLEL, 5)):
        last = runs[who][-1]
        # a click reruns only the main view (a fragment), with its heading, marker and figures
        assert last.status == "FINISHED_FRAGMENT_RUN_SUCCESSFULLY"
        assert [r.step for r in runs[who]] == list(range(1, steps + 1))
        assert last.headings == [label] and last.pool_step == steps
        assert not any(r.exceptions for r in runs[who])


def test_a_run_from_another_session_counts_as_cross_talk():
    from deploy.checks.class_load import Student
    s = Student("http://127.0.0.1:1", MIXED, [])
    s.check(RunSeen(texts=["rendered step 3"], headings=[MIXED]), 3, [MIXED, PARALLEL])
    assert s.cross_talk == [] and s.errors == []
    s.check(RunSeen(texts=["rendered step 7"], headings=[PARALLEL]), 3, [MIXED, PARALLEL])
    assert len(s.cross_talk) == 2          # another step, and another session's scenario
    s.check(RunSeen(exceptions=["ValueError: x"]), None, [])
    assert s.errors == ["ValueError: x"]


def test_a_short_class_runs_clean():
    """Three protocol students join, pick presets and click for a few seconds: every click is
    served and shows one more step (the load check's own harness, end to end)."""
    from deploy.checks.class_load import Servers, run_level
    labels = [s.label for s in SCENARIOS.values()]
    with Servers(1, {}) as servers:
        row = asyncio.run(run_level(servers, 3, period=0.5, duration=5, join=1, labels=labels,
                                    settle=0, assets=False, log=lambda *a: None))
    assert row["errors"] == 0 and row["cross_talk"] == 0 and row["lost"] == 0, row
    assert row["served"] == row["clicks"] > 10
    assert row["first_page_p90_s"] > 0 and row["server_cpu_s_per_click"] > 0
    assert row["sessions_by_process"] == {"st1": 3}        # one process: no HAProxy cookie
    assert row["click_p90_by_process"]["st1"] == row["click_p90_s"]
    assert len(row["click_p90_by_10s"]) == 1 and row["click_p90_by_10s"][0] > 0


def test_click_latency_over_time_is_binned_by_when_each_click_was_due():
    from deploy.checks.class_load import Student, over_time
    a, b = Student("", "x", []), Student("", "y", [])
    a.dues, a.latencies = [100.0, 105.0, 112.0], [0.1, 0.2, 3.0]
    b.dues, b.latencies = [101.0, 125.0], [0.3, 0.4]
    # 0-10 s: 0.1, 0.2, 0.3 -> p90 0.3; 10-20 s: 3.0; 20-30 s: 0.4
    assert over_time([a, b], t0=100.0, duration=30.0) == [0.3, 3.0, 0.4]


@pytest.mark.skipif(bool(browser_missing()), reason=browser_missing() or "")
def test_the_protocol_client_sees_what_chromium_shows(server):
    """The same clicks in Chromium and over the protocol: the same step counter and the same
    data in both figures of the Memory tab."""
    from deploy.checks.protocol_validation import validate
    browser, protocol, differences = validate(server, MIXED, 8)
    assert browser["step"] == protocol["step"] == 8
    assert len(browser["figures"]) == 2
    assert differences == []


def test_a_first_visits_requests_are_fetched_and_a_missing_one_is_an_error(server):
    from deploy.checks.class_load import fetch_all
    import urllib.request
    paths = ["/_stcore/health", "/favicon.png", "/_stcore/host-config"] * 3
    sizes = {}
    for path in set(paths):
        with urllib.request.urlopen(server + path, timeout=10) as r:
            sizes[path] = len(r.read())
    # every byte counted: six connections whose bodies arrive together once lost some
    # (``got += await …``, a total of 4 bytes for nine responses)
    assert asyncio.run(fetch_all(server, paths, cookie="")) == sum(sizes[p] for p in paths) > 1000
    with pytest.raises(RuntimeError, match="HTTP 404"):
        asyncio.run(fetch_all(server, ["/media/no-such-file.png"], cookie=""))


def test_the_class_plots_draw_each_run_and_the_table_has_a_line_per_run():
    from deploy.checks.class_plot import latency_figure, markdown_table, over_time_figure
    base = dict(period_s=2.0, first_page_p50_s=0.5, first_page_p90_s=1.0, clicks_per_s=50.0,
                clicks_asked_per_s=50.0, server_cpu_s_per_click=0.03,
                server_cpu_s_per_first_page=0.04, rss_before_mib=1000.0, rss_peak_mib=1100.0,
                mib_per_session=1.0, rss_after_mib=1050.0, **{"rss_after_vs_before_%": 5.0},
                errors=0, cross_talk=0, lost=0)
    rows = [dict(base, processes=1, sessions=30, click_p50_s=0.03, click_p90_s=0.08,
                 click_max_s=0.3),
            dict(base, processes=2, sessions=100, click_p50_s=0.1, click_p90_s=0.5,
                 click_max_s=2.5, click_p90_by_10s=[0.2, 0.9, 0.4])]
    lat = latency_figure(rows)
    p90 = {t.name: list(t.y) for t in lat.data if t.name.endswith(": p90")}
    assert p90 == {"1 process, a click every 2 s: p90": [0.08],
                   "2 processes + HAProxy, a click every 2 s: p90": [0.5]}
    over = over_time_figure(rows)                 # the run without a time series is left out
    runs = [t for t in over.data if not t.name.startswith("target")]
    assert len(runs) == 1 and list(runs[0].y) == [0.2, 0.9, 0.4]
    assert list(runs[0].x) == [10, 20, 30]
    table = markdown_table(rows).splitlines()
    assert len(table) == 2 + len(rows) and "| 2 + HAProxy | 100, every 2 s |" in table[-1]
