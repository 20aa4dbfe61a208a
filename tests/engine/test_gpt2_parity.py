"""GPT-2 in our model code equals transformers' generate; the Triton backend equals torch.

- Tiny random GPT-2 checkpoints (built from a config, saved, loaded by path): greedy outputs of
  three prompts stepped together equal ``GPT2LMHeadModel.generate``; also for the
  OpenAI-style checkpoint layout (no ``transformer.`` prefix, attention-mask buffers present).
- The Triton backend on CPU (Triton's interpreter, so tiny) gives the torch backend's tokens.
- With CUDA: the same parity tests with the Triton backend on the GPU.
"""
import os

import pytest
import torch

if not torch.cuda.is_available():           # before anything imports the Triton kernels
    os.environ.setdefault("TRITON_INTERPRET", "1")

from engine import Engine, EngineConfig, SamplingParams  # noqa: E402
from paged_kernels.triton_support import interpreting, triton_importable  # noqa: E402
from tests.engine.helpers import hf_greedy  # noqa: E402

PROMPTS = [[1, 5, 9, 3, 7], list(range(10, 31)), list(range(40, 77))]   # 5, 21, 37 tokens


def build_tiny_gpt2(path, **overrides):
    import transformers

    cfg = dict(vocab_size=128, n_embd=64, n_layer=2, n_head=4, n_positions=256,
               eos_token_id=None, bos_token_id=None, pad_token_id=None,
               initializer_range=0.1)   # peaky logits: argmax ties would make parity flaky
    cfg.update(overrides)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(**cfg)).eval()
    model.save_pretrained(str(path))
    return model


@pytest.fixture(scope="module")
def tiny_gpt2(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-gpt2")
    return str(path), build_tiny_gpt2(path)


@pytest.fixture(scope="module")
def tiny_gpt2_variant(tmp_path_factory):
    """Untied lm_head, n_inner, per-layer attention scaling, plain gelu; saved OpenAI-style:
    no 'transformer.' prefix and the old 'attn.bias' / 'attn.masked_bias' buffers."""
    from safetensors.torch import load_file, save_file

    path = tmp_path_factory.mktemp("tiny-gpt2-variant")
    hf = build_tiny_gpt2(path, tie_word_embeddings=False, n_inner=96,
                         scale_attn_by_inverse_layer_idx=True, activation_function="gelu")
    state = load_file(str(path / "model.safetensors"))
    renamed = {k.removeprefix("transformer."): v for k, v in state.items()}
    for i in range(2):
        renamed[f"h.{i}.attn.bias"] = torch.tril(torch.ones(1, 1, 256, 256, dtype=torch.bool))
        renamed[f"h.{i}.attn.masked_bias"] = torch.tensor(-1e4)
    assert "lm_head.weight" in renamed
    save_file(renamed, str(path / "model.safetensors"))
    return str(path), hf


def run_batch(eng, prompts, max_tokens):
    for p in prompts:                      # stepped together, one batch
        eng.add_request(p, SamplingParams(max_tokens=max_tokens, ignore_eos=True))
    first = eng.step()
    assert first.kind == "prefill" and len(first.snapshot.sequences) == len(prompts)
    while eng.has_unfinished_requests():
        eng.step()
    eng.check_invariants()
    return [eng.get_output(str(i)).outputs[0].token_ids for i in range(len(prompts))]


@pytest.mark.parametrize("block_size", [4, 16])
def test_gpt2_greedy_matches_transformers(tiny_gpt2, block_size):
    path, hf = tiny_gpt2
    expected = [hf_greedy(hf, p, 32) for p in PROMPTS]
    eng = Engine(EngineConfig(model=path, block_size=block_size, num_gpu_blocks=64, device="cpu"))
    assert eng.spec.model_type == "gpt2" and eng.spec.num_kv_heads == eng.spec.num_heads
    assert run_batch(eng, PROMPTS, 32) == expected


def test_gpt2_openai_layout_untied_matches_transformers(tiny_gpt2_variant):
    path, hf = tiny_gpt2_variant
    expected = [hf_greedy(hf, p, 16) for p in PROMPTS]
    eng = Engine(EngineConfig(model=path, block_size=16, num_gpu_blocks=64, device="cpu"))
    assert run_batch(eng, PROMPTS, 16) == expected


# ---- Triton backend --------------------------------------------------------------------------

def _skip_unless_triton_interpreter():
    if not triton_importable():
        pytest.skip("triton not installed")
    if not interpreting():
        pytest.skip("CUDA is present: the interpreter check runs on machines without CUDA "
                    "(or with TRITON_INTERPRET=1 set before Python starts)")


def test_triton_backend_on_cpu_equals_torch(tiny_llama):
    """Tiny Llama (GQA 4/2 heads), block size 8: prefill + decode (with split-K merges) +
    a CoW copy from parallel sampling, all through the Triton kernels in the interpreter."""
    _skip_unless_triton_interpreter()
    path, _ = tiny_llama
    prompts = [[1, 5, 9, 3, 7], list(range(40, 77))]     # 37 tokens: decode uses 2 splits
    results = {}
    for backend in ("torch", "triton"):
        eng = Engine(EngineConfig(model=path, block_size=8, num_gpu_blocks=32, device="cpu",
                                  backend=backend))
        assert eng.backend_label == f"cpu-{backend}"
        got = run_batch(eng, prompts, 6)
        rid = eng.add_request([2, 4, 6], SamplingParams(n=2, temperature=1.0, seed=7, max_tokens=3,
                                                        ignore_eos=True))
        kinds = []
        while eng.has_unfinished_requests():
            kinds += [e.kind for e in eng.step().events]
        eng.check_invariants()
        assert "cow" in kinds                      # copy_blocks ran on the shared last block
        results[backend] = (got, [o.token_ids for o in eng.get_output(rid).outputs])
    assert results["triton"] == results["torch"]


@pytest.fixture
def cuda_triton():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA")
    if not triton_importable():
        pytest.skip("triton not installed")
    if interpreting():
        pytest.skip("TRITON_INTERPRET=1 is set: Triton would not run on the GPU")


@pytest.mark.parametrize("arch", ["tiny_llama", "tiny_qwen2", "tiny_gpt2"])
@pytest.mark.parametrize("block_size", [4, 16])
def test_cuda_triton_greedy_matches_transformers(cuda_triton, arch, block_size, request):
    path, hf = request.getfixturevalue(arch)
    expected = [hf_greedy(hf, p, 32) for p in PROMPTS]
    eng = Engine(EngineConfig(model=path, block_size=block_size, num_gpu_blocks=64, device="cuda",
                              dtype="float32", backend="triton"))
    assert eng.backend_label == "cuda-triton"
    assert run_batch(eng, PROMPTS, 32) == expected
