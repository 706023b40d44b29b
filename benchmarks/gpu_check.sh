#!/usr/bin/env bash
# The GPU check, end to end, for a lent GPU machine (one H100 or H200 with its own image: torch with CUDA,
# transformers 5.17, no omegaconf / math-verify / reasoning-gym, no network). All parts take ~25 minutes; a lease of
# 15 minutes of device time fits about 11 minutes of them (a fresh machine compiles everything once): pick parts
# and their time limits with GPU_CHECK (NAME=SECONDS ..., in the order given); GPU_CHECK_PROFILE=1 profiles the
# Qwen3 sampling part, GPU_CHECK_KERNEL (JSON) names the decode kernel's launch, GPU_CHECK_PAPER_MARGIN sets the
# paper step's rollout.kv_cache_margin, GPU_CHECK_LONG_MODES the long part's modes (default: no-stop varied varied-calls),
# GPU_CHECK_PRECISION_NEW the new tokens of the precision part's five paper steps (issue 41: pure bf16, float32
# masters, masters offloaded; issue 43: an FSDP2 group of one rank, without and with CPU offload; suggested for a
# 15-minute lease: GPU_CHECK="precision=540"). The 2026-11-27 runs (benchmarks/results/gpu-h100-paper-step.md):
# `GPU_CHECK_PROFILE=1 GPU_CHECK="tests=60 kernel=60 qwen=140 paper=320"`, then on a fresh machine
# `GPU_CHECK_KERNEL=... GPU_CHECK="qwen=105 paper=320"`.
#
#   here:        bash benchmarks/fetch_gpu_wheels.sh          # the wheels hacrl needs there, into .gpu-wheels/
#                                                             # and a copy of the real tokenizers, .gpu-tokenizers/
#   GPU machine: bash benchmarks/gpu_check.sh                 # (the device tool: carry .gpu-wheels .gpu-tokenizers)
#
# Installs the carried wheels into a private directory (never over the image's torch), runs the GPU tests and then
# each part of benchmarks/gpu_throughput.py under its own time limit (GPU time is short: a part that overruns is
# cut, the parts before it are kept), and writes gpu.md + gpu.json and the logs into $OUT when set (so that they
# come back from the device tool), else into benchmarks/results. The kernel part's chosen launch (the fastest of
# its sweep) is passed to every part after it, also in a later call on the same machine (kept in /tmp).
set -uo pipefail
cd "$(dirname "$0")/.."
SITE=/tmp/hacrl-site WHEELS=${GPU_CHECK_WHEELS:-.gpu-wheels}  # GPU_CHECK_WHEELS: another folder (the tests: none)
if compgen -G "$WHEELS/*.whl" > /dev/null; then
  python -m pip install --quiet --no-index --no-deps --no-compile --target "$SITE" "$WHEELS"/*.whl || exit 1
fi
export PYTHONPATH="$SITE:$PWD/src:$PWD" PYTHONUNBUFFERED=1
[ -d .gpu-tokenizers ] && export HACRL_TOKENIZERS="$PWD/.gpu-tokenizers"
RESULTS="${OUT:-benchmarks/results}"
MODELS=/tmp/hacrl-gpu-models PARTS=/tmp/hacrl-gpu-parts
mkdir -p "$RESULTS" "$MODELS" "$PARTS"
python -c "import torch, transformers; print('torch', torch.__version__, '| transformers', transformers.__version__, '|', torch.cuda.get_device_name() if torch.cuda.is_available() else 'no CUDA device: a dry run with tiny shapes')" || exit 1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
nproc; lscpu | grep -m1 'Model name' || true
start=$(date +%s)
say() { echo "gpu_check: $* ($(( $(date +%s) - start )) s)"; }
kernel_config() {  # GPU_CHECK_KERNEL (JSON), else the kernel part's choice once it has run on this machine
  [ -n "${GPU_CHECK_KERNEL:-}" ] && { echo "$GPU_CHECK_KERNEL"; return; }
  [ -f "$PARTS/kernel/gpu.json" ] && python -c "import json, sys; print(json.dumps(json.load(open(sys.argv[1]))['kernel']['chosen']))" "$PARTS/kernel/gpu.json" 2>/dev/null
}
part() {  # part NAME LIMIT ARGS: gpu_throughput.py ARGS under a time limit, then all parts so far merged into gpu.json/md
  local name=$1 limit=$2; shift 2
  local chosen; chosen=$(kernel_config)
  rm -rf "${PARTS:?}/$name"
  timeout "$limit" python benchmarks/gpu_throughput.py --models "$MODELS" --out "$PARTS/$name" "$@" \
    ${chosen:+--kernel-config "$chosen"} >> "$RESULTS/gpu-throughput.log" 2>&1
  say "$name exit $?"
  python benchmarks/gpu_throughput.py --out "$RESULTS" --merge "$PARTS"/* > /dev/null
}
for item in ${GPU_CHECK:-tests=120 kernel=60 qwen=150 qwen-hf=70 llama=80 llama-hf=50 parity=50 long=360 paper=300 \
    precision=300 logprobs=60 step=200 sync=60}; do
  name=${item%%=*} limit=${item#*=}
  case $name in
    tests)
      timeout "$limit" python -m pytest -q -p no:cacheprovider ${GPU_CHECK_TESTS:-tests/gpu} > "$RESULTS/gpu-tests.txt" 2>&1
      say "tests/gpu exit $? ($(tail -1 "$RESULTS/gpu-tests.txt"))" ;;
    kernel) part kernel "$limit" --only kernel ;;
    qwen) part qwen "$limit" --only sampling --shapes qwen3-0.6b --backends static+graphs --modes varied no-stop \
            ${GPU_CHECK_PROFILE:+--profile} ;;
    qwen-hf) part qwen-hf "$limit" --only sampling --shapes qwen3-0.6b --backends hf --modes varied ;;
    llama) part llama "$limit" --only sampling --shapes llama-3.2-1b --backends static+graphs --modes varied no-stop ;;
    llama-hf) part llama-hf "$limit" --only sampling --shapes llama-3.2-1b --backends hf --modes varied ;;
    parity) part parity "$limit" --only parity ;;
    long) part long "$limit" --only long --shapes qwen3-0.6b ${GPU_CHECK_LONG_MODES:+--long-modes $GPU_CHECK_LONG_MODES} ;;
    paper) part paper "$limit" --only paper --shapes qwen3-4b ${GPU_CHECK_PAPER_MARGIN:+--paper-margin "$GPU_CHECK_PAPER_MARGIN"} ;;
    precision) part precision "$limit" --only precision --shapes qwen3-4b --precision-new "${GPU_CHECK_PRECISION_NEW:-1024}" ;;
    logprobs) part logprobs "$limit" --only logprobs ;;
    step) part step "$limit" --only step --step-new "${GPU_CHECK_STEP_NEW:-512}" ;;
    lag) part lag "$limit" --only lag --shapes qwen3-4b ;;  # two GPUs: the paper step at lag 0 and 1 (issue 59)
    sync)  # a sampler of its own: the weight sync of the 4B shape on one GPU (issue 59)
      timeout "$limit" python benchmarks/weight_sync.py --device cuda --shape qwen3-4b --out "$RESULTS" \
        >> "$RESULTS/gpu-throughput.log" 2>&1
      say "sync exit $?" ;;
    *) echo "gpu_check: no part named $name (tests kernel qwen qwen-hf llama llama-hf parity long paper precision logprobs step lag sync)"
       exit 2 ;;
  esac
done
say "done"
cat "$RESULTS/gpu.md" 2>/dev/null || cat "$RESULTS/gpu-cpu-dry-run.md" 2>/dev/null || true
