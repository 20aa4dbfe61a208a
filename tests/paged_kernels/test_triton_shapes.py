"""The Triton attention kernels at real model shapes: head dims 64 and 128, GQA groups 1, 4
and 8, block sizes 1, 16 and 32, in fp32, fp16 and bf16.

bf16 under the interpreter: the kernels cast K, V (and Q) to fp32 before ``tl.dot`` when they
run on CPU tensors, because the interpreter's bf16 ``tl.dot`` is silently wrong (triton issue
#11584, see ../shared/FACTS.md). So on CPU these bf16 cases check the paging, masking and
dtype handling with bf16 storage; on a GPU the same tests run the real bf16 dots, at bf16
tolerance. Sequence counts and lengths stay tiny: the interpreter runs every program in Python.
"""
import pytest
import torch

from paged_kernels import reference as ref
from tests.paged_kernels.helpers import close, paged_setup

BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32

# dtype, block size, q heads, kv heads (group = hq / hkv), head dim
SHAPES = [
    (BF16, 16, 8, 1, 128),    # group 8, Llama-3-8B's head dim
    (BF16, 32, 4, 1, 64),     # group 4
    (BF16, 1, 4, 1, 128),     # one token per page
    (FP16, 1, 2, 2, 64),      # MHA (group 1)
    (FP32, 32, 8, 1, 128),
    (FP32, 16, 2, 2, 128),
]


@pytest.mark.parametrize("dtype, block_size, hq, hkv, d", SHAPES)
def test_decode_real_shapes(device, tk, dtype, block_size, hq, hkv, d):
    lengths = [1, 17, 40]            # one token; a page boundary; a partial last tile + 2 splits
    k_cache, v_cache, table, gen = paged_setup(lengths, block_size, hkv, d, dtype, device, 5,
                                               extra_cols=3)
    q = torch.randn(len(lengths), hq, d, generator=gen).to(dtype).to(device)
    ctx = torch.tensor(lengths, dtype=torch.int32, device=device)
    scale = d ** -0.5
    want = ref.paged_decode_attention(q, k_cache, v_cache, table, ctx, scale)
    got = tk[0].paged_decode_attention(q, k_cache, v_cache, table, ctx, scale, max(lengths))
    assert got.dtype == dtype and torch.isfinite(got).all()
    close(got, want, dtype)


@pytest.mark.parametrize("dtype, block_size, hq, hkv, d", SHAPES)
def test_prefill_real_shapes(device, tk, dtype, block_size, hq, hkv, d):
    # (context, new tokens): a fresh prompt; a prefix hit whose cached part ends exactly on a
    # key tile (unmasked loop, then the diagonal); a single new token after a long context
    lengths, new = [5, 32, 40], [5, 16, 1]
    k_cache, v_cache, table, gen = paged_setup(lengths, block_size, hkv, d, dtype, device, 6)
    q = torch.randn(sum(new), hq, d, generator=gen).to(dtype).to(device)
    starts = [0]
    for n in new:
        starts.append(starts[-1] + n)
    scale = d ** -0.5
    want = ref.paged_prefill_attention(q, k_cache, v_cache, table, starts, lengths, scale)
    got = tk[1].paged_prefill_attention(q, k_cache, v_cache, table, starts, lengths, scale)
    assert got.dtype == dtype and torch.isfinite(got).all()
    close(got, want, dtype)


def test_decode_splits_follow_live_context(device):
    """The split count comes from the longest live context, not the padded table width: a
    table 8x wider than needed gives the same plan (and result) as a tight one."""
    from paged_kernels import triton_decode
    lengths = [20, 3]
    k_cache, v_cache, table, gen = paged_setup(lengths, 4, 1, 16, FP32, device, 7, extra_cols=35)
    tight = triton_decode.split_plan(2, 1, max(lengths), 16, torch.device(device))
    wide = triton_decode.split_plan(2, 1, table.shape[1] * 4, 16, torch.device(device))
    assert tight[1] < wide[1]
    q = torch.randn(2, 2, 16, generator=gen).to(device)
    ctx = torch.tensor(lengths, dtype=torch.int32, device=device)
    got = triton_decode.paged_decode_attention(q, k_cache, v_cache, table, ctx, 0.25, max(lengths))
    close(got, ref.paged_decode_attention(q, k_cache, v_cache, table, ctx, 0.25), FP32)


@pytest.mark.parametrize("block_m, block_n", [(16, 16), (4, 32)])
def test_prefill_fixed_tiles(device, block_m, block_n):
    """Explicit tiles (what autotune chooses among on a GPU) give the reference's result; a
    tile too small for tl.dot is refused."""
    from paged_kernels import triton_prefill
    lengths, new = [37, 9], [20, 9]
    k_cache, v_cache, table, gen = paged_setup(lengths, 8, 1, 16, FP32, device, 8)
    q = torch.randn(sum(new), 4, 16, generator=gen).to(device)          # group 4
    starts = [0, 20, 29]
    want = ref.paged_prefill_attention(q, k_cache, v_cache, table, starts, lengths, 0.3)
    got = triton_prefill.paged_prefill_attention(q, k_cache, v_cache, table, starts, lengths, 0.3,
                                                 block_m=block_m, block_n=block_n)
    close(got, want, FP32)
    with pytest.raises(ValueError, match="tl.dot"):
        triton_prefill.paged_prefill_attention(q, k_cache, v_cache, table, starts, lengths, 0.3,
                                               block_m=2, block_n=16)   # 2 x group 4 = 8 rows


def test_autotune_configs_fit_the_shape(device):
    """The GPU autotuner only tries Q tiles of >= 16 rows whose accumulator stays <= 128 x 128,
    and always keeps one configuration."""
    from paged_kernels import triton_prefill
    configs = triton_prefill._gpu_configs()
    for group_p, block_d in [(1, 64), (4, 128), (8, 128), (1, 256)]:
        kept = triton_prefill._prune(configs, {}, GROUP_P=group_p, BLOCK_D=block_d)
        assert kept
        for c in kept:
            rows = c.kwargs["BLOCK_M"] * group_p
            assert rows >= 16 and rows * block_d <= 128 * 128
    # nothing fits (a group of 16 with head dim 256): the first configuration is kept
    assert triton_prefill._prune(configs, {}, GROUP_P=16, BLOCK_D=256) == configs[:1]
    assert {c.kwargs["BLOCK_M"] for c in triton_prefill._prune(configs, {}, GROUP_P=8,
                                                                BLOCK_D=128)} == {16}
