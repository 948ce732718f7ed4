#!/usr/bin/env bash
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$root"

variant="${1:-release}"
cuda_archs="${2:-90a 100a}"
compile_only="${3:-0}"

nvcc_bin="${NVCC:-$(command -v nvcc || true)}"
if [ -z "$nvcc_bin" ] && [ -x /usr/local/cuda/bin/nvcc ]; then
    nvcc_bin=/usr/local/cuda/bin/nvcc
fi
if [ -z "$nvcc_bin" ]; then
    echo "build_cuda.sh: nvcc not found" >&2
    exit 1
fi
cuda_home="${CUDA_HOME:-}"
if [ -z "$cuda_home" ]; then
    cuda_home=$("$nvcc_bin" -dryrun -c -x cu /dev/null 2>&1 | sed -n 's/^#\$ TOP=//p' | head -1)
fi
if [ -z "$cuda_home" ]; then
    cuda_home=$(dirname "$(dirname "$(readlink -f "$nvcc_bin")")")
fi

case "$variant" in
    release) out_dir="build"; nv_opt="-O3 -lineinfo -DNDEBUG"; cc_opt="-O3 -march=${GLMRT_MARCH:-native} -DNDEBUG"; link_extra="" ;;
    debug) out_dir="build/debug"; nv_opt="-O0 -g -lineinfo -DGLMRT_DEBUG"; cc_opt="-O0 -g -DGLMRT_DEBUG"; link_extra="" ;;
    asan) out_dir="build/asan"; nv_opt="-O1 -g -lineinfo -DGLMRT_DEBUG"; cc_opt="-O1 -g -DGLMRT_DEBUG -fsanitize=address,undefined -fno-omit-frame-pointer"; link_extra="-fsanitize=address,undefined" ;;
    *) echo "build_cuda.sh: unknown variant $variant" >&2; exit 2 ;;
esac

supported_archs=$("$nvcc_bin" --list-gpu-arch 2>/dev/null | tr '\n' ' ')
probe_dir=$(mktemp -d)
trap 'rm -rf "$probe_dir"' EXIT
printf '__global__ void glmrt_probe_kernel(int *p) { *p = 1; }\n' > "$probe_dir/probe.cu"

gencode=""
built_archs=""
for arch in $cuda_archs; do
    base="${arch%a}"
    base="${base%f}"
    if ! echo " $supported_archs " | grep -q " compute_${base} "; then
        echo "build_cuda.sh: nvcc $("$nvcc_bin" --version | tail -1) cannot target compute_${base}; skipping sm_${arch}" >&2
        continue
    fi
    flag="-gencode=arch=compute_${arch},code=sm_${arch}"
    if ! "$nvcc_bin" $flag -c "$probe_dir/probe.cu" -o "$probe_dir/probe.o" >/dev/null 2>&1; then
        echo "build_cuda.sh: nvcc rejects sm_${arch}; skipping it" >&2
        continue
    fi
    gencode="$gencode $flag"
    built_archs="$built_archs sm_${arch}"
done
if [ -z "$gencode" ]; then
    echo "build_cuda.sh: none of the architectures [$cuda_archs] can be built" >&2
    exit 1
fi

find_nccl() {
    local candidates=""
    if [ -n "${NCCL_HOME:-}" ]; then
        candidates="$NCCL_HOME"
    fi
    local wheel_dir
    wheel_dir=$(python3 -c 'import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__) if nvidia.nccl.__file__ else list(nvidia.nccl.__path__)[0])' 2>/dev/null || true)
    candidates="$candidates $wheel_dir $cuda_home /usr /usr/local"
    for base in $candidates; do
        [ -e "$base/include/nccl.h" ] || continue
        for lib_dir in "$base/lib" "$base/lib64" "$base/lib/x86_64-linux-gnu" /usr/lib/x86_64-linux-gnu; do
            if ls "$lib_dir"/libnccl.so* >/dev/null 2>&1; then
                nccl_include="$base/include"
                nccl_lib="$lib_dir"
                return 0
            fi
        done
    done
    return 1
}

nccl_include=""
nccl_lib=""
if ! find_nccl; then
    echo "build_cuda.sh: NCCL not found; pip install -r requirements-cuda12.txt or requirements-cuda13.txt (the NCCL wheel for your CUDA) or set NCCL_HOME" >&2
    exit 1
fi
echo "build_cuda.sh: NCCL from $nccl_include and $nccl_lib"
nccl_link="-Xlinker $(ls "$nccl_lib"/libnccl.so* | sort | head -1) -Xlinker -rpath=$nccl_lib"

cuda_include_flags=$(find csrc/cuda -type d | sort | sed 's/^/-I/' | paste -sd ' ')
include_flags="-Icsrc/include -Icsrc/core -Icsrc/cpu $cuda_include_flags -I$nccl_include"
nv_flags="-std=c++17 $nv_opt $gencode $include_flags -Xcompiler -fPIC,-Wall,-Wextra,-Wno-unused-parameter"
cc="${CC:-gcc}"
cc_flags="-std=c11 -D_GNU_SOURCE -fPIC -pthread -Wall -Wextra -Wno-unused-parameter $include_flags -DGLMRT_WITH_CUDA $cc_opt"

obj_dir="$out_dir/obj_cuda"
mkdir -p "$obj_dir"
flags_stamp="$obj_dir/nvcc_flags"
if [ ! -e "$flags_stamp" ] || [ "$(cat "$flags_stamp")" != "$nv_flags" ]; then
    rm -f "$obj_dir"/*.o
    printf '%s' "$nv_flags" > "$flags_stamp"
fi
jobs="${GLMRT_BUILD_JOBS:-$(nproc)}"

cuda_object_of() {
    local rel="${1#csrc/cuda/}"
    rel="${rel%.cu}"
    printf '%s/%s.o\n' "$obj_dir" "${rel//\//_}"
}

compile_cuda_one() {
    local src="$1"
    local obj
    obj=$(cuda_object_of "$src")
    if [ "$obj" -nt "$src" ] && [ -z "$(find csrc/cuda csrc/core csrc/include \( -name '*.h' -o -name '*.cuh' \) -newer "$obj" | head -1)" ]; then
        return 0
    fi
    "$nvcc_bin" $nv_flags -c "$src" -o "$obj"
}
export -f cuda_object_of compile_cuda_one
export nvcc_bin nv_flags obj_dir

cuda_sources=$(find csrc/cuda -name '*.cu' | sort)
printf '%s\n' $cuda_sources | xargs -P "$jobs" -I{} bash -c 'compile_cuda_one "$1"' _ {}
cuda_objects=$(for src in $cuda_sources; do cuda_object_of "$src"; done | paste -sd ' ')

if [ "$compile_only" = 1 ]; then
    for driver in tests/native_cuda/*.cu bench/*.cu; do
        [ -e "$driver" ] || continue
        "$nvcc_bin" $nv_flags -c "$driver" -o "$obj_dir/driver_$(basename "$driver" .cu).o"
    done
    echo "compiled CUDA sources for$built_archs ($variant, compile only)"
    exit 0
fi

core_objects=""
for src in csrc/core/*.c csrc/cpu/*.c; do
    obj="$obj_dir/core_$(echo "$src" | tr '/' '_' | sed 's/\.c$/.o/')"
    $cc $cc_flags -c "$src" -o "$obj"
    core_objects="$core_objects $obj"
done

link_libs="-L$cuda_home/lib64 -L$cuda_home/targets/x86_64-linux/lib -lcudart_static $nccl_link -ldl -lrt -lpthread -lm"
g++ -shared $link_extra -o "$out_dir/libglmrt_cuda.so" $core_objects $cuda_objects $link_libs

for driver in tests/native_cuda/*.cu bench/*.cu; do
    [ -e "$driver" ] || continue
    name=$(basename "$driver" .cu)
    "$nvcc_bin" $nv_flags -o "$out_dir/$name" "$driver" $core_objects $cuda_objects $link_libs ${link_extra:+-Xcompiler $link_extra}
done

echo "built $out_dir/libglmrt_cuda.so for$built_archs ($variant)"
