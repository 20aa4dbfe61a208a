"""Incremental detokenization equals decoding the whole output, multi-byte characters included,
and stop strings are found in the new tail only."""
import pytest
import torch

from engine import Engine, EngineConfig, SamplingParams
from engine.processing.detokenizer import DetokState, detokenize_step
from engine.processing.output_processor import find_stop

TEXTS = ["ROMEO: But, soft! what light through yonder window breaks?",
         "naïve café — “quoted” ☃ 😀 über ñandú",       # 2-, 3- and 4-byte UTF-8
         "a\n\n  spaced\tout   words  "]


@pytest.fixture(scope="module")
def tok(default_model_path):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(default_model_path)


@pytest.mark.parametrize("text", TEXTS)
def test_token_by_token_equals_whole_decode(tok, text):
    ids = tok.encode(text, add_special_tokens=False)
    state, pieces = DetokState(), []
    for n in range(1, len(ids) + 1):
        new = detokenize_step(tok, ids[:n], state)
        assert "\ufffd" not in new                       # never half a character
        pieces.append(new)
    assert state.text == "".join(pieces) == tok.decode(ids, skip_special_tokens=True)


def test_a_cut_character_waits_for_the_rest(tok):
    ids = tok.encode("😀", add_special_tokens=False)
    if len(ids) < 2:
        pytest.skip("the tokenizer keeps this emoji in one token")
    state = DetokState()
    assert detokenize_step(tok, ids[:1], state) == ""      # an incomplete UTF-8 sequence
    assert detokenize_step(tok, ids, state) == "😀" and state.text == "😀"


def test_a_character_cut_by_the_length_cap_is_left_out(tok):
    """vLLM never emits an incomplete character (v1 detokenizer: decode_next returns "" until
    the character is whole), so a sequence that ends inside one does not show U+FFFD."""
    eng = Engine(EngineConfig(model="default", block_size=8, num_gpu_blocks=64))
    emoji = tok.encode("😀", add_special_tokens=False)
    if len(emoji) < 2:
        pytest.skip("the tokenizer keeps this emoji in one token")
    prompt = tok.encode("ROMEO:", add_special_tokens=False)
    runner = eng.runner
    forced = iter([emoji[0], emoji[1]] * 4)
    real = runner.execute

    def execute(batch):                  # the model "says" the emoji's first byte token first
        logits = torch.full_like(real(batch), float("-inf"))
        logits[:, next(forced)] = 0.0
        return logits

    runner.execute = execute
    out = eng.generate([prompt], SamplingParams(max_tokens=1, ignore_eos=True))[0].outputs[0]
    assert out.token_ids == emoji[:1] and out.text == ""


def test_engine_text_equals_whole_decode(tok):
    eng = Engine(EngineConfig(model="default", block_size=8, num_gpu_blocks=128))
    outs = eng.generate(["ROMEO:\n", "JULIET:\nO"],
                        SamplingParams(n=2, temperature=1.0, seed=3, max_tokens=40, ignore_eos=True))
    for out in outs:
        for c in out.outputs:
            assert c.text == tok.decode(c.token_ids, skip_special_tokens=True)


def test_find_stop_looks_only_at_the_new_tail():
    assert find_stop("hello world", "rld", ["wor"]) == (6, "wor")      # overlaps the new text
    assert find_stop("hello world", "ld", ["wor"]) is None      # ended before it: seen already
    assert find_stop("hello world", "d", ["hello"]) is None     # seen (and not hit) before
    # the first listed stop string that matches wins, as in vLLM's check_stop_strings
    assert find_stop("abcabc", "c", ["bc", "abc"]) == (4, "bc")
    assert find_stop("abcabc", "c", ["abc", "bc"]) == (3, "abc")
    assert find_stop("xyz ab", "b", ["zz", "ab", "z ab"]) == (4, "ab")
    assert find_stop("abc", "", ["abc"]) is None                # nothing new: nothing to find


def test_a_text_prompt_gets_the_tokenizers_special_tokens(default_model_path, tmp_path):
    """vLLM encodes a text prompt with the tokenizer's defaults (add_special_tokens=True), as
    transformers' tokenizer(prompt) does: a BOS that tokenizer.json's post-processor adds (Llama
    3's way, with no add_bos_token in tokenizer_config.json) starts the prompt."""
    import json
    import shutil
    from pathlib import Path
    from transformers import AutoTokenizer
    src = Path(default_model_path)
    for f in src.iterdir():
        if f.is_file():
            shutil.copy(f, tmp_path / f.name)
    spec = json.loads((src / "tokenizer.json").read_text())
    bos = {"SpecialToken": {"id": "<s>", "type_id": 0}}
    spec["post_processor"] = {
        "type": "TemplateProcessing", "single": [bos, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [bos, {"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {"<s>": {"id": "<s>", "ids": [0], "tokens": ["<s>"]}}}
    (tmp_path / "tokenizer.json").write_text(json.dumps(spec))
    want = AutoTokenizer.from_pretrained(str(tmp_path))("ROMEO:")["input_ids"]
    assert want[0] == 0
    eng = Engine(EngineConfig(model=str(tmp_path), block_size=8, num_gpu_blocks=32))
    out = eng.generate(["ROMEO:"], SamplingParams(max_tokens=2))[0]
    assert out.prompt_token_ids == want
    plain = Engine(EngineConfig(model="default", block_size=8, num_gpu_blocks=32))
    assert plain.generate(["ROMEO:"], SamplingParams(max_tokens=2))[0].prompt_token_ids == want[1:]
