"""Every EOS id stops generation, generation_config.json is read, and beam search follows
transformers' generate exactly: early_stopping True / False / "never", several EOS ids (more
candidates kept per step), stop strings, with EOS really occurring."""
import pytest
import torch

from engine import Engine, EngineConfig, SamplingParams
from tests.conftest import build_tiny

PROMPT = [5, 17, 33, 2, 60, 41]


@pytest.fixture(scope="module")
def two_eos(tmp_path_factory):
    """A tiny Llama whose config.json lists one EOS id that never occurs, and whose
    generation_config.json lists it plus one the model produces at its 6th greedy step (and
    that beam search meets as well): the second id, from the second file, must stop it."""
    path = tmp_path_factory.mktemp("two-eos")
    hf = build_tiny(path, "llama")
    free = hf.generate(torch.tensor([PROMPT]), max_new_tokens=24, do_sample=False)[0, 6:].tolist()
    seen = set(free[:5])
    stopper = next(t for t in free[5:] if t not in seen)
    never = next(t for t in range(hf.config.vocab_size) if t not in free and t not in PROMPT)
    hf.config.eos_token_id = never
    hf.generation_config.eos_token_id = [never, stopper]
    hf.generation_config.pad_token_id = never
    hf.save_pretrained(str(path))
    return str(path), hf, (never, stopper)


def _trim(ids, eos):
    """transformers pads a finished sequence after its EOS; ours ends at the EOS."""
    for i, t in enumerate(ids):
        if t in eos:
            return ids[:i + 1]
    return ids


def test_every_eos_id_stops_greedy(two_eos):
    path, hf, eos = two_eos
    eng = Engine(EngineConfig(model=path, block_size=4, num_gpu_blocks=64))
    assert eng.spec.eos_token_ids == eos                   # generation_config.json's list
    want = hf.generate(torch.tensor([PROMPT]), max_new_tokens=24, do_sample=False)[0, 6:].tolist()
    out = eng.generate([PROMPT], SamplingParams(max_tokens=24))[0].outputs[0]
    assert out.token_ids == _trim(want, eos) and out.token_ids[-1] == eos[1]
    assert out.finish_reason == "stop" and len(out.token_ids) < 24


@pytest.mark.parametrize("semantics", ["v0", "v1"])
def test_an_eos_as_the_last_allowed_token_is_a_stop(two_eos, semantics):
    """vLLM checks EOS before the length cap (v1: vllm/v1/core/sched/utils.py check_stop; v0:
    StopChecker.maybe_stop_sequence): max_tokens = the EOS's position still says "stop"."""
    path, _, eos = two_eos
    eng = Engine(EngineConfig(model=path, semantics=semantics, block_size=4, num_gpu_blocks=64))
    free = eng.generate([PROMPT], SamplingParams(max_tokens=24))[0].outputs[0]
    assert free.token_ids[-1] in eos
    capped = eng.generate([PROMPT], SamplingParams(max_tokens=len(free.token_ids)))[0].outputs[0]
    assert capped.token_ids == free.token_ids and capped.finish_reason == "stop"
    shorter = eng.generate([PROMPT], SamplingParams(max_tokens=len(free.token_ids) - 1))[0]
    assert shorter.outputs[0].finish_reason == "length"


@pytest.mark.parametrize("semantics", ["v0", "v1"])
def test_a_stop_string_completed_by_the_last_allowed_token_is_a_stop(semantics):
    """A stop string the max_tokens-th token completes ends the request as "stop" with the text
    cut before it (vLLM v1's OutputProcessor lets the detokenizer's stop string override the
    core's "length"; v0's StopChecker checks stop strings before max_tokens)."""
    eng = Engine(EngineConfig(model="default", semantics=semantics, block_size=8,
                              num_gpu_blocks=64))
    texts = [r.outputs[0].text for r in eng.generate(
        ["ROMEO:\n"] * 16, [SamplingParams(max_tokens=n, ignore_eos=True) for n in range(1, 17)])]
    # the first n whose n-th token's text (stripped) is new: it can be a stop string
    n, stop = next((n, t) for n in range(4, 16)
                   if (t := texts[n - 1][len(texts[n - 2]):].strip()) and t not in texts[n - 2])
    out = eng.generate(["ROMEO:\n"], SamplingParams(max_tokens=n, ignore_eos=True,
                                                     stop=[stop]))[0].outputs[0]
    assert out.finish_reason == "stop" and len(out.token_ids) == n
    assert out.text == texts[n - 1][:texts[n - 1].rindex(stop)] and stop not in out.text


@pytest.mark.parametrize("early_stopping, length_penalty", [
    (False, 1.0), (True, 1.0), ("never", 1.0), ("never", 2.0), (False, 2.0), (True, -1.0)])
def test_beam_search_matches_transformers(two_eos, early_stopping, length_penalty):
    path, hf, eos = two_eos
    width, new = 3, 14
    gen = hf.generate(torch.tensor([PROMPT]), max_new_tokens=new, do_sample=False,
                      num_beams=width, num_return_sequences=width, early_stopping=early_stopping,
                      length_penalty=length_penalty)
    want = [_trim(row[len(PROMPT):].tolist(), eos) for row in gen]
    eng = Engine(EngineConfig(model=path, block_size=4, num_gpu_blocks=128))
    out = eng.generate([PROMPT], SamplingParams(beam_width=width, max_tokens=new,
                                                early_stopping=early_stopping,
                                                length_penalty=length_penalty))[0]
    assert [o.token_ids for o in out.outputs] == want
    hyps = eng.groups[out.request_id].done_seqs
    assert any(h.finish_reason == "stop" for h in hyps)         # EOS really occurred
    eng.check_invariants()


def test_early_stopping_changes_the_search(two_eos):
    """The three settings are not the same search: True stops first."""
    path, _, _ = two_eos
    steps = {}
    for es in (True, False, "never"):
        eng = Engine(EngineConfig(model=path, block_size=4, num_gpu_blocks=128))
        eng.add_request(PROMPT, SamplingParams(beam_width=3, max_tokens=14, early_stopping=es,
                                               length_penalty=2.0))
        n = 0
        while eng.has_unfinished_requests():
            eng.step()
            n += 1
        steps[es] = n
    assert steps[True] <= steps[False] <= steps["never"]
    assert steps[True] < steps["never"]


def test_stop_strings_end_beams_as_transformers_does(default_model_path):
    """Beam search with a stop string: a hypothesis that produces it finishes (transformers'
    stop_strings), the others go on; the default model has a real tokenizer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tok = AutoTokenizer.from_pretrained(default_model_path)
    hf = AutoModelForCausalLM.from_pretrained(default_model_path).eval()
    eng = Engine(EngineConfig(model="default", block_size=8, num_gpu_blocks=256))
    prompt = tok.encode("ROMEO:\n", add_special_tokens=False)
    base = eng.generate([prompt], SamplingParams(beam_width=3, max_tokens=20, ignore_eos=True))[0]
    text = base.outputs[0].text
    word = next(w for w in text.split()[2:] if w.isalpha() and len(w) >= 3)
    stop = word[:3]
    gen = hf.generate(torch.tensor([prompt]), max_new_tokens=20, do_sample=False, num_beams=3,
                      num_return_sequences=3, stop_strings=[stop], tokenizer=tok,
                      pad_token_id=tok.pad_token_id)
    want = []
    for row in gen:
        ids = row[len(prompt):].tolist()
        while ids and ids[-1] == tok.pad_token_id:
            ids.pop()
        want.append(ids)
    out = eng.generate([prompt], SamplingParams(beam_width=3, max_tokens=20, stop=[stop],
                                                ignore_eos=True))[0]
    assert [o.token_ids for o in out.outputs] == want
    stopped = [o for o in out.outputs if o.finish_reason == "stop"]
    assert stopped and all(stop not in o.text for o in stopped)   # text is cut before it


@pytest.mark.parametrize("semantics", ["v0", "v1"])
def test_min_tokens_holds_every_eos_back_as_transformers_min_new_tokens(two_eos, semantics):
    """vLLM's min_tokens = transformers' min_new_tokens: no EOS id can be sampled (nor end the
    sequence) before that many output tokens; the EOS the model produces at step 6 is held back
    by min_tokens=8, so the search goes elsewhere and stops at a later EOS, or at max_tokens."""
    path, hf, eos = two_eos
    want = _trim(hf.generate(torch.tensor([PROMPT]), max_new_tokens=20, min_new_tokens=8,
                             do_sample=False)[0, 6:].tolist(), eos)
    eng = Engine(EngineConfig(model=path, semantics=semantics, block_size=4, num_gpu_blocks=64))
    free = eng.generate([PROMPT], SamplingParams(max_tokens=20))[0].outputs[0]
    held = eng.generate([PROMPT], SamplingParams(max_tokens=20, min_tokens=8))[0].outputs[0]
    assert len(free.token_ids) == 6 and free.finish_reason == "stop"
    assert held.token_ids == want and not set(held.token_ids[:8]) & set(eos)
    assert held.token_ids[:5] == free.token_ids[:5]
    eng.check_invariants()


def test_min_tokens_with_beams_matches_transformers(two_eos):
    path, hf, eos = two_eos
    gen = hf.generate(torch.tensor([PROMPT]), max_new_tokens=12, min_new_tokens=7,
                      do_sample=False, num_beams=3, num_return_sequences=3)
    want = [_trim(row[len(PROMPT):].tolist(), eos) for row in gen]
    eng = Engine(EngineConfig(model=path, block_size=4, num_gpu_blocks=128))
    out = eng.generate([PROMPT], SamplingParams(beam_width=3, max_tokens=12, min_tokens=7))[0]
    assert [o.token_ids for o in out.outputs] == want
    assert all(not set(o.token_ids[:7]) & set(eos) for o in out.outputs)


def test_stop_token_ids_end_beams_like_eos_ids(two_eos):
    """Beam search with stop_token_ids: they end hypotheses as the model's EOS ids do, so the
    search equals transformers' with those ids added to eos_token_id."""
    path, hf, eos = two_eos
    base = Engine(EngineConfig(model=path, block_size=4, num_gpu_blocks=128)).generate(
        [PROMPT], SamplingParams(beam_width=3, max_tokens=12, ignore_eos=True))[0]
    ids = base.outputs[0].token_ids
    stop = next(t for i, t in enumerate(ids) if i >= 5 and t not in ids[:i])    # met late
    gen = hf.generate(torch.tensor([PROMPT]), max_new_tokens=12, do_sample=False, num_beams=3,
                      num_return_sequences=3, eos_token_id=[*eos, stop])
    want = [_trim(row[len(PROMPT):].tolist(), (*eos, stop)) for row in gen]
    eng = Engine(EngineConfig(model=path, block_size=4, num_gpu_blocks=128))
    out = eng.generate([PROMPT], SamplingParams(beam_width=3, max_tokens=12,
                                                stop_token_ids=[stop]))[0]
    assert [o.token_ids for o in out.outputs] == want
    hyps = [h for h in eng.groups[out.request_id].done_seqs if h.finish_reason == "stop"]
    assert any(h.token_ids[-1] == stop and h.stop_reason == stop for h in hyps)   # it occurred
