import ctypes

import pytest
from engine_support import build_test_model, greedy, open_engine, prompt_of_length, run_to_completion

from glmrt.engine import native
from glmrt.engine.errors import GlmrtError
from glmrt.model.config import load_model_config
from glmrt.model.native_config import native_model_config


@pytest.fixture(scope="module")
def model_dir():
    return build_test_model("bf16")


def test_empty_batch_does_nothing(model_dir):
    with open_engine(model_dir) as engine:
        before = engine.stats()
        assert engine.step([]) == ([], [])
        after = engine.stats()
        assert after.tokens_processed == before.tokens_processed
        assert after.kv_pages_free == before.kv_pages_free


def test_batch_of_one_generates_until_max_new_tokens(model_dir):
    with open_engine(model_dir) as engine:
        request = engine.create_request(prompt_of_length(9, engine.vocab_size, 1), greedy(max_new_tokens=5))
        tokens = run_to_completion(engine, [request])[0]
        info = request.info()
        assert len(tokens) == 5
        assert info.num_generated_tokens == 5
        assert info.finish_reason_name == "length"
        assert request.tokens()[9:] == tokens
        engine.free_request(request)


def test_max_batch_runs_and_one_more_is_rejected_by_the_library(model_dir):
    with open_engine(model_dir, max_batch=4, max_tokens_per_step=64) as engine:
        requests = [engine.create_request(prompt_of_length(4 + i, engine.vocab_size, i), greedy(max_new_tokens=3))
                    for i in range(5)]
        outputs = run_to_completion(engine, requests[:4])
        assert all(len(tokens) == 3 for tokens in outputs)
        states = (native.request_p * 5)(*[request.handle for request in requests])
        tokens = (ctypes.c_int64 * 5)()
        done = (ctypes.c_int32 * 5)()
        status = engine._lib.glmrt_run_batch_decode(engine._handle, states, 5, tokens, done)
        assert status == 1
        assert "batch" in engine._last_error()
        with pytest.raises(GlmrtError):
            engine.step(requests)
        for request in requests:
            engine.free_request(request)
        engine.check_invariants()


def test_request_that_exactly_fills_the_pool_runs_and_returns_every_page(model_dir):
    with open_engine(model_dir, kv_num_pages=4, kv_page_size=16, max_tokens_per_step=64) as engine:
        prompt = prompt_of_length(64, engine.vocab_size, 2)
        request = engine.create_request(prompt, greedy(max_new_tokens=8))
        tokens = run_to_completion(engine, [request])[0]
        assert len(tokens) == 1
        assert request.info().finish_reason_name == "length"
        assert engine.stats().kv_pages_free == 0
        engine.free_request(request)
        assert engine.stats().kv_pages_free == 4
        with pytest.raises(GlmrtError) as too_big:
            engine.create_request(prompt + [1], greedy())
        assert too_big.value.status_name == "OUT_OF_PAGES"


def test_prompt_without_tokens_is_an_error(model_dir):
    with open_engine(model_dir) as engine:
        with pytest.raises(GlmrtError) as error:
            engine.create_request([], greedy())
        assert error.value.status_name == "INVALID_ARGUMENT"
        assert "no tokens" in error.value.message
        assert engine.stats().live_requests == 0


def test_prompt_beyond_the_context_limit_is_an_error(model_dir):
    with open_engine(model_dir, max_context=100) as engine:
        with pytest.raises(GlmrtError) as error:
            engine.create_request(prompt_of_length(150, engine.vocab_size, 3), greedy())
        assert error.value.status_name == "CONTEXT_LENGTH"
        assert engine.stats().live_requests == 0


def test_token_outside_the_vocabulary_is_an_error(model_dir):
    with open_engine(model_dir) as engine:
        with pytest.raises(GlmrtError) as error:
            engine.create_request([1, engine.vocab_size], greedy())
        assert error.value.status_name == "INVALID_ARGUMENT"


def test_out_of_pages_leaves_every_request_unchanged_and_others_continue(model_dir):
    with open_engine(model_dir, kv_num_pages=6, kv_page_size=16, max_tokens_per_step=128) as engine:
        first = engine.create_request(prompt_of_length(40, engine.vocab_size, 4), greedy(max_new_tokens=4))
        second = engine.create_request(prompt_of_length(60, engine.vocab_size, 5), greedy(max_new_tokens=4))
        engine.step([first])
        before_first = first.info()
        before_second = second.info()
        free_before = engine.stats().kv_pages_free
        with pytest.raises(GlmrtError) as error:
            engine.step([first, second])
        assert error.value.status_name == "OUT_OF_PAGES"
        assert first.info() == before_first
        assert second.info() == before_second
        assert engine.stats().kv_pages_free == free_before
        engine.check_invariants()
        outputs = run_to_completion(engine, [first])
        assert len(outputs[0]) == 3
        engine.free_request(first)
        assert len(run_to_completion(engine, [second])[0]) == 4
        engine.free_request(second)
        assert engine.stats().kv_pages_free == 6


def test_invalid_sampling_parameters_are_rejected(model_dir):
    from glmrt.engine.engine import SamplingParams

    with open_engine(model_dir) as engine:
        for params in (SamplingParams(temperature=-1.0), SamplingParams(top_p=0.0), SamplingParams(top_k=-2),
                       SamplingParams(min_p=1.5), SamplingParams(repetition_penalty=0.0),
                       SamplingParams(max_new_tokens=0), SamplingParams(stop_token_ids=[engine.vocab_size])):
            with pytest.raises(GlmrtError) as error:
                engine.create_request([1, 2, 3], params)
            assert error.value.status_name == "INVALID_ARGUMENT"
        assert engine.stats().live_requests == 0


def test_freeing_a_request_twice_through_the_library_is_reported(model_dir):
    with open_engine(model_dir) as engine:
        request = engine.create_request([1, 2, 3], greedy())
        handle = request.handle
        engine.free_request(request)
        assert engine.stats().live_requests == 0
        status = engine._lib.glmrt_request_free(engine._handle, handle)
        assert status == 1
        assert "not a live request" in engine._last_error()
        engine.free_request(request)
        engine.check_invariants()


def call_native_step(engine, handles):
    states = (native.request_p * len(handles))(*handles)
    tokens = (ctypes.c_int64 * len(handles))()
    done = (ctypes.c_int32 * len(handles))()
    return engine._lib.glmrt_run_batch_decode(engine._handle, states, len(handles), tokens, done)


def test_step_rejects_a_freed_request_without_touching_it(model_dir):
    with open_engine(model_dir) as engine:
        kept = engine.create_request([1, 2, 3], greedy())
        freed = engine.create_request([4, 5, 6], greedy())
        freed_handle = freed.handle
        engine.free_request(freed)
        assert call_native_step(engine, [kept.handle, freed_handle]) == 1
        assert "batch entry 1 is not a live request" in engine._last_error()
        assert kept.info().num_computed_tokens == 0
        assert call_native_step(engine, [kept.handle, kept.handle]) == 1
        assert "appears twice" in engine._last_error()
        assert call_native_step(engine, [kept.handle]) == 0
        assert kept.info().num_computed_tokens == 3
        engine.free_request(kept)
        engine.check_invariants()


def test_step_rejects_a_request_of_another_engine(model_dir):
    with open_engine(model_dir) as first, open_engine(model_dir) as second:
        foreign = second.create_request([1, 2, 3], greedy())
        assert call_native_step(first, [foreign.handle]) == 1
        assert "not a live request" in first._last_error()
        assert foreign.info().num_computed_tokens == 0
        second.free_request(foreign)


def test_batched_request_infos_equal_the_single_request_infos(model_dir):
    with open_engine(model_dir) as engine:
        requests = [engine.create_request(prompt_of_length(n, engine.vocab_size, n), greedy(max_new_tokens=4))
                    for n in (3, 20, 40)]
        engine.step(requests)
        engine.step(requests)
        assert engine.request_infos(requests) == [request.info() for request in requests]
        assert engine.request_infos([]) == []
        gone = requests.pop()
        gone_handle = gone.handle
        engine.free_request(gone)
        states = (native.request_p * 2)(requests[0].handle, gone_handle)
        infos = (native.RequestInfoStruct * 2)()
        assert engine._lib.glmrt_request_get_infos(engine._handle, states, 2, infos) == 1
        assert "not a live request" in engine._last_error()
        for request in requests:
            engine.free_request(request)


def first_new_token_position(tokens):
    for index in range(2, len(tokens)):
        if tokens[index] not in tokens[:index]:
            return index
    raise AssertionError("greedy output has no fresh token after position 2")


def test_generation_stops_on_a_stop_token_and_by_default_on_the_config_eos_ids(model_dir):
    import dataclasses

    from glmrt.engine.engine import SamplingParams
    from glmrt.model.config import load_model_config

    prompt = prompt_of_length(12, 2048, 21)
    with open_engine(model_dir) as engine:
        request = engine.create_request(prompt, greedy(max_new_tokens=10))
        reference = run_to_completion(engine, [request])[0]
        engine.free_request(request)
        position = first_new_token_position(reference)
        stop_token = reference[position]
        request = engine.create_request(prompt, SamplingParams(temperature=0.0, max_new_tokens=10,
                                                               stop_token_ids=[stop_token]))
        assert run_to_completion(engine, [request])[0] == reference[:position + 1]
        assert request.info().finish_reason_name == "stop"
        engine.free_request(request)
    config = dataclasses.replace(load_model_config(model_dir), eos_token_ids=[stop_token])
    with open_engine(model_dir, config=config) as engine:
        request = engine.create_request(prompt, SamplingParams(temperature=0.0, max_new_tokens=10))
        assert run_to_completion(engine, [request])[0] == reference[:position + 1]
        assert request.info().finish_reason_name == "stop"
        ignoring = engine.create_request(prompt, SamplingParams(temperature=0.0, max_new_tokens=10, ignore_eos=True))
        assert run_to_completion(engine, [ignoring])[0] == reference
        engine.free_request(request)
        engine.free_request(ignoring)


@pytest.mark.parametrize("num_devices, status, words", [(0, "INVALID_ARGUMENT", "num_devices must be in [1, 16]"),
                                                        (17, "INVALID_ARGUMENT", "num_devices must be in [1, 16]"),
                                                        (2, "UNSUPPORTED", "needs the CUDA backend")])
def test_device_count_outside_what_the_backend_runs_is_an_error(model_dir, num_devices, status, words):
    with pytest.raises(GlmrtError) as raised:
        open_engine(model_dir, num_devices=num_devices)
    assert raised.value.status_name == status
    assert words in raised.value.message


def test_one_device_is_the_default_and_is_reported(model_dir):
    with open_engine(model_dir) as engine:
        assert engine.info().num_devices == 1


def create_with_option(model_dir, field, value):
    library = native.load_library(native.BACKEND_CPU)
    options = native.EngineOptionsStruct()
    library.glmrt_engine_options_default(ctypes.byref(options))
    default = getattr(options, field)
    setattr(options, field, value)
    config = native_model_config(load_model_config(model_dir))
    handle = native.engine_p()
    message = ctypes.create_string_buffer(native.GLMRT_ERROR_MESSAGE_CAPACITY)
    status = library.glmrt_engine_create(str(model_dir).encode(), ctypes.byref(config), ctypes.byref(options),
                                         ctypes.byref(handle), message, len(message))
    return default, status, handle, message.value.decode()


@pytest.mark.parametrize("field", ("decode_graphs", "dependent_launches"))
def test_launch_option_out_of_range_is_refused_with_its_name(model_dir, field):
    default, status, handle, message = create_with_option(model_dir, field, 5)
    assert default == 0
    assert status == native.STATUS_INVALID_ARGUMENT
    assert not handle
    assert message == f"{field} must be 0 (default) or 1 (off), got 5"


def test_launch_ahead_out_of_range_is_refused_with_its_choices(model_dir):
    default, status, handle, message = create_with_option(model_dir, "launch_ahead", 3)
    assert default == native.LAUNCH_AHEAD_DEFAULT
    assert status == native.STATUS_INVALID_ARGUMENT
    assert not handle
    assert message == "launch_ahead must be 0 (default), 1 (off) or 2 (always), got 3"


def test_all_reduce_out_of_range_is_refused_with_its_choices(model_dir):
    default, status, handle, message = create_with_option(model_dir, "all_reduce", 7)
    assert default == native.ALL_REDUCE_AUTO
    assert status == native.STATUS_INVALID_ARGUMENT
    assert not handle
    assert message == "all_reduce must be 0 (nccl), 1 (peer), 2 (auto) or 3 (peer-bf16), got 7"


def test_all_reduce_names_are_checked_before_the_library_is_asked(model_dir):
    from glmrt.engine.engine import Engine

    with pytest.raises(ValueError,
                       match="all_reduce must be one of \\['auto', 'nccl', 'peer', 'peer-bf16'\\], got 'ring'"):
        Engine(model_dir, all_reduce="ring")
    for name in ("nccl", "peer", "auto", "peer-bf16"):
        with open_engine(model_dir, all_reduce=name) as engine:
            info = engine.info()
            assert info.num_devices == 1
            assert info.all_reduce == native.ALL_REDUCE_NONE


def test_expert_split_out_of_range_is_refused_with_its_choices(model_dir):
    default, status, handle, message = create_with_option(model_dir, "expert_split", 4)
    assert default == native.EXPERT_SPLIT_WHOLE
    assert status == native.STATUS_INVALID_ARGUMENT
    assert not handle
    assert message == "expert_split must be 0 (whole) or 1 (columns), got 4"


def test_expert_split_names_are_checked_and_one_gpu_takes_either(model_dir):
    from glmrt.engine.engine import Engine

    with pytest.raises(ValueError, match="expert_split must be one of \\['columns', 'whole'\\], got 'rows'"):
        Engine(model_dir, expert_split="rows")
    for name in ("whole", "columns"):
        with open_engine(model_dir, expert_split=name) as engine:
            assert engine.info().num_devices == 1


def test_server_expert_split_option_reaches_the_engine_arguments():
    from glmrt.serve.options import engine_kwargs, server_parser

    assert engine_kwargs(server_parser().parse_args([]))["expert_split"] == "whole"
    assert engine_kwargs(server_parser().parse_args(["--expert-split", "columns"]))["expert_split"] == "columns"
    with pytest.raises(SystemExit):
        server_parser().parse_args(["--expert-split", "rows"])


def test_server_all_reduce_option_reaches_the_engine_arguments():
    from glmrt.serve.options import engine_kwargs, server_parser

    assert engine_kwargs(server_parser().parse_args([]))["all_reduce"] == "auto"
    assert engine_kwargs(server_parser().parse_args(["--all-reduce", "nccl"]))["all_reduce"] == "nccl"
    assert engine_kwargs(server_parser().parse_args(["--all-reduce", "peer"]))["all_reduce"] == "peer"
    assert engine_kwargs(server_parser().parse_args(["--all-reduce", "peer-bf16"]))["all_reduce"] == "peer-bf16"
    with pytest.raises(SystemExit):
        server_parser().parse_args(["--all-reduce", "ring"])


def test_server_step_budget_defaults_by_backend_and_keeps_a_given_value():
    from glmrt.serve.options import engine_kwargs, server_parser

    def step_tokens(argv):
        return engine_kwargs(server_parser().parse_args(argv))["max_tokens_per_step"]

    assert step_tokens([]) == 256
    assert step_tokens(["--backend", "cuda"]) == 2048
    assert step_tokens(["--backend", "cuda", "--max-batch", "4096"]) == 4096
    assert step_tokens(["--backend", "cpu", "--max-batch", "512"]) == 512
    assert step_tokens(["--backend", "cuda", "--max-tokens-per-step", "300"]) == 300
