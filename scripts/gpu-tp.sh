#!/usr/bin/env bash
# gpu-tp.sh — on a lent multi-GPU machine: build kiln with CUDA + NCCL and run the tensor-
# parallel gpu test (tests/gpu/test_tp_nccl.c; docs/TP.md). NVLink multicast stays off.
# kiln's C dependencies come from Debian packages in .carry/deps/ when the image lacks them
# (here: scripts/gpu-pack.sh --deps .carry/deps), then a device run with carry [".carry"]:
#   bash scripts/gpu-tp.sh        (results in $OUT/tp.txt when $OUT is set)
set -uo pipefail
OUT=${OUT:-/tmp}
JOBS=$(nproc)
exec > >(tee "$OUT/tp.txt") 2>&1
nvidia-smi -L
source scripts/gpu-env.sh
cmake -S . -B build-gpu-tp -DCMAKE_BUILD_TYPE=Release -DKILN_CUDA=ON -DKILN_CUDA_ARCHITECTURES=90 \
  -DKILN_ONEDNN=OFF -DKILN_OPENBLAS=OFF "${KILN_CMAKE_ARGS[@]}" | grep -E "NCCL|CUDA|Error"
time cmake --build build-gpu-tp -j"$JOBS" --target test_tp_nccl kiln-gen 2>&1 | grep -E "error|warning|Built target" 
KILN_BINARY_DIR=$PWD/build-gpu-tp ./build-gpu-tp/tests/test_tp_nccl
echo "test_tp_nccl exit $?"
