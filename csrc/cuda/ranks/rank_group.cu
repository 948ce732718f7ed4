#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda_check.cuh"
#include "rank_group.cuh"

#define GLMRT_RANK_PENDING (-1000)

static void glmrt_group_release_peer_waits(glmrt_cuda_group *group)
{
    if (group->peer_abort != nullptr) {
        __atomic_store_n(group->peer_abort, 1, __ATOMIC_RELEASE);
    }
}

static glmrt_status glmrt_rank_run(glmrt_cuda_group *group, int32_t rank, const glmrt_rank_work *work)
{
    glmrt_cuda_state *st = group->ranks[rank];
    glmrt_status status = GLMRT_OK;
    if (work->job == GLMRT_RANK_JOB_LOAD) {
        status = glmrt_cuda_rank_load(st);
    } else if (work->job == GLMRT_RANK_JOB_FORWARD) {
        status = glmrt_cuda_forward_packed(st, work->counts, work->host_inputs, rank == 0 ? work->out_logits : nullptr,
                                           rank == 0 ? work->out_sampled : nullptr);
    } else if (work->job == GLMRT_RANK_JOB_CAPTURE) {
        status = glmrt_cuda_decode_graphs_capture(st, work->counts, work->host_inputs);
    }
    if (status != GLMRT_OK) {
        int32_t nobody = -1;
        __atomic_compare_exchange_n(&group->failing_rank, &nobody, rank, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
        __atomic_store_n(&group->step_abandoned, 1, __ATOMIC_RELEASE);
        glmrt_group_release_peer_waits(group);
    }
    return status;
}

static void *glmrt_rank_thread(void *arg)
{
    glmrt_rank_slot *slot = (glmrt_rank_slot *)arg;
    glmrt_cuda_group *group = slot->group;
    int32_t rank = slot->rank;
    uint64_t seen = 0;
    for (;;) {
        pthread_mutex_lock(&group->lock);
        while (group->generation == seen) {
            pthread_cond_wait(&group->work_ready, &group->lock);
        }
        seen = group->generation;
        glmrt_rank_work work = group->work;
        pthread_mutex_unlock(&group->lock);
        if (work.job == GLMRT_RANK_JOB_STOP) {
            return nullptr;
        }
        glmrt_status status = glmrt_rank_run(group, rank, &work);
        pthread_mutex_lock(&group->lock);
        group->rank_status[rank] = status;
        group->ranks_done += 1;
        pthread_cond_broadcast(&group->work_done);
        pthread_mutex_unlock(&group->lock);
    }
}

static void glmrt_group_release_graphs(glmrt_cuda_group *group)
{
    for (int32_t r = 0; r < group->num_ranks; ++r) {
        glmrt_cuda_state *st = group->ranks[r];
        if (st != nullptr && st->graphs.count > 0 && cudaSetDevice(st->device) == cudaSuccess) {
            glmrt_cuda_decode_graphs_release(st);
        }
        cudaGetLastError();
    }
}

static void glmrt_group_abort_comms(glmrt_cuda_group *group)
{
    if (!group->comms_live || group->comms_aborted) {
        return;
    }
    group->comms_aborted = 1;
    glmrt_group_release_peer_waits(group);
    glmrt_group_release_graphs(group);
    for (int32_t r = 0; r < group->num_ranks; ++r) {
        if (group->comms[r] != nullptr) {
            ncclCommAbort(group->comms[r]);
        }
    }
}

static int32_t glmrt_group_only_waiting(const glmrt_cuda_group *group)
{
    for (int32_t r = 0; r < group->num_ranks; ++r) {
        if (group->rank_status[r] == GLMRT_RANK_PENDING && !__atomic_load_n(&group->rank_waiting[r], __ATOMIC_ACQUIRE)) {
            return 0;
        }
    }
    return 1;
}

static void glmrt_group_wait(glmrt_cuda_group *group)
{
    pthread_mutex_lock(&group->lock);
    while (group->ranks_done < group->num_ranks) {
        struct timespec deadline;
        clock_gettime(CLOCK_REALTIME, &deadline);
        deadline.tv_nsec += 100 * 1000 * 1000;
        if (deadline.tv_nsec >= 1000 * 1000 * 1000) {
            deadline.tv_sec += 1;
            deadline.tv_nsec -= 1000 * 1000 * 1000;
        }
        pthread_cond_timedwait(&group->work_done, &group->lock, &deadline);
        if (group->ranks_done < group->num_ranks && __atomic_load_n(&group->step_abandoned, __ATOMIC_ACQUIRE) &&
            glmrt_group_only_waiting(group) && !group->comms_aborted) {
            pthread_mutex_unlock(&group->lock);
            glmrt_group_abort_comms(group);
            pthread_mutex_lock(&group->lock);
        }
    }
    pthread_mutex_unlock(&group->lock);
}

static glmrt_status glmrt_group_report(glmrt_cuda_group *group, int32_t rank, glmrt_status status)
{
    glmrt_cuda_state *st = group->ranks[rank];
    if (group->num_ranks == 1) {
        return status;
    }
    return glmrt_error_set(&group->engine->error, status, "GPU %d of %d (device %d): %s", rank, group->num_ranks,
                           st != nullptr ? st->device : -1, st != nullptr ? st->rank_error.message : "no state");
}

static void glmrt_group_post(glmrt_cuda_group *group, const glmrt_rank_work *work)
{
    pthread_mutex_lock(&group->lock);
    group->work = *work;
    group->ranks_done = 0;
    __atomic_store_n(&group->step_abandoned, 0, __ATOMIC_RELEASE);
    __atomic_store_n(&group->failing_rank, -1, __ATOMIC_RELEASE);
    for (int32_t r = 0; r < group->num_ranks; ++r) {
        group->rank_status[r] = GLMRT_RANK_PENDING;
        __atomic_store_n(&group->rank_waiting[r], 0, __ATOMIC_RELEASE);
    }
    group->generation += 1;
    pthread_cond_broadcast(&group->work_ready);
    pthread_mutex_unlock(&group->lock);
}

static glmrt_status glmrt_group_collect(glmrt_cuda_group *group, int32_t job)
{
    glmrt_group_wait(group);
    int32_t failed = __atomic_load_n(&group->failing_rank, __ATOMIC_ACQUIRE);
    if (failed < 0) {
        return GLMRT_OK;
    }
    if (job == GLMRT_RANK_JOB_FORWARD || job == GLMRT_RANK_JOB_CAPTURE) {
        glmrt_group_abort_comms(group);
    }
    return glmrt_group_report(group, failed, group->rank_status[failed]);
}

static glmrt_status glmrt_group_dispatch(glmrt_cuda_group *group, const glmrt_rank_work *work)
{
    glmrt_group_post(group, work);
    return glmrt_group_collect(group, work->job);
}

static glmrt_status glmrt_group_start_threads(glmrt_cuda_group *group)
{
    glmrt_error *error = &group->engine->error;
    if (pthread_mutex_init(&group->lock, nullptr) != 0) {
        return glmrt_error_set(error, GLMRT_ERR_BACKEND, "cannot create the GPU worker lock");
    }
    if (pthread_cond_init(&group->work_ready, nullptr) != 0) {
        pthread_mutex_destroy(&group->lock);
        return glmrt_error_set(error, GLMRT_ERR_BACKEND, "cannot create the GPU worker signal");
    }
    if (pthread_cond_init(&group->work_done, nullptr) != 0) {
        pthread_cond_destroy(&group->work_ready);
        pthread_mutex_destroy(&group->lock);
        return glmrt_error_set(error, GLMRT_ERR_BACKEND, "cannot create the GPU worker signal");
    }
    group->sync_ready = 1;
    for (int32_t r = 0; r < group->num_ranks; ++r) {
        group->slots[r].group = group;
        group->slots[r].rank = r;
        int result = pthread_create(&group->threads[r], nullptr, glmrt_rank_thread, &group->slots[r]);
        if (result != 0) {
            return glmrt_error_set(error, GLMRT_ERR_BACKEND, "cannot start the worker thread of GPU %d: %s", r,
                                   strerror(result));
        }
        group->threads_started += 1;
    }
    return GLMRT_OK;
}

static void glmrt_group_stop_threads(glmrt_cuda_group *group)
{
    if (group->threads_started > 0) {
        pthread_mutex_lock(&group->lock);
        group->work.job = GLMRT_RANK_JOB_STOP;
        group->generation += 1;
        pthread_cond_broadcast(&group->work_ready);
        pthread_mutex_unlock(&group->lock);
        for (int32_t r = 0; r < group->threads_started; ++r) {
            pthread_join(group->threads[r], nullptr);
        }
        group->threads_started = 0;
    }
    if (group->sync_ready) {
        pthread_cond_destroy(&group->work_done);
        pthread_cond_destroy(&group->work_ready);
        pthread_mutex_destroy(&group->lock);
        group->sync_ready = 0;
    }
}

static glmrt_status glmrt_group_load(glmrt_cuda_group *group)
{
    if (group->num_ranks == 1) {
        return glmrt_cuda_rank_load(group->ranks[0]);
    }
    GLMRT_TRY(glmrt_group_start_threads(group));
    glmrt_rank_work work;
    memset(&work, 0, sizeof(work));
    work.job = GLMRT_RANK_JOB_LOAD;
    return glmrt_group_dispatch(group, &work);
}

static glmrt_status glmrt_group_settle(glmrt_cuda_group *group, ncclResult_t result, ncclResult_t ended,
                                       const char *what)
{
    glmrt_error *error = &group->engine->error;
    if (result == ncclSuccess) {
        result = ended;
    }
    if (result != ncclSuccess) {
        return glmrt_error_set(error, GLMRT_ERR_BACKEND, "the NCCL warm-up %s failed: %s", what,
                               ncclGetErrorString(result));
    }
    for (int32_t r = 0; r < group->num_ranks; ++r) {
        GLMRT_CUDA_TRY(error, cudaSetDevice(group->ranks[r]->device));
        GLMRT_CUDA_TRY(error, cudaStreamSynchronize(group->ranks[r]->stream));
    }
    return GLMRT_OK;
}

static glmrt_status glmrt_group_all_reduce_once(glmrt_cuda_group *group, float *const *buffers, int64_t count)
{
    ncclResult_t result = ncclGroupStart();
    for (int32_t r = 0; r < group->num_ranks && result == ncclSuccess; ++r) {
        glmrt_cuda_state *st = group->ranks[r];
        result = ncclAllReduce(buffers[r], buffers[r], (size_t)count, ncclFloat, ncclSum, st->comm, st->stream);
    }
    return glmrt_group_settle(group, result, ncclGroupEnd(), "all-reduce");
}

static glmrt_status glmrt_group_gather_once(glmrt_cuda_group *group, float *const *buffers)
{
    glmrt_cuda_state *first = group->ranks[0];
    ncclResult_t result = ncclGroupStart();
    for (int32_t r = 1; r < group->num_ranks && result == ncclSuccess; ++r) {
        glmrt_cuda_state *st = group->ranks[r];
        result = ncclSend(buffers[r], 1, ncclFloat, 0, st->comm, st->stream);
        if (result == ncclSuccess) {
            result = ncclRecv(buffers[0] + r, 1, ncclFloat, r, first->comm, first->stream);
        }
    }
    return glmrt_group_settle(group, result, ncclGroupEnd(), "gather of the logits");
}

static int64_t glmrt_group_sum_capacity(const glmrt_cuda_group *group)
{
    const glmrt_cuda_dims *d = &group->ranks[0]->dims;
    return (int64_t)d->max_tokens * d->hidden;
}

static glmrt_status glmrt_group_warm_up(glmrt_cuda_group *group)
{
    glmrt_error *error = &group->engine->error;
    int64_t largest = glmrt_group_sum_capacity(group);
    float *buffers[GLMRT_MAX_DEVICES];
    memset(buffers, 0, sizeof(buffers));
    glmrt_status status = GLMRT_OK;
    for (int32_t r = 0; r < group->num_ranks && status == GLMRT_OK; ++r) {
        cudaError_t result = cudaSetDevice(group->ranks[r]->device);
        if (result == cudaSuccess) {
            result = cudaMalloc((void **)&buffers[r], (size_t)largest * sizeof(float));
        }
        if (result == cudaSuccess) {
            result = cudaMemset(buffers[r], 0, (size_t)largest * sizeof(float));
        }
        if (result != cudaSuccess) {
            cudaGetLastError();
            status = glmrt_error_set(error, GLMRT_ERR_OUT_OF_MEMORY,
                                     "cannot set up the NCCL warm-up buffer of %lld bytes on device %d: %s",
                                     (long long)largest * 4, group->ranks[r]->device, cudaGetErrorString(result));
        }
    }
    if (status == GLMRT_OK) {
        status = glmrt_group_all_reduce_once(group, buffers, 1);
    }
    if (status == GLMRT_OK) {
        status = glmrt_group_all_reduce_once(group, buffers, largest);
    }
    if (status == GLMRT_OK) {
        status = glmrt_group_gather_once(group, buffers);
    }
    for (int32_t r = 0; r < group->num_ranks; ++r) {
        if (buffers[r] != nullptr) {
            cudaSetDevice(group->ranks[r]->device);
            cudaFree(buffers[r]);
        }
    }
    return status;
}

static glmrt_status glmrt_group_connect_peers(glmrt_cuda_group *group, const int32_t *devices)
{
    glmrt_cuda_peer_reduce *peers[GLMRT_MAX_DEVICES];
    cudaStream_t streams[GLMRT_MAX_DEVICES];
    for (int32_t r = 0; r < group->num_ranks; ++r) {
        peers[r] = &group->ranks[r]->peer;
        streams[r] = group->ranks[r]->stream;
    }
    glmrt_cuda_peer_group peer_group;
    peer_group.num_ranks = group->num_ranks;
    peer_group.devices = devices;
    peer_group.ranks = peers;
    peer_group.capacity = glmrt_group_sum_capacity(group);
    peer_group.streams = streams;
    peer_group.bf16_partials = group->all_reduce == GLMRT_ALL_REDUCE_PEER_BF16;
    return glmrt_cuda_peer_reduce_open(&peer_group, &group->peer_abort, &group->engine->error);
}

static glmrt_status glmrt_group_all_gather_once(glmrt_cuda_group *group, int64_t count)
{
    ncclResult_t result = ncclGroupStart();
    for (int32_t r = 0; r < group->num_ranks && result == ncclSuccess; ++r) {
        glmrt_cuda_state *st = group->ranks[r];
        result = ncclAllGather(st->ordered.rows + (int64_t)r * count, st->ordered.rows, (size_t)count, ncclFloat,
                               st->comm, st->stream);
    }
    return glmrt_group_settle(group, result, ncclGroupEnd(), "all-gather");
}

static glmrt_status glmrt_group_prepare_ordered_sums(glmrt_cuda_group *group)
{
    int64_t capacity = glmrt_group_sum_capacity(group);
    for (int32_t r = 0; r < group->num_ranks; ++r) {
        glmrt_cuda_state *st = group->ranks[r];
        GLMRT_TRY(glmrt_cuda_ordered_gather_allocate(&st->ordered, st->device, group->num_ranks, capacity,
                                                     &group->engine->error));
        GLMRT_CUDA_TRY(&group->engine->error, cudaMemset(st->ordered.rows, 0, (size_t)st->ordered.bytes));
    }
    GLMRT_TRY(glmrt_group_all_gather_once(group, 1));
    return glmrt_group_all_gather_once(group, capacity);
}

static glmrt_status glmrt_group_choose_all_reduce(glmrt_cuda_group *group, const int32_t *devices)
{
    group->all_reduce = group->engine->options.all_reduce;
    if (group->all_reduce != GLMRT_ALL_REDUCE_AUTO) {
        return GLMRT_OK;
    }
    int32_t from = -1;
    int32_t to = -1;
    GLMRT_TRY(glmrt_cuda_peer_unreachable(devices, group->num_ranks, &from, &to, &group->engine->error));
    group->all_reduce = from < 0 ? GLMRT_ALL_REDUCE_PEER : GLMRT_ALL_REDUCE_NCCL;
    return GLMRT_OK;
}

static glmrt_status glmrt_group_connect(glmrt_cuda_group *group)
{
    if (group->num_ranks == 1) {
        return GLMRT_OK;
    }
    int devices[GLMRT_MAX_DEVICES];
    for (int32_t r = 0; r < group->num_ranks; ++r) {
        devices[r] = group->ranks[r]->device;
    }
    ncclResult_t result = ncclCommInitAll(group->comms, group->num_ranks, devices);
    if (result != ncclSuccess) {
        return glmrt_error_set(&group->engine->error, GLMRT_ERR_BACKEND, "NCCL could not connect %d GPUs from device %d: %s",
                               group->num_ranks, devices[0], ncclGetErrorString(result));
    }
    group->comms_live = 1;
    for (int32_t r = 0; r < group->num_ranks; ++r) {
        group->ranks[r]->comm = group->comms[r];
    }
    GLMRT_TRY(glmrt_group_warm_up(group));
    GLMRT_TRY(glmrt_group_choose_all_reduce(group, devices));
    if (group->all_reduce == GLMRT_ALL_REDUCE_PEER || group->all_reduce == GLMRT_ALL_REDUCE_PEER_BF16) {
        return glmrt_group_connect_peers(group, devices);
    }
    if (glmrt_cuda_ordered_gather_wanted(group->all_reduce, group->num_ranks)) {
        return glmrt_group_prepare_ordered_sums(group);
    }
    return GLMRT_OK;
}

static glmrt_status glmrt_group_capture_decode_graphs(glmrt_cuda_group *group)
{
    glmrt_cuda_state *first = group->ranks[0];
    if (!glmrt_cuda_decode_graphs_wanted(first)) {
        return GLMRT_OK;
    }
    GLMRT_TRY(glmrt_cuda_decode_graphs_pack_warm_up(first, group->host_step_inputs[0], &group->step_counts,
                                                    &group->engine->error));
    if (group->num_ranks == 1) {
        return glmrt_cuda_decode_graphs_capture(first, &group->step_counts, group->host_step_inputs[0]);
    }
    glmrt_rank_work work;
    memset(&work, 0, sizeof(work));
    work.job = GLMRT_RANK_JOB_CAPTURE;
    work.counts = &group->step_counts;
    work.host_inputs = group->host_step_inputs[0];
    return glmrt_group_dispatch(group, &work);
}

static void glmrt_group_agree_on_owned_rows(glmrt_cuda_group *group)
{
    int32_t capable = group->num_ranks > 1;
    for (int32_t r = 0; r < group->num_ranks; ++r) {
        capable = capable && glmrt_cuda_forward_can_own_rows(group->ranks[r]);
    }
    for (int32_t r = 0; r < group->num_ranks; ++r) {
        group->ranks[r]->rows_owned_capable = capable;
    }
}

static glmrt_status glmrt_group_allocate(glmrt_cuda_group *group)
{
    glmrt_engine *engine = group->engine;
    int32_t pages = engine->options.kv_num_pages;
    if (pages <= 0) {
        for (int32_t r = 0; r < group->num_ranks; ++r) {
            int32_t rank_pages = 0;
            glmrt_status status = glmrt_cuda_rank_page_capacity(group->ranks[r], &rank_pages);
            if (status != GLMRT_OK) {
                return glmrt_group_report(group, r, status);
            }
            if (r == 0 || rank_pages < pages) {
                pages = rank_pages;
            }
        }
        engine->options.kv_num_pages = pages;
    }
    for (int32_t r = 0; r < group->num_ranks; ++r) {
        glmrt_status status = glmrt_cuda_rank_allocate(group->ranks[r], pages);
        if (status != GLMRT_OK) {
            return glmrt_group_report(group, r, status);
        }
    }
    glmrt_group_agree_on_owned_rows(group);
    glmrt_cuda_state *first = group->ranks[0];
    GLMRT_CUDA_TRY(&engine->error, cudaSetDevice(first->device));
    group->num_input_buffers = group->num_ranks == 1 ? GLMRT_CUDA_FLIGHTS : 1;
    for (int32_t b = 0; b < group->num_input_buffers; ++b) {
        GLMRT_CUDA_TRY(&engine->error, cudaHostAlloc((void **)&group->host_step_inputs[b],
                                                     (size_t)first->step_input_bytes,
                                                     cudaHostAllocPortable | cudaHostAllocMapped));
        GLMRT_TRY(glmrt_cuda_host_mapped_check(group->host_step_inputs[b], "step inputs", &engine->error));
    }
    return glmrt_group_capture_decode_graphs(group);
}

static glmrt_status glmrt_group_check_devices(glmrt_cuda_group *group)
{
    glmrt_engine *engine = group->engine;
    int count = 0;
    GLMRT_CUDA_TRY(&engine->error, cudaGetDeviceCount(&count));
    int64_t last = (int64_t)engine->options.device_id + group->num_ranks - 1;
    if (last >= count) {
        return glmrt_error_set(&engine->error, GLMRT_ERR_INVALID_ARGUMENT,
                               "device_id %d and num_devices %d need devices %d to %lld, but %d visible CUDA devices are numbered from 0",
                               engine->options.device_id, group->num_ranks, engine->options.device_id,
                               (long long)last, count);
    }
    return GLMRT_OK;
}

static glmrt_status glmrt_group_build(glmrt_cuda_group *group)
{
    glmrt_engine *engine = group->engine;
    GLMRT_TRY(glmrt_rank_plan_build(&engine->config, group->num_ranks, engine->options.expert_split, &group->plan,
                                    &engine->error));
    GLMRT_TRY(glmrt_group_check_devices(group));
    for (int32_t r = 0; r < group->num_ranks; ++r) {
        glmrt_cuda_state *st = (glmrt_cuda_state *)calloc(1, sizeof(glmrt_cuda_state));
        if (st == nullptr) {
            return glmrt_error_set(&engine->error, GLMRT_ERR_OUT_OF_MEMORY, "cannot allocate the state of GPU %d", r);
        }
        group->ranks[r] = st;
        st->engine = engine;
        if (group->num_ranks > 1) {
            st->step_abandoned = &group->step_abandoned;
            st->waiting_for_stream = &group->rank_waiting[r];
        }
        st->error = group->num_ranks == 1 ? &engine->error : &st->rank_error;
        st->rank = group->plan.ranks[r];
        st->plan = &group->plan;
        st->device = engine->options.device_id + r;
    }
    GLMRT_TRY(glmrt_group_load(group));
    GLMRT_TRY(glmrt_group_connect(group));
    return glmrt_group_allocate(group);
}

static void glmrt_group_settle_stream(glmrt_cuda_state *st)
{
    if (st->stream != nullptr) {
        cudaStreamSynchronize(st->stream);
        cudaGetLastError();
    }
}

static void glmrt_group_settle_streams(glmrt_cuda_group *group)
{
    for (int32_t r = 0; r < group->num_ranks; ++r) {
        glmrt_cuda_state *st = group->ranks[r];
        if (st != nullptr && cudaSetDevice(st->device) == cudaSuccess) {
            glmrt_group_settle_stream(st);
        }
        cudaGetLastError();
    }
}

void glmrt_cuda_group_destroy(glmrt_cuda_group *group)
{
    if (group == nullptr) {
        return;
    }
    glmrt_group_release_peer_waits(group);
    glmrt_group_stop_threads(group);
    glmrt_group_settle_streams(group);
    glmrt_group_release_graphs(group);
    if (group->comms_live && !group->comms_aborted) {
        for (int32_t r = 0; r < group->num_ranks; ++r) {
            if (group->comms[r] != nullptr) {
                ncclCommDestroy(group->comms[r]);
            }
        }
    }
    for (int32_t r = 0; r < group->num_ranks; ++r) {
        glmrt_cuda_state *st = group->ranks[r];
        if (st == nullptr) {
            continue;
        }
        if (cudaSetDevice(st->device) == cudaSuccess) {
            glmrt_cuda_rank_release(st);
        }
        cudaGetLastError();
        free(st);
    }
    for (int32_t b = 0; b < GLMRT_CUDA_FLIGHTS; ++b) {
        if (group->host_step_inputs[b] != nullptr) {
            cudaFreeHost(group->host_step_inputs[b]);
        }
    }
    if (group->peer_abort != nullptr) {
        cudaFreeHost(group->peer_abort);
    }
    free(group);
}

glmrt_status glmrt_cuda_group_create(glmrt_engine *engine, glmrt_cuda_group **out)
{
    *out = nullptr;
    glmrt_cuda_group *group = (glmrt_cuda_group *)calloc(1, sizeof(glmrt_cuda_group));
    if (group == nullptr) {
        return glmrt_error_set(&engine->error, GLMRT_ERR_OUT_OF_MEMORY, "cannot allocate the CUDA backend state");
    }
    group->engine = engine;
    group->num_ranks = engine->options.num_devices > 0 ? engine->options.num_devices : 1;
    glmrt_status status = glmrt_group_build(group);
    if (status != GLMRT_OK) {
        glmrt_cuda_group_destroy(group);
        return status;
    }
    *out = group;
    return GLMRT_OK;
}

static glmrt_status glmrt_group_check_usable(glmrt_cuda_group *group)
{
    if (group->failed) {
        return glmrt_error_set(&group->engine->error, GLMRT_ERR_BACKEND,
                               "the GPUs fell out of step in an earlier step and the engine must be recreated: %s",
                               group->failure);
    }
    if (group->launched >= group->num_input_buffers) {
        return glmrt_error_set(&group->engine->error, GLMRT_ERR_INVARIANT,
                               "%d CUDA steps are already in flight; complete one before launching another",
                               group->launched);
    }
    return GLMRT_OK;
}

int32_t glmrt_cuda_group_feeds_sampled_tokens(const glmrt_cuda_group *group)
{
    return group->num_input_buffers == GLMRT_CUDA_FLIGHTS;
}

static uint8_t *glmrt_group_take_inputs(glmrt_cuda_group *group)
{
    uint8_t *inputs = group->host_step_inputs[group->next_input_buffer];
    group->next_input_buffer = (group->next_input_buffer + 1) % group->num_input_buffers;
    return inputs;
}

static void glmrt_group_mark_failed(glmrt_cuda_group *group)
{
    group->failed = 1;
    snprintf(group->failure, sizeof(group->failure), "%s", group->engine->error.message);
}

glmrt_status glmrt_cuda_group_launch(glmrt_cuda_group *group, const glmrt_step_batch *batch, float *out_logits,
                                     glmrt_token *out_sampled)
{
    glmrt_error *error = &group->engine->error;
    GLMRT_TRY(glmrt_group_check_usable(group));
    if (batch == nullptr || batch->num_tokens <= 0) {
        return GLMRT_OK;
    }
    glmrt_cuda_state *first = group->ranks[0];
    glmrt_cuda_step_padding padding;
    padding.bucket = glmrt_cuda_decode_graph_bucket(first, batch);
    padding.pad_page = first->kv_pad_page;
    uint8_t *inputs = glmrt_group_take_inputs(group);
    GLMRT_TRY(glmrt_cuda_step_pack_padded(batch, &first->capacity, &first->split_policy, first->kv.page_size,
                                          first->kv_num_pages, &padding, inputs, &group->step_counts, error));
    if (group->num_ranks == 1) {
        glmrt_status status = glmrt_cuda_forward_enqueue(first, &group->step_counts, inputs, out_logits, out_sampled);
        if (status != GLMRT_OK) {
            glmrt_group_settle_stream(first);
            return status;
        }
        group->launched += 1;
        return GLMRT_OK;
    }
    glmrt_rank_work work;
    memset(&work, 0, sizeof(work));
    work.job = GLMRT_RANK_JOB_FORWARD;
    work.counts = &group->step_counts;
    work.host_inputs = inputs;
    work.out_logits = out_logits;
    work.out_sampled = out_sampled;
    glmrt_group_post(group, &work);
    group->launched += 1;
    return GLMRT_OK;
}

glmrt_status glmrt_cuda_group_complete(glmrt_cuda_group *group, glmrt_step_report *out_report)
{
    out_report->device_ns = 0;
    out_report->rows_owned = 0;
    if (group->launched <= 0) {
        return GLMRT_OK;
    }
    group->launched -= 1;
    glmrt_cuda_state *first = group->ranks[0];
    if (group->num_ranks == 1) {
        glmrt_status status = glmrt_cuda_forward_wait(first, &out_report->device_ns);
        out_report->rows_owned = first->last_rows_owned;
        if (status != GLMRT_OK) {
            glmrt_group_settle_stream(first);
        }
        return status;
    }
    glmrt_status status = glmrt_group_collect(group, GLMRT_RANK_JOB_FORWARD);
    if (status != GLMRT_OK) {
        glmrt_group_mark_failed(group);
        return status;
    }
    out_report->device_ns = first->last_device_ns;
    out_report->rows_owned = first->last_rows_owned;
    return GLMRT_OK;
}
