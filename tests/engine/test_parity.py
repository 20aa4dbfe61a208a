"""Greedy and beam outputs equal transformers' generate on the same weights."""
import pytest

from engine import Engine, EngineConfig, SamplingParams
from tests.engine.helpers import hf_greedy

PROMPTS = [[1, 5, 9, 3, 7], list(range(10, 31)), list(range(40, 77))]   # 5, 21, 37 tokens


@pytest.mark.parametrize("arch", ["tiny_llama", "tiny_qwen2"])
@pytest.mark.parametrize("block_size", [4, 16])
def test_greedy_matches_transformers(arch, block_size, request):
    path, hf = request.getfixturevalue(arch)
    expected = [hf_greedy(hf, p, 32) for p in PROMPTS]
    eng = Engine(EngineConfig(model=path, block_size=block_size, num_gpu_blocks=64))
    for p in PROMPTS:                      # stepped together, one batch
        eng.add_request(p, SamplingParams(max_tokens=32, ignore_eos=True))
    first = eng.step()
    assert first.kind == "prefill" and len(first.snapshot.sequences) == 3
    while eng.has_unfinished_requests():
        eng.step()
    got = [eng.get_output(r).outputs[0].token_ids for r in ("0", "1", "2")]
    assert got == expected
    eng.check_invariants()


@pytest.mark.parametrize("arch", ["tiny_llama", "tiny_qwen2"])
def test_beam_search_matches_transformers(arch, request):
    path, hf = request.getfixturevalue(arch)
    prompt = PROMPTS[1]
    expected = hf_greedy(hf, prompt, 16, num_beams=3)
    eng = Engine(EngineConfig(model=path, block_size=4, num_gpu_blocks=64))
    out = eng.generate([prompt], SamplingParams(max_tokens=16, beam_width=3, ignore_eos=True))[0]
    assert out.outputs[0].token_ids == expected
    assert len(out.outputs) == 3
    scores = [o.cumulative_logprob for o in out.outputs]
    assert scores == sorted(scores, reverse=True)          # best first
    eng.check_invariants()
