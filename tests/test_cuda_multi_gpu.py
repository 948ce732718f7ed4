import subprocess

import numpy as np
import pytest
from engine_support import build_test_model, greedy, prompt_of_length, run_to_completion
from test_cuda_backend import (BATCH_PARAMS, BUILD_DIR, ENGINE_OPTIONS, NATIVE_FP8_MEDIAN_RELATIVE_L2, TIE_MARGIN,
                               WEIGHT_FORMATS, assert_equal_decode_rows, check_batched_requests_equal_solo_requests,
                               check_greedy_tokens_follow_until_a_near_tie,
                               check_server_streams_offline_engine_tokens, cpu_precision_matching,
                               cuda_device_count, cuda_ready, first_divergence_margin, greedy_with_logits,
                               native_fp8, prefill_bound, prompts_for, random_glm_dir, relative_l2)

from glmrt.engine import native
from glmrt.engine.engine import Engine
from glmrt.engine.errors import GlmrtError

SPLIT_RELATIVE_L2 = 1e-3
SPLIT_NATIVE_RELATIVE_L2 = 0.5
BF16_SUM_RELATIVE_L2 = 0.05
SPLITS = (2, 4)
ROWS_ROUTED_BY_THEIR_OWNER = 256
ROWS_OWNED_BATCH = 262
ROWS_OWNED_SOLO = (0, 100, 140, 210, 261)

DECODE_GRAPH_BUCKETS = (1, 2, 4, 8, 16)
DECODE_GRAPHS_A_BLOCK_AND_SPREAD = 2

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not cuda_ready() or cuda_device_count() < 2,
                                 reason="needs two NVIDIA GPUs and build/libglmrt_cuda.so")]


def splits_available():
    return [n for n in SPLITS if n <= cuda_device_count()]


def wide_model(weight_format):
    return build_test_model(weight_format, seed=3, num_attention_heads=8, num_key_value_heads=4, head_dim=32,
                            hidden_size=128, intermediate_size=256, moe_intermediate_size=64, n_routed_experts=16,
                            n_group=4, topk_group=2, num_experts_per_tok=4)


def first_logits(engine, prompt):
    request = engine.create_request(prompt, greedy(1))
    _, _, logits = engine.step_with_logits([request])
    engine.free_request(request)
    return logits[0].copy()


def columns_split_fits(weight_format, num_devices):
    return weight_format != "fp8-block" or num_devices <= 2


@pytest.mark.parametrize("expert_split", ("whole", "columns"))
@pytest.mark.parametrize("weight_format", WEIGHT_FORMATS)
@pytest.mark.parametrize("num_devices", splits_available())
def test_split_prefill_logits_match_one_gpu_in_high_precision_and_the_cpu_backend(weight_format, num_devices,
                                                                                  expert_split):
    if expert_split == "columns" and not columns_split_fits(weight_format, num_devices):
        pytest.skip("the test model's 64 expert columns in 32x32 FP8 blocks give two GPUs a share, not four")
    model_dir = wide_model(weight_format)
    with Engine(model_dir, backend="cuda", matmul_precision="high", **ENGINE_OPTIONS) as one, \
            Engine(model_dir, backend="cuda", num_devices=num_devices, matmul_precision="high",
                   expert_split=expert_split, **ENGINE_OPTIONS) as split, \
            Engine(model_dir, backend="cpu", num_threads=2, matmul_precision="high", **ENGINE_OPTIONS) as cpu:
        assert split.info().num_devices == num_devices
        for prompt in prompts_for(cpu):
            reference, single, spread = (first_logits(engine, prompt) for engine in (cpu, one, split))
            to_one, to_cpu = relative_l2(spread, single), relative_l2(spread, reference)
            print(f"{weight_format} over {num_devices} GPUs, experts split {expert_split}, prompt of {len(prompt)}: "
                  f"relative L2 {to_one:.3e} to one GPU, {to_cpu:.3e} to the CPU backend")
            assert np.all(np.isfinite(spread))
            assert to_one < SPLIT_RELATIVE_L2
            assert to_cpu < prefill_bound(weight_format, "high")


@pytest.mark.parametrize("weight_format", WEIGHT_FORMATS)
@pytest.mark.parametrize("num_devices", splits_available())
def test_split_prefill_logits_in_native_precision_meet_the_one_gpu_bounds_to_the_cpu_backend(weight_format,
                                                                                            num_devices):
    model_dir = wide_model(weight_format)
    with Engine(model_dir, backend="cuda", num_devices=num_devices, **ENGINE_OPTIONS) as split, \
            Engine(model_dir, backend="cpu", num_threads=2, matmul_precision=cpu_precision_matching(split),
                   **ENGINE_OPTIONS) as cpu:
        precision = cpu_precision_matching(split)
        errors = []
        for prompt in prompts_for(cpu):
            reference, spread = first_logits(cpu, prompt), first_logits(split, prompt)
            error = relative_l2(spread, reference)
            print(f"{weight_format} {precision} over {num_devices} GPUs, prompt of {len(prompt)}: "
                  f"relative L2 {error:.3e} to the CPU backend")
            assert np.all(np.isfinite(spread))
            assert error < prefill_bound(weight_format, precision)
            errors.append(error)
        if native_fp8(weight_format, precision):
            assert float(np.median(errors)) < NATIVE_FP8_MEDIAN_RELATIVE_L2


@pytest.mark.parametrize("weight_format", WEIGHT_FORMATS)
def test_split_greedy_tokens_follow_one_gpu_until_a_near_tie(weight_format):
    model_dir = wide_model(weight_format)
    with Engine(model_dir, backend="cuda", matmul_precision="high", **ENGINE_OPTIONS) as one, \
            Engine(model_dir, backend="cuda", num_devices=2, matmul_precision="high", **ENGINE_OPTIONS) as split:
        agreed, total = check_greedy_tokens_follow_until_a_near_tie(one, split, "one GPU")
    print(f"{weight_format} over 2 GPUs: {agreed} of {total} greedy tokens agree with one GPU before any near-tie")


@pytest.mark.parametrize("params", BATCH_PARAMS)
def test_split_batched_requests_equal_solo_requests(params):
    with Engine(wide_model("fp8-block"), backend="cuda", num_devices=2, **ENGINE_OPTIONS) as engine:
        check_batched_requests_equal_solo_requests(engine, params)


@pytest.mark.parametrize("num_devices", splits_available())
def test_split_decode_graphs_equal_direct_launches_bit_for_bit(num_devices):
    model_dir = wide_model("fp8-block")
    with Engine(model_dir, backend="cuda", num_devices=num_devices, **ENGINE_OPTIONS) as graphs, \
            Engine(model_dir, backend="cuda", num_devices=num_devices, decode_graphs=False,
                   **ENGINE_OPTIONS) as direct:
        assert graphs.info().num_decode_graphs == DECODE_GRAPHS_A_BLOCK_AND_SPREAD * len(DECODE_GRAPH_BUCKETS)
        assert direct.info().num_decode_graphs == 0
        assert_equal_decode_rows(graphs, direct, (1, 3, 6, 16), (1, 509), 17, 8)


@pytest.mark.parametrize("num_devices", splits_available())
def test_peer_all_reduce_computes_what_nccl_computes_bit_for_bit(num_devices):
    model_dir = wide_model("fp8-block")
    with Engine(model_dir, backend="cuda", num_devices=num_devices, all_reduce="nccl", **ENGINE_OPTIONS) as nccl, \
            Engine(model_dir, backend="cuda", num_devices=num_devices, all_reduce="peer", **ENGINE_OPTIONS) as peer:
        assert nccl.info().all_reduce == native.ALL_REDUCE_NCCL
        assert peer.info().all_reduce == native.ALL_REDUCE_PEER
        assert peer.info().workspace_bytes > nccl.info().workspace_bytes
        for prompt in prompts_for(peer) + [prompt_of_length(ROWS_ROUTED_BY_THEIR_OWNER, peer.vocab_size, 3)]:
            expected, actual = first_logits(nccl, prompt), first_logits(peer, prompt)
            assert np.all(np.isfinite(actual))
            assert np.array_equal(actual, expected), f"prompt of {len(prompt)} over {num_devices} GPUs"
        for prompt in prompts_for(peer)[:3]:
            tokens, rows = greedy_with_logits(nccl, prompt, 12)
            peer_tokens, peer_rows = greedy_with_logits(peer, prompt, 12)
            assert tokens == peer_tokens
            assert all(np.array_equal(row, peer_row) for row, peer_row in zip(rows, peer_rows))


def run_bench_driver(name, num_devices):
    binary = BUILD_DIR / name
    if not binary.exists():
        pytest.skip(f"{binary} is not built")
    result = subprocess.run([str(binary), str(num_devices)], capture_output=True, text=True, timeout=300)
    print(result.stdout)
    assert result.returncode == 0, result.stdout + result.stderr
    return result


@pytest.mark.parametrize("num_devices", splits_available())
def test_peer_sums_have_the_same_bits_on_every_gpu_and_the_row_gather_moves_every_row(num_devices):
    result = run_bench_driver("allreduce_bench", num_devices)
    checks = [line for line in result.stdout.splitlines() if line.startswith("check over")]
    bf16_checks = [line for line in result.stdout.splitlines() if line.startswith("check of the BF16 sums over")]
    gather_checks = [line for line in result.stdout.splitlines() if line.startswith("check of the row gather over")]
    assert len(checks) == 4
    assert len(bf16_checks) == 5
    scatter_checks = [line for line in result.stdout.splitlines()
                      if line.startswith("check of the BF16 reduce by rows over")]
    assert len(gather_checks) == 6
    assert len(scatter_checks) == 5
    for line in scatter_checks:
        assert line.endswith("every GPU's own rows have the two-shot's bits, the others are untouched"), line
    for line in checks + bf16_checks:
        assert "every GPU's sum has the same bits, one-shot and two-shot have the same bits" in line, line
    for line in gather_checks:
        assert line.endswith("every GPU holds every row"), line


@pytest.mark.parametrize("num_devices", splits_available())
def test_expert_exchange_over_peer_inboxes_returns_every_rows_sum(num_devices):
    result = run_bench_driver("alltoall_bench", num_devices)
    rows = [line for line in result.stdout.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert len(rows) == sum(1 for tokens in (8, 16, 32, 64, 128, 256, 512) if tokens % num_devices == 0)
    for line in rows:
        assert line.rstrip().endswith("| every combined value as expected |"), line


@pytest.mark.parametrize("num_devices", splits_available())
def test_peer_bf16_sums_stay_near_the_fp32_sums_and_keep_the_residual_on_every_gpu(num_devices):
    model_dir = wide_model("bf16")
    with Engine(model_dir, backend="cuda", num_devices=num_devices, all_reduce="peer", **ENGINE_OPTIONS) as fp32, \
            Engine(model_dir, backend="cuda", num_devices=num_devices, all_reduce="peer-bf16",
                   **ENGINE_OPTIONS) as bf16:
        assert bf16.info().all_reduce == native.ALL_REDUCE_PEER_BF16
        assert bf16.info().workspace_bytes > fp32.info().workspace_bytes
        worst = 0.0
        for prompt in prompts_for(bf16):
            expected, actual = first_logits(fp32, prompt), first_logits(bf16, prompt)
            assert np.all(np.isfinite(actual))
            assert not np.array_equal(actual, expected), f"prompt of {len(prompt)}: BF16 sums rounded nothing"
            worst = max(worst, relative_l2(actual, expected))
        print(f"\nBF16 against FP32 sums over {num_devices} GPUs: worst relative L2 of the logits {worst:.3e}")
        assert worst < BF16_SUM_RELATIVE_L2


def with_step_paths(engine, run):
    before = engine.stats()
    result = run()
    after = engine.stats()
    return result, after.steps - before.steps, after.rows_owned_steps - before.rows_owned_steps


def start_requests(engine, prompts, steps):
    return [engine.create_request(prompt, greedy(steps)) for prompt in prompts], [[] for _ in prompts]


def step_requests(engine, requests, rows):
    tokens, finished, logits = engine.step_with_logits(requests)
    for index, token in enumerate(tokens):
        if token >= 0:
            rows[index].append((token, logits[index].tobytes()))
    return all(finished)


def finish_requests(engine, requests, rows):
    while not step_requests(engine, requests, rows):
        pass
    for request in requests:
        engine.free_request(request)
    return rows


def rows_by_request(engine, prompts, steps):
    requests, rows = start_requests(engine, prompts, steps)
    return finish_requests(engine, requests, rows)


@pytest.mark.parametrize("weight_format", ("fp8-block", "bf16"))
@pytest.mark.parametrize("num_devices", splits_available())
def test_rows_owned_by_each_gpu_keep_a_wide_batch_equal_to_solo_requests_bit_for_bit(num_devices, weight_format):
    with Engine(wide_model(weight_format), backend="cuda", num_devices=num_devices, all_reduce="peer-bf16",
                max_batch=ROWS_OWNED_BATCH, max_tokens_per_step=2048, kv_page_size=16, kv_num_pages=1024) as engine:
        prompts = [prompt_of_length(2 + index % 7, engine.vocab_size, 500 + index) for index in range(ROWS_OWNED_BATCH)]
        requests, batched = start_requests(engine, prompts, 4)
        _, prefill_steps, prefill_owned = with_step_paths(engine, lambda: step_requests(engine, requests, batched))
        _, decode_steps, decode_owned = with_step_paths(engine, lambda: finish_requests(engine, requests, batched))
        assert all(len(rows) == 4 for rows in batched)
        assert prefill_owned == prefill_steps == 1
        assert decode_owned == decode_steps == 3
        for index in ROWS_OWNED_SOLO:
            solo, solo_steps, solo_owned = with_step_paths(engine, lambda: rows_by_request(engine, [prompts[index]], 4))
            assert solo_steps == 4 and solo_owned == 0
            assert solo[0] == batched[index], f"request {index}"
        stats = engine.stats()
        assert stats.kv_pages_free == stats.kv_pages_total


@pytest.mark.parametrize("num_devices", splits_available())
def test_columns_split_keeps_batched_equal_to_solo_and_graphs_equal_to_direct(num_devices):
    model_dir = wide_model("fp8-channel")
    with Engine(model_dir, backend="cuda", num_devices=num_devices, expert_split="columns",
                **ENGINE_OPTIONS) as graphs, \
            Engine(model_dir, backend="cuda", num_devices=num_devices, expert_split="columns", decode_graphs=False,
                   **ENGINE_OPTIONS) as direct:
        check_batched_requests_equal_solo_requests(graphs, BATCH_PARAMS[0])
        assert_equal_decode_rows(graphs, direct, (1, 3, 6, 16), (1, 509), 17, 8)


@pytest.mark.parametrize("all_reduce", ("auto", "peer", "nccl", "peer-bf16"))
@pytest.mark.parametrize("num_devices", splits_available())
def test_all_reduces_keep_batched_equal_to_solo_and_graphs_equal_to_direct(num_devices, all_reduce):
    model_dir = wide_model("fp8-block")
    with Engine(model_dir, backend="cuda", num_devices=num_devices, all_reduce=all_reduce, **ENGINE_OPTIONS) as graphs, \
            Engine(model_dir, backend="cuda", num_devices=num_devices, all_reduce=all_reduce, decode_graphs=False,
                   **ENGINE_OPTIONS) as direct:
        chosen = {"peer": {native.ALL_REDUCE_PEER}, "nccl": {native.ALL_REDUCE_NCCL},
                  "auto": {native.ALL_REDUCE_PEER, native.ALL_REDUCE_NCCL},
                  "peer-bf16": {native.ALL_REDUCE_PEER_BF16}}[all_reduce]
        assert graphs.info().all_reduce in chosen
        assert direct.info().all_reduce == graphs.info().all_reduce
        check_batched_requests_equal_solo_requests(graphs, BATCH_PARAMS[0])
        assert_equal_decode_rows(graphs, direct, (1, 3, 6, 16), (1, 509), 17, 8)


def test_split_engine_frees_every_page_across_many_requests():
    with Engine(wide_model("bf16"), backend="cuda", num_devices=2, max_batch=8, max_tokens_per_step=64,
                kv_page_size=16, kv_num_pages=48) as engine:
        for round_index in range(20):
            requests = [engine.create_request(prompt_of_length(5 + 7 * i, engine.vocab_size, round_index * 10 + i),
                                              greedy(3 + i)) for i in range(6)]
            outputs = run_to_completion(engine, requests)
            assert [len(tokens) for tokens in outputs] == [3 + i for i in range(6)]
            for request in requests:
                engine.free_request(request)
        engine.check_invariants()
        stats = engine.stats()
        assert stats.kv_pages_free == stats.kv_pages_total == 48
        assert stats.live_requests == 0


def glm47_shape_greedy(model_dir, prompts, num_devices, precision):
    settings = dict(random_weights=True, random_seed=3, max_batch=4, max_tokens_per_step=128, kv_page_size=16,
                    kv_num_pages=64, matmul_precision=precision)
    with Engine(model_dir, backend="cuda", num_devices=num_devices, **settings) as engine:
        info = engine.info()
        return info, engine.config, [greedy_with_logits(engine, prompt, 6) for prompt in prompts]


@pytest.mark.parametrize("precision", ("high", "default"))
def test_real_glm47_shape_splits_its_weights_over_two_gpus_and_computes_the_same_model(tmp_path, precision):
    model_dir = random_glm_dir(tmp_path, 5)
    prompts = [prompt_of_length(n, 150000, n) for n in (1, 70)]
    one_info, _, expected = glm47_shape_greedy(model_dir, prompts, 1, precision)
    info, config, produced = glm47_shape_greedy(model_dir, prompts, 2, precision)
    replicated = config.vocab_size * config.hidden_size * 2 + 2 * config.n_routed_experts * config.hidden_size * 4
    assert info.num_devices == 2
    assert info.kv_bytes_per_page == one_info.kv_bytes_per_page
    assert one_info.weight_bytes < info.weight_bytes < one_info.weight_bytes + replicated
    for prompt, (tokens, rows), (split_tokens, split_rows) in zip(prompts, expected, produced):
        error = relative_l2(split_rows[0], rows[0])
        index, margin = first_divergence_margin(tokens, rows, split_tokens)
        print(f"GLM-4.7 shape, 5 layers, {precision} precision, prompt of {len(prompt)}: relative L2 {error:.3e} "
              f"to one GPU, {index} of {len(tokens)} greedy tokens agree before any near-tie")
        assert len(split_tokens) == len(tokens)
        assert np.all(np.isfinite(split_rows[0]))
        if precision == "high":
            assert error < SPLIT_RELATIVE_L2
            assert margin <= TIE_MARGIN
        else:
            assert error < SPLIT_NATIVE_RELATIVE_L2


def test_split_errors_are_reported_before_any_gpu_work():
    model_dir = wide_model("bf16")
    with pytest.raises(GlmrtError) as raised:
        Engine(model_dir, backend="cuda", num_devices=2 * cuda_device_count(), **ENGINE_OPTIONS)
    assert raised.value.status_name == "INVALID_ARGUMENT"
    assert "visible CUDA devices" in raised.value.message
    with pytest.raises(GlmrtError) as raised:
        Engine(model_dir, backend="cuda", num_devices=3, **ENGINE_OPTIONS)
    assert raised.value.status_name == "UNSUPPORTED"
    assert "split evenly" in raised.value.message


def test_server_over_two_gpus_streams_the_offline_engine_tokens(tmp_path):
    stdout = check_server_streams_offline_engine_tokens(tmp_path, num_devices=2)
    assert "over 2 device(s)" in stdout
    assert "all-reduce between the 2 GPUs: peer" in stdout or "all-reduce between the 2 GPUs: nccl" in stdout


@pytest.mark.parametrize("all_reduce", ("nccl", "peer", "peer-bf16"))
@pytest.mark.parametrize("num_devices", splits_available())
def test_server_over_several_gpus_survives_the_soak_and_exits_cleanly(tmp_path, num_devices, all_reduce):
    from server_harness import ServerProcess, build_server_test_model
    from test_server_loadgen import assert_clean_run, run_loadgen

    model_dir = build_server_test_model(tmp_path / "model")
    with ServerProcess(tmp_path / "logs", model_dir, backend="cuda", num_devices=num_devices, all_reduce=all_reduce,
                       max_batch=64, max_tokens_per_step=256, kv_pages=2304) as server:
        result, summary = run_loadgen(server.ws_url, "responses-ws", tmp_path / "soak.json", concurrency=64,
                                      duration=30, prompt_len=256, gen_len=256, cancel=0.1, disconnect=0.1,
                                      timeout=150)
        samples = server.wait_idle(15)
        assert_clean_run(server, summary, samples)
        assert summary["completed"] >= 32
    assert server.process.returncode == 0
    print(f"\nall_reduce {all_reduce} over {num_devices} GPUs:\n{result.stdout}")
