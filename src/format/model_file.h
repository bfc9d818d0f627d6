/*
 * model_file.h — one model, whatever it is stored in: the family-independent view that
 * model families, the tokenizer and the loader read.
 *
 * kiln_model_file_open(path) detects the source:
 *   - a GGUF file (magic "GGUF");
 *   - a safetensors file (`*.safetensors`), with config.json / tokenizer.json from the
 *     same directory;
 *   - a directory holding model.safetensors.index.json (sharded) or model.safetensors;
 *   - a model.safetensors.index.json file.
 * and gives, for every source:
 *   - the metadata view (meta.h) with GGUF key names. For safetensors, HF config.json is
 *     mapped (hf_map.h): `general.architecture` ("llama", "qwen2", "qwen3", "gemma3"),
 *     `<arch>.block_count`, `<arch>.embedding_length`, `<arch>.feed_forward_length`,
 *     `<arch>.context_length`, `<arch>.attention.head_count`, `..head_count_kv`,
 *     `..key_length`, `..value_length`, `..layer_norm_rms_epsilon`, `<arch>.rope.freq_base`
 *     and the rest, exactly as llama.cpp's converter names them; every top-level scalar
 *     or array of config.json is also kept raw as `hf.config.<key>`.
 *   - the tensor table with GGUF tensor names (`token_embd.weight`,
 *     `blk.N.attn_q.weight`, `blk.N.ffn_down.weight`, `output_norm.weight`, ...); HF names
 *     (`model.layers.N.self_attn.q_proj.weight`) are mapped for the llama, qwen2, qwen3
 *     and gemma3 families; tensors with no mapping keep their HF name (a family never
 *     asks for them). kiln_model_file_tensor_src_name() gives the stored name.
 *     Shapes are in ggml order in both cases (HF [out, in] -> shape {in, out}), so a
 *     weight has the same shape whichever source it came from.
 *
 * Source differences a family must know (everything else is identical):
 *   - RoPE layout of llama-family q/k weights: llama.cpp's converter stores attn_q /
 *     attn_k rows PERMUTED for "normal" (interleaved-pair) RoPE; HF safetensors are not
 *     permuted, which is NEOX-style (half-split) RoPE on the same weights. So a llama
 *     family uses normal RoPE for KILN_SOURCE_GGUF and NEOX RoPE for
 *     KILN_SOURCE_SAFETENSORS (kiln_model_file_source()). qwen2/qwen3/gemma3 use NEOX in
 *     both (their converters do not permute).
 *   - Gemma RMSNorm weights: GGUF stores 1 + w, HF stores w. The model file marks those
 *     tensors with KILN_FIXUP_ADD_ONE and the loader adds the one (families see GGUF
 *     values). Such a tensor cannot be aliased.
 *   - Gemma 3 GGUF token_embd drops rows past the tokenizer's vocabulary; HF keeps the
 *     padded rows. Families take the vocabulary size from the tokenizer, the row count
 *     from the tensor.
 *   - llama3 RoPE scaling: GGUF carries the factors as tensor `rope_freqs.weight`; from
 *     config.json kiln maps `llama.rope.scaling.type` = "llama3" with
 *     `..factor`, `..low_freq_factor`, `..high_freq_factor`,
 *     `..original_context_length`, and the family computes the factors.
 *   - Tokenizer: GGUF carries `tokenizer.ggml.*` in the metadata; a safetensors model
 *     has tokenizer.json, whose path kiln_model_file_tokenizer_json() gives (NULL for
 *     GGUF, or when absent). `tokenizer.ggml.bos_token_id` / `eos_token_id` are mapped
 *     from config.json when present.
 *
 * Ownership: the model file owns every file it opened (mappings and descriptors), the
 * metadata table and the tensor table; every pointer handed out lives until
 * kiln_model_file_close. Immutable after open (read from any thread).
 */
#ifndef KILN_FORMAT_MODEL_FILE_H
#define KILN_FORMAT_MODEL_FILE_H

#include "base/status.h"
#include "format/meta.h"
#include "format/tensor.h"

#include <stddef.h>
#include <stdint.h>

typedef enum kiln_model_source {
    KILN_SOURCE_GGUF = 1,
    KILN_SOURCE_SAFETENSORS = 2,
} kiln_model_source;

/* "gguf" / "safetensors". */
const char *kiln_model_source_name(kiln_model_source s);

/* One file that holds tensor bytes (a GGUF file, or one safetensors shard). */
typedef struct kiln_model_shard {
    const char *path;
    int fd;               /* open read-only, for pread / io_uring */
    const uint8_t *base;  /* read-only mapping of the whole file */
    uint64_t size;        /* file size */
    uint64_t data_offset; /* where the data section starts */
    uint32_t alignment;   /* GGUF alignment; for safetensors the largest power of two
                             (<= 64) dividing every tensor offset of the shard */
} kiln_model_shard;

typedef struct kiln_model_file kiln_model_file;

/* Opens and validates a model (see above for what path may be). flags: KILN_FILE_*. */
kiln_status kiln_model_file_open(const char *path, uint32_t flags, kiln_model_file **out,
                                 kiln_err *err);
/* NULL-safe. */
void kiln_model_file_close(kiln_model_file *mf);

kiln_model_source kiln_model_file_source(const kiln_model_file *mf);
/* The path given to open. */
const char *kiln_model_file_path(const kiln_model_file *mf);
/* general.architecture as a NUL-terminated string ("" when absent). */
const char *kiln_model_file_arch(const kiln_model_file *mf);
const kiln_meta *kiln_model_file_meta(const kiln_model_file *mf);

size_t kiln_model_file_tensor_count(const kiln_model_file *mf);
const kiln_tensor_info *kiln_model_file_tensor(const kiln_model_file *mf, size_t i);
/* By GGUF name (for safetensors, the mapped name). NULL when absent. */
const kiln_tensor_info *kiln_model_file_find_tensor(const kiln_model_file *mf, const char *name);
/* The name as stored in the file (the HF name for safetensors). */
const char *kiln_model_file_tensor_src_name(const kiln_model_file *mf, size_t i);

size_t kiln_model_file_shard_count(const kiln_model_file *mf);
const kiln_model_shard *kiln_model_file_shard(const kiln_model_file *mf, size_t i);

/* Path of tokenizer.json next to a safetensors model, or NULL. */
const char *kiln_model_file_tokenizer_json(const kiln_model_file *mf);
/* Total bytes of all tensors. */
uint64_t kiln_model_file_tensor_bytes(const kiln_model_file *mf);

#endif /* KILN_FORMAT_MODEL_FILE_H */
