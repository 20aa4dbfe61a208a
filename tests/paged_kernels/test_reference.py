"""The torch reference ops against plain contiguous attention on scattered, ragged pages."""
import pytest
import torch

from engine.core.block_math import cdiv
from paged_kernels import reference as ref


def naive_attention(q, k, v, scale, causal_offset=None):
    """q [n, Hq, D], k/v [L, Hkv, D]: softmax attention, GQA by repeating K/V heads."""
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    scores = torch.einsum("nhd,lhd->hnl", q, k) * scale
    if causal_offset is not None:
        n, L = q.shape[0], k.shape[0]
        mask = torch.arange(L)[None, :] > (torch.arange(n)[:, None] + causal_offset)
        scores = scores.masked_fill(mask, float("-inf"))
    return torch.einsum("hnl,lhd->nhd", scores.softmax(-1), v)


def scatter_sequences(lengths, block_size, hkv, d, num_blocks, gen):
    """Random K/V for each sequence placed in random, non-contiguous physical blocks."""
    k_cache = torch.randn(num_blocks, block_size, hkv, d, generator=gen)
    v_cache = torch.randn(num_blocks, block_size, hkv, d, generator=gen)
    perm = torch.randperm(num_blocks, generator=gen).tolist()
    tables, ks, vs = [], [], []
    for L in lengths:
        n = cdiv(L, block_size)
        blocks = [perm.pop() for _ in range(n)]
        tables.append(blocks)
        ks.append(k_cache[blocks].flatten(0, 1)[:L])
        vs.append(v_cache[blocks].flatten(0, 1)[:L])
    width = max(map(len, tables))
    table = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32)
    return k_cache, v_cache, table, ks, vs


@pytest.mark.parametrize("block_size", [1, 8, 16])
@pytest.mark.parametrize("hq, hkv", [(4, 4), (8, 2)])
def test_paged_decode_equals_contiguous(block_size, hq, hkv):
    gen = torch.Generator().manual_seed(0)
    lengths = [1, 7, 33, 16]
    k_cache, v_cache, table, ks, vs = scatter_sequences(lengths, block_size, hkv, 8, 64, gen)
    q = torch.randn(len(lengths), hq, 8, generator=gen)
    out = ref.paged_decode_attention(q, k_cache, v_cache, table, torch.tensor(lengths), 0.3)
    for i, L in enumerate(lengths):
        expect = naive_attention(q[i:i + 1], ks[i], vs[i], 0.3)[0]
        torch.testing.assert_close(out[i], expect, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("block_size", [4, 16])
def test_paged_prefill_over_cached_context(block_size):
    gen = torch.Generator().manual_seed(1)
    lengths, new = [20, 5, 37], [4, 5, 1]       # last `new` tokens are the queries
    k_cache, v_cache, table, ks, vs = scatter_sequences(lengths, block_size, 2, 8, 64, gen)
    q = torch.randn(sum(new), 8, 8, generator=gen)
    starts = [0, 4, 9, 10]
    out = ref.paged_prefill_attention(q, k_cache, v_cache, table, starts, lengths, 0.5)
    for i, L in enumerate(lengths):
        expect = naive_attention(q[starts[i]:starts[i + 1]], ks[i], vs[i], 0.5,
                                 causal_offset=L - new[i])
        torch.testing.assert_close(out[starts[i]:starts[i + 1]], expect, rtol=1e-5, atol=1e-5)


def test_store_copy_and_swap_blocks():
    gen = torch.Generator().manual_seed(2)
    kv = torch.zeros(2, 2, 6, 4, 2, 3)             # layers, k/v, blocks, block_size, heads, dim
    k = torch.randn(3, 2, 3, generator=gen)
    v = torch.randn(3, 2, 3, generator=gen)
    slots = torch.tensor([5, 6, 13])                # block 1 slots 1-2, block 3 slot 1
    ref.store_kv(kv[0, 0], kv[0, 1], k, v, slots)
    assert torch.equal(kv[0, 0, 1, 1], k[0]) and torch.equal(kv[0, 1, 3, 1], v[2])
    ref.copy_blocks(kv, torch.tensor([1, 3]), torch.tensor([4, 5]))
    assert torch.equal(kv[:, :, 4], kv[:, :, 1]) and torch.equal(kv[:, :, 5], kv[:, :, 3])
    cpu = torch.zeros(2, 2, 3, 4, 2, 3)
    ref.swap_blocks(kv, cpu, torch.tensor([1, 3]), torch.tensor([2, 0]))
    assert torch.equal(cpu[:, :, 2], kv[:, :, 1]) and torch.equal(cpu[:, :, 0], kv[:, :, 3])
