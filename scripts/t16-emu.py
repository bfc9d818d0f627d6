#!/usr/bin/env python3
"""t16-emu.py -- a host emulation of the T16 gemv (src/kernels/cuda/gemv_t16.cu) for q4_0,
q4_K and q6_K, for checking its fragment indexing without a GPU.

The weights go through the real host repack (kiln_cuda_t16_repack, built here from
src/kernels/cuda_t16.c and the format sources into a shared object with gcc); the
activations through a transcription of xsplit_t16_kernel; each mma.sync m16n8k16 is
emulated from the PTX fragment layout (A: a0 = row g cols 2 tig, +1; a1 = row g + 8; a2 /
a3 = cols + 8; B: b0 = rows 2 tig, +1 of column g, b1 = rows + 8; C: c0, c1 = row g cols
2 tig, +1, c2, c3 = row g + 8), and the kernels' per-lane code (gemv_t16_kernel for q4_0,
gemv_t16k_kernel for q4_K / q6_K) is transcribed line by line. y is compared with the
f64 dot of kiln_dequantize_row's weights: relative error ~1e-7 when the indexing is right,
O(1) when a word, nibble or shift is wrong (q4_0, which runs on the GPU, checks the
emulator itself). Pure Python, no numpy; a few seconds.

  python3 scripts/t16-emu.py
"""
import os, subprocess, tempfile
_src = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..')
_lib = os.path.join(tempfile.mkdtemp(prefix='t16emu'), 'libt16.so')
subprocess.check_call(['gcc', '-shared', '-fPIC', '-O1', '-ffp-contract=off', '-I' + _src + '/src',
                       '-I' + _src + '/include'] +
                      [_src + '/src/' + f for f in ('kernels/cuda_t16.c', 'format/dtype.c',
                       'base/status.c', 'base/mem.c', 'format/quants.c', 'format/quants_k.c')] +
                      ['-o', _lib, '-lm'])
import ctypes, struct, random, math, sys
L = ctypes.CDLL(_lib)
Q4K, Q6K, Q40 = 12, 14, 2
def f16(v):  # round to f16, back to float
    return struct.unpack('<e', struct.pack('<e', v))[0]
def f32(v):
    return struct.unpack('<f', struct.pack('<f', v))[0]
def h2f(u16):
    return struct.unpack('<e', struct.pack('<H', u16 & 0xFFFF))[0]
def word(buf, off):
    return struct.unpack_from('<I', buf, off)[0]
def bytes_h2(u, sel, bias):  # kc_bytes_h2: two f16 (1024 + byte) - bias  -> (lo, hi) floats
    b = [(u >> (8 * i)) & 0xFF for i in range(4)]
    s0, s1 = sel & 0xF, (sel >> 8) & 0xF
    bl, bh = bias & 0xFFFF, bias >> 16
    return (f16(1024 + b[s0] - h2f(bl)), f16(1024 + b[s1] - h2f(bh)))
def afrag(u0, u1, bias):
    return [bytes_h2(u0, 0x4140, bias), bytes_h2(u1, 0x4140, bias), bytes_h2(u0, 0x4342, bias), bytes_h2(u1, 0x4342, bias)]
def mma(acc, A, B):
    # A[lane] = 4 pairs, B[lane] = 2 pairs (PTX m16n8k16 .row.col f16 layout); acc[lane] = 4 floats
    Am = [[0.0] * 16 for _ in range(16)]; Bm = [[0.0] * 8 for _ in range(16)]
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        a = A[lane]
        Am[g][2*t], Am[g][2*t+1] = a[0]; Am[g+8][2*t], Am[g+8][2*t+1] = a[1]
        Am[g][2*t+8], Am[g][2*t+9] = a[2]; Am[g+8][2*t+8], Am[g+8][2*t+9] = a[3]
        b = B[lane]
        Bm[2*t][g], Bm[2*t+1][g] = b[0]; Bm[2*t+8][g], Bm[2*t+9][g] = b[1]
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        for j, (r, c) in enumerate([(g, 2*t), (g, 2*t+1), (g+8, 2*t), (g+8, 2*t+1)]):
            acc[lane][j] = f32(acc[lane][j] + sum(Am[r][kk] * Bm[kk][c] for kk in range(16)))
def byte_perm(x, y, sel):  # __byte_perm
    b = [(x >> 8*i) & 0xFF for i in range(4)] + [(y >> 8*i) & 0xFF for i in range(4)]
    return sum(b[(sel >> 4*i) & 7] << 8*i for i in range(4))
def byte_f(w, i):  # kc_byte_f: 2^23 + byte as a float, minus 2^23
    return struct.unpack('<f', struct.pack('<I', byte_perm(w, 0x4B000000, 0x7540 | i)))[0] - 8388608.0
def sbyte_f(w, i):  # kc_sbyte_f
    v = byte_perm(w ^ 0x80808080, 0x4B000000, 0x7540 | i)
    return struct.unpack('<f', struct.pack('<I', v))[0] - 8388736.0
def q4k_sm(S, M, H):  # kc_q4k_sm: the 8 blocks' 6-bit scales / mins as bytes of 4 words
    hs, hm = H & 0xFFFF, H >> 16
    hs, hm = (hs | (hs << 8)) & 0x00FF00FF, (hm | (hm << 8)) & 0x00FF00FF
    hs, hm = (hs | (hs << 4)) & 0x0F0F0F0F, (hm | (hm << 4)) & 0x0F0F0F0F
    m32 = 0xFFFFFFFF
    return [(S & 0x0F0F0F0F) | ((hs << 4) & 0x30303030 & m32),
            ((S >> 4) & 0x0F0F0F0F) | ((hs << 2) & 0x30303030),
            (M & 0x0F0F0F0F) | ((hm << 4) & 0x30303030 & m32),
            ((M >> 4) & 0x0F0F0F0F) | ((hm << 2) & 0x30303030)]
def pairs(halves):  # list of 8 halves -> 4 pairs
    return [(halves[2*i], halves[2*i+1]) for i in range(4)]

def run(dt, n, k, T, seed):
    rnd = random.Random(seed)
    bb_bytes = 144 if dt == Q4K else 210 if dt == Q6K else 18
    BLK = 32 if dt == Q40 else 256
    rb = k // BLK * bb_bytes
    w = bytearray(rnd.getrandbits(8) for _ in range(n * rb))
    for r in range(n):
        for b in range(k // BLK):
            o = r * rb + b * bb_bytes
            if dt == Q40:
                struct.pack_into('<e', w, o, rnd.uniform(0.002, 0.02))
            elif dt == Q4K:
                struct.pack_into('<e', w, o, rnd.uniform(0.002, 0.02)); struct.pack_into('<e', w, o + 2, rnd.uniform(0.002, 0.02))
            else:
                struct.pack_into('<e', w, o + 208, rnd.uniform(0.0002, 0.002))
    tiles = (n + 15) // 16
    t16 = ctypes.create_string_buffer(tiles * 16 * rb)
    assert L.kiln_cuda_t16_repack(ctypes.c_uint32(dt), bytes(w), ctypes.c_size_t(rb), ctypes.c_int64(n), ctypes.c_int64(k), t16, None) == 0
    W = t16.raw
    ref = []
    fb = (ctypes.c_float * k)()
    for r in range(n):
        assert L.kiln_dequantize_row(ctypes.c_uint32(dt), bytes(w[r*rb:(r+1)*rb]), fb, ctypes.c_int64(k), None) == 0
        ref.append(list(fb))
    x = [[f32(rnd.gauss(0, 1)) for _ in range(k)] for _ in range(T)]
    # prep (xsplit_t16_kernel): per token, 32-block: hi/lo halves per (tig), inv, xsum
    nb = k // 32
    XH = {}; XL = {}; INV = {}; XS = {}
    for t in range(T):
        for b in range(nb):
            v = x[t][32*b:32*b+32]
            m = max(abs(a) for a in v)
            sc = 1.0
            if m > 0:
                e = math.frexp(m)[1]; p = max(-126, min(126, 15 - e)); sc = 2.0 ** p
            INV[t, b] = f32(1.0 / sc)
            # xsum: per float4 (a+b)+(c+d), then xor 1,2,4 over 8 threads
            s = [f32(f32(v[4*q] + v[4*q+1]) + f32(v[4*q+2] + v[4*q+3])) for q in range(8)]
            for d in (1, 2, 4):
                s = [f32(s[i] + s[i ^ d]) for i in range(8)]
            XS[t, b] = s[0]
            for tg in range(4):
                el = [4*tg + e for e in range(4)] + [16 + 4*tg + e for e in range(4)]
                hs = [f16(f32(v[i] * sc)) for i in el]
                ls = [f16(f32(f32(v[i] * sc) - h)) for i, h in zip(el, hs)]
                XH[t, b, tg] = hs; XL[t, b, tg] = ls
    SCB = 2304 if dt == Q4K else 3360 if dt == Q6K else 1152
    SO = 2048 if dt == Q4K else 3072 if dt == Q6K else 1024
    nsc = k // 256 if dt != Q40 else k // 128
    NB = 8 if dt != Q40 else 4
    y = [[0.0] * n for _ in range(T)]
    for tile in range(tiles):
        tb = tile * nsc * SCB
        tot = [[0.0] * 4 for _ in range(32)]
        for sc in range(nsc):  # one warp's order (warps split sc; the sum order differs, fine here)
            c = tb + sc * SCB
            q = [[[word(W, c + i*512 + lane*16 + 4*j) for j in range(4)] for i in range(4 if dt == Q4K else 6 if dt == Q6K else 2)] for lane in range(32)]
            sa = [[word(W, c + SO + (lane >> 2)*(16 if dt == Q40 else 32) + 4*j) for j in range(4)] for lane in range(32)]
            sb = [[word(W, c + SO + (lane >> 2)*32 + 16 + 4*j) for j in range(4)] for lane in range(32)] if dt != Q40 else None
            dq = [0 if dt != Q6K else word(W, c + 3328 + (lane >> 2)*4) for lane in range(32)]
            for bb in range(NB):
                b = sc * NB + bb
                BH0 = []; BH1 = []; BL0 = []; BL1 = []; A0 = []; A1 = []
                for lane in range(32):
                    g, tig = lane >> 2, lane & 3
                    if g < T:
                        ph = pairs(XH[g, b, tig]); pl = pairs(XL[g, b, tig])
                    else:
                        ph = pl = [(0.0, 0.0)] * 4
                    BH0.append([ph[0], ph[1]]); BH1.append([ph[2], ph[3]])
                    BL0.append([pl[0], pl[1]]); BL1.append([pl[2], pl[3]])
                    v = q[lane][bb // 2]
                    if dt == Q40:
                        q0 = v[2] if bb % 2 else v[0]; q1 = v[3] if bb % 2 else v[1]
                        m4 = 0x0F0F0F0F
                        A0.append(afrag(q0 & m4, q1 & m4, 0x64086408))
                        A1.append(afrag((q0 >> 4) & m4, (q1 >> 4) & m4, 0x64086408))
                    elif dt == Q4K:
                        sh = 4 * (bb % 2); m4 = 0x0F0F0F0F
                        A0.append(afrag((v[0] >> sh) & m4, (v[2] >> sh) & m4, 0x64006400))
                        A1.append(afrag((v[1] >> sh) & m4, (v[3] >> sh) & m4, 0x64006400))
                    else:
                        lg = v[2] if bb % 2 else v[0]; lg8 = v[3] if bb % 2 else v[1]
                        hw = q[lane][4 + bb // 4][bb % 4]
                        m4, m2 = 0x0F0F0F0F, 0x30303030
                        r0a = (lg & m4) | (hw & m2); r0b = ((lg >> 4) & m4) | ((hw >> 2) & m2)
                        r1a = (lg8 & m4) | ((hw << 4) & m2 & 0xFFFFFFFF); r1b = ((lg8 >> 4) & m4) | ((hw << 2) & m2 & 0xFFFFFFFF)
                        A0.append(afrag(r0a, r1a, 0x64206420)); A1.append(afrag(r0b, r1b, 0x64206420))
                if dt in (Q4K, Q40):
                    acc = [[0.0] * 4 for _ in range(32)]
                    mma(acc, A0, BH0); mma(acc, A1, BH1); mma(acc, A0, BL0); mma(acc, A1, BL1)
                else:
                    acc0 = [[0.0] * 4 for _ in range(32)]; acc1 = [[0.0] * 4 for _ in range(32)]
                    mma(acc0, A0, BH0); mma(acc1, A1, BH1); mma(acc0, A0, BL0); mma(acc1, A1, BL1)
                for lane in range(32):
                    g, tig = lane >> 2, lane & 3
                    ivx = INV.get((2*tig, b), 0.0); ivy = INV.get((2*tig+1, b), 0.0)
                    if dt == Q40:
                        dw = sa[lane][bb]; d0, d1 = h2f(dw), h2f(dw >> 16); a = acc[lane]
                        tot[lane][0] += d0*ivx*a[0]; tot[lane][1] += d0*ivy*a[1]
                        tot[lane][2] += d1*ivx*a[2]; tot[lane][3] += d1*ivy*a[3]
                    elif dt == Q4K:
                        S, M, H = sa[lane][1], sa[lane][2], sa[lane][3]
                        S8, M8, H8 = sb[lane][1], sb[lane][2], sb[lane][3]
                        dg, mg = h2f(sa[lane][0]), h2f(sa[lane][0] >> 16)
                        dg8, mg8 = h2f(sb[lane][0]), h2f(sb[lane][0] >> 16)
                        ea, eb = q4k_sm(S, M, H), q4k_sm(S8, M8, H8)  # kc_q4k_sm, kc_byte_f
                        j, o = bb // 2, bb % 2
                        scg, mng = byte_f(ea[o], j), byte_f(ea[2 + o], j)
                        scg8, mng8 = byte_f(eb[o], j), byte_f(eb[2 + o], j)
                        d1, m1, d18, m18 = dg*scg, mg*mng, dg8*scg8, mg8*mng8
                        xsx = XS.get((2*tig, b), 0.0); xsy = XS.get((2*tig+1, b), 0.0)
                        a = acc[lane]
                        tot[lane][0] += d1*ivx*a[0] - m1*xsx
                        tot[lane][1] += d1*ivy*a[1] - m1*xsy
                        tot[lane][2] += d18*ivx*a[2] - m18*xsx
                        tot[lane][3] += d18*ivy*a[3] - m18*xsy
                    else:
                        dg, dg8 = h2f(dq[lane]), h2f(dq[lane] >> 16)
                        wg, wg8 = sa[lane][bb // 2], sb[lane][bb // 2]
                        sb2 = 2 * (bb % 2)  # kc_sbyte_f
                        f0, f1 = dg*sbyte_f(wg, sb2), dg*sbyte_f(wg, sb2+1)
                        f08, f18 = dg8*sbyte_f(wg8, sb2), dg8*sbyte_f(wg8, sb2+1)
                        a0, a1 = acc0[lane], acc1[lane]
                        tot[lane][0] += f0*ivx*a0[0] + f1*ivx*a1[0]
                        tot[lane][1] += f0*ivy*a0[1] + f1*ivy*a1[1]
                        tot[lane][2] += f08*ivx*a0[2] + f18*ivx*a1[2]
                        tot[lane][3] += f08*ivy*a0[3] + f18*ivy*a1[3]
        for lane in range(32):
            g, tig = lane >> 2, lane & 3
            for j in range(4):
                row = tile*16 + g + (8 if j >= 2 else 0); tok = 2*tig + (j & 1)
                if row < n and tok < T: y[tok][row] = tot[lane][j]
    num = den = 0.0
    for t in range(T):
        for r in range(n):
            want = sum(ref[r][i] * x[t][i] for i in range(k))
            num += (y[t][r] - want) ** 2; den += want ** 2
    print(f"dt={dt} n={n} k={k} T={T}: rel err {math.sqrt(num/den):.3g}")
    return math.sqrt(num / den)

ok = True
for dt in (Q40, Q4K, Q6K):
    for (n, k, T) in ((19, 512, 3), (16, 256, 8), (5, 768, 1)):
        ok &= run(dt, n, k, T, 1234 + n) < 1e-5
print("OK" if ok else "FAIL")
sys.exit(0 if ok else 1)
