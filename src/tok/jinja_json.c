/*
 * jinja_json.c — JSON in (jansson values to template values, keeping object key order)
 * and JSON out: `tojson` as transformers defines it, i.e. Python's
 * json.dumps(x, ensure_ascii=False, indent=indent, separators=separators,
 * sort_keys=sort_keys). jansson's encoder cannot match it byte for byte (separators
 * ", "/": ", float repr, escaping only of '"', '\\' and control characters), so the
 * serializer is written here.
 */
#include "tok/jinja_int.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

int jv_from_json(jctx *c, const json_t *j, jv *out) {
    if (++c->depth > JINJA_MAX_DEPTH) return jerr(c, NULL, "JSON input nested too deeply");
    int rc = 0;
    switch (json_typeof(j)) {
    case JSON_NULL:
        *out = jv_none();
        break;
    case JSON_TRUE:
        *out = jv_bool(true);
        break;
    case JSON_FALSE:
        *out = jv_bool(false);
        break;
    case JSON_INTEGER:
        *out = jv_int((int64_t)json_integer_value(j));
        break;
    case JSON_REAL:
        *out = jv_float(json_real_value(j));
        break;
    case JSON_STRING:
        *out = jv_str(c, json_string_value(j), json_string_length(j));
        if (out->type != JV_STR) rc = jv_oom(c, NULL);
        break;
    case JSON_ARRAY: {
        size_t n = json_array_size(j);
        jlist *l = jl_new(c, n);
        if (!l) {
            rc = jv_oom(c, NULL);
            break;
        }
        for (size_t i = 0; i < n && !rc; i++) {
            rc = jv_from_json(c, json_array_get(j, i), &l->items[i]);
            l->n = i + 1;
        }
        *out = jv_list(l);
        break;
    }
    case JSON_OBJECT: {
        jdict *d = jd_new(c, json_object_size(j));
        if (!d) {
            rc = jv_oom(c, NULL);
            break;
        }
        const char *key;
        json_t *val;
        /* jansson >= 2.8 iterates in insertion order, as Python's json.loads keeps it */
        json_object_foreach((json_t *)j, key, val) {
            if (d->n == d->cap) {
                rc = jerr(c, NULL, "JSON object changed while reading it");
                break;
            }
            jv k = jv_str(c, key, strlen(key)), v;
            if (k.type != JV_STR) {
                rc = jv_oom(c, NULL);
                break;
            }
            if ((rc = jv_from_json(c, val, &v))) break;
            d->keys[d->n] = k;
            d->vals[d->n] = v;
            d->n++;
        }
        *out = jv_dict(d);
        break;
    }
    default:
        rc = jerr(c, NULL, "unknown JSON value type");
    }
    c->depth--;
    return rc;
}

static void json_str(jbuf *b, const char *s, size_t n, bool ascii) {
    jbuf_putc(b, '"');
    size_t run = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        const char *esc = NULL;
        char tmp[8];
        switch (ch) {
        case '"':
            esc = "\\\"";
            break;
        case '\\':
            esc = "\\\\";
            break;
        case '\n':
            esc = "\\n";
            break;
        case '\r':
            esc = "\\r";
            break;
        case '\t':
            esc = "\\t";
            break;
        case '\b':
            esc = "\\b";
            break;
        case '\f':
            esc = "\\f";
            break;
        default:
            if (ascii && ch >= 0x7f) {
                uint32_t cp = ch;
                int k = 1;
                if (ch >= 0xF0 && i + 3 < n) {
                    cp = ((uint32_t)(ch & 7) << 18) | ((uint32_t)(s[i + 1] & 0x3F) << 12) |
                         ((uint32_t)(s[i + 2] & 0x3F) << 6) | (uint32_t)(s[i + 3] & 0x3F);
                    k = 4;
                } else if (ch >= 0xE0 && i + 2 < n) {
                    cp = ((uint32_t)(ch & 15) << 12) | ((uint32_t)(s[i + 1] & 0x3F) << 6) |
                         (uint32_t)(s[i + 2] & 0x3F);
                    k = 3;
                } else if (ch >= 0xC0 && i + 1 < n) {
                    cp = ((uint32_t)(ch & 31) << 6) | (uint32_t)(s[i + 1] & 0x3F);
                    k = 2;
                }
                jbuf_put(b, s + i - run, run);
                run = 0;
                if (cp >= 0x10000) {
                    uint32_t v = cp - 0x10000;
                    jbuf_printf(b, "\\u%04x\\u%04x", 0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF));
                } else {
                    jbuf_printf(b, "\\u%04x", cp);
                }
                i += (size_t)k - 1;
                continue;
            }
            if (ch < 0x20) {
                static const char hex[] = "0123456789abcdef";
                tmp[0] = '\\', tmp[1] = 'u', tmp[2] = '0', tmp[3] = '0';
                tmp[4] = hex[ch >> 4], tmp[5] = hex[ch & 15], tmp[6] = 0;
                esc = tmp;
            }
        }
        if (esc) {
            jbuf_put(b, s + i - run, run);
            run = 0;
            jbuf_puts(b, esc);
        } else {
            run++;
        }
    }
    jbuf_put(b, s + n - run, run);
    jbuf_putc(b, '"');
}

static void json_float(jbuf *b, double f) {
    if (isnan(f)) {
        jbuf_puts(b, "NaN");
    } else if (isinf(f)) {
        jbuf_puts(b, f < 0 ? "-Infinity" : "Infinity");
    } else {
        char tmp[32];
        jfloat_repr(f, tmp);
        jbuf_puts(b, tmp);
    }
}

static void newline_indent(jbuf *b, int indent, int level) {
    jbuf_putc(b, '\n');
    for (int i = 0; i < indent * level; i++) jbuf_putc(b, ' ');
}

typedef struct kv_ref {
    jv key;
    jv val;
} kv_ref;

static int kv_cmp(const void *x, const void *y) {
    const kv_ref *a = x, *b = y;
    /* only string keys are sorted (checked by the caller) */
    size_t n = a->key.u.str.n < b->key.u.str.n ? a->key.u.str.n : b->key.u.str.n;
    int r = memcmp(a->key.u.str.s, b->key.u.str.s, n);
    if (r) return r;
    return a->key.u.str.n < b->key.u.str.n ? -1 : a->key.u.str.n > b->key.u.str.n;
}

int jv_tojson(jctx *c, const jnode *at, jbuf *b, jv v, int indent, const char *item_sep,
              const char *key_sep, bool sort_keys, bool ascii, int level) {
    if (level > JINJA_MAX_DEPTH) return jerr(c, at, "tojson: value nested too deeply");
    switch (v.type) {
    case JV_NONE:
        jbuf_puts(b, "null");
        return 0;
    case JV_BOOL:
        jbuf_puts(b, v.u.b ? "true" : "false");
        return 0;
    case JV_INT:
        jbuf_printf(b, "%lld", (long long)v.u.i);
        return 0;
    case JV_FLOAT:
        json_float(b, v.u.f);
        return 0;
    case JV_STR:
        json_str(b, v.u.str.s, v.u.str.n, ascii);
        return 0;
    case JV_LIST: {
        jlist *l = v.u.list;
        if (l->kind != JL_LIST)
            return jerr(c, at, "tojson: Object of type %s is not JSON serializable", l->kname);
        if (!l->n) {
            jbuf_puts(b, "[]");
            return 0;
        }
        jbuf_putc(b, '[');
        for (size_t i = 0; i < l->n; i++) {
            if (i) jbuf_puts(b, item_sep);
            if (indent >= 0) newline_indent(b, indent, level + 1);
            JTRY(jv_tojson(c, at, b, l->items[i], indent, item_sep, key_sep, sort_keys, ascii,
                           level + 1));
        }
        if (indent >= 0) newline_indent(b, indent, level);
        jbuf_putc(b, ']');
        return 0;
    }
    case JV_DICT: {
        jdict *d = v.u.dict;
        if (!d->n) {
            jbuf_puts(b, "{}");
            return 0;
        }
        kv_ref *items = jalloc(c, d->n * sizeof *items);
        if (!items) return jv_oom(c, at);
        for (size_t i = 0; i < d->n; i++) {
            items[i].key = d->keys[i];
            items[i].val = d->vals[i];
        }
        if (sort_keys) {
            for (size_t i = 0; i < d->n; i++)
                if (items[i].key.type != JV_STR)
                    return jerr(c, at, "tojson: sort_keys needs string keys, got '%s'",
                                jv_type_name(items[i].key));
            qsort(items, d->n, sizeof *items, kv_cmp);
        }
        jbuf_putc(b, '{');
        for (size_t i = 0; i < d->n; i++) {
            if (i) jbuf_puts(b, item_sep);
            if (indent >= 0) newline_indent(b, indent, level + 1);
            jv k = items[i].key;
            switch (k.type) {
            case JV_STR:
                json_str(b, k.u.str.s, k.u.str.n, ascii);
                break;
            case JV_INT:
                jbuf_printf(b, "\"%lld\"", (long long)k.u.i);
                break;
            case JV_BOOL:
                jbuf_puts(b, k.u.b ? "\"true\"" : "\"false\"");
                break;
            case JV_NONE:
                jbuf_puts(b, "\"null\"");
                break;
            case JV_FLOAT:
                jbuf_putc(b, '"');
                json_float(b, k.u.f);
                jbuf_putc(b, '"');
                break;
            default:
                return jerr(c, at, "tojson: keys must be str, int, float, bool or None, not %s",
                            jv_type_name(k));
            }
            jbuf_puts(b, key_sep);
            JTRY(jv_tojson(c, at, b, items[i].val, indent, item_sep, key_sep, sort_keys, ascii,
                           level + 1));
        }
        if (indent >= 0) newline_indent(b, indent, level);
        jbuf_putc(b, '}');
        return 0;
    }
    default:
        return jerr(c, at, "tojson: Object of type %s is not JSON serializable", jv_type_name(v));
    }
}
