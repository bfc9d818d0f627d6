/*
 * jinja_value.c — values with Python semantics: construction in the render arena,
 * truthiness, ==, ordering, str() and repr() (float repr is the shortest round-trip form,
 * as Python prints it), len() and iteration.
 */
#include "tok/jinja_int.h"
#include "base/mem.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

/* ---- errors and buffers ------------------------------------------------------------ */

int jerr(jctx *c, const jnode *at, const char *fmt, ...) {
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (at)
        kiln_err_set(c->err, KILN_ERR_FORMAT, "line %d, column %d: %s", at->line, at->col, msg);
    else
        kiln_err_set(c->err, KILN_ERR_FORMAT, "%s", msg);
    return -1;
}

void jbuf_put(jbuf *b, const char *s, size_t n) {
    if (b->oom || n == 0) return;
    if (b->n + n + 1 > b->cap) {
        size_t nc = b->cap ? b->cap : 256;
        while (nc < b->n + n + 1) {
            if (nc > ((size_t)1 << 40)) {
                b->oom = true;
                return;
            }
            nc *= 2;
        }
        char *np = kiln_realloc(b->p, nc);
        if (!np) {
            b->oom = true;
            return;
        }
        b->p = np;
        b->cap = nc;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

void jbuf_putc(jbuf *b, char ch) {
    jbuf_put(b, &ch, 1);
}
void jbuf_puts(jbuf *b, const char *s) {
    jbuf_put(b, s, strlen(s));
}

void jbuf_printf(jbuf *b, const char *fmt, ...) {
    char tmp[256];
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (k > 0) jbuf_put(b, tmp, (size_t)k < sizeof tmp ? (size_t)k : sizeof tmp - 1);
}

void jbuf_free(jbuf *b) {
    kiln_free(b->p);
    b->p = NULL;
    b->n = b->cap = 0;
}

/* ---- construction ------------------------------------------------------------------ */

void *jalloc(jctx *c, size_t n) {
    if (n > c->budget) return NULL;
    c->budget -= n;
    return kiln_arena_alloc(c->a, n ? n : 1);
}

int jv_oom(jctx *c, const jnode *at) {
    return jerr(c, at, "out of memory (or over the render memory limit)");
}

jv jv_undef(const char *name) {
    jv v = {.type = JV_UNDEF};
    v.u.undef_name = name;
    return v;
}
jv jv_none(void) {
    return (jv){.type = JV_NONE};
}
jv jv_bool(bool b) {
    jv v = {.type = JV_BOOL};
    v.u.b = b;
    return v;
}
jv jv_int(int64_t i) {
    jv v = {.type = JV_INT};
    v.u.i = i;
    return v;
}
jv jv_float(double f) {
    jv v = {.type = JV_FLOAT};
    v.u.f = f;
    return v;
}
jv jv_str_lit(const char *s) {
    jv v = {.type = JV_STR};
    v.u.str.s = s;
    v.u.str.n = strlen(s);
    return v;
}
jv jv_str(jctx *c, const char *s, size_t n) {
    char *p = jalloc(c, n + 1);
    if (!p) return jv_undef(NULL);
    if (n) memcpy(p, s, n);
    p[n] = 0;
    jv v = {.type = JV_STR};
    v.u.str.s = p;
    v.u.str.n = n;
    return v;
}
jv jv_str_buf(jctx *c, jbuf *b) {
    if (b->oom) {
        jbuf_free(b);
        return jv_undef(NULL);
    }
    jv v = jv_str(c, b->p ? b->p : "", b->n);
    jbuf_free(b);
    return v;
}

jlist *jl_new(jctx *c, size_t cap) {
    jlist *l = jalloc(c, sizeof *l);
    if (!l) return NULL;
    memset(l, 0, sizeof *l);
    if (cap) {
        size_t bytes;
        if (!kiln_size_mul(cap, sizeof(jv), &bytes) || !(l->items = jalloc(c, bytes))) return NULL;
        l->cap = cap;
    }
    return l;
}

int jl_push(jctx *c, jlist *l, jv v) {
    if (l->n == l->cap) {
        size_t nc = l->cap ? l->cap * 2 : 4, bytes;
        if (!kiln_size_mul(nc, sizeof(jv), &bytes)) return -1;
        jv *ni = jalloc(c, bytes);
        if (!ni) return -1;
        if (l->n) memcpy(ni, l->items, l->n * sizeof(jv));
        l->items = ni;
        l->cap = nc;
    }
    l->items[l->n++] = v;
    return 0;
}

jv jv_list(jlist *l) {
    jv v = {.type = JV_LIST};
    v.u.list = l;
    return v;
}

jdict *jd_new(jctx *c, size_t cap) {
    jdict *d = jalloc(c, sizeof *d);
    if (!d) return NULL;
    memset(d, 0, sizeof *d);
    if (cap) {
        size_t bytes;
        if (!kiln_size_mul(cap, sizeof(jv), &bytes)) return NULL;
        d->keys = jalloc(c, bytes);
        d->vals = jalloc(c, bytes);
        if (!d->keys || !d->vals) return NULL;
        d->cap = cap;
    }
    return d;
}

bool jd_get(const jdict *d, jv key, jv *out) {
    for (size_t i = 0; i < d->n; i++)
        if (jv_eq(d->keys[i], key)) {
            if (out) *out = d->vals[i];
            return true;
        }
    return false;
}

bool jd_get_str(const jdict *d, const char *key, jv *out) {
    size_t n = strlen(key);
    for (size_t i = 0; i < d->n; i++)
        if (d->keys[i].type == JV_STR && d->keys[i].u.str.n == n &&
            !memcmp(d->keys[i].u.str.s, key, n)) {
            if (out) *out = d->vals[i];
            return true;
        }
    return false;
}

int jd_set(jctx *c, jdict *d, jv key, jv val) {
    for (size_t i = 0; i < d->n; i++)
        if (jv_eq(d->keys[i], key)) {
            d->vals[i] = val;
            return 0;
        }
    if (d->n == d->cap) {
        size_t nc = d->cap ? d->cap * 2 : 4, bytes;
        if (!kiln_size_mul(nc, sizeof(jv), &bytes)) return -1;
        jv *nk = jalloc(c, bytes), *nv = jalloc(c, bytes);
        if (!nk || !nv) return -1;
        if (d->n) {
            memcpy(nk, d->keys, d->n * sizeof(jv));
            memcpy(nv, d->vals, d->n * sizeof(jv));
        }
        d->keys = nk;
        d->vals = nv;
        d->cap = nc;
    }
    d->keys[d->n] = key;
    d->vals[d->n] = val;
    d->n++;
    return 0;
}

jv jv_dict(jdict *d) {
    jv v = {.type = JV_DICT};
    v.u.dict = d;
    return v;
}

jv jv_func(jctx *c, const char *name, jbuiltin_fn fn, jv self) {
    jfunc *f = jalloc(c, sizeof *f);
    if (!f) return jv_undef(NULL);
    memset(f, 0, sizeof *f);
    f->name = name;
    f->builtin = fn;
    f->self = self;
    f->caller = jv_undef(NULL);
    jv v = {.type = JV_FUNC};
    v.u.fn = f;
    return v;
}

/* ---- UTF-8 helpers ----------------------------------------------------------------- */

size_t ju_len(const char *s, size_t n) {
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (((unsigned char)s[i] & 0xC0) != 0x80) k++;
    return k;
}

size_t ju_offset(const char *s, size_t n, size_t i) {
    size_t k = 0;
    for (size_t p = 0; p < n; p++) {
        if (((unsigned char)s[p] & 0xC0) != 0x80) {
            if (k == i) return p;
            k++;
        }
    }
    return n;
}

/* ---- Python semantics -------------------------------------------------------------- */

bool jv_is_num(jv v) {
    return v.type == JV_INT || v.type == JV_FLOAT || v.type == JV_BOOL;
}

double jv_num(jv v) {
    return v.type == JV_INT ? (double)v.u.i : v.type == JV_FLOAT ? v.u.f : v.u.b ? 1.0 : 0.0;
}

jv jv_lazy(jlist *l, int kind, const char *kname) {
    l->kind = (uint8_t)kind;
    l->kname = kname;
    return jv_list(l);
}

void jhtml_escape_into(jbuf *b, const char *s, size_t n) {
    for (size_t i = 0; i < n; i++) {
        switch (s[i]) {
        case '&':
            jbuf_puts(b, "&amp;");
            break;
        case '<':
            jbuf_puts(b, "&lt;");
            break;
        case '>':
            jbuf_puts(b, "&gt;");
            break;
        case '"':
            jbuf_puts(b, "&#34;");
            break;
        case '\'':
            jbuf_puts(b, "&#39;");
            break;
        default:
            jbuf_putc(b, s[i]);
        }
    }
}

int jv_check_printable(jctx *c, const jnode *at, jv v) {
    if (v.type == JV_LIST && (v.u.list->kind == JL_ITER || v.u.list->kind == JL_RANGE))
        return jerr(c, at, "kiln cannot print a %s object (Python prints its address); add |list",
                    v.u.list->kname);
    return 0;
}

bool jv_truthy(jv v) {
    switch (v.type) {
    case JV_UNDEF:
    case JV_NONE:
        return false;
    case JV_BOOL:
        return v.u.b;
    case JV_INT:
        return v.u.i != 0;
    case JV_FLOAT:
        return v.u.f != 0.0;
    case JV_STR:
        return v.u.str.n != 0;
    case JV_LIST:
        return v.u.list->kind == JL_ITER || v.u.list->n != 0;
    case JV_DICT:
        return v.u.dict->n != 0;
    default:
        return true;
    }
}

bool jv_eq(jv a, jv b) {
    if (jv_is_num(a) && jv_is_num(b)) {
        if (a.type != JV_FLOAT && b.type != JV_FLOAT) {
            int64_t x = a.type == JV_INT ? a.u.i : a.u.b, y = b.type == JV_INT ? b.u.i : b.u.b;
            return x == y;
        }
        return jv_num(a) == jv_num(b);
    }
    if (a.type != b.type) return false;
    switch (a.type) {
    case JV_UNDEF:
    case JV_NONE:
        return true;
    case JV_STR:
        return a.u.str.n == b.u.str.n && !memcmp(a.u.str.s, b.u.str.s, a.u.str.n);
    case JV_LIST:
        if (a.u.list->tuple != b.u.list->tuple || a.u.list->n != b.u.list->n) return false;
        for (size_t i = 0; i < a.u.list->n; i++)
            if (!jv_eq(a.u.list->items[i], b.u.list->items[i])) return false;
        return true;
    case JV_DICT:
        if (a.u.dict->n != b.u.dict->n) return false;
        for (size_t i = 0; i < a.u.dict->n; i++) {
            jv o;
            if (!jd_get(b.u.dict, a.u.dict->keys[i], &o) || !jv_eq(a.u.dict->vals[i], o))
                return false;
        }
        return true;
    case JV_NS:
        return a.u.dict == b.u.dict;
    case JV_FUNC:
        return a.u.fn == b.u.fn;
    case JV_LOOP:
        return a.u.loop == b.u.loop;
    default:
        return false;
    }
}

const char *jv_type_name(jv v) {
    switch (v.type) {
    case JV_UNDEF:
        return "Undefined";
    case JV_NONE:
        return "NoneType";
    case JV_BOOL:
        return "bool";
    case JV_INT:
        return "int";
    case JV_FLOAT:
        return "float";
    case JV_STR:
        return "str";
    case JV_LIST:
        return v.u.list->kind ? v.u.list->kname : v.u.list->tuple ? "tuple" : "list";
    case JV_DICT:
        return "dict";
    case JV_NS:
        return "Namespace";
    case JV_FUNC:
        return v.u.fn->macro ? "Macro" : "builtin_function_or_method";
    case JV_LOOP:
        return "LoopContext";
    default:
        return "object";
    }
}

int jv_cmp(jctx *c, const jnode *at, jv a, jv b, int *out) {
    if (jv_is_num(a) && jv_is_num(b)) {
        if (a.type != JV_FLOAT && b.type != JV_FLOAT) {
            int64_t x = a.type == JV_INT ? a.u.i : a.u.b, y = b.type == JV_INT ? b.u.i : b.u.b;
            *out = x < y ? -1 : x > y;
        } else {
            double x = jv_num(a), y = jv_num(b);
            *out = x < y ? -1 : x > y;
        }
        return 0;
    }
    if (a.type == JV_STR && b.type == JV_STR) {
        /* UTF-8 byte order equals code point order */
        size_t n = a.u.str.n < b.u.str.n ? a.u.str.n : b.u.str.n;
        int r = memcmp(a.u.str.s, b.u.str.s, n);
        *out = r ? (r < 0 ? -1 : 1) : a.u.str.n < b.u.str.n ? -1 : a.u.str.n > b.u.str.n;
        return 0;
    }
    if (a.type == JV_LIST && b.type == JV_LIST && a.u.list->tuple == b.u.list->tuple) {
        size_t n = a.u.list->n < b.u.list->n ? a.u.list->n : b.u.list->n;
        for (size_t i = 0; i < n; i++) {
            if (jv_eq(a.u.list->items[i], b.u.list->items[i])) continue;
            return jv_cmp(c, at, a.u.list->items[i], b.u.list->items[i], out);
        }
        *out = a.u.list->n < b.u.list->n ? -1 : a.u.list->n > b.u.list->n;
        return 0;
    }
    return jerr(c, at, "'<' not supported between instances of '%s' and '%s'", jv_type_name(a),
                jv_type_name(b));
}

/* Python float repr: shortest string that round-trips, with Python's layout. */
void jfloat_repr(double f, char out[32]) {
    if (isnan(f)) {
        strcpy(out, "nan");
        return;
    }
    if (isinf(f)) {
        strcpy(out, f < 0 ? "-inf" : "inf");
        return;
    }
    char buf[40];
    int prec;
    for (prec = 1; prec <= 17; prec++) {
        snprintf(buf, sizeof buf, "%.*e", prec - 1, f);
        if (strtod(buf, NULL) == f) break;
    }
    /* buf = [-]d.ddde[+-]XX ; digits and exponent */
    char digits[24];
    int nd = 0, exp10;
    const char *p = buf;
    bool neg = false;
    if (*p == '-') neg = true, p++;
    for (; *p && *p != 'e'; p++)
        if (*p != '.') digits[nd++] = *p;
    exp10 = atoi(p + 1);
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    digits[nd] = 0;
    char *o = out;
    if (neg) *o++ = '-';
    if (exp10 >= 16 || exp10 < -4) {
        *o++ = digits[0];
        if (nd > 1) {
            *o++ = '.';
            memcpy(o, digits + 1, (size_t)nd - 1);
            o += nd - 1;
        }
        sprintf(o, "e%c%02d", exp10 < 0 ? '-' : '+', exp10 < 0 ? -exp10 : exp10);
        return;
    }
    if (exp10 < 0) {
        *o++ = '0';
        *o++ = '.';
        for (int i = 0; i < -exp10 - 1; i++) *o++ = '0';
        memcpy(o, digits, (size_t)nd);
        o += nd;
        *o = 0;
        return;
    }
    for (int i = 0; i <= exp10; i++) *o++ = i < nd ? digits[i] : '0';
    *o++ = '.';
    if (nd > exp10 + 1) {
        memcpy(o, digits + exp10 + 1, (size_t)(nd - exp10 - 1));
        o += nd - exp10 - 1;
    } else {
        *o++ = '0';
    }
    *o = 0;
}

static void repr_str(jbuf *b, const char *s, size_t n) {
    bool has_sq = memchr(s, '\'', n) != NULL, has_dq = memchr(s, '"', n) != NULL;
    char q = has_sq && !has_dq ? '"' : '\'';
    jbuf_putc(b, q);
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (ch == (unsigned char)q || ch == '\\') {
            jbuf_putc(b, '\\');
            jbuf_putc(b, (char)ch);
        } else if (ch == '\n') {
            jbuf_puts(b, "\\n");
        } else if (ch == '\r') {
            jbuf_puts(b, "\\r");
        } else if (ch == '\t') {
            jbuf_puts(b, "\\t");
        } else if (ch < 0x20 || ch == 0x7f) {
            jbuf_printf(b, "\\x%02x", ch);
        } else if (ch >= 0x80) {
            utf8proc_int32_t cp = 0;
            utf8proc_ssize_t k =
                utf8proc_iterate((const utf8proc_uint8_t *)s + i, (utf8proc_ssize_t)(n - i), &cp);
            if (k <= 0) {
                jbuf_printf(b, "\\x%02x", ch);
                continue;
            }
            utf8proc_category_t cat = utf8proc_category(cp);
            bool printable = !(cat == UTF8PROC_CATEGORY_CC || cat == UTF8PROC_CATEGORY_CF ||
                               cat == UTF8PROC_CATEGORY_CS || cat == UTF8PROC_CATEGORY_CO ||
                               cat == UTF8PROC_CATEGORY_CN || cat == UTF8PROC_CATEGORY_ZL ||
                               cat == UTF8PROC_CATEGORY_ZP || cat == UTF8PROC_CATEGORY_ZS);
            if (printable)
                jbuf_put(b, s + i, (size_t)k);
            else if (cp < 0x100)
                jbuf_printf(b, "\\x%02x", (unsigned)cp);
            else if (cp < 0x10000)
                jbuf_printf(b, "\\u%04x", (unsigned)cp);
            else
                jbuf_printf(b, "\\U%08x", (unsigned)cp);
            i += (size_t)k - 1;
        } else {
            jbuf_putc(b, (char)ch);
        }
    }
    jbuf_putc(b, q);
}

void jv_repr_into(jbuf *b, jv v) {
    switch (v.type) {
    case JV_STR:
        if (v.markup) jbuf_puts(b, "Markup(");
        repr_str(b, v.u.str.s, v.u.str.n);
        if (v.markup) jbuf_putc(b, ')');
        return;
    case JV_LIST: {
        jlist *l = v.u.list;
        if (l->kind == JL_VIEW) {
            jbuf_printf(b, "%s(", l->kname);
            jlist plain = *l;
            plain.kind = JL_LIST;
            jv pv = jv_list(&plain);
            jv_repr_into(b, pv);
            jbuf_putc(b, ')');
            return;
        }
        if (l->kind != JL_LIST) {
            jbuf_printf(b, "<%s object>", l->kname);
            return;
        }
        jbuf_putc(b, l->tuple ? '(' : '[');
        for (size_t i = 0; i < l->n; i++) {
            if (i) jbuf_puts(b, ", ");
            jv_repr_into(b, l->items[i]);
        }
        if (l->tuple && l->n == 1) jbuf_putc(b, ',');
        jbuf_putc(b, l->tuple ? ')' : ']');
        return;
    }
    case JV_DICT: {
        jdict *d = v.u.dict;
        jbuf_putc(b, '{');
        for (size_t i = 0; i < d->n; i++) {
            if (i) jbuf_puts(b, ", ");
            jv_repr_into(b, d->keys[i]);
            jbuf_puts(b, ": ");
            jv_repr_into(b, d->vals[i]);
        }
        jbuf_putc(b, '}');
        return;
    }
    case JV_UNDEF:
        jbuf_puts(b, "Undefined");
        return;
    default:
        jv_str_into(b, v);
    }
}

void jv_str_into(jbuf *b, jv v) {
    char tmp[40];
    switch (v.type) {
    case JV_UNDEF:
        return;
    case JV_NONE:
        jbuf_puts(b, "None");
        return;
    case JV_BOOL:
        jbuf_puts(b, v.u.b ? "True" : "False");
        return;
    case JV_INT:
        jbuf_printf(b, "%lld", (long long)v.u.i);
        return;
    case JV_FLOAT:
        jfloat_repr(v.u.f, tmp);
        jbuf_puts(b, tmp);
        return;
    case JV_STR:
        jbuf_put(b, v.u.str.s, v.u.str.n);
        return;
    case JV_LIST:
    case JV_DICT:
        jv_repr_into(b, v);
        return;
    case JV_NS: {
        jbuf_puts(b, "<Namespace ");
        jv d = {.type = JV_DICT};
        d.u.dict = v.u.dict;
        jv_repr_into(b, d);
        jbuf_putc(b, '>');
        return;
    }
    case JV_FUNC:
        jbuf_printf(b, "<function %s>", v.u.fn->name ? v.u.fn->name : "?");
        return;
    case JV_LOOP:
        jbuf_puts(b, "<LoopContext>");
        return;
    default:
        return;
    }
}

jv jv_to_str(jctx *c, jv v) {
    if (v.type == JV_STR) return v;
    jbuf b = {0};
    jv_str_into(&b, v);
    return jv_str_buf(c, &b);
}

int64_t jv_len(jv v, bool *ok) {
    *ok = true;
    switch (v.type) {
    case JV_STR:
        return (int64_t)ju_len(v.u.str.s, v.u.str.n);
    case JV_LIST:
        if (v.u.list->kind == JL_ITER) {
            *ok = false;
            return 0;
        }
        return (int64_t)v.u.list->n;
    case JV_DICT:
        return (int64_t)v.u.dict->n;
    case JV_UNDEF:
        return 0;
    default:
        *ok = false;
        return 0;
    }
}

int jv_iter(jctx *c, const jnode *at, jv v, jlist **out) {
    switch (v.type) {
    case JV_LIST:
        if (v.u.list->kind == JL_ITER) { /* a generator yields its items once */
            jlist *rest = jl_new(c, 0);
            if (!rest) return jv_oom(c, at);
            rest->items = v.u.list->items ? v.u.list->items + v.u.list->pos : NULL;
            rest->n = rest->cap = v.u.list->n - v.u.list->pos;
            v.u.list->pos = v.u.list->n;
            *out = rest;
            return 0;
        }
        *out = v.u.list;
        return 0;
    case JV_UNDEF:
        *out = jl_new(c, 0);
        return *out ? 0 : jv_oom(c, at);
    case JV_DICT: {
        jlist *l = jl_new(c, v.u.dict->n);
        if (!l) return jv_oom(c, at);
        for (size_t i = 0; i < v.u.dict->n; i++) l->items[l->n++] = v.u.dict->keys[i];
        *out = l;
        return 0;
    }
    case JV_STR: {
        size_t n = ju_len(v.u.str.s, v.u.str.n);
        jlist *l = jl_new(c, n);
        if (!l) return jv_oom(c, at);
        const char *s = v.u.str.s;
        for (size_t i = 0; i < v.u.str.n;) {
            size_t j = i + 1;
            while (j < v.u.str.n && ((unsigned char)s[j] & 0xC0) == 0x80) j++;
            jv ch = jv_str(c, s + i, j - i);
            if (ch.type != JV_STR || jl_push(c, l, ch)) return jv_oom(c, at);
            i = j;
        }
        *out = l;
        return 0;
    }
    default:
        return jerr(c, at, "'%s' object is not iterable", jv_type_name(v));
    }
}
