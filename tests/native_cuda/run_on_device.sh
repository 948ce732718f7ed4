#!/usr/bin/env bash
set -uo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
out="${OUT:-/tmp/glmrt-device-out}"
mkdir -p "$out"
jobs="$(nproc)"

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
start=$(date +%s)
if ! bash build.sh --no-deps > "$out/build.log" 2>&1; then
    tail -30 "$out/build.log"
    exit 1
fi
if ! GLMRT_BUILD_JOBS="$jobs" bash build_cuda.sh release "${GLMRT_CUDA_ARCHS:-90a}" 0 >> "$out/build.log" 2>&1; then
    grep -E "error|warning" "$out/build.log" | head -40
    exit 1
fi
echo "build seconds $(( $(date +%s) - start ))"
grep -E "warning" "$out/build.log" | head -10

for driver in test_cuda_fp8 test_cuda_gemm test_cuda_qgemm test_cuda_attention test_cuda_moe_sampling; do
    timeout 180 "build/$driver" > "$out/$driver.log" 2>&1
    echo "$driver rc=$?"
    grep -E "FAIL|checks|row " "$out/$driver.log" | head -20
done

if [ "${GLMRT_SKIP_PYTEST:-0}" = 1 ]; then
    exit 0
fi
PYTHONUNBUFFERED=1 GLMRT_CUDA_CHURN_STEPS="${GLMRT_CUDA_CHURN_STEPS:-2000}" timeout "${GLMRT_PYTEST_SECONDS:-400}" \
    python3 -m pytest -q -rA -m gpu ${GLMRT_PYTEST_FILES:-tests/test_cuda_backend.py} -k "${GLMRT_PYTEST_FILTER:-not kernel_driver}" \
    -p no:cacheprovider -s > "$out/pytest.log" 2>&1
echo "pytest rc=$?"
grep -E "passed|failed|PASSED|FAILED|Error|relative L2|agree|assert" "$out/pytest.log" | head -120
