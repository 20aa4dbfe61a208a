"""Session state: validation before replacing the engine, stepping, play, replay, and the
scenario presets making their point within ~20 steps on the real model."""
from __future__ import annotations

from collections import Counter

import pytest

from app.scenarios import preset
from app.engine_build import build_engine, parse_prompts
from app.lab import Lab

from .conftest import needs_model

BAD_SETTINGS = [   # (changes to the "parallel" preset, words the error must contain)
    (dict(prompts="  \n \n"), "prompt is empty"),
    (dict(num_gpu_blocks=2), "could never run"),
    (dict(temperature=0.0), "set temperature > 0"),
    (dict(n=0), "n must be an integer >= 1"),
    (dict(n=2, beam_width=2), "not both"),
    (dict(block_size=3), "power of two"),
    (dict(preemption_mode="swap", num_cpu_blocks=0), "CPU pool (blocks) > 0"),   # its label
    (dict(top_p=1.5), "top-p"),
    (dict(max_model_len=0), "max_model_len must be"),
    (dict(max_model_len=-4), "max_model_len must be"),
    (dict(max_model_len=2.5), "max_model_len must be"),
    (dict(max_model_len=100000), "above the model's context"),
    (dict(num_gpu_blocks=10**6), "limited to"),
    (dict(model="/no/such/folder"), "PAGED_LAB_MODELS"),         # not on the server's list
    (dict(model="someone/not-a-model-anywhere"), "PAGED_LAB_MODELS"),
    (dict(backend="cuda-graphs"), "unknown kernel backend"),
]


def test_parse_prompts():
    assert parse_prompts("a\n\n  b  \n") == ["a", "b"]
    with pytest.raises(ValueError, match="empty"):
        parse_prompts("")


@needs_model
def test_bad_settings_raise_and_keep_the_engine(model):
    lab = Lab.create("parallel", model)
    assert lab.engine is not None and lab.error is None
    lab.step()
    for changes, words in BAD_SETTINGS:
        engine, settings, n = lab.engine, lab.settings, len(lab.snapshots())
        assert not lab.apply(settings.replace(**changes)), changes
        assert words in lab.error, (changes, lab.error)
        assert lab.engine is engine and lab.settings == settings and len(lab.snapshots()) == n
    assert lab.step()                                # still works
    assert len(lab.snapshots()) == 3


def test_the_page_passes_only_the_settings_that_apply():
    """The engine refuses beam settings without beams and top-k / top-p with them (as vLLM v0
    did); the sidebar keeps both kinds, so the page hands over only those that apply."""
    from app.engine_build import make_params
    plain = make_params(preset("single").replace(length_penalty=2.0, top_k=5))
    assert plain.length_penalty == 1.0 and plain.top_k == 5
    beams = make_params(preset("beam").replace(top_k=5, top_p=0.9, length_penalty=2.0))
    assert beams.beam_width > 1 and (beams.top_k, beams.top_p, beams.length_penalty) == (-1, 1.0, 2.0)


@needs_model
def test_kernel_backend_setting_reaches_the_engine(model):
    """The sidebar's Kernels setting forces a backend; the snapshot shows the label that ran."""
    lab = Lab.create("single", model)
    assert lab.apply(lab.settings.replace(backend="torch"))
    lab.step()
    assert lab.engine.config.backend == "torch" and lab.current().backend == "cpu-torch"


@needs_model
def test_second_prompt_error_names_it(model):
    s = preset("mixed", model).replace(prompts="ROMEO:\n" + "word " * 2000)
    with pytest.raises(ValueError, match="^prompt 2: "):
        build_engine(s)


@needs_model
def test_sessions_share_weights_not_pools(model):
    a, b = Lab.create("single", model), Lab.create("single", model)
    assert a.engine is not b.engine
    ra, rb = a.engine.engine.runner, b.engine.engine.runner   # the page engines' own Engines
    assert ra is not rb
    for name in ("model", "tokenizer"):     # the per-process cached weights, if the engine exposes them
        wa, wb = getattr(ra, name, None), getattr(rb, name, None)
        if wa is not None:
            assert wa is wb
    a.step()
    assert len(a.snapshots()) == 2 and len(b.snapshots()) == 1


@needs_model
def test_history_back_and_latest(model):
    lab = Lab.create("single", model)
    for _ in range(3):
        lab.step()
    assert lab.current().step == 3 and lab.view is None
    lab.back()
    assert lab.current().step == 2 and lab.previous().step == 1
    lab.show(0)
    assert lab.current().kind == "init"
    lab.step()                                       # forward through the recorded history
    assert lab.current().step == 1 and lab.view == 1 and len(lab.snapshots()) == 4
    lab.forward()
    lab.step()                                       # the newest recorded step
    assert lab.current().step == 3 and lab.view is None and len(lab.snapshots()) == 4
    lab.forward()                                    # Forward never computes a step
    assert len(lab.snapshots()) == 4
    lab.step()                                       # at the end: a new engine step
    assert lab.current().step == 4 and lab.view is None


@needs_model
def test_play_stops_when_finished(model):
    lab = Lab.create("single", model)
    assert lab.apply(lab.settings.replace(max_tokens=4))
    lab.playing = True
    ticks = 0
    while lab.playing and ticks < 100:
        lab.last_tick = 0.0                          # pretend the interval has passed
        lab.tick(1.0)
        ticks += 1
    assert not lab.playing and lab.finished
    assert ticks == 4             # the prefill samples the first token, then one per step
    assert not lab.tick(1.0)
    lab.playing = True
    lab.last_tick = 10**12                           # too soon: no step
    assert not lab.tick(1.0)


@needs_model
def test_replay_a_trace(model):
    lab = Lab.create("parallel", model)
    for _ in range(3):
        lab.step()
    trace = lab.snapshots()
    lab.load_trace(trace, "t.json")
    assert lab.replaying and lab.current().step == 0 and not lab.finished
    engine_steps = lab.engine.snapshot.step
    while lab.step():
        pass
    assert lab.current().step == 3 and lab.finished
    assert lab.engine.snapshot.step == engine_steps  # replay never touches the engine
    assert lab.decode is not None                    # same model: tokens can be decoded
    lab.close_trace()
    assert not lab.replaying and lab.current().step == 3


def kinds_by_step(lab: Lab, steps: int) -> list[Counter]:
    out = []
    for _ in range(steps):
        if not lab.step():
            break
        out.append(Counter(e.kind for e in lab.current().events))
    return out


@needs_model
def test_single_preset_grows_one_block_at_a_time(model):
    lab = Lab.create("single", model)
    kinds = kinds_by_step(lab, 9)
    assert sum(k["alloc"] for k in kinds[1:]) >= 2   # new blocks while decoding (block size 4)
    for snap in lab.snapshots():
        partial = [b for b in snap.blocks if b.ref_count and b.filled < snap.block_size]
        assert len(partial) <= 1


@needs_model
def test_parallel_preset_copies_on_write_on_the_first_decode(model):
    lab = Lab.create("parallel", model)
    kinds = kinds_by_step(lab, 2)
    assert kinds[0]["fork"] == 3 and kinds[1]["cow"] == 3
    snap = lab.current()
    prompt_len = snap.sequences[0].prompt_len
    assert snap.stats.shared_blocks == prompt_len // snap.block_size >= 1


@needs_model
def test_beam_preset_forks_prunes_and_copies(model):
    lab = Lab.create("beam", model)
    total = sum(kinds_by_step(lab, 20), Counter())
    assert total["fork"] >= 2 and total["beam_prune"] >= 1 and total["cow"] >= 1


@needs_model
def test_prefix_preset_hits_the_cache(model):
    lab = Lab.create("prefix", model)
    kinds = kinds_by_step(lab, 1)
    assert kinds[0]["prefix_hit"] >= 2 * 2           # 2 later requests x >= 2 blocks


@needs_model
@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_mixed_preset_preempts(model, mode):
    lab = Lab.create("mixed", model)
    assert lab.apply(lab.settings.replace(preemption_mode=mode))
    total = sum(kinds_by_step(lab, 20), Counter())
    assert total["preempt"] >= 1
    assert (total["swap_out"] >= 1) == (mode == "swap")


@needs_model
def test_characters_split_over_byte_tokens_are_shown_whole(model):
    """The default model's tokenizer splits é, 漢 and 🙂 into byte tokens that decode to �
    one by one; the page shows each character whole, on the token that completes it."""
    lab = Lab.create("single", model)
    text = "ÉTÉ: café 漢字 🙂 ok"
    ids = lab.engine.tokenize(text)
    assert "\ufffd" in "".join(lab.engine.decode_tokens(ids))
    shown = lab.decode(ids)
    assert len(shown) == len(ids) and "".join(shown) == text and "\ufffd" not in "".join(shown)
