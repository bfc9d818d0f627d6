/*
 * stream.c — the streaming detokenizer: token pieces in, complete UTF-8 out.
 * Bytes of a character split across tokens wait in `held` until the character is
 * complete; a byte sequence that cannot become a valid character is replaced by
 * U+FFFD (one per maximal invalid subpart, as base/utf8.h decodes).
 */
#include "base/utf8.h"
#include "base/mem.h"
#include "tok/tok_impl.h"

#include <stdlib.h>
#include <string.h>

struct kiln_detok_stream {
    const kiln_vocab *v;
    bool special;
    bool first;
    uint8_t held[4];
    size_t n_held;
    char *out;
    size_t out_cap;
};

kiln_status kiln_detok_stream_create(const kiln_vocab *v, bool special, kiln_detok_stream **out,
                                     kiln_err *err) {
    kiln_detok_stream *s = kiln_calloc(1, sizeof *s);
    if (!s) return kiln_err_set(err, KILN_ERR_NOMEM, "detokenizer stream: out of memory");
    s->v = v;
    s->special = special;
    s->first = true;
    *out = s;
    return KILN_OK;
}

void kiln_detok_stream_free(kiln_detok_stream *s) {
    if (!s) return;
    kiln_free(s->out);
    kiln_free(s);
}

static const char k_fffd[3] = {(char)0xEF, (char)0xBF, (char)0xBD};

/* Validates buf[0..n) into s->out; returns bytes written. With final=false an
 * unfinished (but so far valid) sequence at the end is kept in held. */
static size_t drain(kiln_detok_stream *s, const uint8_t *buf, size_t n, bool final) {
    size_t k = 0, i = 0;
    s->n_held = 0;
    while (i < n) {
        if (buf[i] < 0x80) {
            s->out[k++] = (char)buf[i++];
            continue;
        }
        uint32_t cp;
        int r = kiln_utf8_decode(buf + i, n - i, &cp);
        if (r > 0) {
            memcpy(s->out + k, buf + i, (size_t)r);
            k += (size_t)r, i += (size_t)r;
            continue;
        }
        size_t bad = (size_t)-r, rest = n - i;
        if (!final && bad == rest && (size_t)kiln_utf8_seq_len(buf[i]) > rest) {
            memcpy(s->held, buf + i, rest); /* may still complete */
            s->n_held = rest;
            break;
        }
        memcpy(s->out + k, k_fffd, 3);
        k += 3, i += bad;
    }
    return k;
}

kiln_status kiln_detok_stream_push(kiln_detok_stream *s, kiln_token t, const char **text,
                                   size_t *len, kiln_err *err) {
    *text = "";
    *len = 0;
    if (t < 0 || (uint32_t)t >= s->v->n_tokens)
        return kiln_err_set(err, KILN_ERR_RANGE, "token %d is not in the vocabulary (%u tokens)", t,
                            s->v->n_tokens);
    kiln_str p = kiln_token_piece(s->v, t, s->special, s->first && s->v->add_space_prefix);
    /* a leading BOS (control) is not the text's first token: the prefix goes with the next */
    if (!(s->first && t == s->v->bos && (s->v->attr[t] & KILN_TOKEN_ATTR_CONTROL)))
        s->first = false;
    size_t n = s->n_held + p.len;
    /* worst case: every byte becomes U+FFFD (3 bytes) */
    if (n * 3 + 4 > s->out_cap) {
        size_t nc = n * 3 + 64;
        char *o = kiln_realloc(s->out, nc);
        if (!o) return kiln_err_set(err, KILN_ERR_NOMEM, "detokenizer stream: out of memory");
        s->out = o;
        s->out_cap = nc;
    }
    uint8_t *tmp = kiln_malloc(n ? n : 1);
    if (!tmp) return kiln_err_set(err, KILN_ERR_NOMEM, "detokenizer stream: out of memory");
    memcpy(tmp, s->held, s->n_held);
    memcpy(tmp + s->n_held, p.ptr, p.len);
    *len = drain(s, tmp, n, false);
    kiln_free(tmp);
    *text = s->out;
    return KILN_OK;
}

void kiln_detok_stream_prime(kiln_detok_stream *s, const kiln_token *prompt, size_t n) {
    size_t i = 0;
    if (n > 0 && prompt[0] == s->v->bos && prompt[0] >= 0 && (uint32_t)prompt[0] < s->v->n_tokens &&
        (s->v->attr[prompt[0]] & KILN_TOKEN_ATTR_CONTROL))
        i = 1;
    s->first = i >= n;
}

void kiln_detok_stream_flush(kiln_detok_stream *s, const char **text, size_t *len) {
    uint8_t tmp[4];
    size_t n = s->n_held;
    memcpy(tmp, s->held, n);
    *text = "";
    *len = 0;
    if (n && s->out_cap >= 16) {
        *len = drain(s, tmp, n, true);
        *text = s->out;
    }
    s->n_held = 0;
    s->first = true;
}
