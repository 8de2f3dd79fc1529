#!/usr/bin/env bash
# Installs a CUDA compiler and headers from PyPI wheels into a virtualenv (no GPU, driver or system CUDA needed) and
# prints the environment that builds the workspace's `cuda` feature. candle's CUDA kernels are compiled to PTX by
# nvcc at build time; the CUDA libraries themselves (libcuda, cuBLAS, cuRAND) are loaded only when a GPU is used, so
# a GPU-less machine can compile and check everything.
#
#   eval "$(scripts/cuda-toolchain.sh)"          # install once (~300 MB), then export the variables
#   cargo check --workspace --features easd/cuda,easd-services/cuda
#
# Environment:
#   EASD_CUDA_VENV      where the virtualenv lives (default ~/.cache/easd/cuda-venv; safe to rerun)
#   CUDA_COMPUTE_CAP    the one GPU generation to compile kernels for (default 90 = Hopper; 80 = A100, 89 = L4/4090)
#   EASD_CUDA_LIBS=1    also install cuBLAS and cuRAND (needed to *run* on a GPU machine without a system CUDA)
#
# Versions are pinned: CUDA 13.4 is the newest release that candle 0.11's cudarc (0.19) knows by number.
set -euo pipefail

venv="${EASD_CUDA_VENV:-$HOME/.cache/easd/cuda-venv}"
version="13.4.92"
packages=("nvidia-cuda-nvcc==$version" "nvidia-cuda-runtime==$version" "nvidia-cuda-crt==$version"
    "nvidia-nvvm==$version" "nvidia-cuda-cccl==13.3.5.0.6")
if [ "${EASD_CUDA_LIBS:-0}" = 1 ]; then
    packages+=("nvidia-cublas" "nvidia-curand")
fi

if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv" >&2
fi
if ! "$venv/bin/pip" install --quiet --disable-pip-version-check "${packages[@]}" >&2; then
    echo "cuda-toolchain: installing ${packages[*]} into $venv failed" >&2
    exit 1
fi

cu="$("$venv/bin/python" - <<'EOF'
import pathlib, sysconfig
root = pathlib.Path(sysconfig.get_paths()["purelib"]) / "nvidia"
hits = sorted(p.parent.parent for p in root.glob("*/bin/nvcc"))
print(hits[0] if hits else "")
EOF
)"
if [ -z "$cu" ] || [ ! -x "$cu/bin/nvcc" ]; then
    echo "cuda-toolchain: no nvcc found under $venv (the wheel layout changed?)" >&2
    exit 1
fi
"$cu/bin/nvcc" --version | tail -n 2 >&2

cat <<EOF
export CUDA_ROOT="$cu"
export CUDA_PATH="$cu"
export PATH="$cu/bin:\$PATH"
export LD_LIBRARY_PATH="$cu/lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
export CUDA_COMPUTE_CAP="${CUDA_COMPUTE_CAP:-90}"
export CUDARC_CUDA_VERSION=13040
EOF
