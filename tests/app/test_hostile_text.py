"""Issue 45, findings 1 and 7: a visitor's or a trace's text is shown as text. Every message
the page draws is rendered here as CommonMark (markdown-it, raw HTML on) and must hold no
<a> or <img> that came from the visitor, and no bare URL a GFM autolink would turn into a
link; a bidi override in a prompt does not reach the Text view's labels."""
from __future__ import annotations

import json
import re

import pytest
from markdown_it import MarkdownIt
from streamlit.testing.v1 import AppTest

from app.plain_text import plain, plain_code
from app.trace_io import trace_json

from .conftest import MODEL, ROOT, needs_model

HOSTILE = "[Log in again](https://evil.example) ![img](http://127.0.0.1:9/i.png) <img src=x>#h"
NAME = HOSTILE + ".json"
MD = MarkdownIt("commonmark", {"html": True})
KINDS = ("markdown", "caption", "info", "error", "warning", "success", "subheader", "title")


def messages(at) -> list:
    return [e for kind in KINDS for e in getattr(at, kind)]


def assert_no_autolink(body: str) -> None:
    """No bare URL of the visitor's in the Markdown source outside a code span: GFM (which
    Streamlit renders, markdown-it's CommonMark does not) would link it; "http\\://" it cannot."""
    outside = re.sub(r"(`+) .*? \1", "", body)
    assert "http://127.0.0.1:9" not in outside and "https://evil" not in outside, body


def assert_no_live_markup(at) -> int:
    """Every message of the page, rendered: no link, image or raw HTML from ``HOSTILE``."""
    seen = 0
    for e in messages(at):
        body = e.proto.body if hasattr(e.proto, "body") else e.value
        if getattr(e.proto, "allow_html", False):      # the page's own HTML (the Text view)
            assert "<img src=x>" not in body and "evil.example)" not in body.split("href")[0]
            continue
        html = MD.render(body)
        if "evil.example" in body or "127.0.0.1:9" in body:
            seen += 1
            assert "<a " not in html and "<img" not in html, (body, html)
            assert_no_autolink(body)
    return seen


def test_plain_leaves_words_and_escapes_markup():
    assert plain("mine.json") == "mine.json"
    assert plain("PAGED_LAB_MAX_TRACE_MB (server.maxUploadSize)") == \
        "PAGED_LAB_MAX_TRACE_MB (server.maxUploadSize)"
    for text in (HOSTILE, "<a href='x'>y</a>", "www.evil.example", "# head", "1. list",
                 "`code`", "$x$", ":red[x]"):
        html = MD.render(plain(text))
        assert "<a" not in html and "<img" not in html and "<h1" not in html, html
        assert "<ol" not in html and "<code" not in html and "<span" not in html, html
    assert MD.render(plain_code("a `` b")).count("<code>") == 1


@pytest.fixture
def app(monkeypatch):
    monkeypatch.setenv("PAGED_LAB_MODEL", MODEL)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("PAGED_LAB_MODELS", "default")
    at = AppTest.from_file(str(ROOT / "app" / "streamlit_app.py"), default_timeout=180)
    at.run()
    assert not at.exception
    return at


@needs_model
def test_a_hostile_trace_name_and_fields_are_shown_as_text(app):
    at = app
    at.button(key="step_btn").click().run()
    snaps = json.loads(trace_json(at.session_state["lab"].snapshots()))
    for s in snaps:                      # the trace's own text fields
        s["model"], s["backend"] = HOSTILE, HOSTILE + "`x`"
    at.sidebar.file_uploader[0].upload(NAME, json.dumps(snaps).encode(),
                                       "application/json").run()
    assert not at.exception
    assert at.session_state["lab"].replaying
    # the heading, the sidebar's facts, the caption under the controls
    assert assert_no_live_markup(at) >= 3
    # a refused upload: its name in the error
    at.sidebar.file_uploader[0].upload(NAME, b"{not json", "application/json").run()
    assert any("could not load" in e.value for e in at.error)
    assert assert_no_live_markup(at) >= 4


def _watch_page():
    from app.views import watch
    watch.draw()


def test_a_hostile_watch_endpoint_is_shown_as_text(monkeypatch):
    monkeypatch.delenv("PAGED_LAB_WATCH_ENDPOINTS", raising=False)
    at = AppTest.from_function(_watch_page, default_timeout=30).run()
    at.text_input(key="w_kv_endpoint").input("[log in](http://127.0.0.1:9/x) <img src=x>")
    at.button(key="kv_connect_btn").click().run()
    assert not at.exception and len(at.error) == 1
    html = MD.render(at.error[0].value)
    assert "<a " not in html and "<img" not in html, html
    assert_no_autolink(at.error[0].value)


@needs_model
def test_a_bidi_override_in_a_prompt_is_shown_not_obeyed(app):
    at = app
    at.text_area(key="w_prompts").input("ROMEO \u202eP8 reversed")
    at.form_submit_button[0].click().run()
    at.button(key="step_btn").click().run()
    assert not at.exception
    assert at.session_state["lab"].settings.prompts == "ROMEO \u202eP8 reversed"  # as typed
    from app.figures.text_view import text_html
    lab = at.session_state["lab"]
    html = text_html(lab.current(), lab.decode)        # the Text tab's figure (drawn when open)
    assert "\u202e" not in html and "\\u202e" in html, html
