// Internal: SAMATTN_HOST_DEVICE marks small index functions that kernels call and CPU tests
// replay (inline host code when the including file is not compiled by nvcc). The same
// definition as attention/mask_policy.h's.
#pragma once

#ifndef SAMATTN_HOST_DEVICE
#if defined(__CUDACC__)
#define SAMATTN_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define SAMATTN_HOST_DEVICE inline
#endif
#endif
