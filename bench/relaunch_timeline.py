import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from bench.gpu_bench import GLM47_CONFIG, PAGE_SIZE, fill_contexts, random_prompt, write_model_dir
from glmrt.engine.engine import Engine, SamplingParams

GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="bench/relaunch_timeline.py",
                                     description="What the GPU runs between two decode steps relaunched by the native "
                                                 "core (the server's loop), from torch.profiler: the last operations "
                                                 "of one step and the first of the next, with the gaps between them.")
    parser.add_argument("--moe-layers", type=int, default=4)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--context", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--launch-ahead", choices=("auto", "off", "always"), default="auto")
    parser.add_argument("--tail", type=int, default=8, help="operations listed before the next step's first kernel")
    return parser.parse_args(argv)


def profiled_events(torch, engine, steps):
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as profiler:
        start = time.perf_counter()
        for _ in range(steps):
            engine.complete_and_relaunch()
        wall = time.perf_counter() - start
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "trace.json"
        profiler.export_chrome_trace(str(path))
        events = json.loads(path.read_text()).get("traceEvents", [])
    return wall, sorted((e for e in events if e.get("cat") in GPU_CATEGORIES), key=lambda e: e["ts"])


def print_boundary(operations, tail):
    starts = [i for i, e in enumerate(operations) if "embed_kernel" in e["name"]]
    if len(starts) < 3:
        print("fewer than three steps on the timeline")
        return
    first, second = starts[-3], starts[-2]
    origin = operations[first]["ts"]
    print(f"one step from its first kernel to the next step's: {operations[second]['ts'] - origin:.1f} us")
    print("| at us | idle before us | us | kind | name |")
    print("|---|---|---|---|---|")
    frontier = origin
    for index in range(first, min(len(operations), second + 2)):
        e = operations[index]
        idle = max(0.0, e["ts"] - frontier)
        if index >= second - tail:
            print(f"| {e['ts'] - origin:.1f} | {idle:.1f} | {e.get('dur', 0):.1f} | {e['cat']} | {e['name'][:60]} |")
        frontier = max(frontier, e["ts"] + e.get("dur", 0))


def main(argv):
    args = parse_args(argv)
    import torch

    dense = json.loads(GLM47_CONFIG.read_text())["first_k_dense_replace"]
    model_dir, config = write_model_dir(dense + args.moe_layers)
    new_tokens = args.steps + 16
    pages = args.batch * -(-(args.context + new_tokens + 1) // PAGE_SIZE) + 16
    engine = Engine(model_dir, backend="cuda", random_weights=True, max_batch=args.batch,
                    max_tokens_per_step=max(2048, args.batch), kv_page_size=PAGE_SIZE, kv_num_pages=pages,
                    launch_ahead=args.launch_ahead)
    rng = np.random.default_rng(0)
    params = SamplingParams(temperature=0.0, max_new_tokens=new_tokens, ignore_eos=True)
    requests = [engine.create_request(random_prompt(rng, args.context, config["vocab_size"]), params)
                for _ in range(args.batch)]
    fill_contexts(engine, requests)
    engine.launch(requests)
    for _ in range(5):
        engine.complete_and_relaunch()
    wall, operations = profiled_events(torch, engine, args.steps)
    engine.complete()
    info = engine.info()
    print(f"{info.device_name}, batch {args.batch}, launched ahead: {'yes' if info.launch_ahead else 'no'}, "
          f"{1e6 * wall / args.steps:.0f} us a step under the profiler")
    print_boundary(operations, args.tail)
    for request in requests:
        engine.free_request(request)
    engine.close()


if __name__ == "__main__":
    main(sys.argv[1:])
