import ctypes
import functools
import os
from pathlib import Path

GLMRT_MAX_EOS_TOKEN_IDS = 16
GLMRT_MAX_STOP_TOKEN_IDS = 256
GLMRT_ERROR_MESSAGE_CAPACITY = 1024
GLMRT_MAX_DEVICES = 16
GLMRT_ABI_VERSION = 13

BACKEND_CPU = 0
BACKEND_CUDA = 1
MATMUL_DEFAULT = 0
MATMUL_HIGH = 1
MATMUL_NATIVE = 2
DECODE_GRAPHS_DEFAULT = 0
DECODE_GRAPHS_OFF = 1
DEPENDENT_LAUNCHES_DEFAULT = 0
DEPENDENT_LAUNCHES_OFF = 1
LAUNCH_AHEAD_DEFAULT = 0
LAUNCH_AHEAD_OFF = 1
LAUNCH_AHEAD_ALWAYS = 2
ALL_REDUCE_NONE = -1
ALL_REDUCE_NCCL = 0
ALL_REDUCE_PEER = 1
ALL_REDUCE_AUTO = 2
ALL_REDUCE_PEER_BF16 = 3
EXPERT_SPLIT_WHOLE = 0
EXPERT_SPLIT_COLUMNS = 1
EXPERT_SPLITS = {"whole": EXPERT_SPLIT_WHOLE, "columns": EXPERT_SPLIT_COLUMNS}

QUANT_NONE = 0
QUANT_FP8_CHANNEL = 1
QUANT_FP8_BLOCK = 2

FINISH_NONE = 0

STATUS_OK = 0
STATUS_INVALID_ARGUMENT = 1

c_status = ctypes.c_int32
c_token = ctypes.c_int32


class ModelConfigStruct(ctypes.Structure):
    _fields_ = [
        ("vocab_size", ctypes.c_int32),
        ("hidden_size", ctypes.c_int32),
        ("intermediate_size", ctypes.c_int32),
        ("moe_intermediate_size", ctypes.c_int32),
        ("num_hidden_layers", ctypes.c_int32),
        ("num_attention_heads", ctypes.c_int32),
        ("num_key_value_heads", ctypes.c_int32),
        ("head_dim", ctypes.c_int32),
        ("n_routed_experts", ctypes.c_int32),
        ("n_shared_experts", ctypes.c_int32),
        ("num_experts_per_tok", ctypes.c_int32),
        ("first_k_dense_replace", ctypes.c_int32),
        ("n_group", ctypes.c_int32),
        ("topk_group", ctypes.c_int32),
        ("norm_topk_prob", ctypes.c_int32),
        ("use_qk_norm", ctypes.c_int32),
        ("attention_bias", ctypes.c_int32),
        ("tie_word_embeddings", ctypes.c_int32),
        ("max_position_embeddings", ctypes.c_int32),
        ("weight_quant", ctypes.c_int32),
        ("weight_block_rows", ctypes.c_int32),
        ("weight_block_cols", ctypes.c_int32),
        ("routed_scaling_factor", ctypes.c_float),
        ("rms_norm_eps", ctypes.c_float),
        ("rope_theta", ctypes.c_float),
        ("partial_rotary_factor", ctypes.c_float),
        ("num_eos_token_ids", ctypes.c_int32),
        ("eos_token_ids", c_token * GLMRT_MAX_EOS_TOKEN_IDS),
    ]


class EngineOptionsStruct(ctypes.Structure):
    _fields_ = [
        ("backend", ctypes.c_int32),
        ("num_threads", ctypes.c_int32),
        ("max_batch", ctypes.c_int32),
        ("max_tokens_per_step", ctypes.c_int32),
        ("kv_page_size", ctypes.c_int32),
        ("kv_num_pages", ctypes.c_int32),
        ("max_context", ctypes.c_int32),
        ("device_id", ctypes.c_int32),
        ("num_devices", ctypes.c_int32),
        ("kv_memory_fraction", ctypes.c_float),
        ("random_weights", ctypes.c_int32),
        ("random_seed", ctypes.c_uint64),
        ("enable_prefix_caching", ctypes.c_int32),
        ("matmul_precision", ctypes.c_int32),
        ("decode_graphs", ctypes.c_int32),
        ("dependent_launches", ctypes.c_int32),
        ("all_reduce", ctypes.c_int32),
        ("expert_split", ctypes.c_int32),
        ("launch_ahead", ctypes.c_int32),
    ]


class RankInfoStruct(ctypes.Structure):
    _fields_ = [(name, ctypes.c_int32) for name in (
        "q_head_begin", "q_head_count", "kv_head_begin", "kv_head_count", "expert_begin", "expert_count",
        "vocab_begin", "vocab_count", "dense_begin", "dense_count", "shared_begin", "shared_count",
        "expert_column_begin", "expert_column_count")]


class SamplingParamsStruct(ctypes.Structure):
    _fields_ = [
        ("temperature", ctypes.c_float),
        ("top_p", ctypes.c_float),
        ("min_p", ctypes.c_float),
        ("repetition_penalty", ctypes.c_float),
        ("frequency_penalty", ctypes.c_float),
        ("presence_penalty", ctypes.c_float),
        ("top_k", ctypes.c_int32),
        ("max_new_tokens", ctypes.c_int32),
        ("seed", ctypes.c_uint64),
        ("ignore_eos", ctypes.c_int32),
        ("num_stop_token_ids", ctypes.c_int32),
        ("stop_token_ids", ctypes.POINTER(c_token)),
    ]


class EngineStatsStruct(ctypes.Structure):
    _fields_ = [
        ("kv_pages_total", ctypes.c_int32),
        ("kv_pages_free", ctypes.c_int32),
        ("kv_page_size", ctypes.c_int32),
        ("live_requests", ctypes.c_int32),
        ("tokens_processed", ctypes.c_int64),
        ("steps", ctypes.c_int64),
        ("tokens_generated", ctypes.c_int64),
        ("kv_pages_cached", ctypes.c_int32),
        ("prefix_cache_queries", ctypes.c_int64),
        ("prefix_cache_hits", ctypes.c_int64),
        ("prefix_cache_evictions", ctypes.c_int64),
        ("device_forward_ns", ctypes.c_int64),
        ("step_gap_ns", ctypes.c_int64),
        ("step_gaps", ctypes.c_int64),
        ("rows_owned_steps", ctypes.c_int64),
        ("steps_launched_ahead", ctypes.c_int64),
    ]


class EngineInfoStruct(ctypes.Structure):
    _fields_ = [
        ("backend", ctypes.c_int32),
        ("num_threads", ctypes.c_int32),
        ("max_batch", ctypes.c_int32),
        ("max_tokens_per_step", ctypes.c_int32),
        ("max_context", ctypes.c_int32),
        ("max_sequence_tokens", ctypes.c_int32),
        ("max_prompt_tokens", ctypes.c_int32),
        ("kv_page_size", ctypes.c_int32),
        ("kv_num_pages", ctypes.c_int32),
        ("num_devices", ctypes.c_int32),
        ("weight_bytes", ctypes.c_int64),
        ("kv_cache_bytes", ctypes.c_int64),
        ("workspace_bytes", ctypes.c_int64),
        ("kv_bytes_per_page", ctypes.c_int64),
        ("num_native_matmuls", ctypes.c_int32),
        ("num_decode_graphs", ctypes.c_int32),
        ("decode_graph_bytes", ctypes.c_int64),
        ("asynchronous_launch", ctypes.c_int32),
        ("all_reduce", ctypes.c_int32),
        ("launch_ahead", ctypes.c_int32),
        ("device_name", ctypes.c_char * 128),
    ]


class RequestInfoStruct(ctypes.Structure):
    _fields_ = [
        ("request_id", ctypes.c_int64),
        ("num_prompt_tokens", ctypes.c_int32),
        ("num_tokens", ctypes.c_int32),
        ("num_computed_tokens", ctypes.c_int32),
        ("num_generated_tokens", ctypes.c_int32),
        ("num_pages", ctypes.c_int32),
        ("max_tokens", ctypes.c_int32),
        ("finish_reason", ctypes.c_int32),
    ]


class StepPlanStruct(ctypes.Structure):
    _fields_ = [(name, ctypes.c_int32) for name in (
        "num_requests", "num_scheduled_requests", "num_scheduled_tokens", "num_new_pages", "num_free_pages")]


engine_p = ctypes.c_void_p
request_p = ctypes.c_void_p

SIGNATURES = {
    "glmrt_abi_version": (ctypes.c_int32, []),
    "glmrt_status_name": (ctypes.c_char_p, [c_status]),
    "glmrt_finish_reason_name": (ctypes.c_char_p, [ctypes.c_int32]),
    "glmrt_model_config_check": (c_status, [ctypes.POINTER(ModelConfigStruct), ctypes.c_char_p, ctypes.c_int32]),
    "glmrt_engine_options_default": (None, [ctypes.POINTER(EngineOptionsStruct)]),
    "glmrt_sampling_params_default": (None, [ctypes.POINTER(SamplingParamsStruct)]),
    "glmrt_engine_create": (c_status, [ctypes.c_char_p, ctypes.POINTER(ModelConfigStruct),
                                       ctypes.POINTER(EngineOptionsStruct), ctypes.POINTER(engine_p),
                                       ctypes.c_char_p, ctypes.c_int32]),
    "glmrt_engine_free": (None, [engine_p]),
    "glmrt_engine_last_error": (ctypes.c_char_p, [engine_p]),
    "glmrt_engine_get_stats": (c_status, [engine_p, ctypes.POINTER(EngineStatsStruct)]),
    "glmrt_engine_get_info": (c_status, [engine_p, ctypes.POINTER(EngineInfoStruct)]),
    "glmrt_engine_check_invariants": (c_status, [engine_p]),
    "glmrt_engine_plan_step": (c_status, [engine_p, ctypes.POINTER(request_p), ctypes.c_int32,
                                          ctypes.POINTER(ctypes.c_int32), ctypes.POINTER(StepPlanStruct)]),
    "glmrt_request_create": (c_status, [engine_p, ctypes.POINTER(c_token), ctypes.c_int32,
                                        ctypes.POINTER(SamplingParamsStruct), ctypes.POINTER(request_p)]),
    "glmrt_request_free": (c_status, [engine_p, request_p]),
    "glmrt_request_preempt": (c_status, [engine_p, request_p]),
    "glmrt_request_get_info": (c_status, [engine_p, request_p, ctypes.POINTER(RequestInfoStruct)]),
    "glmrt_request_get_infos": (c_status, [engine_p, ctypes.POINTER(request_p), ctypes.c_int32,
                                           ctypes.POINTER(RequestInfoStruct)]),
    "glmrt_request_get_tokens": (c_status, [engine_p, request_p, ctypes.POINTER(c_token), ctypes.c_int32,
                                            ctypes.POINTER(ctypes.c_int32)]),
    "glmrt_step_launch": (c_status, [engine_p, ctypes.POINTER(request_p), ctypes.c_int32]),
    "glmrt_step_complete": (c_status, [engine_p, ctypes.c_int32, ctypes.POINTER(ctypes.c_int64),
                                       ctypes.POINTER(ctypes.c_int32), ctypes.POINTER(ctypes.c_int32)]),
    "glmrt_step_complete_relaunch": (c_status, [engine_p, ctypes.c_int32, ctypes.POINTER(ctypes.c_int64),
                                                ctypes.POINTER(ctypes.c_int32), ctypes.POINTER(ctypes.c_int32),
                                                ctypes.POINTER(ctypes.c_int32)]),
    "glmrt_run_batch_decode": (c_status, [engine_p, ctypes.POINTER(request_p), ctypes.c_int32,
                                          ctypes.POINTER(ctypes.c_int64), ctypes.POINTER(ctypes.c_int32)]),
    "glmrt_run_batch_decode_logits": (c_status, [engine_p, ctypes.POINTER(request_p), ctypes.c_int32,
                                                 ctypes.POINTER(ctypes.c_int64), ctypes.POINTER(ctypes.c_int32),
                                                 ctypes.POINTER(ctypes.c_float)]),
    "glmrt_fp8_e4m3_decode": (c_status, [ctypes.POINTER(ctypes.c_uint8), ctypes.POINTER(ctypes.c_float),
                                         ctypes.c_int64]),
    "glmrt_fp8_e4m3_encode": (c_status, [ctypes.POINTER(ctypes.c_float), ctypes.POINTER(ctypes.c_uint8),
                                         ctypes.c_int64]),
    "glmrt_plan_ranks": (c_status, [ctypes.POINTER(ModelConfigStruct), ctypes.c_int32, ctypes.c_int32,
                                            ctypes.POINTER(RankInfoStruct), ctypes.c_char_p, ctypes.c_int32]),
    "glmrt_checkpoint_validate": (c_status, [ctypes.c_char_p, ctypes.POINTER(ModelConfigStruct), ctypes.c_char_p,
                                             ctypes.c_int32]),
    "glmrt_safetensors_validate": (c_status, [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int32,
                                              ctypes.POINTER(ctypes.c_int32)]),
    "glmrt_sample_logits": (c_status, [ctypes.POINTER(ctypes.c_float), ctypes.c_int32,
                                       ctypes.POINTER(SamplingParamsStruct), ctypes.POINTER(c_token), ctypes.c_int32,
                                       ctypes.c_int32, ctypes.POINTER(c_token)]),
    "glmrt_sampling_probabilities": (c_status, [ctypes.POINTER(ctypes.c_float), ctypes.c_int32,
                                                ctypes.POINTER(SamplingParamsStruct), ctypes.POINTER(c_token),
                                                ctypes.c_int32, ctypes.c_int32, ctypes.POINTER(ctypes.c_float)]),
}

REPO_ROOT = Path(__file__).resolve().parents[2]
LIBRARY_NAMES = {BACKEND_CPU: "libglmrt.so", BACKEND_CUDA: "libglmrt_cuda.so"}
_loaded = {}


def library_path(backend=BACKEND_CPU):
    override = os.environ.get("GLMRT_CUDA_LIB" if backend == BACKEND_CUDA else "GLMRT_LIB")
    if override:
        return Path(override)
    return REPO_ROOT / "build" / LIBRARY_NAMES[backend]


def bind(library):
    for name, (restype, argtypes) in SIGNATURES.items():
        function = getattr(library, name)
        function.restype = restype
        function.argtypes = argtypes
    return library


def load_library(backend=BACKEND_CPU):
    path = library_path(backend)
    key = str(path)
    if key not in _loaded:
        if not path.exists():
            raise FileNotFoundError(f"native library {path} is missing: run `bash build.sh`"
                                    + (" --cuda" if backend == BACKEND_CUDA else ""))
        library = ctypes.CDLL(key)
        library.glmrt_abi_version.restype = ctypes.c_int32
        library.glmrt_abi_version.argtypes = []
        version = library.glmrt_abi_version()
        if version != GLMRT_ABI_VERSION:
            raise RuntimeError(f"native library {path} has ABI {version}, this glmrt needs {GLMRT_ABI_VERSION}: "
                               "rebuild it with `bash build.sh`")
        _loaded[key] = bind(library)
    return _loaded[key]


@functools.lru_cache(maxsize=64)
def status_name(status):
    return load_library(BACKEND_CPU).glmrt_status_name(int(status)).decode("ascii")


@functools.lru_cache(maxsize=64)
def finish_reason_name(finish_reason):
    name = load_library(BACKEND_CPU).glmrt_finish_reason_name(int(finish_reason)).decode("ascii")
    return name or None
