#!/usr/bin/env bash
# The pure-Python wheels that hacrl needs on the GPU machine's image (see benchmarks/gpu_check.sh and
# ../shared/notes/gpu-testbed.md), downloaded here into .gpu-wheels/ (ignored by git; about 15 MB).
set -euo pipefail
cd "$(dirname "$0")/.."
# pure-Python wheels only (the GPU machine runs another Python); the GPU check needs no reasoning-gym, whose
# dependencies would have to be compiled there
python -m pip download --quiet --no-deps --only-binary=:all: -d .gpu-wheels \
  transformers==5.24.0 omegaconf==2.4.0 math-verify==0.9.0 latex2sympy2_extended==1.11.0 \
  antlr4-python3-runtime==4.13.2
ls -la .gpu-wheels
