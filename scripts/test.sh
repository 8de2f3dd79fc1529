#!/usr/bin/env bash
# The project's test suite: what CI runs (.ci/run) and what a developer runs before pushing.
# Rust unit + end-to-end + fault tests (tiny models written from code, loopback only), the OpenAI-client
# tests (official `openai` package in a virtualenv), and the deployment manifests' validation.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n== %s\n' "$*"; }

step "format"
cargo fmt --all -- --check

step "cargo test --workspace"
cargo test --workspace --no-fail-fast

step "model runtime on the portable kernels (as on a CPU without AVX2; must give the same bits)"
EASD_KERNELS=portable cargo test -p easd-kernels -p easd-model --lib --no-fail-fast

# ~8 minutes on two cores (nvcc compiles candle's kernels for one GPU generation); EASD_CUDA_CHECK=0 skips it.
if [ "${EASD_CUDA_CHECK:-1}" != 0 ]; then
  step "the cuda feature compiles (nvcc from PyPI wheels; no GPU needed)"
  (
    eval "$(scripts/cuda-toolchain.sh)"
    cargo check -p easd -p easd-services --features easd/cuda,easd-services/cuda
  )
fi

if [ -f tests/openai/run.sh ]; then
  step "OpenAI API tests (official openai client)"
  bash tests/openai/run.sh
fi

if [ -f deploy/check.sh ]; then
  step "deployment manifests (docker compose config, kubernetes-validate)"
  bash deploy/check.sh
fi

step "all tests passed"
