"""Sampling runs on the logits' device: a step moves only the chosen ids, their logprobs and
the beam candidates to the host, in one copy, never the [batch, vocab] logits.

Host transfers are observed with a TorchFunctionMode that records every tensor->host
conversion (tolist / item / cpu / numpy) and its size; on CPU these are the same calls that
would copy from a GPU.
"""
import torch
from torch.overrides import TorchFunctionMode

from engine import Engine, EngineConfig, SamplingParams
from engine.processing.sampler import BeamAsk, TokenAsk, sample_step

_TO_HOST = {"tolist", "item", "cpu", "numpy"}


class HostCopies(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.sizes: list[int] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in _TO_HOST and args and isinstance(args[0], torch.Tensor):
            self.sizes.append(args[0].numel())
        return func(*args, **(kwargs or {}))


def test_one_small_copy_per_step_and_same_answers():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(5, 1000, generator=gen)
    greedy = SamplingParams(max_tokens=4)
    hot = SamplingParams(temperature=0.9, top_k=50, top_p=0.9, max_tokens=4)
    asks = [TokenAsk(0, 1, greedy, torch.Generator().manual_seed(1)),
            TokenAsk(1, 3, hot, torch.Generator().manual_seed(2)),
            BeamAsk([2, 3, 4], [-1.0, -1.5, -0.5], 6)]
    with HostCopies() as seen:
        got = sample_step(logits, asks)
    assert seen.sizes == [2 * (1 + 3 + 6)]               # one copy: ids + logprobs, that's all
    lp = torch.log_softmax(logits, -1)
    assert got[0] == [(int(logits[0].argmax()), float(lp[0].max()))]
    assert len(got[1]) == 3 and all(float(lp[1, t]) == v for t, v in got[1])
    scores = (torch.tensor([-1.0, -1.5, -0.5])[:, None] + lp[2:]).flatten()
    top = torch.topk(scores, 6)
    assert got[2] == [(int(i) // 1000, int(i) % 1000, float(v))
                      for i, v in zip(top.indices, top.values)]


def test_seeded_sampling_reproducible():
    logits = torch.randn(1, 300, generator=torch.Generator().manual_seed(3))
    p = SamplingParams(temperature=1.0, max_tokens=2)
    runs = [sample_step(logits, [TokenAsk(0, 8, p, torch.Generator().manual_seed(11))])
            for _ in range(2)]
    assert runs[0] == runs[1]


def test_engine_step_never_copies_logits_to_host(tiny_llama):
    eng = Engine(EngineConfig(model=tiny_llama[0], block_size=4, num_gpu_blocks=64, device="cpu"))
    vocab = eng.spec.vocab_size
    eng.add_request([1, 2, 3, 4, 5], SamplingParams(max_tokens=4))
    eng.add_request([6, 7, 8], SamplingParams(n=3, temperature=0.8, seed=5, max_tokens=4))
    eng.add_request([9, 10], SamplingParams(beam_width=2, max_tokens=4))
    big = []
    while eng.has_unfinished_requests():
        with HostCopies() as seen:
            eng.step()
        big += [n for n in seen.sizes if n >= vocab]
    assert big == []


def test_cuda_sampling_stays_on_device_and_is_seeded(tiny_llama):
    """On a GPU: no [batch, vocab] copy to the host, and a seed gives the same tokens twice."""
    import pytest
    if not torch.cuda.is_available():
        pytest.skip("no CUDA")
    outs = []
    for _ in range(2):
        eng = Engine(EngineConfig(model=tiny_llama[0], block_size=4, num_gpu_blocks=64,
                                  device="cuda", dtype="float32"))
        rid = eng.add_request([6, 7, 8], SamplingParams(n=3, temperature=0.8, seed=5, max_tokens=6,
                                                        ignore_eos=True))
        eng.add_request([9, 10], SamplingParams(beam_width=2, max_tokens=4, ignore_eos=True))
        big = []
        while eng.has_unfinished_requests():
            with HostCopies() as seen:
                eng.step()
            big += [n for n in seen.sizes if n >= eng.spec.vocab_size]
        assert big == []
        outs.append([o.token_ids for o in eng.get_output(rid).outputs])
    assert outs[0] == outs[1]
