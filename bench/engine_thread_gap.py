import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from bench.serve_ceiling import write_tiny_model
from glmrt.engine.engine import Engine, SamplingParams
from glmrt.engine.engine_thread import EngineThread, Finish
from glmrt.engine.request import Request
from glmrt.serve.metrics import ServerMetrics


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="bench/engine_thread_gap.py",
                                     description="The engine thread's serial host time: from a step's completion to "
                                                 "the next launch, under a closed-loop load of streams in-process.")
    parser.add_argument("--backend", default="cpu")
    parser.add_argument("--streams", type=int, default=256)
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--gen-len", type=int, default=64)
    parser.add_argument("--warmup", type=float, default=8.0, help="seconds before the measured window")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds measured")
    parser.add_argument("--threads", type=int, default=1, help="CPU backend compute threads")
    parser.add_argument("--switch-interval", type=float, default=0.0001)
    return parser.parse_args(argv)


class StepClock:
    def __init__(self):
        self.completed_at = None
        self.gaps = []
        self.recording = False
        self.launch = Engine.launch
        self.complete = Engine.complete

    def install(self):
        clock = self

        def timed_launch(engine, requests):
            if clock.recording and clock.completed_at is not None:
                clock.gaps.append(time.perf_counter() - clock.completed_at)
            clock.completed_at = None
            return clock.launch(engine, requests)

        def timed_complete(engine):
            outputs = clock.complete(engine)
            clock.completed_at = time.perf_counter()
            return outputs

        Engine.launch = timed_launch
        Engine.complete = timed_complete

    def remove(self):
        Engine.launch = self.launch
        Engine.complete = self.complete


async def closed_loop_stream(thread, loop, args, index, counts):
    serial = 0
    while True:
        prompt = [(index * 7 + serial * 13 + position) % 900 + 3 for position in range(args.prompt_len)]
        params = SamplingParams(temperature=1.0, max_new_tokens=args.gen_len, ignore_eos=True, seed=index * 1000 + serial)
        request = Request(prompt, params, loop, asyncio.Queue(), owner=f"stream-{index}")
        thread.submit(request)
        serial += 1
        while True:
            item = await request.queue.get()
            if isinstance(item, Finish):
                counts["finished"] += 1
                break
            counts["tokens"] += 1


async def measure(args, model_dir):
    sys.setswitchinterval(args.switch_interval)
    engine_options = dict(backend=args.backend, max_batch=args.streams, max_tokens_per_step=max(args.streams, 512),
                          kv_num_pages=args.streams * ((args.prompt_len + args.gen_len) // 16 + 4))
    if args.backend == "cpu":
        engine_options["num_threads"] = args.threads
    metrics = ServerMetrics()
    thread = EngineThread(lambda: Engine(model_dir, **engine_options), metrics, max_inbox=4 * args.streams)
    loop = asyncio.get_running_loop()
    loaded = loop.create_future()
    stopped = loop.create_future()
    thread.add_listener(loop, lambda: loaded.set_result(True), lambda: stopped.set_result(True))
    clock = StepClock()
    clock.install()
    try:
        thread.start()
        await asyncio.wait_for(loaded, 600)
        counts = {"tokens": 0, "finished": 0}
        tasks = [asyncio.create_task(closed_loop_stream(thread, loop, args, index, counts))
                 for index in range(args.streams)]
        await asyncio.sleep(args.warmup)
        counts.update(tokens=0, finished=0)
        clock.recording = True
        native_before = (metrics.seen_step_gap_ns, metrics.seen_step_gaps)
        started = time.perf_counter()
        await asyncio.sleep(args.duration)
        elapsed = time.perf_counter() - started
        native_after = (metrics.seen_step_gap_ns, metrics.seen_step_gaps)
        clock.recording = False
        thread.stop()
        await asyncio.wait_for(stopped, 120)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        clock.remove()
    gaps = clock.gaps
    if not gaps:
        raise RuntimeError("no step completed and launched again inside the measured window")
    native_gaps = native_after[1] - native_before[1]
    native_mean_ms = (native_after[0] - native_before[0]) / native_gaps / 1e6 if native_gaps else float("nan")
    return dict(steps=len(gaps), seconds=elapsed, tokens_per_s=counts["tokens"] / elapsed,
                native_gap_mean_ms=native_mean_ms,
                finished_per_step=counts["finished"] / len(gaps), gap_median_ms=1e3 * statistics.median(gaps),
                gap_mean_ms=1e3 * statistics.mean(gaps), gap_p90_ms=1e3 * statistics.quantiles(gaps, n=10)[-1])


def main(argv=None):
    args = parse_args(argv)
    with tempfile.TemporaryDirectory() as work:
        result = asyncio.run(measure(args, write_tiny_model(Path(work) / "tiny")))
    print(f"{args.streams} streams, prompts of {args.prompt_len}, {args.gen_len} generated, backend {args.backend}: "
          f"{result['steps']} steps in {result['seconds']:.1f} s, {result['tokens_per_s']:.0f} tokens/s, "
          f"{result['finished_per_step']:.2f} requests finished a step; completion to next launch: median "
          f"{result['gap_median_ms']:.3f} ms, mean {result['gap_mean_ms']:.3f} ms, p90 {result['gap_p90_ms']:.3f} ms; "
          f"the native core's step gap (lock hand-offs included): mean {result['native_gap_mean_ms']:.3f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
