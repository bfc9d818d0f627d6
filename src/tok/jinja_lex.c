/*
 * jinja_lex.c — the template lexer, following jinja2's Lexer with the settings
 * Hugging Face uses (trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=False):
 *
 * - newlines (\r\n, \r) become \n and one trailing \n of the source is dropped;
 * - `{%-`, `{{-`, `{#-` strip all whitespace before the tag; `-%}`, `-}}`, `-#}` all
 *   whitespace after it;
 * - lstrip_blocks: spaces/tabs between the start of a line and a `{%` or `{#` are
 *   removed (not before `{{`, not with `{%+`); "start of a line" also means right after
 *   a tag whose match ended with a newline (jinja2's `line_starting`);
 * - trim_blocks: the first newline after `%}` or `#}` is removed (not with `+%}`);
 * - inside brackets `}}` / `%}` do not end the tag (jinja2's balancing stack);
 * - `{% raw %}...{% endraw %}` becomes data.
 */
#include "tok/jinja_int.h"
#include "base/mem.h"
#include "base/utf8.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct lexer {
    const char *s;
    size_t n;
    size_t pos;
    int line, col; /* of pos */
    kiln_arena *a;
    kiln_err *err;
    jtok *toks;
    size_t n_toks, cap;
} lexer;

static int lx_err(lexer *L, int line, int col, const char *msg, const char *arg) {
    kiln_err_set(L->err, KILN_ERR_FORMAT, "line %d, column %d: %s%s", line, col, msg,
                 arg ? arg : "");
    return -1;
}

/* Advances pos to p, updating line/col. */
static void lx_goto(lexer *L, size_t p) {
    while (L->pos < p) {
        if (L->s[L->pos] == '\n') {
            L->line++;
            L->col = 1;
        } else if (((unsigned char)L->s[L->pos] & 0xC0) != 0x80) {
            L->col++;
        }
        L->pos++;
    }
}

static jtok *lx_push(lexer *L, int type, int line, int col, const char *text, size_t len) {
    if (L->n_toks == L->cap) {
        size_t nc = L->cap ? L->cap * 2 : 256;
        jtok *nt = kiln_realloc(L->toks, nc * sizeof *nt);
        if (!nt) return NULL;
        L->toks = nt;
        L->cap = nc;
    }
    jtok *t = &L->toks[L->n_toks++];
    memset(t, 0, sizeof *t);
    t->type = (uint8_t)type;
    t->line = line;
    t->col = col;
    t->text = text ? kiln_arena_strndup(L->a, text, len) : "";
    t->len = text ? len : 0;
    if (text && !t->text) return NULL;
    return t;
}

static bool py_space_cp(uint32_t cp) {
    return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 ||
           cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 ||
           cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

/* Byte length of the Python whitespace character (str.isspace, regex \s) at s[p], or 0. */
static size_t ws_at(const char *s, size_t n, size_t p) {
    unsigned char c = (unsigned char)s[p];
    if (c < 0x80) return py_space_cp(c) ? 1 : 0;
    uint32_t cp;
    int k = kiln_utf8_decode((const uint8_t *)s + p, n - p, &cp);
    return k > 0 && py_space_cp(cp) ? (size_t)k : 0;
}

static size_t skip_ws(const char *s, size_t n, size_t p) {
    size_t k;
    while (p < n && (k = ws_at(s, n, p)) > 0) p += k;
    return p;
}

/* Length of text after Python's str.rstrip(). */
static size_t rstrip_len(const char *s, size_t n) {
    while (n > 0) {
        size_t p = n - 1;
        while (p > 0 && ((unsigned char)s[p] & 0xC0) == 0x80 && n - p < 4) p--;
        size_t k = ws_at(s, n, p);
        if (k == 0 || p + k != n) break;
        n = p;
    }
    return n;
}

/* The text before a tag after whitespace control (jinja2 OptionalLStrip). */
static size_t strip_before(const char *text, size_t n, char sign, bool is_var, bool line_starting) {
    if (sign == '-') return rstrip_len(text, n);
    if (sign == '+' || is_var) return n;
    size_t l_pos = n;
    while (l_pos > 0 && text[l_pos - 1] != '\n') l_pos--;
    if (l_pos > 0 || line_starting) {
        for (size_t i = l_pos; i < n; i++)
            if (text[i] != ' ' && text[i] != '\t') return n;
        return l_pos;
    }
    return n;
}

static int hexval(char ch) {
    if (ch >= '0' && ch <= '9') return ch - '0';
    if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F') return ch - 'A' + 10;
    return -1;
}

static size_t put_utf8(char *o, uint32_t cp) {
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xC0 | (cp >> 6));
        o[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | (cp >> 12));
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | (cp >> 18));
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* Python "unicode-escape" decoding of a string literal body; unknown escapes stay. */
static char *unescape(lexer *L, const char *s, size_t n, size_t *out_n, int line, int col) {
    char *o = kiln_arena_alloc(L->a, n + 1);
    if (!o) return NULL;
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] != '\\' || i + 1 >= n) {
            o[k++] = s[i];
            continue;
        }
        char e = s[++i];
        int digits = 0;
        switch (e) {
        case '\n':
            break;
        case '\\':
            o[k++] = '\\';
            break;
        case '\'':
            o[k++] = '\'';
            break;
        case '"':
            o[k++] = '"';
            break;
        case 'a':
            o[k++] = '\a';
            break;
        case 'b':
            o[k++] = '\b';
            break;
        case 'f':
            o[k++] = '\f';
            break;
        case 'n':
            o[k++] = '\n';
            break;
        case 'r':
            o[k++] = '\r';
            break;
        case 't':
            o[k++] = '\t';
            break;
        case 'v':
            o[k++] = '\v';
            break;
        case 'x':
            digits = 2;
            break;
        case 'u':
            digits = 4;
            break;
        case 'U':
            digits = 8;
            break;
        default:
            if (e >= '0' && e <= '7') {
                uint32_t v = 0;
                int m = 0;
                while (m < 3 && i < n && s[i] >= '0' && s[i] <= '7')
                    v = v * 8 + (uint32_t)(s[i++] - '0'), m++;
                i--;
                if (v > 0x7F) {
                    /* 2 bytes at most for \377: fits the input length (4 bytes) */
                    k += put_utf8(o + k, v);
                } else {
                    o[k++] = (char)v;
                }
            } else {
                o[k++] = '\\';
                o[k++] = e;
            }
        }
        if (digits) {
            uint32_t v = 0;
            for (int m = 0; m < digits; m++) {
                int h = i + 1 + (size_t)m < n ? hexval(s[i + 1 + m]) : -1;
                if (h < 0) {
                    lx_err(L, line, col, "truncated \\",
                           digits == 2 ? "xXX escape" : "uXXXX escape");
                    return NULL;
                }
                v = v * 16 + (uint32_t)h;
            }
            if (v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) {
                lx_err(L, line, col, "string escape outside Unicode scalar values", NULL);
                return NULL;
            }
            i += (size_t)digits;
            k += put_utf8(o + k, v); /* <= 4 bytes for >= 4 input bytes */
        }
    }
    o[k] = 0;
    *out_n = k;
    return o;
}

static const char *const ops2[] = {"//", "**", "==", "!=", ">=", "<=", NULL};
static const char ops1[] = "+-/*%~[](){}.:|,;=<>";

/* Lexes the inside of a {{ }} or {% %} tag starting at L->pos. is_var selects the end
 * marker. On return L->pos is past the end marker (and the whitespace it consumes). */
static int lex_tag(lexer *L, bool is_var, bool *line_starting) {
    const char endc = is_var ? '}' : '%';
    int tag_line = L->line, tag_col = L->col;
    char stack[256];
    int depth = 0;
    for (;;) {
        size_t p = L->pos;
        const char *s = L->s;
        if (p >= L->n)
            return lx_err(L, tag_line, tag_col, "unexpected end of template, tag not closed: ",
                          is_var ? "expected '}}'" : "expected '%}'");
        /* end marker (only outside brackets) */
        if (depth == 0) {
            size_t q = 0;
            int kind = 0; /* 1 plain, 2 minus, 3 plus */
            if (s[p] == '-' && p + 2 < L->n + 0 && s[p + 1] == endc && s[p + 2] == '}')
                q = p + 3, kind = 2;
            else if (!is_var && s[p] == '+' && p + 2 < L->n + 0 && s[p + 1] == endc &&
                     s[p + 2] == '}')
                q = p + 3, kind = 3;
            else if (s[p] == endc && p + 1 < L->n && s[p + 1] == '}')
                q = p + 2, kind = 1;
            if (kind) {
                if (!lx_push(L, is_var ? JT_VAR_END : JT_BLOCK_END, L->line, L->col, NULL, 0))
                    return -1;
                if (kind == 2)
                    q = skip_ws(s, L->n, q);
                else if (kind == 1 && !is_var && q < L->n && s[q] == '\n')
                    q++;
                *line_starting = q > 0 && s[q - 1] == '\n';
                lx_goto(L, q);
                return 0;
            }
        }
        size_t wk = ws_at(s, L->n, p);
        if (wk) {
            lx_goto(L, p + wk);
            continue;
        }
        int line = L->line, col = L->col;
        unsigned char ch = (unsigned char)s[p];
        if (ch == '\'' || ch == '"') {
            size_t q = p + 1;
            while (q < L->n && s[q] != (char)ch) {
                if (s[q] == '\\' && q + 1 < L->n) q++;
                q++;
            }
            if (q >= L->n) return lx_err(L, line, col, "unterminated string literal", NULL);
            size_t un = 0;
            char *u = unescape(L, s + p + 1, q - p - 1, &un, line, col);
            if (!u)
                return L->err && L->err->code ? -1 : lx_err(L, line, col, "out of memory", NULL);
            jtok *t = lx_push(L, JT_STRING, line, col, NULL, 0);
            if (!t) return lx_err(L, line, col, "out of memory", NULL);
            t->text = u;
            t->len = un;
            lx_goto(L, q + 1);
            continue;
        }
        if (ch >= '0' && ch <= '9') {
            size_t q = p;
            while (q < L->n && ((s[q] >= '0' && s[q] <= '9') || s[q] == '_')) q++;
            bool is_float = false;
            if (q + 1 < L->n && s[q] == '.' && s[q + 1] >= '0' && s[q + 1] <= '9') {
                is_float = true;
                q++;
                while (q < L->n && ((s[q] >= '0' && s[q] <= '9') || s[q] == '_')) q++;
            }
            if (q < L->n && (s[q] == 'e' || s[q] == 'E')) {
                size_t r = q + 1;
                if (r < L->n && (s[r] == '+' || s[r] == '-')) r++;
                if (r < L->n && s[r] >= '0' && s[r] <= '9') {
                    while (r < L->n && ((s[r] >= '0' && s[r] <= '9') || s[r] == '_')) r++;
                    q = r;
                    is_float = true;
                }
            }
            char buf[128];
            size_t k = 0;
            for (size_t i = p; i < q && k + 1 < sizeof buf; i++)
                if (s[i] != '_') buf[k++] = s[i];
            buf[k] = 0;
            if (q - p >= sizeof buf - 1)
                return lx_err(L, line, col, "number literal too long", NULL);
            jtok *t = lx_push(L, is_float ? JT_FLOAT : JT_INT, line, col, s + p, q - p);
            if (!t) return lx_err(L, line, col, "out of memory", NULL);
            if (is_float) {
                t->fval = strtod(buf, NULL);
            } else {
                char *end = NULL;
                unsigned long long v = strtoull(buf, &end, 10);
                if (v > (unsigned long long)INT64_MAX || k > 19)
                    return lx_err(L, line, col, "integer literal too large for kiln (int64)", NULL);
                t->ival = (int64_t)v;
            }
            lx_goto(L, q);
            continue;
        }
        if (ch == '_' || (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z')) {
            size_t q = p;
            while (q < L->n && (s[q] == '_' || (s[q] >= 'a' && s[q] <= 'z') ||
                                (s[q] >= 'A' && s[q] <= 'Z') || (s[q] >= '0' && s[q] <= '9')))
                q++;
            if (!lx_push(L, JT_NAME, line, col, s + p, q - p))
                return lx_err(L, line, col, "out of memory", NULL);
            lx_goto(L, q);
            continue;
        }
        size_t oplen = 0;
        for (int i = 0; ops2[i]; i++)
            if (p + 1 < L->n && s[p] == ops2[i][0] && s[p + 1] == ops2[i][1]) oplen = 2;
        if (!oplen && strchr(ops1, (char)ch) && ch) oplen = 1;
        if (!oplen) {
            char what[8];
            snprintf(what, sizeof what, "'%c'", ch >= 0x20 && ch < 0x7f ? ch : '?');
            return lx_err(L, line, col, "unexpected character ", what);
        }
        if (oplen == 1 && (ch == '(' || ch == '[' || ch == '{')) {
            if (depth >= (int)sizeof stack)
                return lx_err(L, line, col, "brackets nested too deeply", NULL);
            stack[depth++] = ch == '(' ? ')' : ch == '[' ? ']' : '}';
        } else if (oplen == 1 && (ch == ')' || ch == ']' || ch == '}')) {
            if (depth == 0 || stack[depth - 1] != (char)ch) {
                char what[8];
                snprintf(what, sizeof what, "'%c'", ch);
                return lx_err(L, line, col, "unexpected closing bracket ", what);
            }
            depth--;
        }
        if (!lx_push(L, JT_OP, line, col, s + p, oplen))
            return lx_err(L, line, col, "out of memory", NULL);
        lx_goto(L, p + oplen);
    }
}

/* Matches `{%[-+]?\s*raw\s*(-%}\s*|%})` at p (p at '{'); returns the end or 0. */
static size_t match_raw_begin(const char *s, size_t n, size_t p, bool *minus_end) {
    size_t q = p + 2;
    if (q < n && (s[q] == '-' || s[q] == '+')) q++;
    q = skip_ws(s, n, q);
    if (q + 3 > n || memcmp(s + q, "raw", 3) != 0) return 0;
    q += 3;
    q = skip_ws(s, n, q);
    *minus_end = false;
    if (q + 3 <= n && s[q] == '-' && s[q + 1] == '%' && s[q + 2] == '}') {
        *minus_end = true;
        return skip_ws(s, n, q + 3);
    }
    if (q + 2 <= n && s[q] == '%' && s[q + 1] == '}') return q + 2;
    return 0;
}

/* Finds `{%[-+]?\s*endraw\s*(+%}|-%}\s*|%}\n?)` from p; returns its start (or n) and
 * sets *end past it and *sign to the sign after `{%`. */
static size_t find_raw_end(const char *s, size_t n, size_t p, size_t *end, char *sign) {
    for (size_t i = p; i + 1 < n; i++) {
        if (s[i] != '{' || s[i + 1] != '%') continue;
        size_t q = i + 2;
        char sg = 0;
        if (q < n && (s[q] == '-' || s[q] == '+')) sg = s[q++];
        q = skip_ws(s, n, q);
        if (q + 6 > n || memcmp(s + q, "endraw", 6) != 0) continue;
        q = skip_ws(s, n, q + 6);
        if (q + 3 <= n && s[q] == '+' && s[q + 1] == '%' && s[q + 2] == '}') {
            *end = q + 3;
        } else if (q + 3 <= n && s[q] == '-' && s[q + 1] == '%' && s[q + 2] == '}') {
            *end = skip_ws(s, n, q + 3);
        } else if (q + 2 <= n && s[q] == '%' && s[q + 1] == '}') {
            *end = q + 2 + (q + 2 < n && s[q + 2] == '\n');
        } else {
            continue;
        }
        *sign = sg;
        return i;
    }
    return n;
}

int jinja_lex(const char *src, size_t len, kiln_arena *a, jlexed *out, kiln_err *err) {
    /* normalize newlines, drop one trailing newline */
    char *s = kiln_arena_alloc(a, len + 1);
    if (!s) return kiln_err_set(err, KILN_ERR_NOMEM, "template: out of memory"), -1;
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            s[n++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n') i++;
        } else {
            s[n++] = src[i];
        }
    }
    if (n > 0 && s[n - 1] == '\n') n--;
    s[n] = 0;

    lexer L = {.s = s, .n = n, .line = 1, .col = 1, .a = a, .err = err};
    bool line_starting = true;
    int rc = 0;
    while (L.pos < n) {
        size_t t = L.pos;
        while (t + 1 < n &&
               !(s[t] == '{' && (s[t + 1] == '{' || s[t + 1] == '%' || s[t + 1] == '#')))
            t++;
        if (t + 1 >= n) {
            if (!lx_push(&L, JT_DATA, L.line, L.col, s + L.pos, n - L.pos)) goto oom;
            lx_goto(&L, n);
            break;
        }
        char kind = s[t + 1];
        char sign = (t + 2 < n && (s[t + 2] == '-' || s[t + 2] == '+')) ? s[t + 2] : 0;
        if (kind == '{' && sign == '+') sign = 0; /* `{{+` is not a marker for variables */
        size_t keep = strip_before(s + L.pos, t - L.pos, sign, kind == '{', line_starting);
        if (keep > 0 && !lx_push(&L, JT_DATA, L.line, L.col, s + L.pos, keep)) goto oom;
        lx_goto(&L, t);
        int tl = L.line, tc = L.col;
        if (kind == '#') {
            size_t q = t + 2 + (sign ? 1 : 0), end = 0;
            for (; q + 1 < n; q++) {
                if (s[q] == '+' && q + 2 < n && s[q + 1] == '#' && s[q + 2] == '}') {
                    end = q + 3;
                    break;
                }
                if (s[q] == '-' && q + 2 < n && s[q + 1] == '#' && s[q + 2] == '}') {
                    end = skip_ws(s, n, q + 3);
                    break;
                }
                if (s[q] == '#' && s[q + 1] == '}') {
                    end = q + 2 + (q + 2 < n && s[q + 2] == '\n');
                    break;
                }
            }
            if (!end) {
                rc = lx_err(&L, tl, tc, "missing end of comment tag", NULL);
                goto done;
            }
            line_starting = s[end - 1] == '\n';
            lx_goto(&L, end);
            continue;
        }
        bool minus_end = false;
        size_t raw_end = kind == '%' ? match_raw_begin(s, n, t, &minus_end) : 0;
        if (raw_end) {
            size_t end = 0;
            char rsign = 0;
            size_t body_end = find_raw_end(s, n, raw_end, &end, &rsign);
            if (body_end >= n) {
                rc = lx_err(&L, tl, tc, "missing end of raw directive", NULL);
                goto done;
            }
            lx_goto(&L, raw_end);
            size_t keep2 = strip_before(s + raw_end, body_end - raw_end, rsign, false,
                                        raw_end > 0 && s[raw_end - 1] == '\n');
            if (keep2 > 0 && !lx_push(&L, JT_DATA, L.line, L.col, s + raw_end, keep2)) goto oom;
            line_starting = s[end - 1] == '\n';
            lx_goto(&L, end);
            continue;
        }
        if (!lx_push(&L, kind == '{' ? JT_VAR_BEGIN : JT_BLOCK_BEGIN, tl, tc, NULL, 0)) goto oom;
        lx_goto(&L, t + 2 + (sign ? 1 : 0));
        if (lex_tag(&L, kind == '{', &line_starting) != 0) {
            rc = -1;
            goto done;
        }
    }
    if (!lx_push(&L, JT_EOF, L.line, L.col, NULL, 0)) goto oom;
    /* copy tokens into the arena so the AST can point at them after we free */
    out->toks = kiln_arena_alloc(a, L.n_toks * sizeof(jtok));
    if (!out->toks) goto oom;
    memcpy(out->toks, L.toks, L.n_toks * sizeof(jtok));
    out->n = L.n_toks;
    goto done;
oom:
    rc = -1;
    kiln_err_set(err, KILN_ERR_NOMEM, "template: out of memory while lexing");
done:
    kiln_free(L.toks);
    return rc;
}
