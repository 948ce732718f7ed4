import ctypes
import json
import os
import random
import subprocess
from pathlib import Path

import numpy as np
import pytest
from engine_support import (build_test_model, cuda_device_count, cuda_ready, greedy, launch_then_complete,
                            prompt_of_length, run_to_completion, step_rows_until_done)

from glmrt.engine.engine import Engine, SamplingParams
from glmrt.engine.errors import GlmrtError

REPO_ROOT = Path(__file__).resolve().parents[1]
BUILD_DIR = REPO_ROOT / "build"
GLM47_CONFIG = REPO_ROOT / "tests" / "data" / "glm-4.7-fp8.config.json"
WEIGHT_FORMATS = ("bf16", "fp8-channel", "fp8-block")
PRECISIONS = ("native", "high")
PROMPT_LENGTHS = (1, 9, 30, 77, 180)
NEW_TOKENS = 32
PREFILL_RELATIVE_L2 = 2e-2
NATIVE_FP8_MEDIAN_RELATIVE_L2 = 6e-2
NATIVE_FP8_WORST_RELATIVE_L2 = 0.5
TIE_MARGIN = 5e-2
KERNEL_DRIVERS = ("test_cuda_fp8", "test_cuda_gemm", "test_cuda_qgemm", "test_cuda_attention", "test_cuda_moe_sampling")
ENGINE_OPTIONS = dict(max_batch=16, max_tokens_per_step=256, kv_page_size=16, kv_num_pages=512)


DECODE_GRAPH_BUCKETS = (1, 2, 4, 8, 16)
DECODE_GRAPHS_A_BLOCK_AND_SPREAD = 2

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not cuda_ready(), reason="needs an NVIDIA GPU and build/libglmrt_cuda.so")]


def device_free_bytes():
    driver = ctypes.CDLL("libcuda.so.1")
    free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
    status = driver.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total))
    assert status == 0, f"cuMemGetInfo failed with {status}"
    return free.value


def native_fp8(weight_format, precision):
    return precision == "native" and weight_format != "bf16"


def prefill_bound(weight_format, precision):
    return NATIVE_FP8_WORST_RELATIVE_L2 if native_fp8(weight_format, precision) else PREFILL_RELATIVE_L2


def greedy_cases():
    return [(weight_format, "high") for weight_format in WEIGHT_FORMATS] + [("bf16", "native")]


def cpu_precision_matching(gpu_engine):
    return "native" if gpu_engine.info().num_native_matmuls > 0 else "high"


def open_pair(model_dir, matmul_precision="high", **options):
    settings = dict(ENGINE_OPTIONS)
    settings.update(options)
    settings["matmul_precision"] = matmul_precision
    return Engine(model_dir, backend="cpu", num_threads=2, **settings), Engine(model_dir, backend="cuda", **settings)


def prompts_for(engine):
    return [prompt_of_length(length, engine.vocab_size, seed=length) for length in PROMPT_LENGTHS]


def relative_l2(actual, expected):
    return float(np.linalg.norm(actual - expected) / np.linalg.norm(expected))


def greedy_with_logits(engine, prompt, count):
    request = engine.create_request(prompt, greedy(count))
    tokens, rows = [], []
    while len(tokens) < count:
        step_tokens, done, logits = engine.step_with_logits([request])
        if step_tokens[0] >= 0:
            tokens.append(step_tokens[0])
            rows.append(logits[0].copy())
        if done[0]:
            break
    engine.free_request(request)
    return tokens, rows


def first_divergence_margin(reference_tokens, reference_rows, tokens):
    for index, (expected, actual) in enumerate(zip(reference_tokens, tokens)):
        if expected != actual:
            row = reference_rows[index]
            return index, float(row[expected] - row[actual])
    return len(tokens), 0.0


@pytest.mark.parametrize("driver", KERNEL_DRIVERS)
def test_cuda_kernel_driver_matches_cpu_references(driver):
    binary = BUILD_DIR / driver
    if not binary.exists():
        pytest.skip(f"{binary} is not built")
    result = subprocess.run([str(binary)], capture_output=True, text=True, timeout=600)
    print(result.stdout)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("weight_format", WEIGHT_FORMATS)
def test_cuda_prefill_logits_match_cpu_backend(weight_format, precision):
    cpu, gpu = open_pair(build_test_model(weight_format), precision)
    errors = []
    with cpu, gpu:
        if precision == "native":
            assert gpu.info().num_native_matmuls > 0
        for prompt in prompts_for(cpu):
            rows = []
            for engine in (cpu, gpu):
                request = engine.create_request(prompt, greedy(1))
                _, _, logits = engine.step_with_logits([request])
                rows.append(logits[0].copy())
                engine.free_request(request)
            error = relative_l2(rows[1], rows[0])
            print(f"{weight_format} {precision} prompt of {len(prompt)}: relative L2 {error:.3e}")
            assert np.all(np.isfinite(rows[1]))
            assert error < prefill_bound(weight_format, precision)
            errors.append(error)
    if native_fp8(weight_format, precision):
        assert float(np.median(errors)) < NATIVE_FP8_MEDIAN_RELATIVE_L2


def check_greedy_tokens_follow_until_a_near_tie(reference, engine, reference_name):
    agreed, total = 0, 0
    for prompt in prompts_for(reference):
        reference_tokens, reference_rows = greedy_with_logits(reference, prompt, NEW_TOKENS)
        tokens, _ = greedy_with_logits(engine, prompt, NEW_TOKENS)
        index, margin = first_divergence_margin(reference_tokens, reference_rows, tokens)
        agreed += index
        total += len(reference_tokens)
        assert len(tokens) == len(reference_tokens)
        assert margin <= TIE_MARGIN, f"diverged at token {index} where {reference_name}'s margin was {margin}"
    return agreed, total


def check_greedy_tokens_follow_cpu_until_a_near_tie(cpu, gpu):
    return check_greedy_tokens_follow_until_a_near_tie(cpu, gpu, "the CPU backend")


@pytest.mark.parametrize(("weight_format", "precision"), greedy_cases())
def test_cuda_greedy_tokens_follow_cpu_backend_until_a_near_tie(weight_format, precision):
    cpu, gpu = open_pair(build_test_model(weight_format), precision)
    with cpu, gpu:
        agreed, total = check_greedy_tokens_follow_cpu_until_a_near_tie(cpu, gpu)
    print(f"{weight_format} {precision}: {agreed} of {total} greedy tokens agree before any near-tie divergence")


@pytest.mark.parametrize("weight_format", WEIGHT_FORMATS)
def test_cuda_greedy_tokens_follow_transformers_until_a_near_tie(weight_format):
    torch = pytest.importorskip("torch")
    parity = pytest.importorskip("test_parity_transformers")
    model_dir = build_test_model(weight_format)
    model = parity.reference_model(model_dir, weight_format)
    engine = Engine(model_dir, backend="cuda", matmul_precision="high", **ENGINE_OPTIONS)
    agreed, total = 0, 0
    with engine, torch.no_grad():
        for prompt in prompts_for(engine):
            ids = torch.tensor([prompt])
            reference_tokens, reference_rows = [], []
            for _ in range(NEW_TOKENS):
                row = model(ids).logits[0, -1].float().numpy()
                token = int(np.argmax(row))
                reference_tokens.append(token)
                reference_rows.append(row)
                ids = torch.cat([ids, torch.tensor([[token]])], dim=1)
            request = engine.create_request(prompt, greedy(NEW_TOKENS))
            gpu_tokens = run_to_completion(engine, [request])[0]
            engine.free_request(request)
            index, margin = first_divergence_margin(reference_tokens, reference_rows, gpu_tokens)
            agreed += index
            total += NEW_TOKENS
            assert margin <= TIE_MARGIN, f"diverged at token {index} where the reference margin was {margin}"
    print(f"{weight_format}: {agreed} of {total} greedy tokens agree with transformers before any near-tie")


BATCH_PARAMS = [greedy(24), SamplingParams(temperature=0.8, top_p=0.9, top_k=40, seed=7, max_new_tokens=24,
                                          ignore_eos=True, repetition_penalty=1.1)]


def check_batched_requests_equal_solo_requests(engine, params):
    prompts = prompts_for(engine) + [prompt_of_length(n, engine.vocab_size, seed=100 + n) for n in (3, 50, 120)]
    solo = []
    for prompt in prompts:
        request = engine.create_request(prompt, params)
        solo.append(run_to_completion(engine, [request])[0])
        engine.free_request(request)
    requests = [engine.create_request(prompt, params) for prompt in prompts]
    batched = run_to_completion(engine, requests)
    for request in requests:
        engine.free_request(request)
    assert batched == solo
    stats = engine.stats()
    assert stats.kv_pages_free == stats.kv_pages_total


@pytest.mark.parametrize("params", BATCH_PARAMS)
def test_cuda_batched_requests_equal_solo_requests(params):
    with Engine(build_test_model("fp8-channel"), backend="cuda", **ENGINE_OPTIONS) as engine:
        check_batched_requests_equal_solo_requests(engine, params)


def decode_rows(engine, prompts, steps):
    requests = [engine.create_request(prompt, greedy(steps)) for prompt in prompts]
    rows = []
    while len(rows) < 2 * steps:
        tokens, done, logits = engine.step_with_logits(requests)
        rows.append((tokens, logits.tobytes()))
        if all(done):
            break
    for request in requests:
        engine.free_request(request)
    return rows


def assert_equal_decode_rows(first, second, counts, long_prompt, step_len, steps):
    vocab = first.vocab_size
    long_at, long_length = long_prompt
    for count in counts:
        prompts = [prompt_of_length(1 + (step_len * i) % 120, vocab, seed=count * 100 + i) for i in range(count)]
        if count > long_at:
            prompts[long_at] = prompt_of_length(long_length, vocab, seed=count)
        assert decode_rows(first, prompts, steps) == decode_rows(second, prompts, steps), f"batch of {count}"
    for engine in (first, second):
        stats = engine.stats()
        assert stats.kv_pages_free == stats.kv_pages_total


@pytest.mark.parametrize("weight_format", ("bf16", "fp8-block"))
def test_cuda_decode_graphs_equal_direct_launches_bit_for_bit(weight_format):
    model_dir = build_test_model(weight_format)
    with Engine(model_dir, backend="cuda", **ENGINE_OPTIONS) as graphs, \
            Engine(model_dir, backend="cuda", decode_graphs=False, **ENGINE_OPTIONS) as direct:
        assert graphs.info().num_decode_graphs == DECODE_GRAPHS_A_BLOCK_AND_SPREAD * len(DECODE_GRAPH_BUCKETS)
        assert direct.info().num_decode_graphs == 0
        assert_equal_decode_rows(graphs, direct, (1, 3, 6, 16), (1, 509), 17, 8)


@pytest.mark.parametrize("decode_graphs", (True, False))
def test_cuda_dependent_launches_equal_serialized_launches_bit_for_bit(decode_graphs):
    model_dir = build_test_model("fp8-channel")
    with Engine(model_dir, backend="cuda", decode_graphs=decode_graphs, **ENGINE_OPTIONS) as dependent, \
            Engine(model_dir, backend="cuda", decode_graphs=decode_graphs, dependent_launches=False,
                   **ENGINE_OPTIONS) as serialized:
        assert_equal_decode_rows(dependent, serialized, (1, 5, 16), (2, 600), 29, 6)


def reads_stats_in_flight(engine):
    assert engine.stats().live_requests >= 1


def sampled_rows(engine, prompts, steps, run_step):
    requests = [engine.create_request(prompt, SamplingParams(temperature=0.8, seed=7 + i, max_new_tokens=steps,
                                                             ignore_eos=True))
                for i, prompt in enumerate(prompts)]
    produced = step_rows_until_done(engine, requests, run_step)
    for request in requests:
        engine.free_request(request)
    return produced


def test_cuda_launch_then_complete_equals_the_synchronous_step_and_counts_device_time():
    model_dir = build_test_model("fp8-block")
    with Engine(model_dir, backend="cuda", **ENGINE_OPTIONS) as first, \
            Engine(model_dir, backend="cuda", **ENGINE_OPTIONS) as second:
        prompts = [prompt_of_length(1 + (23 * i) % 70, first.vocab_size, seed=500 + i) for i in range(6)]
        launched = sampled_rows(first, prompts, 12,
                                lambda engine, active: launch_then_complete(engine, active, reads_stats_in_flight))
        assert launched == sampled_rows(second, prompts, 12, Engine.step)
        for engine in (first, second):
            stats = engine.stats()
            assert stats.kv_pages_free == stats.kv_pages_total
            assert stats.device_forward_ns > 0
            assert stats.rows_owned_steps == 0
            engine.check_invariants()


def churn_step(engine, rng, live, vocab):
    action = rng.random()
    if action < 0.3 and len(live) < 12:
        params = SamplingParams(temperature=rng.choice([0.0, 0.7]), max_new_tokens=rng.randint(1, 40),
                                seed=rng.randint(0, 1000), ignore_eos=True)
        try:
            live.append(engine.create_request(prompt_of_length(rng.randint(1, 90), vocab, rng.randint(0, 10**6)),
                                              params))
        except GlmrtError as error:
            assert error.status_name == "OUT_OF_PAGES"
    elif action < 0.36 and live:
        engine.free_request(live.pop(rng.randrange(len(live))))
    elif action < 0.4 and live:
        engine.preempt_request(rng.choice(live))
    if not live:
        return 0
    try:
        _, done = engine.step(live)
    except GlmrtError as error:
        assert error.status_name == "OUT_OF_PAGES"
        engine.preempt_request(live[-1])
        return 1
    for request, reason in list(zip(live, done)):
        if reason:
            live.remove(request)
            engine.free_request(request)
    return 1


def test_cuda_churn_returns_every_page_and_keeps_device_memory_flat():
    steps_wanted = int(os.environ.get("GLMRT_CUDA_CHURN_STEPS", "10000"))
    rng = random.Random(5)
    with Engine(build_test_model("bf16"), backend="cuda", max_batch=16, max_tokens_per_step=128, kv_page_size=16,
                kv_num_pages=96) as engine:
        live, steps = [], 0
        warm_free = None
        while steps < steps_wanted:
            steps += churn_step(engine, rng, live, engine.vocab_size)
            if warm_free is None and steps >= 200:
                warm_free = device_free_bytes()
            if steps % 1000 == 0:
                engine.check_invariants()
        for request in live:
            engine.free_request(request)
        engine.check_invariants()
        stats = engine.stats()
        assert stats.kv_pages_free == stats.kv_pages_total
        assert stats.live_requests == 0
        assert device_free_bytes() == warm_free


def random_glm_dir(tmp_path, layers):
    config = json.loads(GLM47_CONFIG.read_text())
    config["num_hidden_layers"] = layers
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


def test_cuda_random_weights_run_the_real_glm47_shape(tmp_path):
    model_dir = random_glm_dir(tmp_path, 4)
    with Engine(model_dir, backend="cuda", random_weights=True, random_seed=3, max_batch=4, max_tokens_per_step=128,
                kv_page_size=16, kv_num_pages=0, kv_memory_fraction=0.02) as engine:
        info = engine.info()
        config = engine.config
        assert info.kv_num_pages > 0
        assert info.kv_bytes_per_page == 4 * 2 * config.num_key_value_heads * 16 * config.head_dim * 2
        expert_bytes = 3 * config.moe_intermediate_size * config.hidden_size
        assert info.weight_bytes > config.n_routed_experts * expert_bytes + 2 * config.vocab_size * config.hidden_size * 2
        requests = [engine.create_request(prompt_of_length(n, config.vocab_size, n), greedy(4)) for n in (1, 70)]
        outputs = run_to_completion(engine, requests)
        assert all(len(tokens) == 4 and all(0 <= t < config.vocab_size for t in tokens) for tokens in outputs)
        request = engine.create_request(prompt_of_length(20, config.vocab_size, 1), greedy(1))
        _, _, logits = engine.step_with_logits([request])
        assert np.all(np.isfinite(logits[0]))


def test_cuda_engine_reports_a_missing_device_as_an_error():
    with pytest.raises(GlmrtError) as raised:
        Engine(build_test_model("bf16"), backend="cuda", device_id=cuda_device_count() + 3, **ENGINE_OPTIONS)
    assert raised.value.status_name == "INVALID_ARGUMENT"
    assert "device_id" in raised.value.message


def check_server_streams_offline_engine_tokens(tmp_path, **engine_options):
    import asyncio

    harness = pytest.importorskip("server_harness")
    from glmrt.model.config import load_model_config
    from glmrt.model.tokenizer import Tokenizer

    model_dir = harness.build_server_test_model(tmp_path / "model")
    tokenizer = Tokenizer(model_dir)
    eos_ids = load_model_config(model_dir).eos_token_ids
    requests = [{"input": "The river by the old mill", "max_output_tokens": 24, "temperature": 0.0, "seed": 1},
                {"input": "kitchen window morning", "max_output_tokens": 24, "temperature": 0.8, "top_p": 0.9,
                 "repetition_penalty": 1.2, "seed": 7, "reasoning": {"effort": "none"}}]
    jobs = [(harness.prompt_ids_for(tokenizer, request), harness.sampling_params_for(request, eos_ids))
            for request in requests]
    expected = harness.solo_outputs(model_dir, jobs, backend="cuda", **engine_options)
    with harness.ServerProcess(tmp_path / "logs", model_dir, backend="cuda", max_batch=8, max_tokens_per_step=64,
                               **engine_options) as server:
        for request, tokens in zip(requests, expected):
            record = asyncio.run(harness.generate(server.ws_url, request))
            assert record.errors == []
            assert record.status in ("completed", "incomplete")
            assert record.token_ids == tokens
        return server.stdout_text()


def test_cuda_server_streams_the_offline_cuda_engine_tokens(tmp_path):
    check_server_streams_offline_engine_tokens(tmp_path)
