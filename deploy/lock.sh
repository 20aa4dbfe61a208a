#!/usr/bin/env bash
# Refresh the locked, tested sets in deploy/locks/ from the human-edited requirement files:
#   bash deploy/lock.sh
# uv's `pip compile` (uv installed into the active environment if missing) resolves each set
# for Linux x86_64 and Python 3.11 (what CI tests) with sha256 hashes from the package index:
#   deploy/locks/requirements.txt       the page and the engine      (requirements.txt)
#   deploy/locks/requirements-dev.txt   + tests and benchmarks       (requirements-dev.txt)
#   deploy/locks/requirements-vllm.txt  + the real vLLM (CPU build)  (+ requirements-vllm.txt)
# torch is resolved as its CPU build but left out of the locks: deploy/install.sh installs the
# build that fits the machine (CPU or CUDA) first, at TORCH_VERSION. The CPU wheel comes from
# PyTorch's CPU index, or from TORCH_FIND_LINKS (a folder or page of wheels) where it is set.
# After a refresh, run `bash .ci/run`: the locks are what CI tested only once it has passed.
set -euo pipefail
cd "$(dirname "$0")/.."
TORCH_VERSION="${TORCH_VERSION:-2.13.0}"
command -v uv >/dev/null 2>&1 || python -m pip install -q "uv>=0.9"
if [[ -n "${TORCH_FIND_LINKS:-}" ]]; then
  torch_source=(--find-links "$TORCH_FIND_LINKS")
else
  torch_source=(--extra-index-url https://download.pytorch.org/whl/cpu --index-strategy unsafe-best-match)
fi
constraints=$(mktemp)
trap 'rm -f "$constraints"' EXIT
echo "torch==$TORCH_VERSION+cpu" > "$constraints"
compile() {  # OUT, then the requirement files
  local out=$1; shift
  uv pip compile -q "$@" --constraint "$constraints" "${torch_source[@]}" \
    --python-version 3.11 --python-platform x86_64-manylinux_2_28 \
    --generate-hashes --no-emit-find-links --no-emit-index-url \
    --no-emit-package torch --no-emit-package torchvision --no-emit-package torchaudio \
    --no-emit-package torchcodec \
    --custom-compile-command "bash deploy/lock.sh" -o "$out"
  echo "$out: $(grep -c '^[a-z0-9]' "$out") packages"
}
compile deploy/locks/requirements.txt requirements.txt
compile deploy/locks/requirements-dev.txt requirements-dev.txt
compile deploy/locks/requirements-vllm.txt requirements-dev.txt requirements-vllm.txt
