"""One simulated student at the protocol level: a websocket to Streamlit's own endpoint
(``/_stcore/stream``) speaking the protobuf messages the browser speaks (Streamlit's own
``BackMsg`` / ``ForwardMsg`` classes, ``streamlit.proto``), with no browser.

What the browser's frontend does, and this class does the same (Streamlit 1.67's frontend,
``frontend/lib/src/WidgetStateManager.ts`` and ``App.tsx``; the server side is
``streamlit/web/server/starlette/starlette_websocket.py`` and ``runtime/app_session.py``):

- it opens the websocket with the subprotocol ``streamlit`` (offering permessage-deflate, which
  Streamlit declines by default) and asks for a first run: a
  ``BackMsg.rerun_script`` with an empty ``ClientState``;
- the server answers with ``new_session``, the run's ``delta``s (one ``Element`` each, at a
  ``delta_path``) and ``script_finished``;
- a widget is addressed by its element id (``$$ID-<hash>-<key>`` for a keyed widget), read
  from the delta that drew it; a button click is a rerun whose ``WidgetStates`` carry that id
  with ``trigger_value`` true, a selectbox choice carries the option's label as
  ``string_value``; a widget drawn inside a fragment (this lab's main view) is rerun with the
  delta's ``fragment_id`` in the ``ClientState``, so only the fragment reruns.
- Widgets the client does not send keep their last value on the server (``SessionState``
  keeps the previous run's widget values), which is what the frontend's resend of unchanged
  values amounts to.

A run is timed from the send to the server's ``script_finished`` for it. Every element of a
run is read: an ``exception`` element is an error; the step marker (``rendered step N``), the
scenario heading and the pool figure's title say what the server drew for this session, so a
caller can check they are its own (no cross-talk).
"""
from __future__ import annotations

import asyncio
import json
import re
import time
from dataclasses import dataclass, field

from streamlit.proto.BackMsg_pb2 import BackMsg
from streamlit.proto.ForwardMsg_pb2 import ForwardMsg
from websockets.asyncio.client import connect

FINISHED = {"FINISHED_SUCCESSFULLY", "FINISHED_FRAGMENT_RUN_SUCCESSFULLY"}
STEP_MARKER = re.compile(r"^rendered step (\d+)$")
POOL_TITLE = "Physical block pool — step "


@dataclass
class RunSeen:
    """What the server sent for one script run (a first page or a click)."""
    status: str = ""
    seconds: float = 0.0
    bytes: int = 0
    messages: int = 0
    texts: list[str] = field(default_factory=list)
    headings: list[str] = field(default_factory=list)
    exceptions: list[str] = field(default_factory=list)
    figures: dict[str, dict] = field(default_factory=dict)   # title -> figure (spec JSON)

    @property
    def step(self) -> int | None:
        """The step marker this run drew, if it drew one."""
        for t in self.texts:
            m = STEP_MARKER.match(t)
            if m:
                return int(m.group(1))
        return None

    @property
    def pool_step(self) -> int | None:
        """The step in the pool figure's title, if this run drew the pool."""
        for title in self.figures:
            if title.startswith(POOL_TITLE):
                return int(re.match(r"\d+", title[len(POOL_TITLE):]).group(0))
        return None


def _figure_title(spec: dict) -> str:
    title = spec.get("layout", {}).get("title", "")
    return title.get("text", "") if isinstance(title, dict) else str(title)


class ProtocolSession:
    """A Streamlit session driven over its websocket. Use ``async with``; ``first_page()``
    then ``click(key)`` / ``choose(key, label)``, each returning the run's ``RunSeen``."""

    def __init__(self, url: str, cookie: str = "", timeout: float = 600.0):
        self.cookie = cookie              # sent as a browser would (HAProxy's backend cookie)
        self.ws_url = url.replace("http://", "ws://").rstrip("/") + "/_stcore/stream"
        self.timeout = timeout
        self.widgets: dict[str, tuple[str, str]] = {}   # key -> (element id, fragment id)
        self.disabled: dict[str, bool] = {}             # key -> drawn disabled
        self.values: dict[str, str] = {}                # key -> string value sent
        self.session_id = ""
        self._ws = None
        self._reader: asyncio.Task | None = None
        self._run: RunSeen | None = None
        self._done: asyncio.Future | None = None

    async def __aenter__(self) -> "ProtocolSession":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def close(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
        if self._ws is not None:
            await self._ws.close()

    # ---- runs -----------------------------------------------------------------------------
    async def first_page(self, t0: float | None = None) -> RunSeen:
        """Connect and run the page once, as a fresh browser tab does (timed from ``t0``)."""
        t0 = time.perf_counter() if t0 is None else t0
        headers = {"Cookie": self.cookie} if self.cookie else None
        self._ws = await connect(self.ws_url, subprotocols=["streamlit"], max_size=None,
                                 open_timeout=self.timeout,
                                 additional_headers=headers)
        self._reader = asyncio.create_task(self._read())
        return await self._rerun(BackMsg(), t0)

    async def click(self, key: str) -> RunSeen:
        """Press the button with widget key ``key`` (a trigger, in its fragment if any)."""
        element_id, fragment_id = self.widgets[key]
        msg = BackMsg()
        state = msg.rerun_script
        self._widget_values(state)
        w = state.widget_states.widgets.add()
        w.id, w.trigger_value = element_id, True
        state.fragment_id = fragment_id
        return await self._rerun(msg)

    async def choose(self, key: str, label: str) -> RunSeen:
        """Choose the option shown as ``label`` in the selectbox with widget key ``key``."""
        self.values[key] = label
        msg = BackMsg()
        self._widget_values(msg.rerun_script)
        msg.rerun_script.fragment_id = self.widgets[key][1]
        return await self._rerun(msg)

    def _widget_values(self, state) -> None:
        state.query_string = ""
        state.page_script_hash = ""
        for key, value in self.values.items():
            w = state.widget_states.widgets.add()
            w.id, w.string_value = self.widgets[key][0], value

    async def _rerun(self, msg: BackMsg, t0: float | None = None) -> RunSeen:
        if self._done is not None and not self._done.done():
            raise RuntimeError("one run at a time: the previous run has not finished")
        if not msg.HasField("rerun_script"):
            msg.rerun_script.query_string = ""
            msg.rerun_script.page_script_hash = ""
        self._run, self._done = RunSeen(), asyncio.get_running_loop().create_future()
        t0 = time.perf_counter() if t0 is None else t0
        await self._ws.send(msg.SerializeToString())
        run = await asyncio.wait_for(self._done, self.timeout)
        run.seconds = time.perf_counter() - t0
        return run

    # ---- what the server sends --------------------------------------------------------------
    async def _read(self) -> None:
        try:
            async for data in self._ws:
                self._receive(data)
        except Exception as exc:                       # the connection ended under a run
            if self._done is not None and not self._done.done():
                self._done.set_exception(exc)

    def _receive(self, data: bytes) -> None:
        msg = ForwardMsg()
        msg.ParseFromString(data)
        run = self._run
        if run is not None:
            run.bytes += len(data)
            run.messages += 1
        kind = msg.WhichOneof("type")
        if kind == "new_session":
            self.session_id = msg.new_session.initialize.session_id
        elif kind == "delta" and msg.delta.WhichOneof("type") == "new_element":
            self._element(msg.delta.new_element, msg.delta.fragment_id, run)
        elif kind == "script_finished" and run is not None:
            status = ForwardMsg.ScriptFinishedStatus.Name(msg.script_finished)
            run.status = status
            if status == "FINISHED_EARLY_FOR_RERUN":
                return                                  # the rerun it yields to follows
            if self._done is not None and not self._done.done():
                self._done.set_result(run)

    def _element(self, el, fragment_id: str, run: RunSeen | None) -> None:
        kind = el.WhichOneof("type")
        body = getattr(el, kind)
        element_id = getattr(body, "id", "") if kind != "markdown" else ""
        if element_id.startswith("$$ID-"):               # a keyed widget: $$ID-<hash>-<key>
            key = element_id.split("-", 2)[2]
            self.widgets[key] = (element_id, fragment_id)
            self.disabled[key] = bool(getattr(body, "disabled", False))
        if run is None:
            return
        if kind == "exception":
            run.exceptions.append(f"{body.type}: {body.message}"[:300])
        elif kind == "markdown":
            run.texts.append(body.body)
        elif kind == "heading":
            run.headings.append(body.body)
        elif kind == "plotly_chart":
            spec = json.loads(body.spec)
            run.figures[_figure_title(spec)] = spec
