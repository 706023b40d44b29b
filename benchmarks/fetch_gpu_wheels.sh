#!/usr/bin/env bash
# What hacrl needs on the GPU machine's image (see benchmarks/gpu_check.sh and ../shared/notes/gpu-testbed.md):
# the pure-Python wheels it lacks, downloaded here into .gpu-wheels/ (~15 MB), and a copy of the real tokenizers
# into .gpu-tokenizers/ (~20 MB; ../shared does not travel with the working tree). Both are ignored by git.
set -euo pipefail
cd "$(dirname "$0")/.."
# pure-Python wheels only (the GPU machine runs another Python); the GPU check needs no reasoning-gym, whose
# dependencies would have to be compiled there
python -m pip download --quiet --no-deps --only-binary=:all: -d .gpu-wheels \
  transformers==5.24.0 omegaconf==2.4.0 math-verify==0.9.0 latex2sympy2_extended==1.11.0 \
  antlr4-python3-runtime==4.13.2
ls -la .gpu-wheels
if [ -d ../shared/data/tokenizers ]; then
  rm -rf .gpu-tokenizers && cp -r ../shared/data/tokenizers .gpu-tokenizers && du -sh .gpu-tokenizers
fi
