/*
 * test_sched_fake.h — a fake engine for scheduler tests (kiln_sched_engine): a paged
 * block pool with the real pool's rules (refcounts, free list, all-or-nothing reserve),
 * KV "contents" that are the tokens written at each position, and a model whose next
 * token is a hash of every token in the sequence's KV — so a wrong prefix-cache block,
 * a lost or duplicated position, or a write into a shared block changes the output or
 * fails the step. fake_expect() computes what a request must generate.
 */
#ifndef KILN_TEST_SCHED_FAKE_H
#define KILN_TEST_SCHED_FAKE_H

#include "sched/adapter.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct fake_seq {
    int used;
    int32_t len, n_blocks;
    int32_t blocks[512];
} fake_seq;

typedef struct fake_engine {
    int32_t n_vocab, max_seqs, max_step, total_blocks;
    int32_t *refcount, *free_list, n_free, n_grown;
    int32_t (*kv)[KILN_SCHED_BLOCK]; /* token at each position of each block */
    fake_seq *seqs;
    long steps, tokens, shared_writes;
    const int32_t *script; /* when set: the token after position p is script[p + 1] */
    int32_t n_script;
    char last_error[256];
} fake_engine;

static uint64_t fake_mix(uint64_t h, int32_t t) {
    h ^= (uint64_t)(uint32_t)t + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    return h * 0xff51afd7ed558ccdull;
}

/* next token after tokens[0..n) */
static int32_t fake_next(const int32_t *tokens, int32_t n, int32_t n_vocab) {
    uint64_t h = 1469598103934665603ull;
    for (int32_t i = 0; i < n; i++) h = fake_mix(h, tokens[i]);
    return (int32_t)((h >> 17) % (uint64_t)n_vocab);
}

static kiln_status f_seq_create(void *impl, int32_t *seq, kiln_err *err) {
    fake_engine *f = impl;
    for (int32_t i = 0; i < f->max_seqs; i++)
        if (!f->seqs[i].used) {
            memset(&f->seqs[i], 0, sizeof(fake_seq));
            f->seqs[i].used = 1;
            *seq = i;
            return KILN_OK;
        }
    return kiln_err_set(err, KILN_ERR_CAPACITY, "fake: no sequence free");
}
static void f_unref(void *impl, int32_t b) {
    fake_engine *f = impl;
    if (--f->refcount[b] == 0) f->free_list[f->n_free++] = b;
}
static void f_ref(void *impl, int32_t b) {
    ((fake_engine *)impl)->refcount[b]++;
}
static int32_t f_refcount(void *impl, int32_t b) {
    fake_engine *f = impl;
    return b < f->n_grown ? f->refcount[b] : 0;
}
static void f_seq_free(void *impl, int32_t seq) {
    fake_engine *f = impl;
    fake_seq *s = &f->seqs[seq];
    for (int32_t i = 0; i < s->n_blocks; i++) f_unref(impl, s->blocks[i]);
    memset(s, 0, sizeof(*s));
}
static void f_seq_blocks(void *impl, int32_t seq, const int32_t **b, int32_t *n) {
    fake_engine *f = impl;
    *b = f->seqs[seq].blocks;
    *n = f->seqs[seq].n_blocks;
}
static kiln_status f_seq_attach(void *impl, int32_t seq, const int32_t *blocks, int32_t n,
                                kiln_err *err) {
    fake_engine *f = impl;
    fake_seq *s = &f->seqs[seq];
    if (s->n_blocks || s->len || n > 512)
        return kiln_err_set(err, KILN_ERR_STATE, "fake: attach to a non-empty sequence");
    for (int32_t i = 0; i < n; i++) {
        if (f->refcount[blocks[i]] <= 0)
            return kiln_err_set(err, KILN_ERR_INTERNAL, "fake: attach of a free block");
        s->blocks[i] = blocks[i];
        f->refcount[blocks[i]]++;
    }
    s->n_blocks = n;
    s->len = n * KILN_SCHED_BLOCK;
    return KILN_OK;
}
static int32_t f_blocks_free(void *impl) {
    fake_engine *f = impl;
    return f->total_blocks - (f->n_grown - f->n_free);
}
static kiln_status f_step(void *impl, const kiln_batch_entry *en, int32_t n, float *logits,
                          int32_t *ids, int32_t limit, kiln_err *err) {
    fake_engine *f = impl;
    (void)limit;
    if (n <= 0 || n > f->max_step) return kiln_err_set(err, KILN_ERR_INVALID_ARG, "fake: n %d", n);
    int32_t cnt[1024] = {0};
    int32_t need = 0;
    for (int32_t i = 0; i < n; i++) {
        const kiln_batch_entry *e = &en[i];
        if (e->seq < 0 || e->seq >= f->max_seqs || !f->seqs[e->seq].used)
            return kiln_err_set(err, KILN_ERR_INVALID_ARG, "fake: entry %d: bad seq %d", i, e->seq);
        fake_seq *s = &f->seqs[e->seq];
        if (e->pos != s->len + cnt[e->seq])
            return kiln_err_set(err, KILN_ERR_INVALID_ARG, "fake: entry %d: seq %d pos %d want %d",
                                i, e->seq, e->pos, s->len + cnt[e->seq]);
        if (e->token < 0 || e->token >= f->n_vocab)
            return kiln_err_set(err, KILN_ERR_INVALID_ARG, "fake: token %d", e->token);
        cnt[e->seq]++;
    }
    for (int32_t q = 0; q < f->max_seqs; q++)
        if (cnt[q]) {
            fake_seq *s = &f->seqs[q];
            int32_t nb = (s->len + cnt[q] + KILN_SCHED_BLOCK - 1) / KILN_SCHED_BLOCK;
            if (nb > s->n_blocks) need += nb - s->n_blocks;
        }
    if (need > f_blocks_free(f))
        return kiln_err_set(err, KILN_ERR_CAPACITY, "fake: KV full (%d needed, %d free)", need,
                            f_blocks_free(f));
    int32_t row = 0;
    for (int32_t i = 0; i < n; i++) {
        const kiln_batch_entry *e = &en[i];
        fake_seq *s = &f->seqs[e->seq];
        int32_t bi = e->pos / KILN_SCHED_BLOCK;
        while (s->n_blocks <= bi) {
            int32_t b = f->n_free ? f->free_list[--f->n_free] : f->n_grown++;
            f->refcount[b] = 1;
            s->blocks[s->n_blocks++] = b;
        }
        int32_t b = s->blocks[bi];
        if (f->refcount[b] != 1) {
            f->shared_writes++;
            snprintf(f->last_error, sizeof(f->last_error), "write into shared block %d", b);
        }
        f->kv[b][e->pos % KILN_SCHED_BLOCK] = e->token;
        s->len = e->pos + 1;
        if (e->want_logits) {
            int32_t toks[8192];
            for (int32_t p = 0; p <= e->pos; p++)
                toks[p] = f->kv[s->blocks[p / KILN_SCHED_BLOCK]][p % KILN_SCHED_BLOCK];
            int32_t nx = fake_next(toks, e->pos + 1, f->n_vocab);
            if (f->script) nx = f->script[(e->pos + 1) % f->n_script];
            if (logits) {
                float *lr = logits + (size_t)row * f->n_vocab;
                for (int32_t v = 0; v < f->n_vocab; v++) lr[v] = (float)((v * 7919) % 13) * 0.01f;
                lr[nx] = 10.0f;
            } else {
                ids[row] = nx;
            }
            row++;
        }
    }
    f->steps++;
    f->tokens += n;
    return KILN_OK;
}

static void fake_init(fake_engine *f, kiln_sched_engine *se, int32_t n_vocab, int32_t max_seqs,
                      int32_t max_step, int32_t total_blocks) {
    memset(f, 0, sizeof(*f));
    f->n_vocab = n_vocab;
    f->max_seqs = max_seqs;
    f->max_step = max_step;
    f->total_blocks = total_blocks;
    f->refcount = calloc((size_t)total_blocks, sizeof(int32_t));
    f->free_list = calloc((size_t)total_blocks, sizeof(int32_t));
    f->kv = calloc((size_t)total_blocks, sizeof(*f->kv));
    f->seqs = calloc((size_t)max_seqs, sizeof(fake_seq));
    memset(se, 0, sizeof(*se));
    se->impl = f;
    se->n_vocab = n_vocab;
    se->max_step = max_step;
    se->max_seqs = max_seqs;
    se->total_blocks = total_blocks;
    se->n_ctx = (int64_t)(total_blocks - max_seqs) * KILN_SCHED_BLOCK;
    se->batch_invariant = true;
    se->model_id = "fake";
    se->backend = "fake";
    se->seq_create = f_seq_create;
    se->seq_free = f_seq_free;
    se->seq_blocks = f_seq_blocks;
    se->seq_attach = f_seq_attach;
    se->block_ref = f_ref;
    se->block_unref = f_unref;
    se->block_refcount = f_refcount;
    se->blocks_free = f_blocks_free;
    se->step = f_step;
}

static int32_t fake_used(const fake_engine *f) {
    return f->n_grown - f->n_free;
}

static void fake_free(fake_engine *f) {
    free(f->refcount);
    free(f->free_list);
    free(f->kv);
    free(f->seqs);
}

/* The tokens a greedy request generates after prompt[0..n) (up to max). */
static void fake_expect(const int32_t *prompt, int32_t n, int32_t max, int32_t n_vocab,
                        int32_t *out) {
    int32_t *t = malloc((size_t)(n + max) * sizeof(int32_t));
    memcpy(t, prompt, (size_t)n * sizeof(int32_t));
    for (int32_t i = 0; i < max; i++) {
        t[n + i] = fake_next(t, n + i, n_vocab);
        out[i] = t[n + i];
    }
    free(t);
}

#endif
