/*
 * tensor.h — the description of one stored tensor, shared by every file format.
 *
 * Conventions (the same for GGUF and safetensors):
 *   - shape is in ggml order: shape[0] is the row length (the contiguous dimension),
 *     shape[1] the number of rows, ... A safetensors (row-major) shape [out, in] becomes
 *     shape = {in, out}. Unused dimensions are 1; rank is the stored number of dims
 *     (0..4).
 *   - dtype is a kiln_dtype id (src/format/dtype.h), always known to the dtype table;
 *     `supported` is false for types kiln cannot compute with (IQ*, TQ*, MXFP4, ...):
 *     such a file still opens (inspect can show it) but the loader refuses those tensors
 *     with KILN_ERR_UNSUPPORTED naming them. Open with KILN_FILE_REQUIRE_SUPPORTED to
 *     refuse them at open instead.
 *   - offset is absolute in the file (shard) `file`; nbytes = kiln_dtype_nbytes(shape)
 *     is checked at open and the range lies inside that file's data section.
 *   - data points at the bytes in the read-only mapping (valid while the file is open).
 */
#ifndef KILN_FORMAT_TENSOR_H
#define KILN_FORMAT_TENSOR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KILN_MAX_DIMS 4

/* Open flags shared by the GGUF, safetensors and model-file readers. */
enum {
    KILN_FILE_REQUIRE_SUPPORTED = 1u << 0, /* fail at open on a tensor kiln cannot use */
};

/* A value change the loader applies while loading so that every source yields what the
 * GGUF converter would have stored (families never see the difference). */
typedef enum kiln_tensor_fixup {
    KILN_FIXUP_NONE = 0,
    KILN_FIXUP_ADD_ONE = 1, /* w + 1 (Gemma RMSNorm weights from HF; GGUF stores 1 + w) */
} kiln_tensor_fixup;

typedef struct kiln_tensor_info {
    const char *name; /* NUL-terminated; the GGUF name (HF names are mapped, see model_file.h) */
    size_t name_len;
    uint32_t dtype; /* kiln_dtype id */
    bool supported; /* kiln_dtype_get(dtype)->supported */
    int rank;       /* 0..4 */
    int64_t shape[KILN_MAX_DIMS];
    uint32_t file;   /* index of the file (shard) holding the bytes; 0 for a single file */
    uint64_t offset; /* absolute byte offset in that file */
    uint64_t nbytes;
    const void *data; /* into the mapping */
    uint32_t fixup;   /* kiln_tensor_fixup; always NONE for GGUF */
} kiln_tensor_info;

/* Number of elements (product of the shape). */
static inline int64_t kiln_tensor_nelements(const kiln_tensor_info *t) {
    int64_t n = 1;
    for (int i = 0; i < KILN_MAX_DIMS; i++) n *= t->shape[i];
    return n;
}

#endif /* KILN_FORMAT_TENSOR_H */
