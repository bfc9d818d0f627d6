/* sample.c — the sampling chain and its RNG (see sample.h; docs/SAMPLING.md). */
#include "sample/sample.h"
#include "base/cpu.h"
#include "base/mem.h"
#include "kernels/kernel.h"

#include <math.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define SAMPLE_AVX2 1 /* sum_exp8 / exp8_row below, chosen at run time (s->avx2) */
#endif
#include <stdlib.h>
#include <string.h>

/* ---- RNG ---- */

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void kiln_rng_seed(kiln_rng *r, uint64_t seed) {
    uint64_t x = seed;
    for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&x);
}

static inline uint64_t rotl(uint64_t x, int k) {
    return (x << k) | (x >> (64 - k));
}

uint64_t kiln_rng_next(kiln_rng *r) {
    uint64_t *s = r->s;
    const uint64_t result = rotl(s[1] * 5, 7) * 9;
    const uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

double kiln_rng_uniform(kiln_rng *r) {
    return (double)(kiln_rng_next(r) >> 11) * 0x1.0p-53;
}

/* ---- sampler state ---- */

typedef kiln_sample_cand cand;

/* A logit that bias or penalties changed: (id, new logit), kept sorted by id. */
typedef struct ovr {
    int32_t id;
    float logit;
} ovr;

struct kiln_sampler {
    kiln_sampler_params p;
    int32_t n_vocab;
    kiln_rng rng;
    kiln_logit_bias *bias; /* sorted by token, duplicates summed */
    int32_t n_bias;
    int32_t *hist; /* ring of the last repeat_last_n tokens (or all of them, growing) */
    int32_t hist_len, hist_cap, hist_pos;
    /* scratch */
    int32_t *win; /* [hist_cap] sorted copy of the window */
    ovr *ov;      /* [n_bias + hist_cap] */
    int32_t n_ov;
    cand *heap; /* [heap_cap] */
    int32_t heap_cap;
    cand *all;    /* [n_vocab], only when a path needs every candidate */
    double *bsum; /* [n_vocab / 64] block sums of draw_all */
    double *dexp; /* [n_vocab], draw's terms when it draws from many candidates */
    bool general; /* KILN_SAMPLER_GENERAL=1 at create: no top-k-off fast path (tests: A/B) */
    bool avx2;    /* the row's exps 8 at a time (the same bits as 4 at a time) */
};

/* Largest k + overrides kept in a heap; beyond it the chain materializes candidates. */
#define HEAP_MAX 4096
#define BLOCK    64

void kiln_sampler_params_default(kiln_sampler_params *p) {
    memset(p, 0, sizeof(*p));
    p->temperature = 0.8f;
    p->top_k = 40;
    p->top_p = 0.95f;
    p->min_p = 0.05f;
    p->repeat_penalty = 1.0f;
    p->repeat_last_n = 64;
    p->n_logprobs = -1;
}

static int cmp_bias(const void *a, const void *b) {
    const kiln_logit_bias *x = a, *y = b;
    return (x->token > y->token) - (x->token < y->token);
}

kiln_status kiln_sampler_create(const kiln_sampler_params *p, int32_t n_vocab, kiln_sampler **out,
                                kiln_err *err) {
    *out = NULL;
    if (n_vocab <= 0)
        return kiln_err_set(err, KILN_ERR_INVALID_ARG, "sampler: vocabulary of %d", (int)n_vocab);
    if (!(p->top_p > 0) || !(p->repeat_penalty > 0) || isnan(p->temperature) || isnan(p->min_p) ||
        isnan(p->frequency_penalty) || isnan(p->presence_penalty))
        return kiln_err_set(err, KILN_ERR_INVALID_ARG,
                            "sampler: top_p must be > 0, repeat_penalty > 0, temperature, min_p "
                            "and the penalties numbers");
    if (p->repeat_last_n < -1)
        return kiln_err_set(err, KILN_ERR_INVALID_ARG,
                            "sampler: repeat_last_n %d (0 = off, -1 = all)", (int)p->repeat_last_n);
    if (p->n_logprobs < -1 || p->n_logprobs > KILN_SAMPLE_MAX_LOGPROBS)
        return kiln_err_set(err, KILN_ERR_INVALID_ARG, "sampler: n_logprobs %d is not in [-1, %d]",
                            (int)p->n_logprobs, KILN_SAMPLE_MAX_LOGPROBS);
    if (p->n_logit_bias < 0 || (p->n_logit_bias > 0 && !p->logit_bias))
        return kiln_err_set(err, KILN_ERR_INVALID_ARG, "sampler: logit_bias count %d",
                            (int)p->n_logit_bias);
    for (int32_t i = 0; i < p->n_logit_bias; i++) {
        const kiln_logit_bias *b = &p->logit_bias[i];
        if (b->token < 0 || b->token >= n_vocab)
            return kiln_err_set(err, KILN_ERR_INVALID_ARG,
                                "sampler: logit_bias token %d is not in the vocabulary (%d tokens)",
                                (int)b->token, (int)n_vocab);
        if (isnan(b->bias) || b->bias == INFINITY)
            return kiln_err_set(err, KILN_ERR_INVALID_ARG,
                                "sampler: logit_bias of token %d is not a number or -inf",
                                (int)b->token);
    }
    kiln_sampler *s = kiln_calloc(1, sizeof(*s));
    const char *gen = getenv("KILN_SAMPLER_GENERAL");
    if (!s) return kiln_err_set(err, KILN_ERR_NOMEM, "sampler: out of memory");
    s->p = *p;
    s->general = gen && gen[0] == '1';
#ifdef SAMPLE_AVX2
    s->avx2 = (kiln_cpu_info()->isa & KILN_ISA_AVX2) != 0 && !getenv("KILN_SAMPLER_NO_AVX2");
#endif
    s->p.logit_bias = NULL;
    s->n_vocab = n_vocab;
    s->hist_cap = p->repeat_last_n > 0 ? p->repeat_last_n : 256;
    s->hist = kiln_malloc((size_t)s->hist_cap * sizeof(int32_t));
    s->win = kiln_malloc((size_t)s->hist_cap * sizeof(int32_t));
    s->ov = kiln_malloc(((size_t)p->n_logit_bias + (size_t)s->hist_cap) * sizeof(ovr));
    if (p->n_logit_bias > 0) {
        s->bias = kiln_malloc((size_t)p->n_logit_bias * sizeof(kiln_logit_bias));
        if (s->bias) {
            memcpy(s->bias, p->logit_bias, (size_t)p->n_logit_bias * sizeof(kiln_logit_bias));
            qsort(s->bias, (size_t)p->n_logit_bias, sizeof(kiln_logit_bias), cmp_bias);
            int32_t m = 0;
            for (int32_t i = 0; i < p->n_logit_bias; i++) {
                if (m > 0 && s->bias[m - 1].token == s->bias[i].token)
                    s->bias[m - 1].bias += s->bias[i].bias;
                else
                    s->bias[m++] = s->bias[i];
            }
            s->n_bias = m;
        }
    }
    if (!s->hist || !s->win || !s->ov || (p->n_logit_bias > 0 && !s->bias)) {
        kiln_sampler_free(s);
        return kiln_err_set(err, KILN_ERR_NOMEM, "sampler: out of memory");
    }
    kiln_rng_seed(&s->rng, p->seed);
    *out = s;
    return KILN_OK;
}

void kiln_sampler_free(kiln_sampler *s) {
    if (!s) return;
    kiln_free(s->bias);
    kiln_free(s->hist);
    kiln_free(s->win);
    kiln_free(s->ov);
    kiln_free(s->heap);
    kiln_free(s->all);
    kiln_free(s->bsum);
    kiln_free(s->dexp);
    kiln_free(s);
}

void kiln_sampler_reset(kiln_sampler *s, uint64_t seed) {
    s->hist_len = s->hist_pos = 0;
    kiln_rng_seed(&s->rng, seed);
}

/* Grows the history of an unbounded window (repeat_last_n -1) with its scratch; false on
 * out of memory (the history then stays a ring of its current size). */
static bool grow_hist(kiln_sampler *s) {
    if (s->hist_cap > INT32_MAX / 4) return false;
    int32_t nc = s->hist_cap * 2;
    int32_t *h = kiln_realloc(s->hist, (size_t)nc * sizeof(int32_t));
    if (!h) return false;
    s->hist = h;
    int32_t *w = kiln_realloc(s->win, (size_t)nc * sizeof(int32_t));
    if (!w) return false;
    s->win = w;
    ovr *o = kiln_realloc(s->ov, ((size_t)s->n_bias + (size_t)nc) * sizeof(ovr));
    if (!o) return false;
    s->ov = o;
    s->hist_cap = nc;
    return true;
}

void kiln_sampler_accept(kiln_sampler *s, int32_t token) {
    if (token < 0 || token >= s->n_vocab || s->p.repeat_last_n == 0) return;
    /* a full unbounded history (in order: it wrapped to 0) grows; the next token goes after
     * the kept ones (the ring's write position was 0: it would overwrite the oldest) */
    if (s->p.repeat_last_n < 0 && s->hist_len == s->hist_cap && s->hist_pos == 0 && grow_hist(s))
        s->hist_pos = s->hist_len;
    s->hist[s->hist_pos] = token;
    s->hist_pos = (s->hist_pos + 1) % s->hist_cap;
    if (s->hist_len < s->hist_cap) s->hist_len++;
}

/* ---- the chain ---- */

static inline bool alive(float l) {
    return l == l && l != -INFINITY;
}

/* "a ranks before b": larger logit, then lower id. */
static inline bool better(const cand *a, const cand *b) {
    return a->logit > b->logit || (a->logit == b->logit && a->id < b->id);
}

static int cmp_cand(const void *a, const void *b) {
    const cand *x = a, *y = b;
    return better(x, y) ? -1 : better(y, x) ? 1 : 0;
}

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

static bool penalties_on(const kiln_sampler *s) {
    const kiln_sampler_params *p = &s->p;
    return s->hist_len > 0 && p->repeat_last_n != 0 &&
           (p->repeat_penalty != 1.0f || p->frequency_penalty != 0.0f ||
            p->presence_penalty != 0.0f);
}

/* The tokens that bias or penalties touch, in id order: the merge of the bias list and
 * the penalty window (copied to s->win and sorted when penalties are on). ov_next gives
 * each id once, with its bias (when it has one) and its count in the window. */
typedef struct ov_iter {
    int32_t bi, wi, nw;
} ov_iter;

static ov_iter ov_begin(kiln_sampler *s) {
    ov_iter it = {0, 0, 0};
    if (penalties_on(s)) {
        memcpy(s->win, s->hist, (size_t)s->hist_len * sizeof(int32_t));
        it.nw = s->hist_len;
        qsort(s->win, (size_t)it.nw, sizeof(int32_t), cmp_i32);
    }
    return it;
}

static bool ov_next(const kiln_sampler *s, ov_iter *it, int32_t *id, const float **bias,
                    int32_t *count) {
    if (it->bi >= s->n_bias && it->wi >= it->nw) return false;
    if (it->wi >= it->nw || (it->bi < s->n_bias && s->bias[it->bi].token <= s->win[it->wi]))
        *id = s->bias[it->bi].token;
    else
        *id = s->win[it->wi];
    *bias = it->bi < s->n_bias && s->bias[it->bi].token == *id ? &s->bias[it->bi++].bias : NULL;
    *count = 0;
    while (it->wi < it->nw && s->win[it->wi] == *id) it->wi++, (*count)++;
    return true;
}

/* Builds s->ov: the tokens whose logits bias and penalties change, with their new
 * logits (bias first, then penalties, as llama.cpp's chain), sorted by id. */
static void build_overrides(kiln_sampler *s, const float *lg, int32_t n) {
    const kiln_sampler_params *p = &s->p;
    ov_iter it = ov_begin(s);
    int32_t m = 0, id, count;
    const float *bias;
    while (ov_next(s, &it, &id, &bias, &count)) {
        float l = id < n ? lg[id] : NAN;
        if (bias) l += *bias;
        if (id >= n) continue;
        if (count > 0) {
            /* llama.cpp's rule: multiply non-positive logits, divide positive ones */
            if (l <= 0)
                l *= p->repeat_penalty;
            else
                l /= p->repeat_penalty;
            l -= (float)count * p->frequency_penalty + p->presence_penalty;
        }
        s->ov[m++] = (ovr){id, l};
    }
    s->n_ov = m;
}

static bool is_override(const kiln_sampler *s, int32_t id) {
    int32_t lo = 0, hi = s->n_ov;
    while (lo < hi) {
        int32_t mid = (lo + hi) / 2;
        if (s->ov[mid].id < id)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < s->n_ov && s->ov[lo].id == id;
}

static kiln_status ensure_heap(kiln_sampler *s, int32_t cap, kiln_err *err) {
    if (cap <= s->heap_cap) return KILN_OK;
    cand *h = kiln_realloc(s->heap, (size_t)cap * sizeof(cand));
    if (!h) return kiln_err_set(err, KILN_ERR_NOMEM, "sampler: out of memory (heap of %d)", cap);
    s->heap = h;
    s->heap_cap = cap;
    return KILN_OK;
}

static kiln_status ensure_all(kiln_sampler *s, kiln_err *err) {
    if (s->all) return KILN_OK;
    s->all = kiln_malloc((size_t)s->n_vocab * sizeof(cand));
    if (!s->all)
        return kiln_err_set(err, KILN_ERR_NOMEM, "sampler: out of memory for %d candidates",
                            (int)s->n_vocab);
    return KILN_OK;
}

/* Max of x[0..n) (NaN ignored; -inf when none). SSE2 on x86-64 (maxps keeps the
 * accumulator when x is NaN, exactly the scalar rule below). */
static float max_f32(const float *x, int32_t n) {
    float m = -INFINITY;
    int32_t i = 0;
#ifdef __SSE2__
    __m128 a0 = _mm_set1_ps(-INFINITY), a1 = a0, a2 = a0, a3 = a0;
    for (; i + 16 <= n; i += 16) {
        a0 = _mm_max_ps(_mm_loadu_ps(x + i), a0);
        a1 = _mm_max_ps(_mm_loadu_ps(x + i + 4), a1);
        a2 = _mm_max_ps(_mm_loadu_ps(x + i + 8), a2);
        a3 = _mm_max_ps(_mm_loadu_ps(x + i + 12), a3);
    }
    float t[4];
    _mm_storeu_ps(t, _mm_max_ps(_mm_max_ps(a0, a1), _mm_max_ps(a2, a3)));
    for (int j = 0; j < 4; j++) m = t[j] > m ? t[j] : m;
#endif
    for (; i < n; i++) m = x[i] > m ? x[i] : m;
    return m;
}

/* Min-heap on rank (the root is the worst kept candidate). */
static void heap_down(cand *h, int32_t n, int32_t i) {
    for (;;) {
        int32_t l = 2 * i + 1, r = l + 1, w = i;
        if (l < n && better(&h[w], &h[l])) w = l;
        if (r < n && better(&h[w], &h[r])) w = r;
        if (w == i) return;
        cand t = h[i];
        h[i] = h[w];
        h[w] = t;
        i = w;
    }
}

static void heap_up(cand *h, int32_t i) {
    while (i > 0) {
        int32_t pa = (i - 1) / 2;
        if (!better(&h[pa], &h[i])) return;
        cand t = h[i];
        h[i] = h[pa];
        h[pa] = t;
        i = pa;
    }
}

/* The k best candidates of the effective logits (raw with s->ov applied) into s->heap,
 * sorted best first; returns how many (fewer than k when fewer are finite). One scan of
 * the raw logits keeps the k + n_ov best (so at least k of them are not overridden),
 * skipping 64-logit blocks that cannot enter; overridden ids are then replaced by their
 * new logits. */
static kiln_status select_top(kiln_sampler *s, const float *lg, int32_t n, int32_t k, int32_t *m,
                              kiln_err *err) {
    int32_t cap = k + s->n_ov;
    KILN_TRY(ensure_heap(s, cap + s->n_ov, err));
    cand *h = s->heap;
    int32_t hn = 0;
    for (int32_t i0 = 0; i0 < n; i0 += BLOCK) {
        int32_t i1 = n - i0 < BLOCK ? n : i0 + BLOCK;
        if (hn == cap) {
            if (!(max_f32(lg + i0, i1 - i0) > h[0].logit)) continue;
        }
        for (int32_t i = i0; i < i1; i++) {
            float l = lg[i];
            if (!alive(l)) continue;
            if (hn < cap) {
                h[hn] = (cand){i, l, 0};
                heap_up(h, hn++);
            } else if (l > h[0].logit) {
                h[0] = (cand){i, l, 0};
                heap_down(h, hn, 0);
            }
        }
    }
    int32_t w = 0;
    if (s->n_ov > 0) {
        for (int32_t i = 0; i < hn; i++)
            if (!is_override(s, h[i].id)) h[w++] = h[i];
        for (int32_t i = 0; i < s->n_ov; i++)
            if (alive(s->ov[i].logit)) h[w++] = (cand){s->ov[i].id, s->ov[i].logit, 0};
    } else {
        w = hn;
    }
    qsort(h, (size_t)w, sizeof(cand), cmp_cand);
    *m = w < k ? w : k;
    return KILN_OK;
}

/* Every finite effective logit into s->all, in id order; returns how many. */
static int32_t materialize(kiln_sampler *s, const float *lg, int32_t n) {
    cand *c = s->all;
    int32_t m = 0, oi = 0;
    for (int32_t i = 0; i < n; i++) {
        float l = lg[i];
        if (oi < s->n_ov && s->ov[oi].id == i) l = s->ov[oi++].logit;
        if (alive(l)) c[m++] = (cand){i, l, 0};
    }
    return m;
}

/* Reorders c[0..n) so that its k best candidates come first (in no order). */
static void quickselect(cand *c, int32_t n, int32_t k) {
    int32_t lo = 0, hi = n; /* the k-th boundary lies in [lo, hi) */
    for (int iter = 0; hi - lo > 1; iter++) {
        if (iter > 64) { /* adversarial input: sort what is left */
            qsort(c + lo, (size_t)(hi - lo), sizeof(cand), cmp_cand);
            return;
        }
        cand a = c[lo], b = c[lo + (hi - lo) / 2], d = c[hi - 1], piv;
        if (better(&a, &b))
            piv = better(&b, &d) ? b : (better(&a, &d) ? d : a);
        else
            piv = better(&a, &d) ? a : (better(&b, &d) ? d : b);
        /* three-way partition: [lo, lt) better than piv, [lt, gt) equal, [gt, hi) worse */
        int32_t lt = lo, i = lo, gt = hi;
        while (i < gt) {
            if (better(&c[i], &piv)) {
                cand t = c[lt];
                c[lt++] = c[i];
                c[i++] = t;
            } else if (better(&piv, &c[i])) {
                cand t = c[--gt];
                c[gt] = c[i];
                c[i] = t;
            } else {
                i++;
            }
        }
        if (k < lt)
            hi = lt;
        else if (k >= gt)
            lo = gt;
        else
            return;
    }
}

/* Softmax of c[0..n).logit / t into c[].p (the maximum first when sorted). */
static void softmax(cand *c, int32_t n, float t) {
    float mx = -INFINITY;
    for (int32_t i = 0; i < n; i++) mx = c[i].logit > mx ? c[i].logit : mx;
    double sum = 0;
    for (int32_t i = 0; i < n; i++) {
        float e = c[i].logit == mx ? 1.0f : expf((c[i].logit - mx) / t);
        c[i].p = e;
        sum += e;
    }
    for (int32_t i = 0; i < n; i++) c[i].p = (float)(c[i].p / sum);
}

/* exp(x) for x <= 0, without branches so the loops around it vectorize (relative error
 * below 2e-7; 0 below -87). */
static inline float fast_exp(float x) {
    x = x < -87.0f ? -87.0f : x;
    float kf = x * 1.44269504f;
    kf = (float)(int32_t)(kf - 0.5f); /* round to nearest for x <= 0 */
    float r = x - kf * 0.693145752f - kf * 1.42860677e-6f;
    float p =
        1.0f +
        r * (1.0f + r * (0.5f + r * (0.166666672f + r * (0.0416664183f + r * 0.00833336823f))));
    int32_t bits = ((int32_t)kf + 127) << 23;
    float sc;
    memcpy(&sc, &bits, sizeof sc);
    return p * sc;
}

#ifdef __SSE2__
/* fast_exp on 4 lanes: the same operations in the same order, so every lane equals the
 * scalar fast_exp of its value bit for bit (no FMA contraction on either path: SSE2). */
static inline __m128 fast_exp_ps(__m128 v) {
    const __m128 half = _mm_set1_ps(0.5f), one = _mm_set1_ps(1.0f);
    v = _mm_max_ps(v, _mm_set1_ps(-87.0f));
    __m128i ki = _mm_cvttps_epi32(_mm_sub_ps(_mm_mul_ps(v, _mm_set1_ps(1.44269504f)), half));
    __m128 kf = _mm_cvtepi32_ps(ki);
    __m128 r = _mm_sub_ps(_mm_sub_ps(v, _mm_mul_ps(kf, _mm_set1_ps(0.693145752f))),
                          _mm_mul_ps(kf, _mm_set1_ps(1.42860677e-6f)));
    __m128 p = _mm_set1_ps(0.00833336823f);
    p = _mm_add_ps(_mm_mul_ps(p, r), _mm_set1_ps(0.0416664183f));
    p = _mm_add_ps(_mm_mul_ps(p, r), _mm_set1_ps(0.166666672f));
    p = _mm_add_ps(_mm_mul_ps(p, r), half);
    p = _mm_add_ps(_mm_mul_ps(p, r), one);
    p = _mm_add_ps(_mm_mul_ps(p, r), one);
    __m128 sc = _mm_castsi128_ps(_mm_slli_epi32(_mm_add_epi32(ki, _mm_set1_epi32(127)), 23));
    return _mm_mul_ps(p, sc);
}
#endif

#ifdef SAMPLE_AVX2
/* fast_exp_ps on 8 lanes (AVX2 without FMA: every lane the same bits as fast_exp_ps's) */
__attribute__((target("avx2"))) static inline __m256 fast_exp_ps8(__m256 v) {
    const __m256 half = _mm256_set1_ps(0.5f), one = _mm256_set1_ps(1.0f);
    v = _mm256_max_ps(v, _mm256_set1_ps(-87.0f));
    __m256i ki =
        _mm256_cvttps_epi32(_mm256_sub_ps(_mm256_mul_ps(v, _mm256_set1_ps(1.44269504f)), half));
    __m256 kf = _mm256_cvtepi32_ps(ki);
    __m256 r = _mm256_sub_ps(_mm256_sub_ps(v, _mm256_mul_ps(kf, _mm256_set1_ps(0.693145752f))),
                             _mm256_mul_ps(kf, _mm256_set1_ps(1.42860677e-6f)));
    __m256 p = _mm256_set1_ps(0.00833336823f);
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(0.0416664183f));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(0.166666672f));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), half);
    p = _mm256_add_ps(_mm256_mul_ps(p, r), one);
    p = _mm256_add_ps(_mm256_mul_ps(p, r), one);
    __m256 sc =
        _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(ki, _mm256_set1_epi32(127)), 23));
    return _mm256_mul_ps(p, sc);
}

/* sum_exp's SSE2 loop 8 logits a step: the exps 8 wide, then the two halves added to the
 * same 4-lane accumulator in the same order, flushed at the same vectors (4092 % 8 == 4:
 * always after a high half). Carries acc4 / *sum in and out; returns the logits done. */
__attribute__((target("avx2"))) static int32_t sum_exp8(const float *x, int32_t n, float mx,
                                                        float inv_t, float acc4[4], double *sum) {
    const __m256 vmx = _mm256_set1_ps(mx), vit = _mm256_set1_ps(inv_t),
                 ninf = _mm256_set1_ps(-INFINITY);
    __m128 acc = _mm_loadu_ps(acc4);
    int32_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 l = _mm256_loadu_ps(x + i);
        __m256 ok =
            _mm256_and_ps(_mm256_cmp_ps(l, l, _CMP_EQ_OQ), _mm256_cmp_ps(l, ninf, _CMP_NEQ_UQ));
        __m256 e = _mm256_and_ps(ok, fast_exp_ps8(_mm256_mul_ps(_mm256_sub_ps(l, vmx), vit)));
        acc = _mm_add_ps(acc, _mm256_castps256_ps128(e));
        acc = _mm_add_ps(acc, _mm256_extractf128_ps(e, 1));
        if (((i + 4) & 4095) == 4092) {
            float t[4];
            _mm_storeu_ps(t, acc);
            *sum += (double)t[0] + t[1] + t[2] + t[3];
            acc = _mm_setzero_ps();
        }
    }
    _mm_storeu_ps(acc4, acc);
    return i;
}

/* pb[j] = fast_exp(lb[j] - mx) for j < len (8 wide; returns how many were done) */
__attribute__((target("avx2"))) static int32_t exp8_row(const float *lb, float *pb, int32_t len,
                                                        float mx) {
    const __m256 vmx = _mm256_set1_ps(mx);
    int32_t j = 0;
    for (; j + 8 <= len; j += 8)
        _mm256_storeu_ps(pb + j, fast_exp_ps8(_mm256_sub_ps(_mm256_loadu_ps(lb + j), vmx)));
    return j;
}
#endif

/* Sum over the finite x[i] of fast_exp((x[i] - mx) * inv_t), SSE2 where available
 * (the same polynomial, so both paths agree to rounding); avx2: the same sum, its exps 8 at
 * a time (sum_exp8). */
static double sum_exp(const float *x, int32_t n, float mx, float inv_t, bool avx2) {
    double sum = 0;
    int32_t i = 0;
    (void)avx2;
#ifdef __SSE2__
    const __m128 vmx = _mm_set1_ps(mx), vit = _mm_set1_ps(inv_t), ninf = _mm_set1_ps(-INFINITY);
    __m128 acc = _mm_setzero_ps();
#ifdef SAMPLE_AVX2
    if (avx2) {
        float a4[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        i = sum_exp8(x, n, mx, inv_t, a4, &sum);
        acc = _mm_loadu_ps(a4);
    }
#endif
    for (; i + 4 <= n; i += 4) {
        __m128 l = _mm_loadu_ps(x + i);
        __m128 ok = _mm_and_ps(_mm_cmpeq_ps(l, l), _mm_cmpneq_ps(l, ninf));
        acc = _mm_add_ps(acc, _mm_and_ps(ok, fast_exp_ps(_mm_mul_ps(_mm_sub_ps(l, vmx), vit))));
        if ((i & 4095) == 4092) { /* flush to double every 1024 vectors */
            float t[4];
            _mm_storeu_ps(t, acc);
            sum += (double)t[0] + t[1] + t[2] + t[3];
            acc = _mm_setzero_ps();
        }
    }
    float t[4];
    _mm_storeu_ps(t, acc);
    sum += (double)t[0] + t[1] + t[2] + t[3];
#endif
    for (; i < n; i++)
        if (alive(x[i])) sum += fast_exp((x[i] - mx) * inv_t);
    return sum;
}

/* Max of the effective logits (raw with s->ov applied; NaN and -inf ignored; -inf when none). */
static float eff_max(const kiln_sampler *s, const float *lg, int32_t n) {
    float mx = max_f32(lg, n);
    for (int32_t i = 0; i < s->n_ov; i++) {
        float r = lg[s->ov[i].id];
        if (r == mx) { /* the raw max may be overridden: recompute without overrides */
            mx = -INFINITY;
            int32_t oi = 0;
            for (int32_t j = 0; j < n; j++) {
                if (oi < s->n_ov && s->ov[oi].id == j) {
                    oi++;
                    continue;
                }
                mx = lg[j] > mx ? lg[j] : mx;
            }
            break;
        }
    }
    for (int32_t i = 0; i < s->n_ov; i++)
        if (alive(s->ov[i].logit) && s->ov[i].logit > mx) mx = s->ov[i].logit;
    return mx;
}

/* Max and sum of exp((l - max) * inv_t) over the finite effective logits. */
static void full_sum(const kiln_sampler *s, const float *lg, int32_t n, float inv_t, float *mx_out,
                     double *sum_out) {
    const float mx = eff_max(s, lg, n);
    double sum = 0;
    if (mx != -INFINITY) {
        sum = sum_exp(lg, n, mx, inv_t, s->avx2);
        for (int32_t k = 0; k < s->n_ov; k++) {
            float r = lg[s->ov[k].id], l = s->ov[k].logit;
            if (alive(r)) sum -= fast_exp((r - mx) * inv_t);
            if (alive(l)) sum += fast_exp((l - mx) * inv_t);
        }
    }
    *mx_out = mx;
    *sum_out = sum;
}

typedef struct chain_state {
    cand *c;     /* candidates after the last stage */
    int32_t n;   /* how many; 0 = none finite */
    bool sorted; /* best first */
} chain_state;

static void sort_state(chain_state *cs) {
    if (!cs->sorted) qsort(cs->c, (size_t)cs->n, sizeof(cand), cmp_cand);
    cs->sorted = true;
}

/* top-p on a sorted set (the heap path: at most a few thousand): keeps the shortest
 * best-first prefix whose probability (softmax over the set) reaches p. */
static void top_p_sorted(chain_state *cs, float p) {
    if (p >= 1.0f || cs->n <= 1) return;
    const cand *c = cs->c;
    const float mx = c[0].logit;
    double z = 0;
    for (int32_t i = 0; i < cs->n; i++) z += c[i].logit == mx ? 1.0 : exp((double)c[i].logit - mx);
    const double target = (double)p * z;
    double cum = 0;
    for (int32_t i = 0; i < cs->n; i++) {
        cum += c[i].logit == mx ? 1.0 : exp((double)c[i].logit - mx);
        if (cum >= target) {
            cs->n = i + 1;
            return;
        }
    }
}

/* min-p: keeps the logits >= max + log(min_p) (p >= min_p * p_max, before temperature). */
static void min_p(chain_state *cs, float p) {
    if (!(p > 0.0f) || cs->n <= 1) return;
    cand *c = cs->c;
    int32_t best = 0;
    for (int32_t i = 1; i < cs->n; i++)
        if (better(&c[i], &c[best])) best = i;
    const float thr = c[best].logit + logf(p);
    if (!(c[best].logit >= thr)) { /* min_p > 1: the maximum always survives */
        c[0] = c[best];
        cs->n = 1;
        cs->sorted = true;
        return;
    }
    int32_t w = 0;
    for (int32_t i = 0; i < cs->n; i++)
        if (c[i].logit >= thr) c[w++] = c[i];
    cs->n = w;
}

#define NBUCKET     512
#define BUCKET_SPAN 32.0f

/* top-p then min-p on an unsorted set of any size, in O(n): both keep a best-first
 * prefix, so the result is the shorter of the two: min-p filters first, then top-p's
 * boundary (mass p of the whole set's softmax) is found with a histogram of the
 * survivors' probabilities over 512 logit buckets; only the boundary bucket is sorted. */
static void top_p_hist(chain_state *cs, float tp, float mx, double z);
static void filter_unsorted(chain_state *cs, float tp, float mp) {
    cand *c = cs->c;
    int32_t n = cs->n;
    if (n <= 1) return;
    float mx = -INFINITY;
    for (int32_t i = 0; i < n; i++) mx = c[i].logit > mx ? c[i].logit : mx;
    double z = 0;
    for (int32_t i = 0; i < n; i++) {
        c[i].p = fast_exp(c[i].logit - mx);
        z += c[i].p;
    }
    if (mp > 0.0f) {
        min_p(cs, mp);
        n = cs->n;
    }
    if (tp >= 1.0f || n <= 1) return;
    top_p_hist(cs, tp, mx, z);
}

/* top-p's boundary on the unsorted survivors c[0..n) (their p = fast_exp(logit - mx) set):
 * the shortest best-first prefix reaching mass tp * z, z the softmax sum of the whole set
 * before min-p. */
static void top_p_hist(chain_state *cs, float tp, float mx, double z) {
    cand *c = cs->c;
    const int32_t n = cs->n;
    const double target = (double)tp * z;
    double mass[NBUCKET] = {0}, s = 0;
    const float scale = (float)NBUCKET / BUCKET_SPAN;
    for (int32_t i = 0; i < n; i++) {
        float d = (mx - c[i].logit) * scale;
        int b = d < (float)(NBUCKET - 1) ? (int)d : NBUCKET - 1;
        mass[b] += c[i].p;
        s += c[i].p;
    }
    if (s < target) return; /* min-p already cut more than top-p would */
    int bstar = 0;
    double cum = 0;
    while (bstar < NBUCKET - 1 && cum + mass[bstar] < target) cum += mass[bstar++];
    /* kept: buckets < bstar first, then bucket bstar (sorted). Two swap partitions written
     * as selects (session 18: -25 % on peaked rows; the compiler keeps some branches; an xor
     * swap under a mask was slower): the same swaps, so the same arrangement. The bucket
     * test is a float compare: for d >= 0 (or inf, or NaN: bucket NBUCKET - 1) and an
     * integer k <= NBUCKET - 1, the clamped bucket (int)d is below k exactly when d < k. */
    int32_t w = 0;
    const float lt = (float)bstar;
    for (int32_t i = 0; i < n; i++) {
        const int32_t f = (mx - c[i].logit) * scale < lt; /* bucket < bstar */
        const cand ci = c[i], cw = c[w];
        c[w] = f ? ci : cw;
        c[i] = f ? cw : ci;
        w += f;
    }
    int32_t m = w;
    const float le = (float)(bstar + 1); /* past the partition above, bucket == bstar */
    for (int32_t i = w; i < n; i++) {
        const int32_t f = bstar == NBUCKET - 1 || (mx - c[i].logit) * scale < le;
        const cand ci = c[i], cm = c[m];
        c[m] = f ? ci : cm;
        c[i] = f ? cm : ci;
        m += f;
    }
    qsort(c + w, (size_t)(m - w), sizeof(cand), cmp_cand);
    int32_t keep = m;
    for (int32_t i = w; i < m; i++) {
        cum += c[i].p;
        if (cum >= target) {
            keep = i + 1;
            break;
        }
    }
    cs->n = keep > 0 ? keep : 1;
    cs->sorted = false;
}

/* The chain when top-k keeps every token (session 18; min_p off or in (0, 1]): the same
 * candidates in the same order, with the same p and the same z, as head() materializing
 * every finite logit then filter_unsorted(), in two passes over the row instead of a pass
 * per stage over 12-byte candidates. min-p needs only the maximum (it keeps logit >= max +
 * log(min_p)), so one pass takes the maximum and a second computes p = fast_exp(l - max)
 * 4 or 8 at a time (fast_exp_ps / exp8_row: the same bits), sums z in id order (the same
 * sequential double sum) and keeps the survivors, in id order, in s->all; top-p then runs on
 * them as filter_unsorted would. bench_sample "top-k off (p.95 m.05)": 2.4-3.9 -> 1.0-1.3 ms
 * (PERF.md "Sampling", session 18). */
static kiln_status topk_off_first(kiln_sampler *s, const float *lg, int32_t n, chain_state *cs,
                                  kiln_err *err) {
    KILN_TRY(ensure_all(s, err));
    cand *c = s->all;
    cs->c = c;
    cs->n = 0;
    cs->sorted = false;
    const float mx = eff_max(s, lg, n);
    if (mx == -INFINITY) return KILN_OK; /* nothing finite */
    /* min-p's threshold, <= mx (the caller keeps min_p <= 1); off: every finite logit */
    const float thr = s->p.min_p > 0.0f ? mx + logf(s->p.min_p) : -INFINITY;
    double z = 0;
    int32_t m = 0, oi = 0, alive_n = 0;
    float lb[256], pb[256]; /* a chunk's effective logits and their fast_exp */
    for (int32_t i0 = 0; i0 < n; i0 += 256) {
        const int32_t len = n - i0 < 256 ? n - i0 : 256;
        memcpy(lb, lg + i0, (size_t)len * sizeof(float));
        for (; oi < s->n_ov && s->ov[oi].id < i0 + len; oi++)
            lb[s->ov[oi].id - i0] = s->ov[oi].logit;
        int32_t j = 0;
#ifdef SAMPLE_AVX2
        if (s->avx2) j = exp8_row(lb, pb, len, mx);
#endif
#ifdef __SSE2__
        const __m128 vmx = _mm_set1_ps(mx);
        for (; j + 4 <= len; j += 4)
            _mm_storeu_ps(pb + j, fast_exp_ps(_mm_sub_ps(_mm_loadu_ps(lb + j), vmx)));
#endif
        for (; j < len; j++) pb[j] = fast_exp(lb[j] - mx);
        for (j = 0; j < len; j++) { /* z in id order, as filter_unsorted sums it */
            if (!alive(lb[j])) continue;
            alive_n++;
            z += pb[j];
            if (lb[j] >= thr) c[m++] = (cand){i0 + j, lb[j], pb[j]};
        }
    }
    cs->n = m;
    if (alive_n <= 1 || s->p.top_p >= 1.0f || m <= 1) return KILN_OK; /* as filter_unsorted */
    top_p_hist(cs, s->p.top_p, mx, z);
    return KILN_OK;
}

/* Runs bias/penalties and top-k; leaves the set in *cs. */
static kiln_status head(kiln_sampler *s, const float *lg, int32_t n, chain_state *cs, bool need_all,
                        kiln_err *err) {
    int32_t k = s->p.top_k > 0 && s->p.top_k < n ? s->p.top_k : n;
    if (!need_all && k + s->n_ov <= HEAP_MAX) {
        KILN_TRY(select_top(s, lg, n, k, &cs->n, err));
        cs->c = s->heap;
        cs->sorted = true;
        return KILN_OK;
    }
    KILN_TRY(ensure_all(s, err));
    cs->c = s->all;
    cs->n = materialize(s, lg, n);
    cs->sorted = false;
    if (!need_all && k < cs->n) {
        quickselect(cs->c, cs->n, k);
        cs->n = k;
    }
    return KILN_OK;
}

/* top-p then min-p on the set after top-k. */
static void filter(chain_state *cs, float tp, float mp) {
    if (cs->sorted) {
        top_p_sorted(cs, tp);
        min_p(cs, mp);
    } else {
        filter_unsorted(cs, tp, mp);
    }
}

/* Draws from exp(l / t) over the whole row when no filter is on (no candidate list):
 * one pass of block sums (64 logits each), then the chosen block alone, element by
 * element, with the same exp. */
static kiln_status draw_all(kiln_sampler *s, const float *lg, int32_t n, int32_t *tok,
                            kiln_err *err) {
    *tok = -1;
    const int32_t nb = (n + BLOCK - 1) / BLOCK;
    if (!s->bsum) {
        s->bsum = kiln_malloc((size_t)((s->n_vocab + BLOCK - 1) / BLOCK) * sizeof(double));
        if (!s->bsum) return kiln_err_set(err, KILN_ERR_NOMEM, "sampler: out of memory");
    }
    const float inv_t = 1.0f / s->p.temperature;
    const float mx = eff_max(s, lg, n); /* the block sums below are the total (session 18:
                                         * full_sum's own pass over the row went unused) */
    if (mx == -INFINITY) return KILN_OK;
    for (int32_t b = 0; b < nb; b++) {
        int32_t i0 = b * BLOCK, len = n - i0 < BLOCK ? n - i0 : BLOCK;
        s->bsum[b] = sum_exp(lg + i0, len, mx, inv_t, s->avx2);
    }
    for (int32_t k = 0; k < s->n_ov; k++) {
        float r = lg[s->ov[k].id], l = s->ov[k].logit;
        double *bs = &s->bsum[s->ov[k].id / BLOCK];
        if (alive(r)) *bs -= fast_exp((r - mx) * inv_t);
        if (alive(l)) *bs += fast_exp((l - mx) * inv_t);
    }
    double sum = 0;
    for (int32_t b = 0; b < nb; b++) sum += s->bsum[b];
    const double u = kiln_rng_uniform(&s->rng) * sum;
    double acc = 0;
    int32_t b = 0;
    while (b < nb - 1 && acc + s->bsum[b] <= u) acc += s->bsum[b++];
    /* the block holding u; when rounding leaves u past its end, its last finite token */
    for (; b >= 0; b--) {
        int32_t i0 = b * BLOCK, i1 = n - i0 < BLOCK ? n : i0 + BLOCK, last = -1;
        int32_t oi = 0;
        while (oi < s->n_ov && s->ov[oi].id < i0) oi++;
        for (int32_t i = i0; i < i1; i++) {
            float l = lg[i];
            if (oi < s->n_ov && s->ov[oi].id == i) l = s->ov[oi++].logit;
            if (!alive(l)) continue;
            acc += fast_exp((l - mx) * inv_t);
            last = i;
            if (u < acc) {
                *tok = i;
                return KILN_OK;
            }
        }
        if (last >= 0) {
            *tok = last;
            return KILN_OK;
        }
    }
    return KILN_OK;
}

static int32_t draw(kiln_sampler *s, const cand *c, int32_t n) {
    const float t = s->p.temperature;
    float mx = -INFINITY;
    for (int32_t i = 0; i < n; i++) mx = c[i].logit > mx ? c[i].logit : mx;
    /* many candidates (top-k off): each term computed once and kept for the second pass
     * (the same doubles, so the same token); few, or no memory: computed twice */
    if (n > HEAP_MAX && !s->dexp) s->dexp = kiln_malloc((size_t)s->n_vocab * sizeof(double));
    double *e = n > HEAP_MAX ? s->dexp : NULL;
    double sum = 0;
    for (int32_t i = 0; i < n; i++) {
        const double v = c[i].logit == mx ? 1.0 : exp(((double)c[i].logit - mx) / t);
        if (e) e[i] = v;
        sum += v;
    }
    const double u = kiln_rng_uniform(&s->rng) * sum;
    double acc = 0;
    for (int32_t i = 0; i < n; i++) {
        acc += e ? e[i] : c[i].logit == mx ? 1.0 : exp(((double)c[i].logit - mx) / t);
        if (u < acc) return c[i].id;
    }
    return c[n - 1].id;
}

static kiln_status logprobs(kiln_sampler *s, const float *lg, int32_t n, kiln_sample_out *o,
                            kiln_err *err) {
    float mx;
    double sum;
    full_sum(s, lg, n, 1.0f, &mx, &sum);
    const double lz = (double)mx + log(sum);
    if (o->token >= 0) {
        float l = lg[o->token];
        for (int32_t i = 0; i < s->n_ov; i++)
            if (s->ov[i].id == o->token) l = s->ov[i].logit;
        o->logprob = (float)((double)l - lz);
    }
    int32_t k = s->p.n_logprobs, m = 0;
    if (k > 0) {
        KILN_TRY(select_top(s, lg, n, k, &m, err));
        for (int32_t i = 0; i < m; i++) {
            o->top_token[i] = s->heap[i].id;
            o->top_logprob[i] = (float)((double)s->heap[i].logit - lz);
        }
    }
    o->n_top = m;
    return KILN_OK;
}

static kiln_status sample_row(kiln_sampler *s, const float *lg, int32_t n, kiln_sample_out *o,
                              kiln_err *err) {
    if (n > s->n_vocab) n = s->n_vocab;
    const kiln_sampler_params *p = &s->p;
    o->token = -1;
    o->logprob = 0;
    o->n_top = 0;
    build_overrides(s, lg, n);
    chain_state cs;
    if (p->temperature <= 0) {
        int32_t m;
        KILN_TRY(select_top(s, lg, n, 1, &m, err));
        o->token = m > 0 ? s->heap[0].id : -1;
    } else if ((p->top_k <= 0 || p->top_k >= n) && p->top_p >= 1.0f && !(p->min_p > 0.0f)) {
        KILN_TRY(draw_all(s, lg, n, &o->token, err));
    } else if (!s->general && (p->top_k <= 0 || p->top_k >= n) && n + s->n_ov > HEAP_MAX &&
               !(p->min_p > 1.0f)) { /* head() would materialize every logit */
        KILN_TRY(topk_off_first(s, lg, n, &cs, err));
        if (cs.n > 0) o->token = draw(s, cs.c, cs.n);
    } else {
        KILN_TRY(head(s, lg, n, &cs, false, err));
        if (cs.n > 0) {
            filter(&cs, p->top_p, p->min_p);
            o->token = draw(s, cs.c, cs.n);
        }
    }
    if (p->n_logprobs >= 0) KILN_TRY(logprobs(s, lg, n, o, err));
    return KILN_OK;
}

kiln_status kiln_sample_batch(const kiln_sample_row *rows, int32_t n_rows, int32_t n_vocab,
                              kiln_sample_out *out, kiln_err *err) {
    if (n_vocab <= 0 || n_rows < 0 || (n_rows > 0 && (!rows || !out)))
        return kiln_err_set(err, KILN_ERR_INVALID_ARG, "sample batch: %d rows of %d logits",
                            (int)n_rows, (int)n_vocab);
    for (int32_t r = 0; r < n_rows; r++) {
        if (!rows[r].sampler || !rows[r].logits)
            return kiln_err_set(err, KILN_ERR_INVALID_ARG, "sample batch: row %d has no %s", (int)r,
                                rows[r].sampler ? "logits" : "sampler");
        KILN_TRY(sample_row(rows[r].sampler, rows[r].logits, n_vocab, &out[r], err));
    }
    return KILN_OK;
}

int32_t kiln_sampler_sample(kiln_sampler *s, const float *logits, int32_t n_vocab) {
    kiln_sample_out o;
    if (n_vocab <= 0 || sample_row(s, logits, n_vocab, &o, NULL)) return -1;
    return o.token;
}

/* ---- the chain on a device ---- */

int32_t kiln_sampler_device_max_overrides(const kiln_sampler *s) {
    return s->n_bias + (penalties_on(s) ? s->hist_len : 0);
}

bool kiln_sampler_device_ok(const kiln_sampler *s, int32_t n) {
    const kiln_sampler_params *p = &s->p;
    if (n <= 0 || p->n_logprobs >= 0) return false;
    if (n > s->n_vocab) n = s->n_vocab;
    const int64_t nov = kiln_sampler_device_max_overrides(s);
    if (!(p->temperature > 0)) return 1 + 2 * nov <= KILN_SAMPLE_MAX_CAND;
    const int64_t k = p->top_k > 0 && p->top_k < n ? p->top_k : n;
    if ((p->top_k <= 0 || p->top_k >= n) && p->top_p >= 1.0f && !(p->min_p > 0.0f))
        return false; /* every filter off: the CPU's two-pass draw */
    return k + nov <= HEAP_MAX && k + 2 * nov <= KILN_SAMPLE_MAX_CAND; /* else O(n) paths */
}

kiln_status kiln_sampler_device_row(kiln_sampler *s, int32_t n, kiln_sample_row_params *row,
                                    int32_t *ov_id, float *ov_bias, int32_t *ov_count,
                                    int32_t ov_cap, kiln_err *err) {
    const kiln_sampler_params *p = &s->p;
    if (n > s->n_vocab) n = s->n_vocab;
    ov_iter it = ov_begin(s);
    int32_t m = 0, id, count;
    const float *bias;
    while (ov_next(s, &it, &id, &bias, &count)) {
        const float b = bias ? *bias : 0.0f;
        if (id >= n) continue;
        if (m >= ov_cap)
            return kiln_err_set(err, KILN_ERR_RANGE, "sampler: more than %d overridden logits",
                                (int)ov_cap);
        ov_id[m] = id;
        ov_bias[m] = b;
        ov_count[m] = count;
        m++;
    }
    row->n_ov = m;
    row->temperature = p->temperature;
    row->top_k = p->top_k;
    row->top_p = p->top_p;
    row->min_p = p->min_p;
    row->log_min_p = p->min_p > 0.0f ? logf(p->min_p) : 0.0f;
    row->repeat_penalty = p->repeat_penalty;
    row->frequency_penalty = p->frequency_penalty;
    row->presence_penalty = p->presence_penalty;
    row->pad_ = 0;
    row->u = p->temperature > 0 ? kiln_rng_uniform(&s->rng) : 0.0;
    return KILN_OK;
}

kiln_status kiln_sampler_stage(kiln_sampler *s, const float *lg, int32_t n, kiln_sample_stage stage,
                               kiln_sample_cand *out, int32_t *n_out, kiln_err *err) {
    *n_out = 0;
    if (n <= 0 || !(s->p.temperature > 0))
        return kiln_err_set(err, KILN_ERR_INVALID_ARG,
                            "sampler stage: needs a vocabulary and a temperature > 0");
    if (n > s->n_vocab) n = s->n_vocab;
    build_overrides(s, lg, n);
    chain_state cs;
    KILN_TRY(head(s, lg, n, &cs, stage == KILN_SAMPLE_STAGE_PENALTIES, err));
    float t = 1.0f;
    if (stage >= KILN_SAMPLE_STAGE_TOP_P)
        filter(&cs, s->p.top_p, stage >= KILN_SAMPLE_STAGE_MIN_P ? s->p.min_p : 0.0f);
    if (stage >= KILN_SAMPLE_STAGE_TEMPERATURE) t = s->p.temperature;
    sort_state(&cs);
    for (int32_t i = 0; i < cs.n; i++) {
        out[i] = cs.c[i];
        out[i].logit = cs.c[i].logit / t;
    }
    softmax(out, cs.n, 1.0f);
    *n_out = cs.n;
    return KILN_OK;
}
