"""A Triton op that fails to compile or launch falls back to the torch reference, once, with a
warning that names the op and the error; the engine's backend label says what really ran.

The failure is real in the sense that matters: the Triton launch itself raises (a fake kernel
object stands in for the compiled one, as a GPU without support for it would), while the
engine, the model and every other op run for real (Triton's interpreter on CPU).
"""
import warnings

import pytest
import torch

from engine import Engine, EngineConfig, SamplingParams
from paged_kernels import get_ops, reference
from paged_kernels.dispatch import FallbackOps, KernelOps
from paged_kernels.triton_support import interpreting, triton_importable


class BrokenKernel:
    """Launching it raises what Triton raises when a kernel does not fit the GPU."""

    def __init__(self, message="out of resource: shared memory, Required: 262144, Hardware limit: 232448"):
        self.message = message
        self.launches = 0

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.launches += 1
            raise RuntimeError(self.message)
        return launch


@pytest.fixture
def interpreted():
    if not triton_importable():
        pytest.skip("triton not installed")
    if torch.cuda.is_available() or not interpreting():
        pytest.skip("runs the Triton kernels in the interpreter (no CUDA, TRITON_INTERPRET=1)")


def _run(path, backend, prompts, **cfg):
    """Step the requests (observed, so snapshots record the backend label after each step)."""
    eng = Engine(EngineConfig(model=path, block_size=8, num_gpu_blocks=32, device="cpu",
                              backend=backend, **cfg))
    rids = [eng.add_request(p, SamplingParams(max_tokens=5, ignore_eos=True)) for p in prompts]
    while eng.has_unfinished_requests():
        eng.step()
    return eng, [eng.get_output(r).outputs[0].token_ids for r in rids]


def test_engine_falls_back_once_and_says_so(interpreted, tiny_llama, monkeypatch):
    from paged_kernels import triton_decode
    broken = BrokenKernel()
    monkeypatch.setattr(triton_decode, "_decode_split_kernel", broken)
    prompts = [[1, 5, 9, 3, 7], list(range(40, 60))]
    _, want = _run(tiny_llama[0], "torch", prompts)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        eng, got = _run(tiny_llama[0], "triton", prompts)
    assert got == want                                  # the reference took over, same tokens
    assert broken.launches == 1                         # tried once, then torch for good
    msgs = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert len(msgs) == 1 and "paged_decode_attention" in msgs[0] and "out of resource" in msgs[0]
    label = eng.backend_label
    assert label.startswith("cpu-triton+torch (triton failed: paged_decode_attention: RuntimeError")
    assert eng.snapshot.backend == label                # the page draws it from the snapshot
    assert eng.runner.ops.failed.keys() == {"paged_decode_attention"}
    eng.check_invariants()


def test_all_kernels_failing_reads_torch(interpreted, tiny_llama, monkeypatch):
    from paged_kernels import triton_cache_ops, triton_decode, triton_prefill
    for mod, name in [(triton_decode, "_decode_split_kernel"), (triton_prefill, "_prefill_kernel"),
                      (triton_cache_ops, "_store_kv_kernel"),
                      (triton_cache_ops, "_copy_blocks_kernel")]:
        monkeypatch.setattr(mod, name, BrokenKernel("PTX JIT compilation failed"))
    with pytest.warns(RuntimeWarning):
        eng = Engine(EngineConfig(model=tiny_llama[0], block_size=8, num_gpu_blocks=32,
                                  device="cpu", backend="triton"))
        rid = eng.add_request([2, 4, 6], SamplingParams(n=2, temperature=1.0, seed=3, max_tokens=3,
                                                        ignore_eos=True))
        kinds = []
        while eng.has_unfinished_requests():
            kinds += [e.kind for e in eng.step().events]
    assert "cow" in kinds and len(eng.get_output(rid).outputs) == 2
    assert set(eng.runner.ops.failed) == {"store_kv", "copy_blocks", "paged_decode_attention",
                                          "paged_prefill_attention"}
    assert eng.backend_label.startswith("cpu-torch (triton failed: ")


def test_fallback_off_raises_naming_nothing_hidden(interpreted, tiny_llama, monkeypatch):
    from paged_kernels import triton_decode
    monkeypatch.setattr(triton_decode, "_decode_split_kernel", BrokenKernel())
    with pytest.raises(RuntimeError, match="out of resource"):
        _run(tiny_llama[0], "triton", [[1, 2, 3]], kernel_fallback=False)


def _fake_set(decode):
    return KernelOps("fake", reference.store_kv, reference.copy_blocks, reference.swap_blocks,
                     decode, reference.paged_decode_attention)


def test_out_of_memory_and_bad_input_are_not_hidden():
    def oom(*a, **k):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    ops = FallbackOps(_fake_set(oom))
    with pytest.raises(torch.cuda.OutOfMemoryError):
        ops.paged_decode_attention()
    assert not ops.failed and ops.label == "fake"

    def bad(*a, **k):
        raise ValueError("kernel rejects this")
    ops = FallbackOps(_fake_set(bad))
    with pytest.raises(TypeError):           # the reference rejects the call as well: propagate
        ops.paged_decode_attention("not a tensor")
    assert not ops.failed


def test_torch_backend_is_never_wrapped():
    assert get_ops("torch", fallback=True).label == "torch"
    ops = FallbackOps(_fake_set(reference.paged_decode_attention))
    assert ops.store_kv is reference.store_kv           # same function: nothing to guard
