"""Bad input: a ValueError that names the problem, raised before any state changes."""
import json
import math

import pytest

from engine import Engine, EngineConfig, SamplingParams


@pytest.fixture()
def eng(tiny_llama):
    e = Engine(EngineConfig(model=tiny_llama[0], block_size=4, num_gpu_blocks=16))
    e.add_request([1, 2, 3], SamplingParams(max_tokens=4))
    e.step()
    return e


REQUEST_CASES = {
    "empty list prompt": ([], SamplingParams(), "empty"),
    "empty text prompt": ("", SamplingParams(), "empty"),
    "text without tokenizer": ("hello", SamplingParams(), "tokenizer"),
    "token out of vocab": ([1, 500], SamplingParams(), "token ids"),
    "negative token": ([-1], SamplingParams(), "token ids"),
    "not a prompt": (3.5, SamplingParams(), "string or a list"),
    "prompt longer than context": (list(range(100)) * 3, SamplingParams(), "context"),
    "n can never fit": ([1] * 10, SamplingParams(n=8, temperature=1, max_tokens=30), "never run"),
    "beams can never fit": ([1] * 10, SamplingParams(beam_width=6, max_tokens=40), "never run"),
    "one request larger than the pool": ([1] * 60, SamplingParams(max_tokens=10), "never run"),
}


@pytest.mark.parametrize("case", REQUEST_CASES)
def test_bad_request_is_rejected_without_state_change(eng, case):
    prompt, params, words = REQUEST_CASES[case]
    before = eng.snapshot.to_dict()
    history = len(eng.history)
    with pytest.raises(ValueError, match=words):
        eng.add_request(prompt, params)
    assert eng.snapshot.to_dict() == before and len(eng.history) == history
    assert set(eng.groups) == {"0"}
    eng.check_invariants()


def test_a_v0_prompt_longer_than_the_step_budget_is_refused_and_v1_chunks_it():
    """vLLM v0's prompt limit is min(max_model_len, max_num_batched_tokens): v0 prefills a
    prompt in one step. v1 prefills it in chunks of the budget."""
    cfg = dict(block_size=4, num_gpu_blocks=32, max_num_batched_tokens=16)
    v0 = Engine.length_only(EngineConfig(**cfg), max_model_len=64)
    with pytest.raises(ValueError, match=r"20 tokens .* max_num_batched_tokens \(16\)"):
        v0.add_request(list(range(20)), SamplingParams(max_tokens=2))
    v0.add_request(list(range(16)), SamplingParams(max_tokens=2))
    v1 = Engine.length_only(EngineConfig(semantics="v1", **cfg), max_model_len=64)
    v1.add_request(list(range(20)), SamplingParams(max_tokens=2, ignore_eos=True))
    chunks = [(e.start, e.end) for e in v1.step().events + v1.step().events if e.kind == "prefill"]
    assert chunks == [(0, 16), (16, 20)]


def test_duplicate_request_id_and_generate_validate_first(eng):
    before = eng.snapshot.to_dict()
    with pytest.raises(ValueError, match="already in use"):
        eng.add_request([5, 6], request_id="0")
    with pytest.raises(ValueError, match="empty"):
        eng.generate([[5, 6], []])          # the good prompt is not queued either
    assert eng.snapshot.to_dict() == before and set(eng.groups) == {"0"}


@pytest.mark.parametrize("kwargs, words", [
    (dict(temperature=math.nan), "temperature"),
    (dict(temperature=-0.5), "temperature"),
    (dict(top_p=0.0), "top_p"),
    (dict(top_p=1.5), "top_p"),
    (dict(top_k=-2), "top_k"),
    (dict(top_k=2.5), "top_k"),
    (dict(seed=-2), "seed"),
    (dict(seed=-1.0), "seed"),
    (dict(top_k=0.0), "top_k"),
    (dict(beam_width=2, top_k=5), "top_k off"),
    (dict(beam_width=2, top_p=0.9), "top_p at 1"),
    (dict(length_penalty=2.0), "without beam search"),
    (dict(early_stopping=True), "without beams"),
    (dict(max_tokens=0), "max_tokens"),
    (dict(n=0), "n must be"),
    (dict(beam_width=0), "beam_width"),
    (dict(n=2, temperature=0.0), "identical"),
    (dict(beam_width=2, temperature=0.7), "deterministic"),
    (dict(n=2, beam_width=2, temperature=1.0), "not both"),
    (dict(stop=[""]), "stop"),
])
def test_bad_sampling_params(kwargs, words):
    with pytest.raises(ValueError, match=words):
        SamplingParams(**kwargs)


def test_vllms_spellings_of_off_are_accepted():
    """vLLM: top_k 0 or -1 considers every token, seed -1 means no seed."""
    assert SamplingParams(top_k=0).top_k == -1 and SamplingParams(seed=-1).seed is None


@pytest.mark.parametrize("kwargs, words", [
    (dict(block_size=3), "power of two"),
    (dict(block_size=0), "power of two"),
    (dict(num_gpu_blocks=0), "num_gpu_blocks"),
    (dict(preemption_mode="drop"), "preemption_mode"),
    (dict(preemption_mode="swap", num_cpu_blocks=0), "swap space"),
    (dict(device="tpu"), "device"),
    (dict(dtype="int8"), "dtype"),
    (dict(max_model_len=0), "max_model_len must be"),
    (dict(max_model_len=-8), "max_model_len must be"),
    (dict(max_model_len=12.5), "max_model_len must be"),
    (dict(max_model_len="64"), "max_model_len must be"),
    (dict(observe="yes"), "observe must be"),
])
def test_bad_engine_config(kwargs, words):
    with pytest.raises(ValueError, match=words):
        EngineConfig(**kwargs)


def test_max_model_len_bounds_requests(tiny_llama):
    """vLLM's max_model_len: above the model's context is refused; a prompt that leaves no room
    is refused before anything changes; a request whose max_tokens would grow past it runs up
    to max_model_len and finishes with "length" (vLLM v1 check_stop); the Max baseline
    reserves exactly it."""
    with pytest.raises(ValueError, match="above the model's context of 256"):
        Engine(EngineConfig(model=tiny_llama[0], max_model_len=257))
    eng = Engine(EngineConfig(model=tiny_llama[0], block_size=4, num_gpu_blocks=32,
                              max_model_len=24))
    assert eng.max_model_len == 24
    before = eng.snapshot.to_dict()
    with pytest.raises(ValueError, match="max_model_len"):
        eng.add_request(list(range(1, 25)), SamplingParams(max_tokens=1))
    assert eng.snapshot.to_dict() == before and not eng.has_unfinished_requests()
    eng.add_request(list(range(1, 21)), SamplingParams(max_tokens=4, ignore_eos=True))
    snap = eng.step().snapshot
    assert [s.size for s in snap.slabs if s.allocator == "max"] == [24]


def test_max_tokens_past_max_model_len_stops_there(tiny_llama):
    """vLLM v1 check_stop: a request stops with "length" once num_tokens reaches
    max_model_len, whatever max_tokens says (prompt 20 + max_tokens 10 > 24: 4 tokens)."""
    for semantics in ("v0", "v1"):
        eng = Engine(EngineConfig(model=tiny_llama[0], block_size=4, num_gpu_blocks=32,
                                  max_model_len=24, semantics=semantics))
        out = eng.generate([list(range(1, 21))],
                           SamplingParams(max_tokens=10, min_tokens=8, ignore_eos=True))[0]
        assert len(out.outputs[0].token_ids) == 4, semantics
        assert out.outputs[0].finish_reason == "length"


def test_unknown_model_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="no such folder"):
        Engine(EngineConfig(model="./no/such/model"))
    with pytest.raises(ValueError, match="no config.json"):
        Engine(EngineConfig(model=str(tmp_path)))
    with pytest.raises(ValueError, match="hub"):
        Engine(EngineConfig(model="nobody-here/not-a-model"))


def test_cuda_requested_without_cuda(tiny_llama):
    import torch
    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    with pytest.raises(ValueError, match="CUDA"):
        Engine(EngineConfig(model=tiny_llama[0], device="cuda"))


def test_snapshot_is_json_serialisable(eng):
    while eng.has_unfinished_requests():
        eng.step()
    for snap in eng.history:
        json.dumps(snap.to_dict())
    assert eng.snapshot.stats.free_blocks == 16


def test_vllm_prompt_dicts_and_the_sampling_params_keyword():
    """vLLM's LLM.generate(prompts, sampling_params=...) with TextPrompt / TokensPrompt dicts
    (a cache_salt may ride in the dict); a dict with neither key is refused by name."""
    eng = Engine(EngineConfig(model="default", num_gpu_blocks=64, enable_prefix_caching=True))
    params = SamplingParams(max_tokens=4)
    text = eng.generate(["ROMEO:"], params)[0].outputs[0].token_ids
    ids = eng.tokenize("ROMEO:")
    outs = eng.generate([{"prompt": "ROMEO:"}, {"prompt_token_ids": ids}], sampling_params=params)
    assert [o.outputs[0].token_ids for o in outs] == [text, text]
    assert outs[0].prompt == "ROMEO:" and outs[1].prompt_token_ids == ids
    rid = eng.add_request({"prompt_token_ids": ids, "cache_salt": "alice"}, params)
    assert eng.groups[rid].cache_salt == "alice"
    with pytest.raises(ValueError, match="a prompt dict holds 'prompt'"):
        eng.generate([{"text": "ROMEO:"}], params)
    with pytest.raises(ValueError, match="give the SamplingParams once"):
        eng.generate(["ROMEO:"], params, sampling_params=params)
    with pytest.raises(ValueError, match="'prompt_token_ids' must be a list of token ids, got str"):
        eng.add_request({"prompt_token_ids": "ROMEO:"}, params)
    with pytest.raises(ValueError, match="'prompt' must be text, got list"):
        eng.add_request({"prompt": [5, 6, 7]}, params)
    with pytest.raises(ValueError, match="two cache salts"):
        eng.add_request({"prompt": "ROMEO:", "cache_salt": "a"}, params, cache_salt="b")
    before = eng.get_num_unfinished_requests()
    with pytest.raises(ValueError, match="cache_salt must be a non-empty string"):
        eng.generate([{"prompt": "ROMEO:"}, {"prompt": "JULIET:", "cache_salt": 5}], params)
    assert eng.get_num_unfinished_requests() == before      # nothing was queued


def test_max_tokens_none_runs_to_max_model_len(tiny_llama):
    """vLLM's max_tokens=None: the request may run up to max_model_len."""
    eng = Engine(EngineConfig(model=tiny_llama[0], block_size=4, num_gpu_blocks=32,
                              max_model_len=24, semantics="v1"))
    out = eng.generate([list(range(1, 18))], SamplingParams(max_tokens=None, ignore_eos=True))[0]
    assert len(out.outputs[0].token_ids) == 7 and out.outputs[0].finish_reason == "length"
    with pytest.raises(ValueError, match="max_tokens must be None"):
        SamplingParams(max_tokens=0)


@pytest.mark.parametrize("backend", ["triton-legacy", "cuda-graphs", None])
def test_a_backend_that_is_not_offered_is_refused_by_the_config(backend):
    """The first Triton kernels are the kernel benchmark's baseline, not a backend: the config
    refuses them (and any other value), naming the field and what it takes."""
    with pytest.raises(ValueError, match=r"backend must be one of \('auto', 'torch', 'triton'\)"):
        EngineConfig(backend=backend)
    for ok in ("auto", "torch", "triton"):
        assert EngineConfig(backend=ok).backend == ok
