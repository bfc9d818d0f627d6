#!/usr/bin/env python3
"""Golden ids for every pre-tokenizer regex set kiln implements, from llama.cpp.

    LLAMA_TOKENIZE=/path/to/llama-tokenize python3 scripts/gen-tok-pre-goldens.py

There is no vocabulary file for most pre-tokenizers here, so the GPT-2 vocabulary
(../shared/testdata/tokenizer/ggml-vocab-gpt-2.gguf) is written again with
tokenizer.ggml.pre set to each name (a temporary file) and llama-tokenize (prebuilt; this
script never builds llama.cpp) tokenizes tests/data/tok/pre/text.txt with it. The ids
are meaningless as language but exact as a test of the pre-tokenizer split (and of
ignore_merges where the name sets it): tests/unit/test_tok.c builds the same vocabulary
and compares. Output: tests/data/tok/pre/<name>.ids.
"""
import os
import random
import subprocess
import sys
import tempfile

from gguf import GGUFReader, GGUFValueType, GGUFWriter

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "data", "tok", "pre")
VOCAB = os.path.join(os.path.dirname(ROOT), "shared", "testdata", "tokenizer", "ggml-vocab-gpt-2.gguf")

# one name per regex set of src/tok/pretok.c
NAMES = ["default", "llama3", "jais-2", "deepseek-llm", "deepseek-v3", "deepseek-coder", "falcon",
         "starcoder", "gpt-2", "qwen2", "qwen35", "poro-chat", "viking", "tekken", "chameleon",
         "gpt-4o", "granite-embed-multi-97m", "bailingmoe", "seed-coder", "laguna", "exaone-moe",
         "minicpm5", "command-r", "olmo"]


def make_text():
    rng = random.Random(4)
    with open(os.path.join(ROOT, "tests", "data", "tok", "gemma3", "mixed.txt"), "rb") as f:
        mixed = f.read()
    snippets = [
        "It's I'LL we'Re they've SHE'D don't 's 't\n",
        "1 12 123 1234 12345 1234567 3.14159 ١٢٣ ⅷ ²³\n",
        "  two  spaces   three\t\ttabs \r\n\r\n\n\n   \u00a0nbsp \u3000ideo \u2009thin\n",
        "Ελληνικά Кириллица Ünïcödé naïve café ǅemal ΐΰ ώ K Ω ℭ\n",
        "日本語のテキスト、中文文本。한국어 텍스트！（全角）「括弧」\n",
        "e\u0301 a\u0308 \u0915\u093f \u0e01\u0e34 combining\n",
        "def f(x):\n    return x**2  # comment\n\tif(a<=b&&c!=d){y=z;}\n",
        "😀👍🏽👩‍💻🇩🇪 emoji!!! ...?? <sentinel:12> IMGIMGABCZ <s></s>\n",
        "x/y/z path/to/file.txt https://example.com/a?b=c&d=e\n",
    ]
    out = "".join(snippets).encode()
    for _ in range(6):
        a = rng.randrange(len(mixed) - 300)
        out += mixed[a:a + 250]
    return out


def write_vocab(path, pre):
    r = GGUFReader(VOCAB)
    w = GGUFWriter(path, arch="gpt2")
    for k, f in r.fields.items():
        if k.startswith("GGUF.") or k == "general.architecture":
            continue
        t = f.types[0]
        if k == "tokenizer.ggml.pre":
            w.add_key_value(k, pre, GGUFValueType.STRING)
        elif t == GGUFValueType.ARRAY:
            st = f.types[1]
            vals = [bytes(f.parts[i]) for i in f.data] if st == GGUFValueType.STRING else \
                [f.parts[i].tolist()[0] for i in f.data]
            w.add_key_value(k, vals, t, sub_type=st)
        elif t == GGUFValueType.STRING:
            w.add_key_value(k, bytes(f.parts[f.data[0]]).decode("utf-8"), t)
        else:
            w.add_key_value(k, f.parts[f.data[0]].tolist()[0], t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main():
    exe = os.environ.get("LLAMA_TOKENIZE")
    if not exe:
        sys.exit("set LLAMA_TOKENIZE to a prebuilt llama-tokenize (this script does not build it)")
    os.makedirs(OUT, exist_ok=True)
    text = os.path.join(OUT, "text.txt")
    with open(text, "wb") as f:
        f.write(make_text())
    with tempfile.TemporaryDirectory() as tmp:
        for name in NAMES:
            vocab = os.path.join(tmp, "v.gguf")
            write_vocab(vocab, name)
            res = subprocess.run([exe, "-m", vocab, "-f", text, "--ids", "--no-bos", "--no-escape",
                                  "--no-parse-special", "--log-disable"], capture_output=True)
            if res.returncode != 0:
                print(f"{name}: llama-tokenize failed: {res.stderr[-300:]!r}")
                continue
            ids = res.stdout.decode().strip().strip("[]").replace(",", " ").split()
            with open(os.path.join(OUT, name + ".ids"), "w") as f:
                f.write(" ".join(ids) + "\n")
            print(f"{name}: {len(ids)} tokens")


if __name__ == "__main__":
    main()
