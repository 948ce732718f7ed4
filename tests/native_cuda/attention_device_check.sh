#!/usr/bin/env bash
set -uo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
out="${OUT:-/tmp/glmrt-device-out}"
mkdir -p "$out"
phases="${*:-build kernels bench model backend sanitizer}"
export NCCL_NVLS_ENABLE=0

has_phase() {
    case " $phases " in *" $1 "*) return 0 ;; *) return 1 ;; esac
}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
uname -r
if has_phase build; then
    start=$(date +%s)
    if ! bash build.sh --no-deps --no-cuda > "$out/build.log" 2>&1 ||
        ! GLMRT_BUILD_JOBS="$(nproc)" bash build_cuda.sh release "${GLMRT_CUDA_ARCHS:-90a}" 0 >> "$out/build.log" 2>&1; then
        grep -E "error|warning" "$out/build.log" | head -40
        tail -20 "$out/build.log"
        exit 1
    fi
    echo "build seconds $(( $(date +%s) - start ))"
fi

if has_phase kernels; then
    start=$(date +%s)
    timeout "${GLMRT_KERNEL_SECONDS:-200}" build/test_cuda_attention > "$out/test_cuda_attention.log" 2>&1
    echo "test_cuda_attention rc=$? seconds $(( $(date +%s) - start ))"
    grep -E "FAIL|checks" "$out/test_cuda_attention.log" | head -40
    echo "$(grep -c PASS "$out/test_cuda_attention.log") checks passed; largest errors against float64:"
    grep -E "against float64" "$out/test_cuda_attention.log" | sed 's/.*: //' | sort -t' ' -k6 -g | tail -4
fi

if has_phase bench; then
    timeout "${GLMRT_BENCH_SECONDS:-150}" python3 bench/attention_bench.py --json "$out/attention_bench.json" \
        > "$out/attention_bench.log" 2>&1
    echo "attention_bench rc=$?"
    cat "$out/attention_bench.log" | tail -30
fi

if has_phase model; then
    PYTHONUNBUFFERED=1 timeout "${GLMRT_MODEL_SECONDS:-240}" python3 -m pytest -q -rA -m gpu \
        tests/test_cuda_attention_model.py -p no:cacheprovider -s > "$out/pytest_model.log" 2>&1
    echo "pytest model rc=$?"
    grep -E "passed|failed|PASSED|FAILED|Error|assert" "$out/pytest_model.log" | head -40
    grep -E "relative L2" "$out/pytest_model.log" | sort -t' ' -k7 -g | tail -3
fi

if has_phase native-matmuls; then
    PYTHONUNBUFFERED=1 GLMRT_ATTENTION_TEST_MATMULS=native timeout "${GLMRT_MODEL_SECONDS:-240}" python3 -m pytest -q -rA \
        -m gpu tests/test_cuda_attention_model.py -k "equal" -p no:cacheprovider > "$out/pytest_native.log" 2>&1
    echo "pytest with native matmuls rc=$?"
    grep -E "passed|failed|PASSED|FAILED" "$out/pytest_native.log" | head -10
fi

if has_phase sass; then
    symbol=$(cuobjdump -symbols build/obj_cuda/kernels_attention_prefill.o | grep -o "_Z30glmrt_attention_prefill_kernelILi128EEv25glmrt_cuda_attention_args" | head -1)
    cuobjdump -sass -fun "$symbol" build/obj_cuda/kernels_attention_prefill.o > "$out/prefill128.sass" 2>&1
    echo "prefill sass lines $(wc -l < "$out/prefill128.sass")"
    grep -oE "^ +/\*[0-9a-f]+\*/ +[A-Z0-9_.]+" "$out/prefill128.sass" | awk '{print $2}' | sed 's/\..*//' | sort | uniq -c | sort -rn | head -25
fi

if has_phase backend; then
    PYTHONUNBUFFERED=1 GLMRT_CUDA_CHURN_STEPS="${GLMRT_CUDA_CHURN_STEPS:-1000}" timeout "${GLMRT_BACKEND_SECONDS:-240}" \
        python3 -m pytest -q -rA -m gpu tests/test_cuda_backend.py \
        -k "${GLMRT_PYTEST_FILTER:-not kernel_driver and not server and not transformers}" -p no:cacheprovider -s > "$out/pytest_backend.log" 2>&1
    echo "pytest backend rc=$?"
    grep -E "passed|failed|PASSED|FAILED|Error|relative L2|agree|assert" "$out/pytest_backend.log" | head -80
fi

if has_phase sanitizer; then
    for tool in memcheck racecheck; do
        timeout "${GLMRT_SANITIZER_SECONDS:-150}" compute-sanitizer --tool "$tool" --print-limit 20 \
            build/test_cuda_attention quick > "$out/sanitizer_$tool.log" 2>&1
        echo "compute-sanitizer $tool rc=$?"
        grep -E "ERROR SUMMARY|RACECHECK SUMMARY|hazard|Invalid|checks" "$out/sanitizer_$tool.log" | head -12
    done
fi

if has_phase profile; then
    sections="--section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section Occupancy --section InstructionStats --section SourceCounters"
    timeout "${GLMRT_PROFILE_SECONDS:-120}" ncu --clock-control none $sections -k regex:glmrt_attention_prefill_kernel \
        --launch-skip 16 --launch-count 1 build/attention_bench > "$out/ncu_prefill.log" 2>&1
    echo "ncu prefill rc=$?"
    grep -E "Duration|Compute \(SM\) Throughput|Memory Throughput|Executed Ipc|Issue Slots Busy|No Eligible|Stall|Warp Cycles Per Issued|Achieved Occupancy|Registers Per|Bank|Pipe|L1/TEX Hit|L2 Hit|DRAM Throughput" "$out/ncu_prefill.log" | head -50
    timeout "${GLMRT_PROFILE_SECONDS:-120}" ncu --clock-control none $sections -k regex:glmrt_attention_decode_kernel \
        --launch-skip 72 --launch-count 1 build/attention_bench > "$out/ncu_decode.log" 2>&1
    echo "ncu decode rc=$?"
    grep -E "Duration|Compute \(SM\) Throughput|Memory Throughput|DRAM Throughput|Executed Ipc|No Eligible|Warp Cycles Per Issued|Achieved Occupancy" "$out/ncu_decode.log" | head -20
fi
