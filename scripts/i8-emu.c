/*
 * i8-emu.c — the int8 GEMM (src/kernels/cuda/gemm_i8.cu) emulated on the CPU: its prep
 * (digits, factors, B-fragment records), its per-lane A fragments from the real T16 repack
 * (kiln_cuda_t16_repack), mma.sync m16n8k32 s8 by the PTX fragment maps, and its f32
 * epilogue, against a double dot product of the dequantized rows. A wrong word or byte order
 * gives ~1; the transcription ~3e-7. Build against a configured build dir B:
 *   O=B/CMakeFiles/kiln.dir/src; gcc -O2 -Iinclude -Isrc scripts/i8-emu.c $O/kernels/cuda_t16.c.o \
 *     $O/format/{dtype,quants,quants_k}.c.o $O/base/[a-z]*.o -lxxhash -lm -lpthread \
 *     -o /tmp/i8-emu   (then /tmp/i8-emu)
 */
#include "kernels/cuda_t16.h"
#include "format/dtype.h"
#include "format/quants.h"
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t s = 88172645463325252ull;
static uint32_t rnd(void) {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return (uint32_t)s;
}
static float nrm(void) {
    float u = (rnd() + 1.0f) / 4294967296.0f, v = rnd() / 4294967296.0f;
    return sqrtf(-2 * logf(u)) * cosf(6.2831853f * v);
}
static float f_of(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static uint32_t u_of(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static float h2f(uint16_t h) { /* normal f16 only */
    int e = (h >> 10) & 31, m = h & 1023;
    float v = (e == 0) ? ldexpf(m, -24) : ldexpf(1024 + m, e - 25);
    return (h & 0x8000) ? -v : v;
}
static uint32_t nib(uint32_t v) {
    return (v + 0x78787878u) ^ 0x80808080u;
}
static int sb(uint32_t w, int i) {
    return (int8_t)(w >> (8 * i));
}

/* prep: x (T x k), records per (tile, block, lane) of 8 words */
static void prep(const float *x, int T, int k, uint32_t *out) {
    int nb = k / 32, Tp = (T + 7) / 8 * 8;
    for (int t = 0; t < Tp; t++)
        for (int b = 0; b < nb; b++) {
            float v[32];
            float m = 0;
            for (int i = 0; i < 32; i++) {
                v[i] = t < T ? x[t * k + b * 32 + i] : 0;
                m = fmaxf(m, fabsf(v[i]));
            }
            float sc = 0, f = 0;
            if (m > 0) {
                int e;
                float fr = frexpf(m, &e);
                int P = (fr >= 127.0f / 128.0f ? 22 : 23) - e;
                if (P > 126) P = 126;
                sc = f_of((uint32_t)(P + 127) << 23);
                f = f_of((uint32_t)(127 - P) << 23);
            }
            for (int q = 0; q < 8; q++) {
                uint32_t w1 = 0, w2 = 0, w3 = 0;
                for (int e = 0; e < 4; e++) {
                    int X = (int)lrintf(v[4 * q + e] * sc);
                    int d3 = ((X + 128) & 255) - 128, X1 = (X - d3) >> 8,
                        d2 = ((X1 + 128) & 255) - 128, d1 = (X1 - d2) >> 8;
                    if (d1 < -128 || d1 > 127) {
                        printf("d1 out of range\n");
                        exit(1);
                    }
                    w1 |= (uint32_t)(d1 & 255) << (8 * e);
                    w2 |= (uint32_t)(d2 & 255) << (8 * e);
                    w3 |= (uint32_t)(d3 & 255) << (8 * e);
                }
                int tig = q & 3, half = q >> 2, tt = t & 7;
                uint32_t *rec = out + ((size_t)(t / 8) * nb + b) * 32 * 8;
                uint32_t *o = rec + (4 * tt + tig) * 8;
                o[half] = w1;
                o[2 + half] = w2;
                o[4 + half] = w3;
                rec[(4 * q + tt / 2) * 8 + 6 + (tt & 1)] = u_of(f);
            }
        }
}

/* D = A B for 32 lanes' fragments */
static void mma(int c[32][4], uint32_t a[32][4], uint32_t b[32][2]) {
    int A[16][32], B[32][8];
    for (int L = 0; L < 32; L++) {
        int g = L >> 2, tig = L & 3;
        for (int i = 0; i < 4; i++) {
            A[g][4 * tig + i] = sb(a[L][0], i);
            A[g + 8][4 * tig + i] = sb(a[L][1], i);
            A[g][16 + 4 * tig + i] = sb(a[L][2], i);
            A[g + 8][16 + 4 * tig + i] = sb(a[L][3], i);
            B[4 * tig + i][g] = sb(b[L][0], i);
            B[16 + 4 * tig + i][g] = sb(b[L][1], i);
        }
    }
    for (int L = 0; L < 32; L++) {
        int g = L >> 2, tig = L & 3;
        for (int e = 0; e < 4; e++) {
            int r = g + (e >= 2 ? 8 : 0), col = 2 * tig + (e & 1), acc = 0;
            for (int kk = 0; kk < 32; kk++) acc += A[r][kk] * B[kk][col];
            c[L][e] = acc;
        }
    }
}

int main(void) {
    for (int q8 = 0; q8 < 2; q8++) {
        uint32_t dt = q8 ? KILN_DTYPE_Q8_0 : KILN_DTYPE_Q4_0;
        int n = 37, k = 512, T = 13, nb = k / 32, bb_ = q8 ? 34 : 18, NQ = q8 ? 4 : 2,
            SCB = q8 ? 2176 : 1152;
        size_t rb = (size_t)nb * bb_;
        int tiles = (n + 15) / 16;
        uint8_t *w = malloc(n * rb), *r = calloc(tiles * 16, rb);
        for (size_t i = 0; i < n * rb; i++) w[i] = (uint8_t)rnd();
        for (int row = 0; row < n; row++)
            for (int b = 0; b < nb; b++) {
                uint16_t h = (uint16_t)(0x2000 + (rnd() & 0x3ff) + ((rnd() & 1) << 15));
                memcpy(w + row * rb + b * bb_, &h, 2);
            }
        float *x = malloc(sizeof(float) * T * k), *wf = malloc(sizeof(float) * k);
        for (int i = 0; i < T * k; i++) x[i] = nrm() * ((i % 97) == 0 ? 1000.0f : 1.0f);
        if (kiln_cuda_t16_repack(dt, w, rb, n, k, r, NULL)) {
            printf("repack failed\n");
            return 1;
        }
        uint32_t *rec = calloc((size_t)((T + 7) / 8) * nb * 256, 4);
        prep(x, T, k, rec);
        double num = 0, den = 0;
        int nsc = k / 128;
        for (int tile = 0; tile < tiles; tile++)
            for (int jt = 0; jt < (T + 7) / 8; jt++) {
                float tot[32][4] = {{0}};
                for (int sc = 0; sc < nsc; sc++) {
                    const uint8_t *c = r + ((size_t)tile * nsc + sc) * SCB;
                    for (int bb = 0; bb < 4; bb++) {
                        int b = sc * 4 + bb;
                        uint32_t a[32][4], bf[32][2], bf2[32][2], bf3[32][2];
                        float dd[32][2], f0[32], f1[32];
                        for (int L = 0; L < 32; L++) {
                            int g = L >> 2;
                            uint32_t qw[4][4], sd[4];
                            for (int i = 0; i < NQ; i++) memcpy(qw[i], c + i * 512 + L * 16, 16);
                            memcpy(sd, c + NQ * 512 + g * 16, 16);
                            uint32_t dw = sd[bb];
                            dd[L][0] = h2f(dw & 0xffff);
                            dd[L][1] = h2f(dw >> 16);
                            if (!q8) {
                                uint32_t *v = qw[bb / 2];
                                uint32_t r0 = bb % 2 ? v[2] : v[0], r8 = bb % 2 ? v[3] : v[1];
                                a[L][0] = nib(r0 & 0x0F0F0F0Fu);
                                a[L][1] = nib(r8 & 0x0F0F0F0Fu);
                                a[L][2] = nib((r0 >> 4) & 0x0F0F0F0Fu);
                                a[L][3] = nib((r8 >> 4) & 0x0F0F0F0Fu);
                            } else {
                                uint32_t *v = qw[bb];
                                a[L][0] = v[0];
                                a[L][1] = v[2];
                                a[L][2] = v[1];
                                a[L][3] = v[3];
                            }
                            const uint32_t *p = rec + (((size_t)jt * nb + b) * 32 + L) * 8;
                            bf[L][0] = p[0];
                            bf[L][1] = p[1];
                            bf2[L][0] = p[2];
                            bf2[L][1] = p[3];
                            bf3[L][0] = p[4];
                            bf3[L][1] = p[5];
                            f0[L] = f_of(p[6]);
                            f1[L] = f_of(p[7]);
                        }
                        int c1[32][4], c2[32][4], c3[32][4];
                        mma(c1, a, bf);
                        mma(c2, a, bf2);
                        mma(c3, a, bf3);
                        for (int L = 0; L < 32; L++)
                            for (int e = 0; e < 4; e++) {
                                float v =
                                    q8 ? fmaf((float)(c1[L][e] * 256 + c2[L][e]), 256.0f,
                                              (float)c3[L][e])
                                       : (float)(c1[L][e] * 65536 + c2[L][e] * 256 + c3[L][e]);
                                float sx = dd[L][e >> 1] * ((e & 1) ? f1[L] : f0[L]);
                                tot[L][e] = fmaf(sx, v, tot[L][e]);
                            }
                    }
                }
                for (int L = 0; L < 32; L++)
                    for (int e = 0; e < 4; e++) {
                        int row = tile * 16 + (L >> 2) + (e >= 2 ? 8 : 0),
                            tok = jt * 8 + 2 * (L & 3) + (e & 1);
                        if (row >= n || tok >= T) continue;
                        kiln_dequantize_row(dt, w + row * rb, wf, k, NULL);
                        double ref = 0;
                        for (int i = 0; i < k; i++) ref += (double)wf[i] * x[tok * k + i];
                        num += (tot[L][e] - ref) * (tot[L][e] - ref);
                        den += ref * ref;
                    }
            }
        printf("%s: rel err %.3g\n", q8 ? "q8_0" : "q4_0", sqrt(num / den));
    }
    return 0;
}
