import asyncio
import json

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from glmrt.model.config import load_model_config
from glmrt.model.tokenizer import Tokenizer
from tests.server_harness import (FINAL_EVENT_TYPES, ResponseRecord, ServerProcess, build_server_test_model,
                                  cancel_frame, create_frame, generate, prompt_ids_for, read_response, receive_event,
                                  sampling_params_for, solo_outputs, split_output, streamed_text, thinking_of,
                                  words_prompt)

pytestmark = pytest.mark.asyncio

MAX_FRAME_BYTES = 256 * 1024
NO_THINKING = {"effort": "none"}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_server_test_model(tmp_path_factory.mktemp("server-model"))


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    return Tokenizer(model_dir)


@pytest.fixture(scope="module")
def eos_ids(model_dir):
    return load_model_config(model_dir).eos_token_ids


@pytest.fixture(scope="module")
def server(model_dir, tmp_path_factory):
    process = ServerProcess(tmp_path_factory.mktemp("server-logs"), model_dir, max_batch=32,
                            max_tokens_per_step=128, max_frame_bytes=MAX_FRAME_BYTES)
    with process:
        yield process


def expected_tokens(model_dir, tokenizer, eos_ids, bodies):
    jobs = [(prompt_ids_for(tokenizer, body), sampling_params_for(body, eos_ids)) for body in bodies]
    return solo_outputs(model_dir, jobs)


def ended_by_length(tokens, limit, eos_ids):
    return len(tokens) == limit and tokens[-1] not in eos_ids


def assert_event_sequence(record):
    assert [event["sequence_number"] for event in record.events] == list(range(len(record.events)))
    assert [event["type"] for event in record.events[:2]] == ["response.created", "response.in_progress"]
    assert record.events[-1] is record.final
    assert sum(event["type"] in FINAL_EVENT_TYPES for event in record.events) == 1
    for event in record.deltas:
        assert "token_ids" in event


async def test_streamed_responses_equal_the_offline_engine_output_for_the_same_input_and_seed(
        server, model_dir, tokenizer, eos_ids):
    bodies = [
        {"input": "The river by the old mill", "max_output_tokens": 40, "temperature": 0.9, "top_p": 0.95,
         "top_k": 50, "seed": 4242},
        {"instructions": "answer briefly", "input": [{"role": "user", "content": "hello there"}],
         "max_output_tokens": 24, "temperature": 0.0, "seed": 1, "reasoning": NO_THINKING},
        {"input": "kitchen window morning", "max_output_tokens": 24, "temperature": 0.7, "min_p": 0.05,
         "repetition_penalty": 1.3, "frequency_penalty": 0.5, "presence_penalty": 0.4, "seed": 99,
         "reasoning": {"effort": "high"}},
    ]
    expected = expected_tokens(model_dir, tokenizer, eos_ids, bodies)
    for body, tokens in zip(bodies, expected):
        record = await generate(server.ws_url, body)
        assert record.errors == []
        assert_event_sequence(record)
        assert record.token_ids == tokens
        assert (record.reasoning, record.text) == split_output(streamed_text(tokenizer, tokens), thinking_of(body))
        prompt_tokens = len(prompt_ids_for(tokenizer, body))
        usage = record.usage
        assert (usage["input_tokens"], usage["output_tokens"]) == (prompt_tokens, len(tokens))
        assert usage["total_tokens"] == prompt_tokens + len(tokens)
        if ended_by_length(tokens, body["max_output_tokens"], eos_ids):
            assert record.final["type"] == "response.incomplete" and record.status == "incomplete"
            assert record.response["incomplete_details"] == {"reason": "max_output_tokens"}
        else:
            assert record.final["type"] == "response.completed" and record.status == "completed"
        assert record.response["id"] == record.response_id
        server_record = await server.record_of(record.response_id)
        assert server_record["completion_tokens"] == len(tokens) and server_record["status"] == "completed"
        assert server_record["ttft_ms"] > 0
    await server.idle()


async def test_the_root_path_serves_the_same_websocket_protocol(server):
    body = {"input": "root path", "max_output_tokens": 12, "temperature": 0.0, "seed": 2, "ignore_eos": True,
            "reasoning": NO_THINKING}
    at_root = await generate(server.root_ws_url, body)
    at_responses = await generate(server.ws_url, body)
    assert at_root.status == "incomplete" and len(at_root.token_ids) == 12
    assert at_root.token_ids == at_responses.token_ids
    assert at_root.text == at_responses.text


async def test_completions_stream_a_raw_prompt_with_the_offline_tokens(server, model_dir, tokenizer, eos_ids):
    bodies = [{"prompt": "The river by the old mill", "max_tokens": 32, "temperature": 0.9, "top_p": 0.95,
               "seed": 4242},
              {"prompt": "kitchen window morning", "max_tokens": 20, "temperature": 0.0, "seed": 1,
               "ignore_eos": True}]
    expected = expected_tokens(model_dir, tokenizer, eos_ids, bodies)
    for body, tokens in zip(bodies, expected):
        request = dict(body, stream=True, return_token_ids=True, stream_options={"include_usage": True})
        status, events, headers = await server.apost_stream("/v1/completions", request)
        assert status == 200 and headers["content-type"].startswith("text/event-stream")
        assert events[-1] == "[DONE]"
        chunks = events[:-1]
        streamed = [token for chunk in chunks for choice in chunk["choices"] for token in choice.get("token_ids") or []]
        assert streamed == tokens
        assert "".join(choice["text"] for chunk in chunks for choice in chunk["choices"]) == streamed_text(
            tokenizer, tokens)
        reasons = [choice["finish_reason"] for chunk in chunks for choice in chunk["choices"] if choice["finish_reason"]]
        assert reasons == ["length" if ended_by_length(tokens, body["max_tokens"], eos_ids) else "stop"]
        assert chunks[-1]["usage"] == {"prompt_tokens": len(tokenizer.encode(body["prompt"])),
                                       "completion_tokens": len(tokens),
                                       "total_tokens": len(tokenizer.encode(body["prompt"])) + len(tokens)}
        status, whole, _ = await server.apost("/v1/completions", dict(body, return_token_ids=True))
        assert status == 200
        assert whole["choices"][0]["token_ids"] == tokens
        assert whole["choices"][0]["text"] == streamed_text(tokenizer, tokens)
    await server.idle()


async def test_chat_completions_return_the_offline_tokens_as_reasoning_or_content(server, model_dir, tokenizer,
                                                                                  eos_ids):
    messages = [{"role": "system", "content": "answer briefly"}, {"role": "user", "content": "hello there"}]
    bodies = [{"messages": messages, "max_tokens": 24, "temperature": 0.0, "seed": 1},
              {"messages": messages, "max_completion_tokens": 24, "temperature": 0.0, "seed": 1,
               "chat_template_kwargs": {"enable_thinking": False}}]
    expected = expected_tokens(model_dir, tokenizer, eos_ids, bodies)
    for body, tokens in zip(bodies, expected):
        status, completion, _ = await server.apost("/v1/chat/completions", dict(body, return_token_ids=True))
        assert status == 200, completion
        choice = completion["choices"][0]
        assert choice["token_ids"] == tokens
        reasoning, content = split_output(streamed_text(tokenizer, tokens), thinking_of(body))
        assert (choice["message"].get("reasoning_content", ""), choice["message"]["content"]) == (reasoning, content)
        assert completion["usage"]["prompt_tokens"] == len(prompt_ids_for(tokenizer, body))
        assert completion["usage"]["completion_tokens"] == len(tokens)
        status, events, _ = await server.apost_stream("/v1/chat/completions",
                                                      dict(body, stream=True, return_token_ids=True))
        assert status == 200 and events[-1] == "[DONE]"
        streamed = [token for chunk in events[:-1] for choice in chunk["choices"]
                    for token in choice.get("token_ids") or []]
        assert streamed == tokens
    await server.idle()


async def test_thirty_two_concurrent_clients_each_get_their_solo_tokens(server, model_dir, tokenizer, eos_ids):
    bodies = []
    for index in range(32):
        body = {"input": words_prompt(index, 5 + (index * 7) % 40), "max_output_tokens": 48 + (index % 4) * 8,
                "seed": 1000 + index, "ignore_eos": index % 3 == 0, "temperature": 0.0 if index % 2 == 0 else 1.0}
        if index % 4 == 1:
            body["reasoning"] = NO_THINKING
        bodies.append(body)
    expected = expected_tokens(model_dir, tokenizer, eos_ids, bodies)
    before = server.metrics()
    records = await asyncio.gather(*(generate(server.ws_url, body) for body in bodies))
    after = await server.idle()
    for record, tokens in zip(records, expected):
        assert record.status in ("completed", "incomplete") and record.errors == []
        assert record.token_ids == tokens
    steps = after["glmrt:step_batch_size_count"] - before["glmrt:step_batch_size_count"]
    batched = after["glmrt:step_batch_size_sum"] - before["glmrt:step_batch_size_sum"]
    assert batched / steps > 2.0


async def test_several_responses_interleave_on_one_socket(server, model_dir, tokenizer, eos_ids):
    bodies = [{"input": words_prompt(500 + index, 8), "max_output_tokens": 20, "temperature": 0.0, "seed": index,
               "reasoning": NO_THINKING if index % 2 else None} for index in range(3)]
    bodies = [{key: value for key, value in body.items() if value is not None} for body in bodies]
    expected = expected_tokens(model_dir, tokenizer, eos_ids, bodies)
    async with connect(server.ws_url, compression=None) as websocket:
        for index, body in enumerate(bodies):
            await websocket.send(create_frame(body, event_id=f"e{index}"))
        records = {}
        by_event = {}
        done = 0
        while done < len(bodies):
            event = await receive_event(websocket)
            if event["type"] == "response.created":
                records[event["response"]["id"]] = ResponseRecord()
                by_event[event["event_id"]] = event["response"]["id"]
            response_id = event["response"]["id"] if "response" in event else event["response_id"]
            records[response_id].add(event)
            done += event["type"] in FINAL_EVENT_TYPES
    assert sorted(by_event) == ["e0", "e1", "e2"]
    for index, tokens in enumerate(expected):
        record = records[by_event[f"e{index}"]]
        assert record.token_ids == tokens
        assert [event["sequence_number"] for event in record.events] == list(range(len(record.events)))


async def test_stop_string_ends_the_response_before_the_stop_text_is_emitted(server):
    base = {"input": "garden library", "max_output_tokens": 40, "temperature": 0.0, "seed": 3, "ignore_eos": True,
            "reasoning": NO_THINKING}
    full = await generate(server.ws_url, base)
    text = full.all_text
    cut = next(index for index in range(len(text) // 3, len(text) - 2) if text[index:index + 2].strip() and
               "\ufffd" not in text[index:index + 2] and "<" not in text[index:index + 2])
    stop = text[cut:cut + 2]
    first = text.find(stop)
    record = await generate(server.ws_url, dict(base, stop=[stop, "\u0000never"]))
    assert record.final["type"] == "response.completed" and record.status == "completed"
    assert record.response["incomplete_details"] is None
    assert record.all_text == text[:first]
    assert stop not in record.all_text
    assert record.token_ids == full.token_ids[:len(record.token_ids)]
    assert record.usage["output_tokens"] == len(record.token_ids)
    await server.idle()


async def test_stop_token_ids_end_the_response_on_that_token(server):
    base = {"input": "matrix vector layer", "max_output_tokens": 30, "temperature": 0.0, "seed": 5,
            "ignore_eos": True, "reasoning": NO_THINKING}
    full = await generate(server.ws_url, base)
    stop_token = full.token_ids[6]
    first = full.token_ids.index(stop_token)
    for ignore_eos in (False, True):
        record = await generate(server.ws_url, dict(base, stop_token_ids=[stop_token], ignore_eos=ignore_eos))
        assert record.token_ids == full.token_ids[:first + 1]
        assert record.final["type"] == "response.completed"


async def test_response_without_seed_picks_a_fresh_seed_each_time(server):
    body = {"input": "question answer", "max_output_tokens": 24, "temperature": 1.0, "ignore_eos": True}
    first = await generate(server.ws_url, body)
    second = await generate(server.ws_url, body)
    assert first.status == second.status == "incomplete"
    assert first.token_ids != second.token_ids


def create(**fields):
    return json.dumps(dict({"type": "response.create", "input": "x"}, **fields))


BAD_FRAMES = [
    ("not json at all", "invalid_json", None),
    ("[1, 2]", "invalid_type", None),
    (json.dumps({"type": "response.update"}), "unknown_event_type", "type"),
    (json.dumps({"type": "response.create"}), "missing_required_parameter", "input"),
    (create(input=7), "invalid_type", "input"),
    (create(temperature=3), "invalid_value", "temperature"),
    (create(top_p=0), "invalid_value", "top_p"),
    (create(top_k=-2), "invalid_value", "top_k"),
    (create(top_k=2**32 + 1), "invalid_value", "top_k"),
    (create(repetition_penalty=1e300), "invalid_value", "repetition_penalty"),
    (create(min_p=2), "invalid_value", "min_p"),
    (create(repetition_penalty=0), "invalid_value", "repetition_penalty"),
    (create(frequency_penalty=-2.1), "invalid_value", "frequency_penalty"),
    (create(presence_penalty=2.1), "invalid_value", "presence_penalty"),
    (create(max_output_tokens=0), "invalid_value", "max_output_tokens"),
    (create(stop=["a", ""]), "invalid_value", "stop"),
    (create(stop_token_ids=[10 ** 6]), "invalid_value", "stop_token_ids"),
    (create(seed="abc"), "invalid_type", "seed"),
    (create(reasoning={"effort": "maximal"}), "invalid_value", "reasoning"),
    (create(input=[{"role": "robot", "content": "x"}]), "invalid_value", "input[0].role"),
    (create(input=[{"type": "input_image", "image_url": "x"}]), "unsupported_value", "input[0].type"),
    (create(tools=[{"type": "function"}]), "missing_required_parameter", "tools[0].name"),
    (create(tools=[{"type": "function", "name": "f"}], tool_choice={"type": "function", "name": "g"}),
     "invalid_value", "tool_choice.name"),
    (create(model="another-model"), "model_not_found", "model"),
    (create(previous_response_id="resp_never"), "previous_response_not_found", "previous_response_id"),
    (create(input="river " * 2500), "context_length_exceeded", "input"),
    (json.dumps({"type": "response.cancel", "response_id": "resp_unknown"}), "response_not_found", "response_id"),
]


async def test_each_bad_input_gets_its_specific_error_and_the_socket_still_serves(server):
    async with connect(server.ws_url, compression=None, max_size=None) as websocket:
        await websocket.send(b"\x00\x01binary")
        event = await receive_event(websocket)
        assert event["type"] == "error" and event["code"] == "binary_frame_unsupported"
        for index, (frame, code, param) in enumerate(BAD_FRAMES):
            if frame.startswith("{"):
                body = json.loads(frame)
                body["event_id"] = f"bad-{index}"
                frame = json.dumps(body)
            await websocket.send(frame)
            event = await receive_event(websocket)
            assert event["type"] == "error", frame[:200]
            assert (event["code"], event["param"]) == (code, param), frame[:200]
            assert event["error"]["code"] == code and event["error"]["param"] == param
            assert event["message"] and event["error"]["message"] == event["message"]
            assert event["error"]["type"] == "invalid_request_error"
            assert "response_id" not in event
            if frame.startswith("{"):
                assert event["event_id"] == f"bad-{index}"
        await websocket.send(create_frame({"input": "still here", "max_output_tokens": 5, "seed": 1,
                                           "ignore_eos": True}))
        record = await read_response(websocket, ResponseRecord())
        assert record.status == "incomplete" and len(record.token_ids) == 5


async def test_the_old_request_envelope_is_refused_with_a_missing_input_error(server):
    async with connect(server.ws_url, compression=None) as websocket:
        await websocket.send(json.dumps({"type": "response.create", "request": {"prompt": "x"}}))
        event = await receive_event(websocket)
        assert (event["code"], event["param"]) == ("missing_required_parameter", "input")


async def test_unpaired_surrogates_get_an_error_and_the_socket_still_serves(server):
    async with connect(server.ws_url, compression=None) as websocket:
        for frame in ('{"type":"response.create","input":"a\\ud800b","max_output_tokens":3}',
                      '{"type":"bogus","event_id":"\\udc00"}'):
            await websocket.send(frame)
            event = await receive_event(websocket)
            assert event["type"] == "error" and event["code"] == "invalid_json"
        await websocket.send(create_frame({"input": "still here", "max_output_tokens": 3, "seed": 1,
                                           "ignore_eos": True}))
        record = await read_response(websocket, ResponseRecord())
        assert record.status == "incomplete" and len(record.token_ids) == 3


async def test_cancel_of_a_finished_response_reports_it_unknown(server):
    async with connect(server.ws_url, compression=None) as websocket:
        await websocket.send(create_frame({"input": "short", "max_output_tokens": 3, "seed": 1}))
        record = await read_response(websocket, ResponseRecord())
        await websocket.send(cancel_frame(record.response_id, event_id="late"))
        event = await receive_event(websocket)
        assert (event["code"], event["event_id"]) == ("response_not_found", "late")


async def test_oversized_frame_closes_the_connection_with_1009(server):
    async with connect(server.ws_url, compression=None, max_size=None) as websocket:
        await websocket.send(create_frame({"input": "x" * (MAX_FRAME_BYTES + 1024), "max_output_tokens": 1}))
        with pytest.raises(ConnectionClosed) as closed:
            await receive_event(websocket, timeout=10)
        assert closed.value.rcvd.code == 1009
    record = await generate(server.ws_url, {"input": "after the big frame", "max_output_tokens": 4, "seed": 2})
    assert record.status in ("completed", "incomplete") and record.errors == []


async def test_bad_http_bodies_get_openai_errors_with_their_status(server):
    cases = [
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "temperature": 3}, 400,
         "invalid_value", "temperature"),
        ("/v1/chat/completions", {"messages": []}, 400, "invalid_value", "messages"),
        ("/v1/completions", {"prompt": "x", "model": "another-model"}, 404, "model_not_found", "model"),
        ("/v1/completions", {"prompt": "river " * 2500}, 400, "context_length_exceeded", "prompt"),
        ("/v1/responses", {"input": "x", "max_output_tokens": 0}, 400, "invalid_value", "max_output_tokens"),
        ("/v1/responses", {"input": "x", "previous_response_id": "resp_never"}, 404, "previous_response_not_found",
         "previous_response_id"),
        ("/v1/completions", b"{not json", 400, "invalid_json", None),
        ("/v1/completions", b"x" * (MAX_FRAME_BYTES + 1), 413, "request_too_large", None),
    ]
    for path, body, status, code, param in cases:
        answered, error, _ = await server.apost(path, body)
        assert answered == status, (path, error)
        assert set(error) == {"error"}
        assert (error["error"]["code"], error["error"]["param"]) == (code, param)
        assert error["error"]["type"] == "invalid_request_error" and error["error"]["message"]
    record = await generate(server.ws_url, {"input": "after the bad bodies", "max_output_tokens": 3, "seed": 2})
    assert record.errors == []


async def test_health_ready_models_and_metrics_endpoints_answer_over_plain_http(server, model_dir):
    status, body, _ = server.get("/healthz")
    assert status == 200 and "ok" in body
    status, body, _ = server.get("/readyz")
    assert status == 200 and "ok" in body
    status, body, headers = server.get("/metrics")
    assert status == 200
    assert headers["content-type"].startswith("text/plain")
    for name in ("glmrt:num_requests_running", "glmrt:num_requests_waiting", "glmrt:kv_pages_used",
                 "glmrt:kv_pages_total", "glmrt:kv_cache_usage_perc", "glmrt:prompt_tokens_total",
                 "glmrt:generation_tokens_total", "glmrt:time_to_first_token_seconds_bucket",
                 "glmrt:inter_token_latency_seconds_bucket", "glmrt:e2e_request_latency_seconds_bucket",
                 "glmrt:step_duration_seconds_bucket", "glmrt:admission_rejections_total",
                 "glmrt:num_preemptions_total"):
        assert name in body, name
    samples = server.metrics()
    assert samples["glmrt:kv_pages_total"] == 512
    status, body, _ = server.get("/v1/models")
    models = json.loads(body)
    assert status == 200 and models["object"] == "list"
    assert [entry["id"] for entry in models["data"]] == [model_dir.name]
    status, body, _ = server.get("/nowhere")
    assert status == 404 and json.loads(body)["error"]["code"] == "not_found"


async def test_metrics_count_prompt_and_generated_tokens(server, tokenizer):
    before = server.metrics()
    body = {"input": "token server request", "max_output_tokens": 9, "seed": 8, "ignore_eos": True}
    record = await generate(server.ws_url, body)
    after = await server.idle()
    assert after["glmrt:generation_tokens_total"] - before["glmrt:generation_tokens_total"] == 9
    assert after["glmrt:prompt_tokens_total"] - before["glmrt:prompt_tokens_total"] == len(
        prompt_ids_for(tokenizer, body))
    assert record.usage["output_tokens"] == 9
    assert after["glmrt:device_forward_seconds_total"] > before.get("glmrt:device_forward_seconds_total", 0.0)
    assert after["glmrt:step_gaps_total"] - before.get("glmrt:step_gaps_total", 0.0) >= 8
    assert after["glmrt:step_gap_seconds_total"] > before.get("glmrt:step_gap_seconds_total", 0.0)
    assert after["glmrt:rows_owned_steps_total"] == 0.0
