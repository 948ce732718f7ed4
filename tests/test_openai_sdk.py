import asyncio
import json

import httpx
import openai
import pytest

from glmrt.engine.engine import Engine, SamplingParams
from glmrt.model.tokenizer import IncrementalDecoder, Tokenizer
from tests.server_harness import ServerProcess, build_server_test_model

MODEL_NAME = "glm-test"
OFFLINE = dict(num_threads=2, max_batch=8, max_tokens_per_step=64, kv_page_size=16, kv_num_pages=512)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_server_test_model(tmp_path_factory.mktemp("openai-sdk-model"))


@pytest.fixture(scope="module")
def server(model_dir, tmp_path_factory):
    process = ServerProcess(tmp_path_factory.mktemp("openai-sdk-logs"), model_dir=model_dir,
                            served_model_name=MODEL_NAME)
    with process:
        yield process


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.http_url + "/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    return Tokenizer(model_dir)


def offline_greedy(model_dir, prompt_ids, max_new_tokens):
    with Engine(model_dir, **OFFLINE) as engine:
        request = engine.create_request(prompt_ids, SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens))
        tokens = []
        while True:
            step_tokens, finish_reasons = engine.step([request])
            if step_tokens[0] >= 0:
                tokens.append(step_tokens[0])
            if finish_reasons[0]:
                break
        engine.free_request(request)
    return tokens


def decoded(tokenizer, token_ids):
    decoder = IncrementalDecoder(tokenizer, skip_special_tokens=True)
    return decoder.push_many(token_ids) + decoder.flush()


def chat_prompt(tokenizer, messages, enable_thinking=None):
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, enable_thinking=enable_thinking)


def test_models_list_names_the_served_model(client):
    models = client.models.list()
    assert [model.id for model in models.data] == [MODEL_NAME]


def test_chat_completion_equals_the_offline_greedy_output(client, model_dir, tokenizer):
    messages = [{"role": "user", "content": "river garden window"}]
    expected = offline_greedy(model_dir, chat_prompt(tokenizer, messages, enable_thinking=False), 12)
    completion = client.chat.completions.create(model=MODEL_NAME, messages=messages, max_tokens=12, temperature=0,
                                                extra_body={"return_token_ids": True,
                                                            "chat_template_kwargs": {"enable_thinking": False}})
    choice = completion.model_dump()["choices"][0]
    assert choice["token_ids"] == expected
    assert choice["message"]["content"] == decoded(tokenizer, expected)
    assert completion.usage.completion_tokens == len(expected)
    assert completion.usage.prompt_tokens == len(chat_prompt(tokenizer, messages, enable_thinking=False))


def test_streamed_chat_completion_carries_reasoning_and_usage(client, model_dir, tokenizer):
    messages = [{"role": "user", "content": "morning kitchen"}]
    expected = offline_greedy(model_dir, chat_prompt(tokenizer, messages), 10)
    stream = client.chat.completions.create(model=MODEL_NAME, messages=messages, max_tokens=10, temperature=0,
                                            stream=True, stream_options={"include_usage": True},
                                            extra_body={"return_token_ids": True})
    reasoning = []
    token_ids = []
    finish_reasons = []
    usage = None
    for chunk in stream:
        data = chunk.model_dump()
        if not data["choices"]:
            usage = chunk.usage
            continue
        choice = data["choices"][0]
        token_ids.extend(choice.get("token_ids") or [])
        reasoning.append(choice["delta"].get("reasoning_content") or "")
        finish_reasons.append(choice["finish_reason"])
    assert token_ids == expected
    assert "".join(reasoning) == decoded(tokenizer, expected)
    assert finish_reasons[-1] == "length"
    assert usage.completion_tokens == len(expected)
    assert usage.completion_tokens_details.reasoning_tokens == len(expected)


def test_completion_equals_the_offline_greedy_output(client, model_dir, tokenizer):
    prompt = "the engine reads a token"
    expected = offline_greedy(model_dir, tokenizer.encode(prompt), 9)
    completion = client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=9, temperature=0,
                                           extra_body={"return_token_ids": True})
    choice = completion.model_dump()["choices"][0]
    assert choice["token_ids"] == expected
    assert choice["text"] == decoded(tokenizer, expected)
    assert choice["finish_reason"] == "length"


def test_responses_over_http_equal_the_offline_greedy_output(client, model_dir, tokenizer):
    messages = [{"role": "user", "content": "library question"}]
    expected = offline_greedy(model_dir, chat_prompt(tokenizer, messages), 8)
    response = client.responses.create(model=MODEL_NAME, input="library question", max_output_tokens=8,
                                       temperature=0)
    assert response.status == "incomplete"
    assert response.incomplete_details.reason == "max_output_tokens"
    reasoning = [item for item in response.output if item.type == "reasoning"]
    assert reasoning[0].content[0].text == decoded(tokenizer, expected)
    assert response.usage.output_tokens == len(expected)


def test_responses_websocket_continues_a_conversation_with_previous_response_id(client, model_dir, tokenizer):
    first_text = "window morning"
    with client.responses.connect() as connection:
        connection.send({"type": "response.create", "model": MODEL_NAME, "input": first_text,
                         "max_output_tokens": 6, "temperature": 0, "reasoning": {"effort": "none"}})
        first = None
        deltas = []
        for event in connection:
            if event.type == "response.output_text.delta":
                deltas.append(event.delta)
            if event.type in ("response.completed", "response.incomplete", "response.failed"):
                first = event.response
                break
        first_answer = "".join(deltas)
        assert first.output[0].content[0].text == first_answer
        connection.send({"type": "response.create", "model": MODEL_NAME, "input": "kitchen", "max_output_tokens": 5,
                         "temperature": 0, "previous_response_id": first.id, "reasoning": {"effort": "none"}})
        second = None
        sequence = []
        for event in connection:
            sequence.append(event.sequence_number)
            if event.type in ("response.completed", "response.incomplete", "response.failed"):
                second = event.response
                break
    transcript = [{"role": "user", "content": first_text}, {"role": "assistant", "content": first_answer},
                  {"role": "user", "content": "kitchen"}]
    prompt = chat_prompt(tokenizer, transcript, enable_thinking=False)
    expected = offline_greedy(model_dir, prompt, 5)
    assert second.usage.input_tokens == len(prompt)
    assert second.output[0].content[0].text == decoded(tokenizer, expected)
    assert sequence == sorted(sequence) and sequence[0] == 0


def test_unknown_model_is_answered_404_in_the_openai_shape(client):
    with pytest.raises(openai.NotFoundError) as error:
        client.chat.completions.create(model="another-model", messages=[{"role": "user", "content": "x"}])
    assert error.value.body["code"] == "model_not_found"
    assert error.value.body["param"] == "model"


@pytest.mark.parametrize("body, code, param", [
    ({"messages": "text"}, "invalid_type", "messages"),
    ({"messages": [{"role": "robot", "content": "x"}]}, "invalid_value", "messages[0].role"),
    ({"messages": [{"role": "user", "content": "x"}], "temperature": "hot"}, "invalid_type", "temperature"),
    ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}, "invalid_value", "max_tokens"),
    ({"messages": [{"role": "user", "content": "x"}],
      "tools": [{"type": "function", "function": {"name": "bad name!", "parameters": {}}}]},
     "invalid_value", "tools[0].function.name"),
    ({"messages": [{"role": "user", "content": "x"}],
      "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}]},
     "invalid_value", "tools[0].function.parameters"),
])
def test_bad_chat_bodies_get_400_naming_the_field(server, body, code, param):
    response = httpx.post(server.http_url + "/v1/chat/completions", json=body, timeout=30)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == code and error["param"] == param and error["type"] == "invalid_request_error"


def test_invalid_json_and_deep_nesting_get_400_and_the_server_stays_up(server):
    for raw in (b"{not json", b"[" * 5000 + b"]" * 5000, b"[1, 2]"):
        response = httpx.post(server.http_url + "/v1/chat/completions", content=raw,
                              headers={"content-type": "application/json"}, timeout=30)
        assert response.status_code == 400
        assert response.json()["error"]["code"] in ("invalid_json", "invalid_type")
    assert httpx.get(server.http_url + "/healthz").status_code == 200


def test_a_too_long_prompt_gets_400_context_length_exceeded(server):
    body = {"messages": [{"role": "user", "content": "river " * 6000}], "max_tokens": 4}
    response = httpx.post(server.http_url + "/v1/chat/completions", json=body, timeout=60)
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "context_length_exceeded"


def test_unknown_paths_answer_404_in_the_openai_shape(server):
    response = httpx.get(server.http_url + "/v1/nothing-here")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"


def test_a_client_that_disconnects_mid_stream_frees_its_pages(server):
    body = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "stream forever"}], "max_tokens": 1500,
            "stream": True, "ignore_eos": True}
    with httpx.stream("POST", server.http_url + "/v1/chat/completions", json=body, timeout=60) as response:
        lines = response.iter_lines()
        received = 0
        for line in lines:
            if line.startswith("data: ") and "[DONE]" not in line:
                received += 1
            if received >= 3:
                break
        assert received >= 3
        assert server.metrics()["glmrt:kv_pages_used"] > 0
    samples = server.wait_idle(timeout=20)
    assert samples["glmrt:kv_pages_used"] == 0


def test_a_wrong_api_key_gets_401_and_health_stays_open(model_dir, tmp_path):
    with ServerProcess(tmp_path, model_dir=model_dir, api_key="sesame") as guarded:
        response = httpx.get(guarded.http_url + "/v1/models", headers={"authorization": "Bearer wrong"})
        assert response.status_code == 401
        assert response.json()["error"]["code"] == "invalid_api_key"
        assert httpx.get(guarded.http_url + "/healthz").status_code == 200
        allowed = openai.OpenAI(base_url=guarded.http_url + "/v1", api_key="sesame", max_retries=0)
        assert allowed.models.list().data


def test_overload_is_answered_429_at_once(model_dir, tmp_path):
    with ServerProcess(tmp_path, model_dir=model_dir, max_batch=1, max_queued=0) as small:
        body = {"messages": [{"role": "user", "content": "long"}], "max_tokens": 1500, "stream": True,
                "ignore_eos": True}

        async def scenario():
            async with httpx.AsyncClient(base_url=small.http_url, timeout=60) as http:
                async with http.stream("POST", "/v1/chat/completions", json=body) as running:
                    async for line in running.aiter_lines():
                        if line.startswith("data: "):
                            break
                    refused = await http.post("/v1/chat/completions", json=dict(body, stream=False))
                    return refused.status_code, refused.json()

        status, payload = asyncio.run(scenario())
        assert status == 429
        assert payload["error"]["code"] == "overloaded"
        small.wait_idle(timeout=20)


def test_sse_chunks_are_json_and_end_with_done(server):
    body = {"model": MODEL_NAME, "prompt": "kernel thread", "max_tokens": 4, "stream": True, "temperature": 0}
    with httpx.stream("POST", server.http_url + "/v1/completions", json=body, timeout=60) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        payloads = [line[len("data: "):] for line in response.iter_lines() if line.startswith("data: ")]
    assert payloads[-1] == "[DONE]"
    chunks = [json.loads(payload) for payload in payloads[:-1]]
    assert all(chunk["object"] == "text_completion" for chunk in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
