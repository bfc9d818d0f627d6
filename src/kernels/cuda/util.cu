/*
 * util.cu — device utilities that are not kernels of an op: the streaming read used to
 * measure the device's read bandwidth (the decode bound of docs/PERF.md).
 */
#include "kernels/cuda/common.cuh"

__global__ void read_kernel(const uint4 *__restrict__ p, size_t n, float *sink) {
    uint32_t acc = 0;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i + 3 * stride < n; i += 4 * stride) {
        uint4 a = __ldcs(p + i), b = __ldcs(p + i + stride), c = __ldcs(p + i + 2 * stride),
              d = __ldcs(p + i + 3 * stride);
        acc ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^
               d.z ^ d.w;
    }
    for (; i < n; i += stride) {
        uint4 a = __ldcs(p + i);
        acc ^= a.x ^ a.y ^ a.z ^ a.w;
    }
    if (acc == 0x12345678u) sink[(blockIdx.x * blockDim.x + threadIdx.x) & 1023] = 1.0f;
}

extern "C" kiln_status kiln_cuda_read_bandwidth(void *stream, const void *buf, size_t bytes,
                                                float *sink) {
    int dev = 0, sms = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
        return KILN_ERR_DEVICE;
    read_kernel<<<sms * 8, 256, 0, (cudaStream_t)stream>>>((const uint4 *)buf, bytes / 16, sink);
    return kc_launched();
}
