#!/usr/bin/env python3
"""Writes tests/data/quant_goldens.bin: bit-compatibility goldens for kiln's reference
quantizers (src/format/quants*.c), produced by the numpy code of the `gguf` Python
package (gguf-py, llama.cpp's own reader/writer), independently of kiln.

    pip install gguf numpy
    python3 scripts/gen-quant-goldens.py [out.bin]

Records (all little-endian):
    file   := "KQG1" u32 version(=1) u32 n_records record*
    record := u32 type_id u32 kind u32 n_elems u32 n_bytes payload
    kind 0 (dequantize): payload = bytes[n_bytes] f32[n_elems]  (gguf.quants.dequantize)
    kind 1 (quantize):   payload = f32[n_elems] bytes[n_bytes]  (gguf.quants.quantize)

Dequantize inputs are random block bytes in which every f16 scale field is replaced by a
random *finite* f16 bit pattern (any finite value: normals, subnormals, zero, both signs),
so outputs are finite and comparable bit for bit; the quant bits are fully random. The
C test separately checks that fully random bytes (inf / NaN scales) never crash.

Quantize inputs are normal data with per-block scales spanning 1e-6..1e3, plus edge
blocks: all zeros, constant, one outlier, exact ties (x / d = k + 0.5).
gguf-py quantizes f16, bf16, q4_0, q4_1, q5_0, q5_1, q8_0 (not the K types).
"""
import struct
import sys

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import dequantize, quantize

SEED = 20261122
rng = np.random.default_rng(SEED)

# byte offsets of f16 fields inside one block
F16_FIELDS = {
    T.Q4_0: [0], T.Q4_1: [0, 2], T.Q5_0: [0], T.Q5_1: [0, 2], T.Q8_0: [0],
    T.Q2_K: [80, 82], T.Q3_K: [108], T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208],
}


def finite_f16_bits(n):
    b = rng.integers(0, 1 << 16, size=n, dtype=np.uint32).astype(np.uint16)
    exp = (b >> 10) & 0x1F
    b = np.where(exp == 0x1F, b & np.uint16(0xBFFF), b)  # exponent 31 -> 15 (finite)
    return b.astype(np.uint16)


def dequant_record(qtype, n_blocks):
    bs, ts = GGML_QUANT_SIZES[qtype]
    if qtype in (T.F16, T.BF16):
        if qtype == T.F16:
            raw = finite_f16_bits(n_blocks)
        else:
            raw = rng.integers(0, 1 << 16, size=n_blocks, dtype=np.uint32).astype(np.uint16)
            # bf16 NaN payloads survive unchanged either way, but keep the golden finite
            exp = (raw >> 7) & 0xFF
            raw = np.where(exp == 0xFF, raw & np.uint16(0xBFFF), raw).astype(np.uint16)
        data = raw.view(np.uint8).copy()
        n = n_blocks
    else:
        data = rng.integers(0, 256, size=(n_blocks, ts), dtype=np.uint16).astype(np.uint8)
        for off in F16_FIELDS[qtype]:
            data[:, off:off + 2] = finite_f16_bits(n_blocks).view(np.uint8).reshape(n_blocks, 2)
        n = n_blocks * bs
    if qtype == T.F16:
        out = data.view(np.float16).astype(np.float32)
    else:
        out = dequantize(data.reshape(1, -1), qtype).astype(np.float32).reshape(-1)
    assert out.size == n and np.all(np.isfinite(out)), qtype.name
    return (int(qtype), 0, n, data.tobytes(), out.astype("<f4").tobytes())


def quant_input(n_blocks, bs):
    x = rng.standard_normal((n_blocks, bs)).astype(np.float32)
    scales = (10.0 ** rng.uniform(-6, 3, size=(n_blocks, 1))).astype(np.float32)
    x *= scales
    x[0] = 0  # all zeros
    x[1] = 0.25  # constant
    x[2] = 0.001 * rng.standard_normal(bs)
    x[2, 5] = -7.0  # one outlier (negative max)
    # ties: values at exact half-steps of the q8_0 / q4_0 grids
    x[3] = (np.arange(bs) - bs / 2 + 0.5).astype(np.float32) * np.float32(0.125)
    x[4] = rng.integers(-8, 8, size=bs).astype(np.float32) * np.float32(0.5)
    x[4, 0] = -4.0
    return x.astype(np.float32)


def quant_record(qtype, n_blocks):
    bs, _ = GGML_QUANT_SIZES[qtype]
    if qtype in (T.F16, T.BF16):
        bs = 32
    x = quant_input(n_blocks, bs)
    if qtype == T.F16:
        x[5, :4] = [1e6, -1e6, 6e-8, 3e-5]  # overflow to inf, subnormals
        q = x.astype(np.float16).view(np.uint8)
    else:
        q = quantize(x.reshape(1, -1), qtype)
    return (int(qtype), 1, x.size, q.tobytes(), x.astype("<f4").tobytes())


def main():
    out_path = sys.argv[1] if len(sys.argv) > 1 else "tests/data/quant_goldens.bin"
    recs = []
    for t in (T.F16, T.BF16):
        recs.append(dequant_record(t, 256))
    for t in (T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0):
        recs.append(dequant_record(t, 24))
    for t in (T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K):
        recs.append(dequant_record(t, 4))
    for t in (T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0):
        recs.append(quant_record(t, 24))
    with open(out_path, "wb") as f:
        f.write(b"KQG1" + struct.pack("<II", 1, len(recs)))
        for type_id, kind, n, qbytes, fbytes in recs:
            f.write(struct.pack("<IIII", type_id, kind, n, len(qbytes)))
            if kind == 0:
                f.write(qbytes + fbytes)
            else:
                f.write(fbytes + qbytes)
    print(f"wrote {out_path}: {len(recs)} records")


if __name__ == "__main__":
    main()
