import argparse
import csv
import json
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from bench.gpu_bench import GLM47_CONFIG, PAGE_SIZE, fill_contexts, random_prompt, write_model_dir
from glmrt.engine.engine import Engine, SamplingParams


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="bench/step_profile.py",
                                     description="Where a CUDA decode step goes: every kernel's time and launches "
                                                 "per step under torch.profiler, at the GLM-4.7-FP8 shape.")
    parser.add_argument("--moe-layers", type=int, default=4)
    parser.add_argument("--batches", default="1,64,256")
    parser.add_argument("--context", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--num-devices", type=int, default=1,
                        help="split the model over this many GPUs; the tables give the mean of one GPU")
    parser.add_argument("--top", type=int, default=16, help="kernels listed per batch")
    parser.add_argument("--decode-graphs", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--dependent-launches", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--all-reduce", choices=("auto", "peer", "nccl", "peer-bf16"), default="auto")
    parser.add_argument("--expert-split", choices=("whole", "columns"), default="whole")
    parser.add_argument("--matmul-precision", default="default", choices=("default", "native", "high"))
    parser.add_argument("--launches", default="",
                        help="comma-separated parts of kernel names: list each launch of one step in order, with its time")
    parser.add_argument("--prefill-prompts", type=int, default=0,
                        help="also profile the prefill of this many fresh prompts of --context tokens")
    parser.add_argument("--temperature", type=float, default=0.0,
                        help="the decode requests' temperature: above 0 every step sorts each row's logits to sample")
    parser.add_argument("--json", help="write the tables to this file")
    parser.add_argument("--trace", help="write each batch's kernel timeline (device, stream, start, length, name) "
                                        "and its CUDA API calls on the host (thread, start, length, call) as CSV "
                                        "files beginning with this path")
    return parser.parse_args(argv)


def short_name(name):
    base = name.split("(")[0]
    if base.startswith("void "):
        base = base[5:]
    return base.split("<")[0][:60]


def kernel_events(profiler):
    events = []
    for event in profiler.events():
        kind = str(getattr(event, "device_type", ""))
        if "CUDA" in kind and event.device_time_total > 0 and "Memcpy" not in event.name \
                and "Memset" not in event.name:
            events.append(event)
    return events


def launch_sequence(events, name_parts, steps):
    sequences = {}
    for name_part in (part for part in name_parts.split(",") if part):
        chosen = sorted((event for event in events if name_part in short_name(event.name)),
                        key=lambda event: event.time_range.start)
        per_step = len(chosen) // steps if steps else 0
        sequences[name_part] = [dict(name=short_name(event.name), us=event.device_time_total)
                                for event in chosen[:per_step]]
    return sequences


def step_table(profiler, steps, wall, launches_of, label, num_devices):
    per_kernel = defaultdict(lambda: [0, 0.0])
    events = kernel_events(profiler)
    device_steps = steps * num_devices
    sequence = launch_sequence(events, launches_of, device_steps)
    for event in events:
        entry = per_kernel[short_name(event.name)]
        entry[0] += 1
        entry[1] += event.device_time_total
    gpu_us = sum(entry[1] for entry in per_kernel.values()) / device_steps
    launches = sum(entry[0] for entry in per_kernel.values()) / device_steps
    kernels = sorted(((name, count / device_steps, total / device_steps)
                      for name, (count, total) in per_kernel.items()), key=lambda row: -row[2])
    return dict(batch=label, wall_us=1e6 * wall / steps, gpu_us=gpu_us, launches=launches,
                kernels=[dict(name=n, per_step=c, us=u) for n, c, u in kernels], sequence=sequence)


def write_timeline(profiler, path):
    with tempfile.TemporaryDirectory() as scratch:
        trace_path = Path(scratch) / "trace.json"
        profiler.export_chrome_trace(str(trace_path))
        events = json.loads(trace_path.read_text()).get("traceEvents", [])
    kernels = sorted((event for event in events if event.get("cat") == "kernel"),
                     key=lambda event: (event["args"].get("device", 0), event["ts"]))
    with open(f"{path}.csv", "w", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(["device", "stream", "start_us", "us", "kernel"])
        for event in kernels:
            writer.writerow([event["args"].get("device", 0), event["args"].get("stream", 0),
                             f"{event['ts']:.3f}", f"{event.get('dur', 0):.3f}", short_name(event["name"])])
    calls = sorted((event for event in events if event.get("cat") in ("cuda_runtime", "cuda_driver")),
                   key=lambda event: event["ts"])
    with open(f"{path}-host.csv", "w", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(["thread", "start_us", "us", "call"])
        for event in calls:
            writer.writerow([event.get("tid", 0), f"{event['ts']:.3f}", f"{event.get('dur', 0):.3f}", event["name"]])


def profile_batch(torch, engine, requests, steps, num_devices, launches_of="", trace=None):
    from torch.profiler import ProfilerActivity, profile

    for _ in range(2):
        engine.step(requests)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as profiler:
        start = time.perf_counter()
        for _ in range(steps):
            engine.step(requests)
        wall = time.perf_counter() - start
    if trace:
        write_timeline(profiler, f"{trace}-batch{len(requests)}")
    return step_table(profiler, steps, wall, launches_of, len(requests), num_devices)


def profile_prefill(torch, engine, prompts, params, num_devices, launches_of="", trace=None):
    from torch.profiler import ProfilerActivity, profile

    requests = [engine.create_request(prompt, params) for prompt in prompts]
    steps = 0
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as profiler:
        start = time.perf_counter()
        pending = list(requests)
        while pending:
            step_tokens, _ = engine.step(pending)
            steps += 1
            pending = [request for request, token in zip(pending, step_tokens) if token < 0]
        torch.cuda.synchronize()
        wall = time.perf_counter() - start
    for request in requests:
        engine.free_request(request)
    if trace:
        write_timeline(profiler, f"{trace}-prefill{len(prompts)}")
    tokens = sum(len(prompt) for prompt in prompts)
    return step_table(profiler, steps, wall, launches_of,
                      f"prefill of {len(prompts)} prompts, {tokens} tokens in {steps} steps", num_devices)


def print_batch(row, top, layers):
    wall, gpu = row["wall_us"], row["gpu_us"]
    print(f"\nbatch {row['batch']}: step {wall:.0f} us wall, kernels {gpu:.0f} us ({100 * gpu / wall:.1f}% of the "
          f"wall time), {row['launches']:.0f} kernels a step ({row['launches'] / layers:.1f} a layer)")
    print("| kernel | launches a step | us a step | share of kernel time |")
    print("|---|---|---|---|")
    for kernel in row["kernels"][:top]:
        print(f"| {kernel['name']} | {kernel['per_step']:.0f} | {kernel['us']:.1f} | "
              f"{100 * kernel['us'] / gpu:.1f}% |")
    for name_part, launches in row["sequence"].items():
        print(f"{name_part} launches of one step in order: " + ", ".join(f"{launch['us']:.1f}" for launch in launches))


def main(argv):
    args = parse_args(argv)
    import torch

    batches = [int(b) for b in args.batches.split(",") if b]
    dense = json.loads(GLM47_CONFIG.read_text())["first_k_dense_replace"]
    model_dir, config = write_model_dir(dense + args.moe_layers)
    largest = max(batches)
    new_tokens = len(batches) * (args.steps + 2) + 4
    pages = max(largest, args.prefill_prompts) * -(-(args.context + new_tokens + 1) // PAGE_SIZE) + 16
    engine = Engine(model_dir, backend="cuda", num_devices=args.num_devices, random_weights=True,
                    max_batch=max(largest, args.prefill_prompts),
                    max_tokens_per_step=max(2048, largest), kv_page_size=PAGE_SIZE, kv_num_pages=pages,
                    matmul_precision=args.matmul_precision, decode_graphs=args.decode_graphs,
                    dependent_launches=args.dependent_launches, all_reduce=args.all_reduce,
                    expert_split=args.expert_split)
    rng = np.random.default_rng(0)
    params = SamplingParams(temperature=args.temperature, seed=0, max_new_tokens=new_tokens, ignore_eos=True)
    requests = [engine.create_request(random_prompt(rng, args.context, config["vocab_size"]), params)
                for _ in range(largest)]
    fill_contexts(engine, requests)
    info = engine.info()
    print(f"{info.num_devices} x {info.device_name}, {config['num_hidden_layers']} layers ({args.moe_layers} MoE), "
          f"{info.num_decode_graphs} decode graphs, matmul precision {args.matmul_precision}")
    rows = [profile_batch(torch, engine, requests[:batch], args.steps, args.num_devices, args.launches, args.trace)
            for batch in batches]
    if args.prefill_prompts:
        for request in requests:
            engine.free_request(request)
        requests = []
        prompts = [random_prompt(rng, args.context, config["vocab_size"]) for _ in range(args.prefill_prompts)]
        prefill_params = SamplingParams(temperature=0.0, max_new_tokens=1, ignore_eos=True)
        rows.append(profile_prefill(torch, engine, prompts, prefill_params, args.num_devices, args.launches,
                                    args.trace))
    for row in rows:
        print_batch(row, args.top, config["num_hidden_layers"])
    for request in requests:
        engine.free_request(request)
    engine.close()
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
