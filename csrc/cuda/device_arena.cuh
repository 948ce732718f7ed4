#ifndef GLMRT_DEVICE_ARENA_CUH
#define GLMRT_DEVICE_ARENA_CUH

#include <stdint.h>

#define GLMRT_CUDA_ARENA_ALIGN 256

typedef struct glmrt_cuda_arena {
    uint8_t *base;
    int64_t used;
} glmrt_cuda_arena;

static inline int64_t glmrt_cuda_arena_round(int64_t bytes)
{
    return (bytes + GLMRT_CUDA_ARENA_ALIGN - 1) / GLMRT_CUDA_ARENA_ALIGN * GLMRT_CUDA_ARENA_ALIGN;
}

static inline uint8_t *glmrt_cuda_arena_take(glmrt_cuda_arena *arena, int64_t bytes)
{
    uint8_t *at = arena->base != nullptr ? arena->base + arena->used : nullptr;
    arena->used += glmrt_cuda_arena_round(bytes > 0 ? bytes : 1);
    return at;
}

template <typename T>
static inline T *glmrt_cuda_arena_array(glmrt_cuda_arena *arena, int64_t count)
{
    return reinterpret_cast<T *>(glmrt_cuda_arena_take(arena, count * (int64_t)sizeof(T)));
}

#endif
