import ctypes
import math
from dataclasses import dataclass, fields

import numpy as np

from glmrt.engine import native
from glmrt.engine.errors import GlmrtError
from glmrt.engine.request import Request
from glmrt.model.config import load_model_config
from glmrt.model.native_config import native_model_config

BACKENDS = {"cpu": native.BACKEND_CPU, "cuda": native.BACKEND_CUDA}
MATMUL_PRECISIONS = {"default": native.MATMUL_DEFAULT, "high": native.MATMUL_HIGH, "native": native.MATMUL_NATIVE}
ALL_REDUCES = {"nccl": native.ALL_REDUCE_NCCL, "peer": native.ALL_REDUCE_PEER, "auto": native.ALL_REDUCE_AUTO,
               "peer-bf16": native.ALL_REDUCE_PEER_BF16}


ALL_REDUCE_NAMES = {number: name for name, number in ALL_REDUCES.items() if name != "auto"}
EXPERT_SPLITS = native.EXPERT_SPLITS
LAUNCH_AHEAD = {"auto": native.LAUNCH_AHEAD_DEFAULT, "off": native.LAUNCH_AHEAD_OFF,
                "always": native.LAUNCH_AHEAD_ALWAYS}


def all_reduce_name(value):
    return ALL_REDUCE_NAMES.get(value, "none")


@dataclass
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    max_new_tokens: int = 16
    seed: int = 0
    stop_token_ids: list | None = None
    ignore_eos: bool = False


@dataclass
class EngineStats:
    kv_pages_total: int
    kv_pages_free: int
    kv_page_size: int
    live_requests: int
    tokens_processed: int
    steps: int
    tokens_generated: int
    kv_pages_cached: int
    prefix_cache_queries: int
    prefix_cache_hits: int
    prefix_cache_evictions: int
    device_forward_ns: int
    step_gap_ns: int
    step_gaps: int
    rows_owned_steps: int
    steps_launched_ahead: int

    @property
    def kv_pages_in_use(self):
        return self.kv_pages_total - self.kv_pages_free

    @property
    def mean_step_gap_ns(self):
        return self.step_gap_ns / self.step_gaps if self.step_gaps else 0.0


@dataclass
class EngineInfo:
    backend: int
    num_threads: int
    max_batch: int
    max_tokens_per_step: int
    max_context: int
    max_sequence_tokens: int
    max_prompt_tokens: int
    kv_page_size: int
    kv_num_pages: int
    num_devices: int
    weight_bytes: int
    kv_cache_bytes: int
    workspace_bytes: int
    kv_bytes_per_page: int
    num_native_matmuls: int
    num_decode_graphs: int
    decode_graph_bytes: int
    asynchronous_launch: int
    all_reduce: int
    launch_ahead: int
    device_name: str


@dataclass
class RequestInfo:
    request_id: int
    num_prompt_tokens: int
    num_tokens: int
    num_computed_tokens: int
    num_generated_tokens: int
    num_pages: int
    max_tokens: int
    finish_reason: int

    @property
    def finish_reason_name(self):
        return native.finish_reason_name(self.finish_reason)


def struct_to_dataclass(struct, cls):
    values = {}
    for item in fields(cls):
        value = getattr(struct, item.name)
        values[item.name] = value.decode("utf-8", "replace") if isinstance(value, bytes) else value
    return cls(**values)


def native_sampling_params(params):
    struct = native.SamplingParamsStruct()
    struct.temperature = float(params.temperature)
    struct.top_p = float(params.top_p)
    struct.top_k = int(params.top_k)
    struct.min_p = float(params.min_p)
    struct.repetition_penalty = float(params.repetition_penalty)
    struct.frequency_penalty = float(params.frequency_penalty)
    struct.presence_penalty = float(params.presence_penalty)
    struct.max_new_tokens = int(params.max_new_tokens)
    struct.seed = int(params.seed) & 0xFFFFFFFFFFFFFFFF
    struct.ignore_eos = 1 if params.ignore_eos else 0
    keep_alive = None
    if params.stop_token_ids:
        keep_alive = (native.c_token * len(params.stop_token_ids))(*[int(t) for t in params.stop_token_ids])
        struct.num_stop_token_ids = len(params.stop_token_ids)
        struct.stop_token_ids = keep_alive
    return struct, keep_alive


@dataclass(frozen=True)
class StepPlan:
    num_scheduled_tokens: list
    num_new_pages: int
    num_free_pages: int

    @property
    def fits(self):
        return self.num_new_pages <= self.num_free_pages


class Engine:
    def __init__(self, model_dir, backend="cpu", num_threads=0, max_batch=32, max_tokens_per_step=256,
                 kv_page_size=16, kv_num_pages=1024, max_context=0, device_id=0, num_devices=1, kv_memory_fraction=0.9,
                 random_weights=False, random_seed=0, num_hidden_layers=None, config=None, enable_prefix_caching=True,
                 matmul_precision="default", decode_graphs=True,
                 dependent_launches=True, all_reduce="auto", expert_split="whole", launch_ahead="auto"):
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {sorted(BACKENDS)}, got {backend!r}")
        if matmul_precision not in MATMUL_PRECISIONS:
            raise ValueError(f"matmul_precision must be one of {sorted(MATMUL_PRECISIONS)}, got {matmul_precision!r}")
        if all_reduce not in ALL_REDUCES:
            raise ValueError(f"all_reduce must be one of {sorted(ALL_REDUCES)}, got {all_reduce!r}")
        if expert_split not in EXPERT_SPLITS:
            raise ValueError(f"expert_split must be one of {sorted(EXPERT_SPLITS)}, got {expert_split!r}")
        if launch_ahead not in LAUNCH_AHEAD:
            raise ValueError(f"launch_ahead must be one of {sorted(LAUNCH_AHEAD)}, got {launch_ahead!r}")
        self.backend = backend
        self.model_dir = str(model_dir)
        self.config = config if config is not None else load_model_config(model_dir,
                                                                           num_hidden_layers=num_hidden_layers)
        self._lib = native.load_library(BACKENDS[backend])
        options = native.EngineOptionsStruct()
        self._lib.glmrt_engine_options_default(ctypes.byref(options))
        options.backend = BACKENDS[backend]
        options.num_threads = int(num_threads)
        options.max_batch = int(max_batch)
        options.max_tokens_per_step = int(max_tokens_per_step)
        options.kv_page_size = int(kv_page_size)
        options.kv_num_pages = int(kv_num_pages)
        options.max_context = int(max_context)
        options.device_id = int(device_id)
        options.num_devices = int(num_devices)
        options.kv_memory_fraction = float(kv_memory_fraction)
        options.random_weights = 1 if random_weights else 0
        options.random_seed = int(random_seed)
        options.enable_prefix_caching = 1 if enable_prefix_caching else 0
        options.matmul_precision = MATMUL_PRECISIONS[matmul_precision]
        options.decode_graphs = native.DECODE_GRAPHS_DEFAULT if decode_graphs else native.DECODE_GRAPHS_OFF
        options.dependent_launches = (native.DEPENDENT_LAUNCHES_DEFAULT if dependent_launches
                                      else native.DEPENDENT_LAUNCHES_OFF)
        options.all_reduce = ALL_REDUCES[all_reduce]
        options.expert_split = EXPERT_SPLITS[expert_split]
        options.launch_ahead = LAUNCH_AHEAD[launch_ahead]
        self._native_config = native_model_config(self.config)
        handle = native.engine_p()
        message = ctypes.create_string_buffer(native.GLMRT_ERROR_MESSAGE_CAPACITY)
        status = self._lib.glmrt_engine_create(self.model_dir.encode(), ctypes.byref(self._native_config),
                                               ctypes.byref(options), ctypes.byref(handle), message, len(message))
        if status != native.STATUS_OK:
            raise GlmrtError(status, message.value.decode("utf-8", "replace"))
        self._handle = handle
        self._info = self.info()
        self.max_batch = self._info.max_batch
        self.max_context = self._info.max_context
        self.vocab_size = self.config.vocab_size
        self._tokens_out = (ctypes.c_int64 * self.max_batch)()
        self._finish_reasons_out = (ctypes.c_int32 * self.max_batch)()
        self._scheduled_out = (ctypes.c_int32 * self.max_batch)()
        self._plan_out = native.StepPlanStruct()
        self._requests_in = (native.request_p * self.max_batch)()
        self._infos_out = (native.RequestInfoStruct * self.max_batch)()
        self._count_out = ctypes.c_int32()
        self._relaunched_out = ctypes.c_int32()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    @property
    def closed(self):
        return getattr(self, "_handle", None) is None

    def _require_open(self):
        if self.closed:
            raise GlmrtError(native.STATUS_INVALID_ARGUMENT, "engine is closed")

    def _last_error(self):
        return self._lib.glmrt_engine_last_error(self._handle).decode("utf-8", "replace")

    def _check(self, status):
        if status != native.STATUS_OK:
            raise GlmrtError(status, self._last_error())

    def close(self):
        if getattr(self, "_handle", None) is not None:
            self._lib.glmrt_engine_free(self._handle)
            self._handle = None

    def create_request(self, prompt_ids, params=None):
        return self.open_request(Request(prompt_ids, params or SamplingParams()))

    def open_request(self, request):
        self._require_open()
        if not request.is_freed:
            raise GlmrtError(native.STATUS_INVALID_ARGUMENT, "request is already open")
        prompt = request.prompt_ids
        tokens = (native.c_token * max(1, len(prompt)))(*[int(t) for t in prompt])
        struct, keep_alive = native_sampling_params(request.params)
        handle = native.request_p()
        self._check(self._lib.glmrt_request_create(self._handle, tokens, len(prompt), ctypes.byref(struct),
                                                   ctypes.byref(handle)))
        del keep_alive
        request.handle = handle
        request.engine = self
        return request

    def free_request(self, request):
        if request.is_freed or self.closed:
            return
        status = self._lib.glmrt_request_free(self._handle, request.handle)
        if status != native.STATUS_INVALID_ARGUMENT:
            request.handle = None
        self._check(status)

    def preempt_request(self, request):
        self._require_open()
        self._check(self._lib.glmrt_request_preempt(self._handle, self._live_handle(request)))

    def _live_handle(self, request):
        if request.is_freed:
            raise GlmrtError(native.STATUS_INVALID_ARGUMENT, "request was already freed")
        return request.handle

    def request_info(self, request):
        self._require_open()
        struct = native.RequestInfoStruct()
        self._check(self._lib.glmrt_request_get_info(self._handle, self._live_handle(request), ctypes.byref(struct)))
        return struct_to_dataclass(struct, RequestInfo)

    def request_infos(self, requests):
        self._require_open()
        count = self._fill_requests(requests)
        self._check(self._lib.glmrt_request_get_infos(self._handle, self._requests_in, count, self._infos_out))
        return [struct_to_dataclass(self._infos_out[i], RequestInfo) for i in range(count)]

    def request_tokens(self, request):
        info = self.request_info(request)
        buffer = (native.c_token * max(1, info.num_tokens))()
        count = ctypes.c_int32()
        self._check(self._lib.glmrt_request_get_tokens(self._handle, self._live_handle(request), buffer,
                                                       len(buffer), ctypes.byref(count)))
        return list(buffer[:count.value])

    def _fill_requests(self, requests):
        if len(requests) > self.max_batch:
            raise GlmrtError(native.STATUS_INVALID_ARGUMENT,
                             f"batch of {len(requests)} exceeds max_batch {self.max_batch}")
        handles = [request.handle for request in requests]
        if None in handles:
            raise GlmrtError(native.STATUS_INVALID_ARGUMENT, "request was already freed")
        self._requests_in[:len(requests)] = handles
        return len(requests)

    def plan_step(self, requests):
        self._require_open()
        count = self._fill_requests(requests)
        self._check(self._lib.glmrt_engine_plan_step(self._handle, self._requests_in, count, self._scheduled_out,
                                                     ctypes.byref(self._plan_out)))
        plan = self._plan_out
        return StepPlan(list(self._scheduled_out[:count]), plan.num_new_pages, plan.num_free_pages)

    def step(self, requests):
        self._require_open()
        count = self._fill_requests(requests)
        self._check(self._lib.glmrt_run_batch_decode(self._handle, self._requests_in, count, self._tokens_out,
                                                     self._finish_reasons_out))
        return self._tokens_out[:count], self._finish_reasons_out[:count]

    def launch(self, requests):
        self._require_open()
        count = self._fill_requests(requests)
        self._check(self._lib.glmrt_step_launch(self._handle, self._requests_in, count))

    def complete(self):
        self._require_open()
        count = self._count_out
        self._check(self._lib.glmrt_step_complete(self._handle, self.max_batch, self._tokens_out,
                                                  self._finish_reasons_out, ctypes.byref(count)))
        return self._tokens_out[:count.value], self._finish_reasons_out[:count.value]

    def complete_and_relaunch(self):
        self._require_open()
        count = self._count_out
        self._check(self._lib.glmrt_step_complete_relaunch(self._handle, self.max_batch, self._tokens_out,
                                                           self._finish_reasons_out, ctypes.byref(count),
                                                           ctypes.byref(self._relaunched_out)))
        return (self._tokens_out[:count.value], self._finish_reasons_out[:count.value],
                bool(self._relaunched_out.value))

    def step_with_logits(self, requests):
        self._require_open()
        count = self._fill_requests(requests)
        logits = np.full((max(1, count), self.vocab_size), math.nan, dtype=np.float32)
        pointer = logits.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
        self._check(self._lib.glmrt_run_batch_decode_logits(self._handle, self._requests_in, count, self._tokens_out,
                                                            self._finish_reasons_out, pointer))
        return list(self._tokens_out[:count]), list(self._finish_reasons_out[:count]), logits[:count]

    def stats(self):
        self._require_open()
        struct = native.EngineStatsStruct()
        self._check(self._lib.glmrt_engine_get_stats(self._handle, ctypes.byref(struct)))
        return struct_to_dataclass(struct, EngineStats)

    def info(self):
        self._require_open()
        struct = native.EngineInfoStruct()
        self._check(self._lib.glmrt_engine_get_info(self._handle, ctypes.byref(struct)))
        return struct_to_dataclass(struct, EngineInfo)

    def check_invariants(self):
        self._require_open()
        self._check(self._lib.glmrt_engine_check_invariants(self._handle))
