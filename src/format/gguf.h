/*
 * gguf.h — a validating GGUF (v2, v3) reader.
 *
 * File layout (all integers little-endian):
 *   1. magic "GGUF" (4 bytes)
 *   2. version u32 (2 or 3; v1 used 32-bit counts and is refused)
 *   3. tensor_count u64, kv_count u64
 *   4. kv_count key/value pairs: key (string), value type u32, value
 *        string = u64 length + bytes (no NUL); array = elem type u32 + count u64 +
 *        elements (arrays may nest); scalars are stored in their size
 *   5. tensor_count tensor infos: name (string), n_dims u32 (<= 4), dims u64[n_dims]
 *        (ggml order: dims[0] is the row length), type u32 (a kiln_dtype id), offset u64
 *        relative to the data section, a multiple of the alignment
 *   6. padding to `general.alignment` (u32, a power of two; default 32)
 *   7. the data section, to the end of the file
 *
 * Validation at open (each failure returns a status whose message names the file and
 * the key or tensor):
 *   bad magic (KILN_ERR_FORMAT), version other than 2/3 or big-endian (UNSUPPORTED),
 *   truncated header, key, value or tensor info (FORMAT "truncated"), counts or string
 *   lengths that could not fit in the file (FORMAT "absurd"), size arithmetic overflow
 *   (OVERFLOW), unknown value types, arrays nested deeper than 8, bool bytes other
 *   than 0/1, empty keys or names, keys or tensor names that are not valid UTF-8,
 *   duplicate keys, duplicate tensor names, general.alignment not a u32 power of two,
 *   n_dims > 4, negative dims, unknown tensor type ids, row length not a multiple of
 *   the type's block size, tensor offset not a multiple of the alignment, tensor range
 *   outside the data section, overlapping tensors.
 * Known-but-unsupported tensor types (IQ*, TQ*, MXFP4, Q8_1, i8..f64) open with
 * `supported = false` (see tensor.h); KILN_FILE_REQUIRE_SUPPORTED refuses them at open.
 * String values are not checked for UTF-8 (vocabularies carry raw byte tokens).
 *
 * Ownership: a kiln_gguf owns its mapping (or borrows the caller's buffer, which must
 * outlive it), its metadata table and its tensor table. Every pointer handed out
 * (metadata strings, tensor names, tensor data) is valid until kiln_gguf_close. A
 * kiln_gguf is immutable after open: read it from any number of threads.
 *
 * Example:
 *   kiln_gguf *g; kiln_err e;
 *   if (kiln_gguf_open("m.gguf", 0, &g, &e)) { fprintf(stderr, "%s\n", e.msg); return; }
 *   uint32_t n_head;
 *   kiln_meta_get_u32(kiln_gguf_meta(g), "llama.attention.head_count", &n_head, &e);
 *   const kiln_tensor_info *t = kiln_gguf_find_tensor(g, "token_embd.weight");
 *   kiln_gguf_close(g);
 */
#ifndef KILN_FORMAT_GGUF_H
#define KILN_FORMAT_GGUF_H

#include "base/status.h"
#include "format/meta.h"
#include "format/tensor.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KILN_GGUF_MAGIC             0x46554747u /* "GGUF" read as a little-endian u32 */
#define KILN_GGUF_DEFAULT_ALIGNMENT 32u
#define KILN_GGUF_MAX_ARRAY_DEPTH   8

typedef struct kiln_gguf kiln_gguf;

/* Opens and validates path (mapped read-only with mmap; flags: KILN_FILE_*). */
kiln_status kiln_gguf_open(const char *path, uint32_t flags, kiln_gguf **out, kiln_err *err);
/* Parses a GGUF image in memory (borrowed: it must outlive the kiln_gguf). `name` is used
 * in messages (may be NULL: "<buffer>"). Used by tests and the fuzzer. */
kiln_status kiln_gguf_open_buffer(const void *data, size_t size, const char *name, uint32_t flags,
                                  kiln_gguf **out, kiln_err *err);
/* NULL-safe. Unmaps the file; every pointer obtained from g becomes invalid. */
void kiln_gguf_close(kiln_gguf *g);

const char *kiln_gguf_path(const kiln_gguf *g);
uint32_t kiln_gguf_version(const kiln_gguf *g);
uint32_t kiln_gguf_alignment(const kiln_gguf *g);
/* Absolute offset of the data section, and the file size. */
uint64_t kiln_gguf_data_offset(const kiln_gguf *g);
uint64_t kiln_gguf_file_size(const kiln_gguf *g);
/* Start of the file image (the read-only mapping or the caller's buffer). */
const void *kiln_gguf_base(const kiln_gguf *g);
/* The file descriptor (-1 for a buffer); owned by g, for pread / io_uring. */
int kiln_gguf_fd(const kiln_gguf *g);

/* The key/value section as a metadata view (see meta.h for the typed accessors). */
const kiln_meta *kiln_gguf_meta(const kiln_gguf *g);

size_t kiln_gguf_tensor_count(const kiln_gguf *g);
/* The i-th tensor in file order (NULL when i is out of range). */
const kiln_tensor_info *kiln_gguf_tensor(const kiln_gguf *g, size_t i);
const kiln_tensor_info *kiln_gguf_find_tensor(const kiln_gguf *g, const char *name);
/* Number of tensors with supported == false. */
size_t kiln_gguf_unsupported_count(const kiln_gguf *g);

#endif /* KILN_FORMAT_GGUF_H */
