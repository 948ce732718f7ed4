import asyncio
import contextlib
import logging
import signal
import socket
import sys
from pathlib import Path

import uvicorn
import uvloop

from glmrt.engine.engine import Engine, all_reduce_name
from glmrt.serve.app import ServerState, create_app
from glmrt.serve.metrics import ServerMetrics
from glmrt.serve.options import engine_kwargs, resolve_client_limit, resolve_serving_limits, server_parser
from glmrt.serve.runtime import RuntimeSettings, ServingRuntime
from glmrt.testmodel.default_model import ensure_default_model

log = logging.getLogger("glmrt.server")

EXIT_OK = 0
EXIT_ENGINE_FAILED = 1


class EmbeddedUvicorn(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self):
        yield


def gib(num_bytes):
    return f"{num_bytes / (1 << 30):.3f} GiB"


EXIT_USAGE = 2


class StartupError(Exception):
    def __init__(self, message, exit_code):
        super().__init__(message)
        self.exit_code = exit_code


def allowed_origins(text):
    if not text:
        return None
    return frozenset(origin.strip().rstrip("/") for origin in text.split(",") if origin.strip())


def check_model_dir(model_dir):
    path = Path(model_dir)
    if not path.is_dir():
        raise StartupError(f"--model {model_dir}: no such directory", EXIT_USAGE)
    if not (path / "config.json").is_file():
        raise StartupError(f"--model {model_dir}: the directory has no config.json", EXIT_USAGE)


def served_model_name(args, model_dir):
    if args.served_model_name:
        return args.served_model_name
    return Path(model_dir).name if args.model else "glmrt-test-model"


class GlmrtServer:
    def __init__(self, args, model_dir):
        sys.setswitchinterval(args.switch_interval)
        self.args = args
        self.model_dir = model_dir
        name = served_model_name(args, model_dir)
        self.metrics = ServerMetrics(model_name=name)
        max_concurrent, max_queued = resolve_serving_limits(args)
        client_limit = resolve_client_limit(args, max_concurrent)
        settings = RuntimeSettings(max_concurrent=max_concurrent, max_queued=max_queued,
                                   default_max_tokens=args.default_max_tokens, watermark_pages=args.watermark_pages,
                                   served_model_name=name, max_stored_responses=args.max_stored_responses,
                                   max_active_per_client=client_limit, tokenizer_threads=args.tokenizer_threads,
                                   max_tokenizing_per_client=args.max_tokenizing_per_client or client_limit,
                                   relaunch_steps=args.relaunch_steps)
        options = engine_kwargs(args)
        self.runtime = ServingRuntime(lambda: Engine(model_dir, **options), model_dir, self.metrics, settings)
        self.state = ServerState(self.runtime, args.api_key, args.send_timeout, args.max_frame_bytes,
                                 args.max_connections, allowed_origins(args.allowed_origins))
        self.app = create_app(self.state)

    def listening_socket(self):
        family = socket.AF_INET6 if ":" in self.args.host else socket.AF_INET
        listener = socket.socket(family, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if self.args.socket_send_buffer:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self.args.socket_send_buffer)
        try:
            listener.bind((self.args.host, self.args.port))
        except OSError as exc:
            listener.close()
            raise StartupError(f"cannot listen on {self.args.host}:{self.args.port}: {exc.strerror or exc}",
                               EXIT_ENGINE_FAILED) from None
        listener.listen(2048)
        listener.setblocking(False)
        return listener

    def uvicorn_config(self):
        return uvicorn.Config(self.app, host=self.args.host, port=self.args.port, loop="none", http="httptools",
                              lifespan="off",
                              ws="websockets-sansio", ws_max_size=self.args.max_frame_bytes,
                              ws_ping_interval=self.args.ping_interval, ws_ping_timeout=self.args.ping_timeout,
                              ws_per_message_deflate=False, log_config=None, access_log=False,
                              timeout_graceful_shutdown=max(1, int(self.args.shutdown_timeout)),
                              timeout_keep_alive=30)

    async def run(self):
        loop = asyncio.get_running_loop()
        stop_requested = asyncio.Event()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop_requested.set)
        listener = self.listening_socket()
        server = EmbeddedUvicorn(self.uvicorn_config())
        serving = asyncio.ensure_future(server.serve(sockets=[listener]))
        while not server.started:
            if serving.done():
                serving.result()
                return EXIT_ENGINE_FAILED
            await asyncio.sleep(0.01)
        port = server.servers[0].sockets[0].getsockname()[1]
        print(f"glmrt server listening on http://{self.args.host}:{port} (OpenAI API at /v1; WebSocket "
              f"ws://{self.args.host}:{port}/v1/responses)", flush=True)
        exit_code = await self.serve_until_stopped(stop_requested)
        await self.shutdown(server, serving)
        return exit_code

    def print_plan(self):
        info = self.runtime.engine_info
        print(f"glmrt engine loaded: backend {info.device_name or self.args.backend}, max batch {info.max_batch}, "
              f"KV pool {info.kv_num_pages} pages of {info.kv_page_size} tokens, context {info.max_context}, "
              f"model '{self.runtime.settings.served_model_name}'", flush=True)
        print(f"glmrt memory plan over {info.num_devices} device(s): weights {gib(info.weight_bytes)}, "
              f"KV cache {gib(info.kv_cache_bytes)} ({info.kv_bytes_per_page} bytes a page), "
              f"workspace {gib(info.workspace_bytes)}", flush=True)
        if info.num_devices > 1:
            print(f"glmrt all-reduce between the {info.num_devices} GPUs: {all_reduce_name(info.all_reduce)}",
                  flush=True)

    async def serve_until_stopped(self, stop_requested):
        starting = asyncio.ensure_future(self.runtime.start())
        stopping = asyncio.ensure_future(stop_requested.wait())
        try:
            await asyncio.wait({starting, stopping}, return_when=asyncio.FIRST_COMPLETED)
            if not starting.done():
                return EXIT_OK
            if starting.exception() is not None:
                log.error("engine failed to start: %s", starting.exception())
                return EXIT_ENGINE_FAILED
            self.print_plan()
            engine_gone = asyncio.ensure_future(self.runtime.engine_stopped)
            await asyncio.wait({stopping, engine_gone}, return_when=asyncio.FIRST_COMPLETED)
            if not stopping.done():
                log.error("the engine thread stopped unexpectedly")
                return EXIT_ENGINE_FAILED
            return EXIT_OK
        finally:
            starting.cancel()
            stopping.cancel()

    async def wait_for_responses(self):
        async with asyncio.timeout(self.args.shutdown_timeout):
            while self.runtime.num_active > 0:
                await asyncio.sleep(0.02)
            pending = [session.finish_responses() for session in list(self.state.sockets)]
            if pending:
                await asyncio.gather(*pending)

    async def shutdown(self, server, serving):
        self.state.shutting_down = True
        log.info("shutting down: no new responses, ending %d active responses", self.runtime.num_active)
        await self.runtime.stop()
        try:
            await self.wait_for_responses()
        except TimeoutError:
            log.warning("in-flight responses did not end within %.1fs", self.args.shutdown_timeout)
        closing = [session.websocket.close(1001, "server shutting down") for session in list(self.state.sockets)]
        if closing:
            await asyncio.gather(*closing, return_exceptions=True)
        server.should_exit = True
        try:
            async with asyncio.timeout(self.args.shutdown_timeout + 5):
                await serving
        except TimeoutError:
            log.warning("connections did not close within %.1fs", self.args.shutdown_timeout)
        log.info("server stopped")


def configure_logging(level):
    logging.basicConfig(level=level, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for name in ("websockets", "uvicorn", "uvicorn.error"):
        logging.getLogger(name).setLevel(logging.WARNING)
    requests = logging.getLogger("glmrt.requests")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    requests.addHandler(handler)
    requests.propagate = False
    requests.setLevel(logging.INFO)


async def main(argv=None):
    args = server_parser().parse_args(argv)
    configure_logging(args.log_level)
    try:
        if args.model:
            check_model_dir(args.model)
        model_dir = args.model if args.model else await asyncio.to_thread(ensure_default_model)
        return await GlmrtServer(args, model_dir).run()
    except StartupError as error:
        print(f"glmrt: {error}", file=sys.stderr, flush=True)
        return error.exit_code


if __name__ == "__main__":
    sys.exit(uvloop.run(main()))
