import asyncio
import json
import logging
import secrets
import time
from collections import Counter
from dataclasses import dataclass

from glmrt.engine.engine import SamplingParams
from glmrt.engine.engine_thread import EngineThread, EngineUnavailable
from glmrt.engine.native import GLMRT_MAX_STOP_TOKEN_IDS
from glmrt.engine.request import Request
from glmrt.model.tokenizer import Tokenizer
from glmrt.serve.api_error import SERVER_ERROR, ApiError
from glmrt.serve.generation import Generation
from glmrt.serve.generation_spec import RequestLimits
from glmrt.serve.response_store import ResponseStore
from glmrt.serve.response_stream import ResponseStream
from glmrt.serve.tokenize_pool import TokenizerPool

request_log = logging.getLogger("glmrt.requests")


@dataclass(frozen=True)
class RuntimeSettings:
    max_concurrent: int
    max_queued: int
    default_max_tokens: int = 1024
    watermark_pages: int = 0
    served_model_name: str = "glmrt"
    max_stored_responses: int = 4096
    max_active_per_client: int = 64
    tokenizer_threads: int = 2
    max_tokenizing_per_client: int = 8
    relaunch_steps: bool | None = None

    @property
    def capacity(self):
        return self.max_concurrent + self.max_queued


def pick(value, model_default, builtin_default):
    if value is not None:
        return value
    return model_default if model_default is not None else builtin_default


def longest_token_bytes(tokenizer):
    vocab = tokenizer.hf_tokenizer.get_vocab()
    return max((len(token.encode("utf-8")) for token in vocab), default=1) or 1


def message_text_bytes(messages):
    return sum(len(str(message.get("content", "")).encode("utf-8")) for message in messages)


class ServingRuntime:
    def __init__(self, engine_factory, model_dir, metrics, settings):
        self.model_dir = model_dir
        self.metrics = metrics
        self.settings = settings
        self.engine_thread = EngineThread(engine_factory, metrics, max_inbox=settings.capacity,
                                          max_running=settings.max_concurrent,
                                          watermark_pages=settings.watermark_pages,
                                          relaunch=settings.relaunch_steps)
        self.tokenizer = None
        self.max_token_bytes = 1
        self.limits = None
        self.num_active = 0
        self.active_by_owner = Counter()
        self.tokenizer_pool = None
        self.responses = ResponseStore(settings.max_stored_responses)
        self.started_at = int(time.time())
        self.loaded = False
        self.ready = False
        self._stopped = None

    @property
    def config(self):
        return self.engine_thread.config

    @property
    def engine_info(self):
        return self.engine_thread.engine_info

    @property
    def max_prompt_tokens(self):
        return self.engine_info.max_prompt_tokens

    async def start(self):
        loop = asyncio.get_running_loop()
        loaded = loop.create_future()
        self._stopped = loop.create_future()
        self.engine_thread.add_listener(loop, lambda: loaded.done() or loaded.set_result(None),
                                        lambda: self._stopped.done() or self._stopped.set_result(None))
        self.engine_thread.start()
        self.tokenizer_pool = TokenizerPool(self.settings.tokenizer_threads, self.settings.max_tokenizing_per_client)
        self.tokenizer = await asyncio.to_thread(Tokenizer, self.model_dir)
        self.max_token_bytes = await asyncio.to_thread(longest_token_bytes, self.tokenizer)
        await loaded
        if self.engine_thread.load_error is not None:
            raise self.engine_thread.load_error
        self.limits = RequestLimits(vocab_size=self.config.vocab_size,
                                    max_stop_token_ids=GLMRT_MAX_STOP_TOKEN_IDS - len(self.config.eos_token_ids))
        self.loaded = True
        self.ready = True

    @property
    def engine_stopped(self):
        return self._stopped

    async def stop(self):
        self.ready = False
        self.engine_thread.stop()
        if self._stopped is not None and self.engine_thread.loaded.is_set():
            await self._stopped
        await asyncio.to_thread(self.engine_thread.join)
        if self.tokenizer_pool is not None:
            await asyncio.to_thread(self.tokenizer_pool.close)

    def reject_surely_too_long(self, spec, event_id):
        text_bytes = message_text_bytes(spec.messages) if spec.is_chat else len(spec.prompt.encode("utf-8"))
        fewest_tokens = text_bytes // self.max_token_bytes
        if fewest_tokens > self.max_prompt_tokens:
            raise ApiError("context_length_exceeded",
                           f"the input has {text_bytes} bytes, at least {fewest_tokens} tokens; this server "
                           f"accepts at most {self.max_prompt_tokens} prompt tokens",
                           param=spec.input_param, event_id=event_id)

    def encode_input(self, spec, event_id):
        self.reject_surely_too_long(spec, event_id)
        if not spec.is_chat:
            try:
                return self.tokenizer.encode(spec.prompt)
            except Exception as exc:
                raise ApiError("invalid_value", f"the prompt cannot be tokenized: {exc}", param="prompt",
                               event_id=event_id) from None
        try:
            return self.tokenizer.apply_chat_template(list(spec.messages), add_generation_prompt=True,
                                                      enable_thinking=spec.enable_thinking,
                                                      tools=list(spec.tools) or None)
        except Exception as exc:
            raise ApiError("invalid_value", f"the chat template rejected the messages: {exc}",
                           param=spec.input_param, event_id=event_id) from None

    def prepare(self, spec, event_id=None):
        arrived_at = time.perf_counter()
        prompt_ids = self.encode_input(spec, event_id)
        limit = self.max_prompt_tokens
        if len(prompt_ids) > limit:
            raise ApiError("context_length_exceeded",
                           f"the prompt has {len(prompt_ids)} tokens; this server accepts at most {limit} "
                           f"prompt tokens (context {self.engine_info.max_context}, KV pool of "
                           f"{self.engine_info.kv_num_pages} pages of {self.engine_info.kv_page_size} tokens)",
                           param=spec.input_param, event_id=event_id)
        if not prompt_ids:
            raise ApiError("invalid_value", "the input encodes to zero tokens", param=spec.input_param,
                           event_id=event_id)
        max_new_tokens = spec.max_tokens or self.settings.default_max_tokens
        prepared = Request(prompt_ids, self.sampling_params(spec.sampling, max_new_tokens))
        prepared.arrived_at = arrived_at
        return prepared

    def stop_token_settings(self, request):
        extra = list(request.stop_token_ids)
        if not extra:
            return None, request.ignore_eos
        if request.ignore_eos:
            return extra, False
        return list(dict.fromkeys(list(self.config.eos_token_ids) + extra)), False

    def sampling_params(self, request, max_new_tokens):
        config = self.config
        stop_token_ids, ignore_eos = self.stop_token_settings(request)
        return SamplingParams(
            temperature=pick(request.temperature, config.temperature, 1.0),
            top_p=pick(request.top_p, config.top_p, 1.0),
            top_k=max(0, pick(request.top_k, config.top_k, 0)),
            min_p=request.min_p,
            repetition_penalty=request.repetition_penalty,
            frequency_penalty=request.frequency_penalty,
            presence_penalty=request.presence_penalty,
            max_new_tokens=max_new_tokens,
            seed=request.seed if request.seed is not None else secrets.randbits(64),
            stop_token_ids=stop_token_ids,
            ignore_eos=ignore_eos,
        )

    async def prepare_for(self, spec, owner, event_id=None):
        return await self.tokenizer_pool.run(owner, self.prepare, spec, event_id)

    def check_admission(self, event_id=None, owner=None):
        if not self.loaded:
            raise ApiError("server_loading", "the model is still loading; retry later", event_id=event_id,
                           error_type=SERVER_ERROR)
        if not self.ready:
            raise ApiError("server_shutting_down", "the server is not accepting new responses",
                           event_id=event_id, error_type=SERVER_ERROR)
        if self.num_active >= self.settings.capacity:
            self.metrics.admission_rejections.inc()
            raise ApiError("overloaded", f"the server is at its limit of {self.settings.capacity} active "
                           "responses; retry later", event_id=event_id, error_type=SERVER_ERROR)
        if owner is not None and self.active_by_owner[owner] >= self.settings.max_active_per_client:
            self.metrics.admission_rejections.inc()
            raise ApiError("overloaded", f"this client already has {self.settings.max_active_per_client} active "
                           "responses, its limit; retry later", event_id=event_id, error_type=SERVER_ERROR)

    def open_generation(self, request, spec, endpoint, id_prefix, event_id=None, owner=None):
        self.check_admission(event_id, owner)
        request.owner = owner
        request.loop = asyncio.get_running_loop()
        request.queue = asyncio.Queue()
        try:
            self.engine_thread.submit(request)
        except EngineUnavailable as exc:
            raise ApiError("server_shutting_down", str(exc), event_id=event_id, error_type=SERVER_ERROR) from None
        self.num_active += 1
        self.active_by_owner[owner] += 1
        self.metrics.num_requests_active.set(self.num_active)
        return Generation(ResponseStream(self, request, spec.sampling.stop, endpoint, id_prefix), spec)

    def release(self, stream):
        self.num_active -= 1
        owner = stream.request.owner
        self.active_by_owner[owner] -= 1
        if self.active_by_owner[owner] <= 0:
            del self.active_by_owner[owner]
        self.metrics.num_requests_active.set(self.num_active)
        self.metrics.e2e_request_latency.observe(time.perf_counter() - stream.created_at)
        self.metrics.count_finished(stream.status, stream.finish_reason)
        request_log.info(json.dumps({
            "event": "response.finished", "endpoint": stream.endpoint, "response_id": stream.response_id,
            "prompt_tokens": stream.prompt_tokens, "completion_tokens": stream.completion_tokens,
            "ttft_ms": stream.ttft_ms, "tokens_per_s": stream.tokens_per_s,
            "e2e_ms": round((time.perf_counter() - stream.created_at) * 1000.0, 3),
            "finish_reason": stream.finish_reason, "status": stream.status}, separators=(",", ":")))
