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


def test_what_the_loader_accepts_follows_transformers_modeling():
    """Read as transformers' modeling code reads a config: Qwen2 slides only the layers its
    layer_types say (max_window_layers); a sliding_window elsewhere slides every layer (Mistral,
    and Llama, whose attention reads the field too), which caps the context (our attention is
    full attention) and the refusal says so; Mistral has no attention biases whatever
    attention_bias says; "swish" is SiLU; an MLP with biases is refused by name."""
    import transformers
    from engine.models.spec import ModelSpec
    small = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    llama = ModelSpec.from_hf_config(transformers.LlamaConfig(**small, sliding_window=8))
    assert llama.max_model_len == 8
    full = transformers.Qwen2Config(**small, use_sliding_window=True, sliding_window=8,
                                    max_window_layers=2)
    slid = transformers.Qwen2Config(**small, use_sliding_window=True, sliding_window=8,
                                    max_window_layers=0)
    assert ModelSpec.from_hf_config(full).max_model_len == 64
    assert ModelSpec.from_hf_config(slid).max_model_len == 8
    mistral = ModelSpec.from_hf_config(transformers.MistralConfig(**small, sliding_window=8,
                                                                  attention_bias=True))
    assert mistral.max_model_len == 8 and not mistral.attention_bias
    assert not mistral.o_proj_bias
    assert ModelSpec.from_hf_config(transformers.LlamaConfig(**small, hidden_act="swish"))
    with pytest.raises(ValueError, match="mlp_bias"):
        ModelSpec.from_hf_config(transformers.LlamaConfig(**small, mlp_bias=True))
    from engine.processing.input_processor import InputProcessor
    from engine import EngineConfig
    inputs = InputProcessor(mistral, None, EngineConfig())
    with pytest.raises(ValueError, match="sliding_window"):
        inputs.check(list(range(10)), None)
