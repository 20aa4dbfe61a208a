"""The embedded default model (assets/default-model/) is present, small, and loads offline.

It is produced by train/train_default_model.py; these tests check the committed files, not a
retraining run.
"""
import os

os.environ["HF_HUB_OFFLINE"] = "1"  # must never reach a model hub
os.environ["TRANSFORMERS_OFFLINE"] = "1"

import json
import re
from pathlib import Path

import pytest
import torch

MODEL_DIR = Path(__file__).resolve().parents[2] / "assets" / "default-model"
MAX_BYTES = 50 * 1024 * 1024
REQUIRED_FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "README.md",
)
# Frequent words of English and of Shakespeare's plays; a model that learned anything about its
# corpus puts most of its greedy words in here, an untrained one almost none.
COMMON_WORDS = set("""
a all am an and are art as at ay be been but by come did do doth dost ere for from give go
good had has hath have he her here him his how i if in is it let lord love make man may me
more my nay no nor not now o of on one or our out shall she should sir so speak such sweet
than that the thee their them then there these they thine this those thou thus thy till tis
to too unto up upon us was we well were what when where which who why will with would ye yet
you your king queen heart death life god know see say day night never ever
""".split())


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(MODEL_DIR)


@pytest.fixture(scope="module")
def model():
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(MODEL_DIR).eval()


def test_folder_has_hf_files():
    assert MODEL_DIR.is_dir(), f"{MODEL_DIR} missing: run train/train_default_model.py"
    for name in REQUIRED_FILES:
        assert (MODEL_DIR / name).is_file(), f"{name} missing from {MODEL_DIR}"


def test_folder_size_at_most_50_mb():
    total = sum(f.stat().st_size for f in MODEL_DIR.rglob("*") if f.is_file())
    assert total <= MAX_BYTES, f"default model folder is {total / 1e6:.1f} MB"


def test_config_is_small_gqa_llama(model, tokenizer):
    cfg = model.config
    assert cfg.model_type == "llama"
    assert cfg.num_key_value_heads < cfg.num_attention_heads
    assert cfg.num_attention_heads % cfg.num_key_value_heads == 0
    assert cfg.max_position_embeddings >= 1024
    assert cfg.vocab_size == len(tokenizer)
    raw = json.loads((MODEL_DIR / "config.json").read_text())
    assert raw["eos_token_id"] == tokenizer.eos_token_id
    assert model.generation_config.eos_token_id == tokenizer.eos_token_id
    n_params = sum(p.numel() for p in model.parameters())
    assert 1_000_000 < n_params < 13_000_000


def test_tokenizer_is_fast_with_special_tokens(tokenizer):
    assert tokenizer.is_fast
    assert tokenizer.bos_token is not None and tokenizer.bos_token_id is not None
    assert tokenizer.eos_token is not None and tokenizer.eos_token_id is not None
    assert tokenizer.bos_token_id != tokenizer.eos_token_id


@pytest.mark.parametrize(
    "text",
    [
        "ROMEO:\nBut, soft! what light through yonder window breaks?\n",
        "JULIET:\nO Romeo, Romeo! wherefore art thou Romeo?\n\n[Exit]",
        "  two spaces, a tab\there; 'tis -- \"quoted\" (parens) & c.",
        "café, naïve, Ærø, 日本語, 🎭",
        "",
    ],
)
def test_tokenizer_round_trips_exactly(tokenizer, text):
    ids = tokenizer(text)["input_ids"]
    assert tokenizer.decode(ids) == text


def test_greedy_generation_looks_like_english(model, tokenizer):
    enc = tokenizer("ROMEO:", return_tensors="pt")
    with torch.no_grad():
        out = model.generate(
            **enc, max_new_tokens=48, do_sample=False, pad_token_id=tokenizer.pad_token_id
        )
    text = tokenizer.decode(out[0][enc["input_ids"].shape[1]:], skip_special_tokens=True)
    assert text.strip(), "greedy generation produced only whitespace"
    printable = sum(c.isascii() and (c.isalpha() or c in " \n,.;:!?'-[]") for c in text)
    assert printable / len(text) >= 0.9, text
    words = [w.strip("'").lower() for w in re.findall(r"[A-Za-z']+", text)]
    words = [w for w in words if w]
    assert len(words) >= 10, text
    common = sum(w in COMMON_WORDS for w in words) / len(words)
    assert common >= 0.25, f"only {common:.0%} common English words in: {text!r}"


def test_model_card_reports_perplexity_and_licence():
    card = (MODEL_DIR / "README.md").read_text(encoding="utf-8")
    assert "public domain" in card.lower()
    assert re.search(r"perplexity\*\*\s*\|\s*\*\*\d+(\.\d+)?", card), "held-out perplexity missing"
