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
NATIVE_BINARY = BUILD_DIR / "attention_bench"
NUM_HEADS = 96
NUM_KV_HEADS = 8
HEAD_DIM = 128
DECODE_TARGET = 0.70
PREFILL_TARGET = 0.40


def run_native():
    if not NATIVE_BINARY.exists():
        raise SystemExit(f"{NATIVE_BINARY} is missing: bash build_cuda.sh release 90a 0 builds it from bench/attention_bench.cu")
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


def torch_cell(backend, row, dense):
    rate, note = sdpa_rate(backend, row["context"], row["chunk"], row["flops"])
    text = "n/a" if rate is None else f"{rate / 1e12:.0f}"
    return rate, text + (f" ({100 * rate / dense:.0f}%)" if rate else f" ({note})")


def main():
    parser = argparse.ArgumentParser(description="decode and prefill attention against the copy bandwidth and bf16 rate")
    parser.add_argument("--json", default="")
    args = parser.parse_args()
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
        if not row["kind"].startswith("decode"):
            continue
        rate = row["kv_bytes"] / (row["us"] * 1e-6)
        row["fraction"] = rate / bandwidth
        print(f"| {row['kind']} | {row['batch']} | {row['context']} | {row['us']:.1f} | {row['kv_bytes'] / 1e9:.3f} | "
              f"{rate / 1e12:.2f} | {100 * row['fraction']:.1f}% | {'met' if row['fraction'] >= DECODE_TARGET else 'below 70%'} |")
    print()
    print("| case | chunk | context | kernel us | TFLOP/s | of bf16 rate | target | torch flash TFLOP/s | torch cuDNN TFLOP/s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        if not row["kind"].startswith("prefill"):
            continue
        rate = row["flops"] / (row["us"] * 1e-6)
        row["fraction"] = rate / dense
        flash_text = cudnn_text = ""
        if row["kind"] == "prefill":
            row["torch_flash"], flash_text = torch_cell(SDPBackend.FLASH_ATTENTION, row, dense)
            row["torch_cudnn"], cudnn_text = torch_cell(SDPBackend.CUDNN_ATTENTION, row, dense)
        print(f"| {row['kind']} | {row['chunk']} | {row['context']} | {row['us']:.1f} | {rate / 1e12:.0f} | "
              f"{100 * row['fraction']:.1f}% | {'met' if row['fraction'] >= PREFILL_TARGET else 'below 40%'} | "
              f"{flash_text} | {cudnn_text} |")
    if args.json:
        Path(args.json).write_text(json.dumps({"device": name, "copy_bandwidth": bandwidth, "bf16_rate": dense,
                                               "cases": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
