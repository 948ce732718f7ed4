import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from bench.serve_ceiling import counter_deltas, server_counters, wait_ready


def parse_args(argv):
    parser = argparse.ArgumentParser(
        prog="bench/serve_glm.py",
        description="The server at the GLM-4.7-FP8 shape (random weights made on the GPUs, a tokenizer of the real "
                    "vocabulary size) under the load generator: start it detached, load it as often as wanted, "
                    "stop it. The server outlives each command, so one device call can load it and later calls "
                    "measure it.")
    commands = parser.add_subparsers(dest="command", required=True)
    start = commands.add_parser("start", help="write the model directory, start the server, wait until it is ready")
    start.add_argument("--state", required=True, help="JSON file the later commands read")
    start.add_argument("--work", required=True, help="directory for the model directory and the server log")
    start.add_argument("--model", default=None,
                       help="serve this checkpoint instead of the GLM-4.7-FP8 shape with random weights")
    start.add_argument("--layers", type=int, default=None, help="decoder layers (default: the config's 92)")
    start.add_argument("--backend", default="cuda")
    start.add_argument("--num-devices", type=int, default=1)
    start.add_argument("--max-batch", type=int, default=256)
    start.add_argument("--max-tokens-per-step", type=int, default=2048)
    start.add_argument("--ready-timeout", type=float, default=1200.0)
    start.add_argument("--server-arg", action="append", default=[],
                       help="one more server argument (repeatable), such as --server-arg=--no-decode-graphs")
    start.add_argument("--bandwidth", action=argparse.BooleanOptionalAction, default=True,
                       help="measure GPU 0's copy bandwidth before the server starts, for the roofline column "
                            "(CUDA backend; on by default)")
    load = commands.add_parser("load", help="run the load generator against the started server")
    load.add_argument("--state", required=True)
    load.add_argument("--api", default="responses-ws", help="responses-ws or chat-sse")
    load.add_argument("--concurrency", type=int, default=64)
    load.add_argument("--duration", type=float, default=300.0)
    load.add_argument("--prompt-len", type=int, default=1024)
    load.add_argument("--gen-len", type=int, default=1024)
    load.add_argument("--seed", type=int, default=0)
    stop = commands.add_parser("stop", help="stop the server and print the end of its log")
    stop.add_argument("--state", required=True)
    commands.add_parser("bandwidth", help="print GPU 0's copy bandwidth in bytes/s (what start runs first)")
    return parser.parse_args(argv)


def bandwidth(args):
    import torch

    from bench.gpu_bench import copy_bandwidth

    print(json.dumps({"bytes_per_s": copy_bandwidth(torch)}))
    return 0


def measure_bandwidth():
    finished = subprocess.run([sys.executable, str(Path(__file__).resolve()), "bandwidth"], cwd=REPO_ROOT,
                              capture_output=True, text=True)
    if finished.returncode != 0:
        raise RuntimeError(f"measuring the copy bandwidth failed:\n{finished.stderr[-2000:]}")
    return json.loads(finished.stdout.strip().splitlines()[-1])["bytes_per_s"]


def decode_roofline(model_dir, num_devices, bytes_per_s, mean_batch, context, device_ms):
    from bench.gpu_bench import decode_step_bytes

    if not bytes_per_s or not mean_batch or not device_ms:
        return None
    config = json.loads((Path(model_dir) / "config.json").read_text())
    weights, kv_read = decode_step_bytes(config, mean_batch, context)
    floor_ms = 1e3 * (weights + kv_read) / (num_devices * bytes_per_s)
    return floor_ms / device_ms


def write_glm_model(work, layers):
    from bench.gpu_bench import GLM47_CONFIG, write_model_dir
    from glmrt.testmodel.tokenizer import write_tokenizer_files

    total = layers if layers is not None else json.loads(GLM47_CONFIG.read_text())["num_hidden_layers"]
    model_dir, config = write_model_dir(total, parent=work)
    write_tokenizer_files(model_dir, config["vocab_size"], config["max_position_embeddings"])
    return model_dir


def server_command(args, model_dir):
    command = [sys.executable, "server.py", "--model", str(model_dir), "--backend", args.backend, "--port", "0",
               "--num-devices", str(args.num_devices), "--max-batch", str(args.max_batch),
               "--max-tokens-per-step", str(args.max_tokens_per_step), "--max-queued", str(args.max_batch)]
    if args.model is None:
        command.append("--random-weights")
    return command + args.server_arg


def start(args):
    work = Path(args.work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    model_dir = Path(args.model).resolve() if args.model else write_glm_model(work, args.layers)
    bytes_per_s = measure_bandwidth() if args.bandwidth and args.backend == "cuda" else None
    log_path = work / "server.log"
    env = dict(os.environ, NCCL_NVLS_ENABLE="0")
    started = time.monotonic()
    with open(log_path, "w") as log:
        process = subprocess.Popen(server_command(args, model_dir), cwd=REPO_ROOT, stdout=log,
                                   stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        port = wait_ready(process, log_path, args.ready_timeout)
    except (RuntimeError, TimeoutError):
        stop_child(process)
        raise
    ready_seconds = time.monotonic() - started
    state = {"pid": process.pid, "port": port, "model_dir": str(model_dir), "log": str(log_path),
             "num_devices": args.num_devices, "max_batch": args.max_batch, "ready_seconds": ready_seconds,
             "bandwidth_bytes_per_s": bytes_per_s, "runs": []}
    Path(args.state).write_text(json.dumps(state, indent=2))
    print(f"server ready in {ready_seconds:.1f} s on port {port} (pid {process.pid}, {args.num_devices} device(s), "
          f"model {model_dir})")
    if bytes_per_s:
        print(f"copy bandwidth of GPU 0 before the server started: {bytes_per_s / 1e12:.2f} TB/s")
    print(log_path.read_text(errors="replace")[-4000:])
    return 0


def server_summary(before, after, seconds):
    delta = counter_deltas(before, after)
    steps = delta["steps"]
    return {
        "steps_per_s": steps / seconds if seconds > 0 else 0.0,
        "server_tokens_per_s": delta["tokens"] / seconds if seconds > 0 else 0.0,
        "mean_batch": delta["batch_sum"] / steps if steps else None,
        "mean_step_ms": 1e3 * delta["step_seconds"] / steps if steps else None,
        "mean_device_ms": 1e3 * delta["device_seconds"] / steps if steps else None,
        "mean_gap_ms": 1e3 * delta["gap_seconds"] / delta["gaps"] if delta["gaps"] else None,
        "device_busy": delta["device_seconds"] / seconds if seconds > 0 else None,
        "preemptions": int(delta["preemptions"]),
        "window_s": seconds,
    }


def load_window_seconds(client, wall_seconds):
    window = client.get("duration_s")
    if window is None or window <= 0 or window > wall_seconds:
        return wall_seconds
    return window


def run_loadgen(state, args, json_path):
    scheme = "ws" if args.api.endswith("-ws") else "http"
    command = [sys.executable, "-m", "glmrt.tools.loadgen", "--url", f"{scheme}://127.0.0.1:{state['port']}",
               "--api", args.api, "--concurrency", str(args.concurrency), "--duration", str(args.duration),
               "--prompt-len", str(args.prompt_len), "--gen-len", str(args.gen_len), "--seed", str(args.seed),
               "--tokenizer", state["model_dir"], "--json", str(json_path)]
    log_path = json_path.with_suffix(".log")
    with open(log_path, "w") as log:
        finished = subprocess.run(command, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT)
    if finished.returncode != 0:
        raise RuntimeError(f"the load generator exited with {finished.returncode}:\n"
                           f"{log_path.read_text(errors='replace')[-4000:]}")
    return json.loads(json_path.read_text())


def number_text(value, digits=1):
    return "n/a" if value is None else f"{value:,.{digits}f}"


def load(args):
    state_path = Path(args.state)
    state = json.loads(state_path.read_text())
    json_path = Path(state["log"]).with_name(f"load-{args.api}-{args.concurrency}-{len(state['runs'])}.json")
    before = server_counters(state["port"])
    started = time.monotonic()
    client = run_loadgen(state, args, json_path)
    wall_seconds = time.monotonic() - started
    server = server_summary(before, server_counters(state["port"]), load_window_seconds(client, wall_seconds))
    server["loadgen_wall_s"] = wall_seconds
    server["decode_roofline"] = decode_roofline(state["model_dir"], state["num_devices"],
                                                state.get("bandwidth_bytes_per_s"), server["mean_batch"],
                                                args.prompt_len + args.gen_len / 2, server["mean_device_ms"])
    run = {"api": args.api, "concurrency": args.concurrency, "duration": args.duration,
           "prompt_len": args.prompt_len, "gen_len": args.gen_len, "client": client, "server": server}
    state["runs"].append(run)
    state_path.write_text(json.dumps(state, indent=2))
    print(f"{state['num_devices']} device(s), {args.api}, concurrency {args.concurrency}, prompts of "
          f"{args.prompt_len}, {args.gen_len} generated, {args.duration:g} s")
    print("| output tokens/s | TTFT p50 / p99 ms | ITL p50 / p99 ms | completed | errors | steps/s | mean batch | "
          "step ms | device ms a step | host gap ms | device busy | preemptions | roofline |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    print(f"| {number_text(client['output_tokens_per_s'])} | {client['ttft_ms_p50']} / {client['ttft_ms_p99']} | "
          f"{client['itl_ms_p50']} / {client['itl_ms_p99']} | {client['completed']} | {client['errors'] or 'none'} | "
          f"{number_text(server['steps_per_s'])} | {number_text(server['mean_batch'])} | "
          f"{number_text(server['mean_step_ms'], 2)} | {number_text(server['mean_device_ms'], 2)} | "
          f"{number_text(server['mean_gap_ms'], 3)} | "
          f"{'n/a' if server['device_busy'] is None else format(server['device_busy'], '.1%')} | "
          f"{server['preemptions']} | "
          f"{'n/a' if server['decode_roofline'] is None else format(server['decode_roofline'], '.1%')} |")
    print("roofline: the bytes of a decode step at the mean batch and the mean context (prompt plus half the "
          "generated tokens) over the GPUs' copy bandwidth, against the mean device time a step (steps that also "
          "prefill count too, so it is a lower bound)")
    print(f"steps/s and device busy: over the load generator's own {server['window_s']:.1f} s of load, not the "
          f"{wall_seconds:.1f} s its process ran (its start loads the tokenizer)")
    return 0


def stop_process(pid, timeout=120.0):
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.killpg(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.5)
    os.killpg(pid, signal.SIGKILL)


def stop_child(process, timeout=120.0):
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def stop(args):
    state = json.loads(Path(args.state).read_text())
    stop_process(state["pid"])
    print(Path(state["log"]).read_text(errors="replace")[-4000:])
    return 0


def main(argv=None):
    args = parse_args(argv)
    return {"start": start, "load": load, "stop": stop, "bandwidth": bandwidth}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
