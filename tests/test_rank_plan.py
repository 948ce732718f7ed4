from pathlib import Path

import pytest
from engine_support import build_test_model

from glmrt.engine import native as bindings
from glmrt.engine.errors import GlmrtError
from glmrt.model.checkpoint import plan_ranks
from glmrt.model.config import load_model_config
from glmrt.tools.pipeline.build_check import header_abi_version

REPO_ROOT = Path(__file__).resolve().parents[1]
GLM47_CONFIG = REPO_ROOT / "tests" / "data" / "glm-4.7-fp8.config.json"


@pytest.fixture(scope="module")
def glm47(tmp_path_factory):
    directory = tmp_path_factory.mktemp("glm47")
    (directory / "config.json").write_text(GLM47_CONFIG.read_text())
    return load_model_config(directory)


def ranges_tile(ranks, begin_key, count_key, total):
    position = 0
    for rank_info in ranks:
        if rank_info[count_key] == 0:
            continue
        if rank_info[begin_key] != position:
            return False
        position += rank_info[count_key]
    return position == total


@pytest.mark.parametrize("num_devices", [1, 2, 4, 8])
def test_glm47_splits_into_whole_heads_experts_and_columns_over_every_supported_gpu_count(glm47, num_devices):
    ranks = plan_ranks(glm47, num_devices)
    assert glm47.weight_quant == "fp8-channel"
    assert len(ranks) == num_devices
    assert ranges_tile(ranks, "q_head_begin", "q_head_count", glm47.num_attention_heads)
    assert ranges_tile(ranks, "kv_head_begin", "kv_head_count", glm47.num_key_value_heads)
    assert ranges_tile(ranks, "expert_begin", "expert_count", glm47.n_routed_experts)
    assert ranges_tile(ranks, "dense_begin", "dense_count", glm47.intermediate_size)
    assert ranges_tile(ranks, "shared_begin", "shared_count", glm47.moe_intermediate_size * glm47.n_shared_experts)
    assert ranges_tile(ranks, "vocab_begin", "vocab_count", glm47.vocab_size)
    group = glm47.num_attention_heads // glm47.num_key_value_heads
    for rank, rank_info in enumerate(ranks):
        assert rank_info["q_head_count"] == glm47.num_attention_heads // num_devices
        assert rank_info["kv_head_begin"] == rank_info["q_head_begin"] // group
        assert rank_info["kv_head_count"] * group == rank_info["q_head_count"]
        assert rank_info["expert_count"] == glm47.n_routed_experts // num_devices
        assert rank_info["dense_count"] == glm47.intermediate_size // num_devices
        assert rank_info["vocab_count"] == glm47.vocab_size // num_devices


def test_glm47_over_eight_gpus_gives_each_one_kv_head_and_twenty_experts(glm47):
    ranks = plan_ranks(glm47, 8)
    assert [s["kv_head_count"] for s in ranks] == [1] * 8
    assert [s["q_head_count"] for s in ranks] == [12] * 8
    assert [s["expert_count"] for s in ranks] == [20] * 8
    assert [s["dense_count"] for s in ranks] == [1536] * 8
    assert [s["shared_count"] for s in ranks] == [192] * 8


@pytest.mark.parametrize("num_devices, words", [(3, "32 heads a GPU straddle the query groups of 12 heads"),
                                                (5, "96 attention heads cannot be split evenly over 5 GPUs"),
                                                (0, "must be in [1, 16]"), (32, "must be in [1, 16]")])
def test_gpu_counts_that_do_not_split_the_model_are_refused_with_the_reason(glm47, num_devices, words):
    with pytest.raises((GlmrtError, ValueError)) as raised:
        plan_ranks(glm47, num_devices)
    assert words in str(raised.value)


def test_block_scaled_heads_that_straddle_scale_blocks_are_refused():
    config = load_model_config(build_test_model("fp8-block", num_attention_heads=8, num_key_value_heads=8,
                                                head_dim=16, hidden_size=64, intermediate_size=256))
    ranks = plan_ranks(config, 2)
    assert [s["q_head_count"] for s in ranks] == [4, 4]
    with pytest.raises(GlmrtError) as raised:
        plan_ranks(config, 8)
    assert raised.value.status_name == "UNSUPPORTED"
    assert "do not fall on the 32x32 FP8 scale blocks" in raised.value.message


def test_the_python_bindings_and_the_header_agree_on_the_abi():
    assert bindings.GLMRT_ABI_VERSION == header_abi_version(REPO_ROOT)
    assert bindings.load_library().glmrt_abi_version() == bindings.GLMRT_ABI_VERSION


def test_columns_split_in_whole_matmul_steps_and_gpus_past_the_last_step_get_none():
    config = load_model_config(build_test_model("bf16", seed=3, num_attention_heads=8, num_key_value_heads=4,
                                                head_dim=32, hidden_size=128, intermediate_size=256,
                                                moe_intermediate_size=64, n_routed_experts=16, n_group=4,
                                                topk_group=2, num_experts_per_tok=4))
    ranks = plan_ranks(config, 8)
    assert [s["dense_count"] for s in ranks] == [32] * 8
    assert [s["shared_count"] for s in ranks] == [16] * 4 + [0] * 4
    assert [s["kv_head_begin"] for s in ranks] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert [s["kv_head_count"] for s in ranks] == [1] * 8


@pytest.mark.parametrize("num_devices", [1, 2, 4, 8])
def test_glm47_columns_split_gives_every_gpu_every_expert_and_its_share_of_each_experts_columns(glm47, num_devices):
    ranks = plan_ranks(glm47, num_devices, expert_split="columns")
    whole = plan_ranks(glm47, num_devices)
    width = glm47.moe_intermediate_size
    assert ranges_tile(ranks, "expert_column_begin", "expert_column_count", width)
    assert [(r["expert_begin"], r["expert_count"]) for r in ranks] == [(0, glm47.n_routed_experts)] * num_devices
    assert [r["expert_column_count"] for r in ranks] == [width // num_devices] * num_devices
    assert [(r["expert_column_begin"], r["expert_column_count"]) for r in whole] == [(0, width)] * num_devices
    moved = {"expert_begin", "expert_count", "expert_column_begin", "expert_column_count"}
    for columns_rank, whole_rank in zip(ranks, whole):
        assert {k: v for k, v in columns_rank.items() if k not in moved} == \
               {k: v for k, v in whole_rank.items() if k not in moved}


def test_columns_split_needs_a_share_of_every_expert_for_every_gpu():
    config = load_model_config(build_test_model("bf16", seed=3, num_attention_heads=8, num_key_value_heads=4,
                                                head_dim=32, hidden_size=128, intermediate_size=256,
                                                moe_intermediate_size=64, n_routed_experts=16, n_group=4,
                                                topk_group=2, num_experts_per_tok=4))
    assert [r["expert_column_count"] for r in plan_ranks(config, 4, expert_split="columns")] == [16] * 4
    with pytest.raises(GlmrtError) as raised:
        plan_ranks(config, 8, expert_split="columns")
    assert raised.value.status_name == "UNSUPPORTED"
    assert "the expert width 64 in blocks of 16 cannot give each of 8 GPUs a share" in raised.value.message
    with pytest.raises(ValueError, match="expert_split must be one of \\['columns', 'whole'\\], got 'rows'"):
        plan_ranks(config, 2, expert_split="rows")
