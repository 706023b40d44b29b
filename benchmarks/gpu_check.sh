#!/usr/bin/env bash
# The GPU check, end to end, for a lent GPU machine (one H100 or H200 with its own image: torch with CUDA,
# transformers 5.17, no omegaconf / math-verify / reasoning-gym, no network). All parts take ~15 minutes; a lease of
# 15 minutes of device time fits about 7 minutes of them: pick parts with GPU_CHECK_LIMITS (0 skips one) and
# GPU_CHECK_TESTS (pytest node ids), GPU_CHECK_PROFILE=1 profiles the Qwen3 sampling part. The 2026-11-27 runs
# (benchmarks/results/gpu-h100-varied.md) used `GPU_CHECK_LIMITS="60 130 60 70 0 90 0 0 0"` and
# `GPU_CHECK_PROFILE=1 GPU_CHECK_LIMITS="50 130 90 70 0 0 0 0 0"`.
#
#   here:        bash benchmarks/fetch_gpu_wheels.sh          # the wheels hacrl needs there, into .gpu-wheels/
#                                                             # and a copy of the real tokenizers, .gpu-tokenizers/
#   GPU machine: bash benchmarks/gpu_check.sh                 # (the device tool: carry .gpu-wheels .gpu-tokenizers)
#
# Installs the carried wheels into a private directory (never over the image's torch), runs the GPU tests and then
# each part of benchmarks/gpu_throughput.py under its own time limit (GPU time is short: a part that overruns is
# cut, the parts before it are kept), and writes gpu.md + gpu.json and the logs into $OUT when set (so that they
# come back from the device tool), else into benchmarks/results.
set -uo pipefail
cd "$(dirname "$0")/.."
SITE=/tmp/hacrl-site
if compgen -G ".gpu-wheels/*.whl" > /dev/null; then
  python -m pip install --quiet --no-index --no-deps --no-compile --target "$SITE" .gpu-wheels/*.whl || exit 1
fi
export PYTHONPATH="$SITE:$PWD/src:$PWD" PYTHONUNBUFFERED=1
[ -d .gpu-tokenizers ] && export HACRL_TOKENIZERS="$PWD/.gpu-tokenizers"
RESULTS="${OUT:-benchmarks/results}"
MODELS=/tmp/hacrl-gpu-models PARTS=/tmp/hacrl-gpu-parts
rm -rf "$PARTS"; mkdir -p "$RESULTS" "$MODELS" "$PARTS"
python -c "import torch, transformers; print('torch', torch.__version__, '| transformers', transformers.__version__, '|', torch.cuda.get_device_name() if torch.cuda.is_available() else 'no CUDA device: a dry run with tiny shapes')" || exit 1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
nproc; lscpu | grep -m1 'Model name' || true
start=$(date +%s)
say() { echo "gpu_check: $* ($(( $(date +%s) - start )) s)"; }
# GPU_CHECK_LIMITS: seconds for the tests, the Qwen3 shape's static sampler (both modes), its hf sampler (varied),
# the Llama shape's static sampler (both modes), its hf sampler (varied), 4,096 new tokens (static, both modes),
# parity, log-probs, the 2-agent step. A limit of 0 skips that part.
read -r T_TESTS T_QWEN T_QWEN_HF T_LLAMA T_LLAMA_HF T_LONG T_PARITY T_LOGPROBS T_STEP \
  <<< "${GPU_CHECK_LIMITS:-80 150 70 80 50 110 50 60 130}"
PARTS_RUN="${GPU_CHECK_PARTS:-tests qwen qwen-hf llama llama-hf long parity logprobs step}"
runs() { [[ " $PARTS_RUN " == *" $1 "* ]] && [ "$2" != 0 ]; }
if runs tests "$T_TESTS"; then
  timeout "$T_TESTS" python -m pytest -q -p no:cacheprovider ${GPU_CHECK_TESTS:-tests/gpu} > "$RESULTS/gpu-tests.txt" 2>&1
  say "tests/gpu exit $? ($(tail -1 "$RESULTS/gpu-tests.txt"))"
fi
part() {  # part NAME LIMIT ARGS: gpu_throughput.py ARGS under a time limit, then all parts so far merged into gpu.json/md
  local name=$1 limit=$2; shift 2
  runs "${name#*-}" "$limit" || return 0
  timeout "$limit" python benchmarks/gpu_throughput.py --models "$MODELS" --out "$PARTS/$name" "$@" \
    >> "$RESULTS/gpu-throughput.log" 2>&1
  say "$name exit $?"
  python benchmarks/gpu_throughput.py --out "$RESULTS" --merge "$PARTS"/* > /dev/null
}
part 1-qwen "$T_QWEN" --only sampling --shapes qwen3-0.6b --backends static+graphs --modes varied no-stop \
  ${GPU_CHECK_PROFILE:+--profile}
part 2-qwen-hf "$T_QWEN_HF" --only sampling --shapes qwen3-0.6b --backends hf --modes varied
part 3-llama "$T_LLAMA" --only sampling --shapes llama-3.2-1b --backends static+graphs --modes varied no-stop
part 3-llama-hf "$T_LLAMA_HF" --only sampling --shapes llama-3.2-1b --backends hf --modes varied
part 4-long "$T_LONG" --only sampling --shapes qwen3-0.6b --rows 64 --new 4096 --backends static+graphs \
  --modes no-stop varied
part 5-parity "$T_PARITY" --only parity
part 6-logprobs "$T_LOGPROBS" --only logprobs
part 7-step "$T_STEP" --only step --step-new "${GPU_CHECK_STEP_NEW:-256}"
say "done"
cat "$RESULTS/gpu.md" 2>/dev/null
