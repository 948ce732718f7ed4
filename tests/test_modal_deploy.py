import ast
import importlib
import inspect
import os
import re
import socket
import subprocess
import sys
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import modal
import pytest
from modal._image import _Image
from modal._utils.async_utils import synchronizer
from modal.cli.import_refs import import_and_filter, parse_import_ref

from glmrt.serve.options import resolve_serving_limits, server_parser
from glmrt.tools.pipeline import bench, build_check, checkpoint_check, common, download, smoke

REPO_ROOT = Path(__file__).resolve().parent.parent
BUILDER_VERSION = "2026.10"
MODAL_MAX_TIMEOUT_S = 24 * 3600
STEP_FUNCTIONS = ("download", "build_check", "validate", "smoke", "bench")
SETTINGS = ("GLMRT_MODAL_GPU", "GLMRT_MODAL_SERVER_ARGS", "GLMRT_MODAL_REGION", "GLMRT_MODAL_MODEL_REVISION",
            "GLMRT_MODAL_HF_SECRET", "GLMRT_MODAL_PROXY_AUTH_SECRET")
PINNED_REVISION = "7b3b5f81eee81be12a6f8da2710eac4bafb0166a"
REQUIREMENT_LAYER = "RUN python -m pip install -r /.requirements.txt"


@dataclass
class ImageLayer:
    commands: list
    gpu_type: str
    mount: object


def load_modal_deploy(monkeypatch, **settings):
    for name in SETTINGS:
        value = settings.get(name.removeprefix("GLMRT_MODAL_").lower())
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    monkeypatch.delitem(sys.modules, "modal_deploy", raising=False)
    return importlib.import_module("modal_deploy")


@pytest.fixture
def deploy(monkeypatch):
    return load_modal_deploy(monkeypatch)


def server_info(deploy):
    return deploy.GlmrtServer().serve.info()


def image_layers(image):
    layers, seen = [], set()

    def visit(inner):
        if id(inner) in seen:
            return
        seen.add(id(inner))
        scope = inspect.getclosurevars(inner._load).nonlocals
        for value in scope.values():
            for candidate in value.values() if isinstance(value, dict) else [value]:
                if isinstance(candidate, _Image):
                    visit(candidate)
        dockerfile_function = scope.get("dockerfile_function")
        if dockerfile_function is None:
            return
        mount_function = scope.get("context_mount_function")
        gpu_config = scope.get("gpu_config")
        layers.append(ImageLayer(dockerfile_function(BUILDER_VERSION).commands,
                                 gpu_config.gpu_type if gpu_config is not None else "",
                                 mount_function(BUILDER_VERSION) if mount_function else None))

    visit(synchronizer._translate_in(image))
    return layers


def layer_index(layers, command):
    matches = [index for index, layer in enumerate(layers) if command in layer.commands]
    assert len(matches) == 1, f"{command!r} appears in {len(matches)} image layers"
    return matches[0]


def requirement_layers(layers):
    return [index for index, layer in enumerate(layers) if REQUIREMENT_LAYER in layer.commands]


def copy_layers(layers):
    return [index for index, layer in enumerate(layers) if layer.mount is not None and layer.mount.is_local()]


def copied_files(layer):
    files = {}
    for entry in layer.mount._entries:
        for local_path, remote_path in entry.get_files_to_upload():
            files[Path(local_path).relative_to(REPO_ROOT).as_posix()] = str(remote_path)
    return files


def webhook_config(deploy):
    method = synchronizer._translate_in(deploy.GlmrtServer).__dict__["_method_partials"]["serve"]
    return method.params.webhook_config


def requirement_names(path):
    names = []
    for line in (REPO_ROOT / path).read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("-r"):
            names.append(re.split(r"[=<>!~\[]", line, maxsplit=1)[0].strip().lower().replace("_", "-"))
    return names


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_app_defines_every_pipeline_step_and_the_server(deploy):
    assert deploy.app.name == "glmrt"
    for name in STEP_FUNCTIONS:
        assert isinstance(getattr(deploy, name), modal.Function), name
    assert isinstance(deploy.GlmrtServer, modal.Cls)
    assert server_info(deploy).method_names == ["serve"]
    assert deploy.PIPELINE_STEPS == ("download", "build", "validate", "smoke", "bench")


def test_modal_run_without_a_target_runs_the_whole_pipeline_entrypoint(deploy):
    runnable, commands, _ = import_and_filter(parse_import_ref(str(REPO_ROOT / "modal_deploy.py")),
                                              base_cmd="modal run", accept_local_entrypoint=True)
    assert isinstance(runnable, modal.app.LocalEntrypoint)
    assert runnable.info.function_name == "main"
    listed = {names[0] for names in (command.names for command in commands)}
    assert listed == {"main", *STEP_FUNCTIONS}


@pytest.mark.parametrize("step", STEP_FUNCTIONS)
def test_each_step_runs_alone_with_modal_run_double_colon(deploy, step):
    runnable, _, _ = import_and_filter(parse_import_ref(f"{REPO_ROOT / 'modal_deploy.py'}::{step}"),
                                       base_cmd="modal run", accept_local_entrypoint=True)
    assert isinstance(runnable, modal.Function)
    assert runnable._get_source_info().function_name == step


def test_pipeline_entrypoint_accepts_known_steps_in_order_and_rejects_others(deploy):
    assert deploy.parse_steps(" smoke, bench ") == ["smoke", "bench"]
    assert deploy.parse_steps(",".join(deploy.PIPELINE_STEPS)) == list(deploy.PIPELINE_STEPS)
    with pytest.raises(ValueError, match="serve"):
        deploy.parse_steps("download,serve")
    with pytest.raises(ValueError):
        deploy.parse_steps(" , ")


def test_endpoint_requires_modal_proxy_auth(deploy):
    assert server_info(deploy).method_details["serve"].unauthenticated is False
    config = webhook_config(deploy)
    assert config.requires_proxy_auth is True
    assert config.web_server_port == deploy.SERVER_PORT == server_parser().get_default("port") == 8765
    assert config.requested_suffix == "glmrt-serve"


def test_only_the_server_and_the_build_check_hold_gpus(deploy):
    assert server_info(deploy).gpus == [("B200", 8)]
    assert deploy.build_check.info().gpus == [("B200", 1)]
    for function in (deploy.download, deploy.validate, deploy.smoke, deploy.bench):
        assert function.info().gpus == [], function


@pytest.mark.parametrize("value, gpu_type", [("H200:8", "H200"), ("H100:8", "H100"), (" h200:8 ", "H200")])
def test_gpu_override_from_the_environment_reaches_every_gpu_function(monkeypatch, value, gpu_type):
    deploy = load_modal_deploy(monkeypatch, gpu=value)
    assert server_info(deploy).gpus == [(gpu_type, 8)]
    assert deploy.build_check.info().gpus == [(gpu_type, 1)]
    assert deploy.validate.info().gpus == []
    assert deploy.container_env()["GLMRT_MODAL_GPU"] == f"{gpu_type}:8"


@pytest.mark.parametrize("value", ["A100:8", "B200:4", "H100", "L40S:8"])
def test_unsupported_gpu_is_rejected_when_the_module_is_imported(monkeypatch, value):
    with pytest.raises(ValueError, match="B200:8, H200:8, H100:8"):
        load_modal_deploy(monkeypatch, gpu=value)


def test_server_and_its_clients_run_in_one_pinned_region(deploy):
    assert deploy.REGIONS == ["us-east"]
    for info in (server_info(deploy), deploy.smoke.info(), deploy.bench.info()):
        assert info.regions == ["us-east"]


def test_region_is_settable_from_the_environment(monkeypatch):
    deploy = load_modal_deploy(monkeypatch, region="us-west, us-central")
    for info in (server_info(deploy), deploy.smoke.info(), deploy.bench.info()):
        assert info.regions == ["us-west", "us-central"]
    assert deploy.container_env()["GLMRT_MODAL_REGION"] == "us-west,us-central"


@pytest.mark.parametrize("value", ["", " , ", "us east", "us-east;eu"])
def test_malformed_region_is_rejected_when_the_module_is_imported(monkeypatch, value):
    with pytest.raises(ValueError, match="GLMRT_MODAL_REGION"):
        load_modal_deploy(monkeypatch, region=value)


def test_model_revision_is_pinned_and_names_the_weights_directory(deploy):
    assert deploy.MODEL_REVISION == PINNED_REVISION
    assert deploy.MODEL_DIR == f"/weights/GLM-4.7-FP8/{PINNED_REVISION}"
    assert deploy.container_env()["GLMRT_MODAL_MODEL_REVISION"] == PINNED_REVISION


def test_model_revision_is_settable_and_must_be_a_commit(monkeypatch):
    other = "0123456789abcdef0123456789abcdef01234567"
    deploy = load_modal_deploy(monkeypatch, model_revision=other.upper())
    assert deploy.MODEL_REVISION == other
    assert deploy.MODEL_DIR.endswith(f"/{other}")
    for value in ("main", "7b3b5f81", "v1.0"):
        with pytest.raises(ValueError, match="40-hex commit"):
            load_modal_deploy(monkeypatch, model_revision=value)


@pytest.mark.filterwarnings("ignore:The download function is executing locally")
def test_download_step_fetches_the_pinned_revision(deploy, monkeypatch):
    calls = []

    def ensure(repo_id, local_dir, revision=None, force=False):
        calls.append((repo_id, local_dir, revision, force))
        return checkpoint_check.ShardReport(local_dir, 1, 2, 3)

    monkeypatch.setattr(download, "ensure_checkpoint", ensure)
    monkeypatch.setattr(deploy.weights_volume, "commit", lambda: None)
    assert deploy.download.local(force=True)["num_shards"] == 1
    assert calls == [("zai-org/GLM-4.7-FP8", deploy.MODEL_DIR, PINNED_REVISION, True)]


def test_hugging_face_token_comes_from_a_named_modal_secret(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_from_the_local_shell")
    deploy = load_modal_deploy(monkeypatch)
    secrets = deploy.download.info().secrets
    assert "modal.Secret.from_name('huggingface-secret')" in secrets
    assert not any("HF_TOKEN" in secret for secret in secrets)
    for function in (deploy.build_check, deploy.validate, deploy.smoke, deploy.bench):
        assert not any("huggingface" in secret for secret in function.info().secrets), function


def test_hugging_face_secret_name_is_settable_and_may_be_left_out(monkeypatch):
    deploy = load_modal_deploy(monkeypatch, hf_secret="team-hf")
    assert "modal.Secret.from_name('team-hf')" in deploy.download.info().secrets
    deploy = load_modal_deploy(monkeypatch, hf_secret="")
    assert not any("from_name" in secret for secret in deploy.download.info().secrets)


def test_smoke_and_bench_carry_the_proxy_auth_token_from_a_named_secret(deploy):
    for function in (deploy.smoke, deploy.bench):
        assert "modal.Secret.from_name('glmrt-proxy-auth')" in function.info().secrets
    assert not any("glmrt-proxy-auth" in secret for secret in server_info(deploy).secrets)
    assert deploy.PROXY_AUTH_KEYS == (common.PROXY_KEY_ENV, common.PROXY_SECRET_ENV)


def test_proxy_auth_secret_name_is_settable_but_not_empty(monkeypatch):
    deploy = load_modal_deploy(monkeypatch, proxy_auth_secret="team-proxy")
    assert "modal.Secret.from_name('team-proxy')" in deploy.smoke.info().secrets
    with pytest.raises(ValueError, match="GLMRT_MODAL_PROXY_AUTH_SECRET"):
        load_modal_deploy(monkeypatch, proxy_auth_secret=" ")


def test_weights_volume_is_writable_for_download_and_read_only_elsewhere(deploy):
    download_volumes = deploy.download.info().volumes
    assert list(download_volumes) == ["/weights"]
    assert download_volumes["/weights"].name == "glmrt-weights"
    assert download_volumes["/weights"].read_only is False
    for info in (server_info(deploy), deploy.validate.info(), deploy.bench.info()):
        assert list(info.volumes) == ["/weights"]
        assert info.volumes["/weights"].name == "glmrt-weights"
        assert info.volumes["/weights"].read_only is True
    assert deploy.MODEL_REPO_ID == download.MODEL_REPO_ID == "zai-org/GLM-4.7-FP8"


def test_server_command_is_accepted_by_the_real_server_parser(deploy):
    command = deploy.server_command("/usr/local/bin/python")
    assert command[:2] == ["/usr/local/bin/python", "server.py"]
    args = server_parser().parse_args(command[2:])
    assert (args.model, args.backend, args.host, args.port) == (deploy.MODEL_DIR, "cuda", "0.0.0.0", 8765)
    assert args.served_model_name == "GLM-4.7-FP8"
    assert args.max_batch == 256
    assert args.all_reduce == "peer-bf16"
    assert args.num_devices == 8
    assert args.api_key is None
    assert resolve_serving_limits(args)[0] >= max(bench.parse_positive_ints(deploy.BENCH_CONCURRENCIES))


@pytest.mark.parametrize("spec, count", [("B200:8", 8), ("H200:8", 8), ("H100:8", 8)])
def test_server_splits_the_model_over_every_gpu_of_the_spec(monkeypatch, spec, count):
    deploy = load_modal_deploy(monkeypatch, gpu=spec)
    args = server_parser().parse_args(deploy.server_command("python")[2:])
    assert deploy.GPU_COUNT == count
    assert (args.backend, args.num_devices, args.device_id) == ("cuda", count, 0)


def test_server_args_from_the_environment_are_appended_and_win(monkeypatch):
    deploy = load_modal_deploy(monkeypatch, server_args="--max-batch 128 --kv-memory-fraction 0.85")
    command = deploy.server_command("python")
    assert command[-4:] == ["--max-batch", "128", "--kv-memory-fraction", "0.85"]
    args = server_parser().parse_args(command[2:])
    assert (args.max_batch, args.kv_memory_fraction) == (128, 0.85)
    assert deploy.container_env()["GLMRT_MODAL_SERVER_ARGS"] == "--max-batch 128 --kv-memory-fraction 0.85"


def test_container_environment_carries_every_setting_so_containers_rebuild_the_same_app(deploy):
    assert sorted(deploy.container_env()) == sorted(SETTINGS)


def test_startup_timeout_governs_the_load_and_sockets_may_live_a_day(deploy):
    info = server_info(deploy)
    assert info.startup_timeout == deploy.SERVER_STARTUP_TIMEOUT_S >= 3600
    assert info.timeout == MODAL_MAX_TIMEOUT_S
    assert webhook_config(deploy).web_server_startup_timeout < deploy.SERVER_STARTUP_TIMEOUT_S
    assert deploy.download.info().timeout >= 6 * 3600
    assert deploy.smoke.info().timeout > deploy.SERVER_STARTUP_TIMEOUT_S
    assert deploy.bench.info().timeout > deploy.SERVER_STARTUP_TIMEOUT_S + deploy.BENCH_DURATION_S * 2
    for function in (*(getattr(deploy, name) for name in STEP_FUNCTIONS), deploy.GlmrtServer().serve):
        assert 300 < function.info().timeout <= MODAL_MAX_TIMEOUT_S, function


def test_server_accepts_many_sockets_on_one_container(deploy):
    concurrency = server_info(deploy).concurrency_info
    assert concurrency.max_inputs >= 1000
    assert concurrency.max_inputs >= max(bench.parse_positive_ints(deploy.BENCH_CONCURRENCIES))


@pytest.mark.filterwarnings("ignore:The GlmrtServer.serve function is executing locally")
def test_server_container_is_ready_only_once_the_model_is_loaded(deploy, monkeypatch, test_model_dir):
    port = free_port()
    command = [sys.executable, "server.py", "--model", str(test_model_dir()), "--port", str(port), "--threads", "2"]
    monkeypatch.setattr(deploy, "server_command", lambda python: command)
    monkeypatch.setattr(deploy, "SERVER_PORT", port)
    monkeypatch.setattr(deploy, "REMOTE_REPO_DIR", str(REPO_ROOT))
    server = deploy.GlmrtServer()
    server.serve.local()
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=10) as response:
            assert response.status == 200
        assert server.server.process.poll() is None
    finally:
        assert server.server.stop() == 0


@pytest.mark.filterwarnings("ignore:The GlmrtServer.serve function is executing locally")
def test_server_that_exits_while_loading_fails_the_container_start(deploy, monkeypatch, tmp_path):
    command = [sys.executable, "server.py", "--model", str(tmp_path / "absent"), "--port", str(free_port())]
    monkeypatch.setattr(deploy, "server_command", lambda python: command)
    monkeypatch.setattr(deploy, "REMOTE_REPO_DIR", str(REPO_ROOT))
    with pytest.raises(common.PipelineError, match="the server process exited with"):
        deploy.GlmrtServer().serve.local()


def test_image_is_cuda_devel_with_python_311(deploy):
    layers = image_layers(deploy.image)
    base = re.fullmatch(r"nvidia/cuda:(\d+)\.(\d+)\.\d+-devel-ubuntu\d+\.\d+", deploy.CUDA_BASE_IMAGE)
    assert base is not None
    assert (int(base.group(1)), int(base.group(2))) >= (12, 8)
    assert any(f"FROM {deploy.CUDA_BASE_IMAGE}" in layer.commands for layer in layers)
    assert deploy.PYTHON_VERSION == "3.11"
    assert all(re.fullmatch(r"[a-z_]+==[0-9.]+", package) for package in deploy.DOWNLOAD_PACKAGES)


def test_native_build_runs_on_a_cpu_builder_from_only_the_sources_it_compiles(deploy):
    layers = image_layers(deploy.image)
    build = layer_index(layers, f"RUN {deploy.BUILD_COMMAND}")
    assert re.search(r'bash build\.sh release --cuda --cuda-arch "100a 90a" .*--no-deps', deploy.BUILD_COMMAND)
    assert all(layer.gpu_type == "" for layer in layers)
    copies = copy_layers(layers)
    assert len(copies) == 2
    native, python = copies
    assert native < layer_index(layers, f"WORKDIR {deploy.REMOTE_REPO_DIR}") < build < python
    files = copied_files(layers[native])
    assert {"build.sh", "build_cuda.sh", "csrc/include/glmrt.h", "csrc/cuda/backend.cu"} <= set(files)
    assert all(name in ("build.sh", "build_cuda.sh") or name.startswith("csrc/") for name in files), files
    assert files["csrc/include/glmrt.h"] == f"{deploy.REMOTE_REPO_DIR}/csrc/include/glmrt.h"


def test_python_sources_are_copied_after_the_native_build(deploy):
    layers = image_layers(deploy.image)
    files = copied_files(layers[copy_layers(layers)[1]])
    for name in ("server.py", "glmrt/__init__.py", "glmrt/tools/pipeline/__main__.py", "glmrt/tools/loadgen.py"):
        assert files[name] == f"{deploy.REMOTE_REPO_DIR}/{name}"
    assert all(name == "server.py" or (name.startswith("glmrt/") and name.endswith(".py")) for name in files), files
    assert not any("__pycache__" in name for name in files)


def test_serving_image_installs_one_nccl_and_no_torch(deploy):
    layers = image_layers(deploy.image)
    requirements = requirement_layers(layers)
    assert len(requirements) == 2
    nccl, serving = requirements
    build = layer_index(layers, f"RUN {deploy.BUILD_COMMAND}")
    downloads = layer_index(layers, "RUN python -m pip install " + " ".join(sorted(deploy.DOWNLOAD_PACKAGES)))
    assert nccl < build < serving < downloads
    major = re.fullmatch(r"nvidia/cuda:(\d+)\..*", deploy.CUDA_BASE_IMAGE).group(1)
    assert (REPO_ROOT / deploy.CUDA_REQUIREMENTS).read_text().split() == [f"nvidia-nccl-cu{major}==2.32.3"]
    assert deploy.SERVING_REQUIREMENTS == "requirements.txt"
    serving_names = requirement_names(deploy.SERVING_REQUIREMENTS)
    assert "torch" not in serving_names
    assert not any(name.startswith("nvidia-") for name in serving_names)
    assert "-r " not in (REPO_ROOT / deploy.SERVING_REQUIREMENTS).read_text()


def test_requirements_split_serving_from_tests():
    serving = set(requirement_names("requirements.txt"))
    assert {"numpy", "transformers", "tokenizers", "safetensors", "ml-dtypes", "jinja2", "websockets", "fastapi",
            "uvicorn", "httptools", "prometheus-client", "uvloop", "httpx"} == serving
    test_file = (REPO_ROOT / "requirements-test.txt").read_text().split("\n")
    assert "-r requirements.txt" in test_file and "-r requirements-modal.txt" in test_file
    assert {"torch", "pytest", "pytest-asyncio", "openai"} <= set(requirement_names("requirements-test.txt"))
    assert "torch==2.13.0" in test_file


def test_readme_and_ci_install_serving_and_test_dependencies_with_one_command_each():
    readme = (REPO_ROOT / "README.md").read_text()
    assert "bash build.sh && python3 server.py" in readme
    test_command = 'bash build.sh --test-deps && python3 -m pytest -q -m "not gpu" tests'
    assert test_command in readme
    ci = (REPO_ROOT / ".ci" / "run").read_text()
    assert "bash build.sh --test-deps\n" in ci and 'python3 -m pytest -q -m "not gpu" tests' in ci
    build = (REPO_ROOT / "build.sh").read_text()
    assert '--test-deps) requirements="requirements-test.txt"' in build
    assert 'requirements="requirements.txt"' in build


def test_server_turns_websocket_compression_off():
    tree = ast.parse((REPO_ROOT / "server.py").read_text())
    calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call)
             and getattr(node.func, "attr", None) == "Config" and getattr(node.func.value, "id", None) == "uvicorn"]
    assert len(calls) == 1, "server.py should configure exactly one uvicorn server"
    keyword = next((keyword.value for keyword in calls[0].keywords if keyword.arg == "ws_per_message_deflate"), None)
    assert isinstance(keyword, ast.Constant) and keyword.value is False


def record_calls(monkeypatch, module, name, result):
    calls = []

    def record(*args, **kwargs):
        calls.append((args, kwargs))
        return result

    monkeypatch.setattr(module, name, record)
    return calls


def test_smoke_step_runs_the_shared_pipeline_smoke_code(deploy, monkeypatch):
    calls = record_calls(monkeypatch, smoke, "run_smoke", ["Paris."])
    assert deploy.smoke.local(url="wss://team--glmrt-serve.modal.run", max_tokens=32) == ["Paris."]
    assert calls == [(("wss://team--glmrt-serve.modal.run", deploy.SERVER_STARTUP_TIMEOUT_S, 32), {})]


@pytest.mark.filterwarnings("ignore:The bench function is executing locally")
def test_bench_step_runs_the_shared_pipeline_benchmark_code(deploy, monkeypatch):
    calls = record_calls(monkeypatch, bench, "run_benchmarks", [{"concurrency": 64}])
    result = deploy.bench.local(url="wss://team--glmrt-serve.modal.run", concurrency="64,256", duration=120)
    assert result == [{"concurrency": 64}]
    assert calls == [(("wss://team--glmrt-serve.modal.run", (64, 256), 120, 1024, 1024, deploy.REMOTE_BENCH_DIR,
                       deploy.SERVER_STARTUP_TIMEOUT_S, deploy.MODEL_DIR), {})]


@pytest.mark.filterwarnings("ignore:The validate function is executing locally")
def test_validate_and_build_steps_run_the_shared_pipeline_code(deploy, monkeypatch):
    validate_calls = record_calls(monkeypatch, checkpoint_check, "validate_checkpoint",
                                  checkpoint_check.ShardReport("/w", 1, 2, 3))
    build_calls = record_calls(monkeypatch, build_check, "check_build", build_check.BuildReport(1))
    assert deploy.validate.local() == {"model_dir": "/w", "num_shards": 1, "num_tensors": 2, "total_bytes": 3}
    assert validate_calls == [((deploy.MODEL_DIR,), {"num_devices": 8})]
    assert deploy.build_check.local() == {"abi_version": 1, "libraries": {}, "cuda_archs": [], "gpus": []}
    assert build_calls == [((Path("/opt/glmrt"),), {"require_cuda": True, "cuda_archs": ("100a", "90a")})]


def test_modal_version_is_pinned_and_installed():
    pins = (REPO_ROOT / "requirements-modal.txt").read_text().split()
    assert pins == [f"modal=={modal.__version__}"]


@pytest.mark.parametrize("target, options", [
    ("modal_deploy.py", ("--steps", "--url", "--concurrency", "--duration", "--prompt-len", "--gen-len",
                         "--max-tokens", "--out-dir", "--force-download")),
    ("modal_deploy.py::bench", ("--url", "--concurrency", "--duration", "--prompt-len", "--gen-len")),
    ("modal_deploy.py::smoke", ("--url", "--max-tokens")),
    ("modal_deploy.py::download", ("--force",)),
])
def test_modal_cli_offers_the_documented_options(target, options):
    result = subprocess.run([sys.executable, "-m", "modal", "run", target, "--help"], cwd=REPO_ROOT,
                            capture_output=True, text=True, timeout=120,
                            env={key: value for key, value in os.environ.items() if not key.startswith("MODAL_")})
    assert result.returncode == 0, result.stderr
    for option in options:
        assert re.search(rf"^\s+{re.escape(option)}\b", result.stdout, re.MULTILINE), option
