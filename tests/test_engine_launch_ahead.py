import random

import pytest
from engine_support import (build_test_model, cuda_ready, greedy, open_engine, prompt_of_length, relaunched_rows,
                            stats_with_every_page_back, step_rows_until_done)

from glmrt.engine import native
from glmrt.engine.engine import Engine, SamplingParams
from glmrt.engine.errors import GlmrtError


@pytest.fixture(scope="module")
def model_dir():
    return build_test_model("bf16")


def make_requests(engine, lengths, params_of):
    return [engine.create_request(prompt_of_length(5 + 7 * i, engine.vocab_size, 60 + i), params_of(i))
            for i, _ in enumerate(lengths)]


CPU_AHEAD = dict(launch_ahead="always")
CUDA_AHEAD = dict(backend="cuda", launch_ahead="auto")


def expected_rows(model_dir, lengths, params_of, **options):
    settings = dict(options, launch_ahead="off")
    with open_engine(model_dir, **settings) as engine:
        assert engine.info().launch_ahead == 0
        return step_rows_until_done(engine, make_requests(engine, lengths, params_of), Engine.step)


def ahead_rows(model_dir, lengths, params_of, on_finish=None, **options):
    with open_engine(model_dir, **(options or CPU_AHEAD)) as engine:
        assert engine.info().launch_ahead == 1
        requests = make_requests(engine, lengths, params_of)
        rows = relaunched_rows(engine, requests, on_finish)
        for request in requests:
            if on_finish is None:
                engine.free_request(request)
        stats = stats_with_every_page_back(engine)
        assert stats.live_requests == 0
        return rows, stats


def free_at_finish(engine, request):
    engine.free_request(request)


def test_steps_launched_ahead_give_the_tokens_of_steps_launched_after_completion(model_dir):
    lengths = (3, 6, 9, 12)

    def params_of(i):
        return greedy(lengths[i])

    expected = expected_rows(model_dir, lengths, params_of)
    rows, stats = ahead_rows(model_dir, lengths, params_of)
    assert rows == expected
    assert stats.tokens_generated == sum(lengths)
    assert stats.steps_launched_ahead == len(rows) - 1
    assert stats.steps == len(rows)


def test_requests_freed_as_they_finish_while_a_step_runs_ahead_lose_nothing(model_dir):
    lengths = (2, 5, 7)

    def params_of(i):
        return greedy(lengths[i])

    expected = expected_rows(model_dir, lengths, params_of)
    rows, _ = ahead_rows(model_dir, lengths, params_of, on_finish=free_at_finish)
    assert rows == expected


def stop_token_of(model_dir, request_index, step_index, lengths, **options):
    rows = expected_rows(model_dir, lengths, lambda i: greedy(lengths[i]), **options)
    return rows[step_index][0][request_index]


def test_a_stop_token_sampled_under_a_step_ahead_drops_that_step_for_its_request(model_dir):
    lengths = (10, 10, 10)
    stop = stop_token_of(model_dir, 1, 3, lengths)

    def params_of(i):
        return SamplingParams(temperature=0.0, max_new_tokens=lengths[i], stop_token_ids=[stop])

    expected = expected_rows(model_dir, lengths, params_of)
    assert any(native.finish_reason_name(code) == "stop" for _, codes in expected for code in codes)
    rows, stats = ahead_rows(model_dir, lengths, params_of, on_finish=free_at_finish)
    assert rows == expected
    assert stats.tokens_generated == sum(1 for tokens, _ in expected for token in tokens if token >= 0)
    assert stats.steps_launched_ahead == len(rows) - 1


def test_a_batch_that_stops_entirely_under_a_step_ahead_lets_the_next_batch_run(model_dir):
    lengths = (10,)
    stop = stop_token_of(model_dir, 0, 2, lengths)
    follow_prompt = prompt_of_length(11, 1000, 99)
    with open_engine(model_dir, launch_ahead="off") as engine:
        follow = engine.create_request(follow_prompt, greedy(4))
        expected_follow = step_rows_until_done(engine, [follow], Engine.step)

    def params_of(i):
        return SamplingParams(temperature=0.0, max_new_tokens=lengths[i], stop_token_ids=[stop])

    expected = expected_rows(model_dir, lengths, params_of)
    with open_engine(model_dir, launch_ahead="always") as engine:
        requests = make_requests(engine, lengths, params_of)
        assert relaunched_rows(engine, requests, on_finish=free_at_finish) == expected
        assert engine.stats().steps_launched_ahead == len(expected)
        follow = engine.create_request(follow_prompt, greedy(4))
        assert relaunched_rows(engine, [follow]) == expected_follow
        engine.free_request(follow)
        stats_with_every_page_back(engine)


def test_seeded_sampling_draws_the_same_tokens_a_step_ahead(model_dir):
    lengths = (6, 9)

    def params_of(i):
        return SamplingParams(temperature=0.9, top_p=0.95, top_k=40, max_new_tokens=lengths[i], seed=1234 + i,
                              ignore_eos=True)

    expected = expected_rows(model_dir, lengths, params_of)
    rows, _ = ahead_rows(model_dir, lengths, params_of)
    assert rows == expected


def test_penalties_that_read_the_last_token_keep_steps_after_completion(model_dir):
    lengths = (5, 8)

    def params_of(i):
        return SamplingParams(temperature=0.0, max_new_tokens=lengths[i], repetition_penalty=1.3, ignore_eos=True)

    expected = expected_rows(model_dir, lengths, params_of)
    rows, stats = ahead_rows(model_dir, lengths, params_of)
    assert rows == expected
    assert stats.step_gaps == len(rows) - 1
    assert stats.steps_launched_ahead == 0


def test_launch_ahead_is_off_by_default_where_the_launch_is_the_forward(model_dir):
    with open_engine(model_dir) as engine:
        assert engine.info().asynchronous_launch == 0
        assert engine.info().launch_ahead == 0
    with pytest.raises(ValueError, match="launch_ahead must be one of \\['always', 'auto', 'off'\\], got 'soon'"):
        Engine(model_dir, launch_ahead="soon")



@pytest.mark.gpu
@pytest.mark.skipif(not cuda_ready(), reason="needs an NVIDIA GPU and build/libglmrt_cuda.so")
@pytest.mark.parametrize("sampled", (False, True))
@pytest.mark.parametrize("weight_format", ("bf16", "fp8-block"))
def test_cuda_steps_launched_ahead_equal_steps_after_completion_bit_for_bit(weight_format, sampled):
    directory = build_test_model(weight_format)
    lengths = (4, 7, 12, 17)
    stop = stop_token_of(directory, 2, 3, lengths, backend="cuda")

    def params_of(i):
        if sampled:
            return SamplingParams(temperature=0.8, top_p=0.9, max_new_tokens=lengths[i], seed=77 + i,
                                  stop_token_ids=[stop])
        return SamplingParams(temperature=0.0, max_new_tokens=lengths[i], stop_token_ids=[stop])

    expected = expected_rows(directory, lengths, params_of, backend="cuda")
    rows, stats = ahead_rows(directory, lengths, params_of, on_finish=free_at_finish, **CUDA_AHEAD)
    assert rows == expected
    assert stats.steps_launched_ahead >= len(rows) - 1


def churn_request(engine, rng):
    params = SamplingParams(temperature=rng.choice([0.0, 0.7]), max_new_tokens=rng.randint(1, 30),
                            seed=rng.randint(0, 1000), stop_token_ids=[rng.randint(0, 40)])
    try:
        return engine.create_request(prompt_of_length(rng.randint(1, 70), engine.vocab_size, rng.randint(0, 10**6)),
                                     params)
    except GlmrtError as error:
        assert error.status_name == "OUT_OF_PAGES"
        return None


def retire_finished(engine, live, active, codes):
    for request, code in zip(active, codes):
        if code:
            live.remove(request)
            engine.free_request(request)
    return [request for request, code in zip(active, codes) if code == 0]


def relaunch_chain(engine, rng, live):
    try:
        engine.launch(live)
    except GlmrtError as error:
        assert error.status_name == "OUT_OF_PAGES"
        engine.preempt_request(live[-1])
        return 1
    active, steps = list(live), 0
    for _ in range(rng.randint(1, 6)):
        _, codes, relaunched = engine.complete_and_relaunch()
        steps += 1
        active = retire_finished(engine, live, active, codes)
        if not relaunched:
            return steps
    _, codes = engine.complete()
    retire_finished(engine, live, active, codes)
    return steps + 1


def run_ahead_churn(engine, steps_wanted, seed):
    rng = random.Random(seed)
    live, steps = [], 0
    while steps < steps_wanted:
        action = rng.random()
        if action < 0.35 and len(live) < 12:
            request = churn_request(engine, rng)
            if request is not None:
                live.append(request)
        elif action < 0.42 and live:
            engine.free_request(live.pop(rng.randrange(len(live))))
        if live:
            steps += relaunch_chain(engine, rng, live)
        if steps % 500 < 6:
            engine.check_invariants()
    for request in live:
        engine.free_request(request)
    stats = stats_with_every_page_back(engine)
    assert stats.live_requests == 0
    return stats


def test_relaunch_churn_with_steps_ahead_returns_every_page(model_dir):
    with open_engine(model_dir, kv_num_pages=64, launch_ahead="always") as engine:
        stats = run_ahead_churn(engine, 1500, 11)
    assert stats.steps_launched_ahead > 300


@pytest.mark.gpu
@pytest.mark.skipif(not cuda_ready(), reason="needs an NVIDIA GPU and build/libglmrt_cuda.so")
def test_cuda_relaunch_churn_with_steps_ahead_returns_every_page():
    with open_engine(build_test_model("bf16"), backend="cuda", kv_num_pages=64) as engine:
        assert engine.info().launch_ahead == 1
        stats = run_ahead_churn(engine, 3000, 12)
    assert stats.steps_launched_ahead > 600


def test_prefix_cache_hits_and_registrations_match_with_steps_ahead(model_dir):
    shared = prompt_of_length(40, 1000, 7)

    def run(launch_ahead):
        with open_engine(model_dir, launch_ahead=launch_ahead) as engine:
            rows = []
            for round_index in range(3):
                requests = [engine.create_request(shared + [11 + round_index, 12 + i], greedy(9)) for i in range(3)]
                rows.append(relaunched_rows(engine, requests))
                for request in requests:
                    engine.free_request(request)
            stats = stats_with_every_page_back(engine)
            return rows, stats

    expected, plain = run("off")
    rows, ahead = run("always")
    assert rows == expected
    assert ahead.prefix_cache_hits == plain.prefix_cache_hits > 0
    assert ahead.prefix_cache_queries == plain.prefix_cache_queries
    assert ahead.steps_launched_ahead > 0 and plain.steps_launched_ahead == 0


def test_a_request_stopped_under_a_step_ahead_gives_back_the_page_that_step_took(model_dir):
    prompt = prompt_of_length(32, 1000, 5)
    with open_engine(model_dir, launch_ahead="off") as engine:
        request = engine.create_request(prompt, greedy(4))
        first = step_rows_until_done(engine, [request], Engine.step)[0][0][0]
    with open_engine(model_dir, launch_ahead="always") as engine:
        params = SamplingParams(temperature=0.0, max_new_tokens=4, stop_token_ids=[first])
        stopping = engine.create_request(prompt, params)
        engine.launch([stopping])
        tokens, codes, relaunched = engine.complete_and_relaunch()
        assert list(tokens) == [first] and native.finish_reason_name(codes[0]) == "stop" and not relaunched
        assert engine.stats().steps_launched_ahead == 1
        info = stopping.info()
        assert (info.num_computed_tokens, info.num_pages) == (32, 2)
        engine.check_invariants()
        engine.free_request(stopping)
        follow = engine.create_request(prompt, greedy(3))
        assert [row[0][0] for row in relaunched_rows(engine, [follow])][0] == first
        engine.free_request(follow)
        stats_with_every_page_back(engine)
