#include "dependent_launch.cuh"

static thread_local bool glmrt_dependent_launches_enabled = true;

void glmrt_cuda_dependent_launches_set(bool enabled)
{
    glmrt_dependent_launches_enabled = enabled;
}

bool glmrt_cuda_dependent_launches(void)
{
    return glmrt_dependent_launches_enabled;
}
