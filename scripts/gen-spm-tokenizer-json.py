#!/usr/bin/env python3
"""Makes Hugging Face tokenizer.json files of the SentencePiece-style BPE kind (Llama 2,
Mistral, Gemma, TinyLlama) from an SPM ("llama") GGUF vocabulary, and the ids that HF
`tokenizers` gives for the shared tokenizer inputs, as test data for kiln's reader.

    PYTHONPATH=/tmp/hftok python3 scripts/gen-spm-tokenizer-json.py \\
        ../shared/testdata/tokenizer/ggml-vocab-llama-spm.gguf tests/data/tok/hf-spm

Needs `tokenizers` 0.23.3 (pip install --target /tmp/hftok tokenizers==0.23.3); not run in
CI. Writes, for STYLE in prepend (Llama 2 / TinyLlama: normalizer Prepend("▁") +
Replace(" ", "▁")) and metaspace (Mistral / newer: pre-tokenizer Metaspace, prepend
"first"):
  STYLE/tokenizer.json   BPE, byte_fallback, fuse_unk, merges derived from the pieces'
                         scores the way transformers' SpmConverter does
  STYLE/ids.txt          one line per input of the .inp file: HF's ids, no special tokens
The GGUF is read by the small reader below (metadata only). Only prepend/tokenizer.json
is committed (1.4 MB); tests/unit/test_tok_hf_spm.c rebuilds the Metaspace one from it by
swapping the normalizer for the same pre-tokenizer as here.
"""
import json
import os
import struct
import sys

from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers


def read_gguf_meta(path):
    with open(path, "rb") as f:
        data = f.read()
    if data[:4] != b"GGUF":
        raise SystemExit(f"{path}: not a GGUF file")
    off = 8
    _n_tensors, n_kv = struct.unpack_from("<QQ", data, off)
    off += 16
    scalar = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
              10: "<Q", 11: "<q", 12: "<d"}

    def value(t, off):
        if t in scalar:
            v = struct.unpack_from(scalar[t], data, off)[0]
            return v, off + struct.calcsize(scalar[t])
        if t == 8:
            n = struct.unpack_from("<Q", data, off)[0]
            return data[off + 8:off + 8 + n].decode("utf-8", "surrogateescape"), off + 8 + n
        if t == 9:
            et, n = struct.unpack_from("<IQ", data, off)
            off += 12
            out = []
            for _ in range(n):
                v, off = value(et, off)
                out.append(v)
            return out, off
        raise SystemExit(f"{path}: unknown GGUF type {t}")

    meta = {}
    for _ in range(n_kv):
        n = struct.unpack_from("<Q", data, off)[0]
        key = data[off + 8:off + 8 + n].decode()
        off += 8 + n
        t = struct.unpack_from("<I", data, off)[0]
        meta[key], off = value(t, off + 4)
    return meta


def spm_merges(pieces, scores):
    """transformers' SentencePieceExtractor: every split of a piece into two pieces of the
    vocabulary is a merge; merges ordered by the merged piece's score (descending),
    splits of one piece by the ids of their halves."""
    vocab = {p: i for i, p in enumerate(pieces)}
    merges = []
    for merge, score in sorted(zip(pieces, scores), key=lambda x: -x[1]):
        local = []
        for k in range(1, len(merge)):
            l, r = merge[:k], merge[k:]
            if l in vocab and r in vocab:
                local.append((l, r, score))
        local.sort(key=lambda x: (vocab[x[0]], vocab[x[1]]))
        merges.extend(local)
    merges.sort(key=lambda x: -x[2])
    return [(l, r) for l, r, _ in merges]


def main():
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    gguf, outdir = sys.argv[1], sys.argv[2]
    meta = read_gguf_meta(gguf)
    if meta.get("tokenizer.ggml.model") != "llama":
        raise SystemExit(f"{gguf}: not an SPM (llama) vocabulary")
    pieces = meta["tokenizer.ggml.tokens"]
    scores = meta["tokenizer.ggml.scores"]
    types = meta["tokenizer.ggml.token_type"]
    unk = pieces[meta.get("tokenizer.ggml.unknown_token_id", 0)]
    vocab = {p: i for i, p in enumerate(pieces)}
    merges = spm_merges(pieces, scores)
    inputs = open(gguf + ".inp", encoding="utf-8").read().split("\n__ggml_vocab_test__\n")
    if inputs and inputs[-1] == "":  # the file ends with a separator
        inputs.pop()
    for style in ("prepend", "metaspace"):
        tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token=unk, fuse_unk=True,
                                   byte_fallback=True))
        special = [p for p, t in zip(pieces, types) if t == 3]  # control: <s>, </s>
        tok.add_special_tokens(special)
        # user-defined pieces (Gemma's white-space runs, ...) as transformers' converter adds
        # them: matched in the raw text before the model, not special
        tok.add_tokens([AddedToken(p, normalized=False, special=False)
                        for p, t in zip(pieces, types) if t == 4])
        if style == "prepend":
            tok.normalizer = normalizers.Sequence(
                [normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
            tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                             decoders.Fuse(), decoders.Strip(" ", 1, 0)])
        else:
            tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first",
                                                         split=False)
            tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="first",
                                             split=False)
        d = os.path.join(outdir, style)
        os.makedirs(d, exist_ok=True)
        tok.save(os.path.join(d, "tokenizer.json"), pretty=False)
        with open(os.path.join(d, "ids.txt"), "w") as f:
            for text in inputs:
                ids = tok.encode(text, add_special_tokens=False).ids
                f.write(" ".join(map(str, ids)) + "\n")
        print(f"{d}: {len(pieces)} tokens, {len(merges)} merges, {len(inputs)} inputs")


if __name__ == "__main__":
    main()
