import bisect
import enum
from dataclasses import dataclass, field


class SequenceStatus(enum.IntEnum):
    WAITING = 0
    RUNNING = 1
    PREEMPTED = 2
    FINISHED_STOPPED = 3
    FINISHED_LENGTH = 4
    FINISHED_CANCELLED = 5
    FINISHED_FAILED = 6

    @property
    def is_finished(self):
        return self > SequenceStatus.PREEMPTED


ENGINE_FINISH_TO_STATUS = {1: SequenceStatus.FINISHED_STOPPED, 2: SequenceStatus.FINISHED_LENGTH}
STATUS_TO_FINISH_REASON = {SequenceStatus.FINISHED_STOPPED: "stop", SequenceStatus.FINISHED_LENGTH: "length"}


def finish_reason_of(status):
    return STATUS_TO_FINISH_REASON.get(status)


@dataclass(frozen=True)
class SchedulerConfig:
    max_batch: int
    max_tokens_per_step: int
    kv_page_size: int
    kv_num_pages: int
    watermark_pages: int = 0

    def pages_for_tokens(self, num_tokens):
        return -(-num_tokens // self.kv_page_size)


@dataclass(eq=False)
class Sequence:
    seq_id: int
    num_prompt_tokens: int
    max_new_tokens: int
    handle: object = None
    num_tokens: int = 0
    num_computed_tokens: int = 0
    num_pages: int = 0
    num_preemptions: int = 0
    status: SequenceStatus = SequenceStatus.WAITING

    def __post_init__(self):
        if self.num_tokens == 0:
            self.num_tokens = self.num_prompt_tokens

    @property
    def num_pending_tokens(self):
        return self.num_tokens - self.num_computed_tokens

    @property
    def num_generated_tokens(self):
        return self.num_tokens - self.num_prompt_tokens

    @property
    def is_decoding(self):
        return self.num_pending_tokens <= 1


@dataclass(frozen=True)
class SequenceProgress:
    num_tokens: int
    num_computed_tokens: int
    num_pages: int


@dataclass
class StepPlan:
    batch: list = field(default_factory=list)
    num_scheduled_tokens: list = field(default_factory=list)
    admitted: list = field(default_factory=list)
    preempted: list = field(default_factory=list)
    failed: list = field(default_factory=list)

    @property
    def total_scheduled_tokens(self):
        return sum(self.num_scheduled_tokens)


@dataclass(frozen=True)
class StepOutput:
    seq: Sequence
    token: int | None
    finish_reason: str | None


def by_arrival(seq):
    return seq.seq_id


class Scheduler:
    def __init__(self, config):
        self.config = config
        self.waiting = []
        self.running = []
        self._seq_by_id = {}

    @property
    def num_waiting(self):
        return len(self.waiting)

    @property
    def num_running(self):
        return len(self.running)

    @property
    def num_pages_held(self):
        return sum(seq.num_pages for seq in self.running)

    def has_work(self):
        return bool(self.waiting or self.running)

    def get(self, seq_id):
        return self._seq_by_id.get(seq_id)

    def all_sequences(self):
        return list(self.running) + list(self.waiting)

    def add(self, seq):
        if seq.seq_id in self._seq_by_id:
            raise ValueError(f"sequence {seq.seq_id} is already scheduled")
        seq.status = SequenceStatus.WAITING
        bisect.insort(self.waiting, seq, key=by_arrival)
        self._seq_by_id[seq.seq_id] = seq

    def finish(self, seq_id, status):
        seq = self._seq_by_id.pop(seq_id, None)
        if seq is None:
            return None
        if seq in self.running:
            self.running.remove(seq)
        else:
            self.waiting.remove(seq)
        seq.status = status
        return seq

    def cancel(self, seq_id):
        return self.finish(seq_id, SequenceStatus.FINISHED_CANCELLED)

    def plan_chunks(self, seqs):
        num_decoding = sum(1 for seq in seqs if seq.is_decoding)
        prefill_budget = max(0, self.config.max_tokens_per_step - num_decoding)
        chunks = []
        for seq in seqs:
            if seq.is_decoding:
                chunks.append(min(1, seq.num_pending_tokens))
                continue
            chunk = min(seq.num_pending_tokens, prefill_budget)
            prefill_budget -= chunk
            chunks.append(chunk)
        return chunks

    def new_pages_for_chunk(self, seq, chunk):
        needed = self.config.pages_for_tokens(seq.num_computed_tokens + chunk)
        return max(0, needed - seq.num_pages)

    def pages_needed(self, seqs, chunks):
        return sum(self.new_pages_for_chunk(seq, chunk) for seq, chunk in zip(seqs, chunks))

    def preempt(self, seq):
        self.running.remove(seq)
        seq.status = SequenceStatus.PREEMPTED
        seq.num_computed_tokens = 0
        seq.num_pages = 0
        seq.num_preemptions += 1
        bisect.insort(self.waiting, seq, key=by_arrival)
        return seq

    def newest_running(self):
        return max(self.running, key=by_arrival) if self.running else None

    def preempt_newest(self):
        if len(self.running) < 2:
            return None
        return self.preempt(self.newest_running())

    def schedule(self, num_free_pages):
        plan = StepPlan()
        free_pages = self._fit_running(num_free_pages, plan)
        self._admit(plan, free_pages)
        plan.batch = list(self.running)
        plan.num_scheduled_tokens = self.plan_chunks(plan.batch)
        return plan

    def _fit_running(self, num_free_pages, plan):
        while True:
            demand = self.pages_needed(self.running, self.plan_chunks(self.running))
            if demand <= num_free_pages:
                return num_free_pages
            victim = self.newest_running()
            num_free_pages += victim.num_pages
            if len(self.running) == 1:
                plan.failed.append(self.finish(victim.seq_id, SequenceStatus.FINISHED_FAILED))
            else:
                plan.preempted.append(self.preempt(victim))

    def _admit(self, plan, num_free_pages):
        while self.waiting and len(self.running) < self.config.max_batch:
            seq = self.waiting[0]
            if seq in plan.preempted:
                return
            candidate = sorted(self.running + [seq], key=by_arrival)
            chunks = self.plan_chunks(candidate)
            if chunks[candidate.index(seq)] == 0:
                return
            demand = self.pages_needed(candidate, chunks)
            reserve = self.config.watermark_pages if self.running else 0
            if demand + reserve > num_free_pages:
                if self.running:
                    return
                plan.failed.append(self.finish(seq.seq_id, SequenceStatus.FINISHED_FAILED))
                continue
            self.waiting.pop(0)
            seq.status = SequenceStatus.RUNNING
            self.running = candidate
            plan.admitted.append(seq)

    def update(self, batch, tokens, engine_finish_codes, progress):
        outputs = []
        for seq, token, code, seq_progress in zip(batch, tokens, engine_finish_codes, progress):
            seq.num_tokens = seq_progress.num_tokens
            seq.num_computed_tokens = seq_progress.num_computed_tokens
            seq.num_pages = seq_progress.num_pages
            status = ENGINE_FINISH_TO_STATUS.get(int(code))
            if status is not None and seq.seq_id in self._seq_by_id:
                self.finish(seq.seq_id, status)
                seq.num_pages = 0
            outputs.append(StepOutput(seq, int(token) if token >= 0 else None, finish_reason_of(status)))
        return outputs
