"""No top-level import name of the repository is one the installed environment also provides
(docs/architecture.md#layers): transformers >= 5.2x imports Hugging Face's ``kernels``
distribution while loading its Llama and GPT-2 code, and a root ``kernels/`` package, first on
``sys.path`` under ``python -m`` and pytest, was imported instead (issue 37)."""
from __future__ import annotations

import importlib.metadata
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def root_import_names() -> set[str]:
    """Every name ``import X`` resolves from the repository root: packages (with or without
    ``__init__.py``: a folder without one is still a namespace portion) and modules."""
    names = set()
    for p in ROOT.iterdir():
        if p.name.startswith(".") or not p.name.isidentifier() and p.suffix != ".py":
            continue
        if p.is_dir() and p.name.isidentifier():
            names.add(p.name)
        elif p.suffix == ".py" and p.stem.isidentifier():
            names.add(p.stem)
    return names


def test_no_root_name_is_an_installed_distributions_module():
    provided = importlib.metadata.packages_distributions()
    clashes = {n: provided[n] for n in root_import_names() if n in provided}
    assert not clashes, (f"top-level names of the repository that installed distributions also "
                         f"provide (rename ours): {clashes}")


def test_the_check_sees_a_clash():
    """The check above can fail: an installed distribution's own top-level name is found."""
    provided = importlib.metadata.packages_distributions()
    assert "transformers" in provided and "transformers" in provided["transformers"]


def test_transformers_model_code_imports_with_the_root_first():
    """transformers' Llama and GPT-2 modeling code imports with the repository root first on
    ``sys.path`` (as ``python -m`` and pytest put it), and builds a tiny model of each."""
    code = (
        "import sys; sys.path.insert(0, sys.argv[1])\n"
        "import transformers\n"
        "from transformers.models.llama import modeling_llama\n"
        "from transformers.models.gpt2 import modeling_gpt2\n"
        "cfg = transformers.LlamaConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1,"
        " num_attention_heads=2, num_key_value_heads=1, vocab_size=64)\n"
        "modeling_llama.LlamaForCausalLM(cfg)\n"
        "modeling_gpt2.GPT2LMHeadModel(transformers.GPT2Config(n_embd=16, n_layer=1, n_head=2,"
        " vocab_size=64, n_positions=32))\n"
        "import engine, paged_kernels\n"
        "print('ok', transformers.__version__)\n")
    run = subprocess.run([sys.executable, "-c", code, str(ROOT)], capture_output=True,
                         text=True, timeout=240, cwd=ROOT)
    assert run.returncode == 0 and "ok" in run.stdout, run.stderr[-3000:]
