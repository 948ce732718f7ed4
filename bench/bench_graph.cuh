#ifndef GLMRT_BENCH_GRAPH_CUH
#define GLMRT_BENCH_GRAPH_CUH

#include <cuda_runtime.h>
#include <stdio.h>

extern "C" {
#include "error.h"
}

static int glmrt_bench_check(const char *tool, cudaError_t result, const char *what)
{
    if (result != cudaSuccess) {
        fprintf(stderr, "%s: %s: %s\n", tool, what, cudaGetErrorString(result));
        return 0;
    }
    return 1;
}

template <typename CALL>
static int glmrt_bench_graph_capture(const char *tool, cudaStream_t stream, int calls, CALL call,
                                     cudaGraphExec_t *exec)
{
    glmrt_error error;
    glmrt_error_clear(&error);
    cudaGraph_t graph = nullptr;
    if (!glmrt_bench_check(tool, cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "capture")) {
        return 0;
    }
    glmrt_status status = GLMRT_OK;
    for (int i = 0; i < calls && status == GLMRT_OK; ++i) {
        status = call(i, &error);
    }
    const cudaError_t ended = cudaStreamEndCapture(stream, &graph);
    if (status != GLMRT_OK) {
        fprintf(stderr, "%s: %s\n", tool, error.message);
        cudaGraphDestroy(graph);
        return 0;
    }
    if (!glmrt_bench_check(tool, ended, "end of capture")) {
        return 0;
    }
    const int made = glmrt_bench_check(tool, cudaGraphInstantiate(exec, graph, 0), "graph instantiation");
    cudaGraphDestroy(graph);
    return made;
}

static int glmrt_bench_graph_call_us(const char *tool, cudaStream_t stream, cudaGraphExec_t exec, int calls,
                                     int replays, double *out_us)
{
    cudaEvent_t start = nullptr;
    cudaEvent_t stop = nullptr;
    float ms = 0.0f;
    int ok = glmrt_bench_check(tool, cudaEventCreate(&start), "event") &&
             glmrt_bench_check(tool, cudaEventCreate(&stop), "event") &&
             glmrt_bench_check(tool, cudaGraphLaunch(exec, stream), "warm-up replay") &&
             glmrt_bench_check(tool, cudaEventRecord(start, stream), "event record");
    for (int r = 0; ok && r < replays; ++r) {
        ok = glmrt_bench_check(tool, cudaGraphLaunch(exec, stream), "replay");
    }
    ok = ok && glmrt_bench_check(tool, cudaEventRecord(stop, stream), "event record") &&
         glmrt_bench_check(tool, cudaEventSynchronize(stop), "replays") &&
         glmrt_bench_check(tool, cudaEventElapsedTime(&ms, start, stop), "elapsed time");
    *out_us = (double)ms * 1e3 / ((double)calls * replays);
    if (start != nullptr) {
        cudaEventDestroy(start);
    }
    if (stop != nullptr) {
        cudaEventDestroy(stop);
    }
    return ok;
}

#endif
