import json
import time

import numpy as np
import pytest

from argparse import Namespace

from bench.gemm_bench import binary_command, parse_args as gemm_parse_args
from bench.gpu_bench import (decode_step_bytes, fill_contexts, kv_pool_pages, mean_context, parse_args, warm_up,
                              write_model_dir)
from bench.layer_projection import full_model_moe_layers, line_fit, main as projection_main, project
from bench.mixed_step_bench import chunk_sizes, measure, prompt_parts
from bench.serve_ceiling import SERVER_COUNTERS
from bench.serve_glm import decode_roofline, load_window_seconds, server_summary
from bench.timeline_report import frontier_shares, last_step, read_kernels
from engine_support import build_test_model, open_engine
from glmrt.engine.engine import SamplingParams


def test_gpu_bench_prefill_counts_every_prompt_token_across_chunked_steps():
    lengths = [5, 40, 97, 130]
    with open_engine(build_test_model("bf16"), max_tokens_per_step=64) as engine:
        params = SamplingParams(temperature=0.0, max_new_tokens=4, ignore_eos=True)
        requests = [engine.create_request([(7 * i + n) % 200 + 1 for i in range(n)], params) for n in lengths]
        tokens, seconds = fill_contexts(engine, requests)
        assert tokens == sum(lengths)
        assert seconds > 0
        assert [r.info().num_computed_tokens for r in requests] == lengths
        assert all(r.info().num_generated_tokens == 1 for r in requests)


def test_gpu_bench_warm_up_takes_its_steps_then_its_seconds_but_never_more_than_its_most():
    calls = []
    assert warm_up(lambda: calls.append(1), (3, 0.0, 10)) == 3
    assert len(calls) == 3
    assert warm_up(lambda: calls.append(1), (3, 60.0, 7)) == 7
    assert warm_up(lambda: time.sleep(0.01), (1, 0.08, 1000)) >= 5


def test_gpu_bench_kv_pool_holds_every_request_grown_by_the_batches_it_joins():
    args = parse_args(["--context", "20", "--decode-steps", "2", "--warmup-steps", "1", "--max-warmup-steps", "4"])
    steps_a_batch = 2 * (4 + 2 + 1)
    first = -(-(20 + 2 * steps_a_batch + 4 + 1) // 16)
    others = -(-(20 + steps_a_batch + 4 + 1) // 16)
    assert kv_pool_pages(args, [1, 3]) == 16 + first + 2 * others


def test_gpu_bench_mean_context_is_over_the_batch_rows():
    with open_engine(build_test_model("bf16"), max_tokens_per_step=64) as engine:
        params = SamplingParams(temperature=0.0, max_new_tokens=4, ignore_eos=True)
        requests = [engine.create_request([(3 * i + n) % 200 + 1 for i in range(n)], params) for n in (6, 10, 17)]
        fill_contexts(engine, requests)
        assert mean_context(requests) == pytest.approx((6 + 10 + 17) / 3 + 1)
        assert mean_context(requests[:1]) == 7


def test_mixed_step_bench_adds_whole_prompts_beside_the_decode_rows_and_gives_their_pages_back():
    assert chunk_sizes("256,0,1024,256") == [0, 256, 1024]
    assert chunk_sizes("64") == [0, 64]
    with pytest.raises(SystemExit):
        chunk_sizes("-1")
    assert prompt_parts(0, 24) == []
    assert prompt_parts(60, 24) == [24, 24, 12]
    with open_engine(build_test_model("bf16"), max_tokens_per_step=128) as engine:
        params = SamplingParams(temperature=0.0, max_new_tokens=40, ignore_eos=True)
        decode_rows = [engine.create_request([(5 * i + n) % 200 + 1 for i in range(12 + n)], params) for n in range(4)]
        fill_contexts(engine, decode_rows)
        args = Namespace(prompt_tokens=24, steps=2, seed=3)
        rows = measure(args, engine, decode_rows, [0, 24, 60], engine.vocab_size)
        assert [(row["chunk"], row["prompts"]) for row in rows] == [(0, 0), (24, 1), (60, 3)]
        assert all(row["device_ms"] > 0 and row["wall_ms"] > 0 for row in rows)
        assert "added_ms" not in rows[0] and all("added_ms" in row for row in rows[1:])
        assert all(r.info().num_generated_tokens == 1 + 3 * 4 for r in decode_rows)
        assert engine.stats().live_requests == len(decode_rows)
        for request in decode_rows:
            engine.free_request(request)
        stats = engine.stats()
        assert stats.kv_pages_free == stats.kv_pages_total
        assert stats.live_requests == 0


def test_serve_glm_roofline_is_the_step_bytes_over_every_gpu_against_the_device_time(tmp_path):
    model_dir, config = write_model_dir(92, parent=tmp_path)
    weights, kv_read = decode_step_bytes(config, 250.0, 1536)
    floor_ms = 1e3 * (weights + kv_read) / (4 * 4.3e12)
    assert decode_roofline(model_dir, 4, 4.3e12, 250.0, 1536, 87.55) == pytest.approx(floor_ms / 87.55)
    assert decode_roofline(model_dir, 4, 4.3e12, 250.0, 1536, 87.55) == pytest.approx(0.331, abs=0.001)
    assert decode_roofline(model_dir, 1, 4.3e12, 250.0, 1536, 87.55) == pytest.approx(4 * floor_ms / 87.55)
    assert decode_roofline(model_dir, 4, None, 250.0, 1536, 87.55) is None
    assert decode_roofline(model_dir, 4, 4.3e12, None, 1536, None) is None


def test_serve_glm_rates_count_the_load_window_not_the_load_generator_start():
    before = {name: 0.0 for name in SERVER_COUNTERS}
    after = dict(before, steps=400.0, step_seconds=4.0, batch_sum=800.0, device_seconds=3.6, gap_seconds=0.2,
                 gaps=399.0, preemptions=2.0)
    window = load_window_seconds({"duration_s": 4.0}, 6.5)
    assert window == 4.0
    summary = server_summary(before, after, window)
    assert summary["steps_per_s"] == pytest.approx(100.0)
    assert summary["device_busy"] == pytest.approx(0.9)
    assert summary["mean_batch"] == pytest.approx(2.0)
    assert summary["window_s"] == 4.0
    assert summary["preemptions"] == 2
    assert load_window_seconds({"duration_s": None}, 6.5) == 6.5
    assert load_window_seconds({"duration_s": 9.0}, 6.5) == 6.5
    assert load_window_seconds({}, 6.5) == 6.5


def test_timeline_report_charges_each_kernel_the_time_it_moves_its_gpus_frontier(tmp_path):
    timeline = tmp_path / "timeline.csv"
    rows = [("glmrt_embed_kernel", 0.0, 2.0), ("glmrt_qgemm_kernel", 2.0, 10.0),
            ("glmrt_embed_kernel", 100.0, 2.0), ("glmrt_qgemm_kernel", 101.0, 10.0),
            ("glmrt_router_kernel", 105.0, 10.0), ("glmrt_rmsnorm_kernel", 106.0, 3.0),
            ("glmrt_combine_kernel", 120.0, 5.0)]
    timeline.write_text("device,stream,start_us,us,kernel\n" +
                        "".join(f"0,7,{start},{length},{name}\n" for name, start, length in rows))
    begin, step = last_step(read_kernels(timeline))
    assert begin == 100.0
    assert [kernel["name"] for kernel in step][0] == "glmrt_embed_kernel"
    charged, launches, idle, wall = frontier_shares(step, begin)
    assert charged["glmrt_embed_kernel"] == pytest.approx(2.0)
    assert charged["glmrt_qgemm_kernel"] == pytest.approx(9.0)
    assert charged["glmrt_router_kernel"] == pytest.approx(4.0)
    assert charged["glmrt_rmsnorm_kernel"] == 0.0
    assert charged["glmrt_combine_kernel"] == pytest.approx(5.0)
    assert idle == pytest.approx(5.0)
    assert wall == pytest.approx(25.0)
    assert sum(charged.values()) + idle == pytest.approx(wall)
    assert launches["glmrt_qgemm_kernel"] == 1


def test_gemm_bench_times_the_gate_up_products_gated_unless_asked_for_both_halves():
    default = gemm_parse_args([])
    assert not default.ungated
    assert "--gated" in binary_command("gemm_bench", not default.no_high, default.block_scales, default.gpus,
                                       not default.ungated)
    ungated = gemm_parse_args(["--ungated", "--no-high", "--block-scales", "--gpus", "4"])
    command = binary_command("gemm_bench", not ungated.no_high, ungated.block_scales, ungated.gpus, not ungated.ungated)
    assert command == ["gemm_bench", "--block-scales", "--gpus", "4"]


def gpu_bench_result(moe_layers, rows, num_devices=1):
    decode = [dict(batch=batch, step_ms=step, relaunched_ms=relaunched, floor_ms=floor)
              for batch, step, relaunched, floor in rows]
    return dict(moe_layers=moe_layers, glmrt=dict(info=dict(num_devices=num_devices), decode=decode))


def linear_rows(moe_layers):
    return [(1, 0.8 + 0.14 * moe_layers, 0.75 + 0.135 * moe_layers, 0.5 + 0.1 * moe_layers),
            (256, 2.4 + 1.5 * moe_layers, 2.3 + 1.48 * moe_layers, 1.9 + 1.2 * moe_layers)]


def test_layer_projection_recovers_a_step_linear_in_its_moe_layers_and_projects_it():
    full = full_model_moe_layers()
    assert full == 89
    projection = project([gpu_bench_result(4, linear_rows(4)), gpu_bench_result(16, linear_rows(16))], full)
    one, wide = projection["batches"]
    assert one["batch"] == 1 and wide["batch"] == 256
    assert one["fits"]["step_ms"]["per_moe_layer_ms"] == pytest.approx(0.14)
    assert one["fits"]["step_ms"]["rest_ms"] == pytest.approx(0.8)
    assert one["step_ms"] == pytest.approx(0.8 + 0.14 * 89)
    assert one["tokens_per_s"] == pytest.approx(1e3 / (0.8 + 0.14 * 89))
    assert wide["relaunched_ms"] == pytest.approx(2.3 + 1.48 * 89)
    assert wide["relaunched_tokens_per_s"] == pytest.approx(256e3 / (2.3 + 1.48 * 89))
    assert wide["roofline_fraction"] == pytest.approx((1.9 + 1.2 * 89) / (2.4 + 1.5 * 89))


def test_layer_projection_fits_more_than_two_layer_counts_by_least_squares():
    rng = np.random.default_rng(3)
    layers = [2, 4, 8, 16, 20]
    steps = [1.1 + 0.3 * n + rng.normal(0, 0.05) for n in layers]
    rest, slope = line_fit(list(zip(layers, steps)))
    expected_slope, expected_rest = np.polyfit(layers, steps, 1)
    assert slope == pytest.approx(expected_slope)
    assert rest == pytest.approx(expected_rest)


def test_layer_projection_refuses_results_it_cannot_fit(tmp_path):
    with pytest.raises(ValueError, match="two different MoE layer counts"):
        project([gpu_bench_result(4, linear_rows(4)), gpu_bench_result(4, linear_rows(4))], 89)
    with pytest.raises(ValueError, match="different GPU counts"):
        project([gpu_bench_result(4, linear_rows(4)), gpu_bench_result(16, linear_rows(16), num_devices=2)], 89)
    with pytest.raises(ValueError, match="no batch"):
        project([gpu_bench_result(4, linear_rows(4)[:1]), gpu_bench_result(16, linear_rows(16)[1:])], 89)
    lacking = tmp_path / "lacking.json"
    lacking.write_text(json.dumps(dict(moe_layers=4)))
    whole = tmp_path / "whole.json"
    whole.write_text(json.dumps(gpu_bench_result(16, linear_rows(16))))
    assert projection_main([str(lacking), str(whole)]) == 1
    assert projection_main([str(whole), str(whole)]) == 1
    assert projection_main([str(whole), "--moe-layers", "-1"]) == 2


def test_layer_projection_writes_its_table_and_json(tmp_path, capsys):
    paths = []
    for layers in (4, 16):
        path = tmp_path / f"gb{layers}.json"
        path.write_text(json.dumps(gpu_bench_result(layers, linear_rows(layers))))
        paths.append(str(path))
    out = tmp_path / "projection.json"
    assert projection_main(paths + ["--moe-layers", "40", "--json", str(out)]) == 0
    written = json.loads(out.read_text())
    assert written["moe_layers"] == 40 and written["measured_moe_layers"] == [4, 16]
    assert written["batches"][0]["step_ms"] == pytest.approx(0.8 + 0.14 * 40)
    table = capsys.readouterr().out
    assert "projected to 40 MoE layers" in table
    assert f"| 1 | 0.140 | 0.80 | {0.8 + 0.14 * 40:.1f} |" in table
