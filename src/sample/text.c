/* text.c — the exact-text stream (see text.h). */
#include "sample/text.h"
#include "base/mem.h"

#include <stdlib.h>
#include <string.h>

kiln_status kiln_text_stream_init(kiln_text_stream *ts, const kiln_vocab *v,
                                  const kiln_token *prompt, size_t n_prompt,
                                  const char *const *stops, int n_stops, kiln_err *err) {
    memset(ts, 0, sizeof(*ts));
    KILN_TRY(kiln_stopper_init(&ts->stop, stops, n_stops, NULL, 0, err));
    kiln_status st = kiln_detok_stream_create(v, false, &ts->ds, err);
    if (st) {
        kiln_stopper_free(&ts->stop);
        return st;
    }
    kiln_detok_stream_prime(ts->ds, prompt, n_prompt);
    return KILN_OK;
}

void kiln_text_stream_free(kiln_text_stream *ts) {
    if (!ts) return;
    kiln_detok_stream_free(ts->ds);
    kiln_stopper_free(&ts->stop);
    memset(ts, 0, sizeof(*ts));
}

kiln_status kiln_text_stream_push(kiln_text_stream *ts, kiln_token t, const char **text,
                                  size_t *len, bool *stopped, kiln_err *err) {
    *text = "";
    *len = 0;
    *stopped = ts->stopped;
    if (ts->stopped) return KILN_OK;
    const char *piece;
    size_t n;
    KILN_TRY(kiln_detok_stream_push(ts->ds, t, &piece, &n, err));
    KILN_TRY(kiln_stopper_feed(&ts->stop, piece, n, text, len, stopped, err));
    ts->stopped = *stopped;
    return KILN_OK;
}

kiln_status kiln_text_stream_finish(kiln_text_stream *ts, char **text, size_t *len, kiln_err *err) {
    *text = NULL;
    *len = 0;
    const char *piece, *a = "", *b = "";
    size_t n, na = 0, nb = 0;
    bool stopped = ts->stopped;
    kiln_detok_stream_flush(ts->ds, &piece, &n);
    if (!stopped) KILN_TRY(kiln_stopper_feed(&ts->stop, piece, n, &a, &na, &stopped, err));
    /* a is valid until the next feed; flush does not feed */
    char *out = kiln_malloc(na + 1);
    if (!out) return kiln_err_set(err, KILN_ERR_NOMEM, "text stream: out of memory");
    memcpy(out, a, na);
    if (!stopped) {
        kiln_stopper_flush(&ts->stop, &b, &nb);
        char *q = kiln_realloc(out, na + nb + 1);
        if (!q) {
            kiln_free(out);
            return kiln_err_set(err, KILN_ERR_NOMEM, "text stream: out of memory");
        }
        out = q;
        memcpy(out + na, b, nb);
    }
    ts->stopped = true;
    out[na + nb] = 0;
    *text = out;
    *len = na + nb;
    return KILN_OK;
}
