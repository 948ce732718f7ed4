import asyncio
import json

import numpy as np
import pytest

from engine_support import build_test_model, greedy, prompt_of_length, run_to_completion
from glmrt.engine import Engine, SamplingParams
from glmrt.errors import GlmrtError
from test_cuda_backend import (ENGINE_OPTIONS, GLM47_CONFIG, NEW_TOKENS, PREFILL_RELATIVE_L2, TIE_MARGIN,
                               WEIGHT_FORMATS, cuda_device_count, cuda_ready, first_divergence_margin,
                               greedy_with_logits, prompts_for, relative_l2)

SPLIT_RELATIVE_L2 = 1e-3
SPLITS = (2, 4)

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


@pytest.mark.parametrize("weight_format", WEIGHT_FORMATS)
@pytest.mark.parametrize("num_devices", splits_available())
def test_split_prefill_logits_match_one_gpu_and_the_cpu_backend(weight_format, num_devices):
    model_dir = wide_model(weight_format)
    with Engine(model_dir, backend="cpu", num_threads=2, **ENGINE_OPTIONS) as cpu, \
            Engine(model_dir, backend="cuda", **ENGINE_OPTIONS) as one, \
            Engine(model_dir, backend="cuda", num_devices=num_devices, **ENGINE_OPTIONS) as split:
        assert split.info().num_devices == num_devices
        for prompt in prompts_for(cpu):
            reference, single, spread = (first_logits(engine, prompt) for engine in (cpu, one, split))
            to_one, to_cpu = relative_l2(spread, single), relative_l2(spread, reference)
            print(f"{weight_format} over {num_devices} GPUs, prompt of {len(prompt)}: "
                  f"relative L2 {to_one:.3e} to one GPU, {to_cpu:.3e} to the CPU backend")
            assert np.all(np.isfinite(spread))
            assert to_one < SPLIT_RELATIVE_L2
            assert to_cpu < PREFILL_RELATIVE_L2


@pytest.mark.parametrize("weight_format", WEIGHT_FORMATS)
def test_split_greedy_tokens_follow_the_cpu_backend_until_a_near_tie(weight_format):
    model_dir = wide_model(weight_format)
    agreed, total = 0, 0
    with Engine(model_dir, backend="cpu", num_threads=2, **ENGINE_OPTIONS) as cpu, \
            Engine(model_dir, backend="cuda", num_devices=2, **ENGINE_OPTIONS) as split:
        for prompt in prompts_for(cpu):
            cpu_tokens, cpu_rows = greedy_with_logits(cpu, prompt, NEW_TOKENS)
            split_tokens, _ = greedy_with_logits(split, prompt, NEW_TOKENS)
            index, margin = first_divergence_margin(cpu_tokens, cpu_rows, split_tokens)
            agreed += index
            total += len(cpu_tokens)
            assert len(split_tokens) == len(cpu_tokens)
            assert margin <= TIE_MARGIN, f"diverged at token {index} where the CPU margin was {margin}"
    print(f"{weight_format} over 2 GPUs: {agreed} of {total} greedy tokens agree before any near-tie divergence")


@pytest.mark.parametrize("params", [greedy(24), SamplingParams(temperature=0.8, top_p=0.9, top_k=40, seed=7,
                                                                max_new_tokens=24, ignore_eos=True,
                                                                repetition_penalty=1.1)])
def test_split_batched_requests_equal_solo_requests(params):
    with Engine(wide_model("fp8-block"), backend="cuda", num_devices=2, **ENGINE_OPTIONS) as engine:
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


def glm47_dir(tmp_path, layers):
    config = json.loads(GLM47_CONFIG.read_text())
    config["num_hidden_layers"] = layers
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


def test_real_glm47_shape_splits_its_weights_over_two_gpus_and_computes_the_same_model(tmp_path):
    model_dir = glm47_dir(tmp_path, 5)
    settings = dict(random_weights=True, random_seed=3, max_batch=4, max_tokens_per_step=128, kv_page_size=16,
                    kv_num_pages=64)
    prompts = [prompt_of_length(n, 150000, n) for n in (1, 70)]
    with Engine(model_dir, backend="cuda", **settings) as one:
        whole = one.info().weight_bytes
        page_bytes = one.info().kv_bytes_per_page
        expected = [greedy_with_logits(one, prompt, 6) for prompt in prompts]
    with Engine(model_dir, backend="cuda", num_devices=2, **settings) as split:
        info = split.info()
        config = split.config
        replicated = config.vocab_size * config.hidden_size * 2 + 2 * config.n_routed_experts * config.hidden_size * 4
        assert info.num_devices == 2
        assert info.kv_bytes_per_page == page_bytes
        assert whole < info.weight_bytes < whole + replicated
        for prompt, (tokens, rows) in zip(prompts, expected):
            split_tokens, split_rows = greedy_with_logits(split, prompt, 6)
            error = relative_l2(split_rows[0], rows[0])
            index, margin = first_divergence_margin(tokens, rows, split_tokens)
            print(f"GLM-4.7 shape, 5 layers, prompt of {len(prompt)}: relative L2 {error:.3e} to one GPU, "
                  f"{index} of {len(tokens)} greedy tokens agree before any near-tie")
            assert np.all(np.isfinite(split_rows[0]))
            assert error < SPLIT_RELATIVE_L2
            assert margin <= TIE_MARGIN


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
    harness = pytest.importorskip("server_harness")
    from glmrt.config import load_model_config
    from glmrt.tokenizer import Tokenizer

    model_dir = harness.build_server_test_model(tmp_path / "model")
    tokenizer = Tokenizer(model_dir)
    eos_ids = load_model_config(model_dir).eos_token_ids
    requests = [{"prompt": "The river by the old mill", "max_tokens": 24, "temperature": 0.0, "seed": 1},
                {"prompt": "kitchen window morning", "max_tokens": 24, "temperature": 0.8, "top_p": 0.9,
                 "repetition_penalty": 1.2, "seed": 7}]
    jobs = [(harness.prompt_ids_for(tokenizer, request), harness.sampling_params_for(request, eos_ids))
            for request in requests]
    expected = harness.solo_outputs(model_dir, jobs, backend="cuda", num_devices=2)
    with harness.ServerProcess(tmp_path / "logs", model_dir, backend="cuda", num_devices=2, max_batch=8,
                               max_tokens_per_step=64) as server:
        for request, tokens in zip(requests, expected):
            record = asyncio.run(harness.generate(server.ws_url, request))
            assert record.errors == []
            assert record.done["status"] == "completed"
            assert record.token_ids == tokens
        assert "over 2 device(s)" in server.stdout_text()
