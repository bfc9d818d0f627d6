/*
 * safetensors.h — a validating reader for one safetensors file.
 *
 * Layout: u64 little-endian N, then N bytes of UTF-8 JSON (the header), then the data
 * section. The header is an object: "__metadata__" (optional; string -> string) and one
 * entry per tensor: {"dtype": "BF16", "shape": [out, in], "data_offsets": [begin, end]}
 * with offsets relative to the data section.
 *
 * Validation at open (messages name the file and the tensor):
 *   file shorter than 8 bytes or than 8 + N (FORMAT "truncated"), N above 100 MiB
 *   (FORMAT "absurd header length"), JSON syntax errors and invalid UTF-8 (jansson,
 *   with line and column), duplicate keys (jansson JSON_REJECT_DUPLICATES), a header
 *   that is not an object, a tensor entry missing dtype/shape/data_offsets or with the
 *   wrong JSON types, negative dims, rank > 4 (UNSUPPORTED), dtypes kiln has no id for
 *   (U8, BOOL, F8_*, ...: UNSUPPORTED naming the dtype), end < begin, end beyond the
 *   data section, shape x dtype != end - begin, overlapping tensors, holes between
 *   tensors or unindexed trailing bytes (the format requires the buffer to be fully
 *   indexed), data not aligned to its element size, element count overflow.
 *
 * Tensors get the shape reversed into ggml order (tensor.h) and their stored (HF) names.
 * Ownership and lifetime as for kiln_gguf (gguf.h).
 */
#ifndef KILN_FORMAT_SAFETENSORS_H
#define KILN_FORMAT_SAFETENSORS_H

#include "base/status.h"
#include "format/meta.h"
#include "format/tensor.h"

#include <stddef.h>
#include <stdint.h>

#define KILN_ST_MAX_HEADER (100u << 20)

typedef struct kiln_safetensors kiln_safetensors;

kiln_status kiln_st_open(const char *path, uint32_t flags, kiln_safetensors **out, kiln_err *err);
/* Parses an image in memory (borrowed; it must outlive the object). */
kiln_status kiln_st_open_buffer(const void *data, size_t size, const char *name, uint32_t flags,
                                kiln_safetensors **out, kiln_err *err);
void kiln_st_close(kiln_safetensors *st); /* NULL-safe */

const char *kiln_st_path(const kiln_safetensors *st);
int kiln_st_fd(const kiln_safetensors *st); /* -1 for a buffer */
const void *kiln_st_base(const kiln_safetensors *st);
uint64_t kiln_st_file_size(const kiln_safetensors *st);
uint64_t kiln_st_data_offset(const kiln_safetensors *st);
/* Largest power of two <= 64 dividing every tensor's absolute offset (64 when none). */
uint32_t kiln_st_alignment(const kiln_safetensors *st);
/* "__metadata__" entries as strings (may be empty). */
const kiln_meta *kiln_st_meta(const kiln_safetensors *st);

size_t kiln_st_tensor_count(const kiln_safetensors *st);
/* Tensors in header order (jansson keeps insertion order). */
const kiln_tensor_info *kiln_st_tensor(const kiln_safetensors *st, size_t i);
const kiln_tensor_info *kiln_st_find_tensor(const kiln_safetensors *st, const char *name);

/* safetensors dtype string -> kiln dtype; false for dtypes kiln has no id for. */
bool kiln_st_dtype_from_name(const char *s, uint32_t *out);

#endif /* KILN_FORMAT_SAFETENSORS_H */
