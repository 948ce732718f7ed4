#ifndef GLMRT_DEVICE_ARCH_CUH
#define GLMRT_DEVICE_ARCH_CUH

int glmrt_cuda_device_hopper(int device);

#endif
