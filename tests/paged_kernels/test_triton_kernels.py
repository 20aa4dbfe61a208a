"""Each Triton kernel equals its torch reference (paged_kernels/reference.py).

Without CUDA the kernels run in Triton's interpreter on CPU tensors: conftest.py sets
TRITON_INTERPRET=1 before anything imports the kernels (triton decides at decoration time).
With CUDA the same comparisons run on the GPU instead. Shapes are tiny: the interpreter runs
every program of the grid in Python.
"""
import os
import subprocess
import sys

import pytest
import torch

from paged_kernels import BACKENDS, get_ops, resolve_backend  # noqa: E402
from paged_kernels import reference as ref  # noqa: E402
from tests.paged_kernels.helpers import close, needs_triton, paged_setup  # noqa: E402


# lengths: one token, within a block, several blocks, past a split; splits: None = heuristic.
DECODE_CASES = [
    # dtype,        block, hq, hkv, d,  splits
    (torch.float32, 8, 8, 2, 8, (1, 3)),      # GQA group 4, head dim padded to 16, empty splits
    (torch.float16, 16, 8, 2, 8, (None, 4)),
    (torch.float32, 16, 4, 4, 16, (2,)),      # MHA
    (torch.float16, 8, 4, 4, 16, (None,)),
    (torch.float32, 4, 8, 2, 8, (None,)),     # block sizes below 8 work too
    (torch.float32, 1, 4, 2, 16, (2,)),
]


@pytest.mark.parametrize("dtype, block_size, hq, hkv, d, splits", DECODE_CASES)
def test_decode_equals_reference(device, tk, dtype, block_size, hq, hkv, d, splits):
    lengths = [1, 7, 33, 50]
    k_cache, v_cache, table, gen = paged_setup(lengths, block_size, hkv, d, dtype, device, 0,
                                               extra_cols=2)   # wider table: more empty splits
    q = torch.randn(len(lengths), hq, d, generator=gen).to(dtype).to(device)
    ctx = torch.tensor(lengths, dtype=torch.int32, device=device)
    want = ref.paged_decode_attention(q, k_cache, v_cache, table, ctx, 0.3)
    for s in splits:
        got = tk[0].paged_decode_attention(q, k_cache, v_cache, table, ctx, 0.3, num_splits=s)
        assert got.dtype == dtype and got.shape == q.shape
        assert torch.isfinite(got).all()
        close(got, want, dtype)


def test_decode_all_splits_empty_but_one(device, tk):
    """A single one-token sequence with many splits: every split but the first is empty."""
    k_cache, v_cache, table, gen = paged_setup([1], 8, 1, 16, torch.float32, device, 3,
                                               extra_cols=7)
    q = torch.randn(1, 2, 16, generator=gen).to(device)
    ctx = torch.tensor([1], dtype=torch.int32, device=device)
    got = tk[0].paged_decode_attention(q, k_cache, v_cache, table, ctx, 0.5, num_splits=4)
    close(got, ref.paged_decode_attention(q, k_cache, v_cache, table, ctx, 0.5), torch.float32)


PREFILL_CASES = [
    (torch.float32, 8, 8, 2, 8),
    (torch.float16, 16, 8, 2, 8),
    (torch.float32, 16, 4, 4, 16),
    (torch.float16, 4, 4, 2, 16),
]


@pytest.mark.parametrize("dtype, block_size, hq, hkv, d", PREFILL_CASES)
def test_prefill_equals_reference(device, tk, dtype, block_size, hq, hkv, d):
    # new tokens are the last `new` of each context: a prefix hit (20/4), a fresh prompt (5/5),
    # one token after a long context (37/1), a prompt longer than one query tile (18/18)
    lengths, new = [20, 5, 37, 18], [4, 5, 1, 18]
    k_cache, v_cache, table, gen = paged_setup(lengths, block_size, hkv, d, dtype, device, 1)
    q = torch.randn(sum(new), hq, d, generator=gen).to(dtype).to(device)
    starts = [0]
    for n in new:
        starts.append(starts[-1] + n)
    want = ref.paged_prefill_attention(q, k_cache, v_cache, table, starts, lengths, 0.4)
    got = tk[1].paged_prefill_attention(q, k_cache, v_cache, table, starts, lengths, 0.4)
    assert got.dtype == dtype and torch.isfinite(got).all()
    close(got, want, dtype)


@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.float16])
def test_store_kv_equals_reference(device, cache_ops, cache_dtype):
    gen = torch.Generator().manual_seed(2)
    want_k = torch.zeros(6, 8, 2, 16, dtype=cache_dtype)
    want_v = torch.zeros_like(want_k)
    qkv = torch.randn(5, 3, 2, 16, generator=gen)
    k, v = qkv[:, 1], qkv[:, 2]                     # non-contiguous views, as a model makes them
    slots = torch.tensor([3, 4, 17, 40, 47])        # blocks 0, 2, 5; ragged offsets
    ref.store_kv(want_k, want_v, k, v, slots)
    got_k, got_v = torch.zeros_like(want_k).to(device), torch.zeros_like(want_v).to(device)
    cache_ops.store_kv(got_k, got_v, k.to(device), v.to(device), slots.to(device))
    assert torch.equal(got_k.cpu(), want_k) and torch.equal(got_v.cpu(), want_v)


def test_copy_blocks_equals_reference(device, cache_ops):
    gen = torch.Generator().manual_seed(4)
    kv = torch.randn(2, 2, 7, 8, 2, 16, generator=gen).to(torch.float16)  # layers, k/v, blocks...
    src, dst = torch.tensor([1, 3, 1]), torch.tensor([4, 6, 0])            # a block copied twice
    want = kv.clone()
    ref.copy_blocks(want, src, dst)
    got = kv.to(device)
    cache_ops.copy_blocks(got, src.to(device), dst.to(device))
    assert torch.equal(got.cpu(), want)
    cache_ops.copy_blocks(got, src[:0].to(device), dst[:0].to(device))         # empty batch: no-op
    assert torch.equal(got.cpu(), want)


def test_triton_ops_set(device):
    ops = get_ops(resolve_backend("triton", device))
    assert ops.name == "triton"
    assert ops.swap_blocks is ref.swap_blocks                # a device<->host copy stays torch


# ---- dispatcher (no triton needed) ----------------------------------------------------------

def test_auto_is_torch_on_cpu():
    assert resolve_backend("auto", "cpu") == "torch"
    assert get_ops("torch").paged_decode_attention is ref.paged_decode_attention


def test_unknown_backend_is_value_error():
    with pytest.raises(ValueError, match="unknown kernel backend"):
        resolve_backend("cuda-graphs", "cpu")


def test_the_legacy_kernels_are_no_backend():
    """They stay the kernel benchmark's baseline (imported from paged_kernels/legacy/)."""
    assert BACKENDS == ("torch", "triton")
    for ask in (lambda: resolve_backend("triton-legacy", "cpu"), lambda: get_ops("triton-legacy")):
        with pytest.raises(ValueError, match="unknown kernel backend"):
            ask()


@needs_triton
def test_triton_on_cpu_needs_interpreter(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
        resolve_backend("triton", "cpu")


def test_missing_triton_is_clear(monkeypatch):
    import paged_kernels.dispatch as dispatch
    monkeypatch.setattr(dispatch, "triton_importable", lambda: False)
    assert dispatch.resolve_backend("auto", "cuda") == "torch"
    with pytest.raises(ValueError, match="triton package"):
        dispatch.resolve_backend("triton", "cuda")


def test_everything_imports_without_triton():
    """Triton is optional: with it unimportable, kernels and the engine import and pick torch."""
    code = ("import sys; sys.modules['triton'] = None\n"
            "import engine, paged_kernels\n"
            "from paged_kernels import resolve_backend, get_ops\n"
            "assert resolve_backend('auto', 'cuda') == 'torch'\n"
            "assert get_ops('torch').name == 'torch'\n"
            "assert 'paged_kernels.triton_decode' not in sys.modules\n"
            "print('ok')\n")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    res = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True,
                         timeout=120, env={**os.environ, "PYTHONPATH": root})
    assert res.returncode == 0 and "ok" in res.stdout, res.stderr[-2000:]
