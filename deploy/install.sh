#!/usr/bin/env bash
# The one set-up command: a virtual environment with the build of torch that fits this machine,
# then the project's locked, tested set (deploy/locks/, made by deploy/lock.sh).
#   bash deploy/install.sh           # the page and the engine            (requirements.txt)
#   bash deploy/install.sh --dev     # + tests and benchmarks             (requirements-dev.txt)
#   bash deploy/install.sh --vllm    # + the real vLLM as well            (deploy/install_vllm.sh)
#   add --latest                     # the newest versions the requirement files allow instead
#                                    # of the locked ones (what CI's canary tests)
# The locks are for Linux x86_64 with Python 3.11 or newer; elsewhere the newest allowed
# versions are installed, and the script says so.
# Uses the active virtual environment, else creates .venv. Without an NVIDIA GPU it installs
# torch's CPU build (pip's default torch on Linux is the CUDA build: ~20 nvidia-* packages, a
# venv of several GB); with one, the default CUDA build. TORCH_VERSION overrides the version
# (default 2.13.0, the one vLLM 0.32's CPU build needs).
set -euo pipefail
cd "$(dirname "$0")/.."
TORCH_VERSION="${TORCH_VERSION:-2.13.0}"
requirements=requirements.txt
vllm=0
latest=0
for arg in "$@"; do
  case "$arg" in
    --dev) requirements=requirements-dev.txt ;;
    --vllm) requirements=requirements-dev.txt; vllm=1 ;;
    --latest) latest=1 ;;
    *) echo "unknown option $arg (use --dev, --vllm and/or --latest)" >&2; exit 2 ;;
  esac
done
if [[ -z "${VIRTUAL_ENV:-}" ]]; then
  [[ -x .venv/bin/python ]] || python3 -m venv .venv
  # shellcheck disable=SC1091
  . .venv/bin/activate
fi
export PIP_DISABLE_PIP_VERSION_CHECK=1
gpu=0
command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && gpu=1
if [[ $gpu == 1 ]]; then
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
lock="deploy/locks/$requirements"
if [[ $latest == 0 ]] && ! python -c 'import platform, sys; sys.exit(not (sys.platform == "linux" and platform.machine() == "x86_64" and sys.version_info >= (3, 11)))'; then
  echo "== the locks are for Linux x86_64 with Python >= 3.11, not this $(python -c 'import platform, sys; print(sys.platform, platform.machine(), platform.python_version())'):" \
       "installing the newest versions $requirements allows"
  latest=1
fi
if [[ $latest == 1 ]]; then
  echo "== $requirements (the newest versions it allows)"
  pip install -q -r "$requirements"
  installed="$requirements, newest allowed"
elif [[ $vllm == 1 && $gpu == 0 ]]; then
  installed="deploy/locks/requirements-vllm.txt, locked"   # holds the dev set: install_vllm.sh
else
  echo "== $lock (the tested set)"
  pip install -q --require-hashes -r "$lock"
  installed="$lock, locked"
fi
python -c "import torch; print('torch', torch.__version__, '| CUDA', torch.cuda.is_available())"
if [[ $vllm == 1 ]]; then
  if [[ $latest == 1 ]]; then bash deploy/install_vllm.sh --latest; else bash deploy/install_vllm.sh; fi
fi
echo "ready: $(command -v python) ($installed)"
