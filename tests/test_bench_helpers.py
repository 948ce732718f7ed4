from bench.gpu_bench import fill_contexts
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
