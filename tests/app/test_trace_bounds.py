"""Issue 45, findings 2, 4 and 5: an upload is bounded while it is read (a decompression bomb
of empty snapshots costs its text, not 20 million dicts), a huge integer is refused naming its
field, and step numbers that no recorded history has are refused naming the first."""
from __future__ import annotations

import gzip
import json
import subprocess
import sys

import pytest

from engine import Engine, EngineConfig, SamplingParams
from app.trace_io import load_trace, trace_json

from .conftest import ROOT

BOMB_MB = 60


@pytest.fixture(scope="module")
def history():
    eng = Engine.length_only(EngineConfig(block_size=4, num_gpu_blocks=16),
                             detailed_snapshots=True)
    eng.add_request([1, 2, 3, 4, 5], SamplingParams(max_tokens=6, ignore_eos=True))
    while eng.has_unfinished_requests():
        eng.step()
    return json.loads(trace_json(eng.history))


MEASURE = r"""
import gzip, sys
def hwm(field="VmHWM"):
    for line in open("/proc/self/status"):
        if line.startswith(field):
            return int(line.split()[1]) // 1024
from app.trace_io import load_trace
data = gzip.compress(b"[" + b"{}," * (%d * 2**20 // 3) + b"{}]", compresslevel=9)
base = hwm("VmRSS")
try:
    load_trace(data, max_bytes=5 << 20)
except ValueError as exc:
    print(exc)
print(hwm() - base)
"""


def test_a_decompression_bomb_is_refused_within_a_bounded_peak():
    """58 KB of gzip inflating to 60 MB of ``[{},{},…]``: before, parsed whole (+1.6 GB of
    RSS); now refused at its first item, its peak about twice its text."""
    out = subprocess.run([sys.executable, "-c", MEASURE % BOMB_MB], cwd=ROOT, check=True,
                         capture_output=True, text=True).stdout.splitlines()
    message, peak_mb = out[0], int(out[1])
    assert peak_mb < 3 * BOMB_MB, f"the bomb raised the peak RSS by {peak_mb} MB"
    # refused at its first item (an empty object is no snapshot), never parsed whole
    assert message.startswith("snapshot 0 of the trace is malformed"), message


def test_a_huge_integer_is_refused_with_its_field(history):
    d = history[1]
    text = json.dumps([d]).replace(f'"step": {d["step"]}', '"step": ' + "9" * 5000, 1)
    with pytest.raises(ValueError, match=r"field 'step' is a 5,000-digit number"):
        load_trace(text)
    used = json.dumps([d]).replace('"used_blocks": ', '"used_blocks": ' + "1" * 30, 1)
    with pytest.raises(ValueError, match=r"field 'stats.used_blocks' is a 3\d-digit number"):
        load_trace(used)


@pytest.mark.parametrize("steps, words", [
    ([0, 3, 2, 1], "snapshot 1 has step 3: a trace has one snapshot per step"),
    ([5, 5, 5, 5], "snapshot 1 has step 5: a trace has one snapshot per step"),
    ([-2, -1, 0, 1], "snapshot 0 has step -2: steps are numbered from 0"),
    ([0, 1, 3, 4], "snapshot 2 has step 3"),
])
def test_impossible_step_numbers_are_named(history, steps, words):
    snaps = [dict(history[i], step=s) for i, s in enumerate(steps)]
    with pytest.raises(ValueError, match="the trace's steps are impossible") as err:
        load_trace(json.dumps(snaps))
    assert words in str(err.value)


def test_a_recorded_history_passes_from_any_first_step(history):
    assert len(load_trace(json.dumps(history))) == len(history)
    tail = [dict(d, step=d["step"] + 100) for d in history[2:]]        # oldest dropped
    assert load_trace(json.dumps(tail))[0].step == history[2]["step"] + 100
    abort = dict(history[3], kind="abort", step=history[2]["step"])     # no step ran
    load_trace(json.dumps(history[:3] + [abort]))
