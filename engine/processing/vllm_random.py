"""vLLM v1's random sampling, so seeded sampling gives vLLM's tokens (docs/vllm-fidelity.md).

vLLM draws a sampled token differently per platform (vLLM 0.32,
``vllm/v1/sample/ops/topk_topp_sampler.py``):
- on a CPU (``forward_cpu``): a Gumbel-max race with hashed noise. Each step takes one seed per
  request, ``torch.randint(0, 2**31, (1,), generator=request's generator)``, and the kernel
  ``fused_gumbel_argmax`` picks ``argmax_i(logit_i + g_i)``, with ``g_i = -log(-log u_i)`` and
  ``u_i`` from SplitMix64 of (SplitMix64(seed), token i): 53 bits, ``(bits + 0.5) / 2**53``;
- on a GPU (``forward_native``, ``random_sample``): the exponential race ``argmax(probs / q)``
  with ``q ~ Exp(1)`` drawn by ``q.exponential_(generator=request's generator)``.
Both are exact samples of softmax(logits); what makes the tokens vLLM's is drawing the same
random numbers from the same per-request generator. Checked against vLLM's own kernel by
tests/vllm_real/test_sampler.py.
"""
from __future__ import annotations

import torch

_MASK64 = (1 << 64) - 1
GAMMA = 0x9E3779B97F4A7C15             # SplitMix64's increment (2**64 / golden ratio)
_M1, _M2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB


def _signed(x: int) -> int:
    """A 64-bit pattern as torch's int64 holds it."""
    x &= _MASK64
    return x - (1 << 64) if x >> 63 else x


def _splitmix64_int(z: int) -> int:
    z &= _MASK64
    z = ((z ^ (z >> 30)) * _M1) & _MASK64
    z = ((z ^ (z >> 27)) * _M2) & _MASK64
    return z ^ (z >> 31)


def _shr(z: torch.Tensor, k: int) -> torch.Tensor:
    """Logical right shift of int64 patterns (torch's >> is arithmetic)."""
    return (z >> k) & ((1 << (64 - k)) - 1)


def _splitmix64(z: torch.Tensor) -> torch.Tensor:
    # int64 products wrap modulo 2**64, which is SplitMix64's unsigned arithmetic
    z = (z ^ _shr(z, 30)) * _signed(_M1)
    z = (z ^ _shr(z, 27)) * _signed(_M2)
    return z ^ _shr(z, 31)


def gumbel_noise(seed: int, vocab: int, device=None) -> torch.Tensor:
    """Token i's Gumbel noise (float64) for a step seed, as vLLM's CPU kernel hashes it."""
    key = _splitmix64_int(seed)
    i = torch.arange(1, vocab + 1, dtype=torch.int64, device=device)
    bits = _shr(_splitmix64(_signed(key) + i * _signed(GAMMA)), 11)
    u = (bits.double() + 0.5) * 2.0 ** -53
    return -torch.log(-torch.log(u))


def gumbel_argmax(logits: torch.Tensor, seed: int) -> int:
    """vLLM's ``fused_gumbel_argmax`` for one row of (processed, float32) logits."""
    noisy = logits.double() + gumbel_noise(seed, logits.shape[-1], logits.device)
    return int(torch.argmax(noisy))


def cpu_step_seed(generator: torch.Generator) -> int:
    """The step's seed vLLM's CPU sampler draws from a request's generator."""
    return int(torch.randint(0, 2 ** 31, (1,), generator=generator, dtype=torch.long))


def exponential_race(probs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """vLLM's ``random_sample`` for one row: ``argmax(probs / q)``, q ~ Exp(1) (a 0-d tensor
    on the probabilities' device: no wait for the device)."""
    q = torch.empty_like(probs).exponential_(generator=generator)
    return (probs / q).argmax()


def vllm_sample(logits: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """One token (a 0-d tensor on the logits' device) from processed float32 logits
    (temperature applied, top-k / top-p masked to -inf), drawn as vLLM draws it there."""
    if logits.device.type == "cpu":
        seed = cpu_step_seed(generator)
        return torch.argmax(logits.double() + gumbel_noise(seed, logits.shape[-1]))
    return exponential_race(torch.softmax(logits, dim=-1, dtype=torch.float32), generator)
