import asyncio
import socket
import time

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from glmrt.model.config import load_model_config
from glmrt.model.tokenizer import Tokenizer
from tests.server_harness import (FINAL_EVENT_TYPES, ResponseRecord, ServerProcess, build_server_test_model,
                                  cancel_frame, create_frame, generate, prompt_ids_for, read_response, receive_event,
                                  sampling_params_for, solo_outputs, words_prompt)

pytestmark = pytest.mark.asyncio

KV_PAGES = 512
LONG_PROMPT_WORDS = 1900
LONG_PROMPT_TOKENS = 1880
IDLE_WITHIN_S = 3.0


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_server_test_model(tmp_path_factory.mktemp("lifecycle-model"))


@pytest.fixture(scope="module")
def long_prompt(model_dir):
    tokenizer = Tokenizer(model_dir)
    words = words_prompt(77, LONG_PROMPT_WORDS)
    token_ids = tokenizer.encode(words)[:LONG_PROMPT_TOKENS]
    return tokenizer.decode(token_ids)


@pytest.fixture(scope="module")
def server(model_dir, tmp_path_factory):
    process = ServerProcess(tmp_path_factory.mktemp("lifecycle-logs"), model_dir, max_batch=8,
                            max_tokens_per_step=16, kv_pages=KV_PAGES)
    with process:
        yield process


def long_request(prompt, max_tokens=1500):
    return {"input": prompt, "max_output_tokens": max_tokens, "seed": 11, "ignore_eos": True, "temperature": 1.0}


async def read_until(websocket, record, predicate):
    return await read_response(websocket, record, until=predicate)


def created(record):
    return record.response_id is not None


def decoding(record):
    return len(record.token_ids) >= 5


def holds_pages_while_running(samples):
    return samples["glmrt:kv_pages_used"] > 0 and samples["glmrt:num_requests_running"] == 1


async def assert_pages_held(server, timeout=2.0):
    deadline = time.monotonic() + timeout
    samples = server.metrics()
    while not holds_pages_while_running(samples) and time.monotonic() < deadline:
        await asyncio.sleep(0.002)
        samples = server.metrics()
    assert samples["glmrt:kv_pages_used"] > 0
    assert samples["glmrt:num_requests_running"] == 1


@pytest.mark.parametrize("phase", ["prefill", "decode"])
async def test_cancel_mid_stream_frees_every_page_at_once(server, long_prompt, phase):
    prompt = long_prompt if phase == "prefill" else "kitchen window"
    async with connect(server.ws_url, compression=None) as websocket:
        await websocket.send(create_frame(long_request(prompt)))
        record = await read_until(websocket, ResponseRecord(), created if phase == "prefill" else decoding)
        await assert_pages_held(server)
        cancel_sent = time.monotonic()
        await websocket.send(cancel_frame(record.response_id))
        await read_response(websocket, record)
        samples = await server.idle(IDLE_WITHIN_S)
    assert time.monotonic() - cancel_sent < IDLE_WITHIN_S
    assert record.final["type"] == "response.incomplete"
    assert record.status == "cancelled" and record.response["incomplete_details"] is None
    if phase == "prefill":
        assert record.usage["output_tokens"] == 0 and record.token_ids == []
    else:
        assert 5 <= record.usage["output_tokens"] < 1500
        assert len(record.token_ids) == record.usage["output_tokens"]
    assert samples["glmrt:kv_pages_total"] == KV_PAGES
    assert samples["glmrt:num_requests_running"] == 0


@pytest.mark.parametrize("phase, leave", [("prefill", "abort"), ("decode", "close"), ("decode", "abort")])
async def test_disconnect_mid_stream_cancels_the_request_and_frees_its_pages(server, long_prompt, phase, leave):
    prompt = long_prompt if phase == "prefill" else "library question"
    websocket = await connect(server.ws_url, compression=None)
    await websocket.send(create_frame(long_request(prompt)))
    record = await read_until(websocket, ResponseRecord(), created if phase == "prefill" else decoding)
    await assert_pages_held(server)
    left_at = time.monotonic()
    if leave == "abort":
        websocket.transport.abort()
    else:
        await websocket.close()
    samples = await server.idle(IDLE_WITHIN_S)
    assert time.monotonic() - left_at < IDLE_WITHIN_S
    log = await server.record_of(record.response_id)
    assert log["status"] == "cancelled", (log, server.stderr_text()[-3000:])
    if phase == "prefill":
        assert log["completion_tokens"] == 0
    else:
        assert 5 <= log["completion_tokens"] < 1500
    assert samples["glmrt:kv_pages_total"] == KV_PAGES


async def test_many_clients_leaving_at_once_leave_no_pages_behind(server):
    sockets = []
    for index in range(12):
        websocket = await connect(server.ws_url, compression=None)
        await websocket.send(create_frame(long_request(words_prompt(index, 30), max_tokens=800)))
        sockets.append(websocket)
    for websocket in sockets:
        await read_until(websocket, ResponseRecord(), created)
    for index, websocket in enumerate(sockets):
        if index % 2:
            websocket.transport.abort()
        else:
            await websocket.close()
    samples = await server.idle(5.0)
    assert samples["glmrt:kv_pages_used"] == 0


def unread_socket(port):
    raw = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    raw.connect(("127.0.0.1", port))
    raw.setblocking(False)
    return raw


@pytest.fixture
def slow_reader_server(model_dir, tmp_path):
    process = ServerProcess(tmp_path, model_dir, max_batch=8, max_tokens_per_step=64, send_timeout=1,
                            socket_send_buffer=16384)
    with process:
        yield process


async def test_client_that_never_reads_is_cut_off_and_other_clients_are_unaffected(slow_reader_server, model_dir):
    server = slow_reader_server
    tokenizer = Tokenizer(model_dir)
    eos_ids = load_model_config(model_dir).eos_token_ids
    sockets_before = server.open_sockets()
    stalled = await connect(server.ws_url, compression=None, sock=unread_socket(server.port), max_queue=1,
                            ping_interval=None)
    for index in range(4):
        await stalled.send(create_frame(long_request(f"stalled reader {index}", max_tokens=1800)))
    good_requests = [{"input": words_prompt(300 + index, 12), "max_output_tokens": 40, "temperature": 0.0,
                      "seed": index} for index in range(4)]
    expected = solo_outputs(model_dir, [(prompt_ids_for(tokenizer, request), sampling_params_for(request, eos_ids))
                                        for request in good_requests])
    started = time.monotonic()
    for request, tokens in zip(good_requests, expected):
        record = await generate(server.ws_url, request, timeout=20)
        assert record.token_ids == tokens
        assert record.status in ("completed", "incomplete") and record.errors == []
    assert time.monotonic() - started < 15
    deadline = time.monotonic() + 20
    while "send deadline" not in server.stderr_text():
        assert time.monotonic() < deadline, server.stderr_text()
        await asyncio.sleep(0.1)
    await server.idle(5.0)
    assert await server.wait_open_sockets(sockets_before) == sockets_before
    stalled_records = [record for record in server.request_log() if record["status"] == "cancelled"]
    assert len(stalled_records) == 4
    assert all(record["completion_tokens"] < 1800 for record in stalled_records)
    record = await generate(server.ws_url, good_requests[0])
    assert record.token_ids == expected[0]
    stalled.transport.abort()


@pytest.fixture
def capped_server(model_dir, tmp_path):
    process = ServerProcess(tmp_path, model_dir, max_batch=8, max_tokens_per_step=64, max_concurrent=2,
                            max_queued=2)
    with process:
        yield process


async def burst_of_rejections(websocket, count):
    for index in range(count):
        await websocket.send(create_frame({"input": "one more please", "max_output_tokens": 4},
                                          event_id=f"o{index}"))
    codes = []
    while len(codes) < count:
        event = await receive_event(websocket)
        if event["type"] == "error":
            assert event["event_id"] == f"o{len(codes)}" and event["error"]["type"] == "server_error"
            codes.append(event["code"])
        else:
            assert event["type"] not in ("response.created",) + FINAL_EVENT_TYPES
    return codes


async def test_requests_over_the_admission_cap_get_overloaded_without_crash_or_memory_growth(capped_server):
    server = capped_server
    async with connect(server.ws_url, compression=None) as websocket:
        for index in range(4):
            await websocket.send(create_frame(long_request(f"hold a slot {index}", max_tokens=2000)))
        records = {}
        while len(records) < 4:
            event = await receive_event(websocket)
            if event["type"] == "response.created":
                records[event["response"]["id"]] = ResponseRecord()
        assert set(await burst_of_rejections(websocket, 200)) == {"overloaded"}
        baseline = server.rss_bytes()
        for _ in range(5):
            assert set(await burst_of_rejections(websocket, 200)) == {"overloaded"}
        growth = server.rss_bytes() - baseline
        samples = server.metrics()
        assert samples["glmrt:admission_rejections_total"] == 1200
        assert samples["glmrt:num_requests_active"] == 4
        assert samples["glmrt:num_requests_running"] == 2
        assert samples["glmrt:num_requests_waiting"] == 2
        for response_id in records:
            await websocket.send(cancel_frame(response_id))
        finals = []
        while len(finals) < 4:
            event = await receive_event(websocket)
            if event["type"] in FINAL_EVENT_TYPES:
                finals.append((event["type"], event["response"]["status"]))
    assert finals == [("response.incomplete", "cancelled")] * 4
    assert growth < 4 * 1024 * 1024
    await server.idle()
    record = await generate(server.ws_url, {"input": "after the storm", "max_output_tokens": 6, "seed": 4})
    assert record.status in ("completed", "incomplete") and record.errors == []


async def test_websocket_without_the_api_key_is_refused_and_one_with_it_is_served(model_dir, tmp_path):
    with ServerProcess(tmp_path, model_dir, api_key="sesame") as server:
        for headers in (None, {"Authorization": "Bearer wrong"}):
            with pytest.raises(InvalidStatus) as refused:
                await generate(server.ws_url, {"input": "x", "max_output_tokens": 2}, headers=headers)
            assert refused.value.response.status_code == 403
        status, body, _ = server.post("/v1/completions", {"prompt": "x", "max_tokens": 2})
        assert status == 401 and body["error"]["code"] == "invalid_api_key"
        assert server.get("/healthz")[0] == 200 and server.get("/metrics")[0] == 200
        record = await generate(server.ws_url, {"input": "with the key", "max_output_tokens": 3, "seed": 1,
                                                "ignore_eos": True}, headers={"Authorization": "Bearer sesame"})
        assert record.errors == [] and len(record.token_ids) == 3
