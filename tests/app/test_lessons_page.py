"""The Lessons mode on the page (AppTest): pick a lesson, press Next until the end, answer each
question with what the snapshot says; again after editing the prompt."""
from __future__ import annotations

import pytest

from app.lessons import LESSONS

from .test_lessons import EDITED_PROMPTS, independent_answer
from .test_page import app, lab  # noqa: F401  (fixture + helper)
from .conftest import needs_model

pytestmark = needs_model


def run_lesson_on_page(at, key: str) -> int:
    """Next through every checkpoint; answer each question right (and once wrong)."""
    answered = 0
    for _ in range(12):
        nxt = [b for b in at.button if b.key == "lesson_next"]
        if not nxt:
            break
        nxt[0].click().run()
        assert not at.exception
        assert not at.warning or all("did not happen" not in w.value for w in at.warning)
        run = at.session_state["lesson_run"]
        cp = run.checkpoint
        assert any(cp.text[:40] in m.value for m in at.markdown)
        if cp.question is None:
            continue
        truth = independent_answer(cp.question.text, run.reached)
        at.text_input(key="w_lesson_answer").input(str(truth + 1))
        at.button(key="lesson_check").click().run()
        assert any("Not quite" in e.value for e in at.error)
        at.text_input(key="w_lesson_answer").input(str(truth))
        at.button(key="lesson_check").click().run()
        assert any(s.value.startswith(f"Right: {truth}.") for s in at.success), key
        answered += 1
    assert any("Lesson complete" in s.value for s in at.success), key
    return answered


@pytest.mark.parametrize("key", list(LESSONS))
def test_each_lesson_completes_on_the_page(app, key):
    at = app
    at.radio(key="w_mode").set_value("Lessons").run()
    at.selectbox(key="w_lesson").set_value(key).run()
    assert not at.exception
    engine = lab(at).engine
    assert engine.config.semantics == LESSONS[key].semantics
    assert at.selectbox(key="w_scenario").value == LESSONS[key].scenario
    assert run_lesson_on_page(at, key) >= 2
    # edit the prompt and apply: the lesson starts over on the new engine and still completes
    at.text_area(key="w_prompts").input(EDITED_PROMPTS[LESSONS[key].scenario])
    at.form_submit_button[0].click().run()
    assert lab(at).engine is not engine and not at.exception
    assert at.session_state["lesson_run"].index == -1
    run_lesson_on_page(at, key)
