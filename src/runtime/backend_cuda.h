/*
 * backend_cuda.h — the CUDA backend's kiln_backend (backend_cuda.c): the buffer interface
 * on cudaMalloc / pinned host memory / one stream per device. Only in CUDA builds.
 */
#ifndef KILN_RUNTIME_BACKEND_CUDA_H
#define KILN_RUNTIME_BACKEND_CUDA_H

#include "runtime/backend.h"

#ifdef KILN_HAVE_CUDA
extern const kiln_backend kiln_backend_cuda;
#endif

#endif /* KILN_RUNTIME_BACKEND_CUDA_H */
