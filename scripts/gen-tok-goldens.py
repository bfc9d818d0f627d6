#!/usr/bin/env python3
"""Builds the Gemma 3 tokenizer golden corpus in tests/data/tok/gemma3/ and its
reference token ids from llama.cpp's llama-tokenize.

    LLAMA_TOKENIZE=/work/llama.cpp/build/bin/llama-tokenize \
    python3 scripts/gen-tok-goldens.py [MODEL.gguf]

MODEL defaults to the cached Gemma 3 270M GGUF (scripts/fetch-model.sh gemma3-270m).
This script never builds llama.cpp: it runs a prebuilt llama-tokenize named by
$LLAMA_TOKENIZE. For every <name>.txt it writes <name>.ids (ids on one line, space
separated), tokenized without BOS/EOS, without escape processing and without parsing
special tokens (kiln: `kiln tokenize -m MODEL --ids`); for "mixed" and "runs" also
<name>.special.ids with special tokens parsed (kiln: `--parse-special`).

Corpus (deterministic, seed fixed; everything generated here or taken from files
that may be copied verbatim):
  english   the GPL-3 and Apache-2.0 license texts (/usr/share/common-licenses)
  code      kiln's own C sources and scripts
  cjk       Chinese/Japanese/Korean text built from the vocabulary's own CJK pieces and
            random CJK code points (some outside the vocabulary: byte fallback)
  emoji     emoji, ZWJ sequences, skin tones, flags, keycaps, symbols
  spaces    runs of spaces, tabs, newlines, CRLF, NBSP, U+3000 ... between words
  mixed     all of the above interleaved, chat-template markup, invalid UTF-8 bytes
  runs      long runs of newlines, tabs and spaces (many overlapping special tokens)
"""
import os
import random
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
OUT = os.path.join(ROOT, "tests", "data", "tok", "gemma3")


def english():
    parts = []
    for name in ("GPL-3", "Apache-2.0"):
        with open(os.path.join("/usr/share/common-licenses", name), encoding="utf-8") as f:
            parts.append(f.read())
    return "\n\n".join(parts).encode()[:20000]


def code():
    files = ["src/tok/spm.c", "src/tok/bpe.c", "scripts/gen-tok-unicode.py"]
    out = []
    for p in files:
        with open(os.path.join(ROOT, p), "rb") as f:
            out.append(f.read())
    return b"\n".join(out)


def vocab_pieces():
    from gguf import GGUFReader

    r = GGUFReader(MODEL)
    f = r.fields["tokenizer.ggml.tokens"]
    return [bytes(f.parts[i]).decode("utf-8", "replace") for i in f.data]


def cjk(rng, pieces):
    def is_cjk(ch):
        o = ord(ch)
        return (0x4E00 <= o <= 0x9FFF or 0x3040 <= o <= 0x30FF or 0xAC00 <= o <= 0xD7A3)

    cjk_pieces = [p.replace("\u2581", "") for p in pieces if p and all(is_cjk(c) or c == "\u2581" for c in p)]
    cjk_pieces = [p for p in cjk_pieces if p]
    punct = ["，", "。", "、", "！", "？", "「", "」", "：", "；", " ", "\n", "（", "）", "・", "ー"]
    out = []
    for _ in range(4500):
        r = rng.random()
        if r < 0.75:
            out.append(rng.choice(cjk_pieces))
        elif r < 0.9:
            out.append(rng.choice(punct))
        else:  # random code point of the CJK blocks, incl. extension B (4-byte UTF-8)
            block = rng.choice([(0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0xAC00, 0xD7A3),
                                (0x20000, 0x2A6DF), (0x3040, 0x309F), (0x30A0, 0x30FF)])
            out.append(chr(rng.randint(*block)))
    return "".join(out).encode()


def emoji(rng):
    base = list(range(0x1F600, 0x1F64F)) + list(range(0x1F300, 0x1F5FF)) + \
        list(range(0x1F900, 0x1F9FF)) + list(range(0x2600, 0x26FF))
    tones = [0x1F3FB, 0x1F3FC, 0x1F3FD, 0x1F3FE, 0x1F3FF]
    out = []
    for _ in range(2500):
        r = rng.random()
        if r < 0.5:
            out.append(chr(rng.choice(base)))
        elif r < 0.6:
            out.append(chr(rng.choice([0x1F44D, 0x1F44B, 0x1F64F])) + chr(rng.choice(tones)))
        elif r < 0.7:  # ZWJ family / profession sequences
            out.append("\U0001F468\u200D\U0001F469\u200D\U0001F467" if rng.random() < 0.5
                       else "\U0001F469\U0001F3FD\u200D\U0001F4BB")
        elif r < 0.8:  # regional-indicator flags
            out.append(chr(0x1F1E6 + rng.randint(0, 25)) + chr(0x1F1E6 + rng.randint(0, 25)))
        elif r < 0.85:  # keycaps and variation selectors
            out.append(rng.choice("0123456789#*") + "\uFE0F\u20E3")
        elif r < 0.95:
            out.append(rng.choice([" ", "  ", "\n", " ok ", " lol", "!", "..."]))
        else:
            out.append(chr(rng.randint(0x1FA70, 0x1FAFF)))
    return "".join(out).encode()


def spaces(rng):
    words = ["alpha", "beta", "def", "x", "return", "日本", "😀", "über", "naïve", "42", "3.14"]
    ws = [" ", "\t", "\n", "\r\n", "\u00a0", "\u3000", "\u2009", "\u200b", "\v", "\f"]
    out = []
    for _ in range(1000):
        r = rng.random()
        if r < 0.45:
            out.append(rng.choice(words))
        elif r < 0.9:
            out.append(rng.choice(ws) * rng.choice([1, 1, 2, 3, 4, 7, 8, 16, 31, 64]))
        else:
            out.append("".join(rng.choice(ws) for _ in range(rng.randint(2, 12))))
    return "".join(out).encode()


def runs(rng):
    """Long runs of the characters Gemma has user-defined run tokens for (newlines, tabs)
    and of spaces: thousands of overlapping special-token matches per run."""
    out = []
    for _ in range(300):
        r = rng.random()
        if r < 0.3:
            out.append("\n" * rng.randint(1, 400))
        elif r < 0.55:
            out.append("\t" * rng.randint(1, 200))
        elif r < 0.7:
            out.append(" " * rng.randint(1, 100))
        elif r < 0.8:
            out.append(rng.choice(["\n\t", "\t\n", " \n", "\n "]) * rng.randint(1, 40))
        else:
            out.append(rng.choice(["word", "x", "日本", "<bos>", "<start_of_turn>", "😀"]))
    return "".join(out).encode()


def mixed(rng, parts):
    out = []
    markup = [b"<start_of_turn>user\n", b"<end_of_turn>\n", b"<start_of_turn>model\n", b"<bos>",
              b"<eos>", b"<pad>", b"<unused17>", b"[multimodal]", b"<start_of_image>", b"<mask>"]
    for _ in range(700):
        r = rng.random()
        if r < 0.8:
            src = rng.choice(parts)
            a = rng.randrange(len(src))
            out.append(src[a:a + rng.randint(1, 120)])  # may cut UTF-8 sequences
        elif r < 0.95:
            out.append(rng.choice(markup))
        else:
            out.append(bytes(rng.randrange(256) for _ in range(rng.randint(1, 6))))
    return b"".join(out)


def run_tokenizer(path, parse_special):
    exe = os.environ.get("LLAMA_TOKENIZE")
    if not exe:
        sys.exit("set LLAMA_TOKENIZE to a prebuilt llama-tokenize (this script does not build it)")
    cmd = [exe, "-m", MODEL, "-f", path, "--ids", "--no-bos", "--no-escape", "--log-disable"]
    if not parse_special:
        cmd.append("--no-parse-special")
    res = subprocess.run(cmd, capture_output=True, check=True)
    m = re.search(rb"\[([0-9, ]*)\]", res.stdout)
    if not m:
        sys.exit("unexpected llama-tokenize output: %r" % res.stdout[:200])
    return [int(x) for x in m.group(1).replace(b",", b" ").split()]


def main():
    rng = random.Random(20260115)
    os.makedirs(OUT, exist_ok=True)
    pieces = vocab_pieces()
    corpus = {"english": english(), "code": code(), "cjk": cjk(rng, pieces), "emoji": emoji(rng),
              "spaces": spaces(rng)}
    corpus["mixed"] = mixed(rng, list(corpus.values()))
    corpus["runs"] = runs(random.Random(7))
    for name, data in corpus.items():
        txt = os.path.join(OUT, name + ".txt")
        with open(txt, "wb") as f:
            f.write(data)
        for special in (False, True) if name in ("mixed", "runs") else (False,):
            ids = run_tokenizer(txt, special)
            suffix = ".special.ids" if special else ".ids"
            with open(os.path.join(OUT, name + suffix), "w") as f:
                f.write(" ".join(map(str, ids)) + "\n")
            print(f"{name}{suffix}: {len(data)} bytes -> {len(ids)} tokens")


if __name__ == "__main__":
    MODEL = sys.argv[1] if len(sys.argv) > 1 else os.path.expanduser(
        "~/.cache/kiln/models/gemma-3-270m-q4_k_m.gguf")
    main()
