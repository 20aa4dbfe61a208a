"""The waste comparison shows the slab: max_model_len sizes the Max baseline, the address-space
picture draws every slab at its offset, the per-request table and the headline come from the
accounting, and the block-size sweep runs the same requests."""
import pytest

from app.figures.address_space import address_space_figure
from app.figures.waste import block_size_sweep_figure, request_table, waste_headline
from app.scenarios import SCENARIOS, preset
from app.lab import Lab
from engine import Engine, EngineConfig, SamplingParams
from analysis.block_size_sweep import block_size_sweep

from .conftest import needs_model


def _hand_case():
    """Prompts of 5 and 9 tokens, max_tokens 4, max_model_len 16, block 4, a 64-slot pool."""
    eng = Engine.length_only(EngineConfig(block_size=4, num_gpu_blocks=16, max_model_len=16),
                             max_model_len=256, detailed_snapshots=True)
    for n in (5, 9):
        eng.add_request(list(range(1, n + 1)), SamplingParams(max_tokens=4, ignore_eos=True))
    return eng, eng.step().snapshot                    # right after their prefill


def _segments(fig, row):
    """(kind label, start, length) of one strip, by start."""
    out = [(tr.name, b, x) for tr in fig.data for y, b, x in zip(tr.y, tr.base, tr.x) if y == row]
    return sorted(out, key=lambda s: s[1])


def test_hand_computed_case():
    _, snap = _hand_case()
    acc = {a.allocator: a for a in snap.accounting}
    held = {k: a.token_states + a.reserved + a.internal_fragmentation for k, a in acc.items()}
    assert {k: a.token_states for k, a in acc.items()} == dict.fromkeys(acc, 14)
    assert held == {"paged": 20, "max": 32, "pow2": 32, "oracle": 22}
    oracle = sorted((s.start, s.size) for s in snap.slabs if s.allocator == "oracle")
    assert oracle == [(0, 9), (9, 13)]
    fig = address_space_figure(snap)
    assert _segments(fig, "Contiguous Oracle") == [
        ("token states", 0, 5), ("reserved (future tokens)", 5, 4),
        ("token states", 9, 9), ("reserved (future tokens)", 18, 4), ("free", 22, 42)]
    assert _segments(fig, "Contiguous Max")[:3] == [
        ("token states", 0, 5), ("reserved (future tokens)", 5, 4),
        ("internal fragmentation (never used)", 9, 7)]
    paged = _segments(fig, "Paged (this engine)")
    assert sum(n for kind, _, n in paged if kind == "token states") == 14
    assert sum(n for kind, _, n in paged if kind != "free") == 20
    assert waste_headline(snap) == (
        "Contiguous Max holds 32 slots for 14 tokens (56% wasted: 8 reserved for future tokens, "
        "10 never used); paged holds 20 slots for the same 14 tokens (30% not yet filled: the "
        "rest of last blocks, which the next tokens fill).")
    table = request_table(snap).set_index("request")
    assert list(table["tokens in cache"]) == [5, 9] and list(table["paged slots"]) == [8, 12]
    assert list(table["Max slab"]) == [16, 16] and list(table["Oracle slab"]) == [9, 13]
    assert list(table["Max wasted"]) == [11, 7]
    assert list(table["Max slab"]) == [a + b for a, b in zip(table["Max tokens stored"],
                                                             table["Max wasted"])]


def test_external_fragmentation_shows_as_holes():
    """Oracle slabs of 12, 6 and 12 slots fill a 32-slot space; when the 6-slot request ends,
    8 slots are free but in two holes (6 + 2): the 8-slot request waiting cannot use them.
    The picture draws those holes as external fragmentation, the accounting's 8 slots."""
    eng = Engine.length_only(EngineConfig(block_size=4, num_gpu_blocks=8, max_model_len=16),
                             max_model_len=256, detailed_snapshots=True)
    for max_tokens in (9, 3, 9, 5):
        eng.add_request([1, 2, 3], SamplingParams(max_tokens=max_tokens, ignore_eos=True))
    for _ in range(3):
        snap = eng.step().snapshot
    acc = next(a for a in snap.accounting if a.allocator == "oracle")
    assert acc.waiting == 1 and acc.external_fragmentation == 8
    holes = [s for s in _segments(address_space_figure(snap), "Contiguous Oracle")
             if s[0].startswith("external")]
    assert [(b, n) for _, b, n in holes] == [(12, 6), (30, 2)]


@needs_model
@pytest.mark.parametrize("key", list(SCENARIOS))
def test_every_preset_shows_the_max_slab(model, key):
    """Stepped to the end: at some step the Max baseline runs a request with token states > 0
    (no preset shows only 'never fit'), and the picture's slabs equal the accounting."""
    lab = Lab.create(key, model)
    assert lab.engine is not None, lab.error
    assert lab.engine.max_model_len == lab.settings.max_model_len
    shown = False
    while lab.step():
        snap = lab.current()
        acc = {a.allocator: a for a in snap.accounting}
        assert acc["max"].rejected == 0
        shown |= acc["max"].token_states > 0
        for name in ("max", "pow2", "oracle"):
            a = acc[name]
            assert sum(s.size for s in snap.slabs if s.allocator == name) == \
                a.token_states + a.reserved + a.internal_fragmentation
            for s in snap.slabs:
                if s.allocator == "max":
                    assert s.size % lab.settings.max_model_len == 0   # width x max_model_len
    assert shown


def test_block_size_sweep_runs_the_same_requests():
    params = SamplingParams(max_tokens=20, ignore_eos=True)
    frame = block_size_sweep([(7, params)] * 3, 64)
    assert list(frame["block_size"]) == [1, 2, 4, 8, 16, 32, 64]     # 128 > the 64-slot pool
    shares = list(frame["token_state_share"])
    assert shares[0] == 1.0 and shares == sorted(shares, reverse=True)
    running = list(frame["mean_running_requests"])
    assert running[0] >= running[-1]
    fig = block_size_sweep_figure(frame, 4)
    assert list(fig.data[0].x) == list(frame["block_size"])


@needs_model
def test_lab_sweep_uses_the_current_requests(model):
    lab = Lab.create("mixed", model)
    frame = lab.block_size_sweep()
    assert 4 in list(frame["block_size"]) and lab.block_size_sweep() is frame   # cached
    assert preset("mixed").max_model_len == 40
