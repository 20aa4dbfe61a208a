"""Incremental detokenization equals decoding the whole output, multi-byte characters included,
and stop strings are found in the new tail only."""
import pytest

from engine import Engine, EngineConfig, SamplingParams
from engine.detokenizer import DetokState, detokenize_flush, detokenize_step
from engine.output_processor import find_stop

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
    assert detokenize_flush(tok, ids, state) == tok.decode(ids, skip_special_tokens=True)
    assert "".join(pieces) == state.text


def test_a_cut_character_waits_then_flushes(tok):
    ids = tok.encode("😀", add_special_tokens=False)
    if len(ids) < 2:
        pytest.skip("the tokenizer keeps this emoji in one token")
    state = DetokState()
    assert detokenize_step(tok, ids[:1], state) == ""      # an incomplete UTF-8 sequence
    assert detokenize_flush(tok, ids[:1], state) == tok.decode(ids[:1])   # shown at the end


def test_engine_text_equals_whole_decode(tok):
    eng = Engine(EngineConfig(model="default", block_size=8, num_gpu_blocks=128))
    outs = eng.generate(["ROMEO:\n", "JULIET:\nO"],
                        SamplingParams(n=2, temperature=1.0, seed=3, max_tokens=40, ignore_eos=True))
    for out in outs:
        for c in out.outputs:
            assert c.text == tok.decode(c.token_ids, skip_special_tokens=True)


def test_find_stop_looks_only_at_the_new_tail():
    assert find_stop("hello world", "rld", ["wor"]) == 6       # overlaps the new text
    assert find_stop("hello world", "ld", ["wor"]) is None      # ended before it: seen already
    assert find_stop("hello world", "d", ["hello"]) is None     # seen (and not hit) before
    assert find_stop("abcabc", "c", ["bc", "abc"]) == 3
    assert find_stop("abc", "", ["abc"]) is None                # nothing new: nothing to find
