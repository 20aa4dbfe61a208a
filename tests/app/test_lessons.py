"""Lessons: every lesson can be completed on the real engine with the default model and its
preset, and again after the prompt is edited; each question's expected answer equals what the
snapshot says, computed here independently of app/lessons.py."""
from __future__ import annotations

import pytest

from app.lessons import LESSONS, LessonRun
from app.lab import Lab

from .conftest import needs_model

pytestmark = needs_model

EDITED_PROMPTS = {"single": "JULIET: O Romeo, Romeo", "parallel": "HAMLET: Words, words, words. What is the matter, my lord?",
                  "beam": "The lady doth protest too",
                  # these two keep their point: a common prefix, and too many requests
                  "prefix": "\n".join(f"First Citizen: Before we proceed any further, hear me "
                                      f"speak. All: Speak, speak. {w}" for w in ("You", "We")),
                  "mixed": "\n".join(("ROMEO: Is the day so young?", "JULIET: Ay me!",
                                      "HAMLET: O, that this too too solid flesh",
                                      "MACBETH: Is this a dagger which I see",
                                      "OTHELLO: It is the cause, it is the cause"))}


def _live(snap):
    return min((s for s in snap.sequences if s.block_table), key=lambda s: s.seq_id)


def independent_answer(text: str, snap) -> int:
    """The answer to a question, read off the snapshot by a different route than the lesson."""
    n = lambda kind: len([e for e in snap.events if e.kind == kind])   # noqa: E731
    if text.startswith("How many physical blocks does the sequence") or \
            text.startswith("How many blocks does the sequence hold"):
        return len(_live(snap).block_table)
    if text.startswith("How many slots of its blocks are still empty"):
        s = _live(snap)
        return sum(snap.block_size - b.filled for b in snap.blocks if b.block_id in s.block_table)
    if text.startswith("What is the refcount of the first prompt block"):
        first = _live(snap).block_table[0]
        return sum(1 for s in snap.sequences if first in s.block_table)
    if "copy-on-write copies" in text:
        return n("cow")
    if text.startswith("How many blocks are shared"):
        return sum(1 for b in snap.blocks if b.ref_count > 1)
    if text.startswith("How many blocks are free") or text.startswith("How many blocks of the pool"):
        return sum(1 for b in snap.blocks if b.ref_count == 0 and b.state != "null")
    if text.startswith("How many live sequences"):
        return sum(1 for s in snap.sequences if not s.finish_reason)
    if "pruned" in text:
        return n("beam_prune")
    if "entered the prefix cache" in text:
        return n("cached")
    if "prefix-cache hits did this step have" in text:
        return n("prefix_hit")
    if "served from the cache in total" in text:
        return snap.stats.prefix_cache_hits
    if "Max slab reserve" in text:
        return sum(s.size for s in snap.slabs if s.allocator == "max")
    if "percentage of the paged memory" in text:
        filled = sum(b.filled for b in snap.blocks if b.ref_count)
        held = snap.block_size * sum(1 for b in snap.blocks if b.ref_count)
        return round(100 * filled / held)
    if "Which sequence was preempted first" in text:
        return [e.seq_id for e in snap.events if e.kind == "preempt"][0]
    if text.startswith("How many KV slots does paging hold"):
        return snap.block_size * len({b for s in snap.sequences for b in s.block_table})
    if text.startswith("How many tokens did this prefill compute"):
        return sum(e.end - e.start for e in snap.events if e.kind == "prefill")
    if "prompt tokens did this step compute" in text:
        return sum(e.end - e.start for e in snap.events if e.kind == "prefill")
    raise AssertionError(f"no independent answer for {text!r}")


def make_lab(lesson, prompts=None) -> Lab:
    lab = Lab.create(lesson.scenario)
    s = lab.settings.replace(semantics=lesson.semantics)
    if lesson.semantics == "v1":
        s = s.replace(enable_prefix_caching=True, preemption_mode="recompute")
    if prompts:
        s = s.replace(prompts=prompts)
    assert lab.apply(s), lab.error
    return lab


@pytest.mark.parametrize("edited", [False, True], ids=["preset", "edited prompt"])
@pytest.mark.parametrize("key", list(LESSONS))
def test_every_lesson_completes_and_its_answers_match_the_state(key, edited):
    lesson = LESSONS[key]
    prompts = EDITED_PROMPTS[lesson.scenario] if edited else None
    lab = make_lab(lesson, prompts)
    run = LessonRun(lesson)
    assert 4 <= len(lesson.checkpoints) <= 8
    while run.next_checkpoint is not None:
        assert run.next(lab), run.missed
        cp, snap = run.checkpoint, run.reached
        snaps = lab.snapshots()
        assert snaps[snap.index] is snap and cp.until(snap, snaps[snap.index - 1])
        if cp.question is not None:
            truth = independent_answer(cp.question.text, snap)
            assert run.expected() == truth, (key, cp.question.text)
            assert run.check(str(truth)) and not run.check(str(truth + 1))
            assert not run.check("many") and run.check(f"{truth} of them")
    assert run.done


def test_a_condition_that_never_comes_is_reported_not_waited_for():
    lesson = LESSONS["parallel"]
    lab = make_lab(lesson)
    # n = 1: no fork will ever happen
    assert lab.apply(lab.settings.replace(n=1, temperature=0.0, max_tokens=3))
    run = LessonRun(lesson)
    assert not run.next(lab)
    assert "until the fork" in run.missed and lab.finished
