"""The server never looks itself up on the network (issue 45). Streamlit asks for its own
addresses in two places: the start banner, when neither ``browser.serverAddress`` nor
``server.address`` is set (a UDP connect towards 8.8.8.8, then an HTTP request to
checkip.amazonaws.com: "Did not auto detect external IP" in a closed network), which
``browser.serverAddress`` in .streamlit/config.toml avoids; and the websocket's origin check,
for an Origin that is not the Host (streamlit/web/server/server_util.py,
``is_url_from_allowed_origins``), which anybody can send. For that one the lookups answer
"unknown" here, so such an origin is refused unless it is localhost, the configured address or
in ``server.corsAllowedOrigins``. Installed once per process, by the first page run."""
from __future__ import annotations


def install() -> None:
    from streamlit import net_util
    net_util.get_internal_ip = lambda: None
    net_util.get_external_ip = lambda: None
