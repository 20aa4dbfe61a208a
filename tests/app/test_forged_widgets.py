"""Issue 45, findings 3 and 4, at the protocol level: a real ``streamlit run app`` (hosted:
``PAGED_LAB_MODELS=default``) on 127.0.0.1, and a client that sends over Streamlit's websocket
what no browser widget would (deploy/checks/protocol_session.py): a value outside every
widget's options, of the wrong type, out of vLLM's range or not finite. Each must get a clear
message naming the widget, no exception, the sidebar (form and uploader) still drawn, and the
engine left as it was."""
from __future__ import annotations

import asyncio
import math

import pytest

from app.screenshots import free_port, start_server, stop_server, wait_healthy
from deploy.checks.protocol_session import BackMsg, ProtocolSession
from tests.app.conftest import needs_model

pytestmark = needs_model
APPLY = "FormSubmitter:settings-Apply & reset"
INF, NAN = math.inf, math.nan

# (widget key, the WidgetState field, the forged value, words of the message, submit the form)
FORGED = [
    ("w_scenario", "string_value", "nope", "Scenario: 'nope' is not one of its choices", False),
    ("w_semantics", "string_value", "v9", "Engine: 'v9' is not one of its choices", False),
    ("w_mode", "string_value", "Admin", "Mode: 'Admin' is not one of its choices", False),
    ("w_model", "string_value", "/etc", "model '/etc' is not offered on this server", True),
    ("w_preemption_mode", "string_value", "teleport", "Preemption: 'teleport' is not one",
     False),
    ("w_backend", "string_value", "evil", "Kernel backend: 'evil' is not one", False),
    # a checkbox or toggle reads only bool_value: another field is not seen (None: no message)
    ("w_enable_prefix_caching", "string_value", "yes", None, False),
    ("w_ignore_eos", "string_value", "no", None, False),
    ("w_prompts", "string_value", "x" * 30_000, "is 30,000 characters long", True),
    ("w_seed", "double_value", -1.0, "seed must be a whole number from 0 to "
     "9,223,372,036,854,775,807, got -1", True),
    ("w_temperature", "double_value", INF, "temperature must be a finite number", True),
    ("w_length_penalty", "double_value", NAN, "length penalty (beams) must be a finite number",
     True),
    ("w_top_p", "double_value", -INF, "top-p must be a finite number", True),
    ("w_n", "double_value", 1e20, "n (samples) must be a finite number", True),
    ("w_beam_width", "double_value", INF, "beam width must be a finite number", True),
    ("w_max_tokens", "double_value", 1e300, "max tokens must be a finite number", True),
    ("w_block_size", "double_value", NAN, "block size must be a finite number", True),
    ("w_num_gpu_blocks", "double_value", -INF, "GPU pool (blocks) must be a finite number", True),
    ("w_num_cpu_blocks", "double_value", 2.0 ** 70, "CPU pool (blocks) must be a finite number",
     True),
    ("w_max_num_batched_tokens", "double_value", NAN, "token budget per step (v1) must be a "
     "finite number", True),
    ("w_top_k", "double_value", INF, "top-k (-1 = off) must be a finite number", True),
    # fields with bounds of their own: Streamlit puts the value back (10, 1.0) itself
    ("w_run_n", "double_value", 1e6, None, False),
    ("w_projector", "string_value", "on", None, False),
    ("w_speed", "string_array_value", ["7"], None, False),
]


class Forger(ProtocolSession):
    """A protocol session that records which widgets each run drew."""

    def _element(self, el, fragment_id, run):
        super()._element(el, fragment_id, run)
        kind = el.WhichOneof("type")
        element_id = getattr(getattr(el, kind), "id", "") if kind != "markdown" else ""
        if run is not None and element_id.startswith("$$ID-"):
            run.__dict__.setdefault("keys", []).append(element_id.split("-", 2)[2])
        if run is not None and kind == "alert":
            run.__dict__.setdefault("alerts", []).append(el.alert.body)

    async def forge(self, key: str, field: str, value, submit: bool):
        msg = BackMsg()
        state = msg.rerun_script
        state.query_string, state.page_script_hash = "", ""
        w = state.widget_states.widgets.add()
        w.id = self.widgets[key][0]
        if field == "string_array_value":
            w.string_array_value.data.extend(value)
        else:
            setattr(w, field, value)
        if submit:
            t = state.widget_states.widgets.add()
            t.id, t.trigger_value = self.widgets[APPLY][0], True
        return await self._rerun(msg)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    port = free_port()
    log = tmp_path_factory.mktemp("streamlit") / "server.log"
    proc = start_server(port, "default", str(log), env={"PAGED_LAB_MODELS": "default"})
    try:
        wait_healthy(port, proc)
        yield f"http://127.0.0.1:{port}", log
    finally:
        stop_server(proc)


def test_forged_widget_values_get_the_widgets_message_and_keep_the_sidebar(server):
    url, log = server

    async def forge_all():
        results = []
        async with Forger(url) as s:
            await s.first_page()
            await s.forge("w_max_tokens", "double_value", 200.0, True)   # long enough a run
            await s.click("step_btn")                   # the engine at step 1
            for key, field, value, words, submit in FORGED:
                run = await s.forge(key, field, value, submit)
                after = await s.click("step_btn")       # the engine went on from where it was
                results.append((key, run, after))
        return results

    results = asyncio.run(forge_all())
    failures = []
    for (key, run, after), (_, _, value, words, _) in zip(results, FORGED):
        alerts = run.__dict__.get("alerts", [])
        keys = run.__dict__.get("keys", [])
        shown = [a.replace("\\", "") for a in alerts]
        if run.exceptions or (words is not None and not any(words in a for a in shown)) \
                or "w_scenario" not in keys or "w_trace" not in keys or APPLY not in keys:
            failures.append((key, repr(value)[:20], run.status, run.exceptions, shown[:2],
                             sorted(set(keys) & {"w_scenario", "w_trace", APPLY})))
    steps = [after.step for _, _, after in results]
    assert not failures, "\n".join(map(str, failures))
    # no forged value reset the engine or stopped the next click
    assert steps == list(range(2, 2 + len(FORGED))), steps
    assert "KeyError" not in log.read_text() and "Traceback" not in log.read_text()
