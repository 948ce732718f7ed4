import pytest

from glmrt.scheduler import Scheduler, SchedulerConfig, Sequence, SequenceProgress, SequenceStatus

PAGE = 4


def make_scheduler(max_batch=4, max_tokens_per_step=16, kv_num_pages=32, watermark_pages=0):
    return Scheduler(SchedulerConfig(max_batch=max_batch, max_tokens_per_step=max_tokens_per_step, kv_page_size=PAGE,
                                     kv_num_pages=kv_num_pages, watermark_pages=watermark_pages))


def add(scheduler, seq_id, prompt_len, max_new_tokens=8):
    seq = Sequence(seq_id=seq_id, num_prompt_tokens=prompt_len, max_new_tokens=max_new_tokens)
    scheduler.add(seq)
    return seq


def step_results(plan, finish=None):
    finish = finish or {}
    tokens, codes, progress = [], [], []
    for seq, chunk in zip(plan.batch, plan.num_scheduled_tokens):
        computed = seq.num_computed_tokens + chunk
        reaches_end = computed == seq.num_tokens
        num_tokens = seq.num_tokens + (1 if reaches_end else 0)
        tokens.append(1000 + seq.seq_id if reaches_end else -1)
        codes.append(finish.get(seq.seq_id, 0))
        progress.append(SequenceProgress(num_tokens, computed, -(-computed // PAGE)))
    return tokens, codes, progress


def run_step(scheduler, free_pages, finish=None):
    plan = scheduler.schedule(free_pages)
    outputs = scheduler.update(plan.batch, *step_results(plan, finish))
    return plan, outputs


def free_pages_of(scheduler, total):
    return total - scheduler.num_pages_held


def test_schedule_admits_waiting_requests_up_to_max_batch():
    scheduler = make_scheduler(max_batch=2)
    for seq_id in range(3):
        add(scheduler, seq_id, prompt_len=4)
    plan = scheduler.schedule(32)
    assert [seq.seq_id for seq in plan.batch] == [0, 1]
    assert [seq.seq_id for seq in plan.admitted] == [0, 1]
    assert [seq.seq_id for seq in scheduler.waiting] == [2]
    assert all(seq.status is SequenceStatus.RUNNING for seq in plan.batch)


def test_prefill_chunks_share_the_token_budget_in_arrival_order():
    scheduler = make_scheduler(max_tokens_per_step=10)
    add(scheduler, 0, prompt_len=7)
    add(scheduler, 1, prompt_len=7)
    add(scheduler, 2, prompt_len=7)
    plan = scheduler.schedule(32)
    assert [seq.seq_id for seq in plan.batch] == [0, 1]
    assert plan.num_scheduled_tokens == [7, 3]
    assert plan.total_scheduled_tokens == 10
    assert [seq.seq_id for seq in scheduler.waiting] == [2]


def test_decoding_requests_take_one_token_each_before_prefill_chunks():
    scheduler = make_scheduler(max_tokens_per_step=8)
    add(scheduler, 0, prompt_len=3)
    run_step(scheduler, 32)
    add(scheduler, 1, prompt_len=20)
    plan = scheduler.schedule(32)
    assert [seq.seq_id for seq in plan.batch] == [0, 1]
    assert plan.num_scheduled_tokens == [1, 7]


def test_partial_prefill_continues_over_several_steps_before_sampling():
    scheduler = make_scheduler(max_tokens_per_step=5)
    seq = add(scheduler, 0, prompt_len=12)
    chunks = []
    emitted = []
    for _ in range(4):
        plan, outputs = run_step(scheduler, free_pages_of(scheduler, 32))
        chunks.append(plan.num_scheduled_tokens[0])
        emitted.append(outputs[0].token)
    assert chunks == [5, 5, 2, 1]
    assert emitted == [None, None, 1000, 1000]
    assert seq.num_computed_tokens == 13 and seq.num_tokens == 14
    assert seq.num_pages == 4


def test_admission_stops_at_the_first_request_that_does_not_fit_the_free_pages():
    scheduler = make_scheduler(max_tokens_per_step=64)
    add(scheduler, 0, prompt_len=16)
    add(scheduler, 1, prompt_len=16)
    add(scheduler, 2, prompt_len=1)
    plan = scheduler.schedule(6)
    assert [seq.seq_id for seq in plan.batch] == [0]
    assert [seq.seq_id for seq in scheduler.waiting] == [1, 2]
    assert plan.preempted == [] and plan.failed == []


def test_watermark_keeps_pages_free_when_admitting_beside_running_requests():
    scheduler = make_scheduler(max_tokens_per_step=64, watermark_pages=2)
    add(scheduler, 0, prompt_len=8)
    add(scheduler, 1, prompt_len=8)
    plan = scheduler.schedule(5)
    assert [seq.seq_id for seq in plan.batch] == [0]
    plan = scheduler.schedule(6)
    assert [seq.seq_id for seq in plan.batch] == [0, 1]


def test_first_request_is_admitted_without_watermark_when_nothing_runs():
    scheduler = make_scheduler(max_tokens_per_step=64, watermark_pages=8)
    add(scheduler, 0, prompt_len=8)
    plan = scheduler.schedule(2)
    assert [seq.seq_id for seq in plan.batch] == [0]


def test_running_requests_that_outgrow_free_pages_preempt_the_newest_first():
    scheduler = make_scheduler(max_tokens_per_step=64, kv_num_pages=6)
    for seq_id in range(3):
        add(scheduler, seq_id, prompt_len=8)
    run_step(scheduler, 6)
    assert scheduler.num_pages_held == 6
    plan = scheduler.schedule(0)
    assert [seq.seq_id for seq in plan.preempted] == [2]
    assert [seq.seq_id for seq in plan.batch] == [0, 1]
    assert plan.num_scheduled_tokens == [1, 1]
    preempted = plan.preempted[0]
    assert preempted.status is SequenceStatus.PREEMPTED
    assert preempted.num_computed_tokens == 0 and preempted.num_pages == 0
    assert preempted.num_tokens == 9 and preempted.num_preemptions == 1


def test_preempted_request_rejoins_ahead_of_later_arrivals_and_recomputes_every_known_token():
    scheduler = make_scheduler(max_tokens_per_step=64, kv_num_pages=8)
    add(scheduler, 0, prompt_len=8)
    add(scheduler, 1, prompt_len=8)
    run_step(scheduler, 8)
    add(scheduler, 2, prompt_len=4)
    plan = scheduler.schedule(0)
    assert [seq.seq_id for seq in plan.preempted] == [1]
    assert [seq.seq_id for seq in scheduler.waiting] == [1, 2]
    scheduler.update(plan.batch, *step_results(plan, finish={0: 2}))
    plan = scheduler.schedule(8)
    assert [seq.seq_id for seq in plan.batch] == [1, 2]
    assert plan.num_scheduled_tokens == [9, 4]


def test_preempt_newest_keeps_a_lone_running_request():
    scheduler = make_scheduler()
    add(scheduler, 0, prompt_len=4)
    add(scheduler, 1, prompt_len=4)
    scheduler.schedule(32)
    assert scheduler.preempt_newest().seq_id == 1
    assert scheduler.preempt_newest() is None
    assert [seq.seq_id for seq in scheduler.running] == [0]


def test_lone_waiting_request_whose_first_chunk_cannot_fit_the_whole_pool_fails():
    scheduler = make_scheduler(max_tokens_per_step=64, kv_num_pages=2)
    add(scheduler, 0, prompt_len=20)
    add(scheduler, 1, prompt_len=4)
    plan = scheduler.schedule(2)
    assert [seq.seq_id for seq in plan.failed] == [0]
    assert plan.failed[0].status is SequenceStatus.FINISHED_FAILED
    assert [seq.seq_id for seq in plan.batch] == [1]
    assert scheduler.get(0) is None


def test_update_retires_finished_requests_with_their_reason():
    scheduler = make_scheduler()
    add(scheduler, 0, prompt_len=4)
    add(scheduler, 1, prompt_len=4)
    plan, outputs = run_step(scheduler, 32, finish={0: 1, 1: 2})
    assert [(output.seq.seq_id, output.token, output.finish_reason) for output in outputs] == [
        (0, 1000, "stop"), (1, 1001, "length")]
    assert plan.batch[0].status is SequenceStatus.FINISHED_STOPPED
    assert plan.batch[1].status is SequenceStatus.FINISHED_LENGTH
    assert not scheduler.has_work()
    assert scheduler.num_pages_held == 0


def test_cancel_removes_waiting_and_running_requests_and_ignores_unknown_ids():
    scheduler = make_scheduler(max_batch=1)
    add(scheduler, 0, prompt_len=4)
    add(scheduler, 1, prompt_len=4)
    scheduler.schedule(32)
    assert scheduler.cancel(1).status is SequenceStatus.FINISHED_CANCELLED
    assert scheduler.cancel(0).status is SequenceStatus.FINISHED_CANCELLED
    assert scheduler.cancel(0) is None
    assert scheduler.cancel(99) is None
    assert not scheduler.has_work()


def test_adding_a_sequence_id_twice_is_refused():
    scheduler = make_scheduler()
    add(scheduler, 0, prompt_len=4)
    with pytest.raises(ValueError):
        add(scheduler, 0, prompt_len=4)


def test_finished_status_predicate_follows_the_lifecycle_order():
    assert not SequenceStatus.WAITING.is_finished
    assert not SequenceStatus.PREEMPTED.is_finished
    assert SequenceStatus.FINISHED_STOPPED.is_finished
    assert SequenceStatus.FINISHED_CANCELLED.is_finished


def test_pressured_pool_completes_every_request_and_ends_with_no_pages_held():
    total_pages = 10
    scheduler = make_scheduler(max_batch=4, max_tokens_per_step=16, kv_num_pages=total_pages)
    seqs = [add(scheduler, seq_id, prompt_len=6, max_new_tokens=10) for seq_id in range(6)]
    generated = {seq.seq_id: 0 for seq in seqs}
    num_preemptions = 0
    for _ in range(500):
        if not scheduler.has_work():
            break
        plan = scheduler.schedule(free_pages_of(scheduler, total_pages))
        num_preemptions += len(plan.preempted)
        assert plan.failed == []
        assert len(plan.batch) <= 4 and plan.total_scheduled_tokens <= 16
        tokens, codes, progress = step_results(plan)
        for index, seq in enumerate(plan.batch):
            if tokens[index] >= 0:
                generated[seq.seq_id] += 1
                if generated[seq.seq_id] == seq.max_new_tokens:
                    codes[index] = 2
        assert sum(item.num_pages for item in progress) <= total_pages
        scheduler.update(plan.batch, tokens, codes, progress)
    assert not scheduler.has_work()
    assert num_preemptions > 0
    assert generated == {seq.seq_id: 10 for seq in seqs}
    assert all(seq.status is SequenceStatus.FINISHED_LENGTH for seq in seqs)
    assert scheduler.num_pages_held == 0


def test_preemption_continues_newest_first_until_the_remaining_batch_fits():
    scheduler = make_scheduler(max_tokens_per_step=64, kv_num_pages=3)
    for seq_id in range(3):
        add(scheduler, seq_id, prompt_len=4)
    run_step(scheduler, 3)
    plan = scheduler.schedule(0)
    assert [seq.seq_id for seq in plan.preempted] == [2, 1]
    assert [seq.seq_id for seq in plan.batch] == [0]
    assert [seq.seq_id for seq in scheduler.waiting] == [1, 2]
