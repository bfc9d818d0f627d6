/* sample.c — samplers, RNG and stop strings (see sample.h). */
#include "sample/sample.h"
#include "base/mem.h"

#include <math.h>
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

/* ---- sampler ---- */

typedef struct cand {
    int32_t id;
    float logit;
    float p;
} cand;

struct kiln_sampler {
    kiln_sampler_params p;
    int32_t n_vocab;
    kiln_rng rng;
    cand *c;
    int32_t *hist; /* ring of the last repeat_last_n tokens (or all, growing) */
    int32_t hist_len, hist_cap, hist_pos;
    int32_t *count; /* [n_vocab] occurrences in the window */
};

void kiln_sampler_params_default(kiln_sampler_params *p) {
    memset(p, 0, sizeof(*p));
    p->temperature = 0.8f;
    p->top_k = 40;
    p->top_p = 0.95f;
    p->min_p = 0.05f;
    p->repeat_penalty = 1.0f;
    p->repeat_last_n = 64;
}

kiln_status kiln_sampler_create(const kiln_sampler_params *p, int32_t n_vocab, kiln_sampler **out,
                                kiln_err *err) {
    if (n_vocab <= 0)
        return kiln_err_set(err, KILN_ERR_INVALID_ARG, "sampler: vocabulary of %d", (int)n_vocab);
    if (!(p->top_p > 0) || !(p->repeat_penalty > 0) || isnan(p->temperature) || isnan(p->min_p))
        return kiln_err_set(
            err, KILN_ERR_INVALID_ARG,
            "sampler: top_p must be > 0, repeat_penalty > 0, temperature and min_p numbers");
    kiln_sampler *s = kiln_calloc(1, sizeof(*s));
    if (!s) return kiln_err_set(err, KILN_ERR_NOMEM, "sampler: out of memory");
    s->p = *p;
    s->n_vocab = n_vocab;
    s->c = kiln_malloc((size_t)n_vocab * sizeof(cand));
    s->count = kiln_calloc((size_t)n_vocab, sizeof(int32_t));
    s->hist_cap = p->repeat_last_n > 0 ? p->repeat_last_n : 256;
    s->hist = kiln_malloc((size_t)s->hist_cap * sizeof(int32_t));
    if (!s->c || !s->count || !s->hist) {
        kiln_sampler_free(s);
        return kiln_err_set(err, KILN_ERR_NOMEM, "sampler: out of memory for %d candidates",
                            (int)n_vocab);
    }
    kiln_rng_seed(&s->rng, p->seed);
    *out = s;
    return KILN_OK;
}

void kiln_sampler_free(kiln_sampler *s) {
    if (!s) return;
    kiln_free(s->c);
    kiln_free(s->count);
    kiln_free(s->hist);
    kiln_free(s);
}

void kiln_sampler_reset(kiln_sampler *s, uint64_t seed) {
    memset(s->count, 0, (size_t)s->n_vocab * sizeof(int32_t));
    s->hist_len = s->hist_pos = 0;
    kiln_rng_seed(&s->rng, seed);
}

void kiln_sampler_accept(kiln_sampler *s, int32_t token) {
    if (token < 0 || token >= s->n_vocab || s->p.repeat_last_n == 0) return;
    if (s->p.repeat_last_n > 0) {
        if (s->hist_len == s->hist_cap) {
            int32_t old = s->hist[s->hist_pos];
            s->count[old]--;
        } else {
            s->hist_len++;
        }
        s->hist[s->hist_pos] = token;
        s->hist_pos = (s->hist_pos + 1) % s->hist_cap;
    } else {
        /* unbounded window: counts only */
        s->hist_len++;
    }
    s->count[token]++;
}

static int cmp_desc(const void *a, const void *b) {
    const cand *x = a, *y = b;
    if (x->logit > y->logit) return -1;
    if (x->logit < y->logit) return 1;
    return x->id - y->id;
}

int32_t kiln_sampler_sample(kiln_sampler *s, const float *logits, int32_t n_vocab) {
    if (n_vocab > s->n_vocab) n_vocab = s->n_vocab;
    const kiln_sampler_params *p = &s->p;
    cand *c = s->c;
    int32_t n = 0;
    bool penal = s->hist_len > 0 && (p->repeat_penalty != 1.0f || p->frequency_penalty != 0.0f ||
                                     p->presence_penalty != 0.0f);
    for (int32_t i = 0; i < n_vocab; i++) {
        float l = logits[i];
        if (isnan(l) || l == -INFINITY) continue;
        if (penal && s->count[i] > 0) {
            /* llama.cpp's rule: divide positive logits, multiply negative ones */
            if (l > 0)
                l /= p->repeat_penalty;
            else
                l *= p->repeat_penalty;
            l -= (float)s->count[i] * p->frequency_penalty + p->presence_penalty;
        }
        c[n].id = i;
        c[n].logit = l;
        n++;
    }
    if (n == 0) return -1;
    if (p->temperature <= 0) {
        int32_t best = 0;
        for (int32_t i = 1; i < n; i++)
            if (c[i].logit > c[best].logit) best = i;
        return c[best].id;
    }
    /* top-k: partial order is enough but a full sort keeps it simple and exact */
    int32_t k = p->top_k > 0 && p->top_k < n ? p->top_k : n;
    if (k < n) {
        /* select the k largest with a sort of the whole list only when k is large */
        qsort(c, (size_t)n, sizeof(cand), cmp_desc);
        n = k;
    } else {
        qsort(c, (size_t)n, sizeof(cand), cmp_desc);
    }
    /* softmax over the (sorted) candidates */
    double sum = 0;
    const float mx = c[0].logit;
    for (int32_t i = 0; i < n; i++) {
        c[i].p = expf(c[i].logit - mx);
        sum += c[i].p;
    }
    for (int32_t i = 0; i < n; i++) c[i].p = (float)(c[i].p / sum);
    if (p->top_p < 1.0f) {
        double cum = 0;
        int32_t keep = n;
        for (int32_t i = 0; i < n; i++) {
            cum += c[i].p;
            if (cum >= p->top_p) {
                keep = i + 1;
                break;
            }
        }
        n = keep;
    }
    if (p->min_p > 0) {
        const float thr = c[0].p * p->min_p;
        int32_t keep = 1;
        while (keep < n && c[keep].p >= thr) keep++;
        n = keep;
    }
    /* temperature, then draw from the renormalised distribution */
    sum = 0;
    for (int32_t i = 0; i < n; i++) {
        c[i].p = expf((c[i].logit - mx) / p->temperature);
        sum += c[i].p;
    }
    double u = kiln_rng_uniform(&s->rng) * sum, acc = 0;
    for (int32_t i = 0; i < n; i++) {
        acc += c[i].p;
        if (u < acc) return c[i].id;
    }
    return c[n - 1].id;
}

/* ---- stopper ---- */

kiln_status kiln_stopper_init(kiln_stopper *st, const char *const *stops, int n_stops,
                              const int32_t *stop_tokens, int n_stop_tokens, kiln_err *err) {
    memset(st, 0, sizeof(*st));
    if (n_stops > 0) {
        st->stops = kiln_calloc((size_t)n_stops, sizeof(char *));
        st->stop_len = kiln_calloc((size_t)n_stops, sizeof(size_t));
        if (!st->stops || !st->stop_len) goto oom;
        for (int i = 0; i < n_stops; i++) {
            size_t l = strlen(stops[i]);
            if (l == 0) continue;
            st->stops[st->n_stops] = kiln_strdup(stops[i]);
            if (!st->stops[st->n_stops]) goto oom;
            st->stop_len[st->n_stops++] = l;
            if (l > st->max_stop) st->max_stop = l;
        }
    }
    if (n_stop_tokens > 0) {
        st->stop_tokens = kiln_malloc((size_t)n_stop_tokens * sizeof(int32_t));
        if (!st->stop_tokens) goto oom;
        memcpy(st->stop_tokens, stop_tokens, (size_t)n_stop_tokens * sizeof(int32_t));
        st->n_stop_tokens = n_stop_tokens;
    }
    return KILN_OK;
oom:
    kiln_stopper_free(st);
    return kiln_err_set(err, KILN_ERR_NOMEM, "stop strings: out of memory");
}

void kiln_stopper_free(kiln_stopper *st) {
    if (!st) return;
    for (int i = 0; i < st->n_stops; i++) kiln_free(st->stops[i]);
    kiln_free(st->stops);
    kiln_free(st->stop_len);
    kiln_free(st->stop_tokens);
    kiln_free(st->buf);
    kiln_free(st->out);
    memset(st, 0, sizeof(*st));
}

bool kiln_stopper_is_stop_token(const kiln_stopper *st, int32_t token) {
    for (int i = 0; i < st->n_stop_tokens; i++)
        if (st->stop_tokens[i] == token) return true;
    return false;
}

/* Length of the longest suffix of buf[0, len) that is a proper prefix of a stop. */
static size_t held_suffix(const kiln_stopper *st) {
    size_t best = 0;
    for (int i = 0; i < st->n_stops; i++) {
        size_t sl = st->stop_len[i];
        size_t mx = sl - 1 < st->len ? sl - 1 : st->len;
        for (size_t k = mx; k > best; k--)
            if (memcmp(st->buf + st->len - k, st->stops[i], k) == 0) {
                best = k;
                break;
            }
    }
    return best;
}

static kiln_status reserve(char **b, size_t *cap, size_t need, kiln_err *err) {
    if (need <= *cap) return KILN_OK;
    size_t nc = need * 2;
    char *q = kiln_realloc(*b, nc);
    if (!q) return kiln_err_set(err, KILN_ERR_NOMEM, "stop strings: out of memory");
    *b = q;
    *cap = nc;
    return KILN_OK;
}

kiln_status kiln_stopper_feed(kiln_stopper *st, const char *text, size_t n, const char **emit,
                              size_t *emit_len, bool *stopped, kiln_err *err) {
    *stopped = st->stopped;
    *emit = "";
    *emit_len = 0;
    if (st->stopped) return KILN_OK;
    KILN_TRY(reserve(&st->buf, &st->cap, st->len + n + 1, err));
    memcpy(st->buf + st->len, text, n);
    st->len += n;
    /* earliest complete stop string */
    size_t first = SIZE_MAX;
    for (int i = 0; i < st->n_stops; i++) {
        const char *hit = memmem(st->buf, st->len, st->stops[i], st->stop_len[i]);
        if (hit && (size_t)(hit - st->buf) < first) first = (size_t)(hit - st->buf);
    }
    size_t out, keep;
    if (first != SIZE_MAX) {
        st->stopped = true;
        *stopped = true;
        out = first;
        keep = 0;
    } else {
        keep = held_suffix(st);
        out = st->len - keep;
    }
    KILN_TRY(reserve(&st->out, &st->out_cap, out + 1, err));
    memcpy(st->out, st->buf, out);
    st->out[out] = 0;
    memmove(st->buf, st->buf + st->len - keep, keep);
    st->len = keep;
    *emit = st->out;
    *emit_len = out;
    return KILN_OK;
}

void kiln_stopper_flush(kiln_stopper *st, const char **emit, size_t *emit_len) {
    *emit = st->buf ? st->buf : "";
    *emit_len = st->stopped ? 0 : st->len;
    st->len = 0;
}
