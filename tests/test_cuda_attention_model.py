import os

import numpy as np
import pytest
from engine_support import build_test_model, cuda_ready, greedy, prompt_of_length

from glmrt.engine.engine import Engine
from glmrt.engine.errors import GlmrtError

WEIGHT_FORMATS = ("bf16", "fp8-channel", "fp8-block")
CONTEXTS = (1, 15, 16, 17, 511, 512, 513, 4096, 32768)
LOGITS_RELATIVE_L2 = 2e-2
LONG_MODEL = dict(head_dim=64, num_attention_heads=2, num_key_value_heads=1, num_hidden_layers=2,
                  max_position_embeddings=33280)
LONG_ENGINE = dict(max_batch=4, max_tokens_per_step=1024, kv_page_size=16, kv_num_pages=2200)
MIXED_ENGINE = dict(max_batch=8, max_tokens_per_step=513, kv_page_size=16, kv_num_pages=1200)
CPU_THREADS = int(os.environ.get("GLMRT_CPU_THREADS", str(os.cpu_count() or 2)))
MATMUL_PRECISION = os.environ.get("GLMRT_ATTENTION_TEST_MATMULS", "high")

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not cuda_ready(), reason="needs an NVIDIA GPU and build/libglmrt_cuda.so")]


def relative_l2(actual, expected):
    return float(np.linalg.norm(actual - expected) / np.linalg.norm(expected))


def prefill_and_decode_logits(engine, prompt):
    request = engine.create_request(prompt, greedy(2))
    rows = []
    while len(rows) < 2:
        tokens, done, logits = engine.step_with_logits([request])
        if tokens[0] >= 0:
            rows.append(logits[0].copy())
        if done[0]:
            break
    engine.free_request(request)
    return rows


@pytest.mark.parametrize("weight_format", WEIGHT_FORMATS)
def test_cuda_attention_logits_match_cpu_at_every_context_length(weight_format):
    model_dir = build_test_model(weight_format, **LONG_MODEL)
    base = prompt_of_length(max(CONTEXTS), 2048, seed=11)
    with Engine(model_dir, backend="cpu", num_threads=CPU_THREADS, **LONG_ENGINE) as cpu, \
            Engine(model_dir, backend="cuda", matmul_precision=MATMUL_PRECISION, **LONG_ENGINE) as gpu:
        for context in CONTEXTS:
            expected = prefill_and_decode_logits(cpu, base[:context])
            actual = prefill_and_decode_logits(gpu, base[:context])
            assert len(expected) == len(actual) == 2
            for label, want, got in zip(("prefill", "decode"), expected, actual):
                error = relative_l2(got, want)
                print(f"{weight_format} {label} at context {context + (label == 'decode')}: relative L2 {error:.3e}")
                assert np.all(np.isfinite(got))
                assert error < LOGITS_RELATIVE_L2


def run_with_logits(engine, requests):
    outputs = {id(request): ([], []) for request in requests}
    active = list(requests)
    while active:
        tokens, done, logits = engine.step_with_logits(active)
        still_active = []
        for index, request in enumerate(active):
            if tokens[index] >= 0:
                outputs[id(request)][0].append(tokens[index])
                outputs[id(request)][1].append(logits[index].copy())
            if done[index] == 0:
                still_active.append(request)
        active = still_active
    return [outputs[id(request)] for request in requests]


def mixed_prompts(vocab_size):
    lengths = (514, 700, 1, 1030, 513, 4000, 2, 600)
    return [prompt_of_length(n, vocab_size, seed=300 + n) for n in lengths]


@pytest.mark.parametrize("weight_format", ("bf16", "fp8-channel"))
def test_cuda_batched_logits_equal_solo_logits_with_long_neighbours(weight_format):
    model_dir = build_test_model(weight_format, **LONG_MODEL)
    with Engine(model_dir, backend="cuda", enable_prefix_caching=False, matmul_precision=MATMUL_PRECISION,
                **MIXED_ENGINE) as engine:
        prompts = mixed_prompts(engine.vocab_size)
        solo = []
        for prompt in prompts:
            request = engine.create_request(prompt, greedy(6))
            solo.append(run_with_logits(engine, [request])[0])
            engine.free_request(request)
        requests = [engine.create_request(prompt, greedy(6)) for prompt in prompts]
        batched = run_with_logits(engine, requests)
        for request in requests:
            engine.free_request(request)
        for prompt, (solo_tokens, solo_rows), (tokens, rows) in zip(prompts, solo, batched):
            assert tokens == solo_tokens, f"prompt of {len(prompt)} tokens"
            for solo_row, row in zip(solo_rows, rows):
                assert np.array_equal(solo_row.view(np.uint32), row.view(np.uint32)), f"prompt of {len(prompt)} tokens"
        stats = engine.stats()
        assert stats.kv_pages_free == stats.kv_pages_total


def test_cuda_single_token_prefill_chunk_past_512_equals_a_longer_chunk():
    model_dir = build_test_model("fp8-block", **LONG_MODEL)
    prompt = prompt_of_length(514, 2048, seed=77)
    rows = []
    for step_tokens in (513, 514, 300):
        settings = dict(MIXED_ENGINE, max_tokens_per_step=step_tokens)
        with Engine(model_dir, backend="cuda", enable_prefix_caching=False, matmul_precision=MATMUL_PRECISION,
                    **settings) as engine:
            request = engine.create_request(prompt, greedy(3))
            rows.append(run_with_logits(engine, [request])[0])
            engine.free_request(request)
    for tokens, logits in rows[1:]:
        assert tokens == rows[0][0]
        for row, first in zip(logits, rows[0][1]):
            assert np.array_equal(row.view(np.uint32), first.view(np.uint32))


def test_a_head_size_without_attention_kernels_is_refused_when_the_engine_is_created():
    model_dir = build_test_model("bf16", head_dim=96)
    with pytest.raises(GlmrtError) as raised:
        Engine(model_dir, backend="cuda", max_batch=2, max_tokens_per_step=16, kv_page_size=16, kv_num_pages=8)
    assert raised.value.status_name == "UNSUPPORTED"
    assert "head_dim 32, 64 or 128, the model has 96" in raised.value.message
