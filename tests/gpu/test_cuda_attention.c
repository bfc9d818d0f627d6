/*
 * test_cuda_attention.c — the CUDA kernels of the paged KV cache (src/kernels/cuda/) against
 * the ref kernels on random data, label gpu: kv_write and the fused rope + KV write (f32
 * cache 2e-6, f16 cache 1e-3: one f16 rounding of the same value), attention (2e-5; GQA
 * 1-8, head dims 32-256, windows, softcap, f16 / f32 KV, several sequences in one flat token
 * list over shuffled block tables, split-K past 1024 positions up to 20,000 in session 12's
 * ranges and session 11's; G > 1 against G = 1 and each call's first / last token alone,
 * bitwise) and the tensor-core flash
 * attention (2e-5, both fragment paths, deterministic). Outputs poisoned before every call.
 * Split from test_cuda_kernels.c (which holds the other kernels and the tolerance notes).
 *
 * Skips (exit 77, CTest SKIP_RETURN_CODE) with the reason when no usable GPU is present.
 */
#include "testutil.h"

#include <stdio.h>

#ifndef KILN_HAVE_CUDA
int main(void) {
    printf("SKIP: kiln was built without CUDA (-DKILN_CUDA=OFF)\n");
    return 77;
}
#else
#include "format/dtype.h"
#include "kernels/kernel.h"
#include "kernels/ref/ref.h"
#include "kernels/ref/ref_fused.h"

#include "cuda_test.h"

/* ---- paged KV: kv_write, rope_kv, attention ---- */

typedef struct kv_fixture {
    int n_seq, n_kv_head, head_dim, n_blocks;
    uint32_t dtype;
    size_t block_bytes, cache_bytes;
    uint8_t *k, *v;  /* host cache */
    void *kd, *vd;   /* device cache */
    int32_t *tables; /* [n_seq][max_blocks] host */
    int max_blocks;
    int32_t len[8];    /* tokens cached per sequence */
    kiln_kv_blocks hb; /* host view of the packed table */
    kiln_kv_blocks db; /* device copy (table and seq_len in device memory) */
    int32_t *seqlen_d;
    int32_t *tables_d;
} kv_fixture;

static void kv_setup(kv_fixture *f, int n_seq, int nkv, int hd, uint32_t dt, const int32_t *len) {
    memset(f, 0, sizeof *f);
    f->n_seq = n_seq, f->n_kv_head = nkv, f->head_dim = hd, f->dtype = dt;
    size_t elt = dt == KILN_DTYPE_F16 ? 2 : 4;
    f->block_bytes = (size_t)KILN_KV_BLOCK * nkv * hd * elt;
    int total = 0;
    for (int s = 0; s < n_seq; s++) {
        f->len[s] = len[s];
        int nb = (len[s] + KILN_KV_BLOCK - 1) / KILN_KV_BLOCK;
        if (nb > f->max_blocks) f->max_blocks = nb;
        total += nb;
    }
    f->n_blocks = total + 3;
    f->cache_bytes = f->block_bytes * (size_t)f->n_blocks;
    f->k = malloc(f->cache_bytes), f->v = malloc(f->cache_bytes);
    /* random f32 values or f16 halves, every block (unused ones too) */
    for (size_t i = 0; i < f->cache_bytes / elt; i++) {
        float a = kt_rng_normal(&rng), b = kt_rng_normal(&rng);
        if (dt == KILN_DTYPE_F16) {
            ((uint16_t *)(void *)f->k)[i] = kiln_f32_to_fp16(a);
            ((uint16_t *)(void *)f->v)[i] = kiln_f32_to_fp16(b);
        } else {
            ((float *)(void *)f->k)[i] = a;
            ((float *)(void *)f->v)[i] = b;
        }
    }
    /* a shuffled permutation of physical blocks */
    int32_t *perm = malloc(sizeof(int32_t) * (size_t)f->n_blocks);
    for (int i = 0; i < f->n_blocks; i++) perm[i] = i;
    for (int i = f->n_blocks - 1; i > 0; i--) {
        int j = (int)(kt_rng_u64(&rng) % (uint64_t)(i + 1));
        int32_t tmp = perm[i];
        perm[i] = perm[j], perm[j] = tmp;
    }
    f->tables = malloc(sizeof(int32_t) * (size_t)(n_seq * f->max_blocks));
    for (int i = 0; i < n_seq * f->max_blocks; i++) f->tables[i] = -1; /* unmapped */
    int next = 0;
    for (int s = 0; s < n_seq; s++) {
        int nb = (len[s] + KILN_KV_BLOCK - 1) / KILN_KV_BLOCK;
        for (int b = 0; b < nb; b++) f->tables[s * f->max_blocks + b] = perm[next++];
    }
    f->hb = (kiln_kv_blocks){
        .table = f->tables, .seq_len = f->len, .n_seqs = n_seq, .stride = f->max_blocks};
    free(perm);
    f->kd = dup_dev(f->k, f->cache_bytes);
    f->vd = dup_dev(f->v, f->cache_bytes);
    f->tables_d = dup_dev(f->tables, sizeof(int32_t) * (size_t)(n_seq * f->max_blocks));
    f->seqlen_d = dup_dev(f->len, sizeof(int32_t) * (size_t)n_seq);
    f->db = f->hb;
    f->db.table = f->tables_d;
    f->db.seq_len = f->seqlen_d;
}

static void kv_free(kv_fixture *f) {
    cudaFree(f->kd), cudaFree(f->vd), cudaFree(f->tables_d), cudaFree(f->seqlen_d);
    free(f->k), free(f->v), free(f->tables);
}

static kiln_kv_layer kv_host(kv_fixture *f) {
    return (kiln_kv_layer){.k = f->k,
                           .v = f->v,
                           .dtype = f->dtype,
                           .n_kv_head = f->n_kv_head,
                           .head_dim = f->head_dim,
                           .block_bytes = f->block_bytes};
}
static kiln_kv_layer kv_dev(kv_fixture *f) {
    kiln_kv_layer l = kv_host(f);
    l.k = f->kd, l.v = f->vd;
    return l;
}

/* compares the device cache with the host one, as floats */
static double cache_err(kv_fixture *f) {
    size_t elt = f->dtype == KILN_DTYPE_F16 ? 2 : 4, n = f->cache_bytes / elt;
    uint8_t *k = malloc(f->cache_bytes), *v = malloc(f->cache_bytes);
    get(k, f->kd, f->cache_bytes);
    get(v, f->vd, f->cache_bytes);
    double num = 0, den = 0;
    for (int which = 0; which < 2; which++) {
        const uint8_t *a = which ? v : k, *b = which ? f->v : f->k;
        for (size_t i = 0; i < n; i++) {
            double x, y;
            if (elt == 2) {
                x = kiln_fp16_to_f32(((const uint16_t *)(const void *)a)[i]);
                y = kiln_fp16_to_f32(((const uint16_t *)(const void *)b)[i]);
            } else {
                x = ((const float *)(const void *)a)[i];
                y = ((const float *)(const void *)b)[i];
            }
            num += (x - y) * (x - y);
            den += y * y;
        }
    }
    free(k), free(v);
    return sqrt(num / den);
}

/* the step's flat token list: the last q[s] positions of each sequence */
static int64_t step_tokens(kv_fixture *f, const int32_t *q, int32_t *tok_seq, int32_t *tok_pos) {
    int64_t t = 0;
    for (int s = 0; s < f->n_seq; s++)
        for (int i = f->len[s] - q[s]; i < f->len[s]; i++) tok_seq[t] = s, tok_pos[t++] = i;
    return t;
}

static void test_kv_write_rope_kv(void **state) {
    (void)state;
    for (int c = 0; c < 4; c++) {
        kv_fixture f;
        const int32_t len[3] = {37, 5, 16 + c};
        const int32_t q[3] = {9, 5, 1};
        const int nkv = 1 + c, hd = c % 2 ? 128 : 64, nh = nkv * 2;
        const uint32_t dt = c < 2 ? KILN_DTYPE_F16 : KILN_DTYPE_F32;
        kv_setup(&f, 3, nkv, hd, dt, len);
        int32_t tok_seq[64], tok_pos[64];
        const int64_t t = step_tokens(&f, q, tok_seq, tok_pos);
        const int64_t kvd = (int64_t)nkv * hd, qd = (int64_t)nh * hd;
        float *k = malloc(sizeof(float) * (size_t)(t * kvd)),
              *v = malloc(sizeof(float) * (size_t)(t * kvd));
        float *qq = malloc(sizeof(float) * (size_t)(t * qd)),
              *qo = malloc(sizeof(float) * (size_t)(t * qd));
        kt_fill_normal(&rng, k, (size_t)(t * kvd), 1.0f);
        kt_fill_normal(&rng, v, (size_t)(t * kvd), 1.0f);
        kt_fill_normal(&rng, qq, (size_t)(t * qd), 1.0f);
        float *kd = dup_dev(k, sizeof(float) * (size_t)(t * kvd)),
              *vd = dup_dev(v, sizeof(float) * (size_t)(t * kvd));
        float *qd_ = dup_dev(qq, sizeof(float) * (size_t)(t * qd));
        int32_t *ts_d = dup_dev(tok_seq, sizeof(int32_t) * (size_t)t),
                *tp_d = dup_dev(tok_pos, sizeof(int32_t) * (size_t)t);
        kiln_kv_write_args w = {.kv = kv_host(&f),
                                .k = k,
                                .v = v,
                                .k_stride = kvd,
                                .v_stride = kvd,
                                .t = t,
                                .tok_seq = tok_seq,
                                .tok_pos = tok_pos,
                                .blocks = f.hb};
        if (c % 2 == 0) {
            assert_int_equal(kiln_ref_kv_write(NULL, &w), KILN_OK);
            w.kv = kv_dev(&f), w.k = kd, w.v = vd, w.tok_seq = ts_d, w.tok_pos = tp_d,
            w.blocks = f.db;
            assert_int_equal(kiln_cuda_kv_write(&kc, &w), KILN_OK);
            CHECK_ERR("kv_write cache", cache_err(&f), 1e-9);
        } else {
            kiln_rope_kv_args r = {.rope = {.x = qq,
                                            .rows = t,
                                            .x_stride = qd,
                                            .n_head = nh,
                                            .head_dim = hd,
                                            .n_rot = hd,
                                            .pos = tok_pos,
                                            .mode = KILN_ROPE_NEOX,
                                            .base = 10000.0f,
                                            .freq_scale = 1.0f,
                                            .attn_factor = 1.0f},
                                   .kv = w};
            assert_int_equal(kiln_ref_rope_kv(NULL, &r), KILN_OK);
            r.rope.x = qd_, r.rope.pos = tp_d;
            r.kv.kv = kv_dev(&f), r.kv.k = kd, r.kv.v = vd, r.kv.tok_seq = ts_d,
            r.kv.tok_pos = tp_d;
            r.kv.blocks = f.db;
            assert_int_equal(kiln_cuda_rope_kv(&kc, &r), KILN_OK);
            get(qo, qd_, sizeof(float) * (size_t)(t * qd));
            CHECK_ERR("rope_kv q", relerr(qo, qq, t, qd, qd, qd), 2e-5);
            CHECK_ERR("rope_kv cache", cache_err(&f), dt == KILN_DTYPE_F16 ? 1e-3 : 2e-6);
        }
        cudaFree(kd), cudaFree(vd), cudaFree(qd_), cudaFree(ts_d), cudaFree(tp_d);
        free(k), free(v), free(qq), free(qo);
        kv_free(&f);
    }
}

/* rope_kv in one launch (decode fusion on) vs the previous three (off): q and both caches
 * bitwise equal, and both within the tolerances of the ref; NORM and NEOX, partial
 * rotation (the unrotated dims of k copied), freq factors, YaRN, f16 and f32 caches,
 * decode (one token) and mixed steps. */
static void test_rope_kv_fused(void **state) {
    (void)state;
    for (int c = 0; c < 8; c++) {
        const int nkv = 1 + c % 4, hd = c % 3 == 0 ? 128 : c % 3 == 1 ? 64 : 96, nh = nkv * 3;
        const int nrot = c == 2 || c == 5 ? hd / 2 : hd;
        const uint32_t dt = c % 2 ? KILN_DTYPE_F32 : KILN_DTYPE_F16;
        const int32_t len[3] = {37 + c, 5, 600};
        const int32_t qa[3] = {9, 5, 1}, qd1[3] = {0, 0, 1};
        const int32_t *q = c < 4 ? qa : qd1; /* c >= 4: one decode token */
        kv_fixture f1, f2;
        const kt_rng r0 = rng;
        kv_setup(&f1, 3, nkv, hd, dt, len);
        rng = r0;
        kv_setup(&f2, 3, nkv, hd, dt, len);
        int32_t tok_seq[64], tok_pos[64];
        const int64_t t = step_tokens(&f1, q, tok_seq, tok_pos);
        const int64_t kvd = (int64_t)nkv * hd, qdim = (int64_t)nh * hd;
        float *k = malloc(sizeof(float) * (size_t)(t * kvd)),
              *v = malloc(sizeof(float) * (size_t)(t * kvd));
        float *qq = malloc(sizeof(float) * (size_t)(t * qdim)),
              *q1 = malloc(sizeof(float) * (size_t)(t * qdim)),
              *q2 = malloc(sizeof(float) * (size_t)(t * qdim));
        float ff[128];
        for (int i = 0; i < nrot / 2; i++) ff[i] = kt_rng_uniform(&rng, 1.0f, 8.0f);
        kt_fill_normal(&rng, k, (size_t)(t * kvd), 1.0f);
        kt_fill_normal(&rng, v, (size_t)(t * kvd), 1.0f);
        kt_fill_normal(&rng, qq, (size_t)(t * qdim), 1.0f);
        float *ffd = dup_dev(ff, sizeof ff);
        int32_t *ts_d = dup_dev(tok_seq, sizeof(int32_t) * (size_t)t),
                *tp_d = dup_dev(tok_pos, sizeof(int32_t) * (size_t)t);
        kiln_rope_kv_args r = {.rope = {.x = qq,
                                        .rows = t,
                                        .x_stride = qdim,
                                        .n_head = nh,
                                        .head_dim = hd,
                                        .n_rot = nrot,
                                        .pos = tok_pos,
                                        .mode = c % 3 == 1 ? KILN_ROPE_NORM : KILN_ROPE_NEOX,
                                        .base = c == 3 ? 500000.0f : 10000.0f,
                                        .freq_scale = c == 6 ? 0.25f : 1.0f,
                                        .freq_factors = c == 4 || c == 7 ? ff : NULL,
                                        .ext_factor = c == 6 ? 1.0f : 0.0f,
                                        .attn_factor = 1.0f,
                                        .beta_fast = 32.0f,
                                        .beta_slow = 1.0f,
                                        .n_ctx_orig = 4096},
                               .kv = {.kv = kv_host(&f1),
                                      .k = k,
                                      .v = v,
                                      .k_stride = kvd,
                                      .v_stride = kvd,
                                      .t = t,
                                      .tok_seq = tok_seq,
                                      .tok_pos = tok_pos,
                                      .blocks = f1.hb}};
        float *qh = malloc(sizeof(float) * (size_t)(t * qdim)),
              *kh = malloc(sizeof(float) * (size_t)(t * kvd));
        memcpy(qh, qq, sizeof(float) * (size_t)(t * qdim));
        memcpy(kh, k, sizeof(float) * (size_t)(t * kvd)); /* the ref may rotate it in place */
        r.rope.x = qh, r.kv.k = kh;
        assert_int_equal(kiln_ref_rope_kv(NULL, &r), KILN_OK); /* f1's host cache: the ref */
        for (int fu = 1; fu >= 0; fu--) {
            kv_fixture *f = fu ? &f1 : &f2;
            float *qdev = dup_dev(qq, sizeof(float) * (size_t)(t * qdim));
            kiln_rope_kv_args d = r;
            d.rope.x = qdev, d.rope.pos = tp_d;
            d.rope.freq_factors = r.rope.freq_factors ? ffd : NULL;
            d.kv.kv = kv_dev(f), d.kv.tok_seq = ts_d, d.kv.tok_pos = tp_d, d.kv.blocks = f->db;
            d.kv.k = dup_dev(k, sizeof(float) * (size_t)(t * kvd));
            d.kv.v = dup_dev(v, sizeof(float) * (size_t)(t * kvd));
            kiln_cuda_decode_fusion(fu);
            assert_int_equal(kiln_cuda_rope_kv(&kc, &d), KILN_OK);
            kiln_cuda_decode_fusion(1);
            get(fu ? q1 : q2, qdev, sizeof(float) * (size_t)(t * qdim));
            cudaFree(qdev), cudaFree((void *)d.kv.k), cudaFree((void *)d.kv.v);
        }
        char what[80];
        snprintf(what, sizeof what, "rope_kv fused case %d q", c);
        CHECK_ERR(what, relerr(q1, qh, t, qdim, qdim, qdim), 2e-5);
        snprintf(what, sizeof what, "rope_kv fused case %d cache", c);
        CHECK_ERR(what, cache_err(&f1), dt == KILN_DTYPE_F16 ? 1e-3 : 2e-6);
        if (memcmp(q1, q2, sizeof(float) * (size_t)(t * qdim)) != 0)
            fail_msg("rope_kv case %d: q of the fused kernel differs from the previous one", c);
        uint8_t *c1 = malloc(f1.cache_bytes), *c2 = malloc(f1.cache_bytes);
        for (int which = 0; which < 2; which++) {
            get(c1, which ? f1.vd : f1.kd, f1.cache_bytes);
            get(c2, which ? f2.vd : f2.kd, f1.cache_bytes);
            if (memcmp(c1, c2, f1.cache_bytes) != 0)
                fail_msg("rope_kv case %d: the fused kernel's %s cache differs from the previous "
                         "one's",
                         c, which ? "v" : "k");
        }
        free(c1), free(c2);
        cudaFree(ffd), cudaFree(ts_d), cudaFree(tp_d);
        free(k), free(kh), free(v), free(qq), free(q1), free(q2), free(qh);
        kv_free(&f1), kv_free(&f2);
    }
}

/* An attention case: sequences of len[s] cached tokens whose last q[s] are the step's
 * tokens (shuffled in the flat list when asked), q of sigma (0: 1). */
typedef struct attn_case {
    int n_seq, n_head, n_kv_head, head_dim;
    int32_t len[4], q[4];
    int window;
    float softcap;
    uint32_t dt;
    float sigma;
    bool shuffle;
} attn_case;

/* One case ready to run: the cache, the step's tokens, q, the ref's output (o), a host
 * buffer for the device's (oo), and the args on device copies with a poisoned output. */
typedef struct attn_run {
    kv_fixture f;
    int32_t *tok_seq, *tok_pos;
    float *q, *o, *oo;
    int64_t t, qd;
    kiln_attention_args a;
} attn_run;

static void attn_prep(attn_run *r, const attn_case *c) {
    kv_setup(&r->f, c->n_seq, c->n_kv_head, c->head_dim, c->dt, c->len);
    r->tok_seq = malloc(sizeof(int32_t) * 4096), r->tok_pos = malloc(sizeof(int32_t) * 4096);
    assert_non_null(r->tok_seq), assert_non_null(r->tok_pos);
    const int64_t t = r->t = step_tokens(&r->f, c->q, r->tok_seq, r->tok_pos);
    for (int64_t i = t - 1; c->shuffle && i > 0; i--) {
        const int64_t j = (int64_t)(kt_rng_u64(&rng) % (uint64_t)(i + 1));
        int32_t a0 = r->tok_seq[i], a1 = r->tok_pos[i];
        r->tok_seq[i] = r->tok_seq[j], r->tok_pos[i] = r->tok_pos[j];
        r->tok_seq[j] = a0, r->tok_pos[j] = a1;
    }
    const int64_t qd = r->qd = (int64_t)c->n_head * c->head_dim;
    const size_t ob = sizeof(float) * (size_t)(t * qd);
    r->q = malloc(ob), r->o = malloc(ob), r->oo = malloc(ob);
    assert_non_null(r->q), assert_non_null(r->o), assert_non_null(r->oo);
    kt_fill_normal(&rng, r->q, (size_t)(t * qd), c->sigma > 0 ? c->sigma : 1.0f);
    kiln_attention_args a = {.kv = kv_host(&r->f),
                             .q = r->q,
                             .q_stride = qd,
                             .out = r->o,
                             .out_stride = qd,
                             .t = t,
                             .n_head = c->n_head,
                             .tok_seq = r->tok_seq,
                             .tok_pos = r->tok_pos,
                             .blocks = r->f.hb,
                             .scale =
                                 1.0f / sqrtf((float)c->head_dim) * (c->softcap > 0 ? 8.0f : 1.0f),
                             .softcap = c->softcap,
                             .window = c->window};
    assert_int_equal(kiln_ref_attention(NULL, &a), KILN_OK);
    a.kv = kv_dev(&r->f);
    a.q = dup_dev(r->q, ob);
    a.out = poisoned(ob);
    a.tok_seq = dup_dev(r->tok_seq, sizeof(int32_t) * (size_t)t);
    a.tok_pos = dup_dev(r->tok_pos, sizeof(int32_t) * (size_t)t);
    a.blocks = r->f.db;
    r->a = a;
}

static void attn_done(attn_run *r) {
    cudaFree((void *)r->a.q), cudaFree(r->a.out), cudaFree((void *)r->a.tok_seq),
        cudaFree((void *)r->a.tok_pos);
    free(r->q), free(r->o), free(r->oo), free(r->tok_seq), free(r->tok_pos);
    kv_free(&r->f);
}

static void test_attention(void **state) {
    (void)state;
    static const attn_case cs[] = {
        {1, 8, 8, 128, {1}, {1}, 0, 0, KILN_DTYPE_F16, 1.0f, false},
        {1, 32, 8, 128, {700}, {1}, 0, 0, KILN_DTYPE_F16, 1.0f, false},
        {3, 4, 1, 256, {33, 1, 100}, {33, 1, 2}, 0, 0, KILN_DTYPE_F16, 1.0f, false},
        {2, 6, 3, 64, {50, 17}, {50, 3}, 7, 0, KILN_DTYPE_F32, 1.0f, false},
        {4, 16, 2, 96, {5, 64, 129, 300}, {5, 1, 20, 1}, 40, 50.0f, KILN_DTYPE_F16, 1.0f, false},
        {2, 2, 2, 32, {16, 31}, {16, 31}, 0, 30.0f, KILN_DTYPE_F32, 1.0f, false},
        {2, 12, 4, 256, {1200, 90}, {2, 90}, 512, 0, KILN_DTYPE_F16, 1.0f, false},
        {1, 8, 1, 160, {77}, {77}, 0, 0, KILN_DTYPE_F32, 1.0f, false},
        /* enough (KV head, token) pairs for the GQA kernel (attn_kernel, G > 1): the 8B's
         * prefill shape, 8 heads per KV head with softcap, 2 with a window */
        {1, 32, 8, 128, {512}, {512}, 0, 0, KILN_DTYPE_F16, 1.0f, false},
        {3, 16, 2, 64, {300, 5, 200}, {150, 5, 200}, 0, 30.0f, KILN_DTYPE_F32, 1.0f, false},
        {2, 8, 4, 128, {100, 90}, {70, 66}, 40, 0, KILN_DTYPE_F16, 1.0f, false},
        /* split-K (tokens attending to > 1024 positions): decode at 5000, 16 ranges at
         * 20000, a window with softcap and head_dim 256, more than 64 tokens (launches of
         * 64), the GQA kernel with ranges */
        {1, 32, 8, 128, {5000}, {1}, 0, 0, KILN_DTYPE_F16, 1.0f, false},
        {2, 8, 2, 128, {3000, 20000}, {1, 3}, 0, 0, KILN_DTYPE_F16, 1.0f, false},
        {1, 4, 1, 256, {2500}, {2}, 1500, 30.0f, KILN_DTYPE_F16, 1.0f, false},
        {3, 16, 2, 64, {1500, 1030, 700}, {70, 2, 1}, 0, 0, KILN_DTYPE_F32, 1.0f, false},
        {2, 32, 8, 128, {1100, 2000}, {40, 1}, 0, 0, KILN_DTYPE_F16, 1.0f, false},
        /* session 12's ranges (attn_split_kernel): the 8B's decode at 8192 (G = 4), 8 heads
         * a KV head with softcap, GQA 3 and head_dim 160 / 256 (G = 1; 4 positions a warp
         * step past 128), ranges longer than 256 (past 16384), a window of 4000 in 17000
         * on an f32 cache, head_dim 32, and a call mixing split and unsplit tokens (positions
         * 1010-1039) over two launches of 16 tokens */
        {1, 32, 8, 128, {8192}, {1}, 0, 0, KILN_DTYPE_F16, 1.0f, false},
        {1, 16, 2, 128, {9000}, {2}, 0, 30.0f, KILN_DTYPE_F16, 1.0f, false},
        {2, 6, 2, 96, {1025, 4000}, {1, 2}, 0, 0, KILN_DTYPE_F32, 1.0f, false},
        {1, 4, 2, 160, {3000}, {1}, 0, 0, KILN_DTYPE_F16, 1.0f, false},
        {2, 8, 1, 256, {17000, 1088}, {1, 1}, 0, 0, KILN_DTYPE_F16, 1.0f, false},
        {1, 8, 2, 64, {17000}, {1}, 4000, 0, KILN_DTYPE_F32, 1.0f, false},
        {2, 2, 2, 32, {2000, 1100}, {1, 5}, 0, 0, KILN_DTYPE_F32, 1.0f, false},
        {1, 32, 8, 128, {1040}, {30}, 0, 0, KILN_DTYPE_F16, 1.0f, true},
        {1, 32, 8, 128, {6000}, {1}, 0, 0, KILN_DTYPE_F16, 40.0f, false},
    };
    for (size_t ci = 0; ci < sizeof cs / sizeof cs[0]; ci++) {
        const attn_case *c = &cs[ci];
        attn_run run;
        attn_prep(&run, c);
        kiln_attention_args a = run.a;
        const int64_t t = run.t, qd = run.qd;
        float *o = run.o, *oo = run.oo;
        assert_int_equal(kiln_cuda_attention(&kc, &a), KILN_OK);
        get(oo, a.out, sizeof(float) * (size_t)(t * qd));
        char what[96];
        snprintf(what, sizeof what, "attention case %zu (gqa %d, hd %d, window %d)", ci,
                 c->n_head / c->n_kv_head, c->head_dim, c->window);
        CHECK_ERR(what, relerr(oo, o, t, qd, qd, qd), 2e-5);
        /* session 11's ranges (KILN_CUDA_OLD_SPLITK=1): other bits for split tokens, the
         * ref's values */
        CK(cudaMemset(a.out, 0xFF, sizeof(float) * (size_t)(t * qd)));
        kiln_cuda_attention_old_splitk(1);
        assert_int_equal(kiln_cuda_attention(&kc, &a), KILN_OK);
        kiln_cuda_attention_old_splitk(0);
        float *os = malloc(sizeof(float) * (size_t)(t * qd));
        assert_non_null(os);
        get(os, a.out, sizeof(float) * (size_t)(t * qd));
        snprintf(what, sizeof what, "attention case %zu old split (gqa %d, hd %d, window %d)", ci,
                 c->n_head / c->n_kv_head, c->head_dim, c->window);
        CHECK_ERR(what, relerr(os, o, t, qd, qd, qd), 2e-5);
        free(os);
        snprintf(what, sizeof what, "attention case %zu (gqa %d, hd %d, window %d)", ci,
                 c->n_head / c->n_kv_head, c->head_dim, c->window);
        /* session 12's split kernel with the next group in flight (KILN_CUDA_ATT2_PF=1): the
         * same bits */
        CK(cudaMemset(a.out, 0xFF, sizeof(float) * (size_t)(t * qd)));
        kiln_cuda_attention_split_prefetch(1);
        assert_int_equal(kiln_cuda_attention(&kc, &a), KILN_OK);
        kiln_cuda_attention_split_prefetch(0);
        get(o, a.out, sizeof(float) * (size_t)(t * qd));
        if (memcmp(o, oo, sizeof(float) * (size_t)(t * qd)) != 0)
            fail_msg("%s: the split kernel with prefetch differs from the default", what);
        /* the per-head kernel (KILN_CUDA_OLD_ATTN=1) on the same call: the same bits */
        CK(cudaMemset(a.out, 0xFF, sizeof(float) * (size_t)(t * qd)));
        kiln_cuda_attention_gqa(0);
        assert_int_equal(kiln_cuda_attention(&kc, &a), KILN_OK);
        kiln_cuda_attention_gqa(1);
        get(o, a.out, sizeof(float) * (size_t)(t * qd));
        if (memcmp(o, oo, sizeof(float) * (size_t)(t * qd)) != 0)
            fail_msg("%s: the per-head kernel's output differs from the default's", what);
        /* batch invariance: the first and the last token alone give the same bits */
        for (int k = 0; k < 2; k++) {
            const int64_t i = k ? t - 1 : 0;
            kiln_attention_args one = a;
            one.t = 1;
            one.q = a.q + i * qd;
            one.out = a.out + i * qd;
            one.tok_seq = a.tok_seq + i;
            one.tok_pos = a.tok_pos + i;
            CK(cudaMemset(one.out, 0xFF, sizeof(float) * (size_t)qd));
            assert_int_equal(kiln_cuda_attention(&kc, &one), KILN_OK);
            get(o, one.out, sizeof(float) * (size_t)qd);
            if (memcmp(o, oo + i * qd, sizeof(float) * (size_t)qd) != 0)
                fail_msg("%s: token %lld alone differs from the token in the call", what,
                         (long long)i);
        }
        attn_done(&run);
    }
}

/* The tensor-core flash attention (flash_attn.cu, forced on every call it can run) against
 * the ref at the f32 paths' 2e-5: GQA 1 / 2 / 4 / 8, head dims 64 / 128 / 256, windows,
 * softcap, f16 and f32 caches, 1-4 sequences of ragged lengths (prefills and single decode
 * tokens in one step), the step's tokens in order or shuffled (a warp's 16 rows then mix
 * sequences and positions), q of sigma 1 and 40 (peaked softmax); outputs poisoned; the
 * same call twice gives the same bits (deterministic); both fragment paths (ldmatrix and
 * plain shared loads). */

static void test_attention_flash(void **state) {
    (void)state;
    static const attn_case cs[] = {
        {1, 32, 8, 128, {512}, {512}, 0, 0, KILN_DTYPE_F16, 1.0f, false},
        {1, 8, 8, 64, {100}, {100}, 0, 0, KILN_DTYPE_F16, 1.0f, false},
        {2, 8, 4, 64, {77, 300}, {77, 129}, 0, 0, KILN_DTYPE_F32, 40.0f, true},
        {3, 16, 2, 128, {33, 1, 200}, {33, 1, 150}, 40, 0, KILN_DTYPE_F16, 1.0f, true},
        {4, 8, 1, 256, {17, 64, 129, 5}, {17, 1, 100, 5}, 0, 30.0f, KILN_DTYPE_F16, 1.0f, false},
        {2, 4, 2, 256, {90, 260}, {90, 64}, 7, 0, KILN_DTYPE_F32, 1.0f, true},
        {1, 4, 4, 128, {1000}, {600}, 512, 0, KILN_DTYPE_F32, 1.0f, false},
        {2, 16, 2, 64, {48, 31}, {48, 31}, 0, 50.0f, KILN_DTYPE_F16, 40.0f, true},
        {3, 24, 3, 128, {16, 15, 17}, {16, 15, 17}, 0, 0, KILN_DTYPE_F16, 1.0f, true},
        {1, 2, 1, 64, {1}, {1}, 0, 0, KILN_DTYPE_F16, 1.0f, false},
        {4, 32, 4, 128, {300, 40, 200, 129}, {300, 1, 200, 64}, 64, 0, KILN_DTYPE_F16, 1.0f, true},
        {2, 8, 8, 256, {70, 33}, {70, 33}, 0, 0, KILN_DTYPE_F32, 40.0f, false},
    };
    kiln_cuda_attention_flash_mode(2);
    for (size_t ci = 0; ci < sizeof cs / sizeof cs[0]; ci++) {
        const attn_case *c = &cs[ci];
        attn_run run;
        attn_prep(&run, c);
        kiln_attention_args a = run.a;
        const int64_t t = run.t, qd = run.qd;
        float *o = run.o, *oo = run.oo;
        char what[128];
        snprintf(what, sizeof what,
                 "flash attention case %zu (gqa %d, hd %d, window %d, softcap %g, %s%s)", ci,
                 c->n_head / c->n_kv_head, c->head_dim, c->window, (double)c->softcap,
                 c->dt == KILN_DTYPE_F16 ? "f16" : "f32", c->shuffle ? ", shuffled" : "");
        if (!kiln_cuda_attention_flash_ok(&a)) fail_msg("%s: the flash kernel would not run", what);
        float *o2 = malloc(sizeof(float) * (size_t)(t * qd));
        for (int ld = 1; ld >= 0; ld--) { /* fragments by ldmatrix, then by plain loads */
            kiln_cuda_attention_flash_ldsm(ld);
            CK(cudaMemset(a.out, 0xFF, sizeof(float) * (size_t)(t * qd)));
            assert_int_equal(kiln_cuda_attention_flash(&kc, &a), KILN_OK);
            get(oo, a.out, sizeof(float) * (size_t)(t * qd));
            char w2[160];
            snprintf(w2, sizeof w2, "%s, %s", what, ld ? "ldmatrix" : "plain loads");
            CHECK_ERR(w2, relerr(oo, o, t, qd, qd, qd), 2e-5);
            CK(cudaMemset(a.out, 0xFF, sizeof(float) * (size_t)(t * qd)));
            assert_int_equal(kiln_cuda_attention_flash(&kc, &a), KILN_OK);
            get(o2, a.out, sizeof(float) * (size_t)(t * qd));
            if (memcmp(o2, oo, sizeof(float) * (size_t)(t * qd)) != 0)
                fail_msg("%s: a second call gave other bits", w2);
        }
        kiln_cuda_attention_flash_ldsm(1);
        free(o2);
        attn_done(&run);
    }
    kiln_cuda_attention_flash_mode(1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kv_write_rope_kv),
        cmocka_unit_test(test_rope_kv_fused),
        cmocka_unit_test(test_attention),
        cmocka_unit_test(test_attention_flash),
    };
    return kt_cuda_main("test_cuda_attention", tests, sizeof tests / sizeof tests[0],
                        0x6b696c6e61747431ull, (size_t)64 << 20);
}

#endif /* KILN_HAVE_CUDA */
