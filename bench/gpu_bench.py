import argparse
import gc
import json
import math
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from bench.gemm_bench import FP8_CUBE, SUSTAINED_SECONDS, fp8_dense_rate, fp8_sustained_rate
from glmrt.engine.engine import Engine, SamplingParams

GLM47_CONFIG = REPO_ROOT / "tests" / "data" / "glm-4.7-fp8.config.json"
PAGE_SIZE = 16


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="bench/gpu_bench.py",
                                     description="CUDA backend step times at the GLM-4.7-FP8 shape with random weights.")
    parser.add_argument("--moe-layers", type=int, default=8, help="MoE layers after the dense ones")
    parser.add_argument("--batches", default="1,8,32,64,128,256")
    parser.add_argument("--context", type=int, default=1024, help="prompt tokens of every request")
    parser.add_argument("--decode-steps", type=int, default=8)
    parser.add_argument("--warmup-steps", type=int, default=2)
    parser.add_argument("--warmup-seconds", type=float, default=0.25,
                        help="each batch warms up for at least this long too, so its timed steps do not run under the "
                             "software power cap the prefill leaves behind (docs/PERF.md)")
    parser.add_argument("--max-warmup-steps", type=int, default=200,
                        help="most warm-up steps a batch takes; the KV pool is sized for them")
    parser.add_argument("--max-tokens-per-step", type=int, default=2048)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--num-devices", type=int, default=1,
                        help="GPUs the model is split over; the floor then assumes an even split of the bytes")
    parser.add_argument("--transformers-batches", default="1,8,32", help="empty to skip the transformers run")
    parser.add_argument("--transformers-prefill-prompts", type=int, default=2)
    parser.add_argument("--transformers-prefill-chunk", type=int, default=128,
                        help="context tokens per transformers forward when filling its cache")
    parser.add_argument("--matmul-precision", default="default", choices=("default", "native", "high"),
                        help="high times the f32-activation matmuls (the path before the native tensor-core ones)")
    parser.add_argument("--decode-graphs", action=argparse.BooleanOptionalAction, default=True,
                        help="replay decode steps from CUDA graphs (the engine's default)")
    parser.add_argument("--dependent-launches", action=argparse.BooleanOptionalAction, default=True,
                        help="start each kernel while the one before it finishes (the engine's default)")
    parser.add_argument("--expert-split", choices=("whole", "columns"), default="whole",
                        help="how a split model spreads the routed experts (see server.py --help)")
    parser.add_argument("--all-reduce", choices=("auto", "peer", "nccl", "peer-bf16"), default="auto",
                        help="how the GPUs of a split model sum their partials (see server.py --help)")
    parser.add_argument("--launch-ahead", choices=("auto", "off", "always"), default="auto",
                        help="launch each relaunched decode step before the one it continues has completed, its "
                             "tokens fed on the device (the engine's default where the backend allows it)")
    parser.add_argument("--json", help="write every measurement to this file")
    return parser.parse_args(argv)


def write_model_dir(num_layers, parent=None):
    config = json.loads(GLM47_CONFIG.read_text())
    config["num_hidden_layers"] = num_layers
    directory = Path(tempfile.mkdtemp(prefix="glmrt-bench-", dir=parent))
    (directory / "config.json").write_text(json.dumps(config))
    return directory, config


def copy_bandwidth(torch):
    count = 4 << 30
    source = torch.empty(count, dtype=torch.uint8, device="cuda")
    target = torch.empty_like(source)
    for _ in range(3):
        target.copy_(source)
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    repeats = 10
    start.record()
    for _ in range(repeats):
        target.copy_(source)
    stop.record()
    torch.cuda.synchronize()
    seconds = start.elapsed_time(stop) / 1000.0
    del source, target
    torch.cuda.empty_cache()
    return 2.0 * count * repeats / seconds


def experts_touched(num_experts, top_k, num_tokens):
    return num_experts * (1.0 - (1.0 - top_k / num_experts) ** num_tokens)


def decode_step_bytes(config, batch, context):
    hidden = config["hidden_size"]
    heads, kv_heads, head_dim = config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]
    vocab, layers = config["vocab_size"], config["num_hidden_layers"]
    dense_layers = min(config["first_k_dense_replace"], layers)
    moe_layers = layers - dense_layers
    q_rows, kv_rows = heads * head_dim, kv_heads * head_dim
    attention = (q_rows + 2 * kv_rows) * hidden + hidden * q_rows + 4 * (q_rows + 2 * kv_rows + 2 * hidden)
    dense_mlp = 3 * config["intermediate_size"] * hidden + 4 * (3 * config["intermediate_size"])
    expert = 3 * config["moe_intermediate_size"] * hidden + 4 * (2 * config["moe_intermediate_size"] + hidden)
    shared = config["n_shared_experts"] * expert
    router = 2 * config["n_routed_experts"] * hidden
    touched = experts_touched(config["n_routed_experts"], config["num_experts_per_tok"], batch)
    weights = dense_layers * (attention + dense_mlp) + moe_layers * (attention + shared + router + touched * expert)
    weights += 2 * vocab * hidden + batch * 2 * hidden
    kv_read = batch * context * layers * 2 * kv_heads * head_dim * 2
    return weights, kv_read


def attention_matmul_parameters(config):
    hidden = config["hidden_size"]
    q_rows = config["num_attention_heads"] * config["head_dim"]
    kv_rows = config["num_key_value_heads"] * config["head_dim"]
    return (q_rows + 2 * kv_rows) * hidden + q_rows * hidden


def dense_mlp_parameters(config):
    return 3 * config["intermediate_size"] * config["hidden_size"]


def moe_active_parameters(config):
    hidden = config["hidden_size"]
    expert = 3 * config["moe_intermediate_size"] * hidden
    router = config["n_routed_experts"] * hidden
    return (config["num_experts_per_tok"] + config["n_shared_experts"]) * expert + router


def active_parameters_per_token(config):
    layers = config["num_hidden_layers"]
    dense_layers = min(config["first_k_dense_replace"], layers)
    attention = attention_matmul_parameters(config)
    dense = dense_layers * (attention + dense_mlp_parameters(config))
    return dense + (layers - dense_layers) * (attention + moe_active_parameters(config))


def lm_head_parameters(config):
    return config["vocab_size"] * config["hidden_size"]


def causal_attention_flops(config, prompt_length):
    visible_pairs = prompt_length * (prompt_length + 1) // 2
    return 4 * config["num_attention_heads"] * config["head_dim"] * visible_pairs * config["num_hidden_layers"]


def prefill_flops(config, prompt_lengths):
    per_token = 2 * active_parameters_per_token(config)
    per_sampled_token = 2 * lm_head_parameters(config)
    return sum(length * per_token + per_sampled_token + causal_attention_flops(config, length)
               for length in prompt_lengths)


def device_forward_ns(engine):
    return getattr(engine.stats(), "device_forward_ns", None)


def host_fraction(wall_seconds, device_ns_before, device_ns_after):
    if device_ns_before is None or device_ns_after is None or wall_seconds <= 0:
        return None
    device_seconds = (device_ns_after - device_ns_before) * 1e-9
    return (wall_seconds - device_seconds) / wall_seconds


def random_prompt(rng, length, vocab):
    return [int(t) for t in rng.integers(0, vocab, size=length)]


def computed_tokens(requests):
    return sum(r.info().num_computed_tokens for r in requests)


def fill_contexts(engine, requests):
    pending = list(requests)
    before = computed_tokens(requests)
    start = time.perf_counter()
    while pending:
        step_tokens, _ = engine.step(pending)
        pending = [r for r, t in zip(pending, step_tokens) if t < 0]
    seconds = time.perf_counter() - start
    return computed_tokens(requests) - before, seconds


def warm_up(step, warmup):
    steps, seconds, most = warmup
    start = time.perf_counter()
    taken = 0
    while taken < steps or (taken < most and time.perf_counter() - start < seconds):
        step()
        taken += 1
    return taken


def time_decode(engine, requests, warmup, steps):
    warm_up(lambda: engine.step(requests), warmup)
    device_ns_before = device_forward_ns(engine)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        engine.step(requests)
        times.append(time.perf_counter() - start)
    device_ns_after = device_forward_ns(engine)
    return float(np.median(times)), host_fraction(sum(times), device_ns_before, device_ns_after)


def time_relaunched(engine, requests, warmup, steps):
    engine.launch(requests)
    warm_up(engine.complete_and_relaunch, warmup)
    device_ns_before = device_forward_ns(engine)
    times = []
    last = time.perf_counter()
    for _ in range(steps):
        engine.complete_and_relaunch()
        now = time.perf_counter()
        times.append(now - last)
        last = now
    device_ns_after = device_forward_ns(engine)
    engine.complete()
    return float(np.median(times)), host_fraction(sum(times), device_ns_before, device_ns_after)


def warmup_plan(args):
    return args.warmup_steps, args.warmup_seconds, max(args.warmup_steps, args.max_warmup_steps)


def steps_a_batch(args):
    return 2 * (warmup_plan(args)[2] + args.decode_steps + 1)


def kv_pool_pages(args, batches):
    pages = 16
    steps = steps_a_batch(args)
    for index in range(max(batches)):
        grown = steps * sum(1 for batch in batches if batch > index) + 4
        pages += math.ceil((args.context + grown + 1) / PAGE_SIZE)
    return pages


def mean_context(requests):
    return sum(request.info().num_tokens for request in requests) / len(requests)


def run_ours(args, model_dir, config, batches, bandwidth, fp8_rate, fp8_sustained):
    largest = max(batches)
    new_tokens = steps_a_batch(args) * len(batches) + 4
    pages = kv_pool_pages(args, batches)
    engine = Engine(model_dir, backend="cuda", num_devices=args.num_devices, random_weights=True,
                    random_seed=args.seed, max_batch=largest,
                    max_tokens_per_step=max(args.max_tokens_per_step, largest), kv_page_size=PAGE_SIZE,
                    kv_num_pages=pages, matmul_precision=args.matmul_precision, decode_graphs=args.decode_graphs,
                    dependent_launches=args.dependent_launches, all_reduce=args.all_reduce,
                    expert_split=args.expert_split, launch_ahead=args.launch_ahead)
    info = engine.info()
    rng = np.random.default_rng(args.seed)
    params = SamplingParams(temperature=0.0, max_new_tokens=new_tokens, ignore_eos=True)
    requests = [engine.create_request(random_prompt(rng, args.context, config["vocab_size"]), params)
                for _ in range(largest)]
    prefill_device_ns_before = device_forward_ns(engine)
    prefill_tokens, prefill_seconds = fill_contexts(engine, requests)
    prefill_host = host_fraction(prefill_seconds, prefill_device_ns_before, device_forward_ns(engine))
    flops = prefill_flops(config, [request.num_prompt_tokens for request in requests])
    flops_per_s = flops / prefill_seconds
    prefill = dict(tokens=prefill_tokens, seconds=prefill_seconds, tokens_per_s=prefill_tokens / prefill_seconds,
                   prompts=len(requests), prompt_tokens=args.context, flops=flops, flops_per_s=flops_per_s,
                   active_parameters_per_token=active_parameters_per_token(config),
                   fp8_fraction=flops_per_s / (fp8_rate * args.num_devices),
                   fp8_sustained_fraction=flops_per_s / (fp8_sustained * args.num_devices), host_fraction=prefill_host)
    print(f"glmrt prefill {prefill_tokens} tokens in {prefill_seconds:.2f} s, "
          f"{flops_per_s / 1e12:.0f} TFLOP/s", flush=True)
    rows = []
    warmup = warmup_plan(args)
    for batch in batches:
        seconds, host = time_decode(engine, requests[:batch], warmup, args.decode_steps)
        relaunched, relaunched_host = time_relaunched(engine, requests[:batch], warmup, args.decode_steps)
        context = mean_context(requests[:batch])
        weight_bytes, kv_bytes = decode_step_bytes(config, batch, context)
        floor = (weight_bytes + kv_bytes) / (bandwidth * args.num_devices)
        rows.append(dict(batch=batch, context=round(context), step_ms=seconds * 1e3, tokens_per_s=batch / seconds,
                         weight_gb=weight_bytes / 1e9, kv_gb=kv_bytes / 1e9, floor_ms=floor * 1e3,
                         roofline_fraction=floor / seconds, host_fraction=host, relaunched_ms=relaunched * 1e3,
                         relaunched_roofline_fraction=floor / relaunched, relaunched_host_fraction=relaunched_host))
        print(f"glmrt decode {rows[-1]}", flush=True)
    for request in requests:
        engine.free_request(request)
    stats = engine.stats()
    engine.close()
    return dict(info=dict(device=info.device_name, num_devices=info.num_devices, weight_bytes=info.weight_bytes,
                          kv_cache_bytes=info.kv_cache_bytes, native_matmuls=info.num_native_matmuls,
                          matmul_precision=args.matmul_precision, decode_graphs=info.num_decode_graphs,
                          dependent_launches=args.dependent_launches, all_reduce=args.all_reduce,
                          expert_split=args.expert_split, decode_graph_bytes=info.decode_graph_bytes,
                          workspace_bytes=info.workspace_bytes, kv_num_pages=info.kv_num_pages,
                          launch_ahead=info.launch_ahead, steps_launched_ahead=stats.steps_launched_ahead,
                          pages_free_after=stats.kv_pages_free),
                prefill=prefill, decode=rows)


def transformers_model(torch, config_dict):
    from transformers import Glm4MoeConfig, Glm4MoeForCausalLM

    fields = {k: v for k, v in config_dict.items() if k != "quantization_config"}
    config = Glm4MoeConfig(**fields)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device("cuda"):
            model = Glm4MoeForCausalLM(config)
    finally:
        torch.set_default_dtype(previous)
    model.eval()
    return model


def run_transformers(args, torch, config_dict, batches):
    from transformers import DynamicCache

    model = transformers_model(torch, config_dict)
    vocab = config_dict["vocab_size"]
    generator = torch.Generator(device="cuda").manual_seed(args.seed)
    rows = []
    with torch.no_grad():
        prompts = torch.randint(0, vocab, (args.transformers_prefill_prompts, args.context), device="cuda",
                                generator=generator)
        model(prompts[:1, :16])
        torch.cuda.synchronize()
        start = time.perf_counter()
        for i in range(prompts.shape[0]):
            model(prompts[i:i + 1])
        torch.cuda.synchronize()
        prefill_rate = prompts.numel() / (time.perf_counter() - start)
        for batch in batches:
            cache = DynamicCache(config=model.config)
            ids = torch.randint(0, vocab, (batch, args.context), device="cuda", generator=generator)
            for begin in range(0, args.context, args.transformers_prefill_chunk):
                out = model(ids[:, begin:begin + args.transformers_prefill_chunk], past_key_values=cache,
                            use_cache=True, logits_to_keep=1)
            token = out.logits[:, -1:].argmax(-1)
            times = []
            for step in range(args.warmup_steps + args.decode_steps):
                torch.cuda.synchronize()
                start = time.perf_counter()
                out = model(token, past_key_values=cache, use_cache=True)
                token = out.logits[:, -1:].argmax(-1)
                torch.cuda.synchronize()
                if step >= args.warmup_steps:
                    times.append(time.perf_counter() - start)
            rows.append(dict(batch=batch, step_ms=float(np.median(times)) * 1e3))
            print(f"transformers decode {rows[-1]}", flush=True)
            del cache, out, ids
            torch.cuda.empty_cache()
    del model
    gc.collect()
    torch.cuda.empty_cache()
    return dict(prefill_tokens_per_s=prefill_rate, decode=rows)


def percent_or_na(fraction):
    return "n/a" if fraction is None else f"{100 * fraction:.1f}%"


def rates_text(bandwidth, fp8_rate, fp8_sustained):
    return (f"copy bandwidth {bandwidth / 1e12:.2f} TB/s, FP8 dense rate (torch._scaled_mm {FP8_CUBE}^3) "
            f"{fp8_rate / 1e12:.0f} TFLOP/s one product at a time, {fp8_sustained / 1e12:.0f} TFLOP/s "
            f"back to back in the last of {SUSTAINED_SECONDS:.0f} s")


def print_tables(result):
    ours = result["glmrt"]
    prefill = ours["prefill"]
    rates = rates_text(result['copy_bandwidth'], result['fp8_flops_per_second'],
                       result['fp8_sustained_flops_per_second'])
    print(f"{ours['info']['num_devices']} x {ours['info']['device']}, {rates}, "
          f"{result['layers']} layers ({result['moe_layers']} MoE), weights {ours['info']['weight_bytes'] / 1e9:.1f} GB, "
          f"matmul precision {ours['info']['matmul_precision']} ({ours['info']['native_matmuls']} native matmuls), "
          f"{ours['info']['decode_graphs']} decode graphs ({ours['info']['decode_graph_bytes'] / 1e6:.1f} MB)")
    print(f"prefill: {prefill['tokens']} tokens ({prefill['prompts']} prompts of {prefill['prompt_tokens']}) in "
          f"{prefill['seconds']:.2f} s = {prefill['tokens_per_s']:.0f} tokens/s, "
          f"{prefill['flops_per_s'] / 1e12:.0f} TFLOP/s "
          f"(2 x {prefill['active_parameters_per_token'] / 1e9:.2f} G active parameters a token, lm_head once a "
          f"prompt, causal attention) = {100 * prefill['fp8_fraction']:.1f}% of the FP8 dense rate one product at "
          f"a time, {100 * prefill['fp8_sustained_fraction']:.1f}% of the rate it sustains back to back, "
          f"host {percent_or_na(prefill['host_fraction'])} of the wall time")
    reference = {row["batch"]: row["step_ms"] for row in result.get("transformers", {}).get("decode", [])}
    print(f"steps relaunched by the native core (the server's loop), launched ahead: "
          f"{'yes' if ours['info']['launch_ahead'] else 'no'} ({ours['info']['steps_launched_ahead']} steps)")
    print("| batch | context | step ms | tokens/s | weights GB | KV GB | floor ms | roofline | host % | "
          "relaunched ms | relaunched roofline | transformers ms | speedup |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for row in ours["decode"]:
        hf = reference.get(row["batch"])
        hf_text = f"{hf:.1f} | {hf / row['step_ms']:.2f}x" if hf else "- | -"
        print(f"| {row['batch']} | {row['context']} | {row['step_ms']:.2f} | {row['tokens_per_s']:.0f} | "
              f"{row['weight_gb']:.2f} | {row['kv_gb']:.2f} | {row['floor_ms']:.2f} | "
              f"{100 * row['roofline_fraction']:.1f}% | {percent_or_na(row['host_fraction'])} | "
              f"{row['relaunched_ms']:.2f} | {100 * row['relaunched_roofline_fraction']:.1f}% | {hf_text} |")
    if "transformers" in result:
        print(f"transformers eager prefill: {result['transformers']['prefill_tokens_per_s']:.0f} tokens/s")


def main(argv):
    args = parse_args(argv)
    import torch

    batches = [int(b) for b in args.batches.split(",") if b]
    dense = json.loads(GLM47_CONFIG.read_text())["first_k_dense_replace"]
    model_dir, config = write_model_dir(dense + args.moe_layers)
    bandwidth = copy_bandwidth(torch)
    fp8_rate = fp8_dense_rate(torch)
    fp8_sustained = fp8_sustained_rate(torch)
    torch.cuda.empty_cache()
    print(rates_text(bandwidth, fp8_rate, fp8_sustained), flush=True)
    result = dict(layers=config["num_hidden_layers"], moe_layers=args.moe_layers, copy_bandwidth=bandwidth,
                  fp8_flops_per_second=fp8_rate, fp8_sustained_flops_per_second=fp8_sustained,
                  glmrt=run_ours(args, model_dir, config, batches, bandwidth, fp8_rate, fp8_sustained))
    hf_batches = [int(b) for b in args.transformers_batches.split(",") if b]
    if hf_batches:
        result["transformers"] = run_transformers(args, torch, config, hf_batches)
    print_tables(result)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
