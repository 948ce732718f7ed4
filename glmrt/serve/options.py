import argparse

DEFAULT_MAX_BATCH = 32
DEFAULT_STEP_TOKENS = {"cpu": 256, "cuda": 2048}


def port_number(text):
    value = int(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a TCP port in [0, 65535], got {value}")
    return value


def positive_int(text):
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def non_negative_int(text):
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def positive_float(text):
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return value


def fraction(text):
    value = float(text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {value}")
    return value


def add_engine_options(parser):
    group = parser.add_argument_group("engine")
    group.add_argument("--model", default=None,
                       help="checkpoint directory; without it a cached random-weight test model is built and served")
    group.add_argument("--backend", choices=("cpu", "cuda"), default="cpu")
    group.add_argument("--device-id", type=non_negative_int, default=0, help="first CUDA device the model uses")
    group.add_argument("--num-devices", type=positive_int, default=1,
                       help="CUDA devices the model is split over, from --device-id on (attention heads, dense MLP "
                            "and shared expert columns split; routed experts spread)")
    group.add_argument("--max-batch", type=positive_int, default=DEFAULT_MAX_BATCH,
                       help="most requests in one engine step")
    group.add_argument("--max-tokens-per-step", type=positive_int, default=None,
                       help="token budget of one step (decode tokens plus prefill chunks); default 256 on cpu and "
                            "2048 on cuda, at least --max-batch (a MoE prefill step reads every expert's weights, so "
                            "a larger step serves more prompt tokens for the same bytes)")
    group.add_argument("--kv-pages", type=non_negative_int, default=None,
                       help="KV cache pages in the pool (default: 1024 on cpu; on cuda as many as "
                            "--kv-memory-fraction of free device memory holds)")
    group.add_argument("--kv-page-size", type=positive_int, default=16, help="tokens per KV page")
    group.add_argument("--kv-memory-fraction", type=fraction, default=0.9,
                       help="share of free device memory the CUDA backend may give to the KV pool")
    group.add_argument("--threads", type=non_negative_int, default=0, help="CPU threads (0 = all cores)")
    group.add_argument("--max-context", type=non_negative_int, default=0,
                       help="context limit in tokens (0 = the model's)")
    group.add_argument("--random-weights", action="store_true",
                       help="fill weights with random values instead of reading them")
    group.add_argument("--num-layers", type=positive_int, default=None,
                       help="run only the first N decoder layers")
    group.add_argument("--prefix-caching", action=argparse.BooleanOptionalAction, default=True,
                       help="reuse the KV pages of prompt prefixes computed before (on by default)")
    group.add_argument("--matmul-precision", choices=("default", "native", "high"), default="default",
                       help="native rounds matmul inputs to the weights' format (per-token E4M3 for FP8, BF16 for "
                            "BF16), as the CUDA backend's tensor-core matmuls do on Hopper; high keeps f32 inputs; "
                            "default is native on the CUDA backend and high on the CPU backend")
    group.add_argument("--decode-graphs", action=argparse.BooleanOptionalAction, default=True,
                       help="replay decode steps from CUDA graphs captured per batch-size bucket at startup "
                            "(CUDA backend, on each GPU of a split model; on by default)")
    group.add_argument("--dependent-launches", action=argparse.BooleanOptionalAction, default=True,
                       help="let each CUDA kernel start while the one before it finishes (programmatic dependent "
                            "launch; on by default)")
    group.add_argument("--all-reduce", choices=("auto", "peer", "nccl", "peer-bf16"), default="auto",
                       help="how the GPUs of a split model sum their partial hidden states: peer (each GPU writes "
                            "its partial into the others' memory over NVLink and they add them in GPU order), nccl "
                            "(through NCCL, also in GPU order from three GPUs on), or auto (the default: peer where "
                            "every GPU can reach every other one's memory, nccl otherwise); all three give the same "
                            "bits. peer-bf16 is peer with the partials and their sum sent rounded to BF16 (half the "
                            "bytes; the residual stays FP32 on every GPU), which rounds where the others do not")
    group.add_argument("--expert-split", choices=("whole", "columns"), default="whole",
                       help="how a split model spreads the routed experts: whole (the default: each GPU holds whole "
                            "experts, a contiguous share of them) or columns (each GPU holds its share of every "
                            "expert's intermediate columns, as the shared expert is split, so one token's experts "
                            "load every GPU alike)")
    group.add_argument("--launch-ahead", choices=("auto", "off", "always"), default="auto",
                       help="a relaunched decode step is launched before the step it continues has completed, its "
                            "tokens taken on the device from that step's sampler, so the device never waits for "
                            "the host between steps: auto (the default: where the backend launches asynchronously "
                            "and feeds tokens on the device, the CUDA backend on one GPU), off, or always (also on "
                            "backends whose launch is the forward pass; for tests)")
    return group


def add_serving_options(parser):
    group = parser.add_argument_group("serving")
    group.add_argument("--max-concurrent", type=positive_int, default=None,
                       help="responses running at once (default: --max-batch)")
    group.add_argument("--max-queued", type=non_negative_int, default=None,
                       help="responses waiting beyond the running ones before 'overloaded' (default: 4 x max batch)")
    group.add_argument("--default-max-tokens", type=positive_int, default=1024,
                       help="max_tokens of a request that gives none")
    group.add_argument("--watermark-pages", type=non_negative_int, default=0,
                       help="KV pages kept free when admitting a new request")
    group.add_argument("--served-model-name", default=None,
                       help="the model id of the OpenAI API (default: the checkpoint directory's name)")
    group.add_argument("--api-key", default=None,
                       help="require 'Authorization: Bearer KEY' on every endpoint but /healthz, /readyz, /metrics")
    group.add_argument("--max-active-per-client", type=positive_int, default=None,
                       help="responses one client may have in flight and queued (a WebSocket connection, or one "
                            "client address over HTTP; default: twice --max-concurrent)")
    group.add_argument("--max-connections", type=positive_int, default=1024,
                       help="open HTTP requests and WebSockets at once; more are answered 429 or closed with 1013")
    group.add_argument("--tokenizer-threads", type=positive_int, default=2,
                       help="threads that render and tokenize prompts, shared round-robin across clients")
    group.add_argument("--max-tokenizing-per-client", type=positive_int, default=None,
                       help="prompts one client may have waiting for the tokenizer (default: its active limit)")
    group.add_argument("--allowed-origins", default=None,
                       help="comma-separated Origin values browsers may connect from (default: any)")
    group.add_argument("--max-stored-responses", type=non_negative_int, default=4096,
                       help="finished responses kept in memory for previous_response_id (0 keeps none)")
    group.add_argument("--relaunch-steps", action=argparse.BooleanOptionalAction, default=None,
                       help="when a step completes and no request waits to join or leave the batch, the native core "
                            "launches the next step of the same requests before the engine thread runs any Python, "
                            "so the device does not wait for the interpreter (default: on where launches return "
                            "before the forward pass runs, the CUDA backend)")
    group.add_argument("--switch-interval", type=positive_float, default=0.0001,
                       help="seconds a Python thread runs before the interpreter offers its lock to another "
                            "(Python's default is 0.005); short, so the engine thread never waits long behind "
                            "the event loop between steps")
    return group


def add_network_options(parser):
    group = parser.add_argument_group("network")
    group.add_argument("--host", default="127.0.0.1")
    group.add_argument("--port", type=port_number, default=8765, help="TCP port (0 = any free port)")
    group.add_argument("--send-timeout", type=positive_float, default=10.0,
                       help="seconds one frame may take to send before the connection is aborted")
    group.add_argument("--socket-send-buffer", type=non_negative_int, default=0,
                       help="SO_SNDBUF of each client socket in bytes (0 = kernel autotuning)")
    group.add_argument("--max-frame-bytes", type=positive_int, default=4 * 1024 * 1024,
                       help="largest request body or WebSocket frame; bigger HTTP bodies get 413, bigger frames close "
                            "the WebSocket with 1009")
    group.add_argument("--ping-interval", type=positive_float, default=20.0)
    group.add_argument("--ping-timeout", type=positive_float, default=20.0)
    group.add_argument("--shutdown-timeout", type=positive_float, default=30.0,
                       help="seconds to wait for in-flight responses to end on SIGINT or SIGTERM")
    return group


def resolve_serving_limits(args):
    max_concurrent = args.max_concurrent if args.max_concurrent is not None else args.max_batch
    max_queued = args.max_queued if args.max_queued is not None else 4 * args.max_batch
    return max_concurrent, max_queued


def resolve_client_limit(args, max_concurrent):
    return args.max_active_per_client if args.max_active_per_client is not None else 2 * max_concurrent


def resolve_step_tokens(args):
    if args.max_tokens_per_step is not None:
        return args.max_tokens_per_step
    return max(DEFAULT_STEP_TOKENS[args.backend], args.max_batch)


def engine_kwargs(args):
    kwargs = dict(backend=args.backend, num_threads=args.threads, max_batch=args.max_batch,
                  max_tokens_per_step=resolve_step_tokens(args), kv_page_size=args.kv_page_size,
                  max_context=args.max_context, device_id=args.device_id, num_devices=args.num_devices,
                  kv_memory_fraction=args.kv_memory_fraction, random_weights=args.random_weights,
                  num_hidden_layers=args.num_layers, enable_prefix_caching=args.prefix_caching,
                  matmul_precision=args.matmul_precision, decode_graphs=args.decode_graphs,
                  dependent_launches=args.dependent_launches, all_reduce=args.all_reduce,
                  expert_split=args.expert_split, launch_ahead=args.launch_ahead)
    if args.kv_pages is not None:
        kwargs["kv_num_pages"] = args.kv_pages
    elif args.backend == "cuda":
        kwargs["kv_num_pages"] = 0
    return kwargs


def server_parser():
    parser = argparse.ArgumentParser(prog="python server.py",
                                     description="Streaming WebSocket server for GLM-4.7 on the glmrt engine.")
    add_engine_options(parser)
    add_serving_options(parser)
    add_network_options(parser)
    parser.add_argument("--log-level", default="INFO", choices=("DEBUG", "INFO", "WARNING", "ERROR"))
    return parser


def generate_parser():
    parser = argparse.ArgumentParser(prog="python -m glmrt.tools.generate",
                                     description="One completion, printed as it streams.")
    add_engine_options(parser)
    parser.add_argument("prompt", help="prompt text (a user message with --chat)")
    parser.add_argument("--chat", action="store_true", help="apply the chat template to the prompt")
    parser.add_argument("--system", default=None, help="system message for --chat")
    parser.add_argument("--max-tokens", type=positive_int, default=256)
    parser.add_argument("--temperature", type=float, default=None)
    parser.add_argument("--top-p", type=float, default=None)
    parser.add_argument("--top-k", type=non_negative_int, default=None)
    parser.add_argument("--seed", type=non_negative_int, default=None)
    parser.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    return parser
