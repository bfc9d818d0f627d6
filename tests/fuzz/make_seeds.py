#!/usr/bin/env python3
"""Writes the seed corpora of the GGUF and safetensors fuzzers (committed output):

  tests/fuzz/corpus/fuzz_gguf/         small GGUF files written by gguf-py (every value
                                       type, nested arrays, quantized tensors, v2 and v3,
                                       custom alignment) and truncated prefixes of the
                                       vocab GGUFs in ../shared/testdata/tokenizer
  tests/fuzz/corpus/fuzz_safetensors/  small safetensors files (several dtypes, metadata,
                                       empty tensors) and HF config.json texts

Run from the repository root: python3 tests/fuzz/make_seeds.py  (needs `pip install gguf numpy`).
"""
import json
import os
import struct
import sys

import numpy as np
import gguf

ROOT = os.path.dirname(os.path.abspath(__file__))
G = os.path.join(ROOT, "corpus", "fuzz_gguf")
S = os.path.join(ROOT, "corpus", "fuzz_safetensors")
SHARED = os.path.join(ROOT, "..", "..", "..", "shared", "testdata", "tokenizer")


def write_gguf(name, build, alignment=None, endian=None):
    path = os.path.join(G, name)
    w = gguf.GGUFWriter(path, "llama")
    if alignment:
        w.add_custom_alignment(alignment)
    build(w)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def rich(w):
    w.add_uint32("llama.block_count", 2)
    w.add_float32("llama.rope.freq_base", 10000.0)
    w.add_uint8("t.u8", 7)
    w.add_int8("t.i8", -7)
    w.add_uint16("t.u16", 700)
    w.add_int16("t.i16", -700)
    w.add_int32("t.i32", -70000)
    w.add_uint64("t.u64", 1 << 40)
    w.add_int64("t.i64", -(1 << 40))
    w.add_float64("t.f64", 0.1)
    w.add_bool("t.bool", True)
    w.add_string("general.name", "seed")
    w.add_array("tokenizer.ggml.tokens", ["<s>", "a", "bc", "\u00e9"])
    w.add_array("tokenizer.ggml.scores", [0.0, -1.0, -2.0, -3.0])
    w.add_array("tokenizer.ggml.token_type", [3, 1, 1, 1])
    w.add_array("t.nested", [[1, 2], [3]])
    rng = np.random.default_rng(1)
    w.add_tensor("token_embd.weight", rng.standard_normal((4, 32), dtype=np.float32))
    w.add_tensor("output_norm.weight", rng.standard_normal(32, dtype=np.float32).astype(np.float16))
    q = gguf.quants.quantize(rng.standard_normal((2, 64), dtype=np.float32), gguf.GGMLQuantizationType.Q8_0)
    w.add_tensor("blk.0.attn_q.weight", q, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    # gguf-py cannot quantize q4_K: random bytes with a q4_K shape (any bytes are a valid block)
    q4 = rng.integers(0, 255, (1, 144), dtype=np.uint8)
    w.add_tensor("blk.0.ffn_down.weight", q4, raw_dtype=gguf.GGMLQuantizationType.Q4_K)


def tiny(w):
    w.add_uint32("llama.context_length", 16)
    w.add_tensor("a", np.arange(8, dtype=np.float32))


def st_file(name, tensors, metadata=None):
    header = {}
    if metadata is not None:
        header["__metadata__"] = metadata
    data = b""
    for tname, (dtype, shape, raw) in tensors.items():
        header[tname] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(os.path.join(S, name), "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + data)


def main():
    os.makedirs(G, exist_ok=True)
    os.makedirs(S, exist_ok=True)
    write_gguf("rich_v3.gguf", rich)
    write_gguf("tiny_v3.gguf", tiny)
    write_gguf("align64.gguf", tiny, alignment=64)
    # a v2 file: same bytes with the version field set to 2 (v2 and v3 share the layout)
    with open(os.path.join(G, "tiny_v3.gguf"), "rb") as f:
        b = bytearray(f.read())
    b[4:8] = struct.pack("<I", 2)
    with open(os.path.join(G, "tiny_v2.gguf"), "wb") as f:
        f.write(b)
    # truncated prefixes of real vocab files (metadata-heavy; the full files are 1-2 MB)
    for vocab in ["ggml-vocab-llama-spm.gguf", "ggml-vocab-gpt-2.gguf"]:
        p = os.path.join(SHARED, vocab)
        if os.path.exists(p):
            with open(p, "rb") as f:
                head = f.read(12000)
            with open(os.path.join(G, "prefix-" + vocab), "wb") as f:
                f.write(head)
    rng = np.random.default_rng(2)
    st_file("mixed.safetensors", {
        "model.embed_tokens.weight": ("BF16", [4, 8], rng.integers(0, 65535, 32, dtype=np.uint16).tobytes()),
        "model.norm.weight": ("F32", [8], rng.standard_normal(8, dtype=np.float32).tobytes()),
        "model.layers.0.self_attn.q_proj.weight": ("F16", [8, 8], rng.standard_normal(64).astype(np.float16).tobytes()),
        "idx": ("I64", [2], np.array([1, 2], dtype=np.int64).tobytes()),
        "empty": ("F32", [0, 3], b""),
    }, metadata={"format": "pt"})
    st_file("scalar.safetensors", {"s": ("I8", [], b"\x05")})
    st_file("empty.safetensors", {})
    for name, cfg in {
        "config-llama.json": {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
                              "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2,
                              "rope_theta": 500000.0, "rope_scaling": {"rope_type": "llama3", "factor": 8.0,
                              "original_max_position_embeddings": 8192}, "eos_token_id": [1, 2]},
        "config-gemma3.json": {"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
                               "text_config": {"hidden_size": 32, "num_attention_heads": 2, "num_hidden_layers": 2,
                                               "sliding_window": 512, "layer_types": ["sliding_attention"]}},
    }.items():
        with open(os.path.join(S, name), "w") as f:
            json.dump(cfg, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
