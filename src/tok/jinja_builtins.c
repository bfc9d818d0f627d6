/*
 * jinja_builtins.c — attribute and item lookup with ImmutableSandboxedEnvironment rules,
 * the Python methods templates call on str, dict and list values, the `loop` object,
 * and the globals (range, namespace, dict, raise_exception, strftime_now).
 *
 * Sandbox: methods that mutate a list or dict (append, pop, update, ...) resolve to a
 * function that fails with jinja2's SecurityError message when called, as the immutable
 * sandbox does; namespace attributes are the only thing a template can change.
 */
#include "tok/jinja_int.h"
#include "base/mem.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <utf8proc.h>

/* ---- argument helpers -------------------------------------------------------------- */

#define BUILTIN(name)                                                                              \
    static int name(jctx *c, const jnode *at, jv self, jv *args, size_t nargs, const char **kwn,   \
                    jv *kwv, size_t nkw, jv *out)

/* Argument pos or keyword name (name may be NULL); false when absent. */
static bool get_arg(jv *args, size_t nargs, const char **kwn, jv *kwv, size_t nkw, size_t pos,
                    const char *name, jv *out) {
    if (pos < nargs) {
        *out = args[pos];
        return true;
    }
    for (size_t i = 0; name && i < nkw; i++)
        if (!strcmp(kwn[i], name)) {
            *out = kwv[i];
            return true;
        }
    return false;
}

#define ARG(pos, name, var) get_arg(args, nargs, kwn, kwv, nkw, pos, name, &(var))

static int need_str(jctx *c, const jnode *at, jv v, const char *what) {
    if (v.type == JV_STR) return 0;
    return jerr(c, at, "%s must be str, not %s", what, jv_type_name(v));
}

/* ---- Unicode helpers (Python str semantics) ---------------------------------------- */

static bool py_space(int32_t cp) {
    return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 ||
           cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 ||
           cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

/* decodes the code point at s[i]; returns its byte length (>= 1) */
static size_t dec(const char *s, size_t n, size_t i, int32_t *cp) {
    utf8proc_int32_t c = 0;
    utf8proc_ssize_t k =
        utf8proc_iterate((const utf8proc_uint8_t *)s + i, (utf8proc_ssize_t)(n - i), &c);
    if (k <= 0) {
        *cp = (unsigned char)s[i];
        return 1;
    }
    *cp = c;
    return (size_t)k;
}

static void put_cp(jbuf *b, int32_t cp) {
    utf8proc_uint8_t tmp[4];
    utf8proc_ssize_t k = utf8proc_encode_char(cp, tmp);
    jbuf_put(b, (const char *)tmp, (size_t)(k > 0 ? k : 0));
}

/* mode 0 lower, 1 upper, 2 capitalize, 3 title (Python str.title), 4 swapcase */
jv jstr_case(jctx *c, jv v, int mode) {
    jbuf b = {0};
    const char *s = v.u.str.s;
    size_t n = v.u.str.n;
    bool first = true, prev_cased = false;
    for (size_t i = 0; i < n;) {
        int32_t cp;
        size_t k = dec(s, n, i, &cp);
        int32_t o = cp;
        bool cased = utf8proc_tolower(cp) != cp || utf8proc_toupper(cp) != cp ||
                     utf8proc_category(cp) == UTF8PROC_CATEGORY_LL ||
                     utf8proc_category(cp) == UTF8PROC_CATEGORY_LU ||
                     utf8proc_category(cp) == UTF8PROC_CATEGORY_LT;
        switch (mode) {
        case 0:
            o = utf8proc_tolower(cp);
            break;
        case 1:
            o = utf8proc_toupper(cp);
            break;
        case 2:
            o = first ? utf8proc_toupper(cp) : utf8proc_tolower(cp);
            break;
        case 3:
            o = prev_cased ? utf8proc_tolower(cp) : utf8proc_toupper(cp);
            break;
        default:
            o = utf8proc_toupper(cp) != cp ? utf8proc_toupper(cp) : utf8proc_tolower(cp);
        }
        if (o == cp)
            jbuf_put(&b, s + i, k);
        else
            put_cp(&b, o);
        prev_cased = cased;
        first = false;
        i += k;
    }
    if (!b.p && !b.oom) return jv_str_lit("");
    return jv_str_buf(c, &b);
}

/* which: 1 left, 2 right, 3 both; chars NONE/UNDEF: whitespace */
int jstr_strip(jctx *c, const jnode *at, jv v, jv chars, int which, jv *out) {
    const char *s = v.u.str.s;
    size_t n = v.u.str.n, lo = 0, hi = n;
    bool ws = chars.type == JV_NONE || chars.type == JV_UNDEF;
    if (!ws && chars.type != JV_STR)
        return jerr(c, at, "strip arg must be None or str, not %s", jv_type_name(chars));
    while ((which & 1) && lo < hi) {
        int32_t cp;
        size_t k = dec(s, n, lo, &cp);
        bool hit = ws ? py_space(cp) : false;
        if (!ws) {
            for (size_t j = 0; j < chars.u.str.n;) {
                int32_t d;
                j += dec(chars.u.str.s, chars.u.str.n, j, &d);
                if (d == cp) hit = true;
            }
        }
        if (!hit) break;
        lo += k;
    }
    while ((which & 2) && hi > lo) {
        size_t p = hi - 1;
        while (p > lo && ((unsigned char)s[p] & 0xC0) == 0x80) p--;
        int32_t cp;
        dec(s, n, p, &cp);
        bool hit = ws ? py_space(cp) : false;
        if (!ws) {
            for (size_t j = 0; j < chars.u.str.n;) {
                int32_t d;
                j += dec(chars.u.str.s, chars.u.str.n, j, &d);
                if (d == cp) hit = true;
            }
        }
        if (!hit) break;
        hi = p;
    }
    if (lo == 0 && hi == n) {
        *out = v;
        return 0;
    }
    *out = jv_str(c, s + lo, hi - lo);
    return out->type == JV_STR ? 0 : jv_oom(c, at);
}

static size_t find_bytes(const char *h, size_t hn, const char *nd, size_t nn, size_t from) {
    if (nn == 0) return from <= hn ? from : (size_t)-1;
    if (from > hn || hn - from < nn) return (size_t)-1;
    const char *p = memmem(h + from, hn - from, nd, nn);
    return p ? (size_t)(p - h) : (size_t)-1;
}

int jstr_replace(jctx *c, const jnode *at, jv s, jv old, jv new_, int64_t count, jv *out) {
    jbuf b = {0};
    size_t pos = 0;
    int64_t done = 0;
    if (old.u.str.n == 0) {
        /* Python inserts `new` before every code point and at the end */
        for (size_t i = 0; i <= s.u.str.n;) {
            if (count < 0 || done < count) {
                jbuf_put(&b, new_.u.str.s, new_.u.str.n);
                done++;
            }
            if (i == s.u.str.n) break;
            size_t j = i + 1;
            while (j < s.u.str.n && ((unsigned char)s.u.str.s[j] & 0xC0) == 0x80) j++;
            jbuf_put(&b, s.u.str.s + i, j - i);
            i = j;
        }
    } else {
        for (;;) {
            size_t hit = (count >= 0 && done >= count)
                             ? (size_t)-1
                             : find_bytes(s.u.str.s, s.u.str.n, old.u.str.s, old.u.str.n, pos);
            if (hit == (size_t)-1) {
                jbuf_put(&b, s.u.str.s + pos, s.u.str.n - pos);
                break;
            }
            jbuf_put(&b, s.u.str.s + pos, hit - pos);
            jbuf_put(&b, new_.u.str.s, new_.u.str.n);
            pos = hit + old.u.str.n;
            done++;
        }
    }
    if (!b.p && !b.oom) {
        *out = jv_str_lit("");
        return 0;
    }
    *out = jv_str_buf(c, &b);
    return out->type == JV_STR ? 0 : jv_oom(c, at);
}

/* ---- str methods ------------------------------------------------------------------- */

static int strip_common(jctx *c, const jnode *at, jv self, jv *args, size_t nargs, const char **kwn,
                        jv *kwv, size_t nkw, jv *out, int which) {
    jv chars = jv_none();
    ARG(0, "chars", chars);
    return jstr_strip(c, at, self, chars, which, out);
}
BUILTIN(m_strip) {
    return strip_common(c, at, self, args, nargs, kwn, kwv, nkw, out, 3);
}
BUILTIN(m_lstrip) {
    return strip_common(c, at, self, args, nargs, kwn, kwv, nkw, out, 1);
}
BUILTIN(m_rstrip) {
    return strip_common(c, at, self, args, nargs, kwn, kwv, nkw, out, 2);
}
BUILTIN(m_upper) {
    *out = jstr_case(c, self, 1);
    return out->type == JV_STR ? 0 : jv_oom(c, at);
}
BUILTIN(m_lower) {
    *out = jstr_case(c, self, 0);
    return out->type == JV_STR ? 0 : jv_oom(c, at);
}
BUILTIN(m_title) {
    *out = jstr_case(c, self, 3);
    return out->type == JV_STR ? 0 : jv_oom(c, at);
}
BUILTIN(m_capitalize) {
    *out = jstr_case(c, self, 2);
    return out->type == JV_STR ? 0 : jv_oom(c, at);
}
BUILTIN(m_swapcase) {
    *out = jstr_case(c, self, 4);
    return out->type == JV_STR ? 0 : jv_oom(c, at);
}

static int split_common(jctx *c, const jnode *at, jv self, jv *args, size_t nargs, const char **kwn,
                        jv *kwv, size_t nkw, jv *out, bool right) {
    jv sep = jv_none(), maxv = jv_int(-1);
    ARG(0, "sep", sep);
    ARG(1, "maxsplit", maxv);
    if (maxv.type != JV_INT) return jerr(c, at, "maxsplit must be an integer");
    int64_t maxsplit = maxv.u.i;
    const char *s = self.u.str.s;
    size_t n = self.u.str.n;
    jlist *l = jl_new(c, 0);
    if (!l) return jv_oom(c, at);
    /* collect [start, end) pieces, then reverse for rsplit */
    size_t cap = 16, np = 0;
    size_t *ps = kiln_malloc(cap * 2 * sizeof *ps);
    if (!ps) return jv_oom(c, at);
#define ADD_PIECE(a_, b_)                                                                          \
    do {                                                                                           \
        if (np == cap) {                                                                           \
            size_t *nps_ = kiln_realloc(ps, cap * 4 * sizeof *ps);                                 \
            if (!nps_) goto oom;                                                                   \
            ps = nps_;                                                                             \
            cap *= 2;                                                                              \
        }                                                                                          \
        ps[2 * np] = (a_);                                                                         \
        ps[2 * np + 1] = (b_);                                                                     \
        np++;                                                                                      \
    } while (0)
    if (sep.type == JV_NONE) {
        if (!right) {
            size_t i = 0;
            int64_t splits = 0;
            for (;;) {
                int32_t cp;
                while (i < n && (dec(s, n, i, &cp), py_space(cp))) i += dec(s, n, i, &cp);
                if (i >= n) break;
                if (maxsplit >= 0 && splits >= maxsplit) {
                    size_t e = n;
                    /* Python keeps the remainder but strips its trailing whitespace? no:
                     * remainder is kept as is after leading whitespace */
                    ADD_PIECE(i, e);
                    break;
                }
                size_t st = i;
                while (i < n && (dec(s, n, i, &cp), !py_space(cp))) i += dec(s, n, i, &cp);
                ADD_PIECE(st, i);
                splits++;
            }
        } else {
            size_t i = n;
            int64_t splits = 0;
            for (;;) {
                int32_t cp;
                while (i > 0) {
                    size_t p = i - 1;
                    while (p > 0 && ((unsigned char)s[p] & 0xC0) == 0x80) p--;
                    dec(s, n, p, &cp);
                    if (!py_space(cp)) break;
                    i = p;
                }
                if (i == 0) break;
                if (maxsplit >= 0 && splits >= maxsplit) {
                    ADD_PIECE(0, i);
                    break;
                }
                size_t e = i;
                while (i > 0) {
                    size_t p = i - 1;
                    while (p > 0 && ((unsigned char)s[p] & 0xC0) == 0x80) p--;
                    dec(s, n, p, &cp);
                    if (py_space(cp)) break;
                    i = p;
                }
                ADD_PIECE(i, e);
                splits++;
            }
        }
    } else {
        if (sep.type != JV_STR) {
            kiln_free(ps);
            return jerr(c, at, "must be str or None, not %s", jv_type_name(sep));
        }
        if (sep.u.str.n == 0) {
            kiln_free(ps);
            return jerr(c, at, "empty separator");
        }
        size_t sl = sep.u.str.n;
        if (!right) {
            size_t pos = 0;
            int64_t splits = 0;
            for (;;) {
                size_t hit = (maxsplit >= 0 && splits >= maxsplit)
                                 ? (size_t)-1
                                 : find_bytes(s, n, sep.u.str.s, sl, pos);
                if (hit == (size_t)-1) {
                    ADD_PIECE(pos, n);
                    break;
                }
                ADD_PIECE(pos, hit);
                pos = hit + sl;
                splits++;
            }
        } else {
            size_t end = n;
            int64_t splits = 0;
            for (;;) {
                size_t hit = (size_t)-1;
                if (!(maxsplit >= 0 && splits >= maxsplit) && end >= sl) {
                    for (size_t p = end - sl + 1; p-- > 0;)
                        if (!memcmp(s + p, sep.u.str.s, sl)) {
                            hit = p;
                            break;
                        }
                }
                if (hit == (size_t)-1) {
                    ADD_PIECE(0, end);
                    break;
                }
                ADD_PIECE(hit + sl, end);
                end = hit;
                splits++;
            }
        }
    }
    for (size_t k = 0; k < np; k++) {
        size_t idx = right ? np - 1 - k : k;
        jv piece = jv_str(c, s + ps[2 * idx], ps[2 * idx + 1] - ps[2 * idx]);
        if (piece.type != JV_STR || jl_push(c, l, piece)) goto oom;
    }
#undef ADD_PIECE
    kiln_free(ps);
    *out = jv_list(l);
    return 0;
oom:
    kiln_free(ps);
    return jv_oom(c, at);
}
BUILTIN(m_split) {
    return split_common(c, at, self, args, nargs, kwn, kwv, nkw, out, false);
}
BUILTIN(m_rsplit) {
    return split_common(c, at, self, args, nargs, kwn, kwv, nkw, out, true);
}

/* Python str.splitlines boundaries; keepends keeps them. */
int jstr_splitlines(jctx *c, const jnode *at, jv self, bool keepends, jlist **out) {
    const char *s = self.u.str.s;
    size_t n = self.u.str.n, st = 0;
    jlist *l = jl_new(c, 0);
    if (!l) return jv_oom(c, at);
    for (size_t i = 0; i < n;) {
        int32_t cp;
        size_t k = dec(s, n, i, &cp);
        bool brk = cp == '\n' || cp == '\r' || cp == 0x0B || cp == 0x0C || cp == 0x1C ||
                   cp == 0x1D || cp == 0x1E || cp == 0x85 || cp == 0x2028 || cp == 0x2029;
        if (!brk) {
            i += k;
            continue;
        }
        size_t e = i + k;
        if (cp == '\r' && e < n && s[e] == '\n') e++;
        jv piece = jv_str(c, s + st, (keepends ? e : i) - st);
        if (piece.type != JV_STR || jl_push(c, l, piece)) return jv_oom(c, at);
        st = i = e;
    }
    if (st < n) {
        jv piece = jv_str(c, s + st, n - st);
        if (piece.type != JV_STR || jl_push(c, l, piece)) return jv_oom(c, at);
    }
    *out = l;
    return 0;
}
BUILTIN(m_splitlines) {
    jv ke = jv_bool(false);
    ARG(0, "keepends", ke);
    jlist *l;
    JTRY(jstr_splitlines(c, at, self, jv_truthy(ke), &l));
    *out = jv_list(l);
    return 0;
}

static int affix_common(jctx *c, const jnode *at, jv self, jv *args, size_t nargs, const char **kwn,
                        jv *kwv, size_t nkw, jv *out, bool end) {
    jv p;
    if (!ARG(0, NULL, p))
        return jerr(c, at, "%s() takes at least 1 argument", end ? "endswith" : "startswith");
    size_t np = p.type == JV_LIST ? p.u.list->n : 1;
    for (size_t i = 0; i < np; i++) {
        jv x = p.type == JV_LIST ? p.u.list->items[i] : p;
        if (x.type != JV_STR)
            return jerr(c, at, "%s first arg must be str or a tuple of str, not %s",
                        end ? "endswith" : "startswith", jv_type_name(x));
        if (x.u.str.n <= self.u.str.n &&
            !memcmp(self.u.str.s + (end ? self.u.str.n - x.u.str.n : 0), x.u.str.s, x.u.str.n)) {
            *out = jv_bool(true);
            return 0;
        }
    }
    *out = jv_bool(false);
    return 0;
}
BUILTIN(m_startswith) {
    return affix_common(c, at, self, args, nargs, kwn, kwv, nkw, out, false);
}
BUILTIN(m_endswith) {
    return affix_common(c, at, self, args, nargs, kwn, kwv, nkw, out, true);
}

BUILTIN(m_replace) {
    jv old, new_, cnt = jv_int(-1);
    if (!ARG(0, NULL, old) || !ARG(1, NULL, new_))
        return jerr(c, at, "replace() takes 2 arguments");
    ARG(2, "count", cnt);
    JTRY(need_str(c, at, old, "replace() argument 1"));
    JTRY(need_str(c, at, new_, "replace() argument 2"));
    if (cnt.type != JV_INT) return jerr(c, at, "replace() count must be an integer");
    return jstr_replace(c, at, self, old, new_, cnt.u.i, out);
}

static int find_common(jctx *c, const jnode *at, jv self, jv *args, size_t nargs, const char **kwn,
                       jv *kwv, size_t nkw, jv *out, int mode) {
    jv sub;
    if (!ARG(0, NULL, sub)) return jerr(c, at, "find() takes at least 1 argument");
    JTRY(need_str(c, at, sub, "find() argument"));
    const char *s = self.u.str.s;
    size_t n = self.u.str.n;
    if (mode == 2) { /* count */
        int64_t k = 0;
        if (sub.u.str.n == 0) {
            *out = jv_int((int64_t)ju_len(s, n) + 1);
            return 0;
        }
        for (size_t pos = 0;;) {
            size_t hit = find_bytes(s, n, sub.u.str.s, sub.u.str.n, pos);
            if (hit == (size_t)-1) break;
            k++;
            pos = hit + sub.u.str.n;
        }
        *out = jv_int(k);
        return 0;
    }
    size_t hit = (size_t)-1;
    if (mode == 0) {
        hit = find_bytes(s, n, sub.u.str.s, sub.u.str.n, 0);
    } else if (sub.u.str.n <= n) {
        for (size_t p = n - sub.u.str.n + 1; p-- > 0;)
            if (!memcmp(s + p, sub.u.str.s, sub.u.str.n)) {
                hit = p;
                break;
            }
    }
    *out = jv_int(hit == (size_t)-1 ? -1 : (int64_t)ju_len(s, hit));
    return 0;
}
BUILTIN(m_find) {
    return find_common(c, at, self, args, nargs, kwn, kwv, nkw, out, 0);
}
BUILTIN(m_rfind) {
    return find_common(c, at, self, args, nargs, kwn, kwv, nkw, out, 1);
}
BUILTIN(m_count) {
    return find_common(c, at, self, args, nargs, kwn, kwv, nkw, out, 2);
}

BUILTIN(m_join) {
    jv it;
    jlist *l;
    if (!ARG(0, NULL, it)) return jerr(c, at, "join() takes exactly one argument");
    JTRY(jv_iter(c, at, it, &l));
    jbuf b = {0};
    for (size_t i = 0; i < l->n; i++) {
        if (l->items[i].type != JV_STR) {
            jbuf_free(&b);
            return jerr(c, at, "sequence item %zu: expected str instance, %s found", i,
                        jv_type_name(l->items[i]));
        }
        if (i) jbuf_put(&b, self.u.str.s, self.u.str.n);
        jbuf_put(&b, l->items[i].u.str.s, l->items[i].u.str.n);
    }
    if (!b.p && !b.oom) {
        *out = jv_str_lit("");
        return 0;
    }
    *out = jv_str_buf(c, &b);
    return out->type == JV_STR ? 0 : jv_oom(c, at);
}

static int is_common(jctx *c, jv self, jv *out, int mode) {
    (void)c;
    bool all = self.u.str.n > 0, any_cased = false;
    for (size_t i = 0; i < self.u.str.n;) {
        int32_t cp;
        i += dec(self.u.str.s, self.u.str.n, i, &cp);
        utf8proc_category_t cat = utf8proc_category(cp);
        bool letter = cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO;
        bool digit = cat == UTF8PROC_CATEGORY_ND;
        switch (mode) {
        case 0:
            all &= digit;
            break;
        case 1:
            all &= letter;
            break;
        case 2:
            all &= letter || digit || cat == UTF8PROC_CATEGORY_NL || cat == UTF8PROC_CATEGORY_NO;
            break;
        case 3:
            all &= py_space(cp);
            break;
        case 4: /* isupper */
            if (cat == UTF8PROC_CATEGORY_LL) all = false;
            if (cat == UTF8PROC_CATEGORY_LU || cat == UTF8PROC_CATEGORY_LT) any_cased = true;
            break;
        default: /* islower */
            if (cat == UTF8PROC_CATEGORY_LU || cat == UTF8PROC_CATEGORY_LT) all = false;
            if (cat == UTF8PROC_CATEGORY_LL) any_cased = true;
        }
    }
    *out = jv_bool(mode >= 4 ? all && any_cased : all);
    return 0;
}
BUILTIN(m_isdigit) {
    return is_common(c, self, out, 0);
}
BUILTIN(m_isalpha) {
    return is_common(c, self, out, 1);
}
BUILTIN(m_isalnum) {
    return is_common(c, self, out, 2);
}
BUILTIN(m_isspace) {
    return is_common(c, self, out, 3);
}
BUILTIN(m_isupper) {
    return is_common(c, self, out, 4);
}
BUILTIN(m_islower) {
    return is_common(c, self, out, 5);
}

static int affix_remove(jctx *c, const jnode *at, jv self, jv *args, size_t nargs, jv *out,
                        bool suffix) {
    if (nargs < 1 || args[0].type != JV_STR)
        return jerr(c, at, "removeprefix/removesuffix needs a str");
    jv p = args[0];
    if (p.u.str.n <= self.u.str.n &&
        !memcmp(self.u.str.s + (suffix ? self.u.str.n - p.u.str.n : 0), p.u.str.s, p.u.str.n)) {
        *out = jv_str(c, self.u.str.s + (suffix ? 0 : p.u.str.n), self.u.str.n - p.u.str.n);
        return out->type == JV_STR ? 0 : jv_oom(c, at);
    }
    *out = self;
    return 0;
}
BUILTIN(m_removeprefix) {
    return affix_remove(c, at, self, args, nargs, out, false);
}
BUILTIN(m_removesuffix) {
    return affix_remove(c, at, self, args, nargs, out, true);
}

/* str.format: {} {0} {name} {{ }} and !s/!r conversions; format specs are refused. */
BUILTIN(m_format) {
    const char *s = self.u.str.s;
    size_t n = self.u.str.n, auto_idx = 0;
    jbuf b = {0};
    for (size_t i = 0; i < n; i++) {
        char ch = s[i];
        if (ch == '}') {
            if (i + 1 < n && s[i + 1] == '}') {
                jbuf_putc(&b, '}');
                i++;
                continue;
            }
            jbuf_free(&b);
            return jerr(c, at, "Single '}' encountered in format string");
        }
        if (ch != '{') {
            jbuf_putc(&b, ch);
            continue;
        }
        if (i + 1 < n && s[i + 1] == '{') {
            jbuf_putc(&b, '{');
            i++;
            continue;
        }
        size_t e = i + 1;
        while (e < n && s[e] != '}') e++;
        if (e >= n) {
            jbuf_free(&b);
            return jerr(c, at, "Single '{' encountered in format string");
        }
        char field[128];
        size_t fl = e - i - 1;
        if (fl >= sizeof field) {
            jbuf_free(&b);
            return jerr(c, at, "format field too long");
        }
        memcpy(field, s + i + 1, fl);
        field[fl] = 0;
        char conv = 0;
        char *bang = strchr(field, '!');
        if (bang) {
            conv = bang[1];
            *bang = 0;
        }
        if (strchr(field, ':') || strchr(field, '.') || strchr(field, '[')) {
            jbuf_free(&b);
            return jerr(c, at,
                        "kiln does not support format specs or field access in str.format ('%s')",
                        field);
        }
        jv v;
        bool found = false;
        if (!field[0]) {
            found = auto_idx < nargs;
            if (found) v = args[auto_idx++];
        } else if (field[0] >= '0' && field[0] <= '9') {
            size_t idx = (size_t)strtoul(field, NULL, 10);
            found = idx < nargs;
            if (found) v = args[idx];
        } else {
            for (size_t k = 0; k < nkw; k++)
                if (!strcmp(kwn[k], field)) {
                    v = kwv[k];
                    found = true;
                }
        }
        if (!found) {
            jbuf_free(&b);
            return jerr(c, at, "str.format: no argument for field '{%s}'", field);
        }
        if (conv == 'r')
            jv_repr_into(&b, v);
        else
            jv_str_into(&b, v);
        i = e;
    }
    if (!b.p && !b.oom) {
        *out = jv_str_lit("");
        return 0;
    }
    *out = jv_str_buf(c, &b);
    return out->type == JV_STR ? 0 : jv_oom(c, at);
}

/* `fmt % args` (Python printf-style): %s %r %d %i %f %x %% with optional width. */
int jinja_str_percent(jctx *c, const jnode *at, jv fmt, jv args, jv *out) {
    jv one[1] = {args};
    jv *av = one;
    size_t an = 1, ai = 0;
    if (args.type == JV_LIST && args.u.list->tuple) {
        av = args.u.list->items;
        an = args.u.list->n;
    }
    jbuf b = {0};
    const char *s = fmt.u.str.s;
    size_t n = fmt.u.str.n;
    for (size_t i = 0; i < n; i++) {
        if (s[i] != '%') {
            jbuf_putc(&b, s[i]);
            continue;
        }
        if (++i >= n) goto bad;
        if (s[i] == '%') {
            jbuf_putc(&b, '%');
            continue;
        }
        char spec[16] = "%";
        size_t k = 1;
        /* (a NUL byte of the string is no flag or conversion: strchr would match the
         * terminator) */
        while (i < n && k < 10 && s[i] && strchr("-+ 0#.0123456789", s[i])) spec[k++] = s[i++];
        if (i >= n) goto bad;
        /* width and precision are at most 4 digits each (Python's are unbounded, but a
         * template from a model file must not make one string of gigabytes) */
        for (size_t d = 1, run = 0; d < k; d++) {
            run = spec[d] >= '0' && spec[d] <= '9' ? run + 1 : 0;
            if (run > 4) {
                jbuf_free(&b);
                return jerr(c, at, "format: width or precision over 9999 in '%%%.*s'", (int)(k - 1),
                            spec + 1);
            }
        }
        char conv = s[i];
        if (!conv) goto bad;
        if (ai >= an) {
            jbuf_free(&b);
            return jerr(c, at, "not enough arguments for format string");
        }
        jv v = av[ai++];
        if (conv == 's' || conv == 'r') {
            jbuf tmp = {0};
            if (conv == 's')
                jv_str_into(&tmp, v);
            else
                jv_repr_into(&tmp, v);
            spec[k++] = 's';
            spec[k] = 0;
            char *o = NULL;
            int len = asprintf(&o, spec, tmp.p ? tmp.p : "");
            jbuf_free(&tmp);
            if (len < 0) goto oom;
            jbuf_put(&b, o, (size_t)len);
            free(o); /* (asprintf's memory, not kiln_alloc's) */
        } else if (strchr("dixXeEfFgG", conv)) {
            if (!jv_is_num(v)) {
                jbuf_free(&b);
                return jerr(c, at, "%%%c format: a real number is required, not %s", conv,
                            jv_type_name(v));
            }
            char *o = NULL; /* (widths up to 9999 and %f of 1e308: not a fixed buffer) */
            int len;
            if (strchr("dixX", conv)) {
                spec[k++] = 'l', spec[k++] = 'l', spec[k++] = conv == 'i' ? 'd' : conv;
                spec[k] = 0;
                len = asprintf(&o, spec,
                               (long long)(v.type == JV_FLOAT ? (long long)v.u.f
                                           : v.type == JV_INT ? v.u.i
                                                              : v.u.b));
            } else {
                spec[k++] = conv;
                spec[k] = 0;
                len = asprintf(&o, spec, jv_num(v));
            }
            if (len < 0) goto oom;
            jbuf_put(&b, o, (size_t)len);
            free(o);
        } else {
            goto bad;
        }
    }
    if (ai < an && !(args.type == JV_DICT)) {
        jbuf_free(&b);
        return jerr(c, at, "not all arguments converted during string formatting");
    }
    if (!b.p && !b.oom) {
        *out = jv_str_lit("");
        return 0;
    }
    *out = jv_str_buf(c, &b);
    return out->type == JV_STR ? 0 : jv_oom(c, at);
bad:
    jbuf_free(&b);
    return jerr(c, at, "unsupported format character in '%%' formatting");
oom:
    jbuf_free(&b);
    return jv_oom(c, at);
}

/* ---- dict / list methods ----------------------------------------------------------- */

BUILTIN(m_get) {
    jv key, def = jv_none();
    if (!ARG(0, NULL, key)) return jerr(c, at, "get expected at least 1 argument, got 0");
    ARG(1, NULL, def);
    if (!jd_get(self.u.dict, key, out)) *out = def;
    return 0;
}

static int items_of(jctx *c, const jnode *at, jdict *d, int which, jv *out) {
    jlist *l = jl_new(c, d->n);
    if (!l) return jv_oom(c, at);
    for (size_t i = 0; i < d->n; i++) {
        if (which == 0) {
            jlist *t = jl_new(c, 2);
            if (!t) return jv_oom(c, at);
            t->items[0] = d->keys[i];
            t->items[1] = d->vals[i];
            t->n = 2;
            t->tuple = true;
            l->items[l->n++] = jv_list(t);
        } else {
            l->items[l->n++] = which == 1 ? d->keys[i] : d->vals[i];
        }
    }
    *out = jv_list(l);
    return 0;
}
int jinja_dict_items(jctx *c, const jnode *at, jdict *d, jv *out) {
    return items_of(c, at, d, 0, out);
}
BUILTIN(m_items) {
    JTRY(items_of(c, at, self.u.dict, 0, out));
    *out = jv_lazy(out->u.list, JL_VIEW, "dict_items");
    return 0;
}
BUILTIN(m_keys) {
    JTRY(items_of(c, at, self.u.dict, 1, out));
    *out = jv_lazy(out->u.list, JL_VIEW, "dict_keys");
    return 0;
}
BUILTIN(m_values) {
    JTRY(items_of(c, at, self.u.dict, 2, out));
    *out = jv_lazy(out->u.list, JL_VIEW, "dict_values");
    return 0;
}
BUILTIN(m_dict_copy) {
    jdict *d = jd_new(c, self.u.dict->n);
    if (!d) return jv_oom(c, at);
    for (size_t i = 0; i < self.u.dict->n; i++) {
        d->keys[i] = self.u.dict->keys[i];
        d->vals[i] = self.u.dict->vals[i];
    }
    d->n = self.u.dict->n;
    *out = jv_dict(d);
    return 0;
}
BUILTIN(m_list_copy) {
    jlist *l = jl_new(c, self.u.list->n);
    if (!l) return jv_oom(c, at);
    for (size_t i = 0; i < self.u.list->n; i++) l->items[l->n++] = self.u.list->items[i];
    *out = jv_list(l);
    return 0;
}
BUILTIN(m_list_index) {
    jv x;
    if (!ARG(0, NULL, x)) return jerr(c, at, "index expected 1 argument");
    for (size_t i = 0; i < self.u.list->n; i++)
        if (jv_eq(self.u.list->items[i], x)) {
            *out = jv_int((int64_t)i);
            return 0;
        }
    return jerr(c, at, "value is not in list");
}
BUILTIN(m_list_count) {
    jv x;
    int64_t k = 0;
    if (!ARG(0, NULL, x)) return jerr(c, at, "count expected 1 argument");
    for (size_t i = 0; i < self.u.list->n; i++) k += jv_eq(self.u.list->items[i], x);
    *out = jv_int(k);
    return 0;
}

/* ---- loop methods ------------------------------------------------------------------ */

BUILTIN(m_loop_cycle) {
    if (!nargs) return jerr(c, at, "no items for cycling given");
    *out = args[self.u.loop->index0 % nargs];
    return 0;
}
BUILTIN(m_loop_changed) {
    jlist *l = jl_new(c, nargs);
    if (!l) return jv_oom(c, at);
    for (size_t i = 0; i < nargs; i++) l->items[l->n++] = args[i];
    jv v = jv_list(l);
    jloop *lp = self.u.loop;
    bool changed = !lp->has_changed || !jv_eq(lp->last_changed, v);
    lp->last_changed = v;
    lp->has_changed = true;
    *out = jv_bool(changed);
    return 0;
}

/* ---- attribute lookup -------------------------------------------------------------- */

typedef struct method {
    const char *name;
    jbuiltin_fn fn;
} method;

static const method str_methods[] = {{"strip", m_strip},
                                     {"lstrip", m_lstrip},
                                     {"rstrip", m_rstrip},
                                     {"split", m_split},
                                     {"rsplit", m_rsplit},
                                     {"splitlines", m_splitlines},
                                     {"startswith", m_startswith},
                                     {"endswith", m_endswith},
                                     {"replace", m_replace},
                                     {"upper", m_upper},
                                     {"lower", m_lower},
                                     {"title", m_title},
                                     {"capitalize", m_capitalize},
                                     {"swapcase", m_swapcase},
                                     {"find", m_find},
                                     {"rfind", m_rfind},
                                     {"count", m_count},
                                     {"join", m_join},
                                     {"format", m_format},
                                     {"isdigit", m_isdigit},
                                     {"isalpha", m_isalpha},
                                     {"isalnum", m_isalnum},
                                     {"isspace", m_isspace},
                                     {"isupper", m_isupper},
                                     {"islower", m_islower},
                                     {"removeprefix", m_removeprefix},
                                     {"removesuffix", m_removesuffix},
                                     {NULL, NULL}};
static const method dict_methods[] = {{"get", m_get},       {"items", m_items},    {"keys", m_keys},
                                      {"values", m_values}, {"copy", m_dict_copy}, {NULL, NULL}};
static const method list_methods[] = {
    {"index", m_list_index}, {"count", m_list_count}, {"copy", m_list_copy}, {NULL, NULL}};
static const char *const dict_unsafe[] = {"pop", "popitem", "setdefault", "update", "clear", NULL};
static const char *const list_unsafe[] = {"append",  "extend", "insert", "pop", "remove",
                                          "reverse", "sort",   "clear",  NULL};

static bool find_method(const method *m, const char *name, jbuiltin_fn *fn) {
    for (; m->name; m++)
        if (!strcmp(m->name, name)) {
            *fn = m->fn;
            return true;
        }
    return false;
}

static int unsafe_method(jctx *c, const jnode *at, jv obj, const char *name, jv *out) {
    *out = jv_func(c, name, NULL, obj);
    if (out->type != JV_FUNC) return jv_oom(c, at);
    out->u.fn->unsafe_call = true;
    return 0;
}

static bool in_list(const char *const *l, const char *name) {
    for (; *l; l++)
        if (!strcmp(*l, name)) return true;
    return false;
}

static int loop_attr(jctx *c, const jnode *at, jv obj, const char *name, jv *out) {
    jloop *lp = obj.u.loop;
    int64_t i = (int64_t)lp->index0, n = (int64_t)lp->items->n;
    if (!strcmp(name, "index"))
        *out = jv_int(i + 1);
    else if (!strcmp(name, "index0"))
        *out = jv_int(i);
    else if (!strcmp(name, "revindex"))
        *out = jv_int(n - i);
    else if (!strcmp(name, "revindex0"))
        *out = jv_int(n - i - 1);
    else if (!strcmp(name, "first"))
        *out = jv_bool(i == 0);
    else if (!strcmp(name, "last"))
        *out = jv_bool(i == n - 1);
    else if (!strcmp(name, "length"))
        *out = jv_int(n);
    else if (!strcmp(name, "depth"))
        *out = jv_int(lp->depth);
    else if (!strcmp(name, "depth0"))
        *out = jv_int(lp->depth - 1);
    else if (!strcmp(name, "previtem"))
        *out = i > 0 ? lp->items->items[i - 1] : jv_undef("there is no previous item");
    else if (!strcmp(name, "nextitem"))
        *out = i + 1 < n ? lp->items->items[i + 1] : jv_undef("there is no next item");
    else if (!strcmp(name, "cycle"))
        *out = jv_func(c, "cycle", m_loop_cycle, obj);
    else if (!strcmp(name, "changed"))
        *out = jv_func(c, "changed", m_loop_changed, obj);
    else
        *out = jv_undef(name);
    return out->type == JV_UNDEF && !strcmp(name, "cycle") ? jv_oom(c, at) : 0;
}

static char *undef_msg(jctx *c, jv obj, const char *name) {
    char tmp[300];
    snprintf(tmp, sizeof tmp, "'%s object' has no attribute '%s'", jv_type_name(obj), name);
    jv s = jv_str(c, tmp, strlen(tmp));
    return s.type == JV_STR ? (char *)s.u.str.s : NULL;
}

int jinja_getattr(jctx *c, const jnode *at, jv obj, const char *name, jv *out) {
    jbuiltin_fn fn;
    switch (obj.type) {
    case JV_UNDEF:
        if (obj.unsafe) return jerr(c, at, "%s", obj.u.undef_name);
        if (obj.u.undef_name) return jerr(c, at, "'%s' is undefined", obj.u.undef_name);
        return jerr(c, at, "undefined value has no attribute '%s'", name);
    case JV_STR:
        if (find_method(str_methods, name, &fn)) break;
        *out = jv_undef(undef_msg(c, obj, name));
        return 0;
    case JV_DICT:
        if (find_method(dict_methods, name, &fn)) break;
        if (in_list(dict_unsafe, name)) return unsafe_method(c, at, obj, name, out);
        if (jd_get_str(obj.u.dict, name, out)) return 0;
        *out = jv_undef(undef_msg(c, obj, name));
        return 0;
    case JV_LIST:
        if (find_method(list_methods, name, &fn)) break;
        if (in_list(list_unsafe, name)) return unsafe_method(c, at, obj, name, out);
        *out = jv_undef(undef_msg(c, obj, name));
        return 0;
    case JV_NS:
        if (!jd_get_str(obj.u.dict, name, out)) *out = jv_undef(undef_msg(c, obj, name));
        return 0;
    case JV_LOOP:
        return loop_attr(c, at, obj, name, out);
    default:
        *out = jv_undef(undef_msg(c, obj, name));
        return 0;
    }
    *out = jv_func(c, name, fn, obj);
    return out->type == JV_FUNC ? 0 : jv_oom(c, at);
}

int jinja_getitem(jctx *c, const jnode *at, jv obj, jv key, jv *out) {
    switch (obj.type) {
    case JV_UNDEF:
        return jinja_getattr(c, at, obj, key.type == JV_STR ? key.u.str.s : "?", out);
    case JV_DICT:
        if (jd_get(obj.u.dict, key, out)) return 0;
        break;
    case JV_LIST:
    case JV_STR:
        if (key.type == JV_INT || key.type == JV_BOOL) {
            int64_t i = key.type == JV_INT ? key.u.i : key.u.b;
            bool ok;
            int64_t n = jv_len(obj, &ok);
            if (i < 0) i += n;
            if (i < 0 || i >= n) {
                *out = jv_undef("index out of range");
                return 0;
            }
            if (obj.type == JV_LIST) {
                *out = obj.u.list->items[i];
                return 0;
            }
            size_t off = ju_offset(obj.u.str.s, obj.u.str.n, (size_t)i);
            size_t e = off + 1;
            while (e < obj.u.str.n && ((unsigned char)obj.u.str.s[e] & 0xC0) == 0x80) e++;
            *out = jv_str(c, obj.u.str.s + off, e - off);
            return out->type == JV_STR ? 0 : jv_oom(c, at);
        }
        break;
    default:
        break;
    }
    if (key.type == JV_STR) {
        if (obj.type == JV_DICT) {
            jbuiltin_fn fn;
            if (find_method(dict_methods, key.u.str.s, &fn))
                return jinja_getattr(c, at, obj, key.u.str.s, out);
            if (in_list(dict_unsafe, key.u.str.s))
                return unsafe_method(c, at, obj, key.u.str.s, out);
            *out = jv_undef(undef_msg(c, obj, key.u.str.s));
            return 0;
        }
        return jinja_getattr(c, at, obj, key.u.str.s, out);
    }
    *out = jv_undef("item not found");
    return 0;
}

/* ---- globals ----------------------------------------------------------------------- */

BUILTIN(g_range) {
    int64_t a[3] = {0, 0, 1};
    if (nargs < 1 || nargs > 3 || nkw)
        return jerr(c, at, "range expected 1 to 3 integer arguments");
    for (size_t i = 0; i < nargs; i++) {
        if (args[i].type != JV_INT && args[i].type != JV_BOOL)
            return jerr(c, at, "'%s' object cannot be interpreted as an integer",
                        jv_type_name(args[i]));
    }
    if (nargs == 1)
        a[1] = args[0].u.i;
    else {
        a[0] = args[0].type == JV_INT ? args[0].u.i : args[0].u.b;
        a[1] = args[1].type == JV_INT ? args[1].u.i : args[1].u.b;
        if (nargs == 3) a[2] = args[2].type == JV_INT ? args[2].u.i : args[2].u.b;
    }
    if (a[2] == 0) return jerr(c, at, "range() arg 3 must not be zero");
    jlist *l = jl_new(c, 0);
    if (!l) return jv_oom(c, at);
    for (int64_t i = a[0]; a[2] > 0 ? i < a[1] : i > a[1]; i += a[2]) {
        if (l->n >= JINJA_MAX_RANGE)
            return jerr(c, at, "range() longer than kiln's limit of %d items", JINJA_MAX_RANGE);
        if (jl_push(c, l, jv_int(i))) return jv_oom(c, at);
        if ((a[2] > 0 && i > INT64_MAX - a[2]) || (a[2] < 0 && i < INT64_MIN - a[2])) break;
    }
    *out = jv_lazy(l, JL_RANGE, "range");
    return 0;
}

BUILTIN(g_namespace) {
    jdict *d = jd_new(c, 0);
    if (!d) return jv_oom(c, at);
    for (size_t i = 0; i < nargs; i++) {
        if (args[i].type != JV_DICT)
            return jerr(c, at, "namespace() positional argument must be a dict");
        for (size_t k = 0; k < args[i].u.dict->n; k++)
            if (jd_set(c, d, args[i].u.dict->keys[k], args[i].u.dict->vals[k]))
                return jv_oom(c, at);
    }
    for (size_t i = 0; i < nkw; i++)
        if (jd_set(c, d, jv_str_lit(kwn[i]), kwv[i])) return jv_oom(c, at);
    out->type = JV_NS;
    out->unsafe = 0;
    out->u.dict = d;
    return 0;
}

BUILTIN(g_dict) {
    jdict *d = jd_new(c, 0);
    if (!d) return jv_oom(c, at);
    for (size_t i = 0; i < nargs; i++) {
        if (args[i].type != JV_DICT)
            return jerr(c, at, "dict() positional argument must be a dict");
        for (size_t k = 0; k < args[i].u.dict->n; k++)
            if (jd_set(c, d, args[i].u.dict->keys[k], args[i].u.dict->vals[k]))
                return jv_oom(c, at);
    }
    for (size_t i = 0; i < nkw; i++)
        if (jd_set(c, d, jv_str_lit(kwn[i]), kwv[i])) return jv_oom(c, at);
    *out = jv_dict(d);
    return 0;
}

BUILTIN(g_raise_exception) {
    jbuf b = {0};
    if (nargs) jv_str_into(&b, args[0]);
    int rc = jerr(c, at, "%s", b.p ? b.p : "");
    jbuf_free(&b);
    return rc;
}

/* Parses "YYYY-MM-DD[THH:MM[:SS[.frac]]]" into tm; false when malformed. */
static bool parse_iso(const char *s, struct tm *tm) {
    int y, mo, d, h = 0, mi = 0, se = 0;
    memset(tm, 0, sizeof *tm);
    int k = sscanf(s, "%4d-%2d-%2d%*1[T ]%2d:%2d:%2d", &y, &mo, &d, &h, &mi, &se);
    if (k != 3 && k < 5) return false;
    if (mo < 1 || mo > 12 || d < 1 || d > 31 || h > 23 || mi > 59 || se > 60) return false;
    tm->tm_year = y - 1900;
    tm->tm_mon = mo - 1;
    tm->tm_mday = d;
    tm->tm_hour = h;
    tm->tm_min = mi;
    tm->tm_sec = se;
    /* fill weekday and day of year */
    time_t t = timegm(tm);
    struct tm norm;
    if (!gmtime_r(&t, &norm)) return false;
    *tm = norm;
    return true;
}

BUILTIN(g_strftime_now) {
    if (nargs < 1 || args[0].type != JV_STR)
        return jerr(c, at, "strftime_now() needs a format string");
    struct tm tm;
    if (c->now_iso) {
        if (!parse_iso(c->now_iso, &tm))
            return jerr(c, at,
                        "KILN_TEMPLATE_NOW '%s' is not an ISO 8601 time (YYYY-MM-DDTHH:MM:SS)",
                        c->now_iso);
    } else {
        time_t t = time(NULL);
        if (!localtime_r(&t, &tm)) return jerr(c, at, "strftime_now: cannot read the local time");
    }
    char buf[512];
    size_t k = strftime(buf, sizeof buf, args[0].u.str.s, &tm);
    if (k == 0 && args[0].u.str.n > 0) return jerr(c, at, "strftime_now: result too long or empty");
    *out = jv_str(c, buf, k);
    return out->type == JV_STR ? 0 : jv_oom(c, at);
}

int jinja_add_globals(jctx *c, jscope *s) {
    static const method globals[] = {{"range", g_range},
                                     {"namespace", g_namespace},
                                     {"dict", g_dict},
                                     {"raise_exception", g_raise_exception},
                                     {"strftime_now", g_strftime_now},
                                     {NULL, NULL}};
    for (const method *m = globals; m->name; m++) {
        jv f = jv_func(c, m->name, m->fn, jv_none());
        if (f.type != JV_FUNC || jscope_set(c, s, m->name, f)) return -1;
    }
    return 0;
}
