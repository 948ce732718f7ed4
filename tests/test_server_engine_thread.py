import asyncio

import pytest

from glmrt.engine.engine import Engine, SamplingParams
from glmrt.engine.engine_thread import EngineThread, EngineUnavailable, Finish
from glmrt.engine.request import Request
from glmrt.serve.metrics import ServerMetrics, parse_metric_samples
from tests.server_harness import OFFLINE_ENGINE, build_server_test_model, solo_outputs

pytestmark = pytest.mark.asyncio


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_server_test_model(tmp_path_factory.mktemp("engine-thread-model"))


async def started_thread(model_dir, thread_type=EngineThread, engine_type=Engine, relaunch=None, **engine_options):
    settings = dict(OFFLINE_ENGINE)
    settings.update(engine_options)
    metrics = ServerMetrics()
    thread = thread_type(lambda: engine_type(model_dir, **settings), metrics, max_inbox=16, relaunch=relaunch)
    loop = asyncio.get_running_loop()
    loaded = loop.create_future()
    stopped = loop.create_future()
    thread.add_listener(loop, lambda: loaded.set_result(True), lambda: stopped.set_result(True))
    thread.start()
    await asyncio.wait_for(loaded, 60)
    return thread, metrics, stopped


def work(prompt_ids, params):
    return Request(prompt_ids, params, asyncio.get_running_loop(), asyncio.Queue())


async def drain(queue):
    tokens = []
    while True:
        item = await asyncio.wait_for(queue.get(), 30)
        if isinstance(item, Finish):
            return tokens, item
        tokens.append(item)


def samples_of(metrics):
    return parse_metric_samples(metrics.render().decode())


async def wait_for_sample(metrics, name, predicate):
    for _ in range(500):
        if predicate(samples_of(metrics)[name]):
            return
        await asyncio.sleep(0.01)
    raise AssertionError(samples_of(metrics))


async def wait_for_pages(metrics, predicate):
    await wait_for_sample(metrics, "glmrt:kv_pages_used", predicate)


RELAUNCH_MODES = ((False, "off"), (True, "off"), (True, "always"))


@pytest.mark.parametrize("relaunch,launch_ahead", RELAUNCH_MODES)
async def test_engine_thread_streams_the_same_tokens_as_the_offline_engine(model_dir, relaunch, launch_ahead):
    jobs = [([5 + index, 17, 300, 42 + index], SamplingParams(temperature=0.8, max_new_tokens=12 + 3 * index,
                                                               seed=index)) for index in range(4)]
    expected = solo_outputs(model_dir, jobs)
    thread, metrics, stopped = await started_thread(model_dir, relaunch=relaunch, launch_ahead=launch_ahead)
    works = [work(prompt, params) for prompt, params in jobs]
    for item in works:
        thread.submit(item)
    results = await asyncio.gather(*(drain(item.queue) for item in works))
    for (tokens, finish), want in zip(results, expected):
        assert tokens == want
        assert finish == Finish("completed", "length")
    await wait_for_pages(metrics, lambda used: used == 0)
    ahead = samples_of(metrics)["glmrt:steps_launched_ahead_total"]
    assert ahead > 0 if launch_ahead == "always" else ahead == 0
    thread.stop()
    await asyncio.wait_for(stopped, 30)
    assert thread.join(5)


@pytest.mark.parametrize("relaunch,launch_ahead", RELAUNCH_MODES)
async def test_cancel_frees_the_pages_before_the_next_step_and_stop_ends_the_rest_incomplete(model_dir, relaunch,
                                                                                            launch_ahead):
    thread, metrics, stopped = await started_thread(model_dir, relaunch=relaunch, launch_ahead=launch_ahead)
    long_params = SamplingParams(temperature=1.0, max_new_tokens=1500, ignore_eos=True, seed=3)
    first = work(list(range(10, 60)), long_params)
    second = work(list(range(70, 120)), long_params)
    thread.submit(first)
    thread.submit(second)
    await first.queue.get()
    await second.queue.get()
    await wait_for_pages(metrics, lambda used: used > 0)
    thread.cancel(first.request_id)
    tokens, finish = await drain(first.queue)
    assert finish.status == "cancelled" and len(tokens) < 1499
    await wait_for_sample(metrics, "glmrt:num_requests_running", lambda running: running == 1)
    for _ in range(3):
        await asyncio.wait_for(second.queue.get(), 30)
    assert first.queue.empty()
    thread.stop()
    tokens, finish = await drain(second.queue)
    assert finish.status == "incomplete"
    await asyncio.wait_for(stopped, 30)
    assert samples_of(metrics)["glmrt:kv_pages_used"] == 0
    assert samples_of(metrics)["glmrt:engine_loaded"] == 0
    with pytest.raises(EngineUnavailable):
        thread.submit(work([1, 2, 3], SamplingParams(max_new_tokens=2)))


class RecordingEngine(Engine):
    events = []

    def launch(self, requests):
        super().launch(requests)
        self.events.append("launch")

    def complete(self):
        outputs = super().complete()
        self.events.append("complete")
        return outputs


class RecordingThread(EngineThread):
    def _hand_out(self, result, deliveries):
        RecordingEngine.events.append("hand out")
        super()._hand_out(result, deliveries)


async def test_the_next_step_is_launched_before_the_last_steps_tokens_are_handed_out(model_dir):
    RecordingEngine.events.clear()
    thread, _, stopped = await started_thread(model_dir, thread_type=RecordingThread, engine_type=RecordingEngine)
    request = work([5, 17, 300, 42], SamplingParams(temperature=0.0, max_new_tokens=6, ignore_eos=True))
    thread.submit(request)
    tokens, finish = await drain(request.queue)
    assert len(tokens) == 6 and finish == Finish("completed", "length")
    thread.stop()
    await asyncio.wait_for(stopped, 30)
    events = RecordingEngine.events
    assert events == ["launch", "complete"] + ["launch", "hand out", "complete"] * 5 + ["hand out"]


class RelaunchCountingEngine(Engine):
    launches = 0
    relaunches = 0

    def launch(self, requests):
        super().launch(requests)
        RelaunchCountingEngine.launches += 1

    def complete_and_relaunch(self):
        tokens, codes, relaunched = super().complete_and_relaunch()
        RelaunchCountingEngine.relaunches += int(relaunched)
        return tokens, codes, relaunched


async def test_steady_decode_steps_are_relaunched_by_the_native_core(model_dir):
    RelaunchCountingEngine.launches = RelaunchCountingEngine.relaunches = 0
    thread, metrics, stopped = await started_thread(model_dir, engine_type=RelaunchCountingEngine, relaunch=True)
    assert thread.engine_info.asynchronous_launch == 0
    jobs = [work([9, 8, 7 + index], SamplingParams(temperature=0.0, max_new_tokens=10, ignore_eos=True))
            for index in range(2)]
    for item in jobs:
        thread.submit(item)
    results = await asyncio.gather(*(drain(item.queue) for item in jobs))
    assert [len(tokens) for tokens, _ in results] == [10, 10]
    assert RelaunchCountingEngine.relaunches >= 8
    assert RelaunchCountingEngine.launches + RelaunchCountingEngine.relaunches >= 10
    assert RelaunchCountingEngine.launches <= 2
    await wait_for_pages(metrics, lambda used: used == 0)
    thread.stop()
    await asyncio.wait_for(stopped, 30)


async def test_engine_refusals_reach_the_request_as_failed_with_a_code(model_dir):
    thread, _, stopped = await started_thread(model_dir, max_context=64)
    too_long = work(list(range(100)), SamplingParams(max_new_tokens=4))
    thread.submit(too_long)
    tokens, finish = await drain(too_long.queue)
    assert tokens == []
    assert finish.status == "failed" and finish.error_code == "context_length_exceeded" and finish.message
    thread.stop()
    await asyncio.wait_for(stopped, 30)


async def test_engine_that_fails_to_load_reports_the_error(tmp_path):
    metrics = ServerMetrics()
    thread = EngineThread(lambda: Engine(tmp_path / "missing", num_threads=1), metrics, max_inbox=4)
    loop = asyncio.get_running_loop()
    loaded = loop.create_future()
    thread.add_listener(loop, lambda: loaded.set_result(True), lambda: None)
    thread.start()
    await asyncio.wait_for(loaded, 30)
    assert thread.load_error is not None
    with pytest.raises(EngineUnavailable):
        thread.submit(work([1], SamplingParams(max_new_tokens=1)))
    assert thread.join(5)
