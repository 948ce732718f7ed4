import asyncio
import json
import random
import socket
import subprocess
import sys
import time

import httpx
import pytest
from websockets.asyncio.client import connect

from glmrt.model.tokenizer import Tokenizer
from tests.server_harness import REPO_ROOT, ServerProcess, build_server_test_model

FINAL_EVENTS = ("response.completed", "response.incomplete", "response.failed")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_server_test_model(tmp_path_factory.mktemp("hardening-model"))


def short_create(tokens=2, text="hi"):
    return {"type": "response.create", "input": text, "max_output_tokens": tokens, "temperature": 0,
            "reasoning": {"effort": "none"}}


async def until_final(websocket, timeout=60):
    events = []
    while True:
        event = json.loads(await asyncio.wait_for(websocket.recv(), timeout))
        events.append(event)
        if event["type"] in FINAL_EVENTS or (event["type"] == "error" and "response_id" not in event):
            return events


async def connect_send_close(url, reset):
    async with connect(url, compression=None, open_timeout=30) as websocket:
        await websocket.send(json.dumps(short_create(64)))
        if reset:
            websocket.transport.abort()


def test_twenty_thousand_connect_send_close_cycles_leave_no_slot_queue_entry_or_page(model_dir, tmp_path):
    with ServerProcess(tmp_path, model_dir=model_dir, max_batch=8, max_queued=64) as server:
        async def cycles():
            counter = iter(range(20_000))

            async def worker():
                for index in counter:
                    try:
                        await connect_send_close(server.ws_url, reset=index % 2 == 1)
                    except OSError:
                        await asyncio.sleep(0.01)

            await asyncio.gather(*(worker() for _ in range(16)))

        asyncio.run(cycles())
        samples = server.wait_idle(timeout=60)
        assert samples["glmrt:num_requests_active"] == 0
        assert samples["glmrt:num_requests_waiting"] == 0 and samples["glmrt:kv_pages_used"] == 0
        assert asyncio.run(one_response(server.ws_url))[-1]["type"] in FINAL_EVENTS


async def one_response(url, frame=None):
    async with connect(url, compression=None) as websocket:
        await websocket.send(json.dumps(frame or short_create()))
        return await until_final(websocket)


def test_a_two_thousand_level_frame_gets_an_error_and_the_socket_keeps_serving(model_dir, tmp_path):
    with ServerProcess(tmp_path, model_dir=model_dir) as server:
        async def scenario():
            async with connect(server.ws_url, compression=None) as websocket:
                await websocket.send("[" * 2000 + "]" * 2000)
                nested = json.loads(await asyncio.wait_for(websocket.recv(), 30))
                frame = json.dumps(dict(short_create(), max_output_tokens=7))
                await websocket.send(frame.replace('"max_output_tokens": 7', '"max_output_tokens": ' + "9" * 5000))
                huge = json.loads(await asyncio.wait_for(websocket.recv(), 30))
                await websocket.send(json.dumps(short_create()))
                return nested, huge, await until_final(websocket)

        nested, huge, events = asyncio.run(scenario())
        assert nested["type"] == "error" and nested["code"] == "invalid_json"
        assert huge["type"] == "error" and huge["code"] == "invalid_value" and huge["param"] == "max_output_tokens"
        assert events[-1]["type"] in FINAL_EVENTS


async def first_token_seconds(url, text="kitchen"):
    async with connect(url, compression=None) as websocket:
        started = time.perf_counter()
        await websocket.send(json.dumps(short_create(3, text)))
        while True:
            event = json.loads(await asyncio.wait_for(websocket.recv(), 120))
            if event["type"] == "response.output_text.delta" and event.get("token_ids"):
                return time.perf_counter() - started


def mean_step_seconds(server):
    samples = server.metrics()
    count = samples.get("glmrt:step_duration_seconds_count", 0)
    return samples.get("glmrt:step_duration_seconds_sum", 0.0) / count if count else 0.0


def test_one_greedy_client_cannot_delay_another_clients_first_token(model_dir, tmp_path):
    with ServerProcess(tmp_path, model_dir=model_dir, max_batch=8, max_queued=400,
                       max_active_per_client=256) as server:
        async def scenario():
            solo = min([await first_token_seconds(server.ws_url) for _ in range(3)])
            async with connect(server.ws_url, compression=None, max_size=None) as greedy:
                for _ in range(200):
                    await greedy.send(json.dumps(dict(short_create(400, "river"), ignore_eos=True)))
                while server.metrics().get("glmrt:num_requests_running", 0) < 8:
                    await asyncio.sleep(0.05)
                await asyncio.sleep(0.5)
                loaded = await first_token_seconds(server.ws_url)
                step = mean_step_seconds(server)
            return solo, loaded, step

        solo, loaded, step = asyncio.run(scenario())
        assert loaded <= 2 * solo + step + 0.05, (solo, loaded, step)
        server.wait_idle(timeout=120)


def large_prompt(seed, count=1500):
    rng = random.Random(seed)
    words = "river mountain garden window morning evening kitchen library question answer".split()
    return " ".join(rng.choice(words) for _ in range(count))


FLOOD_CLIENT = """
import asyncio, json, random, sys
import httpx

def large_prompt(seed, count):
    rng = random.Random(seed)
    words = "river mountain garden window morning evening kitchen library question answer".split()
    return " ".join(rng.choice(words) for _ in range(count))

async def flood(url):
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=httpx.Limits(max_connections=300)) as http:
        bodies = [{"messages": [{"role": "user", "content": large_prompt(index, 2600)}], "max_tokens": 1}
                  for index in range(256)]
        requests = [asyncio.ensure_future(http.post("/v1/chat/completions", json=body)) for body in bodies]
        await asyncio.sleep(0)
        print("sending", flush=True)
        print(json.dumps([response.status_code for response in await asyncio.gather(*requests)]), flush=True)

asyncio.run(flood(sys.argv[1]))
"""


def test_a_tokenizer_flood_from_one_client_keeps_another_clients_small_request_fast(model_dir, tmp_path):
    with ServerProcess(tmp_path, model_dir=model_dir, max_queued=512, max_active_per_client=512,
                       max_tokenizing_per_client=8) as server:
        flooder = subprocess.Popen([sys.executable, "-c", FLOOD_CLIENT, server.http_url], stdout=subprocess.PIPE,
                                   text=True)
        try:
            assert flooder.stdout.readline().strip() == "sending"
            time.sleep(0.2)

            async def measure():
                async with connect(server.ws_url, compression=None) as websocket:
                    started = time.perf_counter()
                    await websocket.send(json.dumps(short_create(1, "hi there")))
                    await until_final(websocket)
                    return time.perf_counter() - started

            small = asyncio.run(measure())
            output, _ = flooder.communicate(timeout=120)
        finally:
            if flooder.poll() is None:
                flooder.kill()
                flooder.wait(timeout=30)
        statuses = json.loads(output.strip().splitlines()[-1])
        assert flooder.returncode == 0
        assert small < 0.2, small
        assert set(statuses) <= {400, 429} and 400 in statuses and 429 in statuses
        server.wait_idle(timeout=60)


def test_memory_returns_to_its_level_after_tokenizer_floods(model_dir, tmp_path):
    with ServerProcess(tmp_path, model_dir=model_dir, max_queued=512) as server:
        def flood():
            async def run():
                async with httpx.AsyncClient(base_url=server.http_url, timeout=120) as http:
                    bodies = [{"messages": [{"role": "user", "content": large_prompt(index)}], "max_tokens": 1}
                              for index in range(64)]
                    await asyncio.gather(*(http.post("/v1/chat/completions", json=body) for body in bodies))

            asyncio.run(run())
            server.wait_idle(timeout=60)
            return server.rss_bytes()

        after_one = flood()
        for _ in range(9):
            after_ten = flood()
        assert after_ten - after_one < 30 * 1024 * 1024, (after_one, after_ten)


def test_every_added_token_in_client_text_stays_text(model_dir, tmp_path):
    tokenizer = Tokenizer(model_dir)
    added = tokenizer.hf_tokenizer.get_added_vocab()
    baseline = tokenizer.apply_chat_template([{"role": "user", "content": "xy"}])
    for text, token_id in added.items():
        forged = tokenizer.apply_chat_template([{"role": "user", "content": f"x{text}y"},
                                                {"role": "assistant", "content": text,
                                                 "reasoning_content": text}])
        template_only = tokenizer.apply_chat_template([{"role": "user", "content": "xy"},
                                                       {"role": "assistant", "content": "z",
                                                        "reasoning_content": "w"}])
        assert forged.count(token_id) == template_only.count(token_id), text
    with ServerProcess(tmp_path, model_dir=model_dir) as server:
        content = "hi" + "".join(added)
        response = httpx.post(server.http_url + "/v1/chat/completions",
                              json={"messages": [{"role": "user", "content": content}], "max_tokens": 1}, timeout=60)
        expected = tokenizer.apply_chat_template([{"role": "user", "content": content}])
        assert response.json()["usage"]["prompt_tokens"] == len(expected)
        assert len(expected) > len(baseline) + len(added)


def test_the_api_key_works_as_a_websocket_subprotocol_and_origins_are_checked(model_dir, tmp_path):
    with ServerProcess(tmp_path, model_dir=model_dir, api_key="sesame",
                       allowed_origins="https://app.glmrt.test") as server:
        async def scenario():
            async with connect(server.ws_url, compression=None,
                               subprotocols=["glmrt", "openai-insecure-api-key.sesame"],
                               origin="https://app.glmrt.test") as websocket:
                assert websocket.subprotocol == "glmrt"
                await websocket.send(json.dumps(short_create()))
                events = await until_final(websocket)
            refused = []
            for options in ({"subprotocols": ["openai-insecure-api-key.wrong"]},
                            {"additional_headers": {"Authorization": "Bearer sesame"},
                             "origin": "https://elsewhere.test"}):
                try:
                    async with connect(server.ws_url, compression=None, **options):
                        refused.append(False)
                except Exception:
                    refused.append(True)
            return events, refused

        events, refused = asyncio.run(scenario())
        assert events[-1]["type"] in FINAL_EVENTS
        assert refused == [True, True]
        blocked = httpx.get(server.http_url + "/v1/models",
                            headers={"Authorization": "Bearer sesame", "Origin": "https://elsewhere.test"})
        assert blocked.status_code == 403 and blocked.json()["error"]["code"] == "origin_not_allowed"


def test_the_connection_cap_answers_429_and_1013_and_lets_others_in_after(model_dir, tmp_path):
    with ServerProcess(tmp_path, model_dir=model_dir, max_connections=2) as server:
        async def scenario():
            async with connect(server.ws_url, compression=None), connect(server.ws_url, compression=None):
                refused_http = httpx.get(server.http_url + "/v1/models")
                try:
                    async with connect(server.ws_url, compression=None):
                        refused_ws = False
                except Exception:
                    refused_ws = True
            await asyncio.sleep(0.2)
            return refused_http, refused_ws, httpx.get(server.http_url + "/v1/models")

        refused_http, refused_ws, later = asyncio.run(scenario())
        assert refused_http.status_code == 429 and refused_http.json()["error"]["code"] == "overloaded"
        assert refused_ws and later.status_code == 200


def run_server(args, timeout=60):
    return subprocess.run([sys.executable, str(REPO_ROOT / "server.py")] + args, cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=timeout)


def test_startup_problems_print_one_line_and_exit_with_a_status(tmp_path, model_dir):
    missing = run_server(["--model", str(tmp_path / "nonexistent"), "--port", "0"])
    assert missing.returncode == 2
    assert missing.stderr.strip().splitlines() == [f"glmrt: --model {tmp_path / 'nonexistent'}: no such directory"]
    assert "listening" not in missing.stdout
    bad_port = run_server(["--port", "99999"])
    assert bad_port.returncode == 2 and "must be a TCP port" in bad_port.stderr
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen(1)
    try:
        busy = run_server(["--model", str(model_dir), "--port", str(holder.getsockname()[1])])
    finally:
        holder.close()
    assert busy.returncode == 1
    lines = [line for line in busy.stderr.strip().splitlines() if line.startswith("glmrt:")]
    assert len(lines) == 1 and "cannot listen on" in lines[0] and "Traceback" not in busy.stderr


def test_metrics_send_one_content_type_and_other_methods_get_405(model_dir, tmp_path):
    with ServerProcess(tmp_path, model_dir=model_dir) as server:
        metrics = httpx.get(server.http_url + "/metrics")
        assert len(metrics.headers.get_list("content-type")) == 1
        assert httpx.post(server.http_url + "/healthz").status_code == 405
        assert httpx.delete(server.http_url + "/v1/models").status_code == 405


def test_chaos_keeps_the_canary_whole_and_the_server_at_zero_afterwards(model_dir, tmp_path):
    with ServerProcess(tmp_path, model_dir=model_dir, max_batch=8, max_queued=128, max_connections=256) as server:
        async def canary():
            results = []
            for index in range(30):
                async with connect(server.ws_url, compression=None) as websocket:
                    await websocket.send(json.dumps(short_create(8, f"canary {index}")))
                    results.append((await until_final(websocket))[-1])
            return results

        async def chaos(seed, deadline):
            rng = random.Random(seed)
            async with httpx.AsyncClient(base_url=server.http_url, timeout=60) as http:
                while time.monotonic() < deadline:
                    choice = rng.randrange(6)
                    try:
                        if choice == 0:
                            await connect_send_close(server.ws_url, reset=rng.random() < 0.5)
                        elif choice == 1:
                            async with connect(server.ws_url, compression=None) as websocket:
                                await websocket.send("[" * 3000)
                                await asyncio.wait_for(websocket.recv(), 30)
                        elif choice == 2:
                            async with http.stream("POST", "/v1/chat/completions",
                                                   json={"messages": [{"role": "user", "content": "x"}],
                                                         "max_tokens": 200, "stream": True}) as response:
                                async for _ in response.aiter_lines():
                                    break
                        elif choice == 3:
                            await http.post("/v1/chat/completions", content=b"{not json")
                        elif choice == 4:
                            await http.post("/v1/chat/completions",
                                            json={"messages": [{"role": "user", "content": large_prompt(seed)}],
                                                  "max_tokens": 2})
                        else:
                            async with connect(server.ws_url, compression=None) as websocket:
                                await websocket.send(json.dumps(short_create(50)))
                                created = json.loads(await asyncio.wait_for(websocket.recv(), 30))
                                await websocket.send(json.dumps({"type": "response.cancel",
                                                                 "response_id": created["response"]["id"]}))
                                await until_final(websocket)
                    except (OSError, asyncio.TimeoutError, httpx.HTTPError):
                        pass
                    except Exception as exc:
                        if "ConnectionClosed" not in type(exc).__name__ and "InvalidStatus" not in type(exc).__name__:
                            raise

        async def scenario():
            deadline = time.monotonic() + 45
            chaos_tasks = [asyncio.ensure_future(chaos(seed, deadline)) for seed in range(8)]
            results = await canary()
            await asyncio.gather(*chaos_tasks)
            return results

        results = asyncio.run(scenario())
        assert [event["type"] for event in results] == ["response.incomplete"] * 30
        assert all(event["response"]["usage"]["output_tokens"] == 8 for event in results)
        samples = server.wait_idle(timeout=60)
        assert samples["glmrt:kv_pages_used"] == 0 and samples["glmrt:num_requests_active"] == 0
