#!/usr/bin/env bash
# The GPU check, end to end, for a lent GPU machine (one H100 or H200 with its own image: torch with CUDA,
# transformers 5.17, no omegaconf / math-verify / reasoning-gym, no network). Under 8 minutes on an H200.
#
#   here:        bash benchmarks/fetch_gpu_wheels.sh          # the wheels hacrl needs there, into .gpu-wheels/
#   GPU machine: bash benchmarks/gpu_check.sh                 # (the device tool: carry .gpu-wheels)
#
# Installs the carried wheels into a private directory (never over the image's torch), runs the GPU tests and
# benchmarks/gpu_throughput.py, and writes benchmarks/results/gpu.md + gpu.json (into $OUT when set, so that
# they come back from the device tool).
set -euo pipefail
cd "$(dirname "$0")/.."
SITE=/tmp/hacrl-site
if compgen -G ".gpu-wheels/*.whl" > /dev/null; then
  python -m pip install --quiet --no-index --no-deps --target "$SITE" .gpu-wheels/*.whl
fi
export PYTHONPATH="$SITE:$PWD/src:$PWD"
RESULTS="${OUT:-benchmarks/results}"
mkdir -p "$RESULTS"
python -c "import torch, transformers; print('torch', torch.__version__, '| transformers', transformers.__version__, '|', torch.cuda.get_device_name())"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
start=$(date +%s)
timeout 180 python -m pytest -q -p no:cacheprovider tests/gpu 2>&1 | tail -5 | tee "$RESULTS/gpu-tests.txt" || true
timeout 420 python benchmarks/gpu_throughput.py --out "$RESULTS"
echo "gpu_check: $(( $(date +%s) - start )) s"
