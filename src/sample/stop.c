/* stop.c — stop strings across token boundaries (see sample.h). */
#include "sample/sample.h"
#include "base/mem.h"

#include <stdlib.h>
#include <string.h>

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
