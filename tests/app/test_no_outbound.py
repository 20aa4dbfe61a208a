"""Issue 45, finding 8: the server makes no request off this machine. Streamlit looks its own
addresses up (a UDP connect towards 8.8.8.8, an HTTP request to checkip.amazonaws.com) for its
start banner when no address is configured, and in the websocket's origin check for an Origin
other than the Host, which any client can send. Checked two ways: the banner with the
project's .streamlit/config.toml under an audit hook on socket.connect, and a real
``streamlit run app`` under ``strace -f -e trace=connect`` that serves a page, a session and a
websocket with a foreign Origin: every connect is to 127.0.0.1 / ::1 or a unix socket."""
from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

from app.screenshots import free_port, wait_healthy
from deploy.checks.protocol_session import ProtocolSession

from .conftest import MODEL, ROOT, needs_model

BANNER = r"""
import sys
seen = []
sys.addaudithook(lambda event, args: event == "socket.connect" and seen.append(repr(args[1])))
from streamlit import config
config.get_config_options(force_reparse=True)      # .streamlit/config.toml of the cwd
config.set_option("server.headless", True)
from streamlit.web import bootstrap
bootstrap._print_url(False)
from app import no_ip_lookup
no_ip_lookup.install()
from streamlit.web.server import server_util
server_util.is_url_from_allowed_origins("http://evil.example:1")
print("CONNECTS", seen)
"""
LOCAL = re.compile(r'inet_addr\("127\.0\.0\.1"\)|inet_pton\(AF_INET6, "::1"|AF_UNIX|AF_NETLINK')


def test_the_start_banner_looks_nothing_up():
    out = subprocess.run([sys.executable, "-c", BANNER], cwd=ROOT, capture_output=True,
                         text=True, timeout=60, check=True).stdout
    connects = out.rsplit("CONNECTS", 1)[1].strip()
    assert connects == "[]", connects


@needs_model
@pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace")
def test_a_served_session_connects_only_to_this_machine(tmp_path):
    port = free_port()
    trace = tmp_path / "connect.txt"
    proc = subprocess.Popen(
        ["strace", "-f", "-qq", "-e", "trace=connect", "-o", str(trace),
         sys.executable, "-m", "streamlit", "run", "app", "--server.port", str(port),
         "--server.headless", "true", "--server.address", "127.0.0.1"],
        cwd=ROOT, env={**os.environ, "PAGED_LAB_MODEL": MODEL,
                       "HF_HUB_OFFLINE": "1", "PAGED_LAB_MODELS": "default"},
        stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_healthy(port, proc, timeout=120)
        url = f"http://127.0.0.1:{port}"
        urllib.request.urlopen(url, timeout=10).read()

        async def sessions():
            async with ProtocolSession(url) as s:
                await s.first_page()
                await s.click("step_btn")
            from websockets.asyncio.client import connect
            try:                          # a foreign Origin: Streamlit's origin check runs
                async with connect(url.replace("http", "ws") + "/_stcore/stream",
                                   origin="http://evil.example:1",
                                   subprotocols=["streamlit"], open_timeout=10):
                    pass
            except Exception:
                pass                      # refused is fine: what it looked up is the point
        asyncio.run(sessions())
        time.sleep(1.5)                   # a lookup has a 1 s timeout: let it be tried
    finally:                              # strace and the server it started: their own group
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    calls = [line for line in trace.read_text().splitlines() if "connect(" in line]
    outbound = [line for line in calls if not LOCAL.search(line)]
    assert not outbound, "\n".join(outbound[:10])
