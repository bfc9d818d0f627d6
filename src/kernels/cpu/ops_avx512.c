/*
 * ops_avx512.c — rms_norm, add, glu and attention for AVX-512: ops_simd.inc with 16
 * floats per vector.
 */
#include "format/dtype.h"
#include "kernels/cpu/cpu_ops.h"

#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/mem.h"

typedef __m512 vf;
#define VW           16
#define VLOAD(p)     _mm512_loadu_ps(p)
#define VSTORE(p, v) _mm512_storeu_ps(p, v)
#define VLOADH(p)    _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p)))
#define VSET1(x)     _mm512_set1_ps(x)
#define VZERO()      _mm512_setzero_ps()
#define VADD         _mm512_add_ps
#define VSUB         _mm512_sub_ps
#define VMUL         _mm512_mul_ps
#define VDIV         _mm512_div_ps
#define VMAX         _mm512_max_ps
#define VFMA         _mm512_fmadd_ps
#define VHSUM        _mm512_reduce_add_ps
#define VCOPYSIGN(mag, sgn)                                                                        \
    _mm512_or_ps(_mm512_andnot_ps(VSET1(-0.0f), mag), _mm512_and_ps(VSET1(-0.0f), sgn))
#define SUF(name) name##_avx512

/* e^x: Cephes-style range reduction + degree-6 polynomial; 0 below -87.3. */
static inline vf vexp(vf x) {
    const vf lo = VSET1(-87.33654f), hi = VSET1(88.3762626647949f);
    __mmask16 under = _mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ);
    x = _mm512_min_ps(_mm512_max_ps(x, lo), hi);
    vf fx = _mm512_roundscale_ps(VMUL(x, VSET1(1.44269504088896341f)),
                                 _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    vf r = _mm512_fnmadd_ps(fx, VSET1(0.693359375f), x);
    r = _mm512_fnmadd_ps(fx, VSET1(-2.12194440e-4f), r);
    vf p = VSET1(1.9875691500E-4f);
    p = VFMA(p, r, VSET1(1.3981999507E-3f));
    p = VFMA(p, r, VSET1(8.3334519073E-3f));
    p = VFMA(p, r, VSET1(4.1665795894E-2f));
    p = VFMA(p, r, VSET1(1.6666665459E-1f));
    p = VFMA(p, r, VSET1(5.0000001201E-1f));
    p = VADD(VFMA(p, VMUL(r, r), r), VSET1(1.0f));
    __m512i e =
        _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(fx), _mm512_set1_epi32(127)), 23);
    return _mm512_maskz_mov_ps((__mmask16)~under, VMUL(p, _mm512_castsi512_ps(e)));
}

#include "kernels/cpu/ops_simd.inc"
