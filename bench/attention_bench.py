import argparse
import json
import subprocess
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.bias import causal_lower_right

REPO_ROOT = Path(__file__).resolve().parents[1]
BUILD_DIR = REPO_ROOT / "build"
NATIVE_SOURCE = REPO_ROOT / "bench" / "attention_bench.cu"
NATIVE_BINARY = BUILD_DIR / "attention_bench"
LIBRARY = BUILD_DIR / "libglmrt_cuda.so"
NUM_HEADS = 96
NUM_KV_HEADS = 8
HEAD_DIM = 128
DECODE_TARGET = 0.70
PREFILL_TARGET = 0.40


def native_sources():
    return [NATIVE_SOURCE, LIBRARY] + sorted((REPO_ROOT / "csrc" / "cuda").rglob("attention*"))


def build_native(arch):
    if NATIVE_BINARY.exists() and all(NATIVE_BINARY.stat().st_mtime >= p.stat().st_mtime for p in native_sources()):
        return
    includes = ["-Icsrc/include", "-Icsrc/core", "-Icsrc/cpu"]
    includes += [f"-I{p.relative_to(REPO_ROOT)}" for p in sorted((REPO_ROOT / "csrc" / "cuda").rglob("*")) if p.is_dir()]
    includes.append("-Icsrc/cuda")
    nccl_include = nccl_include_dir()
    if nccl_include:
        includes.append(f"-I{nccl_include}")
    command = ["nvcc", "-std=c++17", "-O3", f"-gencode=arch=compute_{arch},code=sm_{arch}", *includes,
               "-o", str(NATIVE_BINARY), str(NATIVE_SOURCE), f"-L{BUILD_DIR}", "-lglmrt_cuda",
               f"-Xlinker=-rpath={BUILD_DIR}"]
    subprocess.run(command, cwd=REPO_ROOT, check=True)


def nccl_include_dir():
    try:
        import nvidia.nccl
    except ImportError:
        return None
    base = Path(list(nvidia.nccl.__path__)[0])
    return base / "include" if (base / "include" / "nccl.h").exists() else None


def run_native():
    result = subprocess.run([str(NATIVE_BINARY)], cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    rows = []
    for line in result.stdout.splitlines():
        if line.startswith("{"):
            rows.append(json.loads(line))
        else:
            print(line)
    if result.returncode != 0:
        print(result.stdout + result.stderr)
        raise SystemExit("native attention bench failed")
    return rows


def cuda_time_ms(fn, iterations, warmup=3):
    for _ in range(warmup):
        fn()
    start = torch.cuda.Event(enable_timing=True)
    stop = torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iterations):
        fn()
    stop.record()
    stop.synchronize()
    return start.elapsed_time(stop) / iterations


def copy_bandwidth():
    count = 1 << 31
    src = torch.empty(count, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = cuda_time_ms(lambda: dst.copy_(src), 10)
    return 2 * count / (ms * 1e-3)


def matmul_rate():
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    ms = cuda_time_ms(lambda: torch.mm(a, b), 20)
    return 2 * n ** 3 / (ms * 1e-3)


def sdpa_rate(backend, context, chunk, flops):
    q = torch.randn(1, NUM_HEADS, chunk, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(1, NUM_KV_HEADS, context, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    k = k.repeat_interleave(NUM_HEADS // NUM_KV_HEADS, dim=1).contiguous()
    v = v.repeat_interleave(NUM_HEADS // NUM_KV_HEADS, dim=1).contiguous()
    if context == chunk:
        call = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)
    else:
        mask = causal_lower_right(chunk, context)
        call = lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    try:
        with sdpa_kernel(backend):
            ms = cuda_time_ms(call, 10)
    except RuntimeError as error:
        return None, str(error).splitlines()[0][:80]
    return flops / (ms * 1e-3), f"{ms * 1e3:.0f} us"


def format_rate(value):
    return "n/a" if value is None else f"{value / 1e12:.0f}"


def main():
    parser = argparse.ArgumentParser(description="decode and prefill attention against the copy bandwidth and bf16 rate")
    parser.add_argument("--arch", default="90a")
    parser.add_argument("--json", default="")
    args = parser.parse_args()
    build_native(args.arch)
    name = torch.cuda.get_device_name()
    bandwidth = copy_bandwidth()
    dense = matmul_rate()
    print(f"device {name}: copy bandwidth {bandwidth / 1e12:.2f} TB/s (read + written), "
          f"bf16 matmul {dense / 1e12:.0f} TFLOP/s (8192^3 torch.mm)")
    rows = run_native()
    print()
    print("| case | batch | context | kernel us | KV GB | KV TB/s | of copy bandwidth | target |")
    print("|---|---|---|---|---|---|---|---|")
    for row in rows:
        if row["kind"] != "decode":
            continue
        rate = row["kv_bytes"] / (row["us"] * 1e-6)
        row["fraction"] = rate / bandwidth
        print(f"| decode | {row['batch']} | {row['context']} | {row['us']:.1f} | {row['kv_bytes'] / 1e9:.3f} | "
              f"{rate / 1e12:.2f} | {100 * row['fraction']:.1f}% | {'met' if row['fraction'] >= DECODE_TARGET else 'below 70%'} |")
    print()
    print("| case | chunk | context | kernel us | TFLOP/s | of bf16 rate | target | torch flash TFLOP/s | torch cuDNN TFLOP/s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        if row["kind"] != "prefill":
            continue
        rate = row["flops"] / (row["us"] * 1e-6)
        row["fraction"] = rate / dense
        flash, flash_note = sdpa_rate(SDPBackend.FLASH_ATTENTION, row["context"], row["chunk"], row["flops"])
        cudnn, cudnn_note = sdpa_rate(SDPBackend.CUDNN_ATTENTION, row["context"], row["chunk"], row["flops"])
        row["torch_flash"] = flash
        row["torch_cudnn"] = cudnn
        flash_text = format_rate(flash) + (f" ({100 * flash / dense:.0f}%)" if flash else f" ({flash_note})")
        cudnn_text = format_rate(cudnn) + (f" ({100 * cudnn / dense:.0f}%)" if cudnn else f" ({cudnn_note})")
        print(f"| prefill | {row['chunk']} | {row['context']} | {row['us']:.1f} | {rate / 1e12:.0f} | "
              f"{100 * row['fraction']:.1f}% | {'met' if row['fraction'] >= PREFILL_TARGET else 'below 40%'} | "
              f"{flash_text} | {cudnn_text} |")
    if args.json:
        Path(args.json).write_text(json.dumps({"device": name, "copy_bandwidth": bandwidth, "bf16_rate": dense,
                                               "cases": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
