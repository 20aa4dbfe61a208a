#!/usr/bin/env bash
# One prepared GPU run (issue 9): CUDA tests, kernel benchmarks, engine vs transformers, plots.
#
#   bash bench/gpu_check.sh OUT_DIR
#
# Writes into OUT_DIR (at most 8 files): env.txt, tests.txt, kernels.json, throughput.json,
# bandwidth.png, throughput.png, summary.txt (targets measured side by side), log.txt is the
# caller's tee. Downloads nothing: the models are the embedded one and a random-weight Llama
# built from a config. Budget: under 6 minutes on an H200 (each stage has its own timeout, so
# one that hangs cannot eat the others' time).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${1:?usage: bash bench/gpu_check.sh OUT_DIR}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
unset TRITON_INTERPRET
PY="${PYTHON:-python3}"
status=0

echo "== environment" | tee "$OUT/env.txt"
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>&1
  "$PY" -c "import torch, triton, transformers; print('torch', torch.__version__, '| cuda', torch.version.cuda, '| triton', triton.__version__, '| transformers', transformers.__version__); print('gpu', torch.cuda.get_device_name(0), torch.cuda.get_device_capability(0))"
} 2>&1 | tee -a "$OUT/env.txt"

# The CUDA tests: every kernel test (current and legacy kernels vs the torch reference on the GPU),
# the engine's Triton-on-CUDA parity with transformers, and device sampling on CUDA. (The other
# engine tests pin no device and compare with transformers on CPU; the page's tests need
# streamlit: both stay in CI.)
echo "== CUDA tests"
XDIST=""
"$PY" -c "import xdist" 2>/dev/null && XDIST="-n 8"      # compile kernels on 8 cores at once
timeout 200 "$PY" -m pytest -q $XDIST -p no:cacheprovider tests/paged_kernels \
  tests/engine/test_gpt2_parity.py tests/engine/test_device_sampling.py \
  2>&1 | tee "$OUT/tests.txt" | tail -25 || status=1

echo "== kernel benchmarks"
timeout 150 "$PY" bench/kernel_bench.py --batches 1,16,64,256 --contexts 512,2048,8192,32768 \
  --max-kv-tokens 2097152 --out "$OUT/kernels.json" || status=1

echo "== engine vs transformers generate (same GPU, bf16)"
timeout 150 "$PY" bench/throughput.py --model default random-1b --batch 1 8 64 --max-tokens 64 \
  --rounds 3 --device cuda --dtype bfloat16 --out "$OUT/throughput.json" || status=1

echo "== report"
"$PY" bench/gpu_report.py "$OUT" 2>&1 | tee "$OUT/summary.txt" || status=1
exit $status
