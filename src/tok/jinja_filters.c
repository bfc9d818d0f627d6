/*
 * jinja_filters.c — jinja2's builtin filters and tests that chat templates use, with
 * jinja2 3.1 semantics (plus transformers' `tojson` override). Names not listed here
 * fail at parse time, as an unknown filter fails jinja2's compile step.
 */
#include "tok/jinja_int.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

jv jstr_case(jctx *c, jv v, int mode);
int jstr_strip(jctx *c, const jnode *at, jv v, jv chars, int which, jv *out);
int jstr_replace(jctx *c, const jnode *at, jv s, jv old, jv new_, int64_t count, jv *out);
int jstr_splitlines(jctx *c, const jnode *at, jv self, bool keepends, jlist **out);
int jinja_dict_items(jctx *c, const jnode *at, jdict *d, jv *out);
int jinja_str_percent(jctx *c, const jnode *at, jv fmt, jv args, jv *out);

#define FILTER(name)                                                                               \
    static int name(jctx *c, const jnode *at, jv in, jv *args, size_t nargs, const char **kwn,     \
                    jv *kwv, size_t nkw, jv *out)
#define TEST(name)                                                                                 \
    static int name(jctx *c, const jnode *at, jv in, jv *args, size_t nargs, bool *out)

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

static int ret_str(jctx *c, const jnode *at, jv v, jv *out) {
    *out = v;
    return v.type == JV_STR ? 0 : jv_oom(c, at);
}

/* soft_str: str(value) */
static jv S(jctx *c, jv v) {
    return jv_to_str(c, v);
}

/* ---- string filters ---------------------------------------------------------------- */

FILTER(f_trim) {
    jv chars = jv_none();
    ARG(0, "chars", chars);
    jv s = S(c, in);
    if (s.type != JV_STR) return jv_oom(c, at);
    return jstr_strip(c, at, s, chars, 3, out);
}
FILTER(f_upper) {
    jv s = S(c, in);
    JTRY(s.type != JV_STR ? jv_oom(c, at) : ret_str(c, at, jstr_case(c, s, 1), out));
    out->markup = s.markup;
    return 0;
}
FILTER(f_lower) {
    jv s = S(c, in);
    JTRY(s.type != JV_STR ? jv_oom(c, at) : ret_str(c, at, jstr_case(c, s, 0), out));
    out->markup = s.markup;
    return 0;
}
FILTER(f_capitalize) {
    jv s = S(c, in);
    return s.type != JV_STR ? jv_oom(c, at) : ret_str(c, at, jstr_case(c, s, 2), out);
}
FILTER(f_title) {
    /* jinja2: split at runs of [-\s({[<], capitalize each piece */
    jv s = S(c, in);
    if (s.type != JV_STR) return jv_oom(c, at);
    jbuf b = {0};
    size_t i = 0, n = s.u.str.n;
    const char *p = s.u.str.s;
    while (i < n) {
        size_t j = i;
        bool sep = strchr("-({[< \t\n\r\v\f", p[i]) != NULL && p[i];
        while (j < n && ((strchr("-({[< \t\n\r\v\f", p[j]) != NULL && p[j]) == sep)) j++;
        jv piece = jv_str(c, p + i, j - i);
        if (piece.type != JV_STR) return jv_oom(c, at);
        if (!sep) piece = jstr_case(c, piece, 2);
        if (piece.type != JV_STR) return jv_oom(c, at);
        jbuf_put(&b, piece.u.str.s, piece.u.str.n);
        i = j;
    }
    if (!b.p && !b.oom) return ret_str(c, at, jv_str_lit(""), out);
    return ret_str(c, at, jv_str_buf(c, &b), out);
}
FILTER(f_replace) {
    jv old, new_, cnt = jv_none();
    if (!ARG(0, "old", old) || !ARG(1, "new", new_))
        return jerr(c, at, "replace filter needs old and new");
    ARG(2, "count", cnt);
    jv s = S(c, in), o = S(c, old), nw = S(c, new_);
    if (s.type != JV_STR || o.type != JV_STR || nw.type != JV_STR) return jv_oom(c, at);
    int64_t k = -1;
    if (cnt.type == JV_INT)
        k = cnt.u.i;
    else if (cnt.type != JV_NONE)
        return jerr(c, at, "replace count must be an integer");
    return jstr_replace(c, at, s, o, nw, k, out);
}
FILTER(f_string) {
    return ret_str(c, at, S(c, in), out);
}
FILTER(f_safe) {
    JTRY(ret_str(c, at, S(c, in), out));
    out->markup = 1;
    return 0;
}
FILTER(f_escape) {
    if (in.type == JV_STR && in.markup) {
        *out = in;
        return 0;
    }
    jv s = S(c, in);
    if (s.type != JV_STR) return jv_oom(c, at);
    jbuf b = {0};
    for (size_t i = 0; i < s.u.str.n; i++) {
        char ch = s.u.str.s[i];
        switch (ch) {
        case '&':
            jbuf_puts(&b, "&amp;");
            break;
        case '<':
            jbuf_puts(&b, "&lt;");
            break;
        case '>':
            jbuf_puts(&b, "&gt;");
            break;
        case '"':
            jbuf_puts(&b, "&#34;");
            break;
        case '\'':
            jbuf_puts(&b, "&#39;");
            break;
        default:
            jbuf_putc(&b, ch);
        }
    }
    JTRY(b.p || b.oom ? ret_str(c, at, jv_str_buf(c, &b), out)
                      : ret_str(c, at, jv_str_lit(""), out));
    out->markup = 1;
    return 0;
}

FILTER(f_indent) {
    jv width = jv_int(4), first = jv_bool(false), blank = jv_bool(false);
    ARG(0, "width", width);
    ARG(1, "first", first);
    ARG(2, "blank", blank);
    jbuf ind = {0};
    if (width.type == JV_STR)
        jbuf_put(&ind, width.u.str.s, width.u.str.n);
    else if (width.type == JV_INT)
        for (int64_t i = 0; i < width.u.i && i < 4096; i++) jbuf_putc(&ind, ' ');
    else
        return jerr(c, at, "indent width must be an int or str");
    const char *is = ind.p ? ind.p : "";
    size_t il = ind.n;
    jv s = S(c, in);
    if (s.type != JV_STR) return jbuf_free(&ind), jv_oom(c, at);
    /* s += "\n" then splitlines() */
    jbuf tmp = {0};
    jbuf_put(&tmp, s.u.str.s, s.u.str.n);
    jbuf_putc(&tmp, '\n');
    jv s2 = jv_str_buf(c, &tmp);
    jlist *lines;
    if (s2.type != JV_STR || jstr_splitlines(c, at, s2, false, &lines)) return jbuf_free(&ind), -1;
    jbuf b = {0};
    if (jv_truthy(first)) jbuf_put(&b, is, il);
    for (size_t i = 0; i < lines->n; i++) {
        jv ln = lines->items[i];
        if (i) {
            jbuf_putc(&b, '\n');
            if (jv_truthy(blank) || ln.u.str.n) jbuf_put(&b, is, il);
        }
        jbuf_put(&b, ln.u.str.s, ln.u.str.n);
    }
    jbuf_free(&ind);
    if (!b.p && !b.oom) return ret_str(c, at, jv_str_lit(""), out);
    return ret_str(c, at, jv_str_buf(c, &b), out);
}

FILTER(f_center) {
    jv width = jv_int(80);
    ARG(0, "width", width);
    jv s = S(c, in);
    if (s.type != JV_STR) return jv_oom(c, at);
    int64_t len = (int64_t)ju_len(s.u.str.s, s.u.str.n), w = width.type == JV_INT ? width.u.i : 80;
    if (w <= len || w > 1 << 20) return ret_str(c, at, s, out);
    int64_t marg = w - len, left = marg / 2 + (marg & w & 1);
    jbuf b = {0};
    for (int64_t i = 0; i < left; i++) jbuf_putc(&b, ' ');
    jbuf_put(&b, s.u.str.s, s.u.str.n);
    for (int64_t i = 0; i < marg - left; i++) jbuf_putc(&b, ' ');
    return ret_str(c, at, jv_str_buf(c, &b), out);
}

FILTER(f_wordcount) {
    jv s = S(c, in);
    if (s.type != JV_STR) return jv_oom(c, at);
    int64_t k = 0;
    bool inw = false;
    for (size_t i = 0; i < s.u.str.n; i++) {
        unsigned char ch = (unsigned char)s.u.str.s[i];
        bool w = ch == '_' || ch >= 0x80 || (ch >= '0' && ch <= '9') ||
                 ((ch | 32) >= 'a' && (ch | 32) <= 'z');
        if (w && !inw) k++;
        inw = w;
    }
    *out = jv_int(k);
    return 0;
}

FILTER(f_format) {
    jv s = S(c, in);
    if (s.type != JV_STR) return jv_oom(c, at);
    if (nkw) return jerr(c, at, "kiln does not support keyword arguments to the format filter");
    jlist *t = jl_new(c, nargs);
    if (!t) return jv_oom(c, at);
    for (size_t i = 0; i < nargs; i++) t->items[t->n++] = args[i];
    t->tuple = true;
    return jinja_str_percent(c, at, s, jv_list(t), out);
}

/* ---- tojson (transformers' override: json.dumps(ensure_ascii=False, ...)) ---------- */

FILTER(f_tojson) {
    jv ensure_ascii = jv_bool(false), indent = jv_none(), seps = jv_none(), sort = jv_bool(false);
    ARG(0, "ensure_ascii", ensure_ascii);
    ARG(1, "indent", indent);
    ARG(2, "separators", seps);
    ARG(3, "sort_keys", sort);
    for (size_t i = 0; i < nkw; i++)
        if (strcmp(kwn[i], "ensure_ascii") && strcmp(kwn[i], "indent") &&
            strcmp(kwn[i], "separators") && strcmp(kwn[i], "sort_keys"))
            return jerr(c, at, "tojson() got an unexpected keyword argument '%s'", kwn[i]);
    int ind = -1;
    if (indent.type == JV_INT)
        ind = indent.u.i < 0 ? 0 : indent.u.i > 64 ? 64 : (int)indent.u.i;
    else if (indent.type != JV_NONE)
        return jerr(c, at, "kiln supports only integer tojson indent");
    const char *item_sep = ind >= 0 ? "," : ", ", *key_sep = ": ";
    if (seps.type == JV_LIST) {
        if (seps.u.list->n != 2 || seps.u.list->items[0].type != JV_STR ||
            seps.u.list->items[1].type != JV_STR)
            return jerr(c, at, "tojson separators must be a pair of strings");
        item_sep = seps.u.list->items[0].u.str.s;
        key_sep = seps.u.list->items[1].u.str.s;
    } else if (seps.type != JV_NONE) {
        return jerr(c, at, "tojson separators must be a pair of strings");
    }
    jbuf b = {0};
    if (jv_tojson(c, at, &b, in, ind, item_sep, key_sep, jv_truthy(sort), jv_truthy(ensure_ascii),
                  0)) {
        jbuf_free(&b);
        return -1;
    }
    return ret_str(c, at, jv_str_buf(c, &b), out);
}

/* ---- sequence filters -------------------------------------------------------------- */

FILTER(f_length) {
    bool ok;
    int64_t n = jv_len(in, &ok);
    if (!ok) return jerr(c, at, "object of type '%s' has no len()", jv_type_name(in));
    *out = jv_int(n);
    return 0;
}

FILTER(f_list) {
    jlist *l;
    JTRY(jv_iter(c, at, in, &l));
    jlist *cp = jl_new(c, l->n);
    if (!cp) return jv_oom(c, at);
    for (size_t i = 0; i < l->n; i++) cp->items[cp->n++] = l->items[i];
    *out = jv_list(cp);
    return 0;
}

FILTER(f_first) {
    if (in.type == JV_LIST && in.u.list->kind == JL_ITER) {
        jlist *g = in.u.list;
        *out = g->pos < g->n ? g->items[g->pos++] : jv_undef("No first item, sequence was empty.");
        return 0;
    }
    jlist *l;
    JTRY(jv_iter(c, at, in, &l));
    *out = l->n ? l->items[0] : jv_undef("No first item, sequence was empty.");
    return 0;
}

FILTER(f_last) {
    if (in.type == JV_UNDEF)
        return jerr(c, at, "'%s' is undefined", in.u.undef_name ? in.u.undef_name : "value");
    jlist *l;
    JTRY(jv_iter(c, at, in, &l));
    *out = l->n ? l->items[l->n - 1] : jv_undef("No last item, sequence was empty.");
    return 0;
}

FILTER(f_reverse) {
    if (in.type == JV_STR) {
        jlist *l;
        JTRY(jv_iter(c, at, in, &l));
        jbuf b = {0};
        for (size_t i = l->n; i-- > 0;) jbuf_put(&b, l->items[i].u.str.s, l->items[i].u.str.n);
        if (!b.p && !b.oom) return ret_str(c, at, jv_str_lit(""), out);
        return ret_str(c, at, jv_str_buf(c, &b), out);
    }
    jlist *l;
    JTRY(jv_iter(c, at, in, &l));
    jlist *r = jl_new(c, l->n);
    if (!r) return jv_oom(c, at);
    for (size_t i = l->n; i-- > 0;) r->items[r->n++] = l->items[i];
    *out = jv_lazy(r, JL_ITER,
                   in.type == JV_DICT ? "dict_reversekeyiterator" : "list_reverseiterator");
    return 0;
}

FILTER(f_join) {
    jv sep = jv_str_lit(""), attr = jv_none();
    ARG(0, "d", sep);
    ARG(1, "attribute", attr);
    jlist *l;
    JTRY(jv_iter(c, at, in, &l));
    jv sp = S(c, sep);
    if (sp.type != JV_STR) return jv_oom(c, at);
    jbuf b = {0};
    for (size_t i = 0; i < l->n; i++) {
        jv v = l->items[i];
        if (attr.type == JV_STR && jinja_getattr(c, at, v, attr.u.str.s, &v)) {
            jbuf_free(&b);
            return -1;
        }
        if (i) jbuf_put(&b, sp.u.str.s, sp.u.str.n);
        jv_str_into(&b, v);
    }
    if (!b.p && !b.oom) return ret_str(c, at, jv_str_lit(""), out);
    return ret_str(c, at, jv_str_buf(c, &b), out);
}

FILTER(f_default) {
    jv def = jv_str_lit(""), boolean = jv_bool(false);
    ARG(0, "default_value", def);
    ARG(1, "boolean", boolean);
    if (in.type == JV_UNDEF || (jv_truthy(boolean) && !jv_truthy(in)))
        *out = def;
    else
        *out = in;
    return 0;
}

FILTER(f_items) {
    if (in.type == JV_UNDEF) {
        jlist *l = jl_new(c, 0);
        if (!l) return jv_oom(c, at);
        *out = jv_list(l);
        return 0;
    }
    if (in.type != JV_DICT)
        return jerr(c, at, "items filter: can only get item pairs from a mapping");
    JTRY(jinja_dict_items(c, at, in.u.dict, out));
    *out = jv_lazy(out->u.list, JL_ITER, "generator");
    return 0;
}

/* Sort key: case-folded string when !case_sensitive. */
static jv sort_key(jctx *c, jv v, bool cs) {
    if (!cs && v.type == JV_STR) return jstr_case(c, v, 0);
    return v;
}

typedef struct sort_item {
    jv key, val;
    size_t idx;
} sort_item;

/* stable merge sort with error reporting through ctx */
static int merge_sort(jctx *c, const jnode *at, sort_item *a, sort_item *tmp, size_t n, bool rev) {
    if (n < 2) return 0;
    size_t h = n / 2;
    JTRY(merge_sort(c, at, a, tmp, h, rev));
    JTRY(merge_sort(c, at, a + h, tmp, n - h, rev));
    size_t i = 0, j = h, k = 0;
    while (i < h && j < n) {
        int r;
        JTRY(jv_cmp(c, at, a[j].key, a[i].key, &r));
        /* take from the right only when strictly smaller (stable), reversed for rev */
        bool right = rev ? r > 0 : r < 0;
        tmp[k++] = right ? a[j++] : a[i++];
    }
    while (i < h) tmp[k++] = a[i++];
    while (j < n) tmp[k++] = a[j++];
    memcpy(a, tmp, n * sizeof *a);
    return 0;
}

static int sorted(jctx *c, const jnode *at, jlist *l, bool cs, const char *attr, bool rev,
                  int by_value, sort_item **out) {
    sort_item *items = jalloc(c, (l->n + 1) * sizeof *items),
              *tmp = jalloc(c, (l->n + 1) * sizeof *tmp);
    if (!items || !tmp) return jv_oom(c, at);
    for (size_t i = 0; i < l->n; i++) {
        jv k = l->items[i];
        if (by_value >= 0) k = k.u.list->items[by_value];
        if (attr) JTRY(jinja_getattr(c, at, k, attr, &k));
        items[i].key = sort_key(c, k, cs);
        items[i].val = l->items[i];
        items[i].idx = i;
    }
    JTRY(merge_sort(c, at, items, tmp, l->n, rev));
    *out = items;
    return 0;
}

FILTER(f_sort) {
    jv rev = jv_bool(false), cs = jv_bool(false), attr = jv_none();
    ARG(0, "reverse", rev);
    ARG(1, "case_sensitive", cs);
    ARG(2, "attribute", attr);
    jlist *l;
    sort_item *it;
    JTRY(jv_iter(c, at, in, &l));
    JTRY(sorted(c, at, l, jv_truthy(cs), attr.type == JV_STR ? attr.u.str.s : NULL, jv_truthy(rev),
                -1, &it));
    jlist *r = jl_new(c, l->n);
    if (!r) return jv_oom(c, at);
    for (size_t i = 0; i < l->n; i++) r->items[r->n++] = it[i].val;
    *out = jv_list(r);
    return 0;
}

FILTER(f_dictsort) {
    jv cs = jv_bool(false), by = jv_str_lit("key"), rev = jv_bool(false);
    ARG(0, "case_sensitive", cs);
    ARG(1, "by", by);
    ARG(2, "reverse", rev);
    if (in.type != JV_DICT)
        return jerr(c, at, "dictsort: expected a mapping, got '%s'", jv_type_name(in));
    int pos = by.type == JV_STR && !strcmp(by.u.str.s, "value") ? 1 : 0;
    jv items;
    JTRY(jinja_dict_items(c, at, in.u.dict, &items));
    sort_item *it;
    JTRY(sorted(c, at, items.u.list, jv_truthy(cs), NULL, jv_truthy(rev), pos, &it));
    jlist *r = jl_new(c, items.u.list->n);
    if (!r) return jv_oom(c, at);
    for (size_t i = 0; i < items.u.list->n; i++) r->items[r->n++] = it[i].val;
    *out = jv_list(r);
    return 0;
}

FILTER(f_unique) {
    jv cs = jv_bool(false), attr = jv_none();
    ARG(0, "case_sensitive", cs);
    ARG(1, "attribute", attr);
    jlist *l;
    JTRY(jv_iter(c, at, in, &l));
    jlist *r = jl_new(c, 0), *seen = jl_new(c, 0);
    if (!r || !seen) return jv_oom(c, at);
    for (size_t i = 0; i < l->n; i++) {
        jv k = l->items[i];
        if (attr.type == JV_STR) JTRY(jinja_getattr(c, at, k, attr.u.str.s, &k));
        k = sort_key(c, k, jv_truthy(cs));
        bool dup = false;
        for (size_t j = 0; j < seen->n && !dup; j++) dup = jv_eq(seen->items[j], k);
        if (!dup && (jl_push(c, seen, k) || jl_push(c, r, l->items[i]))) return jv_oom(c, at);
    }
    *out = jv_lazy(r, JL_ITER, "generator");
    return 0;
}

static int minmax(jctx *c, const jnode *at, jv in, jv *args, size_t nargs, const char **kwn,
                  jv *kwv, size_t nkw, jv *out, bool want_max) {
    jv cs = jv_bool(false), attr = jv_none();
    ARG(0, "case_sensitive", cs);
    ARG(1, "attribute", attr);
    jlist *l;
    JTRY(jv_iter(c, at, in, &l));
    if (!l->n) {
        *out = jv_undef(want_max ? "No largest item, sequence was empty."
                                 : "No smallest item, sequence was empty.");
        return 0;
    }
    size_t best = 0;
    jv bk = jv_none();
    for (size_t i = 0; i < l->n; i++) {
        jv k = l->items[i];
        if (attr.type == JV_STR) JTRY(jinja_getattr(c, at, k, attr.u.str.s, &k));
        k = sort_key(c, k, jv_truthy(cs));
        if (i == 0) {
            bk = k;
            continue;
        }
        int r;
        JTRY(jv_cmp(c, at, k, bk, &r));
        if (want_max ? r > 0 : r < 0) best = i, bk = k;
    }
    *out = l->items[best];
    return 0;
}
FILTER(f_min) {
    return minmax(c, at, in, args, nargs, kwn, kwv, nkw, out, false);
}
FILTER(f_max) {
    return minmax(c, at, in, args, nargs, kwn, kwv, nkw, out, true);
}

FILTER(f_sum) {
    jv attr = jv_none(), start = jv_int(0);
    ARG(0, "attribute", attr);
    ARG(1, "start", start);
    jlist *l;
    JTRY(jv_iter(c, at, in, &l));
    jv acc = start;
    for (size_t i = 0; i < l->n; i++) {
        jv v = l->items[i];
        if (attr.type == JV_STR) JTRY(jinja_getattr(c, at, v, attr.u.str.s, &v));
        if (!jv_is_num(acc) || !jv_is_num(v))
            return jerr(c, at, "unsupported operand type(s) for +: '%s' and '%s'",
                        jv_type_name(acc), jv_type_name(v));
        if (acc.type != JV_FLOAT && v.type != JV_FLOAT) {
            int64_t r, x = acc.type == JV_INT ? acc.u.i : acc.u.b,
                       y = v.type == JV_INT ? v.u.i : v.u.b;
            if (__builtin_add_overflow(x, y, &r)) return jerr(c, at, "integer overflow in sum");
            acc = jv_int(r);
        } else {
            acc = jv_float(jv_num(acc) + jv_num(v));
        }
    }
    *out = acc;
    return 0;
}

/* map / select / reject / selectattr / rejectattr */
static int run_test(jctx *c, const jnode *at, const char *name, jv v, jv *targs, size_t tn,
                    bool *r) {
    jtest_fn t = jinja_find_test(name);
    if (!t) return jerr(c, at, "no test named '%s'", name);
    return t(c, at, v, targs, tn, r);
}

FILTER(f_map) {
    jlist *l;
    if (!jv_truthy(in)) in = jv_undef(NULL); /* jinja2: `if value: for item in value` */
    JTRY(jv_iter(c, at, in, &l));
    jlist *r = jl_new(c, l->n);
    if (!r) return jv_oom(c, at);
    jv attr, def;
    bool has_attr = false, has_def = false;
    for (size_t i = 0; i < nkw; i++) {
        if (!strcmp(kwn[i], "attribute"))
            attr = kwv[i], has_attr = true;
        else if (!strcmp(kwn[i], "default"))
            def = kwv[i], has_def = true;
        else if (!nargs)
            return jerr(c, at, "map: unexpected keyword argument '%s'", kwn[i]);
    }
    if (has_attr) {
        if (attr.type != JV_STR) return jerr(c, at, "map attribute must be a string");
        for (size_t i = 0; i < l->n; i++) {
            jv v;
            JTRY(jinja_getattr(c, at, l->items[i], attr.u.str.s, &v));
            if (v.type == JV_UNDEF && has_def) v = def;
            r->items[r->n++] = v;
        }
        *out = jv_lazy(r, JL_ITER, "generator");
        return 0;
    }
    if (!nargs || args[0].type != JV_STR)
        return jerr(c, at, "map: expected a filter name or attribute=");
    jfilter_fn f = jinja_find_filter(args[0].u.str.s);
    if (!f) return jerr(c, at, "no filter named '%s'", args[0].u.str.s);
    for (size_t i = 0; i < l->n; i++) {
        JTRY(f(c, at, l->items[i], args + 1, nargs - 1, kwn, kwv, nkw, &r->items[i]));
        r->n = i + 1;
    }
    *out = jv_lazy(r, JL_ITER, "generator");
    return 0;
}

static int select_common(jctx *c, const jnode *at, jv in, jv *args, size_t nargs, jv *out,
                         bool attr_mode, bool want) {
    jlist *l;
    if (!jv_truthy(in)) in = jv_undef(NULL); /* jinja2: `if value: for item in value` */
    JTRY(jv_iter(c, at, in, &l));
    size_t off = 0;
    const char *attr = NULL;
    if (attr_mode) {
        if (!nargs || args[0].type != JV_STR)
            return jerr(c, at, "selectattr/rejectattr need an attribute name");
        attr = args[0].u.str.s;
        off = 1;
    }
    const char *test = NULL;
    if (nargs > off) {
        if (args[off].type != JV_STR) return jerr(c, at, "test name must be a string");
        test = args[off].u.str.s;
    }
    jlist *r = jl_new(c, 0);
    if (!r) return jv_oom(c, at);
    for (size_t i = 0; i < l->n; i++) {
        jv v = l->items[i];
        if (attr) JTRY(jinja_getattr(c, at, v, attr, &v));
        bool ok;
        if (test)
            JTRY(run_test(c, at, test, v, args + off + 1, nargs - off - 1, &ok));
        else
            ok = jv_truthy(v);
        if (ok == want && jl_push(c, r, l->items[i])) return jv_oom(c, at);
    }
    *out = jv_lazy(r, JL_ITER, "generator");
    return 0;
}
FILTER(f_select) {
    return select_common(c, at, in, args, nargs, out, false, true);
}
FILTER(f_reject) {
    return select_common(c, at, in, args, nargs, out, false, false);
}
FILTER(f_selectattr) {
    return select_common(c, at, in, args, nargs, out, true, true);
}
FILTER(f_rejectattr) {
    return select_common(c, at, in, args, nargs, out, true, false);
}

FILTER(f_attr) {
    if (!nargs || args[0].type != JV_STR) return jerr(c, at, "attr filter needs a name");
    return jinja_getattr(c, at, in, args[0].u.str.s, out);
}

FILTER(f_truncate) {
    jv length = jv_int(255), killwords = jv_bool(false), end = jv_str_lit("..."),
       leeway = jv_int(5);
    ARG(0, "length", length);
    ARG(1, "killwords", killwords);
    ARG(2, "end", end);
    ARG(3, "leeway", leeway);
    if (length.type != JV_INT || leeway.type != JV_INT || end.type != JV_STR)
        return jerr(c, at, "truncate: length and leeway must be integers, end a string");
    jv s = S(c, in);
    if (s.type != JV_STR) return jv_oom(c, at);
    int64_t n = (int64_t)ju_len(s.u.str.s, s.u.str.n),
            el = (int64_t)ju_len(end.u.str.s, end.u.str.n);
    if (length.u.i < el)
        return jerr(c, at, "expected length >= %lld, got %lld", (long long)el,
                    (long long)length.u.i);
    if (leeway.u.i < 0) return jerr(c, at, "expected leeway >= 0, got %lld", (long long)leeway.u.i);
    if (n <= length.u.i + leeway.u.i) {
        *out = s;
        return 0;
    }
    size_t cut = ju_offset(s.u.str.s, s.u.str.n, (size_t)(length.u.i - el));
    if (!jv_truthy(killwords)) { /* s[:length - len(end)].rsplit(" ", 1)[0] */
        size_t k = cut;
        while (k > 0 && s.u.str.s[k - 1] != ' ') k--;
        if (k > 0) cut = k - 1;
    }
    jbuf b = {0};
    jbuf_put(&b, s.u.str.s, cut);
    jbuf_put(&b, end.u.str.s, end.u.str.n);
    return ret_str(c, at, jv_str_buf(c, &b), out);
}

/* batch / slice: lists of lists, as generators */
FILTER(f_batch) {
    jv count, fill = jv_none();
    bool has_fill = ARG(1, "fill_with", fill) && fill.type != JV_NONE;
    if (!ARG(0, "linecount", count) || count.type != JV_INT || count.u.i <= 0)
        return jerr(c, at, "batch: linecount must be a positive integer");
    jlist *l;
    JTRY(jv_iter(c, at, in, &l));
    jlist *r = jl_new(c, 0), *cur = NULL;
    if (!r) return jv_oom(c, at);
    for (size_t i = 0; i < l->n; i++) {
        if (!cur || (int64_t)cur->n == count.u.i) {
            if (!(cur = jl_new(c, 0)) || jl_push(c, r, jv_list(cur))) return jv_oom(c, at);
        }
        if (jl_push(c, cur, l->items[i])) return jv_oom(c, at);
    }
    while (has_fill && cur && (int64_t)cur->n < count.u.i)
        if (jl_push(c, cur, fill)) return jv_oom(c, at);
    *out = jv_lazy(r, JL_ITER, "generator");
    return 0;
}

FILTER(f_slice) {
    jv slices, fill = jv_none();
    bool has_fill = ARG(1, "fill_with", fill) && fill.type != JV_NONE;
    if (!ARG(0, "slices", slices) || slices.type != JV_INT || slices.u.i <= 0 ||
        slices.u.i > 1 << 20)
        return jerr(c, at, "slice: slices must be a positive integer");
    jlist *l;
    JTRY(jv_iter(c, at, in, &l));
    int64_t n = (int64_t)l->n, per = n / slices.u.i, extra = n % slices.u.i, offset = 0;
    jlist *r = jl_new(c, 0);
    if (!r) return jv_oom(c, at);
    for (int64_t i = 0; i < slices.u.i; i++) {
        int64_t start = offset + i * per;
        if (i < extra) offset++;
        int64_t end = offset + (i + 1) * per;
        jlist *t = jl_new(c, 0);
        if (!t || jl_push(c, r, jv_list(t))) return jv_oom(c, at);
        for (int64_t k = start; k < end; k++)
            if (jl_push(c, t, l->items[k])) return jv_oom(c, at);
        if (has_fill && i >= extra && jl_push(c, t, fill)) return jv_oom(c, at);
    }
    *out = jv_lazy(r, JL_ITER, "generator");
    return 0;
}

/* ---- numbers ----------------------------------------------------------------------- */

static bool parse_int_str(const char *s, size_t n, int64_t base, int64_t *out) {
    /* Python int(str, base): optional sign, whitespace, underscores between digits */
    size_t i = 0;
    while (i < n && (s[i] == ' ' || (s[i] >= '\t' && s[i] <= '\r'))) i++;
    while (n > i && (s[n - 1] == ' ' || (s[n - 1] >= '\t' && s[n - 1] <= '\r'))) n--;
    bool neg = false;
    if (i < n && (s[i] == '+' || s[i] == '-')) neg = s[i++] == '-';
    if (i >= n) return false;
    /* base prefixes: 0x/0o/0b are allowed when they match the base; base 0 picks one */
    if (i + 1 < n && s[i] == '0') {
        char p = (char)(s[i + 1] | 32);
        int64_t pb = p == 'x' ? 16 : p == 'o' ? 8 : p == 'b' ? 2 : 0;
        if (pb && (base == pb || base == 0)) {
            base = pb;
            i += 2;
            if (i < n && s[i] == '_') i++;
        }
    }
    if (base == 0) {
        if (n - i > 1 && s[i] == '0') return false; /* Python: no leading zeros in base 0 */
        base = 10;
    }
    if (base < 2 || base > 36 || i >= n) return false;
    int64_t v = 0;
    bool any = false;
    for (; i < n; i++) {
        if (s[i] == '_' && any && i + 1 < n && s[i + 1] != '_') continue;
        int d = s[i] >= '0' && s[i] <= '9'                 ? s[i] - '0'
                : (s[i] | 32) >= 'a' && (s[i] | 32) <= 'z' ? (s[i] | 32) - 'a' + 10
                                                           : 99;
        if (d >= base) return false;
        if (__builtin_mul_overflow(v, base, &v) || __builtin_add_overflow(v, d, &v)) return false;
        any = true;
    }
    *out = neg ? -v : v;
    return any;
}

static bool parse_float_str(const char *s, double *out) {
    char *end;
    while (*s == ' ' || (*s >= '\t' && *s <= '\r')) s++;
    if (!*s) return false;
    /* Python float(): decimal only (strtod would also take hex) */
    for (const char *p = s; *p; p++)
        if (*p == 'x' || *p == 'X' || *p == 'p' || *p == 'P') return false;
    double v = strtod(s, &end);
    while (*end == ' ' || (*end >= '\t' && *end <= '\r')) end++;
    if (*end) return false;
    *out = v;
    return true;
}

FILTER(f_int) {
    jv def = jv_int(0), base = jv_int(10);
    ARG(0, "default", def);
    ARG(1, "base", base);
    int64_t v;
    double f;
    switch (in.type) {
    case JV_INT:
        *out = in;
        return 0;
    case JV_BOOL:
        *out = jv_int(in.u.b);
        return 0;
    case JV_FLOAT:
        if (isfinite(in.u.f) && fabs(in.u.f) < 9.2e18) {
            *out = jv_int((int64_t)in.u.f);
            return 0;
        }
        break;
    case JV_STR:
        if (parse_int_str(in.u.str.s, in.u.str.n, base.type == JV_INT ? base.u.i : 10, &v)) {
            *out = jv_int(v);
            return 0;
        }
        if (parse_float_str(in.u.str.s, &f) && isfinite(f) && fabs(f) < 9.2e18) {
            *out = jv_int((int64_t)f);
            return 0;
        }
        break;
    default:
        break;
    }
    *out = def;
    return 0;
}

FILTER(f_float) {
    jv def = jv_float(0.0);
    ARG(0, "default", def);
    double f;
    if (jv_is_num(in))
        *out = jv_float(jv_num(in));
    else if (in.type == JV_STR && parse_float_str(in.u.str.s, &f))
        *out = jv_float(f);
    else
        *out = def;
    return 0;
}

FILTER(f_abs) {
    if (in.type == JV_INT) {
        if (in.u.i == INT64_MIN) return jerr(c, at, "integer overflow in abs");
        *out = jv_int(in.u.i < 0 ? -in.u.i : in.u.i);
    } else if (in.type == JV_BOOL) {
        *out = jv_int(in.u.b);
    } else if (in.type == JV_FLOAT) {
        *out = jv_float(fabs(in.u.f));
    } else {
        return jerr(c, at, "bad operand type for abs(): '%s'", jv_type_name(in));
    }
    return 0;
}

FILTER(f_round) {
    jv prec = jv_int(0), method = jv_str_lit("common");
    ARG(0, "precision", prec);
    ARG(1, "method", method);
    if (!jv_is_num(in)) return jerr(c, at, "round: expected a number, got '%s'", jv_type_name(in));
    double x = jv_num(in), p = pow(10.0, (double)(prec.type == JV_INT ? prec.u.i : 0));
    const char *m = method.type == JV_STR ? method.u.str.s : "common";
    double r;
    if (!strcmp(m, "common")) {
        /* Python round(): round half to even on the decimal value */
        char buf[64];
        snprintf(buf, sizeof buf, "%.*f", (int)(prec.type == JV_INT && prec.u.i > 0 ? prec.u.i : 0),
                 x);
        r = prec.type == JV_INT && prec.u.i < 0 ? nearbyint(x * p) / p : strtod(buf, NULL);
    } else if (!strcmp(m, "floor")) {
        r = floor(x * p) / p;
    } else if (!strcmp(m, "ceil")) {
        r = ceil(x * p) / p;
    } else {
        return jerr(c, at, "method must be common, ceil or floor");
    }
    *out = jv_float(r);
    return 0;
}

/* ---- tests ------------------------------------------------------------------------- */

TEST(t_defined) {
    *out = in.type != JV_UNDEF;
    return 0;
}
TEST(t_undefined) {
    *out = in.type == JV_UNDEF;
    return 0;
}
TEST(t_none) {
    *out = in.type == JV_NONE;
    return 0;
}
TEST(t_boolean) {
    *out = in.type == JV_BOOL;
    return 0;
}
TEST(t_false) {
    *out = in.type == JV_BOOL && !in.u.b;
    return 0;
}
TEST(t_true) {
    *out = in.type == JV_BOOL && in.u.b;
    return 0;
}
TEST(t_integer) {
    *out = in.type == JV_INT;
    return 0;
}
TEST(t_float) {
    *out = in.type == JV_FLOAT;
    return 0;
}
TEST(t_number) {
    *out = jv_is_num(in);
    return 0;
}
TEST(t_string) {
    *out = in.type == JV_STR;
    return 0;
}
TEST(t_mapping) {
    *out = in.type == JV_DICT;
    return 0;
}
TEST(t_iterable) {
    *out = in.type == JV_STR || in.type == JV_LIST || in.type == JV_DICT || in.type == JV_UNDEF;
    return 0;
}
TEST(t_sequence) {
    *out = in.type == JV_STR || in.type == JV_LIST || in.type == JV_DICT || in.type == JV_UNDEF;
    return 0;
}
TEST(t_callable) {
    *out = in.type == JV_FUNC;
    return 0;
}
TEST(t_escaped) {
    *out = false;
    return 0;
}
TEST(t_lower) {
    if (in.type != JV_STR) {
        *out = false;
        return 0;
    }
    jv l = jstr_case(c, in, 0);
    *out = l.type == JV_STR && jv_eq(l, in);
    return 0;
}
TEST(t_upper) {
    if (in.type != JV_STR) {
        *out = false;
        return 0;
    }
    jv l = jstr_case(c, in, 1);
    *out = l.type == JV_STR && jv_eq(l, in);
    return 0;
}

static int need1(jctx *c, const jnode *at, size_t nargs, const char *name) {
    if (nargs != 1) return jerr(c, at, "test '%s' takes exactly one argument", name);
    return 0;
}
TEST(t_eq) {
    JTRY(need1(c, at, nargs, "eq"));
    *out = jv_eq(in, args[0]);
    return 0;
}
TEST(t_ne) {
    JTRY(need1(c, at, nargs, "ne"));
    *out = !jv_eq(in, args[0]);
    return 0;
}
static int cmp_test(jctx *c, const jnode *at, jv in, jv *args, size_t nargs, bool *out, int op) {
    int r;
    JTRY(need1(c, at, nargs, "comparison"));
    JTRY(jv_cmp(c, at, in, args[0], &r));
    *out = op == 0 ? r < 0 : op == 1 ? r <= 0 : op == 2 ? r > 0 : r >= 0;
    return 0;
}
TEST(t_lt) {
    return cmp_test(c, at, in, args, nargs, out, 0);
}
TEST(t_le) {
    return cmp_test(c, at, in, args, nargs, out, 1);
}
TEST(t_gt) {
    return cmp_test(c, at, in, args, nargs, out, 2);
}
TEST(t_ge) {
    return cmp_test(c, at, in, args, nargs, out, 3);
}
TEST(t_in) {
    JTRY(need1(c, at, nargs, "in"));
    jv hay = args[0];
    if (hay.type == JV_STR) {
        if (in.type != JV_STR)
            return jerr(c, at, "'in <string>' requires string as left operand, not %s",
                        jv_type_name(in));
        *out = in.u.str.n == 0 || memmem(hay.u.str.s, hay.u.str.n, in.u.str.s, in.u.str.n);
    } else if (hay.type == JV_LIST) {
        *out = false;
        for (size_t i = 0; i < hay.u.list->n; i++) *out |= jv_eq(hay.u.list->items[i], in);
    } else if (hay.type == JV_DICT) {
        *out = jd_get(hay.u.dict, in, NULL);
    } else if (hay.type == JV_UNDEF) {
        *out = false;
    } else {
        return jerr(c, at, "argument of type '%s' is not iterable", jv_type_name(hay));
    }
    return 0;
}
TEST(t_sameas) {
    JTRY(need1(c, at, nargs, "sameas"));
    jv o = args[0];
    *out = in.type == o.type &&
           (in.type == JV_NONE || in.type == JV_UNDEF || (in.type == JV_BOOL && in.u.b == o.u.b) ||
            (in.type == JV_LIST && in.u.list == o.u.list) ||
            ((in.type == JV_DICT || in.type == JV_NS) && in.u.dict == o.u.dict) ||
            (in.type == JV_FUNC && in.u.fn == o.u.fn) ||
            (in.type == JV_INT && in.u.i == o.u.i && in.u.i >= -5 && in.u.i <= 256));
    return 0;
}
static int int_of(jctx *c, const jnode *at, jv v, int64_t *out) {
    if (v.type == JV_INT)
        *out = v.u.i;
    else if (v.type == JV_BOOL)
        *out = v.u.b;
    else
        return jerr(c, at, "expected an integer, got '%s'", jv_type_name(v));
    return 0;
}
TEST(t_odd) {
    int64_t v = 0;
    JTRY(int_of(c, at, in, &v));
    *out = (v % 2) != 0;
    return 0;
}
TEST(t_even) {
    int64_t v = 0;
    JTRY(int_of(c, at, in, &v));
    *out = (v % 2) == 0;
    return 0;
}
TEST(t_divisibleby) {
    int64_t v = 0, d = 1;
    JTRY(need1(c, at, nargs, "divisibleby"));
    JTRY(int_of(c, at, in, &v));
    JTRY(int_of(c, at, args[0], &d));
    if (d == 0) return jerr(c, at, "integer division or modulo by zero");
    *out = (d == -1) || v % d == 0;
    return 0;
}
TEST(t_filter) {
    JTRY(need1(c, at, nargs, "filter"));
    *out = in.type == JV_STR && jinja_find_filter(in.u.str.s) != NULL;
    return 0;
}
TEST(t_test) {
    JTRY(need1(c, at, nargs, "test"));
    *out = in.type == JV_STR && jinja_find_test(in.u.str.s) != NULL;
    return 0;
}

/* ---- tables ------------------------------------------------------------------------ */

static const struct {
    const char *name;
    jfilter_fn fn;
} filters[] = {
    {"abs", f_abs},
    {"batch", f_batch},
    {"slice", f_slice},
    {"truncate", f_truncate},
    {"attr", f_attr},
    {"capitalize", f_capitalize},
    {"center", f_center},
    {"count", f_length},
    {"d", f_default},
    {"default", f_default},
    {"dictsort", f_dictsort},
    {"e", f_escape},
    {"escape", f_escape},
    {"first", f_first},
    {"float", f_float},
    {"format", f_format},
    {"indent", f_indent},
    {"int", f_int},
    {"items", f_items},
    {"join", f_join},
    {"last", f_last},
    {"length", f_length},
    {"list", f_list},
    {"lower", f_lower},
    {"map", f_map},
    {"max", f_max},
    {"min", f_min},
    {"reject", f_reject},
    {"rejectattr", f_rejectattr},
    {"replace", f_replace},
    {"reverse", f_reverse},
    {"round", f_round},
    {"safe", f_safe},
    {"select", f_select},
    {"selectattr", f_selectattr},
    {"sort", f_sort},
    {"string", f_string},
    {"sum", f_sum},
    {"title", f_title},
    {"tojson", f_tojson},
    {"trim", f_trim},
    {"unique", f_unique},
    {"upper", f_upper},
    {"wordcount", f_wordcount},
};

static const struct {
    const char *name;
    jtest_fn fn;
} tests[] = {
    {"boolean", t_boolean},
    {"callable", t_callable},
    {"defined", t_defined},
    {"divisibleby", t_divisibleby},
    {"eq", t_eq},
    {"equalto", t_eq},
    {"==", t_eq},
    {"escaped", t_escaped},
    {"even", t_even},
    {"false", t_false},
    {"filter", t_filter},
    {"float", t_float},
    {"ge", t_ge},
    {">=", t_ge},
    {"gt", t_gt},
    {"greaterthan", t_gt},
    {">", t_gt},
    {"in", t_in},
    {"integer", t_integer},
    {"iterable", t_iterable},
    {"le", t_le},
    {"<=", t_le},
    {"lower", t_lower},
    {"lt", t_lt},
    {"lessthan", t_lt},
    {"<", t_lt},
    {"mapping", t_mapping},
    {"ne", t_ne},
    {"!=", t_ne},
    {"none", t_none},
    {"number", t_number},
    {"odd", t_odd},
    {"sameas", t_sameas},
    {"sequence", t_sequence},
    {"string", t_string},
    {"test", t_test},
    {"true", t_true},
    {"undefined", t_undefined},
    {"upper", t_upper},
};

jfilter_fn jinja_find_filter(const char *name) {
    for (size_t i = 0; i < sizeof filters / sizeof filters[0]; i++)
        if (!strcmp(filters[i].name, name)) return filters[i].fn;
    return NULL;
}

jtest_fn jinja_find_test(const char *name) {
    for (size_t i = 0; i < sizeof tests / sizeof tests[0]; i++)
        if (!strcmp(tests[i].name, name)) return tests[i].fn;
    return NULL;
}
