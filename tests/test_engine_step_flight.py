import ctypes

import pytest
from engine_support import (build_test_model, greedy, launch_then_complete, open_engine, prompt_of_length,
                            step_rows_until_done)

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
