/*
 * ops_avx2.c — rms_norm, add, glu and attention for AVX2 + FMA + F16C: ops_simd.inc with
 * 8 floats per vector.
 */
#include "format/dtype.h"
#include "kernels/cpu/cpu_ops.h"

#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/mem.h"

typedef __m256 vf;
#define VW           8
#define VLOAD(p)     _mm256_loadu_ps(p)
#define VSTORE(p, v) _mm256_storeu_ps(p, v)
#define VLOADH(p)    _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p)))
#define VSET1(x)     _mm256_set1_ps(x)
#define VZERO()      _mm256_setzero_ps()
#define VADD         _mm256_add_ps
#define VSUB         _mm256_sub_ps
#define VMUL         _mm256_mul_ps
#define VDIV         _mm256_div_ps
#define VMAX         _mm256_max_ps
#define VFMA         _mm256_fmadd_ps
#define VCOPYSIGN(mag, sgn)                                                                        \
    _mm256_or_ps(_mm256_andnot_ps(VSET1(-0.0f), mag), _mm256_and_ps(VSET1(-0.0f), sgn))
#define SUF(name) name##_avx2

static inline float VHSUM(vf v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* e^x: Cephes-style range reduction + degree-6 polynomial; 0 below -87.3. */
static inline vf vexp(vf x) {
    const vf lo = VSET1(-87.33654f), hi = VSET1(88.3762626647949f);
    vf keep = _mm256_cmp_ps(x, lo, _CMP_GE_OQ);
    x = _mm256_min_ps(_mm256_max_ps(x, lo), hi);
    vf fx = _mm256_round_ps(VMUL(x, VSET1(1.44269504088896341f)),
                            _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    vf r = _mm256_fnmadd_ps(fx, VSET1(0.693359375f), x);
    r = _mm256_fnmadd_ps(fx, VSET1(-2.12194440e-4f), r);
    vf p = VSET1(1.9875691500E-4f);
    p = VFMA(p, r, VSET1(1.3981999507E-3f));
    p = VFMA(p, r, VSET1(8.3334519073E-3f));
    p = VFMA(p, r, VSET1(4.1665795894E-2f));
    p = VFMA(p, r, VSET1(1.6666665459E-1f));
    p = VFMA(p, r, VSET1(5.0000001201E-1f));
    p = VADD(VFMA(p, VMUL(r, r), r), VSET1(1.0f));
    __m256i e =
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(fx), _mm256_set1_epi32(127)), 23);
    return _mm256_and_ps(keep, VMUL(p, _mm256_castsi256_ps(e)));
}

#include "kernels/cpu/ops_simd.inc"
