import ctypes
import threading
import time

import pytest
from engine_support import (build_test_model, greedy, launch_then_complete, open_engine, prompt_of_length,
                            relaunched_rows, step_rows_until_done)

from glmrt.engine import native
from glmrt.engine.engine import Engine
from glmrt.engine.errors import GlmrtError


@pytest.fixture(scope="module")
def model_dir():
    return build_test_model("bf16")


def make_requests(engine, count, max_new_tokens=6):
    return [engine.create_request(prompt_of_length(5 + 7 * i, engine.vocab_size, 40 + i), greedy(max_new_tokens))
            for i in range(count)]


def test_launch_then_complete_equals_the_synchronous_step(model_dir):
    with open_engine(model_dir) as engine:
        expected = step_rows_until_done(engine, make_requests(engine, 3), Engine.step)
    with open_engine(model_dir) as engine:
        bystander = engine.create_request([9, 8, 7], greedy())
        spare = []

        def work_while_in_flight(engine):
            stats = engine.stats()
            assert stats.live_requests >= 4
            spare.append(engine.create_request([1, 2, 3, 4], greedy()))
            engine.free_request(spare.pop())

        requests = make_requests(engine, 3)
        launched = step_rows_until_done(
            engine, requests, lambda engine, active: launch_then_complete(engine, active, work_while_in_flight))
        assert launched == expected
        assert engine.stats().device_forward_ns > 0
        assert engine.stats().rows_owned_steps == 0
        for request in requests + [bystander]:
            engine.free_request(request)
        engine.check_invariants()
        assert engine.stats().kv_pages_free == engine.stats().kv_pages_total


def expect_refusal(call, words):
    with pytest.raises(GlmrtError) as raised:
        call()
    assert raised.value.status_name == "INVALID_ARGUMENT"
    assert words in raised.value.message


def test_a_step_in_flight_refuses_what_would_change_its_requests(model_dir):
    with open_engine(model_dir) as engine:
        requests = make_requests(engine, 2)
        outsider = engine.create_request([3, 4, 5], greedy())
        expect_refusal(engine.complete, "no step is in flight")
        engine.launch(requests)
        expect_refusal(lambda: engine.launch([outsider]), "a step is in flight")
        expect_refusal(lambda: engine.step([outsider]), "a step is in flight")
        expect_refusal(lambda: engine.plan_step([outsider]), "a step is in flight")
        expect_refusal(engine.check_invariants, "a step is in flight")
        expect_refusal(lambda: engine.free_request(requests[0]), "in the step in flight")
        expect_refusal(lambda: engine.preempt_request(requests[1]), "in the step in flight")
        assert not requests[0].is_freed
        assert requests[0].info().num_computed_tokens == 0
        tokens, codes = engine.complete()
        assert len(tokens) == 2 and all(token >= 0 for token in tokens) and list(codes) == [0, 0]
        assert [request.info().num_generated_tokens for request in requests] == [1, 1]
        for request in requests + [outsider]:
            engine.free_request(request)
        engine.check_invariants()


def test_complete_with_too_little_room_keeps_the_step_in_flight(model_dir):
    with open_engine(model_dir) as engine:
        requests = make_requests(engine, 3)
        engine.launch(requests)
        tokens = (ctypes.c_int64 * 2)()
        codes = (ctypes.c_int32 * 2)()
        count = ctypes.c_int32(-1)
        status = engine._lib.glmrt_step_complete(engine._handle, 2, tokens, codes, ctypes.byref(count))
        assert status == native.STATUS_INVALID_ARGUMENT
        assert "has 3 requests, the outputs hold 2" in engine._last_error()
        assert count.value == 0
        tokens, codes = engine.complete()
        assert len(tokens) == 3
        for request in requests:
            engine.free_request(request)
        engine.check_invariants()


def test_closing_an_engine_with_a_step_in_flight_returns_cleanly(model_dir):
    engine = open_engine(model_dir)
    requests = make_requests(engine, 4)
    engine.launch(requests)
    engine.close()
    assert engine.closed


def test_step_gaps_count_host_time_between_steps_that_continue_a_request(model_dir):
    with open_engine(model_dir) as engine:
        requests = make_requests(engine, 2, max_new_tokens=8)
        launch_then_complete(engine, requests)
        assert engine.stats().step_gaps == 0
        time.sleep(0.05)
        launch_then_complete(engine, requests)
        first = engine.stats()
        assert first.step_gaps == 1
        assert 0.05e9 <= first.step_gap_ns < 5e9
        launch_then_complete(engine, requests)
        second = engine.stats()
        assert second.step_gaps == 2
        assert second.step_gap_ns > first.step_gap_ns
        newcomer = engine.create_request([5, 6, 7], greedy(4))
        time.sleep(0.02)
        launch_then_complete(engine, [newcomer])
        assert engine.stats().step_gaps == 2
        assert engine.stats().step_gap_ns == second.step_gap_ns
        launch_then_complete(engine, requests + [newcomer])
        assert engine.stats().step_gaps == 3
        assert engine.stats().mean_step_gap_ns == engine.stats().step_gap_ns / 3
        for request in requests + [newcomer]:
            engine.free_request(request)


def test_the_cpu_forward_lets_other_python_threads_run(model_dir):
    with open_engine(model_dir, num_threads=1, max_tokens_per_step=1024, kv_num_pages=512) as engine:
        request = engine.create_request(prompt_of_length(1000, engine.vocab_size, 7), greedy(1))
        ticks = []
        stop = threading.Event()

        def tick():
            while not stop.is_set():
                ticks.append(time.perf_counter())

        ticker = threading.Thread(target=tick)
        ticker.start()
        begin = time.perf_counter()
        engine.launch([request])
        end = time.perf_counter()
        stop.set()
        ticker.join()
        engine.complete()
        engine.free_request(request)
        inside = [stamp for stamp in ticks if begin < stamp < end]
        assert end - begin > 0.01
        assert len(inside) > 1 and max(inside) - min(inside) > 0.5 * (end - begin)


def relaunched_rows_until_done(engine, requests):
    produced = relaunched_rows(engine, requests)
    expect_refusal(engine.complete, "no step is in flight")
    return produced


def test_complete_and_relaunch_steps_the_unfinished_requests_as_launch_and_complete_would(model_dir):
    with open_engine(model_dir) as engine:
        expected = step_rows_until_done(engine, make_requests(engine, 4), Engine.step)
    with open_engine(model_dir) as engine:
        assert engine.info().asynchronous_launch == 0
        requests = make_requests(engine, 4)
        rows = relaunched_rows_until_done(engine, requests)
        assert rows == expected
        stats = engine.stats()
        assert stats.step_gaps == len(rows) - 1
        for request in requests:
            engine.free_request(request)
        engine.check_invariants()
        assert engine.stats().kv_pages_free == engine.stats().kv_pages_total


def test_relaunch_that_needs_more_pages_than_are_free_leaves_nothing_in_flight(model_dir):
    with open_engine(model_dir, kv_num_pages=3) as engine:
        requests = [engine.create_request(prompt_of_length(15, engine.vocab_size, 80 + i), greedy(10))
                    for i in range(2)]
        engine.launch(requests)
        _, _, relaunched = engine.complete_and_relaunch()
        assert relaunched
        tokens, codes, relaunched = engine.complete_and_relaunch()
        assert not relaunched and all(token >= 0 for token in tokens) and list(codes) == [0, 0]
        assert engine.stats().kv_pages_free == 1
        assert [request.info().num_computed_tokens for request in requests] == [16, 16]
        expect_refusal(engine.complete, "no step is in flight")
        with pytest.raises(GlmrtError) as raised:
            engine.launch(requests)
        assert raised.value.status_name == "OUT_OF_PAGES"
        engine.preempt_request(requests[1])
        engine.launch([requests[0]])
        engine.complete()
        for request in requests:
            engine.free_request(request)
        engine.check_invariants()
