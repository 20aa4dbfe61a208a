"""vLLM's stop_token_ids, min_tokens, include_stop_str_in_output and stop_reason, and the
text a stop leaves (vllm/v1/core/sched/utils.py check_stop, vllm/v1/engine/detokenizer.py,
vLLM v0's StopChecker), on the default model (a real tokenizer)."""
import json
import shutil

import pytest

from engine import Engine, EngineConfig, SamplingParams

PROMPT = "ROMEO:"


@pytest.fixture(scope="module")
def free_run():
    """The default model's greedy output for PROMPT with nothing to stop it early."""
    eng = Engine(EngineConfig(model="default", num_gpu_blocks=64))
    return eng.generate([PROMPT], SamplingParams(max_tokens=20, ignore_eos=True))[0].outputs[0]


@pytest.mark.parametrize("semantics", ["v0", "v1"])
def test_a_stop_token_ends_the_sequence_with_its_id_as_stop_reason(free_run, semantics):
    eng = Engine(EngineConfig(model="default", semantics=semantics, num_gpu_blocks=64))
    ids = free_run.token_ids
    stop = next(t for i, t in enumerate(ids) if i >= 3 and t not in ids[:i])
    at = ids.index(stop)
    out = eng.generate([PROMPT], SamplingParams(max_tokens=20, stop_token_ids=[stop]))[0].outputs[0]
    assert out.token_ids == ids[:at + 1]                   # the stop token is kept in the ids
    assert out.finish_reason == "stop" and out.stop_reason == stop
    # ... but its text is not (vLLM's Detokenizer.update(stop_terminated=True))
    assert out.text == eng.tokenizer.decode(ids[:at], skip_special_tokens=True)
    kept = eng.generate([PROMPT], SamplingParams(max_tokens=20, stop_token_ids=[stop],
                                                 include_stop_str_in_output=True))[0].outputs[0]
    assert kept.token_ids == out.token_ids
    assert kept.text == eng.tokenizer.decode(ids[:at + 1], skip_special_tokens=True)
    assert len(kept.text) > len(out.text)
    # the length cap and the model's own EOS report no stop_reason
    assert free_run.finish_reason == "length" and free_run.stop_reason is None
    eng.check_invariants()


@pytest.mark.parametrize("semantics", ["v0", "v1"])
def test_min_tokens_holds_back_stop_tokens_and_stop_strings(free_run, semantics):
    eng = Engine(EngineConfig(model="default", semantics=semantics, num_gpu_blocks=64))
    first = free_run.token_ids[0]
    held = eng.generate([PROMPT], SamplingParams(max_tokens=12, min_tokens=4, ignore_eos=True,
                                                 stop_token_ids=[first]))[0].outputs[0]
    # the first greedy token is a stop token: it cannot be sampled before 4 output tokens
    assert first not in held.token_ids[:4] and held.token_ids[0] != first
    stop = free_run.text[1:4]                # completed by one of the first few tokens
    cut = eng.generate([PROMPT], SamplingParams(max_tokens=12, ignore_eos=True,
                                                stop=[stop]))[0].outputs[0]
    late = eng.generate([PROMPT], SamplingParams(max_tokens=12, ignore_eos=True, stop=[stop],
                                                 min_tokens=len(cut.token_ids) + 1))[0].outputs[0]
    assert cut.finish_reason == "stop" and cut.stop_reason == stop
    assert len(late.token_ids) > len(cut.token_ids)       # that stop string came too early
    # from min_tokens on it counts in v0 (StopChecker); v1's detokenizer looks only after it
    at_min = eng.generate([PROMPT], SamplingParams(max_tokens=12, ignore_eos=True, stop=[stop],
                                                   min_tokens=len(cut.token_ids)))[0].outputs[0]
    assert (at_min.token_ids == cut.token_ids) == (semantics == "v0")


@pytest.mark.parametrize("include", [False, True])
def test_a_stop_string_is_cut_or_kept_and_is_the_stop_reason(free_run, include):
    eng = Engine(EngineConfig(model="default", num_gpu_blocks=64))
    text = free_run.text
    stop = text[5:8]
    out = eng.generate([PROMPT], SamplingParams(max_tokens=20, ignore_eos=True, stop=[stop],
                                                include_stop_str_in_output=include))[0].outputs[0]
    at = text.index(stop)
    assert out.text == (text[:at + len(stop)] if include else text[:at])
    assert out.finish_reason == "stop" and out.stop_reason == stop


def test_an_eos_that_is_not_a_special_token_leaves_its_text_out(tmp_path, default_model_path,
                                                                 free_run):
    """With skip_special_tokens an EOS such as "</s>" has no text anyway; a model whose EOS is
    an ordinary token must not show it either (vLLM's StopChecker / detokenizer). The
    tokenizer's EOS is the primary one (no stop_reason); another EOS id from
    generation_config.json reports its id, as vLLM adds such ids to stop_token_ids."""
    ids = free_run.token_ids
    eos = next(t for i, t in enumerate(ids) if i >= 3 and t not in ids[:i])
    at = ids.index(eos)
    path = tmp_path / "model"
    shutil.copytree(default_model_path, path)
    gen = json.loads((path / "generation_config.json").read_text())
    primary = gen["eos_token_id"]
    gen["eos_token_id"] = [primary, eos]
    (path / "generation_config.json").write_text(json.dumps(gen))
    eng = Engine(EngineConfig(model=str(path), num_gpu_blocks=64))
    out = eng.generate([PROMPT], SamplingParams(max_tokens=20))[0].outputs[0]
    assert out.token_ids == ids[:at + 1] and out.finish_reason == "stop"
    assert out.text == eng.tokenizer.decode(ids[:at], skip_special_tokens=True)
    assert out.stop_reason == eos and eng.tokenizer.eos_token_id == primary
    beams = eng.generate([PROMPT], SamplingParams(beam_width=2, max_tokens=20))[0].outputs
    ended = [b for b in beams if b.token_ids[-1] == eos]
    assert ended
    for b in ended:
        assert b.text == eng.tokenizer.decode(b.token_ids[:-1], skip_special_tokens=True)
        assert b.stop_reason == eos


@pytest.mark.parametrize("bad, message", [
    (dict(min_tokens=-1), "min_tokens must be an integer >= 0"),
    (dict(min_tokens=17, max_tokens=16), "min_tokens must be at most max_tokens=16"),
    (dict(stop_token_ids=[3, -2]), "stop_token_ids must be token ids"),
    (dict(stop_token_ids=7), "stop_token_ids must be a list of token ids"),
    (dict(stop_token_ids=[True]), "stop_token_ids must be token ids"),
    (dict(include_stop_str_in_output="yes"), "include_stop_str_in_output must be True or False"),
])
def test_bad_stop_settings_are_refused_by_name(bad, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**bad)


def test_a_stop_token_outside_the_vocabulary_is_refused_before_any_state_changes():
    eng = Engine(EngineConfig(model="default", num_gpu_blocks=64))
    with pytest.raises(ValueError, match=r"stop_token_ids must be token ids in \[0, 4096\)"):
        eng.add_request(PROMPT, SamplingParams(stop_token_ids=[4096]))
    assert not eng.groups and not eng.has_unfinished_requests()


def test_sampling_never_draws_a_held_back_stop_token():
    """At temperature 1 the ban is in the sampler, not only in the stop check: none of 8
    samples draws a stop token among its first min_tokens tokens, though they are the likeliest."""
    eng = Engine(EngineConfig(model="default", num_gpu_blocks=128))
    free = eng.generate([PROMPT], SamplingParams(n=8, temperature=1.0, seed=3, max_tokens=6,
                                                 ignore_eos=True))[0].outputs
    likely = sorted({o.token_ids[0] for o in free})
    held = eng.generate([PROMPT], SamplingParams(n=8, temperature=1.0, seed=3, max_tokens=6,
                                                 min_tokens=3, ignore_eos=True,
                                                 stop_token_ids=likely))[0].outputs
    assert all(not set(o.token_ids[:3]) & set(likely) for o in held)
    assert all(o.finish_reason == "length" or o.token_ids[-1] in likely for o in held)


@pytest.mark.parametrize("semantics", ["v0", "v1"])
def test_text_read_mid_run_holds_back_what_may_start_a_stop_string(free_run, semantics):
    """vLLM holds back len(longest stop string) - 1 characters of a running sequence's text
    (v1 Detokenizer.get_next_output_text, v0 output_text_buffer_length), so every text read
    mid-run is the start of the final one, even when a stop string is cut from it later."""
    eng = Engine(EngineConfig(model="default", semantics=semantics, num_gpu_blocks=64))
    stop = free_run.text[8:18]
    rid = eng.add_request(PROMPT, SamplingParams(max_tokens=20, ignore_eos=True, stop=[stop]))
    seen, raw = [], []
    while eng.has_unfinished_requests():
        eng.step()
        seen.append(eng.get_output(rid).outputs[0].text)
        raw.append(eng.groups[rid].all_seqs()[0].output_text)     # the engine's own text
    final = seen[-1]
    assert final == free_run.text[:8] and eng.get_output(rid).finished
    assert all(final.startswith(t) for t in seen)
    assert all(t == r[:-(len(stop) - 1)] for t, r in zip(seen[:-1], raw[:-1]))
    assert any(not final.startswith(r) for r in raw[:-1])   # unheld, a read would show more
    kept = eng.add_request(PROMPT, SamplingParams(max_tokens=20, ignore_eos=True, stop=[stop],
                                                  include_stop_str_in_output=True))
    eng.step()
    eng.step()
    assert eng.get_output(kept).outputs[0].text             # nothing held back with it


def test_a_tiny_positive_temperature_is_raised_to_a_hundredth_as_vllm_does():
    """vLLM's SamplingParams.__post_init__: 0 < temperature < 1e-2 becomes 1e-2 (dividing
    logits by less could overflow), so only temperature 0 is greedy."""
    assert SamplingParams(temperature=1e-6).temperature == 0.01
    assert not SamplingParams(temperature=1e-6).is_greedy and SamplingParams().is_greedy
    assert SamplingParams(temperature=0.5).temperature == 0.5
    SamplingParams(n=2, temperature=1e-6)                   # sampled, so n > 1 is fine
