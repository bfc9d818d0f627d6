#!/usr/bin/env python3
"""Checks kiln-gen output against llama.cpp by hand (not a CI test: it needs a llama.cpp
build and the `tokenizers` package). docs/GENERATOR.md reports its results.

    pip install tokenizers
    LLAMA_CPP_BIN=/work/llama.cpp/build/bin python3 scripts/check-kiln-gen.py [build/kiln-gen]

1. tiny models of every family in several types: llama-simple loads each and generates;
   the greedy text must differ between two prompts (no input echo) for each family.
2. tokenizer.json of --format hf against llama-tokenize on the GGUF of the same
   vocabulary (built-in, and every vocab GGUF of ../shared/testdata/tokenizer plus the
   Gemma 3 model when present): identical token ids on a set of strings.
"""
import os
import subprocess
import sys
import tempfile

GEN = sys.argv[1] if len(sys.argv) > 1 else "build/kiln-gen"
BIN = os.environ.get("LLAMA_CPP_BIN", "/work/llama.cpp/build/bin")
SHARED = os.environ.get("KILN_SHARED_DIR", os.path.join(os.path.dirname(__file__), "../../shared"))
TEXTS = ["Hello world", "the cat sat on the mat.", "Once upon a time, there was a little girl.",
         "  leading spaces and\ttabs\nnewline", "numbers 12345 and UPPER case",
         "\u00fcn\u00efc\u00f6d\u00e9 \u00e7hars \u65e5\u672c\u8a9e", "xyz qqq zzzz"]


def gen(*args):
    subprocess.run([GEN, "-q", *args], check=True)


def simple(model, prompt):
    r = subprocess.run([f"{BIN}/llama-simple", "-m", model, "-n", "12", prompt],
                       capture_output=True, text=True, errors="replace", timeout=300)
    if r.returncode != 0:
        raise RuntimeError(f"llama-simple failed on {model}: {r.stderr[-500:]}")
    return r.stdout


def llama_tokenize(model, text):
    r = subprocess.run([f"{BIN}/llama-tokenize", "-m", model, "-p", text, "--ids", "--log-disable"],
                       capture_output=True, text=True, timeout=120, check=True)
    return eval(r.stdout.strip().splitlines()[-1])


def main():
    from tokenizers import Tokenizer
    bad = 0
    with tempfile.TemporaryDirectory() as d:
        for fam in ("llama", "qwen2", "qwen3", "gemma3"):
            for ty in ("f16", "q8_0", "q4_0", "q4_K", "q6_K"):
                p = f"{d}/{fam}-{ty}.gguf"
                gen("-f", fam, "-t", ty, "-o", p)
                a, b = simple(p, "the cat"), simple(p, "once upon a time")
                tail_a, tail_b = a.split("the cat", 1)[-1], b.split("once upon a time", 1)[-1]
                echo = tail_a.strip("t ") == "" or tail_b.strip("e ") == ""
                print(f"{fam:7} {ty:5} ok{'  ECHO' if echo else ''}: {a.strip()!r}")
                bad += echo
        vocabs = [None]
        tdir = os.path.join(SHARED, "testdata/tokenizer")
        if os.path.isdir(tdir):
            vocabs += sorted(os.path.join(tdir, f) for f in os.listdir(tdir) if f.endswith(".gguf"))
        gemma = os.path.expanduser("~/.cache/kiln/models/gemma-3-270m-q4_k_m.gguf")
        if os.path.exists(gemma):
            vocabs.append(gemma)
        for v in vocabs:
            extra = ["--vocab", v] if v else []
            g, h = f"{d}/tok.gguf", f"{d}/tok-hf"
            gen("-f", "llama", "-t", "q8_0", *extra, "-o", g)
            gen("-f", "llama", "-t", "bf16", "--format", "hf", *extra, "-o", h)
            tk = Tokenizer.from_file(f"{h}/tokenizer.json")
            same = sum(llama_tokenize(g, t) == tk.encode(t).ids for t in TEXTS)
            print(f"tokenizer {os.path.basename(v) if v else 'built-in'}: {same}/{len(TEXTS)} identical")
            bad += same != len(TEXTS)
    print("all good" if not bad else f"{bad} problems")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
