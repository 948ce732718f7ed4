import ctypes
import os
import subprocess
from pathlib import Path

import ml_dtypes
import numpy as np
import torch

REPO_ROOT = Path(__file__).resolve().parent.parent
INVALID_ARGUMENT = 1
NEGATIVE_NAN = np.copysign(np.float32(np.nan), np.float32(-1.0))


def load_library():
    path = Path(os.environ.get("GLMRT_LIB", REPO_ROOT / "build" / "libglmrt.so"))
    if not path.exists():
        subprocess.run(["bash", str(REPO_ROOT / "build.sh"), "--no-deps"], cwd=REPO_ROOT, check=True,
                       capture_output=True, text=True, timeout=900)
    library = ctypes.CDLL(str(path))
    library.glmrt_fp8_e4m3_decode.restype = ctypes.c_int32
    library.glmrt_fp8_e4m3_decode.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    library.glmrt_fp8_e4m3_encode.restype = ctypes.c_int32
    library.glmrt_fp8_e4m3_encode.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    return library


LIBRARY = load_library()


def decode(bits):
    bits = np.ascontiguousarray(bits, dtype=np.uint8)
    values = np.empty(bits.shape, dtype=np.float32)
    assert LIBRARY.glmrt_fp8_e4m3_decode(bits.ctypes.data, values.ctypes.data, bits.size) == 0
    return values


def encode(values):
    values = np.ascontiguousarray(values, dtype=np.float32)
    bits = np.empty(values.shape, dtype=np.uint8)
    assert LIBRARY.glmrt_fp8_e4m3_encode(values.ctypes.data, bits.ctypes.data, values.size) == 0
    return bits


def ml_dtypes_saturating_bits(values):
    values = np.asarray(values, dtype=np.float32)
    clipped = np.where(np.isnan(values), values, np.clip(values, -448.0, 448.0)).astype(np.float32)
    with np.errstate(invalid="ignore"):
        return clipped.astype(ml_dtypes.float8_e4m3fn).view(np.uint8)


def torch_bits(values):
    tensor = torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32))
    return tensor.to(torch.float8_e4m3fn).view(torch.uint8).numpy()


def assert_same_floats(actual, expected):
    actual = np.asarray(actual, dtype=np.float32)
    expected = np.asarray(expected, dtype=np.float32)
    assert np.array_equal(np.isnan(actual), np.isnan(expected))
    finite = ~np.isnan(expected)
    assert np.array_equal(actual[finite].view(np.uint32), expected[finite].view(np.uint32))


def test_decode_matches_ml_dtypes_for_all_256_patterns():
    bits = np.arange(256, dtype=np.uint8)
    expected = bits.view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    assert_same_floats(decode(bits), expected)


def test_decode_matches_torch_for_all_256_patterns():
    bits = np.arange(256, dtype=np.uint8)
    expected = torch.from_numpy(bits).view(torch.float8_e4m3fn).to(torch.float32).numpy()
    assert_same_floats(decode(bits), expected)


def test_decode_has_nan_only_at_0x7f_and_0xff_and_signed_zeros():
    values = decode(np.arange(256, dtype=np.uint8))
    assert sorted(np.flatnonzero(np.isnan(values)).tolist()) == [0x7F, 0xFF]
    assert values[0x00].view(np.uint32) == 0x00000000
    assert values[0x80].view(np.uint32) == 0x80000000
    assert values[0x7E] == 448.0 and values[0xFE] == -448.0


def test_decode_subnormals_are_multiples_of_two_to_minus_nine():
    values = decode(np.arange(1, 8, dtype=np.uint8))
    assert np.array_equal(values, np.arange(1, 8, dtype=np.float32) * np.float32(2.0 ** -9))
    assert decode(np.array([0x08], dtype=np.uint8))[0] == np.float32(2.0 ** -6)


def test_encode_edge_values_saturate_and_round_to_nearest_even():
    cases = [
        (448.0, 0x7E), (-448.0, 0xFE), (464.0, 0x7E), (-464.0, 0xFE),
        (np.nextafter(np.float32(464.0), np.float32(500.0)), 0x7E), (480.0, 0x7E), (500.0, 0x7E),
        (1.0e30, 0x7E), (-1.0e30, 0xFE), (np.finfo(np.float32).max, 0x7E),
        (np.inf, 0x7E), (-np.inf, 0xFE), (np.nan, 0x7F), (NEGATIVE_NAN, 0xFF),
        (0.0, 0x00), (-0.0, 0x80), (1.0, 0x38), (-1.0, 0xB8),
        (1.0625, 0x38), (1.1875, 0x3A), (np.nextafter(np.float32(1.0625), np.float32(2.0)), 0x39),
        (2.0 ** -9, 0x01), (-(2.0 ** -9), 0x81), (2.0 ** -10, 0x00), (-(2.0 ** -10), 0x80),
        (np.nextafter(np.float32(2.0 ** -10), np.float32(1.0)), 0x01), (3.0 * 2.0 ** -10, 0x02),
        (5.0 * 2.0 ** -10, 0x02), (7.0 * 2.0 ** -10, 0x04), (15.0 * 2.0 ** -10, 0x08),
        (7.5 * 2.0 ** -9, 0x08), (2.0 ** -6, 0x08), (np.float32(1.0e-30), 0x00), (np.float32(-1.0e-30), 0x80),
        (np.float32(1.0e-45), 0x00), (240.0, 0x77), (248.0, 0x78), (232.0, 0x76),
    ]
    values = np.array([value for value, _ in cases], dtype=np.float32)
    assert np.signbit(values[13]) and np.isnan(values[13])
    expected = np.array([bits for _, bits in cases], dtype=np.uint8)
    actual = encode(values)
    mismatches = [(float(v), hex(a), hex(e)) for v, a, e in zip(values, actual, expected) if a != e]
    assert mismatches == []
    assert np.array_equal(actual, torch_bits(values))
    assert np.array_equal(actual, ml_dtypes_saturating_bits(values))


def test_encode_midpoints_between_all_grid_values_round_to_even():
    grid = decode(np.arange(0, 0x7F, dtype=np.uint8)).astype(np.float64)
    midpoints = ((grid[:-1] + grid[1:]) / 2.0).astype(np.float32)
    assert np.array_equal(midpoints.astype(np.float64), (grid[:-1] + grid[1:]) / 2.0)
    lower_codes = np.arange(0, 0x7E, dtype=np.uint8)
    expected = np.where(lower_codes % 2 == 0, lower_codes, lower_codes + 1).astype(np.uint8)
    assert np.array_equal(encode(midpoints), expected)
    assert np.array_equal(encode(-midpoints), expected | 0x80)
    assert np.array_equal(encode(midpoints), ml_dtypes_saturating_bits(midpoints))


def test_encode_round_trips_every_pattern():
    bits = np.arange(256, dtype=np.uint8)
    round_trip = encode(decode(bits))
    finite = (bits & 0x7F) != 0x7F
    assert np.array_equal(round_trip[finite], bits[finite])
    assert round_trip[0x7F] == 0x7F and round_trip[0xFF] == 0xFF


def random_float32_values(count, seed):
    generator = np.random.default_rng(seed)
    magnitudes = np.exp2(generator.uniform(-14.0, 11.0, count)) * generator.uniform(1.0, 2.0, count)
    signs = np.where(generator.random(count) < 0.5, -1.0, 1.0)
    mixed = (signs * magnitudes).astype(np.float32)
    raw = generator.integers(0, 2 ** 32, count // 10, dtype=np.uint64).astype(np.uint32).view(np.float32)
    mixed[: raw.size] = raw
    return mixed


def test_encode_one_million_random_values_matches_saturating_ml_dtypes_and_torch():
    values = random_float32_values(1_000_000, 20240611)
    actual = encode(values)
    expected = ml_dtypes_saturating_bits(values)
    mismatch = np.flatnonzero(actual != expected)
    assert mismatch.size == 0, [(float(values[i]), int(actual[i]), int(expected[i])) for i in mismatch[:10]]
    assert np.array_equal(actual, torch_bits(values))
    assert np.count_nonzero(np.abs(values[~np.isnan(values)]) > 448.0) > 1000
    assert np.count_nonzero(np.abs(values) < 2.0 ** -6) > 1000


def test_codec_rejects_negative_counts_and_null_buffers():
    values = np.zeros(4, dtype=np.float32)
    bits = np.zeros(4, dtype=np.uint8)
    assert LIBRARY.glmrt_fp8_e4m3_encode(values.ctypes.data, bits.ctypes.data, -1) == INVALID_ARGUMENT
    assert LIBRARY.glmrt_fp8_e4m3_decode(bits.ctypes.data, values.ctypes.data, -1) == INVALID_ARGUMENT
    assert LIBRARY.glmrt_fp8_e4m3_encode(None, bits.ctypes.data, 4) == INVALID_ARGUMENT
    assert LIBRARY.glmrt_fp8_e4m3_encode(values.ctypes.data, None, 4) == INVALID_ARGUMENT
    assert LIBRARY.glmrt_fp8_e4m3_decode(None, values.ctypes.data, 4) == INVALID_ARGUMENT
    assert LIBRARY.glmrt_fp8_e4m3_decode(bits.ctypes.data, None, 4) == INVALID_ARGUMENT
    assert LIBRARY.glmrt_fp8_e4m3_encode(None, None, 0) == 0
    assert LIBRARY.glmrt_fp8_e4m3_decode(None, None, 0) == 0
