/* cuda_fault_shim.c — CUDA / cuBLAS error injection for tests of the cuda backend
 * (issue #14): link a test binary with this file and
 *   -Wl,--wrap=cudaMalloc,--wrap=cudaFree,--wrap=cudaMemcpyAsync,--wrap=cudaMemcpy,
 *   --wrap=cudaHostAlloc,--wrap=cudaFreeHost,--wrap=cudaMemsetAsync,--wrap=cudaGraphLaunch,
 *   --wrap=__cudaLaunchKernel (what <<<>>> calls since CUDA 12.8),
 *   --wrap=cudaStreamSynchronize,--wrap=cudaLaunchKernel,--wrap=cudaGetLastError,
 *   --wrap=cublasCreate_v2,--wrap=cublasSetStream_v2,--wrap=cublasSgemm_v2,--wrap=cublasGemmEx
 * (CMake: KILN_CUDA_FAULT_WRAP in tests/CMakeLists.txt; test: tests/gpu/test_cuda_fault.c).
 * Every wrapped call counts; kiln_cuda_fault_set(n) makes the n-th call from then fail with
 * the call's own error type (cudaErrorMemoryAllocation for allocations,
 * cudaErrorLaunchFailure otherwise, CUBLAS_STATUS_EXECUTION_FAILED for cuBLAS), once. A
 * failed kernel launch also makes the next cudaGetLastError report it, as the runtime
 * does. Walk N = 1..kiln_cuda_fault_count() over bind + a step as test_alloc_fault does
 * for allocations: each must end in KILN_ERR_DEVICE (circuit breaker where it applies),
 * no leak (cudaFree count balances cudaMalloc), engine usable afterwards.
 * Built only with KILN_CUDA; compiles without a GPU (not run on the 2-core CI machine). */
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <stdatomic.h>
#include <stdint.h>

static _Atomic uint64_t g_count, g_fail_at, g_live_allocs;
static _Atomic int g_pending_launch_error;

void kiln_cuda_fault_set(uint64_t n) {
    atomic_store(&g_fail_at, 0);
    atomic_store(&g_count, 0);
    atomic_store(&g_fail_at, n);
}
uint64_t kiln_cuda_fault_count(void) {
    return atomic_load(&g_count);
}
/* cudaMalloc'ed blocks not yet cudaFree'd through the wrappers (leak check). */
int64_t kiln_cuda_fault_live_allocs(void) {
    return (int64_t)atomic_load(&g_live_allocs);
}

static int should_fail(void) {
    uint64_t c = atomic_fetch_add(&g_count, 1) + 1;
    uint64_t f = atomic_load(&g_fail_at);
    return f != 0 && c == f;
}

cudaError_t __real_cudaMalloc(void **p, size_t n);
cudaError_t __wrap_cudaMalloc(void **p, size_t n) {
    if (should_fail()) return cudaErrorMemoryAllocation;
    cudaError_t e = __real_cudaMalloc(p, n);
    if (e == cudaSuccess) atomic_fetch_add(&g_live_allocs, 1);
    return e;
}
cudaError_t __real_cudaFree(void *p);
cudaError_t __wrap_cudaFree(void *p) {
    if (p) atomic_fetch_sub(&g_live_allocs, 1);
    return __real_cudaFree(p); /* frees are never failed: cleanup paths must run */
}
cudaError_t __real_cudaHostAlloc(void **p, size_t n, unsigned int flags);
cudaError_t __wrap_cudaHostAlloc(void **p, size_t n, unsigned int flags) {
    if (should_fail()) return cudaErrorMemoryAllocation;
    cudaError_t e = __real_cudaHostAlloc(p, n, flags);
    if (e == cudaSuccess) atomic_fetch_add(&g_live_allocs, 1);
    return e;
}
cudaError_t __real_cudaFreeHost(void *p);
cudaError_t __wrap_cudaFreeHost(void *p) {
    if (p) atomic_fetch_sub(&g_live_allocs, 1);
    return __real_cudaFreeHost(p);
}
cudaError_t __real_cudaMemsetAsync(void *d, int v, size_t n, cudaStream_t st);
cudaError_t __wrap_cudaMemsetAsync(void *d, int v, size_t n, cudaStream_t st) {
    return should_fail() ? cudaErrorLaunchFailure : __real_cudaMemsetAsync(d, v, n, st);
}
cudaError_t __real_cudaGraphLaunch(cudaGraphExec_t g, cudaStream_t st);
cudaError_t __wrap_cudaGraphLaunch(cudaGraphExec_t g, cudaStream_t st) {
    return should_fail() ? cudaErrorLaunchFailure : __real_cudaGraphLaunch(g, st);
}
#if CUDART_VERSION >= 12080
/* nvcc's kernel launch stubs (<<<>>>) call this internal entry point, not cudaLaunchKernel */
cudaError_t __real___cudaLaunchKernel(cudaKernel_t k, dim3 g, dim3 b, void **a, size_t sh,
                                      cudaStream_t st);
cudaError_t __wrap___cudaLaunchKernel(cudaKernel_t k, dim3 g, dim3 b, void **a, size_t sh,
                                      cudaStream_t st) {
    if (should_fail()) {
        atomic_store(&g_pending_launch_error, 1);
        return cudaErrorLaunchFailure;
    }
    return __real___cudaLaunchKernel(k, g, b, a, sh, st);
}
#endif
cudaError_t __real_cudaMemcpy(void *d, const void *s, size_t n, enum cudaMemcpyKind k);
cudaError_t __wrap_cudaMemcpy(void *d, const void *s, size_t n, enum cudaMemcpyKind k) {
    return should_fail() ? cudaErrorLaunchFailure : __real_cudaMemcpy(d, s, n, k);
}
cudaError_t __real_cudaMemcpyAsync(void *d, const void *s, size_t n, enum cudaMemcpyKind k,
                                   cudaStream_t st);
cudaError_t __wrap_cudaMemcpyAsync(void *d, const void *s, size_t n, enum cudaMemcpyKind k,
                                   cudaStream_t st) {
    return should_fail() ? cudaErrorLaunchFailure : __real_cudaMemcpyAsync(d, s, n, k, st);
}
cudaError_t __real_cudaStreamSynchronize(cudaStream_t st);
cudaError_t __wrap_cudaStreamSynchronize(cudaStream_t st) {
    return should_fail() ? cudaErrorLaunchFailure : __real_cudaStreamSynchronize(st);
}
cudaError_t __real_cudaLaunchKernel(const void *f, dim3 g, dim3 b, void **a, size_t sh,
                                    cudaStream_t st);
cudaError_t __wrap_cudaLaunchKernel(const void *f, dim3 g, dim3 b, void **a, size_t sh,
                                    cudaStream_t st) {
    if (should_fail()) {
        atomic_store(&g_pending_launch_error, 1);
        return cudaErrorLaunchFailure;
    }
    return __real_cudaLaunchKernel(f, g, b, a, sh, st);
}
cudaError_t __real_cudaGetLastError(void);
cudaError_t __wrap_cudaGetLastError(void) {
    cudaError_t e = __real_cudaGetLastError();
    if (atomic_exchange(&g_pending_launch_error, 0)) return cudaErrorLaunchFailure;
    return e;
}
cublasStatus_t __real_cublasCreate_v2(cublasHandle_t *h);
cublasStatus_t __wrap_cublasCreate_v2(cublasHandle_t *h) {
    return should_fail() ? CUBLAS_STATUS_ALLOC_FAILED : __real_cublasCreate_v2(h);
}
cublasStatus_t __real_cublasSetStream_v2(cublasHandle_t h, cudaStream_t s);
cublasStatus_t __wrap_cublasSetStream_v2(cublasHandle_t h, cudaStream_t s) {
    return should_fail() ? CUBLAS_STATUS_EXECUTION_FAILED : __real_cublasSetStream_v2(h, s);
}
cublasStatus_t __real_cublasSgemm_v2(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb,
                                     int m, int n, int k, const float *al, const float *A, int lda,
                                     const float *B, int ldb, const float *be, float *C, int ldc);
cublasStatus_t __wrap_cublasSgemm_v2(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb,
                                     int m, int n, int k, const float *al, const float *A, int lda,
                                     const float *B, int ldb, const float *be, float *C, int ldc) {
    if (should_fail()) return CUBLAS_STATUS_EXECUTION_FAILED;
    return __real_cublasSgemm_v2(h, ta, tb, m, n, k, al, A, lda, B, ldb, be, C, ldc);
}
cublasStatus_t __real_cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb,
                                   int m, int n, int k, const void *al, const void *A,
                                   cudaDataType at, int lda, const void *B, cudaDataType bt,
                                   int ldb, const void *be, void *C, cudaDataType ct, int ldc,
                                   cublasComputeType_t comp, cublasGemmAlgo_t algo);
cublasStatus_t __wrap_cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb,
                                   int m, int n, int k, const void *al, const void *A,
                                   cudaDataType at, int lda, const void *B, cudaDataType bt,
                                   int ldb, const void *be, void *C, cudaDataType ct, int ldc,
                                   cublasComputeType_t comp, cublasGemmAlgo_t algo) {
    if (should_fail()) return CUBLAS_STATUS_EXECUTION_FAILED;
    return __real_cublasGemmEx(h, ta, tb, m, n, k, al, A, at, lda, B, bt, ldb, be, C, ct, ldc, comp,
                               algo);
}
