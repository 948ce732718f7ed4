import argparse
import json
import os
import random
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
LISTENING = re.compile(r"listening on (?:ws|http)://[0-9.]+:([0-9]+)")
TINY_MODEL = dict(hidden_size=256, num_hidden_layers=2, first_k_dense_replace=1, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=64, intermediate_size=512, moe_intermediate_size=128)


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="bench/serve_ceiling.py",
                                     description="The serving stack's ceiling: a tiny model, the server and several "
                                                 "load generators, beside the engine alone at the same batch.")
    parser.add_argument("--tree", action="append", default=[],
                        help="repository tree to serve from (repeatable; default: this one)")
    parser.add_argument("--apis", default="responses-ws,chat-sse", help="load generator APIs (new layout only)")
    parser.add_argument("--backend", default="cuda")
    parser.add_argument("--clients", type=int, default=4, help="load generator processes")
    parser.add_argument("--concurrency", type=int, default=64, help="streams per load generator")
    parser.add_argument("--duration", type=float, default=30.0)
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--gen-len", type=int, default=256)
    parser.add_argument("--engine-steps", type=int, default=400)
    parser.add_argument("--glm-moe-layers", type=int, default=0,
                        help="serve the GLM-4.7-FP8 shape (3 dense + N MoE layers, random weights on the GPU, a "
                             "tokenizer of the real vocabulary size) instead of the tiny model")
    parser.add_argument("--variant", action="append", default=[],
                        help="extra server arguments, one server run each (repeatable; default: none)")
    parser.add_argument("--json", default=None)
    return parser.parse_args(argv)


def write_tiny_model(out_dir):
    sys.path.insert(0, str(REPO_ROOT))
    from glmrt.testmodel.writer import write_test_model

    return write_test_model(out_dir, seed=0, weight_format="bf16", **TINY_MODEL)


def write_glm_shape(parent, moe_layers):
    sys.path.insert(0, str(REPO_ROOT))
    from bench.gpu_bench import GLM47_CONFIG, write_model_dir
    from glmrt.testmodel.tokenizer import write_tokenizer_files

    dense = json.loads(GLM47_CONFIG.read_text())["first_k_dense_replace"]
    model_dir, config = write_model_dir(dense + moe_layers, parent=parent)
    write_tokenizer_files(model_dir, config["vocab_size"], config["max_position_embeddings"])
    return model_dir


def model_options(args):
    return ["--random-weights"] if args.glm_moe_layers > 0 else []


def server_engine_options(args):
    batch = args.clients * args.concurrency
    return dict(max_batch=batch, max_tokens_per_step=max(batch, 512),
                kv_num_pages=batch * ((args.prompt_len + args.gen_len) // 16 + 4))


def tree_environment(tree):
    inherited = os.environ.get("PYTHONPATH")
    return dict(os.environ, PYTHONPATH=str(tree) + (os.pathsep + inherited if inherited else ""))


def tree_layout(tree):
    new = (Path(tree) / "glmrt" / "tools" / "loadgen.py").exists()
    return {"new": new, "loadgen": "glmrt.tools.loadgen" if new else "glmrt.loadgen"}


def http_text(url):
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.read().decode()


SERVER_COUNTERS = {
    "steps": "glmrt:step_duration_seconds_count",
    "step_seconds": "glmrt:step_duration_seconds_sum",
    "batch_sum": "glmrt:step_batch_size_sum",
    "tokens": "glmrt:generation_tokens_total",
    "device_seconds": "glmrt:device_forward_seconds_total",
    "gap_seconds": "glmrt:step_gap_seconds_total",
    "gaps": "glmrt:step_gaps_total",
    "preemptions": "glmrt:num_preemptions_total",
}


def metric(text, name):
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and not line.startswith("#"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def server_counters(port):
    text = http_text(f"http://127.0.0.1:{port}/metrics")
    return {name: metric(text, sample) for name, sample in SERVER_COUNTERS.items()}


def counter_deltas(before, after):
    return {name: after[name] - before[name] for name in SERVER_COUNTERS}


def wait_ready(process, log_path, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        match = LISTENING.search(Path(log_path).read_text(errors="replace"))
        if match:
            port = int(match.group(1))
            try:
                if "ok" in http_text(f"http://127.0.0.1:{port}/readyz"):
                    return port
            except OSError:
                pass
        if process.poll() is not None:
            raise RuntimeError(f"the server exited with {process.returncode}:\n{Path(log_path).read_text()}")
        time.sleep(0.2)
    raise TimeoutError(f"the server was not ready after {timeout:g} s")


def start_server(tree, model_dir, args, log_path, variant):
    options = server_engine_options(args)
    command = [sys.executable, "server.py", "--model", str(model_dir), "--backend", args.backend, "--port", "0",
               "--max-batch", str(options["max_batch"]), "--max-tokens-per-step", str(options["max_tokens_per_step"]),
               "--kv-pages", str(options["kv_num_pages"]), "--max-queued", str(options["max_batch"])]
    command += model_options(args) + shlex.split(variant)
    env = tree_environment(tree)
    with open(log_path, "w") as log:
        process = subprocess.Popen(command, cwd=tree, stdout=log, stderr=subprocess.STDOUT, env=env)
    return process, wait_ready(process, log_path, 300)


def run_load(tree, port, api, args, out_dir):
    layout = tree_layout(tree)
    processes = []
    for index in range(args.clients):
        json_path = Path(out_dir) / f"load-{index}.json"
        command = [sys.executable, "-m", layout["loadgen"], "--url", f"ws://127.0.0.1:{port}", "--concurrency",
                   str(args.concurrency), "--duration", str(args.duration), "--prompt-len", str(args.prompt_len),
                   "--gen-len", str(args.gen_len), "--seed", str(index), "--json", str(json_path)]
        if layout["new"]:
            command += ["--api", api]
        processes.append((subprocess.Popen(command, cwd=tree, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                           env=tree_environment(tree)), json_path))
    before = server_counters(port)
    started = time.monotonic()
    time.sleep(args.duration)
    delta = counter_deltas(before, server_counters(port))
    elapsed = time.monotonic() - started
    results = []
    for process, json_path in processes:
        process.wait(timeout=args.duration + 120)
        results.append(json.loads(json_path.read_text()))
    steps = delta["steps"]
    errors = {}
    for result in results:
        for kind, count in (result.get("errors") or {}).items():
            errors[kind] = errors.get(kind, 0) + count
    device = delta["device_seconds"]
    return {"steps_per_s": steps / elapsed, "server_tokens_per_s": delta["tokens"] / elapsed,
            "client_tokens_per_s": sum(result.get("output_tokens_per_s", 0.0) for result in results),
            "mean_batch": delta["batch_sum"] / steps if steps else 0.0,
            "mean_step_ms": 1e3 * delta["step_seconds"] / steps if steps else 0.0,
            "mean_gap_ms": 1e3 * delta["gap_seconds"] / delta["gaps"] if delta["gaps"] else None,
            "mean_device_ms": 1e3 * device / steps if steps and device > 0 else None,
            "errors": sum(errors.values()), "error_kinds": errors}


def mean_gap_ms(before, after):
    gaps = after.step_gaps - before.step_gaps
    return (after.step_gap_ns - before.step_gap_ns) / gaps / 1e6 if gaps else None


def mean_device_ms(before, after, steps):
    return (after.device_forward_ns - before.device_forward_ns) / steps / 1e6 if steps else None


def ms_text(value):
    return "n/a" if value is None else f"{value:.3f} ms"


def engine_ceiling(model_dir, args):
    sys.path.insert(0, str(REPO_ROOT))
    from glmrt.engine.engine import Engine, SamplingParams

    options = server_engine_options(args)
    batch = options["max_batch"]
    options["kv_num_pages"] = batch * ((args.prompt_len + args.engine_steps) // 16 + 4)
    with Engine(model_dir, backend=args.backend, random_weights=args.glm_moe_layers > 0, **options) as engine:
        params = SamplingParams(temperature=1.0, max_new_tokens=args.engine_steps + 64, ignore_eos=True)
        requests = [engine.create_request([(index * 7 + position) % 1000 + 3 for position in range(args.prompt_len)],
                                          params) for index in range(batch)]
        for _ in range(4):
            engine.step(requests)
        started = time.perf_counter()
        for _ in range(args.engine_steps):
            engine.step(requests)
        elapsed = time.perf_counter() - started
    return {"steps_per_s": args.engine_steps / elapsed, "tokens_per_s": args.engine_steps * batch / elapsed}


class ClosedLoopStreams:
    def __init__(self, engine, scheduler, request_type, params_type, args, seed):
        self.engine = engine
        self.scheduler = scheduler
        self.request_type = request_type
        self.params_type = params_type
        self.rng = random.Random(seed)
        self.prompt_len = args.prompt_len
        self.gen_len = args.gen_len
        self.num_failed = 0

    def submit(self, owner):
        prompt = [self.rng.randrange(self.engine.vocab_size) for _ in range(self.prompt_len)]
        params = self.params_type(temperature=1.0, max_new_tokens=self.gen_len, ignore_eos=True,
                                  seed=self.rng.getrandbits(32))
        request = self.engine.open_request(self.request_type(prompt, params, owner=owner))
        self.scheduler.add(request)

    def replace(self, request):
        self.engine.free_request(request)
        self.submit(request.owner)

    def retire_all(self):
        for request in self.scheduler.all_requests():
            self.scheduler.cancel(request.request_id)
            self.engine.free_request(request)


def engine_workload(model_dir, args):
    sys.path.insert(0, str(REPO_ROOT))
    from glmrt.engine.engine import Engine, SamplingParams
    from glmrt.engine.request import Request
    from glmrt.engine.scheduler import Scheduler, SchedulerPolicy

    options = server_engine_options(args)
    batch = options["max_batch"]
    with Engine(model_dir, backend=args.backend, random_weights=args.glm_moe_layers > 0, **options) as engine:
        scheduler = Scheduler(engine, SchedulerPolicy(max_running=min(batch, engine.max_batch)))
        streams = ClosedLoopStreams(engine, scheduler, Request, SamplingParams, args, seed=0)
        for index in range(batch):
            streams.submit(f"stream:{index}")
        steps = tokens = batch_sum = 0
        busy = 0.0
        stats_before = engine.stats()
        started = time.perf_counter()
        try:
            while time.perf_counter() - started < args.duration:
                step_started = time.perf_counter()
                result = scheduler.step()
                step_seconds = time.perf_counter() - step_started
                for request in result.failed:
                    streams.num_failed += 1
                    streams.replace(request)
                if not result.batch:
                    continue
                steps += 1
                busy += step_seconds
                batch_sum += len(result.batch)
                tokens += sum(1 for token in result.tokens if token >= 0)
                for request in result.finished_requests:
                    streams.replace(request)
            elapsed = time.perf_counter() - started
            stats_after = engine.stats()
        finally:
            streams.retire_all()
        engine.check_invariants()
    return {"steps_per_s": steps / elapsed, "tokens_per_s": tokens / elapsed,
            "mean_batch": batch_sum / steps if steps else 0.0, "mean_step_ms": 1e3 * busy / steps if steps else 0.0,
            "mean_gap_ms": mean_gap_ms(stats_before, stats_after),
            "mean_device_ms": mean_device_ms(stats_before, stats_after, steps), "steps": steps, "seconds": elapsed,
            "failed_requests": streams.num_failed}


def serve_once(tree, model_dir, args, work, variant, api):
    log_path = Path(work) / "server.log"
    process, port = start_server(tree, model_dir, args, log_path, variant)
    try:
        result = run_load(tree, port, api, args, work)
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=120)
    print(f"{tree} [{variant}] {api}: {result['steps_per_s']:.1f} steps/s, server {result['server_tokens_per_s']:.0f} "
          f"tokens/s, clients {result['client_tokens_per_s']:.0f} tokens/s, mean batch {result['mean_batch']:.1f}, "
          f"mean step {result['mean_step_ms']:.2f} ms, device {ms_text(result['mean_device_ms'])} a step, "
          f"host gap between steps {ms_text(result['mean_gap_ms'])}, "
          f"errors {result['error_kinds'] or 'none'}", flush=True)
    return dict(tree=tree, variant=variant, api=api, **result)


def share(part, whole):
    return part / whole if whole > 0 else None


def percent_text(fraction):
    return "n/a" if fraction is None else f"{fraction:.1%}"


def main(argv=None):
    args = parse_args(argv)
    trees = [str(Path(tree).resolve()) for tree in args.tree] or [str(REPO_ROOT)]
    rows = []
    with tempfile.TemporaryDirectory() as work:
        if args.glm_moe_layers > 0:
            model_dir = write_glm_shape(work, args.glm_moe_layers)
        else:
            model_dir = write_tiny_model(Path(work) / "tiny")
        batch = args.clients * args.concurrency
        engine = engine_ceiling(model_dir, args)
        print(f"engine alone, decode only, batch {batch}: {engine['steps_per_s']:.1f} steps/s, "
              f"{engine['tokens_per_s']:.0f} tokens/s", flush=True)
        workload = engine_workload(model_dir, args)
        print(f"engine alone, the server's workload, batch {batch} (prompts of {args.prompt_len}, {args.gen_len} "
              f"generated, {args.duration:g} s): {workload['steps_per_s']:.1f} steps/s, "
              f"{workload['tokens_per_s']:.0f} tokens/s, mean batch {workload['mean_batch']:.1f}, "
              f"mean step {workload['mean_step_ms']:.2f} ms, device {ms_text(workload['mean_device_ms'])} a step, "
              f"host gap between steps {ms_text(workload['mean_gap_ms'])}, "
              f"failed requests {workload['failed_requests']}",
              flush=True)
        for tree in trees:
            apis = args.apis.split(",") if tree_layout(tree)["new"] else ["websocket"]
            for variant in args.variant or [""]:
                for api in apis:
                    rows.append(serve_once(tree, model_dir, args, work, variant, api))
    for row in rows:
        row["of_engine_decode_only"] = share(row["steps_per_s"], engine["steps_per_s"])
        row["of_engine_workload"] = share(row["steps_per_s"], workload["steps_per_s"])
    print("| tree | server arguments | api | steps/s | server tokens/s | client tokens/s | "
          "of the engine's decode-only step rate | of the engine's step rate on the server's workload |")
    print("|---|---|---|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['tree']} | {row['variant']} | {row['api']} | {row['steps_per_s']:.1f} | "
              f"{row['server_tokens_per_s']:.0f} | {row['client_tokens_per_s']:.0f} | "
              f"{percent_text(row['of_engine_decode_only'])} | {percent_text(row['of_engine_workload'])} |")
    if args.json:
        Path(args.json).write_text(json.dumps({"engine": engine, "engine_workload": workload, "rows": rows},
                                              indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
