#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <vector>

#include "activation_quant.cuh"
#include "bench_fill.cuh"
#include "gemm.cuh"
#include "qgemm.cuh"

#define GLMRT_BENCH_ROTATION_BYTES (384ll << 20)
#define GLMRT_BENCH_LAUNCHES 24
#define GLMRT_BENCH_REPLAYS 7

typedef struct glmrt_bench_shape {
    const char *name;
    int32_t rows;
    int32_t cols;
    int32_t format;
    int32_t experts;
    int32_t gate_up;
    int32_t splits_columns;
} glmrt_bench_shape;

typedef struct glmrt_bench_copy {
    glmrt_cuda_matrix m;
    glmrt_cuda_qgemm_weight *q;
} glmrt_bench_copy;

__global__ void glmrt_bench_fill_bytes(uint8_t *data, int64_t count, uint32_t seed, int32_t fp8)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += (int64_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 2654435761u ^ seed;
        h ^= h >> 15;
        h *= 2246822519u;
        h ^= h >> 13;
        uint8_t b = (uint8_t)h;
        if (fp8) {
            b = (b & 0x7f) >= 0x7e ? (uint8_t)(b & 0xb7) : b;
        } else if ((i & 1) == 1) {
            b = (uint8_t)(0x3c | (b & 0x80) | (b & 0x03));
        }
        data[i] = b;
    }
}

static int glmrt_bench_ok(cudaError_t result, const char *what)
{
    if (result != cudaSuccess) {
        fprintf(stderr, "%s failed: %s\n", what, cudaGetErrorString(result));
        return 0;
    }
    return 1;
}

static int glmrt_bench_status(glmrt_status status, const glmrt_error *error, const char *what)
{
    if (status != GLMRT_OK) {
        fprintf(stderr, "%s failed: %s\n", what, error->message);
        return 0;
    }
    return 1;
}

static void *glmrt_bench_aligned(size_t bytes)
{
    void *memory = nullptr;
    if (posix_memalign(&memory, 64, bytes) != 0) {
        return nullptr;
    }
    memset(memory, 0, bytes);
    return memory;
}

#define GLMRT_BENCH_SCALE_BLOCK_SIDE 128

static glmrt_cuda_matrix glmrt_bench_matrix(const glmrt_bench_shape &shape, uint8_t *data, float *scales,
                                            int32_t block_scales)
{
    glmrt_cuda_matrix m;
    memset(&m, 0, sizeof(m));
    const int32_t fp8 = shape.format == GLMRT_CUDA_FORMAT_FP8;
    const int32_t blocks = fp8 && block_scales;
    m.format = shape.format;
    m.scale_kind = fp8 ? (blocks ? GLMRT_CUDA_SCALE_BLOCK : GLMRT_CUDA_SCALE_CHANNEL) : GLMRT_CUDA_SCALE_NONE;
    m.rows = shape.rows;
    m.cols = shape.cols;
    m.block_rows = blocks ? GLMRT_BENCH_SCALE_BLOCK_SIDE : 1;
    m.block_cols = blocks ? GLMRT_BENCH_SCALE_BLOCK_SIDE : shape.cols;
    m.scale_rows = fp8 ? (blocks ? glmrt_ceil_div(shape.rows, GLMRT_BENCH_SCALE_BLOCK_SIDE) : shape.rows) : 0;
    m.scale_cols = fp8 ? (blocks ? glmrt_ceil_div(shape.cols, GLMRT_BENCH_SCALE_BLOCK_SIDE) : 1) : 0;
    m.num_segments = 1;
    m.segment_row_end[0] = shape.rows;
    m.num_groups = shape.experts > 0 ? shape.experts : 1;
    m.group_bytes = (int64_t)shape.rows * shape.cols * (fp8 ? 1 : 2);
    m.group_scales = (int64_t)m.scale_rows * m.scale_cols;
    m.data = data;
    m.scale = fp8 ? scales : nullptr;
    return m;
}

typedef struct glmrt_bench_context {
    cudaStream_t stream;
    int32_t num_sms;
    glmrt_cuda_qgemm_split split;
    float *x;
    float *y;
    float *scales;
    glmrt_cuda_qgemm_operand *operands;
    uint8_t *activations;
    float *activation_scales;
    int32_t max_rows;
    int32_t max_cols;
    glmrt_cuda_gemm_tile *tiles;
    int32_t *num_tiles;
    int32_t block_scales;
    int32_t gated;
    int32_t no_split;
    int32_t gpus;
    int32_t expert_tile_rows;
} glmrt_bench_context;

typedef struct glmrt_bench_run {
    const glmrt_bench_shape *shape;
    std::vector<glmrt_bench_copy> *copies;
    const glmrt_cuda_qgemm_operand *operand;
    int32_t rows;
    int32_t native;
    int32_t grid_tiles;
    int32_t tile_rows;
} glmrt_bench_run;

static glmrt_status glmrt_bench_launch(const glmrt_bench_context *c, const glmrt_bench_run *r, int32_t copy,
                                       glmrt_error *error)
{
    const glmrt_cuda_matrix *m = &(*r->copies)[(size_t)copy].m;
    const int32_t grouped = r->shape->experts > 0;
    if (r->native) {
        glmrt_cuda_qgemm_call call;
        memset(&call, 0, sizeof(call));
        call.w = m;
        call.x = r->operand;
        call.num_rows = r->rows;
        call.tiles = grouped ? c->tiles : nullptr;
        call.num_tiles = grouped ? c->num_tiles : nullptr;
        call.grid_tiles = r->grid_tiles;
        call.tile_rows = r->tile_rows;
        call.y = c->y;
        call.y_stride = r->shape->rows;
        call.gated = c->gated && r->shape->gate_up;
        return glmrt_cuda_qgemm_run(&call, &c->split, c->stream, error);
    }
    if (grouped) {
        glmrt_cuda_gemm_args args;
        memset(&args, 0, sizeof(args));
        args.x = c->x;
        args.x_stride = r->shape->cols;
        args.y = c->y;
        args.y_stride = r->shape->rows;
        args.num_rows = r->rows;
        args.tiles = c->tiles;
        args.num_tiles = c->num_tiles;
        args.w = *m;
        return glmrt_cuda_gemm_run(&args, glmrt_cuda_gemm_tile_rows(r->tile_rows), r->grid_tiles, c->stream, error);
    }
    return glmrt_cuda_gemm_dense(m, c->x, r->shape->cols, c->y, r->shape->rows, r->rows, nullptr, 0, c->stream,
                                 error);
}

static double glmrt_bench_time(const glmrt_bench_context *c, const glmrt_bench_run *r, glmrt_error *error)
{
    const int32_t copies = (int32_t)r->copies->size();
    for (int32_t i = 0; i < 2; ++i) {
        if (!glmrt_bench_status(glmrt_bench_launch(c, r, i % copies, error), error, "warm-up launch")) {
            return -1.0;
        }
    }
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    if (!glmrt_bench_ok(cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal), "capture")) {
        return -1.0;
    }
    glmrt_status status = GLMRT_OK;
    for (int32_t i = 0; i < GLMRT_BENCH_LAUNCHES && status == GLMRT_OK; ++i) {
        status = glmrt_bench_launch(c, r, i % copies, error);
    }
    cudaError_t ended = cudaStreamEndCapture(c->stream, &graph);
    if (!glmrt_bench_status(status, error, "captured launch") || !glmrt_bench_ok(ended, "end capture") ||
        !glmrt_bench_ok(cudaGraphInstantiate(&exec, graph, 0), "instantiate")) {
        return -1.0;
    }
    cudaEvent_t start;
    cudaEvent_t stop;
    cudaEventCreate(&start);
    cudaEventCreate(&stop);
    std::vector<float> samples;
    for (int32_t replay = 0; replay < GLMRT_BENCH_REPLAYS + 1; ++replay) {
        cudaEventRecord(start, c->stream);
        cudaGraphLaunch(exec, c->stream);
        cudaEventRecord(stop, c->stream);
        if (!glmrt_bench_ok(cudaEventSynchronize(stop), "graph replay")) {
            return -1.0;
        }
        float ms = 0.0f;
        cudaEventElapsedTime(&ms, start, stop);
        if (replay > 0) {
            samples.push_back(ms);
        }
    }
    std::sort(samples.begin(), samples.end());
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    return samples[samples.size() / 2] * 1e-3 / GLMRT_BENCH_LAUNCHES;
}

static int glmrt_bench_copies(const glmrt_bench_context *c, const glmrt_bench_shape &shape,
                              std::vector<glmrt_bench_copy> *out, glmrt_error *error)
{
    const int64_t bytes = (int64_t)shape.rows * shape.cols * (shape.format == GLMRT_CUDA_FORMAT_FP8 ? 1 : 2) *
                          (shape.experts > 0 ? shape.experts : 1);
    const int64_t count = std::max<int64_t>(1, GLMRT_BENCH_ROTATION_BYTES / bytes);
    for (int64_t i = 0; i < count; ++i) {
        uint8_t *data = nullptr;
        if (!glmrt_bench_ok(cudaMalloc(&data, (size_t)bytes), "cudaMalloc weights")) {
            return 0;
        }
        glmrt_bench_fill_bytes<<<2048, 256>>>(data, bytes, 11u + (uint32_t)i, shape.format == GLMRT_CUDA_FORMAT_FP8);
        glmrt_bench_copy copy;
        copy.m = glmrt_bench_matrix(shape, data, c->scales, c->block_scales);
        copy.q = (glmrt_cuda_qgemm_weight *)glmrt_bench_aligned(sizeof(glmrt_cuda_qgemm_weight));
        const int32_t allow_split = shape.experts == 0 && shape.format == GLMRT_CUDA_FORMAT_FP8 && !c->no_split;
        if (copy.q == nullptr || !glmrt_bench_status(glmrt_cuda_qgemm_weight_prepare(&copy.m, c->num_sms, allow_split,
                                                                                     copy.q, error),
                                                     error, "weight tensor map")) {
            return 0;
        }
        copy.m.qgemm = copy.q;
        out->push_back(copy);
    }
    return 1;
}

static void glmrt_bench_free_copies(std::vector<glmrt_bench_copy> *copies)
{
    for (glmrt_bench_copy &copy : *copies) {
        cudaFree(copy.m.data);
        free(copy.q);
    }
    copies->clear();
}

static int32_t glmrt_bench_route(glmrt_bench_context *c, int32_t tokens, int32_t experts, int32_t top_k,
                                 int32_t tile_rows, int64_t *touched)
{
    uint64_t state = 0x243F6A8885A308D3ull;
    std::vector<std::vector<int32_t>> rows_of((size_t)experts);
    int32_t assignment = 0;
    for (int32_t t = 0; t < tokens; ++t) {
        std::vector<int32_t> chosen;
        while ((int32_t)chosen.size() < top_k) {
            state = state * 6364136223846793005ull + 1442695040888963407ull;
            int32_t e = (int32_t)((state >> 33) % (uint64_t)experts);
            if (std::find(chosen.begin(), chosen.end(), e) == chosen.end()) {
                chosen.push_back(e);
            }
        }
        for (int32_t e : chosen) {
            rows_of[(size_t)e].push_back(assignment++);
        }
    }
    std::vector<glmrt_cuda_gemm_tile> tiles;
    int32_t row = 0;
    *touched = 0;
    for (int32_t e = 0; e < experts; ++e) {
        int32_t count = (int32_t)rows_of[(size_t)e].size();
        *touched += count > 0;
        for (int32_t t = 0; t < count; t += tile_rows) {
            glmrt_cuda_gemm_tile tile;
            tile.group = e;
            tile.row_begin = row + t;
            tile.num_rows = std::min(tile_rows, count - t);
            tile.reserved = 0;
            tiles.push_back(tile);
        }
        row += count;
    }
    int32_t count = (int32_t)tiles.size();
    cudaMemcpy(c->tiles, tiles.data(), tiles.size() * sizeof(glmrt_cuda_gemm_tile), cudaMemcpyHostToDevice);
    cudaMemcpy(c->num_tiles, &count, sizeof(count), cudaMemcpyHostToDevice);
    return count;
}

static const glmrt_cuda_qgemm_operand *glmrt_bench_operand(glmrt_bench_context *c, const glmrt_bench_shape &shape,
                                                           glmrt_error *error)
{
    glmrt_cuda_qgemm_operand *o = c->operands;
    int32_t kind = shape.format == GLMRT_CUDA_FORMAT_FP8 ? GLMRT_OPERAND_FP8 : GLMRT_OPERAND_BF16;
    glmrt_status status = glmrt_cuda_qgemm_operand_prepare(o, kind, c->activations, c->activation_scales, shape.cols,
                                                           c->max_rows, "bench activations", error);
    if (!glmrt_bench_status(status, error, "activation tensor map")) {
        return nullptr;
    }
    glmrt_cuda_activation_args args;
    memset(&args, 0, sizeof(args));
    args.x = c->x;
    args.x_stride = shape.cols;
    args.op = GLMRT_ACTIVATION_COPY;
    args.num_rows = c->max_rows;
    args.out = o;
    status = glmrt_cuda_activation_quantize(&args, c->stream, error);
    return glmrt_bench_status(status, error, "activation quantization") ? o : nullptr;
}

static void glmrt_bench_print(const char *kind, const glmrt_bench_shape &shape, int32_t rows, const char *path,
                              double seconds, int64_t weight_bytes, double flops)
{
    printf("{\"kind\": \"%s\", \"matrix\": \"%s\", \"n\": %d, \"k\": %d, \"rows\": %d, \"path\": \"%s\", "
           "\"seconds\": %.9e, \"weight_bytes\": %lld, \"flops\": %.6e}\n",
           kind, shape.name, shape.rows, shape.cols, rows, path, seconds, (long long)weight_bytes, flops);
    fflush(stdout);
}

static int glmrt_bench_shape_run(glmrt_bench_context *c, const glmrt_bench_shape &shape,
                                 const std::vector<int32_t> &row_counts, int32_t with_high, glmrt_error *error)
{
    std::vector<glmrt_bench_copy> copies;
    if (!glmrt_bench_copies(c, shape, &copies, error)) {
        return 0;
    }
    const glmrt_cuda_qgemm_operand *operand = glmrt_bench_operand(c, shape, error);
    if (operand == nullptr) {
        return 0;
    }
    const int64_t matrix_bytes = (int64_t)shape.rows * shape.cols * (shape.format == GLMRT_CUDA_FORMAT_FP8 ? 1 : 2);
    for (int32_t rows : row_counts) {
        const int32_t grouped_prefill = shape.experts > 0 && rows >= 1024;
        for (int32_t native = 1; native >= (with_high && !grouped_prefill ? 0 : 1); --native) {
            glmrt_bench_run r;
            r.shape = &shape;
            r.copies = &copies;
            r.operand = operand;
            r.rows = rows;
            r.native = native;
            r.grid_tiles = 0;
            r.tile_rows = 0;
            int64_t weight_bytes = matrix_bytes;
            const char *kind = rows >= 1024 ? "prefill" : "decode";
            if (shape.experts > 0) {
                const int32_t top_k = 8;
                const int32_t tokens = std::max(1, rows / c->gpus);
                const int32_t assignments = tokens * top_k;
                r.tile_rows = c->expert_tile_rows > 0 ? c->expert_tile_rows
                                                      : glmrt_cuda_qgemm_expert_tile_rows(assignments, shape.experts);
                int64_t touched = 0;
                int32_t count = glmrt_bench_route(c, tokens, shape.experts, top_k, r.tile_rows, &touched);
                r.rows = assignments;
                r.grid_tiles = count;
                weight_bytes = matrix_bytes * touched;
                kind = grouped_prefill ? "grouped_prefill" : "grouped";
            }
            double seconds = glmrt_bench_time(c, &r, error);
            if (seconds < 0.0) {
                glmrt_bench_free_copies(&copies);
                return 0;
            }
            glmrt_bench_print(kind, shape, rows, native ? "native" : "high", seconds, weight_bytes,
                              2.0 * r.rows * (double)shape.rows * shape.cols);
        }
    }
    glmrt_bench_free_copies(&copies);
    return 1;
}

static int glmrt_bench_parse_rows(const char *text, std::vector<int32_t> *rows)
{
    rows->clear();
    const char *at = text;
    while (*at != '\0') {
        char *end = nullptr;
        const long value = strtol(at, &end, 10);
        if (end == at || value <= 0 || value > 2048) {
            return 0;
        }
        rows->push_back((int32_t)value);
        at = *end == ',' ? end + 1 : end;
        if (*end != ',' && *end != '\0') {
            return 0;
        }
    }
    return !rows->empty();
}

static int glmrt_bench_parse_whole(const char *text, long *value)
{
    char *end = nullptr;
    *value = strtol(text, &end, 10);
    return end != text && *end == '\0';
}

static int glmrt_bench_parse_gpus(const char *text, int32_t *gpus)
{
    long value = 0;
    if (!glmrt_bench_parse_whole(text, &value) || (value != 1 && value != 2 && value != 4)) {
        return 0;
    }
    *gpus = (int32_t)value;
    return 1;
}

static int glmrt_bench_parse_expert_tile(const char *text, int32_t *tile_rows)
{
    long value = 0;
    if (!glmrt_bench_parse_whole(text, &value) || value < 1 || value > GLMRT_QGEMM_MAX_TILE_ROWS ||
        glmrt_cuda_qgemm_tile_rows((int32_t)value) != value) {
        return 0;
    }
    *tile_rows = (int32_t)value;
    return 1;
}

static glmrt_bench_shape glmrt_bench_gpu_share(const glmrt_bench_shape &whole, int32_t gpus)
{
    glmrt_bench_shape share = whole;
    if (gpus <= 1) {
        return share;
    }
    if (whole.experts > 0) {
        share.experts = whole.experts / gpus;
    } else if (whole.splits_columns) {
        share.cols = whole.cols / gpus;
    } else {
        share.rows = whole.rows / gpus;
    }
    return share;
}

static double glmrt_bench_copy_bandwidth(cudaStream_t stream)
{
    const size_t bytes = 2ull << 30;
    uint8_t *a = nullptr;
    uint8_t *b = nullptr;
    if (!glmrt_bench_ok(cudaMalloc(&a, bytes), "copy buffer") || !glmrt_bench_ok(cudaMalloc(&b, bytes), "copy buffer")) {
        return 0.0;
    }
    cudaMemsetAsync(a, 1, bytes, stream);
    for (int i = 0; i < 3; ++i) {
        cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, stream);
    }
    cudaEvent_t start;
    cudaEvent_t stop;
    cudaEventCreate(&start);
    cudaEventCreate(&stop);
    const int reps = 10;
    cudaEventRecord(start, stream);
    for (int i = 0; i < reps; ++i) {
        cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, stream);
    }
    cudaEventRecord(stop, stream);
    cudaEventSynchronize(stop);
    float ms = 0.0f;
    cudaEventElapsedTime(&ms, start, stop);
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    cudaFree(a);
    cudaFree(b);
    return 2.0 * bytes * reps / (ms * 1e-3);
}

int main(int argc, char **argv)
{
    int32_t with_high = 0;
    int32_t block_scales = 0;
    int32_t gated = 0;
    int32_t no_split = 0;
    int32_t gpus = 1;
    int32_t expert_tile_rows = 0;
    const char *only = nullptr;
    std::vector<int32_t> chosen_rows;
    for (int i = 1; i < argc; ++i) {
        if (strcmp(argv[i], "--rows") == 0 && i + 1 < argc && !glmrt_bench_parse_rows(argv[++i], &chosen_rows)) {
            fprintf(stderr, "--rows takes a comma-separated list of positive row counts, got %s\n", argv[i]);
            return 1;
        }
        with_high |= strcmp(argv[i], "--with-high") == 0;
        block_scales |= strcmp(argv[i], "--block-scales") == 0;
        gated |= strcmp(argv[i], "--gated") == 0;
        no_split |= strcmp(argv[i], "--no-split") == 0;
        if (strcmp(argv[i], "--only") == 0 && i + 1 < argc) {
            only = argv[++i];
        }
        if (strcmp(argv[i], "--expert-tile") == 0 && i + 1 < argc &&
            !glmrt_bench_parse_expert_tile(argv[++i], &expert_tile_rows)) {
            fprintf(stderr, "--expert-tile takes a token tile of 8 to %d rows in powers of two, got %s\n",
                    GLMRT_QGEMM_MAX_TILE_ROWS, argv[i]);
            return 1;
        }
        if (strcmp(argv[i], "--gpus") == 0 && i + 1 < argc && !glmrt_bench_parse_gpus(argv[++i], &gpus)) {
            fprintf(stderr, "--gpus takes 1, 2 or 4 (the share of one GPU of a model split over that many), got %s\n",
                    argv[i]);
            return 1;
        }
    }
    const glmrt_bench_shape dense[] = {
        {"qkv", 14336, 5120, GLMRT_CUDA_FORMAT_FP8, 0, 0, 0},
        {"o_proj", 5120, 12288, GLMRT_CUDA_FORMAT_FP8, 0, 0, 1},
        {"dense gate_up", 24576, 5120, GLMRT_CUDA_FORMAT_FP8, 0, 1, 0},
        {"dense down", 5120, 12288, GLMRT_CUDA_FORMAT_FP8, 0, 0, 1},
        {"shared gate_up", 3072, 5120, GLMRT_CUDA_FORMAT_FP8, 0, 1, 0},
        {"shared down", 5120, 1536, GLMRT_CUDA_FORMAT_FP8, 0, 0, 1},
        {"lm_head bf16", 151552, 5120, GLMRT_CUDA_FORMAT_BF16, 0, 0, 0},
    };
    const glmrt_bench_shape experts[] = {
        {"experts gate_up", 3072, 5120, GLMRT_CUDA_FORMAT_FP8, 160, 1, 0},
        {"experts down", 5120, 1536, GLMRT_CUDA_FORMAT_FP8, 160, 0, 0},
    };
    glmrt_bench_context c;
    memset(&c, 0, sizeof(c));
    c.block_scales = block_scales;
    c.gated = gated;
    c.no_split = no_split;
    c.gpus = gpus;
    c.expert_tile_rows = expert_tile_rows;
    int device = 0;
    cudaGetDevice(&device);
    cudaDeviceGetAttribute(&c.num_sms, cudaDevAttrMultiProcessorCount, device);
    if (!glmrt_cuda_qgemm_device_supported(device)) {
        fprintf(stderr, "the native matmuls need an sm_90 device\n");
        return 1;
    }
    cudaStreamCreateWithFlags(&c.stream, cudaStreamNonBlocking);
    const int32_t prefill_tokens = 2048;
    const int32_t max_assignments = prefill_tokens * 8;
    c.max_rows = max_assignments;
    c.max_cols = 12288;
    const int32_t max_n = 151552;
    c.split.partial_elements = glmrt_cuda_qgemm_split_partial_elements(GLMRT_QGEMM_MAX_SPLITS * 384);
    c.split.num_counters = glmrt_cuda_qgemm_split_counters(24576);
    c.operands = (glmrt_cuda_qgemm_operand *)glmrt_bench_aligned(sizeof(glmrt_cuda_qgemm_operand));
    if (c.operands == nullptr ||
        !glmrt_bench_ok(cudaMalloc(&c.x, (size_t)c.max_rows * c.max_cols * sizeof(float)), "cudaMalloc x") ||
        !glmrt_bench_ok(cudaMalloc(&c.y, (size_t)std::max((int64_t)prefill_tokens * max_n, (int64_t)max_assignments * 5120) * sizeof(float)), "cudaMalloc y") ||
        !glmrt_bench_ok(cudaMalloc(&c.scales, (size_t)max_n * 160 * sizeof(float)), "cudaMalloc scales") ||
        !glmrt_bench_ok(cudaMalloc(&c.activations, (size_t)c.max_rows * c.max_cols * 2), "cudaMalloc activations") ||
        !glmrt_bench_ok(cudaMalloc(&c.activation_scales, (size_t)c.max_rows * sizeof(float)), "cudaMalloc scales") ||
        !glmrt_bench_ok(cudaMalloc(&c.split.partials, (size_t)c.split.partial_elements * 4),
                        "cudaMalloc partials") ||
        !glmrt_bench_ok(cudaMalloc(&c.split.counters, (size_t)c.split.num_counters * 4), "cudaMalloc counters") ||
        !glmrt_bench_ok(cudaMalloc(&c.tiles, (size_t)(max_assignments + 160) * sizeof(glmrt_cuda_gemm_tile)),
                        "cudaMalloc tiles") ||
        !glmrt_bench_ok(cudaMalloc(&c.num_tiles, sizeof(int32_t)), "cudaMalloc tile count")) {
        return 1;
    }
    cudaMemset(c.split.counters, 0, (size_t)c.split.num_counters * 4);
    glmrt_bench_fill_floats<<<1024, 256>>>(c.x, (int64_t)c.max_rows * c.max_cols, 7u, 0.0f, 2.0f);
    glmrt_bench_fill_floats<<<1024, 256>>>(c.scales, (int64_t)max_n * 160, 9u, 1e-3f, 1e-3f);
    printf("{\"kind\": \"device\", \"copy_bytes_per_second\": %.6e, \"num_sms\": %d, \"scales\": \"%s\"}\n",
           glmrt_bench_copy_bandwidth(c.stream), c.num_sms, block_scales ? "block" : "channel");
    glmrt_error error;
    glmrt_error_clear(&error);
    const std::vector<int32_t> decode_rows = {1, 8, 16, 32, 64};
    const std::vector<int32_t> prefill_rows = {2048};
    for (const glmrt_bench_shape &whole : dense) {
        if (only != nullptr && strcmp(only, whole.name) != 0) {
            continue;
        }
        const glmrt_bench_shape shape = glmrt_bench_gpu_share(whole, gpus);
        const std::vector<int32_t> &dense_rows =
            !chosen_rows.empty() ? chosen_rows : (only != nullptr ? prefill_rows : decode_rows);
        if (!glmrt_bench_shape_run(&c, shape, dense_rows, with_high, &error)) {
            return 1;
        }
        if (only == nullptr && chosen_rows.empty() && shape.format == GLMRT_CUDA_FORMAT_FP8 &&
            !glmrt_bench_shape_run(&c, shape, prefill_rows, with_high, &error)) {
            return 1;
        }
    }
    const std::vector<int32_t> expert_tokens = {256, prefill_tokens};
    for (const glmrt_bench_shape &whole : experts) {
        if (only != nullptr && strcmp(only, whole.name) != 0) {
            continue;
        }
        const glmrt_bench_shape shape = glmrt_bench_gpu_share(whole, gpus);
        const std::vector<int32_t> prefill_experts = {prefill_tokens};
        const std::vector<int32_t> &tokens =
            !chosen_rows.empty() ? chosen_rows : (only != nullptr ? prefill_experts : expert_tokens);
        if (!glmrt_bench_shape_run(&c, shape, tokens, with_high, &error)) {
            return 1;
        }
    }
    return glmrt_bench_ok(cudaDeviceSynchronize(), "final synchronize") ? 0 : 1;
}
