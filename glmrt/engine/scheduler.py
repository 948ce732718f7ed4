import bisect
from collections import Counter
from dataclasses import dataclass, field
from typing import NamedTuple

from glmrt.engine import native
from glmrt.engine.errors import GlmrtError
from glmrt.engine.request import FINISH_REASON_TO_STATUS, RequestStatus, by_arrival


@dataclass(frozen=True)
class SchedulerPolicy:
    max_running: int
    watermark_pages: int = 0


class StepOutput(NamedTuple):
    request: object
    token: int | None
    finish_reason: str | None


@dataclass
class StepResult:
    batch: list = field(default_factory=list)
    tokens: list = field(default_factory=list)
    finish_codes: list = field(default_factory=list)
    admitted: list = field(default_factory=list)
    preempted: list = field(default_factory=list)
    failed: list = field(default_factory=list)
    finished_requests: list = field(default_factory=list)
    launched_at: float = 0.0
    completed_at: float = 0.0

    @property
    def outputs(self):
        reason_name = native.finish_reason_name
        return [StepOutput(request, token if token >= 0 else None, reason_name(code) if code else None)
                for request, token, code in zip(self.batch, self.tokens, self.finish_codes)]

    @property
    def finished(self):
        return [output for output in self.outputs if output.finish_reason is not None]


class Scheduler:
    def __init__(self, engine, policy):
        self.engine = engine
        self.policy = policy
        self.waiting = []
        self.running = []
        self._by_id = {}

    @property
    def num_waiting(self):
        return len(self.waiting)

    @property
    def num_running(self):
        return len(self.running)

    def has_work(self):
        return bool(self.waiting or self.running)

    def get(self, request_id):
        return self._by_id.get(request_id)

    def all_requests(self):
        return list(self.running) + list(self.waiting)

    def add(self, request):
        if request.request_id in self._by_id:
            raise ValueError(f"request {request.request_id} is already scheduled")
        request.status = RequestStatus.WAITING
        bisect.insort(self.waiting, request, key=by_arrival)
        self._by_id[request.request_id] = request

    def finish(self, request_id, status):
        request = self._by_id.pop(request_id, None)
        if request is None:
            return None
        if request in self.running:
            self.running.remove(request)
        else:
            self.waiting.remove(request)
        request.status = status
        return request

    def cancel(self, request_id):
        return self.finish(request_id, RequestStatus.FINISHED_CANCELLED)

    def running_by_owner(self):
        return Counter(request.owner for request in self.running)

    def newest_running(self):
        if not self.running:
            return None
        counts = self.running_by_owner()
        return max(self.running, key=lambda request: (counts[request.owner], by_arrival(request)))

    def next_candidate(self, counts):
        return min(self.waiting, key=lambda request: (counts[request.owner],
                                                      request.status is not RequestStatus.PREEMPTED,
                                                      by_arrival(request)))

    def make_room_for(self, candidate, result, counts):
        if counts[candidate.owner] > 0 or not counts or max(counts.values()) < 2:
            return False
        victim = self.preempt_newest()
        if victim is None:
            return False
        result.preempted.append(victim)
        return True

    def preempt_newest(self):
        if len(self.running) < 2:
            return None
        victim = self.newest_running()
        self.engine.preempt_request(victim)
        self.running.remove(victim)
        victim.status = RequestStatus.PREEMPTED
        victim.num_preemptions += 1
        bisect.insort(self.waiting, victim, key=by_arrival)
        return victim

    def admit(self, result):
        if not self.waiting:
            return
        counts = self.running_by_owner()
        while self.waiting:
            request = self.next_candidate(counts)
            if request in result.preempted:
                return
            if len(self.running) >= self.policy.max_running:
                if not self.make_room_for(request, result, counts):
                    return
                counts = self.running_by_owner()
            candidate = list(self.running)
            bisect.insort(candidate, request, key=by_arrival)
            plan = self.engine.plan_step(candidate)
            if plan.num_scheduled_tokens[candidate.index(request)] == 0:
                return
            reserve = self.policy.watermark_pages if self.running else 0
            if plan.num_new_pages + reserve > plan.num_free_pages:
                if self.running:
                    return
                result.failed.append(self.finish(request.request_id, RequestStatus.FINISHED_FAILED))
                continue
            self.waiting.remove(request)
            request.status = RequestStatus.RUNNING
            self.running = candidate
            counts[request.owner] += 1
            result.admitted.append(request)

    def launch(self, result=None):
        result = StepResult() if result is None else result
        self.admit(result)
        while self.running:
            batch = list(self.running)
            try:
                self.engine.launch(batch)
            except GlmrtError as exc:
                if exc.status_name != "OUT_OF_PAGES":
                    raise
                self.relieve_page_pressure(result)
                continue
            result.batch = batch
            break
        return result

    def complete(self, result):
        result.tokens, result.finish_codes = self.engine.complete()
        self.retire_finished(result)
        return result

    def complete_and_relaunch(self, result):
        result.tokens, result.finish_codes, relaunched = self.engine.complete_and_relaunch()
        self.retire_finished(result)
        if not relaunched:
            return None
        return StepResult(batch=[request for request, code in zip(result.batch, result.finish_codes) if not code])

    def step(self):
        result = self.launch()
        if result.batch:
            self.complete(result)
        return result

    def relieve_page_pressure(self, result):
        victim = self.preempt_newest()
        if victim is not None:
            result.preempted.append(victim)
            return
        lone = self.running[0]
        result.failed.append(self.finish(lone.request_id, RequestStatus.FINISHED_FAILED))

    def retire_finished(self, result):
        if not any(result.finish_codes):
            return
        reason_name = native.finish_reason_name
        for index, code in enumerate(result.finish_codes):
            if code:
                request = result.batch[index]
                self.finish(request.request_id, FINISH_REASON_TO_STATUS[reason_name(code)])
                result.finished_requests.append(request)
