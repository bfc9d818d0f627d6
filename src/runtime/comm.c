/* comm.c — the communicator interface and the in-process host communicator (comm.h). */
#include "runtime/comm.h"

#include "base/mem.h"

#include <pthread.h>
#include <stdint.h>
#include <string.h>

/* ---- the interface ---- */

void kiln_comm_free(kiln_comm *c) {
    if (c) c->ops->free(c);
}

int kiln_comm_size(const kiln_comm *c) {
    return c ? c->n_ranks : 0;
}

const char *kiln_comm_kind(const kiln_comm *c) {
    return c ? c->ops->kind : "none";
}

static kiln_status check_rank(const kiln_comm *c, int rank, const char *what, kiln_err *err) {
    if (!c) return kiln_err_set(err, KILN_ERR_INVALID_ARG, "%s: no communicator", what);
    if (rank < 0 || rank >= c->n_ranks)
        return kiln_err_set(err, KILN_ERR_INVALID_ARG, "%s: rank %d of a group of %d", what, rank,
                            c->n_ranks);
    return KILN_OK;
}

kiln_status kiln_comm_all_reduce_sum_f32(kiln_comm *c, int rank, const float *in, float *out,
                                         size_t count, void *stream, kiln_err *err) {
    KILN_TRY(check_rank(c, rank, "all_reduce", err));
    if (count > SIZE_MAX / sizeof(float))
        return kiln_err_set(err, KILN_ERR_OVERFLOW, "all_reduce of %zu floats", count);
    return c->ops->all_reduce(c, rank, in, out, count, stream, err);
}

kiln_status kiln_comm_all_gather(kiln_comm *c, int rank, const void *in, void *out, size_t bytes,
                                 void *stream, kiln_err *err) {
    KILN_TRY(check_rank(c, rank, "all_gather", err));
    if (bytes > SIZE_MAX / (size_t)c->n_ranks)
        return kiln_err_set(err, KILN_ERR_OVERFLOW, "all_gather of %zu bytes x %d ranks", bytes,
                            c->n_ranks);
    return c->ops->all_gather(c, rank, in, out, bytes, stream, err);
}

kiln_status kiln_comm_broadcast(kiln_comm *c, int rank, int root, void *buf, size_t bytes,
                                void *stream, kiln_err *err) {
    KILN_TRY(check_rank(c, rank, "broadcast", err));
    if (root < 0 || root >= c->n_ranks)
        return kiln_err_set(err, KILN_ERR_INVALID_ARG, "broadcast: root %d of %d ranks", root,
                            c->n_ranks);
    return c->ops->broadcast(c, rank, root, buf, bytes, stream, err);
}

kiln_status kiln_comm_barrier(kiln_comm *c, int rank, void *stream, kiln_err *err) {
    KILN_TRY(check_rank(c, rank, "barrier", err));
    return c->ops->barrier(c, rank, stream, err);
}

void kiln_comm_abort(kiln_comm *c) {
    if (c) c->ops->abort(c);
}

kiln_status kiln_comm_reset(kiln_comm *c, kiln_err *err) {
    if (!c) return KILN_OK;
    return c->ops->reset(c, err);
}

#ifndef KILN_HAVE_NCCL
bool kiln_comm_nccl_built(void) {
    return false;
}

kiln_status kiln_comm_nccl_create(int n_ranks, const int *devices, kiln_comm **out, kiln_err *err) {
    (void)n_ranks;
    (void)devices;
    *out = NULL;
    return kiln_err_set(err, KILN_ERR_UNSUPPORTED,
                        "NCCL communicator: this kiln was built without CUDA and NCCL "
                        "(KILN_CUDA=ON and nccl.h + libnccl are needed)");
}
#endif

/* ---- the host communicator ----
 * Every collective is phases separated by a generation barrier: ranks post their buffer
 * pointers, wait, read each other's buffers, wait again before anyone reuses them. */

typedef struct host_comm {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int arrived;
    uint64_t gen;
    bool aborted;
    bool grow_failed;
    const void *src[KILN_COMM_MAX_RANKS];
    float *scratch; /* all_reduce: the sum, written in parts, read by all */
    size_t scratch_cap;
} host_comm;

static kiln_status hc_wait(kiln_comm *c, const char *what, kiln_err *err) {
    host_comm *h = c->impl;
    pthread_mutex_lock(&h->mu);
    bool aborted = h->aborted;
    if (!aborted) {
        const uint64_t g = h->gen;
        if (++h->arrived == c->n_ranks) {
            h->arrived = 0;
            h->gen++;
            pthread_cond_broadcast(&h->cv);
        } else {
            while (g == h->gen && !h->aborted) pthread_cond_wait(&h->cv, &h->mu);
            aborted = g == h->gen; /* woken by abort, not by the last rank */
        }
    }
    pthread_mutex_unlock(&h->mu);
    if (aborted)
        return kiln_err_set(err, KILN_ERR_STATE,
                            "%s: the tensor-parallel group was aborted (another rank failed)",
                            what);
    return KILN_OK;
}

static kiln_status hc_all_reduce(kiln_comm *c, int rank, const float *in, float *out, size_t count,
                                 void *stream, kiln_err *err) {
    (void)stream;
    host_comm *h = c->impl;
    const int n = c->n_ranks;
    /* every rank reads the same scratch_cap here: it changes only between the first two
     * waits of a collective, and every rank is past the last wait of the previous one */
    const bool grow = count > h->scratch_cap;
    h->src[rank] = in;
    KILN_TRY(hc_wait(c, "all_reduce", err));
    if (grow) {
        if (rank == 0) {
            float *s = kiln_realloc(h->scratch, count * sizeof(float));
            h->grow_failed = !s;
            if (s) {
                h->scratch = s;
                h->scratch_cap = count;
            }
        }
        KILN_TRY(hc_wait(c, "all_reduce", err));
        if (h->grow_failed) {
            /* every rank returns here; the last wait keeps the next collective apart */
            kiln_status st = hc_wait(c, "all_reduce", err);
            return st ? st
                      : kiln_err_set(err, KILN_ERR_NOMEM, "all_reduce: scratch of %zu floats",
                                     count);
        }
    }
    /* this rank sums its part of the elements, over ranks in order 0..n-1 */
    const size_t b = count * (size_t)rank / (size_t)n, e = count * (size_t)(rank + 1) / (size_t)n;
    if (e > b) {
        float *s = h->scratch + b;
        memcpy(s, (const float *)h->src[0] + b, (e - b) * sizeof(float));
        for (int r = 1; r < n; r++) {
            const float *x = (const float *)h->src[r] + b;
            for (size_t i = 0; i < e - b; i++) s[i] += x[i];
        }
    }
    KILN_TRY(hc_wait(c, "all_reduce", err));
    if (count) memcpy(out, h->scratch, count * sizeof(float));
    return hc_wait(c, "all_reduce", err);
}

static kiln_status hc_all_gather(kiln_comm *c, int rank, const void *in, void *out, size_t bytes,
                                 void *stream, kiln_err *err) {
    (void)stream;
    host_comm *h = c->impl;
    h->src[rank] = in;
    KILN_TRY(hc_wait(c, "all_gather", err));
    for (int r = 0; r < c->n_ranks && bytes; r++) {
        uint8_t *dst = (uint8_t *)out + (size_t)r * bytes;
        if (dst != h->src[r]) memmove(dst, h->src[r], bytes);
    }
    return hc_wait(c, "all_gather", err);
}

static kiln_status hc_broadcast(kiln_comm *c, int rank, int root, void *buf, size_t bytes,
                                void *stream, kiln_err *err) {
    (void)stream;
    host_comm *h = c->impl;
    if (rank == root) h->src[root] = buf;
    KILN_TRY(hc_wait(c, "broadcast", err));
    if (rank != root && bytes && buf != h->src[root]) memcpy(buf, h->src[root], bytes);
    return hc_wait(c, "broadcast", err);
}

static kiln_status hc_barrier(kiln_comm *c, int rank, void *stream, kiln_err *err) {
    (void)rank;
    (void)stream;
    return hc_wait(c, "barrier", err);
}

static void hc_abort(kiln_comm *c) {
    host_comm *h = c->impl;
    pthread_mutex_lock(&h->mu);
    h->aborted = true;
    pthread_cond_broadcast(&h->cv);
    pthread_mutex_unlock(&h->mu);
}

static kiln_status hc_reset(kiln_comm *c, kiln_err *err) {
    (void)err;
    host_comm *h = c->impl;
    pthread_mutex_lock(&h->mu);
    h->aborted = false;
    h->arrived = 0;
    h->gen++;
    pthread_mutex_unlock(&h->mu);
    return KILN_OK;
}

static void hc_free(kiln_comm *c) {
    host_comm *h = c->impl;
    if (h) {
        pthread_mutex_destroy(&h->mu);
        pthread_cond_destroy(&h->cv);
        kiln_free(h->scratch);
        kiln_free(h);
    }
    kiln_free(c);
}

static const kiln_comm_ops host_ops = {
    .kind = "host",
    .all_reduce = hc_all_reduce,
    .all_gather = hc_all_gather,
    .broadcast = hc_broadcast,
    .barrier = hc_barrier,
    .abort = hc_abort,
    .reset = hc_reset,
    .free = hc_free,
};

kiln_status kiln_comm_host_create(int n_ranks, kiln_comm **out, kiln_err *err) {
    *out = NULL;
    if (n_ranks < 1 || n_ranks > KILN_COMM_MAX_RANKS)
        return kiln_err_set(err, KILN_ERR_INVALID_ARG, "host communicator: %d ranks (1..%d)",
                            n_ranks, KILN_COMM_MAX_RANKS);
    kiln_comm *c = kiln_calloc(1, sizeof(*c));
    host_comm *h = kiln_calloc(1, sizeof(*h));
    if (!c || !h) {
        kiln_free(c);
        kiln_free(h);
        return kiln_err_set(err, KILN_ERR_NOMEM, "host communicator");
    }
    if (pthread_mutex_init(&h->mu, NULL) != 0) {
        kiln_free(c);
        kiln_free(h);
        return kiln_err_set(err, KILN_ERR_NOMEM, "host communicator: mutex");
    }
    if (pthread_cond_init(&h->cv, NULL) != 0) {
        pthread_mutex_destroy(&h->mu);
        kiln_free(c);
        kiln_free(h);
        return kiln_err_set(err, KILN_ERR_NOMEM, "host communicator: condition variable");
    }
    c->ops = &host_ops;
    c->n_ranks = n_ranks;
    c->impl = h;
    *out = c;
    return KILN_OK;
}
