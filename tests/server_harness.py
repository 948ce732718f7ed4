import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from websockets.asyncio.client import connect

from glmrt.serve.metrics import parse_metric_samples

REPO_ROOT = Path(__file__).resolve().parents[1]
LISTENING = re.compile(r"listening on http://([0-9.]+):([0-9]+)")
SMALL_ENGINE = {"--threads": "2", "--max-batch": "8", "--max-tokens-per-step": "64", "--kv-page-size": "16",
                "--kv-pages": "512"}
START_TIMEOUT_S = 120.0
FINAL_EVENT_TYPES = ("response.completed", "response.incomplete", "response.failed")
TEXT_DELTA_TYPES = ("response.output_text.delta", "response.reasoning_text.delta")
NO_THINKING_EFFORTS = ("none", "minimal")


def build_server_test_model(out_dir):
    from glmrt.testmodel.writer import write_test_model

    return Path(write_test_model(Path(out_dir), seed=0, weight_format="bf16"))


def merged_options(overrides):
    options = dict(SMALL_ENGINE)
    options.update(overrides)
    args = []
    for name, value in options.items():
        if value is None:
            continue
        args.extend([name] if value is True else [name, str(value)])
    return args


def lower_keys(headers):
    return {name.lower(): value for name, value in headers.items()}


def http_request(url, body=None, timeout=30.0, headers=None, method=None):
    data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode("utf-8"))
    sent_headers = {"Content-Type": "application/json"} if data is not None else {}
    sent_headers.update(headers or {})
    request = urllib.request.Request(url, data=data, headers=sent_headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read().decode("utf-8"), lower_keys(response.headers)
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode("utf-8"), lower_keys(error.headers)


def http_get(url, timeout=10.0, headers=None):
    return http_request(url, timeout=timeout, headers=headers)


def http_post_json(url, body, timeout=120.0, headers=None):
    status, text, response_headers = http_request(url, body, timeout, headers)
    return status, json.loads(text) if text else None, response_headers


def sse_payloads(text):
    payloads = []
    for block in text.split("\n\n"):
        for line in block.splitlines():
            if line.startswith("data: "):
                payloads.append(line[len("data: "):])
    return payloads


def sse_events(text):
    events = []
    for payload in sse_payloads(text):
        events.append("[DONE]" if payload == "[DONE]" else json.loads(payload))
    return events


class ServerProcess:
    def __init__(self, log_dir, model_dir=None, env=None, **options):
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.stdout_path = self.log_dir / "server.stdout"
        self.stderr_path = self.log_dir / "server.stderr"
        overrides = {"--host": "127.0.0.1", "--port": "0"}
        if model_dir is not None:
            overrides["--model"] = str(model_dir)
        overrides.update({"--" + name.replace("_", "-"): value for name, value in options.items()})
        self.command = [sys.executable, str(REPO_ROOT / "server.py")] + merged_options(overrides)
        python_path = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
        self.env = dict(os.environ, PYTHONPATH=python_path, **(env or {}))
        self.process = None
        self.port = None

    @property
    def ws_url(self):
        return f"ws://127.0.0.1:{self.port}/v1/responses"

    @property
    def root_ws_url(self):
        return f"ws://127.0.0.1:{self.port}/"

    @property
    def http_url(self):
        return f"http://127.0.0.1:{self.port}"

    def launch(self):
        with open(self.stdout_path, "wb") as stdout, open(self.stderr_path, "wb") as stderr:
            self.process = subprocess.Popen(self.command, stdout=stdout, stderr=stderr, cwd=REPO_ROOT, env=self.env)
        return self

    def wait_listening(self, timeout=START_TIMEOUT_S):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            match = LISTENING.search(self.stdout_path.read_text(errors="replace"))
            if match:
                self.port = int(match.group(2))
                return self
            self.require_running()
            time.sleep(0.05)
        raise TimeoutError(f"server did not start listening within {timeout}s:\n{self.stderr_text()}")

    def wait_healthy(self, timeout=START_TIMEOUT_S):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.require_running()
            if http_get(self.http_url + "/healthz")[0] == 200:
                return self
            time.sleep(0.05)
        raise TimeoutError(f"server did not become healthy within {timeout}s:\n{self.stderr_text()}")

    def start(self):
        return self.launch().wait_listening().wait_healthy()

    def require_running(self):
        if self.process.poll() is not None:
            raise RuntimeError(f"server exited with {self.process.returncode}:\n{self.stderr_text()}")

    def stderr_text(self):
        return self.stderr_path.read_text(errors="replace") if self.stderr_path.exists() else ""

    def stdout_text(self):
        return self.stdout_path.read_text(errors="replace") if self.stdout_path.exists() else ""

    def request_log(self):
        records = []
        for line in self.stderr_text().splitlines():
            if line.startswith("{") and '"response.finished"' in line:
                records.append(json.loads(line))
        return records

    def request_record(self, response_id, timeout=10.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for record in self.request_log():
                if record["response_id"] == response_id:
                    return record
            time.sleep(0.05)
        raise TimeoutError(f"no log line for {response_id}")

    def get(self, path, headers=None):
        return http_get(self.http_url + path, headers=headers)

    def post(self, path, body, headers=None, timeout=120.0):
        return http_post_json(self.http_url + path, body, timeout, headers)

    async def apost(self, path, body, headers=None, timeout=120.0):
        return await asyncio.to_thread(self.post, path, body, headers, timeout)

    def post_stream(self, path, body, headers=None, timeout=120.0):
        status, text, response_headers = http_request(self.http_url + path, body, timeout, headers)
        return status, sse_events(text) if status == 200 else json.loads(text), response_headers

    async def apost_stream(self, path, body, headers=None, timeout=120.0):
        return await asyncio.to_thread(self.post_stream, path, body, headers, timeout)

    def metrics(self):
        status, body, _ = self.get("/metrics")
        assert status == 200
        return parse_metric_samples(body)

    def wait_idle(self, timeout=10.0):
        deadline = time.monotonic() + timeout
        samples = {}
        while time.monotonic() < deadline:
            samples = self.metrics()
            if (samples.get("glmrt:num_requests_running") == 0 and samples.get("glmrt:num_requests_waiting") == 0
                    and samples.get("glmrt:kv_pages_used") == 0 and samples.get("glmrt:num_requests_active") == 0):
                return samples
            time.sleep(0.02)
        raise AssertionError(f"server did not go idle within {timeout}s: {samples}")

    async def idle(self, timeout=10.0):
        return await asyncio.to_thread(self.wait_idle, timeout)

    async def record_of(self, response_id, timeout=10.0):
        return await asyncio.to_thread(self.request_record, response_id, timeout)

    def rss_bytes(self):
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise RuntimeError("VmRSS missing")

    def open_sockets(self):
        fds = Path(f"/proc/{self.process.pid}/fd")
        count = 0
        for entry in fds.iterdir():
            try:
                count += os.readlink(entry).startswith("socket:")
            except OSError:
                continue
        return count

    async def wait_open_sockets(self, most, timeout=10.0):
        deadline = time.monotonic() + timeout
        count = self.open_sockets()
        while count > most and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
            count = self.open_sockets()
        return count

    def send_signal(self, signum):
        self.process.send_signal(signum)

    def wait_exit(self, timeout=60.0):
        return self.process.wait(timeout=timeout)

    def stop(self):
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=30)

    def __enter__(self):
        return self.start()

    def __exit__(self, exc_type, exc, tb):
        self.stop()


@dataclass
class ResponseRecord:
    response_id: str | None = None
    created: dict | None = None
    events: list = field(default_factory=list)
    deltas: list = field(default_factory=list)
    errors: list = field(default_factory=list)
    final: dict | None = None

    @property
    def done(self):
        return self.final is not None

    @property
    def response(self):
        return self.final["response"] if self.final is not None else None

    @property
    def status(self):
        return self.response["status"] if self.final is not None else None

    @property
    def usage(self):
        return self.response["usage"] if self.final is not None else None

    @property
    def token_ids(self):
        return [token for delta in self.deltas for token in delta.get("token_ids", [])]

    @property
    def text(self):
        return "".join(delta["delta"] for delta in self.deltas if delta["type"] == "response.output_text.delta")

    @property
    def all_text(self):
        return "".join(delta["delta"] for delta in self.deltas)

    @property
    def reasoning(self):
        return "".join(delta["delta"] for delta in self.deltas if delta["type"] == "response.reasoning_text.delta")

    def add(self, event):
        kind = event["type"]
        self.events.append(event)
        if kind == "response.created":
            self.created = event
            self.response_id = event["response"]["id"]
        elif kind in TEXT_DELTA_TYPES:
            self.deltas.append(event)
        elif kind == "error":
            self.errors.append(event)
        elif kind in FINAL_EVENT_TYPES:
            self.final = event


def create_frame(body, event_id=None):
    frame = {"type": "response.create"}
    frame.update(body)
    if event_id is not None:
        frame["event_id"] = event_id
    return json.dumps(frame)


def cancel_frame(response_id, event_id=None):
    frame = {"type": "response.cancel", "response_id": response_id}
    if event_id is not None:
        frame["event_id"] = event_id
    return json.dumps(frame)


async def receive_event(websocket, timeout=60.0):
    return json.loads(await asyncio.wait_for(websocket.recv(), timeout))


async def read_response(websocket, record, timeout=120.0, until=None):
    while record.final is None:
        event = await receive_event(websocket, timeout)
        record.add(event)
        if event["type"] == "error" and "response_id" not in event:
            return record
        if until is not None and until(record):
            return record
    return record


async def generate(url, body, timeout=120.0, headers=None):
    async with connect(url, compression=None, additional_headers=headers) as websocket:
        await websocket.send(create_frame(body))
        return await read_response(websocket, ResponseRecord(), timeout)


OFFLINE_ENGINE = dict(num_threads=2, max_batch=8, max_tokens_per_step=64, kv_page_size=16, kv_num_pages=512)


def solo_outputs(model_dir, jobs, **engine_options):
    from glmrt.engine.engine import Engine

    settings = dict(OFFLINE_ENGINE)
    settings.update(engine_options)
    outputs = []
    with Engine(model_dir, **settings) as engine:
        for prompt_ids, params in jobs:
            request = engine.create_request(prompt_ids, params)
            tokens = []
            while True:
                step_tokens, finish_codes = engine.step([request])
                if step_tokens[0] >= 0:
                    tokens.append(step_tokens[0])
                if finish_codes[0]:
                    break
            engine.free_request(request)
            outputs.append(tokens)
        assert engine.stats().kv_pages_free == engine.stats().kv_pages_total
    return outputs


def streamed_text(tokenizer, token_ids):
    from glmrt.model.tokenizer import IncrementalDecoder

    decoder = IncrementalDecoder(tokenizer, skip_special_tokens=True)
    return "".join(decoder.push(token) for token in token_ids) + decoder.flush()


def split_output(text, starts_in_reasoning):
    from glmrt.serve.glm_output import ContentDelta, GlmOutputParser, ReasoningDelta

    parser = GlmOutputParser(None, starts_in_reasoning=starts_in_reasoning)
    events = parser.feed(text) + parser.finish()
    reasoning = "".join(event.text for event in events if isinstance(event, ReasoningDelta))
    content = "".join(event.text for event in events if isinstance(event, ContentDelta))
    return reasoning, content


def max_tokens_of(body):
    for name in ("max_output_tokens", "max_completion_tokens", "max_tokens"):
        if body.get(name) is not None:
            return body[name]
    raise KeyError("the body names no token limit")


def sampling_params_for(body, eos_token_ids):
    from glmrt.engine.engine import SamplingParams

    extra = list(body.get("stop_token_ids", []))
    ignore_eos = body.get("ignore_eos", False)
    stop_token_ids = None
    if extra:
        stop_token_ids = extra if ignore_eos else list(dict.fromkeys(list(eos_token_ids) + extra))
    return SamplingParams(temperature=body.get("temperature", 1.0), top_p=body.get("top_p", 1.0),
                          top_k=body.get("top_k", 0), min_p=body.get("min_p", 0.0),
                          repetition_penalty=body.get("repetition_penalty", 1.0),
                          frequency_penalty=body.get("frequency_penalty", 0.0),
                          presence_penalty=body.get("presence_penalty", 0.0),
                          max_new_tokens=max_tokens_of(body), seed=body["seed"],
                          stop_token_ids=stop_token_ids, ignore_eos=ignore_eos and not extra)


def thinking_of(body):
    if "input" in body:
        effort = (body.get("reasoning") or {}).get("effort")
        return effort not in NO_THINKING_EFFORTS
    kwargs = body.get("chat_template_kwargs") or {}
    if "enable_thinking" in kwargs:
        return kwargs["enable_thinking"]
    return body.get("reasoning_effort") not in NO_THINKING_EFFORTS


def input_messages(body):
    messages = [{"role": "system", "content": body["instructions"]}] if body.get("instructions") else []
    value = body["input"]
    if isinstance(value, str):
        return messages + [{"role": "user", "content": value}]
    for item in value:
        role = "system" if item["role"] == "developer" else item["role"]
        messages.append({"role": role, "content": item["content"]})
    return messages


def prompt_ids_for(tokenizer, body):
    if "input" in body:
        return tokenizer.apply_chat_template(input_messages(body), enable_thinking=thinking_of(body))
    if "messages" in body:
        return tokenizer.apply_chat_template(body["messages"], enable_thinking=thinking_of(body))
    return tokenizer.encode(body["prompt"])


def words_prompt(seed, count):
    import random

    rng = random.Random(seed)
    vocabulary = ("river mountain garden window morning evening kitchen library question answer number system "
                  "language model token server request engine memory kernel thread matrix vector layer").split()
    return " ".join(rng.choice(vocabulary) for _ in range(count))
