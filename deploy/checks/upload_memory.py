"""What one trace upload costs the server in memory (issue 45): RSS before, peak (VmHWM) and
after ``load_trace`` on a decompression bomb and on the largest trace the page exports, each
in a fresh subprocess so one peak does not hide another.

    python deploy/checks/upload_memory.py [--steps 400]

The bomb: a 58 KB gzip of ``[{},{},…]`` that inflates to 60 MB (20 million snapshots). The
valid trace: a 400-step run of the default model (the live history's limit), gzip-exported as
the Export tab does."""
from __future__ import annotations

import argparse
import gzip
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

MEASURE = r"""
import sys, time
def status(field):
    for line in open("/proc/self/status"):
        if line.startswith(field):
            return int(line.split()[1]) / 1024
sys.path.insert(0, sys.argv[2])
from app import trace_io
data = open(sys.argv[1], "rb").read()
before = status("VmRSS")
t0 = time.perf_counter()
try:
    n, outcome = len(trace_io.load_trace(data, max_bytes=5 << 20)), "loaded"
except ValueError as exc:
    n, outcome = 0, f"refused: {exc}"
seconds = time.perf_counter() - t0
import gc; gc.collect()
print(before, status("VmHWM"), status("VmRSS"), seconds, n, outcome, sep="\t")
"""


def bomb_bytes(mb: int = 60) -> bytes:
    items = mb * (1 << 20) // 3
    return gzip.compress(b"[" + b"{}," * (items - 1) + b"{}]", compresslevel=9)


def valid_trace_bytes(steps: int) -> bytes:
    sys.path.insert(0, str(ROOT))
    from engine import Engine, EngineConfig, SamplingParams
    from app.trace_io import trace_gzip
    eng = Engine(EngineConfig(model="default", block_size=8, num_gpu_blocks=128,
                              max_history=steps))
    for p in ("ROMEO:", "JULIET: Good night"):
        eng.add_request(p, SamplingParams(max_tokens=steps + 20, ignore_eos=True))
    while len(eng.history) < steps or eng.history[0].step == 0:
        eng.step()
    return trace_gzip(eng.history)


def measure(path: Path) -> dict:
    out = subprocess.run([sys.executable, "-c", MEASURE, str(path), str(ROOT)], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout.strip()
    before, peak, after, seconds, n, outcome = out.split("\t", 5)
    return {"rss_before_mb": float(before), "peak_mb": float(peak),
            "rss_after_mb": float(after), "seconds": float(seconds), "snapshots": int(n),
            "outcome": outcome}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=400)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cases = {"bomb (60 MB of [{},…])": bomb_bytes(),
                 f"valid trace ({args.steps} steps)": valid_trace_bytes(args.steps)}
        print(f"{'upload':28} {'gzip KB':>8} {'RSS before':>10} {'peak':>8} {'after':>8} "
              f"{'+peak MB':>8} {'s':>5}  outcome")
        for name, data in cases.items():
            path = Path(tmp) / "trace.json.gz"
            path.write_bytes(data)
            r = measure(path)
            print(f"{name:28} {len(data) / 1024:8.0f} {r['rss_before_mb']:10.0f} "
                  f"{r['peak_mb']:8.0f} {r['rss_after_mb']:8.0f} "
                  f"{r['peak_mb'] - r['rss_before_mb']:8.0f} {r['seconds']:5.1f}  "
                  f"{r['outcome'][:90]}")
            print(json.dumps({name: r}))


if __name__ == "__main__":
    main()
