import ctypes
import functools
import os
import tempfile
from pathlib import Path

from glmrt.engine.engine import Engine, SamplingParams
from glmrt.engine.native import BACKEND_CUDA, library_path

MODEL_ROOT = Path(os.environ.get("GLMRT_TEST_MODEL_ROOT", tempfile.gettempdir())) / f"glmrt-test-models-{os.getpid()}"


@functools.lru_cache(maxsize=None)
def build_test_model(weight_format="bf16", seed=0, **overrides):
    from glmrt.testmodel.writer import write_test_model

    suffix = "-".join(f"{key}{value}" for key, value in sorted(overrides.items()))
    out_dir = MODEL_ROOT / f"{weight_format}-s{seed}-{suffix}"
    return Path(write_test_model(out_dir, seed=seed, weight_format=weight_format, **overrides))


def open_engine(model_dir, **options):
    settings = dict(num_threads=2, max_batch=16, max_tokens_per_step=128, kv_page_size=16, kv_num_pages=256)
    settings.update(options)
    return Engine(model_dir, **settings)


def run_to_completion(engine, requests, step_limit=10_000):
    outputs = {id(request): [] for request in requests}
    active = list(requests)
    steps = 0
    while active:
        steps += 1
        if steps > step_limit:
            raise AssertionError("requests did not finish within the step limit")
        tokens, done = engine.step(active)
        still_active = []
        for request, token, reason in zip(active, tokens, done):
            if token >= 0:
                outputs[id(request)].append(token)
            if reason == 0:
                still_active.append(request)
        active = still_active
    return [outputs[id(request)] for request in requests]


def step_rows_until_done(engine, requests, run_step):
    produced = []
    active = list(requests)
    while active:
        tokens, codes = run_step(engine, active)
        produced.append((list(tokens), list(codes)))
        active = [request for request, code in zip(active, codes) if code == 0]
    return produced


def relaunched_rows(engine, requests, on_finish=None):
    produced = []
    active = list(requests)
    engine.launch(active)
    while active:
        tokens, codes, relaunched = engine.complete_and_relaunch()
        produced.append((list(tokens), list(codes)))
        finished = [request for request, code in zip(active, codes) if code != 0]
        active = [request for request, code in zip(active, codes) if code == 0]
        assert relaunched == bool(active)
        if on_finish is not None:
            for request in finished:
                on_finish(engine, request)
    return produced


def stats_with_every_page_back(engine):
    engine.check_invariants()
    stats = engine.stats()
    assert stats.kv_pages_free == stats.kv_pages_total
    return stats


def launch_then_complete(engine, requests, between_steps=None):
    engine.launch(requests)
    if between_steps is not None:
        between_steps(engine)
    return engine.complete()


def prompt_of_length(length, vocab_size, seed):
    import numpy as np

    rng = np.random.default_rng(seed)
    return [int(t) for t in rng.integers(0, min(vocab_size, 1000), size=length)]


def greedy(max_new_tokens=16, **kwargs):
    return SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens, ignore_eos=True, **kwargs)


def cuda_device_count():
    try:
        driver = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return 0
    count = ctypes.c_int(0)
    if driver.cuInit(0) != 0 or driver.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return 0
    return count.value


def cuda_ready():
    return library_path(BACKEND_CUDA).exists() and cuda_device_count() > 0
