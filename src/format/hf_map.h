/*
 * hf_map.h — Hugging Face conventions mapped onto GGUF ones, so that a safetensors model
 * looks like its GGUF conversion (see model_file.h for the rules and the differences
 * that remain).
 *
 *  - kiln_hf_config_to_meta: config.json -> metadata with llama.cpp's GGUF key names for
 *    the families llama (also mistral), qwen2, qwen3 and gemma3 (gemma3_text, and the
 *    text_config of Gemma3ForConditionalGeneration). Every top-level scalar, string or
 *    array of scalars/strings is also stored as `hf.config.<key>`.
 *  - kiln_hf_tensor_name: `model.layers.7.self_attn.q_proj.weight` ->
 *    `blk.7.attn_q.weight`, with the fixup the loader must apply (Gemma norms: +1).
 *
 * The mapping tables are data (one row per tensor kind), in hf_map.c.
 */
#ifndef KILN_FORMAT_HF_MAP_H
#define KILN_FORMAT_HF_MAP_H

#include "base/status.h"
#include "format/meta.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Parses config.json text (len bytes; `path` names it in errors) into m (which must be
 * initialized and empty). The architecture name is general.architecture. Errors: JSON
 * syntax (with line/column), not an object, an unknown model (KILN_ERR_UNSUPPORTED naming
 * model_type / architectures), a required field (num_hidden_layers, hidden_size,
 * num_attention_heads) missing or of the wrong type (naming it). */
kiln_status kiln_hf_config_to_meta(const char *text, size_t len, const char *path, kiln_meta *m,
                                   kiln_err *err);

/* Maps an HF tensor name for arch ("llama", "qwen2", "qwen3", "gemma3") to the GGUF
 * name in out (NUL-terminated). Returns false when the name has no mapping (out is then
 * a copy of hf_name, cut to n-1 bytes). *fixup gets a kiln_tensor_fixup. */
bool kiln_hf_tensor_name(const char *arch, const char *hf_name, char *out, size_t n,
                         uint32_t *fixup);

#endif /* KILN_FORMAT_HF_MAP_H */
