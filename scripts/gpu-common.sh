# gpu-common.sh — the setup the newer gpu-*.sh scripts share (sourced from the repository
# root on the GPU machine): $OUT/logs as LOG, /tmp/models as M, the GPU's name in
# $LOG/gpu.txt, gpu-env.sh (NVLink multicast off, carried deps, NCCL), gpu-step.sh's `step NAME
# TIMEOUT CMD...` (output in $LOG/NAME.log, a row for the summary in ROWS, rc=1 on failure), B the
# build folder (build-gpu), configured once for sm_90.
OUT=${OUT:-/tmp/kiln-gpu-out}
LOG=$OUT/logs; mkdir -p "$LOG"
M=/tmp/models; mkdir -p $M
export KILN_NO_PROGRESS=1
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader | tee "$LOG/gpu.txt"
source scripts/gpu-env.sh
source scripts/gpu-step.sh
B=build-gpu
[ -f $B/CMakeCache.txt ] || step configure 300 cmake -S . -B $B -DCMAKE_BUILD_TYPE=Release \
  -DKILN_CUDA=ON -DKILN_CUDA_ARCHITECTURES=90 -DKILN_OPENBLAS=OFF -DKILN_ONEDNN=OFF "${KILN_CMAKE_ARGS[@]}"
