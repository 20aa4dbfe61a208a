#!/usr/bin/env bash
# The one set-up command: a virtual environment with the build of torch that fits this machine,
# then the project's requirements.
#   bash deploy/install.sh           # the page and the engine            (requirements.txt)
#   bash deploy/install.sh --dev     # + tests and benchmarks             (requirements-dev.txt)
#   bash deploy/install.sh --vllm    # + the real vLLM as well            (deploy/install_vllm.sh)
# Uses the active virtual environment, else creates .venv. Without an NVIDIA GPU it installs
# torch's CPU build (pip's default torch on Linux is the CUDA build: ~20 nvidia-* packages, a
# venv of several GB); with one, the default CUDA build. TORCH_VERSION overrides the version
# (default 2.13.0, the one vLLM 0.32's CPU build needs).
set -euo pipefail
cd "$(dirname "$0")/.."
TORCH_VERSION="${TORCH_VERSION:-2.13.0}"
requirements=requirements.txt
vllm=0
for arg in "$@"; do
  case "$arg" in
    --dev) requirements=requirements-dev.txt ;;
    --vllm) requirements=requirements-dev.txt; vllm=1 ;;
    *) echo "unknown option $arg (use --dev or --vllm)" >&2; exit 2 ;;
  esac
done
if [[ -z "${VIRTUAL_ENV:-}" ]]; then
  [[ -x .venv/bin/python ]] || python3 -m venv .venv
  # shellcheck disable=SC1091
  . .venv/bin/activate
fi
export PIP_DISABLE_PIP_VERSION_CHECK=1
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  echo "== an NVIDIA GPU: torch's CUDA build"
  pip install -q "torch==$TORCH_VERSION"
else
  echo "== no NVIDIA GPU: torch's CPU build"
  # a local +cpu wheel where the index has one, else PyTorch's CPU wheel index; never the
  # CUDA build (the plain PyPI wheel) on a machine that cannot use it
  pip install -q "torch==$TORCH_VERSION+cpu" 2>/dev/null \
    || pip install -q --index-url https://download.pytorch.org/whl/cpu "torch==$TORCH_VERSION" \
    || { echo "could not install torch $TORCH_VERSION's CPU build (from the package index or" \
              "https://download.pytorch.org/whl/cpu); set TORCH_VERSION to one your Python has" >&2
         exit 1; }
fi
echo "== $requirements"
pip install -q -r "$requirements"
python -c "import torch; print('torch', torch.__version__, '| CUDA', torch.cuda.is_available())"
if [[ $vllm == 1 ]]; then
  bash deploy/install_vllm.sh
fi
echo "ready: $(command -v python) ($requirements)"
