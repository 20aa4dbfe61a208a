"""Several sessions opening a freshly started server read model configs at the same moment."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# A fresh interpreter (transformers not imported yet), sixteen threads reading the embedded
# model's config at once: the way a class opening a just-started page loads it.
SCRIPT = """
import sys, threading
sys.setswitchinterval(1e-6)    # switch threads as often as possible: makes the race likely
from engine.models.loader import hf, read_spec, resolve_model_path
path = resolve_model_path("default")
NAMES = ["AutoConfig", "AutoTokenizer", "GenerationConfig", "AutoConfig"]
errors, barrier = [], threading.Barrier(16)
def read(i):
    barrier.wait()
    try:
        hf(NAMES[i % 4])      # unlocked, `from transformers import AutoConfig` failed here
        read_spec(path)
    except Exception as exc:
        errors.append(repr(exc))
threads = [threading.Thread(target=read, args=(i,)) for i in range(16)]
[t.start() for t in threads]
[t.join() for t in threads]
print("errors:", errors)
"""


def test_concurrent_first_config_reads_do_not_fail():
    out = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "errors: []" in out.stdout, out.stdout[-2000:]
