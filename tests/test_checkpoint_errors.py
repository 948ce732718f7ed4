import ctypes
import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.asan_drivers import assert_clean_run, run_asan_driver

REPO_ROOT = Path(__file__).resolve().parent.parent
STATUS_OK = 0
STATUS_INVALID_ARGUMENT = 1
STATUS_IO = 2
STATUS_FORMAT = 3
MESSAGE_CAPACITY = 1024
BUILD_TIMEOUT_S = 900


def library_path():
    override = os.environ.get("GLMRT_LIB")
    return Path(override) if override else REPO_ROOT / "build" / "libglmrt.so"


@pytest.fixture(scope="module")
def validate_function():
    path = library_path()
    if not path.exists():
        subprocess.run(["bash", "build.sh", "--no-deps"], cwd=REPO_ROOT, check=True, timeout=BUILD_TIMEOUT_S)
    library = ctypes.CDLL(str(path))
    function = library.glmrt_safetensors_validate
    function.restype = ctypes.c_int32
    function.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int32, ctypes.POINTER(ctypes.c_int32)]
    return function


def validate(function, path, capacity=MESSAGE_CAPACITY):
    message = ctypes.create_string_buffer(max(capacity, 1))
    count = ctypes.c_int32(-1)
    status = function(str(path).encode(), message, capacity, ctypes.byref(count))
    return status, message.value.decode("utf-8", "replace"), count.value


def raw_file(path, header, data=b"", length=None):
    header_bytes = header if isinstance(header, bytes) else json.dumps(header).encode()
    prefix = len(header_bytes) if length is None else length
    path.write_bytes(prefix.to_bytes(8, "little") + header_bytes + data)
    return path


def entry(dtype, shape, begin, end):
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


def test_validator_accepts_a_well_formed_file(validate_function, tmp_path):
    header = {"__metadata__": {"format": "pt"}, "w": entry("BF16", [2, 3], 0, 12), "s": entry("F32", [2, 1], 12, 20)}
    status, message, count = validate(validate_function, raw_file(tmp_path / "ok.safetensors", header, bytes(20)))
    assert (status, message, count) == (STATUS_OK, "", 2)


def test_validator_rejects_file_shorter_than_length_prefix(validate_function, tmp_path):
    path = tmp_path / "short.safetensors"
    path.write_bytes(b"\x10\x00\x00")
    status, message, count = validate(validate_function, path)
    assert status == STATUS_FORMAT
    assert "shorter than the 8-byte header length prefix" in message
    assert str(path) in message
    assert count == 0


def test_validator_rejects_truncated_header(validate_function, tmp_path):
    header = json.dumps({"w": entry("U8", [4], 0, 4)}).encode()
    path = tmp_path / "truncated.safetensors"
    path.write_bytes(len(header).to_bytes(8, "little") + header[: len(header) // 2])
    status, message, _ = validate(validate_function, path)
    assert status == STATUS_FORMAT
    assert f"header length {len(header)} runs past the end of the file" in message


def test_validator_rejects_header_length_past_end(validate_function, tmp_path):
    path = raw_file(tmp_path / "past.safetensors", {}, length=1000)
    status, message, _ = validate(validate_function, path)
    assert status == STATUS_FORMAT
    assert "header length 1000 runs past the end of the file" in message


def test_validator_rejects_header_length_above_limit(validate_function, tmp_path):
    path = raw_file(tmp_path / "huge.safetensors", {}, length=100_000_001)
    status, message, _ = validate(validate_function, path)
    assert status == STATUS_FORMAT
    assert "exceeds the limit" in message


def test_validator_rejects_data_cut_short(validate_function, tmp_path):
    path = raw_file(tmp_path / "cut.safetensors", {"w": entry("F32", [4], 0, 16)}, bytes(10))
    status, message, _ = validate(validate_function, path)
    assert status == STATUS_FORMAT
    assert 'tensor "w"' in message and "past the end of the data section" in message


def test_validator_rejects_invalid_json(validate_function, tmp_path):
    path = raw_file(tmp_path / "json.safetensors", b'{"w": {"dtype": "U8",}}')
    status, message, _ = validate(validate_function, path)
    assert status == STATUS_FORMAT
    assert "not valid JSON" in message and "trailing comma" in message


def test_validator_rejects_unknown_dtype(validate_function, tmp_path):
    path = raw_file(tmp_path / "dtype.safetensors", {"layer.w": entry("Q4", [2], 0, 2)}, bytes(2))
    status, message, _ = validate(validate_function, path)
    assert status == STATUS_FORMAT
    assert 'tensor "layer.w": unknown dtype "Q4"' in message


def test_validator_rejects_size_offset_mismatch(validate_function, tmp_path):
    path = raw_file(tmp_path / "size.safetensors", {"proj": entry("F32", [3], 0, 8)}, bytes(16))
    status, message, _ = validate(validate_function, path)
    assert status == STATUS_FORMAT
    assert 'tensor "proj"' in message and "need 12 bytes" in message and "[0, 8]" in message


def test_validator_rejects_overlapping_ranges(validate_function, tmp_path):
    header = {"first": entry("U8", [8], 0, 8), "second": entry("U8", [8], 4, 12)}
    status, message, _ = validate(validate_function, raw_file(tmp_path / "overlap.safetensors", header, bytes(12)))
    assert status == STATUS_FORMAT
    assert "overlapping data ranges" in message
    assert '"first"' in message and '"second"' in message


def test_validator_rejects_duplicate_tensor_name(validate_function, tmp_path):
    header = (b'{"twice":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},'
              b'"twice":{"dtype":"U8","shape":[2],"data_offsets":[2,4]}}')
    status, message, _ = validate(validate_function, raw_file(tmp_path / "dup.safetensors", header, bytes(4)))
    assert status == STATUS_FORMAT
    assert 'duplicate key "twice"' in message


def test_validator_rejects_header_that_is_not_an_object(validate_function, tmp_path):
    status, message, _ = validate(validate_function, raw_file(tmp_path / "array.safetensors", b"[1, 2]"))
    assert status == STATUS_FORMAT
    assert "must be a JSON object, found array" in message


def test_validator_reports_missing_file_as_io_error(validate_function, tmp_path):
    path = tmp_path / "absent.safetensors"
    status, message, _ = validate(validate_function, path)
    assert status == STATUS_IO
    assert str(path) in message and "cannot open" in message


def test_validator_truncates_message_to_capacity(validate_function, tmp_path):
    path = raw_file(tmp_path / "dtype.safetensors", {"w": entry("Q4", [2], 0, 2)}, bytes(2))
    status, full, _ = validate(validate_function, path)
    status_short, short, _ = validate(validate_function, path, capacity=10)
    assert status == status_short == STATUS_FORMAT
    assert short == full[:9]


def test_validator_rejects_null_path(validate_function):
    message = ctypes.create_string_buffer(MESSAGE_CAPACITY)
    status = validate_function(None, message, MESSAGE_CAPACITY, None)
    assert status == STATUS_INVALID_ARGUMENT
    assert b"null path" in message.value


def test_fuzz_driver_is_clean_under_address_sanitizer():
    assert_clean_run(run_asan_driver("test_safetensors_fuzz"), minimum_passed=2000)


def small_model(tmp_path, weight_format="bf16", **overrides):
    from glmrt.testmodel.writer import write_test_model

    settings = dict(hidden_size=32, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                    intermediate_size=48, moe_intermediate_size=16, num_hidden_layers=2, n_routed_experts=4,
                    vocab_size=512, max_position_embeddings=256, fp8_block_size=16)
    settings.update(overrides)
    return Path(write_test_model(tmp_path / "model", seed=0, weight_format=weight_format, **settings))


def open_engine(model_dir):
    from glmrt.engine.engine import Engine

    return Engine(model_dir, num_threads=1, max_batch=2, max_tokens_per_step=16, kv_page_size=16, kv_num_pages=8)


def expect_engine_error(model_dir):
    from glmrt.engine.errors import GlmrtError

    with pytest.raises(GlmrtError) as caught:
        engine = open_engine(model_dir)
        engine.close()
    return caught.value


def index_of(model_dir):
    return json.loads((model_dir / "model.safetensors.index.json").read_text())


def write_index(model_dir, index):
    (model_dir / "model.safetensors.index.json").write_text(json.dumps(index))


def rewrite_shard(model_dir, tensor_name, change):
    from safetensors.torch import load_file, save_file

    shard = model_dir / index_of(model_dir)["weight_map"][tensor_name]
    tensors = load_file(str(shard))
    change(tensors)
    save_file(tensors, str(shard), metadata={"format": "pt"})


def test_engine_reports_missing_tensor_by_name(tmp_path):
    model_dir = small_model(tmp_path)
    name = "model.layers.1.mlp.experts.2.down_proj.weight"
    rewrite_shard(model_dir, name, lambda tensors: tensors.pop(name))
    index = index_of(model_dir)
    del index["weight_map"][name]
    write_index(model_dir, index)
    error = expect_engine_error(model_dir)
    assert error.status_name == "MISSING_TENSOR"
    assert name in error.message


def test_engine_reports_wrong_shape_with_expected_and_found(tmp_path):
    model_dir = small_model(tmp_path)
    name = "model.layers.0.self_attn.q_proj.weight"

    def shrink(tensors):
        tensors[name] = tensors[name][:-1].clone()

    rewrite_shard(model_dir, name, shrink)
    error = expect_engine_error(model_dir)
    assert error.status_name == "FORMAT"
    assert f"{name} has shape [31, 32], expected [32, 32]" in error.message


def test_engine_reports_index_pointing_to_missing_file(tmp_path):
    model_dir = small_model(tmp_path)
    index = index_of(model_dir)
    index["weight_map"]["model.norm.weight"] = "model-99999-of-99999.safetensors"
    write_index(model_dir, index)
    error = expect_engine_error(model_dir)
    assert error.status_name == "IO"
    assert "model-99999-of-99999.safetensors" in error.message


def test_engine_reports_index_naming_the_wrong_shard(tmp_path):
    model_dir = small_model(tmp_path)
    index = index_of(model_dir)
    files = sorted(set(index["weight_map"].values()))
    name = "model.embed_tokens.weight"
    index["weight_map"][name] = next(file for file in files if file != index["weight_map"][name])
    write_index(model_dir, index)
    error = expect_engine_error(model_dir)
    assert error.status_name == "MISSING_TENSOR"
    assert name in error.message


def test_engine_reports_fp8_weight_without_scale(tmp_path):
    model_dir = small_model(tmp_path, weight_format="fp8-channel")
    scale = "model.layers.0.self_attn.o_proj.weight_scale"
    rewrite_shard(model_dir, scale, lambda tensors: tensors.pop(scale))
    index = index_of(model_dir)
    del index["weight_map"][scale]
    write_index(model_dir, index)
    error = expect_engine_error(model_dir)
    assert error.status_name == "MISSING_TENSOR"
    assert "model.layers.0.self_attn.o_proj.weight" in error.message


@pytest.mark.parametrize("weight_format", ["bf16", "fp8-channel", "fp8-block"])
@pytest.mark.parametrize("mtp", [True, False])
def test_engine_loads_checkpoints_with_and_without_mtp_layer(tmp_path, weight_format, mtp):
    model_dir = small_model(tmp_path, weight_format=weight_format, mtp=mtp, sharded=mtp)
    engine = open_engine(model_dir)
    try:
        assert engine.info().weight_bytes > 0
    finally:
        engine.close()


def test_validator_bounds_the_number_of_json_values_in_a_header(validate_function, tmp_path):
    header = {"__metadata__": {"padding": [0] * 2_500_000}, "w": entry("F32", [1], 0, 4)}
    status, message, _ = validate(validate_function, raw_file(tmp_path / "wide.safetensors", header, bytes(4)))
    assert status == STATUS_FORMAT
    assert "more than 2000000 values" in message


@pytest.mark.parametrize("weight_format", ["bf16", "fp8-channel"])
def test_engine_loads_a_checkpoint_whose_mtp_layer_carries_embed_and_head_copies(tmp_path, weight_format):
    model_dir = small_model(tmp_path, weight_format=weight_format, mtp=True, mtp_copies=True)
    names = set(index_of(model_dir)["weight_map"])
    assert "model.layers.2.embed_tokens.weight" in names
    assert "model.layers.2.shared_head.head.weight" in names
    engine = open_engine(model_dir)
    try:
        assert engine.info().weight_bytes > 0
    finally:
        engine.close()
