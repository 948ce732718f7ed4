import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field

from glmrt.engine import native
from glmrt.engine.errors import GlmrtError
from glmrt.engine.request import RequestStatus
from glmrt.engine.scheduler import Scheduler, SchedulerPolicy, StepResult

log = logging.getLogger("glmrt.engine.engine_thread")

ENGINE_ERROR_CODES = {"CONTEXT_LENGTH": "context_length_exceeded", "OUT_OF_PAGES": "kv_cache_too_small",
                      "INVALID_ARGUMENT": "invalid_value"}


@dataclass(frozen=True)
class Finish:
    status: str
    finish_reason: str | None = None
    error_code: str | None = None
    message: str | None = None

    @property
    def is_error(self):
        return self.error_code is not None


INCOMPLETE = Finish("incomplete")
CANCELLED = Finish("cancelled")


def finish_for_engine_error(exc):
    return Finish("failed", error_code=ENGINE_ERROR_CODES.get(exc.status_name, "engine_error"), message=exc.message)


class EngineUnavailable(Exception):
    pass


def put_all(items):
    for queue, item in items:
        queue.put_nowait(item)


@dataclass
class Deliveries:
    by_loop: dict = field(default_factory=dict)

    def add(self, request, item):
        self.by_loop.setdefault(request.loop, []).append((request.queue, item))

    def send(self):
        for loop, items in self.by_loop.items():
            try:
                loop.call_soon_threadsafe(put_all, items)
            except RuntimeError:
                log.warning("event loop closed; %d engine events dropped", len(items))
        self.by_loop = {}


class EngineThread:
    def __init__(self, engine_factory, metrics, max_inbox, max_running=None, watermark_pages=0, relaunch=None):
        self._factory = engine_factory
        self._relaunch_option = relaunch
        self._relaunch = False
        self._metrics = metrics
        self._max_inbox = max_inbox
        self._max_running = max_running
        self._watermark_pages = watermark_pages
        self._cond = threading.Condition()
        self._inbox = deque()
        self._cancels = set()
        self._stopping = False
        self._engine = None
        self._in_flight = None
        self.scheduler = None
        self.engine_info = None
        self.config = None
        self.load_error = None
        self.loaded = threading.Event()
        self.stopped = threading.Event()
        self._on_loaded = []
        self._on_stopped = []
        self._thread = threading.Thread(target=self._run, name="glmrt-engine", daemon=True)

    def add_listener(self, loop, on_loaded, on_stopped):
        self._on_loaded.append((loop, on_loaded))
        self._on_stopped.append((loop, on_stopped))

    def start(self):
        self._thread.start()

    def join(self, timeout=None):
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def submit(self, request):
        with self._cond:
            if self._stopping or not self.loaded.is_set() or self.load_error is not None:
                raise EngineUnavailable("the engine is not accepting requests")
            if len(self._inbox) >= self._max_inbox:
                raise EngineUnavailable("the engine inbox is full")
            self._inbox.append(request)
            self._cond.notify()

    def cancel(self, request_id):
        with self._cond:
            self._cancels.add(request_id)
            self._cond.notify()

    def stop(self):
        with self._cond:
            self._stopping = True
            self._cond.notify()

    @staticmethod
    def _notify(callbacks):
        for loop, callback in callbacks:
            try:
                loop.call_soon_threadsafe(callback)
            except RuntimeError:
                pass

    def _run(self):
        try:
            self._engine = self._factory()
            self._start_scheduler()
        except Exception as exc:
            log.error("engine failed to load: %s", exc)
            self.load_error = exc
            self._close_engine()
            self.loaded.set()
            self.stopped.set()
            self._notify(self._on_loaded)
            self._notify(self._on_stopped)
            return
        self.loaded.set()
        self._metrics.engine_loaded.set(1)
        self._notify(self._on_loaded)
        try:
            while self._iterate():
                pass
        finally:
            self._end_all(INCOMPLETE)
            self._metrics.engine_loaded.set(0)
            self._close_engine()
            self.stopped.set()
            self._notify(self._on_stopped)

    def _close_engine(self):
        if self._engine is not None:
            self._engine.close()

    def _start_scheduler(self):
        info = self._engine.info()
        self.engine_info = info
        self.config = self._engine.config
        self._relaunch = bool(info.asynchronous_launch if self._relaunch_option is None else self._relaunch_option)
        max_running = info.max_batch if self._max_running is None else min(info.max_batch, self._max_running)
        self.scheduler = Scheduler(self._engine, SchedulerPolicy(max_running=max_running,
                                                                 watermark_pages=self._watermark_pages))
        self._publish_stats()

    def _take_work(self):
        with self._cond:
            while not (self._inbox or self._cancels or self._stopping or self._in_flight is not None
                       or self.scheduler.has_work()):
                self._cond.wait()
            arrivals = list(self._inbox)
            self._inbox.clear()
            cancels = self._cancels
            self._cancels = set()
            return arrivals, cancels, self._stopping

    def _iterate(self):
        arrivals, cancels, stopping = self._take_work()
        deliveries = Deliveries()
        for request in arrivals:
            self._accept(request, deliveries)
        relaunch = self._relaunch and not (cancels or stopping or self.scheduler.waiting)
        completed = self._complete_safely(deliveries, relaunch)
        for request_id in cancels:
            self._cancel(request_id, deliveries)
        if self._in_flight is None and not stopping and self.scheduler.has_work():
            self._launch_safely(deliveries)
        if completed is not None:
            self._hand_out(completed, deliveries)
        deliveries.send()
        self._publish_stats()
        if self._in_flight is None and not self.scheduler.has_work():
            self._check_idle_invariants()
        return not stopping

    def _accept(self, request, deliveries):
        try:
            self._engine.open_request(request)
        except GlmrtError as exc:
            deliveries.add(request, finish_for_engine_error(exc))
            return
        self.scheduler.add(request)
        self._metrics.prompt_tokens.inc(request.num_prompt_tokens)

    def _cancel(self, request_id, deliveries):
        request = self.scheduler.cancel(request_id)
        if request is not None:
            self._retire(request, CANCELLED, deliveries)

    def _retire(self, request, finish, deliveries):
        self._engine.free_request(request)
        deliveries.add(request, finish)

    def _launch_safely(self, deliveries):
        result = StepResult(launched_at=time.perf_counter())
        try:
            self.scheduler.launch(result)
        except GlmrtError as exc:
            self._fail_running(exc, deliveries)
        if result.batch:
            self._in_flight = result
        for request in result.failed:
            self._retire(request, Finish("failed", error_code="kv_cache_too_small",
                                         message="the KV cache pool cannot hold this request"), deliveries)
        self._metrics.num_preemptions.inc(len(result.preempted))

    def _complete_safely(self, deliveries, relaunch=False):
        result = self._in_flight
        if result is None:
            return None
        self._in_flight = None
        follow_up = None
        try:
            if relaunch:
                follow_up = self.scheduler.complete_and_relaunch(result)
            else:
                self.scheduler.complete(result)
        except GlmrtError as exc:
            self._fail_running(exc, deliveries)
            return None
        result.completed_at = time.perf_counter()
        if follow_up is not None:
            follow_up.launched_at = result.completed_at
            self._in_flight = follow_up
        for request in result.finished_requests:
            self._engine.free_request(request)
        return result

    def _hand_out(self, result, deliveries):
        self._metrics.step_duration.observe(result.completed_at - result.launched_at)
        self._metrics.step_batch_size.observe(len(result.batch))
        reason_name = native.finish_reason_name
        num_generated = 0
        for request, token, code in zip(result.batch, result.tokens, result.finish_codes):
            if token >= 0 and (code or not request.status.is_finished):
                num_generated += 1
                deliveries.add(request, token)
            if code:
                deliveries.add(request, Finish("completed", reason_name(code)))
        self._metrics.generation_tokens.inc(num_generated)

    def _settle_in_flight(self, deliveries):
        completed = self._complete_safely(deliveries)
        if completed is not None:
            self._hand_out(completed, deliveries)

    def _fail_running(self, exc, deliveries):
        batch = list(self.scheduler.running)
        log.error("engine step failed for %d requests: %s", len(batch), exc)
        for request in batch:
            if self.scheduler.finish(request.request_id, RequestStatus.FINISHED_FAILED) is not None:
                self._retire(request, finish_for_engine_error(exc), deliveries)

    def _end_all(self, finish):
        deliveries = Deliveries()
        if self.scheduler is not None:
            self._settle_in_flight(deliveries)
        with self._cond:
            leftovers = list(self._inbox)
            self._inbox.clear()
        for request in leftovers:
            deliveries.add(request, finish)
        if self.scheduler is not None:
            for request in self.scheduler.all_requests():
                self.scheduler.finish(request.request_id, RequestStatus.FINISHED_CANCELLED)
                self._retire(request, finish, deliveries)
        deliveries.send()
        if self._engine is not None and not self._engine.closed:
            self._publish_stats()

    def _publish_stats(self):
        stats = self._engine.stats()
        self._metrics.set_kv_pages(stats.kv_pages_total, stats.kv_pages_free)
        self._metrics.set_prefix_cache(stats)
        self._metrics.set_step_times(stats)
        self._metrics.set_queue_sizes(self.scheduler.num_running, self.scheduler.num_waiting)

    def _check_idle_invariants(self):
        try:
            self._engine.check_invariants()
        except GlmrtError as exc:
            log.error("engine invariants broken while idle: %s", exc)
