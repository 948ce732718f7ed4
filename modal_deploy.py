import json
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
from pathlib import Path

import modal

APP_NAME = "glmrt"
REPO_ROOT = Path(__file__).resolve().parent
REMOTE_REPO_DIR = "/opt/glmrt"
NATIVE_SOURCES = ("csrc/**", "build.sh", "build_cuda.sh")
PYTHON_SOURCES = ("server.py", "glmrt/**/*.py")

CUDA_BASE_IMAGE = "nvidia/cuda:12.8.1-devel-ubuntu22.04"
PYTHON_VERSION = "3.11"
CUDA_ARCHS = "100a 90a"
CUDA_REQUIREMENTS = "requirements-cuda12.txt"
SERVING_REQUIREMENTS = "requirements.txt"
BUILD_COMMAND = f'PATH="/usr/local/cuda/bin:$PATH" bash build.sh release --cuda --cuda-arch "{CUDA_ARCHS}" --march x86-64-v3 --no-deps'
DOWNLOAD_PACKAGES = ("huggingface_hub==2.4.0", "hf_xet==1.8.0")

WEIGHTS_VOLUME_NAME = "glmrt-weights"
WEIGHTS_MOUNT = "/weights"
MODEL_REPO_ID = "zai-org/GLM-4.7-FP8"
SERVED_MODEL_NAME = "GLM-4.7-FP8"

SERVER_PORT = 8765
SERVER_HOST = "0.0.0.0"
SERVER_LABEL = "glmrt-serve"
GPU_ENV_VAR = "GLMRT_MODAL_GPU"
SERVER_ARGS_ENV_VAR = "GLMRT_MODAL_SERVER_ARGS"
REGION_ENV_VAR = "GLMRT_MODAL_REGION"
REVISION_ENV_VAR = "GLMRT_MODAL_MODEL_REVISION"
HF_SECRET_ENV_VAR = "GLMRT_MODAL_HF_SECRET"
PROXY_AUTH_SECRET_ENV_VAR = "GLMRT_MODAL_PROXY_AUTH_SECRET"
SERVER_TUNING_ARGS = ("--max-batch", "256", "--all-reduce", "peer-bf16")
DEFAULT_GPU_SPEC = "B200:8"
SUPPORTED_GPU_SPECS = ("B200:8", "H200:8", "H100:8")
DEFAULT_REGION = "us-east"
DEFAULT_MODEL_REVISION = "7b3b5f81eee81be12a6f8da2710eac4bafb0166a"
DEFAULT_HF_SECRET = "huggingface-secret"
DEFAULT_PROXY_AUTH_SECRET = "glmrt-proxy-auth"
HF_TOKEN_KEY = "HF_TOKEN"
PROXY_AUTH_KEYS = ("GLMRT_PROXY_KEY", "GLMRT_PROXY_SECRET")

MODAL_MAX_TIMEOUT_S = 24 * 3600
SERVER_TIMEOUT_S = MODAL_MAX_TIMEOUT_S
SERVER_STARTUP_TIMEOUT_S = 3600
SERVER_PORT_WAIT_S = 120
SERVER_STOP_GRACE_S = 60
SERVER_SCALEDOWN_WINDOW_S = 1800
SERVER_CPU_CORES = 32.0
MAX_CONCURRENT_SOCKETS = 1000
DOWNLOAD_TIMEOUT_S = 6 * 3600
DOWNLOAD_CPU_CORES = 8.0
CHECK_TIMEOUT_S = 1800
VALIDATE_CPU_CORES = 4.0
CLIENT_TIMEOUT_S = SERVER_STARTUP_TIMEOUT_S + 3 * 3600
CLIENT_CPU_CORES = 8.0

PIPELINE_STEPS = ("download", "build", "validate", "smoke", "bench")
BENCH_CONCURRENCIES = "64,256"
BENCH_DURATION_S = 300
BENCH_PROMPT_LEN = 1024
BENCH_GEN_LEN = 1024
SMOKE_MAX_TOKENS = 256
REMOTE_BENCH_DIR = "/tmp/glmrt-bench"


def resolve_gpu_spec(value):
    spec = (value or DEFAULT_GPU_SPEC).strip().upper()
    if spec not in SUPPORTED_GPU_SPECS:
        raise ValueError(f"{GPU_ENV_VAR}={value!r} is not supported: use one of {', '.join(SUPPORTED_GPU_SPECS)}")
    return spec


def resolve_regions(value):
    text = DEFAULT_REGION if value is None else value
    regions = [part.strip().lower() for part in text.split(",") if part.strip()]
    if not regions or not all(re.fullmatch(r"[a-z]+(-[a-z0-9]+)*", region) for region in regions):
        raise ValueError(f"{REGION_ENV_VAR}={value!r} is not a list of Modal regions: name one or more, separated "
                         f"by commas, such as us-east, us-west, us or eu")
    return regions


def resolve_revision(value):
    revision = (value or DEFAULT_MODEL_REVISION).strip().lower()
    if not re.fullmatch(r"[0-9a-f]{40}", revision):
        raise ValueError(f"{REVISION_ENV_VAR}={value!r} is not a commit: pin {MODEL_REPO_ID} by its 40-hex commit id")
    return revision


def resolve_secret_name(variable, default, allow_empty):
    value = os.environ.get(variable)
    name = default if value is None else value.strip()
    if not name and not allow_empty:
        raise ValueError(f"{variable} is empty: name the Modal secret to use")
    return name


GPU_SPEC = resolve_gpu_spec(os.environ.get(GPU_ENV_VAR))
GPU_TYPE = GPU_SPEC.split(":")[0]
GPU_COUNT = int(GPU_SPEC.split(":")[1])
SERVER_EXTRA_ARGS = tuple(shlex.split(os.environ.get(SERVER_ARGS_ENV_VAR, "")))
REGIONS = resolve_regions(os.environ.get(REGION_ENV_VAR))
MODEL_REVISION = resolve_revision(os.environ.get(REVISION_ENV_VAR))
MODEL_DIR = f"{WEIGHTS_MOUNT}/{SERVED_MODEL_NAME}/{MODEL_REVISION}"
HF_SECRET_NAME = resolve_secret_name(HF_SECRET_ENV_VAR, DEFAULT_HF_SECRET, allow_empty=True)
PROXY_AUTH_SECRET_NAME = resolve_secret_name(PROXY_AUTH_SECRET_ENV_VAR, DEFAULT_PROXY_AUTH_SECRET, allow_empty=False)


def server_command(python_executable):
    return [python_executable, "server.py", "--model", MODEL_DIR, "--served-model-name", SERVED_MODEL_NAME,
            "--backend", "cuda", "--num-devices", str(GPU_COUNT), "--host", SERVER_HOST, "--port", str(SERVER_PORT),
            *SERVER_TUNING_ARGS, *SERVER_EXTRA_ARGS]


def container_env():
    return {GPU_ENV_VAR: GPU_SPEC, SERVER_ARGS_ENV_VAR: shlex.join(SERVER_EXTRA_ARGS),
            REGION_ENV_VAR: ",".join(REGIONS), REVISION_ENV_VAR: MODEL_REVISION,
            HF_SECRET_ENV_VAR: HF_SECRET_NAME, PROXY_AUTH_SECRET_ENV_VAR: PROXY_AUTH_SECRET_NAME}


def hugging_face_secrets():
    return [modal.Secret.from_name(HF_SECRET_NAME, required_keys=[HF_TOKEN_KEY])] if HF_SECRET_NAME else []


def proxy_auth_secrets():
    return [modal.Secret.from_name(PROXY_AUTH_SECRET_NAME, required_keys=list(PROXY_AUTH_KEYS))]


image = (
    modal.Image.from_registry(CUDA_BASE_IMAGE, add_python=PYTHON_VERSION)
    .apt_install("build-essential")
    .pip_install_from_requirements(str(REPO_ROOT / CUDA_REQUIREMENTS))
    .add_local_dir(REPO_ROOT, REMOTE_REPO_DIR, copy=True, ignore=~modal.FilePatternMatcher(*NATIVE_SOURCES))
    .workdir(REMOTE_REPO_DIR)
    .run_commands(BUILD_COMMAND)
    .pip_install_from_requirements(str(REPO_ROOT / SERVING_REQUIREMENTS))
    .pip_install(*DOWNLOAD_PACKAGES)
    .env({"PYTHONPATH": REMOTE_REPO_DIR, "HF_XET_HIGH_PERFORMANCE": "1"})
    .add_local_dir(REPO_ROOT, REMOTE_REPO_DIR, copy=True, ignore=~modal.FilePatternMatcher(*PYTHON_SOURCES))
)

app = modal.App(APP_NAME, image=image)
weights_volume = modal.Volume.from_name(WEIGHTS_VOLUME_NAME, create_if_missing=True)
read_only_weights = weights_volume.with_mount_options(read_only=True)


@app.function(volumes={WEIGHTS_MOUNT: weights_volume}, timeout=DOWNLOAD_TIMEOUT_S, cpu=DOWNLOAD_CPU_CORES,
              secrets=hugging_face_secrets(), env=container_env())
def download(force: bool = False) -> dict:
    from glmrt.tools.pipeline import common
    from glmrt.tools.pipeline import download as download_step

    try:
        report = download_step.ensure_checkpoint(MODEL_REPO_ID, MODEL_DIR, revision=MODEL_REVISION, force=force)
    finally:
        weights_volume.commit()
    return common.as_dict(report)


@app.function(gpu=GPU_TYPE, timeout=CHECK_TIMEOUT_S, env=container_env())
def build_check() -> dict:
    from glmrt.tools.pipeline import build_check as build_check_step
    from glmrt.tools.pipeline import common

    return common.as_dict(build_check_step.check_build(Path(REMOTE_REPO_DIR), require_cuda=True,
                                                       cuda_archs=tuple(CUDA_ARCHS.split())))


@app.function(volumes={WEIGHTS_MOUNT: read_only_weights}, timeout=CHECK_TIMEOUT_S, cpu=VALIDATE_CPU_CORES,
              env=container_env())
def validate() -> dict:
    from glmrt.tools.pipeline import checkpoint_check, common

    return common.as_dict(checkpoint_check.validate_checkpoint(MODEL_DIR, num_devices=GPU_COUNT))


def exit_code(returncode):
    return returncode if returncode >= 0 else 128 - returncode


class ServerProcess:
    def __init__(self, command, cwd):
        self.stopping = False
        self.process = subprocess.Popen(command, cwd=cwd)

    def wait_until_loaded(self, url, timeout_s):
        from glmrt.tools.pipeline import smoke as smoke_step

        return smoke_step.wait_healthy(url, timeout_s, headers={}, process=self.process)

    def exit_with_server(self):
        returncode = self.process.wait()
        if self.stopping:
            return
        print(json.dumps({"event": "server_exited", "returncode": returncode}), flush=True)
        os._exit(exit_code(returncode))

    def watch(self):
        threading.Thread(target=self.exit_with_server, name="server-watch", daemon=True).start()

    def stop(self, grace_s=SERVER_STOP_GRACE_S):
        self.stopping = True
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode


@app.cls(gpu=GPU_SPEC, volumes={WEIGHTS_MOUNT: read_only_weights}, timeout=SERVER_TIMEOUT_S,
         startup_timeout=SERVER_STARTUP_TIMEOUT_S, scaledown_window=SERVER_SCALEDOWN_WINDOW_S, max_containers=1,
         cpu=SERVER_CPU_CORES, region=REGIONS, env=container_env())
@modal.concurrent(max_inputs=MAX_CONCURRENT_SOCKETS)
class GlmrtServer:
    @modal.enter()
    def load(self):
        self.server = ServerProcess(server_command(sys.executable), REMOTE_REPO_DIR)
        try:
            self.server.wait_until_loaded(f"http://127.0.0.1:{SERVER_PORT}", SERVER_STARTUP_TIMEOUT_S)
        except BaseException:
            self.server.stop()
            raise
        self.server.watch()

    @modal.web_server(port=SERVER_PORT, startup_timeout=SERVER_PORT_WAIT_S, label=SERVER_LABEL,
                      requires_proxy_auth=True)
    def serve(self):
        return None

    @modal.exit()
    def stop(self):
        self.server.stop()


def resolve_server_url(url):
    if url:
        return url
    web_url = GlmrtServer().serve.hydrate().get_web_url()
    if not web_url:
        raise RuntimeError("the serve endpoint has no URL yet: pass --url wss://<your endpoint>")
    return web_url


@app.function(timeout=CLIENT_TIMEOUT_S, cpu=CLIENT_CPU_CORES, region=REGIONS, secrets=proxy_auth_secrets(),
              env=container_env())
def smoke(url: str = "", max_tokens: int = SMOKE_MAX_TOKENS) -> list:
    from glmrt.tools.pipeline import smoke as smoke_step

    return smoke_step.run_smoke(resolve_server_url(url), SERVER_STARTUP_TIMEOUT_S, max_tokens)


@app.function(volumes={WEIGHTS_MOUNT: read_only_weights}, timeout=CLIENT_TIMEOUT_S, cpu=CLIENT_CPU_CORES,
              region=REGIONS, secrets=proxy_auth_secrets(), env=container_env())
def bench(url: str = "", concurrency: str = BENCH_CONCURRENCIES, duration: int = BENCH_DURATION_S,
          prompt_len: int = BENCH_PROMPT_LEN, gen_len: int = BENCH_GEN_LEN) -> list:
    from glmrt.tools.pipeline import bench as bench_step

    return bench_step.run_benchmarks(resolve_server_url(url), bench_step.parse_positive_ints(concurrency), duration,
                                     prompt_len, gen_len, REMOTE_BENCH_DIR, SERVER_STARTUP_TIMEOUT_S, MODEL_DIR)


def parse_steps(text):
    steps = [step.strip() for step in text.split(",") if step.strip()]
    unknown = [step for step in steps if step not in PIPELINE_STEPS]
    if unknown or not steps:
        raise ValueError(f"unknown steps {unknown or text!r}: choose from {', '.join(PIPELINE_STEPS)}")
    return steps


def print_step_result(step, result):
    print(f"== {step}: done", flush=True)
    print(json.dumps(result, indent=2), flush=True)


def save_results(out_dir, step, result):
    if not out_dir:
        return
    path = Path(out_dir) / f"modal-{step}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {path}", flush=True)


@app.local_entrypoint()
def main(steps: str = ",".join(PIPELINE_STEPS), url: str = "", concurrency: str = BENCH_CONCURRENCIES,
         duration: int = BENCH_DURATION_S, prompt_len: int = BENCH_PROMPT_LEN, gen_len: int = BENCH_GEN_LEN,
         max_tokens: int = SMOKE_MAX_TOKENS, out_dir: str = "", force_download: bool = False):
    selected = parse_steps(steps)
    print(f"glmrt on Modal: {GPU_SPEC} in {', '.join(REGIONS)}, {MODEL_REPO_ID}@{MODEL_REVISION}, "
          f"steps {', '.join(selected)}", flush=True)
    runners = {
        "download": lambda: download.remote(force=force_download),
        "build": build_check.remote,
        "validate": validate.remote,
        "smoke": lambda: smoke.remote(url=resolve_server_url(url), max_tokens=max_tokens),
        "bench": lambda: bench.remote(url=resolve_server_url(url), concurrency=concurrency, duration=duration,
                                      prompt_len=prompt_len, gen_len=gen_len),
    }
    for step in selected:
        print(f"== {step}", flush=True)
        result = runners[step]()
        print_step_result(step, result)
        save_results(out_dir, step, result)
