/**
 * @file host_device.h
 * @brief DEMB_HOST_DEVICE: marks inline rules shared by the CPU (g++) and CUDA (nvcc) kernels.
 *
 * The headers in this folder hold the rules both backends must agree on (hash, bucket, digest,
 * score updates, victim order). Under nvcc they compile as __host__ __device__; under g++ the
 * qualifiers vanish, so one definition serves both sides.
 */
#pragma once

#if defined(__CUDACC__) || defined(__HIPCC__)
#define DEMB_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define DEMB_HOST_DEVICE inline
#endif
