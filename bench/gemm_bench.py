import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
FP8_CUBE = 8192
SUSTAINED_SECONDS = 3.0
SUSTAINED_BATCH = 25


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="bench/gemm_bench.py",
                                     description="Native and high-precision matmuls at the GLM-4.7-FP8 shapes against "
                                                 "the copy bandwidth and torch._scaled_mm's FP8 rate, measured in the "
                                                 "same run.")
    parser.add_argument("--binary", default=str(REPO_ROOT / "build" / "gemm_bench"),
                        help="the program build_cuda.sh builds from bench/gemm_bench.cu")
    parser.add_argument("--no-high", action="store_true", help="time only the native matmuls")
    parser.add_argument("--block-scales", action="store_true",
                        help="FP8 weights with 128x128 block scales (DeepSeek-style checkpoints) instead of GLM-4.7-FP8's "
                             "one scale an output row")
    parser.add_argument("--gpus", type=int, choices=(1, 2, 4), default=1,
                        help="time one GPU's share of each matrix when the model is split over this many GPUs")
    parser.add_argument("--ungated", action="store_true",
                        help="time the gate-up products writing both halves in FP32, instead of SiLU(gate) x up in "
                             "their epilogue as a step runs them")
    parser.add_argument("--json", help="write every measurement to this file")
    return parser.parse_args(argv)


def median_seconds(torch, run, repeats=10):
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    samples = []
    for _ in range(repeats):
        start.record()
        run()
        stop.record()
        stop.synchronize()
        samples.append(start.elapsed_time(stop) * 1e-3)
    samples.sort()
    return samples[len(samples) // 2]


def copy_bandwidth(torch):
    source = torch.empty(4 << 30, dtype=torch.uint8, device="cuda")
    target = torch.empty_like(source)
    for _ in range(3):
        target.copy_(source)
    seconds = median_seconds(torch, lambda: target.copy_(source))
    return 2.0 * source.numel() / seconds


def fp8_cube_product(torch):
    generator = torch.Generator(device="cuda").manual_seed(0)
    a = (torch.randn(FP8_CUBE, FP8_CUBE, device="cuda", generator=generator) * 0.5).to(torch.float8_e4m3fn)
    b = (torch.randn(FP8_CUBE, FP8_CUBE, device="cuda", generator=generator) * 0.5).to(torch.float8_e4m3fn)
    scale_a = torch.rand(FP8_CUBE, 1, device="cuda", generator=generator) + 0.5
    scale_b = torch.rand(1, FP8_CUBE, device="cuda", generator=generator) + 0.5
    b_columns = b.t()

    def product():
        return torch._scaled_mm(a, b_columns, scale_a=scale_a, scale_b=scale_b, out_dtype=torch.bfloat16)

    return product


def fp8_dense_rate(torch):
    product = fp8_cube_product(torch)
    for _ in range(3):
        product()
    seconds = median_seconds(torch, product)
    return 2.0 * FP8_CUBE ** 3 / seconds


def fp8_sustained_rate(torch, seconds=SUSTAINED_SECONDS, batch=SUSTAINED_BATCH):
    product = fp8_cube_product(torch)
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    settle_until = time.perf_counter() + seconds - 1.0
    while time.perf_counter() < settle_until:
        for _ in range(batch):
            product()
        torch.cuda.synchronize()
    start.record()
    count = 0
    measure_until = time.perf_counter() + 1.0
    while time.perf_counter() < measure_until:
        for _ in range(batch):
            product()
        count += batch
    stop.record()
    stop.synchronize()
    return 2.0 * FP8_CUBE ** 3 * count / (start.elapsed_time(stop) * 1e-3)


def binary_command(path, with_high, block_scales, gpus, gated):
    command = [path] + (["--with-high"] if with_high else []) + (["--block-scales"] if block_scales else [])
    command += ["--gated"] if gated else []
    return command + ["--gpus", str(gpus)]


def run_binary(path, with_high, block_scales, gpus, gated):
    command = binary_command(path, with_high, block_scales, gpus, gated)
    completed = subprocess.run(command, capture_output=True, text=True, check=False)
    records = [json.loads(line) for line in completed.stdout.splitlines() if line.startswith("{")]
    failure = None
    if completed.returncode != 0:
        failure = f"{path} failed with exit status {completed.returncode}: {completed.stderr.strip()}"
    return records, failure


def table_rows(records, kind, bandwidth, fp8_rate):
    by_key = {}
    for record in records:
        if record.get("kind") == kind:
            by_key.setdefault((record["matrix"], record["rows"]), {})[record["path"]] = record
    lines = []
    for (matrix, rows), paths in by_key.items():
        native = paths.get("native")
        high = paths.get("high")
        cells = [matrix, str(rows)]
        for record in (native, high):
            if record is None:
                cells += ["", "", ""]
                continue
            seconds = record["seconds"]
            if kind in ("prefill", "grouped_prefill"):
                rate = record["flops"] / seconds
                cells += [f"{seconds * 1e6:.1f}", f"{rate * 1e-12:.0f}", f"{100 * rate / fp8_rate:.1f}%"]
            else:
                rate = record["weight_bytes"] / seconds
                cells += [f"{seconds * 1e6:.1f}", f"{rate * 1e-9:.0f}", f"{100 * rate / bandwidth:.1f}%"]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def main(argv):
    args = parse_args(argv)
    import torch
    bandwidth = copy_bandwidth(torch)
    fp8_rate = fp8_dense_rate(torch)
    torch.cuda.empty_cache()
    records, failure = run_binary(args.binary, not args.no_high, args.block_scales, args.gpus, not args.ungated)
    device = next((r for r in records if r.get("kind") == "device"), {})
    print(f"device: {torch.cuda.get_device_name()}, {device.get('num_sms', 0)} SMs, FP8 weight scales: "
          f"{device.get('scales', 'unknown')}; gate-up epilogue: "
          f"{'both halves in FP32' if args.ungated else 'SiLU(gate) x up, as a step runs it'}")
    print(f"copy bandwidth (torch copy_, bytes read + written): {bandwidth * 1e-12:.2f} TB/s; "
          f"cudaMemcpy in the binary: {device.get('copy_bytes_per_second', 0.0) * 1e-12:.2f} TB/s")
    print(f"FP8 dense rate (torch._scaled_mm {FP8_CUBE}^3, row and column scales): {fp8_rate * 1e-12:.0f} TFLOP/s")
    header = "| matrix | rows | native us | {0} | {1} | high us | {0} | {1} |"
    divider = "|---|---|---|---|---|---|---|---|"
    for kind, title, units in (("decode", "Decode shapes: weight bytes over kernel time", ("GB/s", "of copy")),
                               ("grouped", "Grouped experts, 256 tokens x top-8 over 160 experts: touched experts' "
                                           "bytes over kernel time", ("GB/s", "of copy")),
                               ("prefill", "Prefill shapes at 2048 rows", ("TFLOP/s", "of FP8 rate")),
                               ("grouped_prefill", "Grouped experts, 2048 tokens x top-8 over 160 experts (a prefill "
                                                   "step)", ("TFLOP/s", "of FP8 rate"))):
        print()
        print(title)
        print(header.format(*units))
        print(divider)
        for line in table_rows(records, kind, bandwidth, fp8_rate):
            print(line)
    if args.json:
        Path(args.json).write_text(json.dumps({"copy_bytes_per_second": bandwidth, "fp8_flops_per_second": fp8_rate,
                                               "records": records}, indent=1))
    if failure is not None:
        print(failure, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
