/*
 * layout.h — target layouts: how a tensor's bytes must look once loaded, and the
 * transforms that produce them from the stored bytes.
 *
 * A load request names a layout per tensor (kiln_load_target.layout). "native" (or NULL)
 * means the bytes as stored; anything else is a transform the transform lane (and the
 * residual and upload lanes, which share the code) runs while reading. Built in:
 *   native     bytes as stored (identity; applies the tensor's fixup to float types)
 *   f32        any supported type -> f32 (f16/bf16 converted, quantized dequantized
 *              with the reference kiln_dequantize_row)
 *   f16        f32/f16/bf16 -> f16 (round to nearest even); quantized types are refused
 *   bf16       f32/f16/bf16 -> bf16 (round to nearest even)
 *   blocks_x4  block-quantized 2-D weights with rows interleaved by 4: for each group
 *              of 4 rows, block b of rows 0,1,2,3, then block b+1 ... (the layout of
 *              4-row SIMD GEMV kernels); needs rows % 4 == 0 and a quantized type
 * The kernel layer registers more with kiln_layout_register (e.g. its own repacks).
 *
 * Transforms work row-wise: a row is shape[0] elements of the (possibly sharded) source
 * tensor; the output of rows [r0, r1) lies at r0 * out_row_bytes and is independent of
 * other rows (row_group rows are transformed together, and the loader only splits work
 * at multiples of row_group). So the loader can split a tensor into chunks, run them on
 * many threads, and get the same bytes as one call over the whole tensor.
 *
 * The registry is a process-wide singleton (kiln_layout_registry in layout.c): register
 * at startup, before loads run; lookups are lock-free reads of an append-only table.
 */
#ifndef KILN_LOAD_LAYOUT_H
#define KILN_LOAD_LAYOUT_H

#include "base/status.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct kiln_layout {
    const char *name; /* unique, e.g. "f32", "blocks_x4" */
    const char *summary;
    uint32_t row_group; /* rows transformed together (>= 1) */
    /* For a source type and row length: the output type and bytes per source row (the
     * output of n rows is n * out_row_bytes). KILN_ERR_UNSUPPORTED with a reason when
     * the layout cannot serve the tensor. n_rows is the tensor's row count (for layouts
     * that need a multiple of row_group). fixup: the tensor's kiln_tensor_fixup. */
    kiln_status (*plan)(uint32_t src_dtype, int64_t ne0, int64_t n_rows, uint32_t fixup,
                        uint32_t *out_dtype, uint64_t *out_row_bytes, kiln_err *err);
    /* Transforms n_rows rows (a multiple of row_group) of contiguous source rows into dst. */
    kiln_status (*run)(uint32_t src_dtype, int64_t ne0, uint32_t fixup, const void *src,
                       int64_t n_rows, void *dst, kiln_err *err);
    /* true: a tensor's row count need not be a multiple of row_group; the last group is
     * padded (the output holds ceil(n_rows / row_group) * row_group rows' bytes) and run
     * is then called with a partial group at the end. */
    bool pad_last_group;
} kiln_layout;

/* The layout called name (NULL and "" mean "native"), or NULL when unknown. */
const kiln_layout *kiln_layout_find(const char *name);
/* Adds a layout (the struct must stay valid for the process lifetime). KILN_ERR_STATE when
 * the name is taken, KILN_ERR_CAPACITY when the table (64 entries) is full. */
kiln_status kiln_layout_register(const kiln_layout *l, kiln_err *err);
/* Number of layouts and the i-th (for listings). */
size_t kiln_layout_count(void);
const kiln_layout *kiln_layout_at(size_t i);

#endif /* KILN_LOAD_LAYOUT_H */
