"""The embedded default model: loads offline, and the engine's greedy text equals transformers'."""
import torch

from engine import Engine, EngineConfig, SamplingParams
from engine.models.loader import DEFAULT_MODEL_DIR

PROMPTS = ["ROMEO:", "JULIET:\nO Romeo, Romeo,", "KING LEAR:\nBlow, winds, and crack your cheeks"]


def test_engine_greedy_equals_transformers_on_the_default_model(monkeypatch):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    eng = Engine(EngineConfig(model="default", block_size=16, num_gpu_blocks=64))
    assert eng.spec.num_kv_heads < eng.spec.num_heads and eng.max_model_len >= 1024
    outs = eng.generate(PROMPTS, SamplingParams(max_tokens=40))
    eng.check_invariants()

    hf = AutoModelForCausalLM.from_pretrained(DEFAULT_MODEL_DIR, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(DEFAULT_MODEL_DIR)
    for prompt, out in zip(PROMPTS, outs):
        ids = eng.tokenize(prompt)
        ref = hf.generate(torch.tensor([ids]), max_new_tokens=40, do_sample=False,
                          pad_token_id=tok.pad_token_id)[0, len(ids):].tolist()
        got = out.outputs[0].token_ids
        assert got == ref                    # both stop at EOS or after 40 tokens
        assert out.outputs[0].text == tok.decode(got, skip_special_tokens=True)
        assert sum(c.isalpha() for c in out.outputs[0].text) > 20    # real words, not noise
