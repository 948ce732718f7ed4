import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from bench.gpu_bench import PAGE_SIZE, device_forward_ns, fill_contexts, random_prompt, write_model_dir
from glmrt.engine.engine import Engine, SamplingParams


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="bench/mixed_step_bench.py",
                                     description="What a prefill chunk adds to a decode step at the GLM-4.7-FP8 shape: "
                                                 "a running batch of decode rows, then the same steps with new prompts "
                                                 "beside it, as a server's steps are under load.")
    parser.add_argument("--moe-layers", type=int, default=4, help="MoE layers after the dense ones")
    parser.add_argument("--num-devices", type=int, default=1)
    parser.add_argument("--all-reduce", choices=("auto", "peer", "nccl", "peer-bf16"), default="auto")
    parser.add_argument("--decode-rows", type=int, default=255, help="decode requests in every step")
    parser.add_argument("--context", type=int, default=1024, help="prompt tokens of every decode request")
    parser.add_argument("--chunks", default="0,256,1024,2048,4096",
                        help="prefill tokens added to a step, made of prompts of at most --prompt-tokens")
    parser.add_argument("--prompt-tokens", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=6, help="timed steps a chunk, after two untimed")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", type=Path, help="write every measurement to this file")
    return parser.parse_args(argv)


def chunk_sizes(text):
    sizes = [int(part) for part in text.split(",") if part.strip()]
    if not sizes or any(size < 0 for size in sizes):
        raise SystemExit(f"--chunks must list token counts of 0 or more, got {text!r}")
    return sorted(set(sizes) | {0})


def prompt_parts(chunk, prompt_tokens):
    return [min(prompt_tokens, chunk - start) for start in range(0, chunk, prompt_tokens)]


def open_engine(args, model_dir, chunks):
    steps_total = len(chunks) * (args.steps + 2) + 8
    largest = max(chunks)
    prompts_a_step = len(prompt_parts(largest, args.prompt_tokens))
    pages = args.decode_rows * math.ceil((args.context + steps_total + 1) / PAGE_SIZE) \
        + prompts_a_step * math.ceil((args.prompt_tokens + 2) / PAGE_SIZE) + 16
    return Engine(model_dir, backend="cuda", num_devices=args.num_devices, random_weights=True,
                  random_seed=args.seed, max_batch=args.decode_rows + prompts_a_step,
                  max_tokens_per_step=args.decode_rows + largest, kv_page_size=PAGE_SIZE, kv_num_pages=pages,
                  all_reduce=args.all_reduce), steps_total


def timed_step(engine, decode_requests, chunk, prompt_tokens, rng, vocab):
    fresh = [engine.create_request(random_prompt(rng, part, vocab),
                                   SamplingParams(temperature=0.0, max_new_tokens=2, ignore_eos=True))
             for part in prompt_parts(chunk, prompt_tokens)]
    try:
        device_before = device_forward_ns(engine)
        start = time.perf_counter()
        tokens, _ = engine.step(decode_requests + fresh)
        wall = time.perf_counter() - start
        device = (device_forward_ns(engine) - device_before) * 1e-9
    finally:
        for request in fresh:
            engine.free_request(request)
    if any(token < 0 for token in tokens[len(decode_requests):]):
        raise SystemExit(f"a chunk of {chunk} tokens did not finish its prompts in one step")
    return wall, device


def measure(args, engine, decode_requests, chunks, vocab):
    rng = np.random.default_rng(args.seed + 1)
    rows = []
    for chunk in chunks:
        for _ in range(2):
            timed_step(engine, decode_requests, chunk, args.prompt_tokens, rng, vocab)
        samples = [timed_step(engine, decode_requests, chunk, args.prompt_tokens, rng, vocab)
                   for _ in range(args.steps)]
        wall = float(np.median([wall for wall, _ in samples]))
        device = float(np.median([device for _, device in samples]))
        rows.append(dict(chunk=chunk, prompts=len(prompt_parts(chunk, args.prompt_tokens)),
                         wall_ms=wall * 1e3, device_ms=device * 1e3))
    decode_only = rows[0]["device_ms"]
    for row in rows[1:]:
        added = row["device_ms"] - decode_only
        row["added_ms"] = added
        row["prefill_tokens_per_s"] = row["chunk"] / (added * 1e-3) if added > 0 else None
    return rows


def print_table(args, rows):
    print(f"\n{args.decode_rows} decode rows of about {args.context} tokens, {args.num_devices} GPU(s), "
          f"3 dense + {args.moe_layers} MoE layers; prompts of at most {args.prompt_tokens} tokens\n")
    print("| prefill tokens | prompts | step ms (wall) | step ms (device) | added ms | prefill tokens/s at the margin |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        added = f"{row['added_ms']:.2f}" if "added_ms" in row else "-"
        rate = row.get("prefill_tokens_per_s")
        rate_text = f"{rate:,.0f}" if rate else "-"
        print(f"| {row['chunk']} | {row['prompts']} | {row['wall_ms']:.2f} | {row['device_ms']:.2f} | {added} | "
              f"{rate_text} |")


def main(argv):
    args = parse_args(argv)
    chunks = chunk_sizes(args.chunks)
    model_dir, config = write_model_dir(3 + args.moe_layers)
    engine, steps_total = open_engine(args, model_dir, chunks)
    try:
        params = SamplingParams(temperature=0.0, max_new_tokens=steps_total, ignore_eos=True)
        rng = np.random.default_rng(args.seed)
        decode_requests = [engine.create_request(random_prompt(rng, args.context, config["vocab_size"]), params)
                           for _ in range(args.decode_rows)]
        fill_contexts(engine, decode_requests)
        rows = measure(args, engine, decode_requests, chunks, config["vocab_size"])
        for request in decode_requests:
            engine.free_request(request)
    finally:
        engine.close()
    print_table(args, rows)
    if args.json:
        args.json.write_text(json.dumps(dict(args={k: str(v) for k, v in vars(args).items()}, rows=rows), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
