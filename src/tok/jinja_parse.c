/*
 * jinja_parse.c — recursive-descent parser from tokens to the AST of jinja_int.h,
 * following jinja2's Parser (operator precedence, filter/test/call postfix chains,
 * statements). Filters and tests are resolved here, so an unknown one fails when the
 * template is parsed, as jinja2 fails at compile time. Statements kiln does not support
 * (include, import, extends, block, recursive loops, ...) are errors naming line and
 * column.
 */
#include "tok/jinja_int.h"

#include <stdio.h>
#include <string.h>

typedef struct parser {
    const jtok *t;
    size_t n, pos;
    kiln_arena *a;
    kiln_err *err;
    int depth;
} parser;

#define P_MAX_DEPTH 400

static const jtok *cur(parser *P) {
    return &P->t[P->pos < P->n ? P->pos : P->n - 1];
}
static const jtok *peek(parser *P, size_t k) {
    size_t i = P->pos + k;
    return &P->t[i < P->n ? i : P->n - 1];
}
static void adv(parser *P) {
    if (P->pos < P->n - 1) P->pos++;
}

static int perr(parser *P, const jtok *t, const char *fmt, ...) KILN_PRINTF(3, 4);
static int perr(parser *P, const jtok *t, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    kiln_err_set(P->err, KILN_ERR_FORMAT, "line %d, column %d: %s", t->line, t->col, msg);
    return -1;
}

static const char *tok_desc(const jtok *t) {
    switch (t->type) {
    case JT_EOF:
        return "end of template";
    case JT_DATA:
        return "template data";
    case JT_VAR_BEGIN:
        return "'{{'";
    case JT_VAR_END:
        return "'}}'";
    case JT_BLOCK_BEGIN:
        return "'{%'";
    case JT_BLOCK_END:
        return "'%}'";
    default:
        return t->text;
    }
}

static bool is_op(const jtok *t, const char *op) {
    return t->type == JT_OP && strcmp(t->text, op) == 0;
}
static bool is_name(const jtok *t, const char *name) {
    return t->type == JT_NAME && strcmp(t->text, name) == 0;
}

static jnode *mk(parser *P, int kind, const jtok *at) {
    jnode *n = kiln_arena_calloc(P->a, 1, sizeof *n);
    if (!n) {
        kiln_err_set(P->err, KILN_ERR_NOMEM, "template: out of memory while parsing");
        return NULL;
    }
    n->kind = (uint8_t)kind;
    n->line = at->line;
    n->col = at->col;
    return n;
}

/* growable node arrays built in a temporary vector then copied into the arena */
typedef struct nvec {
    jnode **v;
    const char **names;
    size_t n, cap;
} nvec;

static int nv_push(parser *P, nvec *v, jnode *x, const char *name) {
    if (v->n == v->cap) {
        size_t nc = v->cap ? v->cap * 2 : 8;
        jnode **nv = kiln_arena_alloc(P->a, nc * sizeof *nv);
        const char **nn = kiln_arena_alloc(P->a, nc * sizeof *nn);
        if (!nv || !nn) {
            kiln_err_set(P->err, KILN_ERR_NOMEM, "template: out of memory while parsing");
            return -1;
        }
        if (v->n) {
            memcpy(nv, v->v, v->n * sizeof *nv);
            memcpy(nn, v->names, v->n * sizeof *nn);
        }
        v->v = nv;
        v->names = nn;
        v->cap = nc;
    }
    v->v[v->n] = x;
    v->names[v->n] = name;
    v->n++;
    return 0;
}

static int expect_op(parser *P, const char *op) {
    if (!is_op(cur(P), op)) return perr(P, cur(P), "expected '%s', got %s", op, tok_desc(cur(P)));
    adv(P);
    return 0;
}

static int expect_type(parser *P, int type, const char *what) {
    if (cur(P)->type != type) return perr(P, cur(P), "expected %s, got %s", what, tok_desc(cur(P)));
    adv(P);
    return 0;
}

static jnode *parse_expression(parser *P, bool with_condexpr);
static jnode *parse_tuple(parser *P, bool with_condexpr, bool explicit_parens);
static jnode *parse_unary(parser *P, bool with_filter);
static jnode *parse_postfix(parser *P, jnode *node);
static jnode *parse_filter_expr(parser *P, jnode *node);

/* ---- expressions ------------------------------------------------------------------- */

static int parse_call_args(parser *P, jnode *call) {
    /* at '(' */
    adv(P);
    nvec pos = {0}, kw = {0};
    bool first = true;
    while (!is_op(cur(P), ")")) {
        if (!first && expect_op(P, ",")) return -1;
        if (is_op(cur(P), ")")) break;
        first = false;
        if (is_op(cur(P), "*") || is_op(cur(P), "**"))
            return perr(P, cur(P), "kiln does not support *args/**kwargs in calls");
        if (cur(P)->type == JT_NAME && is_op(peek(P, 1), "=")) {
            const char *name = cur(P)->text;
            adv(P);
            adv(P);
            jnode *v = parse_expression(P, true);
            if (!v || nv_push(P, &kw, v, name)) return -1;
        } else {
            if (kw.n) return perr(P, cur(P), "positional argument follows keyword argument");
            jnode *v = parse_expression(P, true);
            if (!v || nv_push(P, &pos, v, NULL)) return -1;
        }
    }
    adv(P);
    call->items = pos.v;
    call->n_items = pos.n;
    call->names = kw.names;
    call->kwvals = kw.v;
    call->n_kw = kw.n;
    return 0;
}

static jnode *parse_primary(parser *P) {
    const jtok *t = cur(P);
    jnode *n;
    if (++P->depth > P_MAX_DEPTH) {
        perr(P, t, "expression nested too deeply");
        return NULL;
    }
    switch (t->type) {
    case JT_NAME:
        if (is_name(t, "true") || is_name(t, "True") || is_name(t, "false") ||
            is_name(t, "False")) {
            if (!(n = mk(P, JN_CONST, t))) return NULL;
            n->value = jv_bool(t->text[0] == 't' || t->text[0] == 'T');
        } else if (is_name(t, "none") || is_name(t, "None")) {
            if (!(n = mk(P, JN_CONST, t))) return NULL;
            n->value = jv_none();
        } else {
            if (!(n = mk(P, JN_NAME, t))) return NULL;
            n->name = t->text;
        }
        adv(P);
        break;
    case JT_STRING: {
        /* adjacent string literals concatenate */
        size_t total = 0, k = 0;
        while (peek(P, k)->type == JT_STRING) total += peek(P, k)->len, k++;
        char *s = kiln_arena_alloc(P->a, total + 1);
        if (!s || !(n = mk(P, JN_CONST, t))) return NULL;
        size_t o = 0;
        while (cur(P)->type == JT_STRING) {
            memcpy(s + o, cur(P)->text, cur(P)->len);
            o += cur(P)->len;
            adv(P);
        }
        s[o] = 0;
        n->value.type = JV_STR;
        n->value.u.str.s = s;
        n->value.u.str.n = o;
        break;
    }
    case JT_INT:
    case JT_FLOAT:
        if (!(n = mk(P, JN_CONST, t))) return NULL;
        n->value = t->type == JT_INT ? jv_int(t->ival) : jv_float(t->fval);
        adv(P);
        break;
    case JT_OP:
        if (is_op(t, "(")) {
            adv(P);
            n = parse_tuple(P, true, true);
            if (!n || expect_op(P, ")")) return NULL;
        } else if (is_op(t, "[")) {
            adv(P);
            nvec v = {0};
            while (!is_op(cur(P), "]")) {
                if (v.n && expect_op(P, ",")) return NULL;
                if (is_op(cur(P), "]")) break;
                jnode *x = parse_expression(P, true);
                if (!x || nv_push(P, &v, x, NULL)) return NULL;
            }
            adv(P);
            if (!(n = mk(P, JN_LIST, t))) return NULL;
            n->items = v.v;
            n->n_items = v.n;
        } else if (is_op(t, "{")) {
            adv(P);
            nvec k = {0}, v = {0};
            while (!is_op(cur(P), "}")) {
                if (k.n && expect_op(P, ",")) return NULL;
                if (is_op(cur(P), "}")) break;
                jnode *key = parse_expression(P, true);
                if (!key || expect_op(P, ":")) return NULL;
                jnode *val = parse_expression(P, true);
                if (!val || nv_push(P, &k, key, NULL) || nv_push(P, &v, val, NULL)) return NULL;
            }
            adv(P);
            if (!(n = mk(P, JN_DICT, t))) return NULL;
            n->items = k.v;
            n->n_items = k.n;
            n->kwvals = v.v;
            n->n_kw = v.n;
        } else {
            perr(P, t, "unexpected %s", tok_desc(t));
            return NULL;
        }
        break;
    default:
        perr(P, t, "unexpected %s", tok_desc(t));
        return NULL;
    }
    P->depth--;
    return n;
}

static jnode *parse_subscript(parser *P, jnode *obj, const jtok *at) {
    /* at '[' */
    adv(P);
    jnode *parts[3] = {NULL, NULL, NULL};
    int k = 0;
    bool slice = false;
    if (!is_op(cur(P), ":")) {
        if (!(parts[0] = parse_expression(P, true))) return NULL;
    }
    while (is_op(cur(P), ":")) {
        slice = true;
        if (k >= 2) {
            perr(P, cur(P), "invalid slice");
            return NULL;
        }
        adv(P);
        k++;
        if (!is_op(cur(P), ":") && !is_op(cur(P), "]")) {
            if (!(parts[k] = parse_expression(P, true))) return NULL;
        }
    }
    if (is_op(cur(P), ",")) {
        perr(P, cur(P), "kiln does not support tuple subscripts");
        return NULL;
    }
    if (expect_op(P, "]")) return NULL;
    jnode *n = mk(P, slice ? JN_SLICE : JN_GETITEM, at);
    if (!n) return NULL;
    n->a = obj;
    n->b = parts[0];
    if (slice) {
        n->c = parts[1];
        n->d = parts[2];
    } else if (!parts[0]) {
        perr(P, at, "expected an index");
        return NULL;
    }
    return n;
}

static jnode *parse_postfix(parser *P, jnode *node) {
    for (;;) {
        const jtok *t = cur(P);
        if (is_op(t, ".")) {
            adv(P);
            const jtok *nm = cur(P);
            if (nm->type == JT_NAME) {
                jnode *n = mk(P, JN_GETATTR, t);
                if (!n) return NULL;
                n->a = node;
                n->name = nm->text;
                adv(P);
                node = n;
            } else if (nm->type == JT_INT) {
                jnode *n = mk(P, JN_GETITEM, t), *k = mk(P, JN_CONST, nm);
                if (!n || !k) return NULL;
                k->value = jv_int(nm->ival);
                n->a = node;
                n->b = k;
                adv(P);
                node = n;
            } else {
                perr(P, nm, "expected an attribute name after '.', got %s", tok_desc(nm));
                return NULL;
            }
        } else if (is_op(t, "[")) {
            if (!(node = parse_subscript(P, node, t))) return NULL;
        } else if (is_op(t, "(")) {
            jnode *n = mk(P, JN_CALL, t);
            if (!n) return NULL;
            n->a = node;
            if (parse_call_args(P, n)) return NULL;
            node = n;
        } else {
            return node;
        }
    }
}

static jnode *parse_filter(parser *P, jnode *node) {
    /* after '|' */
    const jtok *t = cur(P);
    if (t->type != JT_NAME) {
        perr(P, t, "expected a filter name after '|', got %s", tok_desc(t));
        return NULL;
    }
    jnode *f = mk(P, JN_FILTER, t);
    if (!f) return NULL;
    f->name = t->text;
    adv(P);
    if (is_op(cur(P), ".")) {
        perr(P, cur(P), "kiln does not support dotted filter names");
        return NULL;
    }
    f->filter = jinja_find_filter(f->name); /* NULL: checked by check_names() */
    f->a = node;
    if (is_op(cur(P), "(") && parse_call_args(P, f)) return NULL;
    return f;
}

static jnode *parse_test(parser *P, jnode *node, const jtok *at) {
    /* after 'is' */
    jnode *n = mk(P, JN_TEST, at);
    if (!n) return NULL;
    n->a = node;
    if (is_name(cur(P), "not")) {
        n->op = 1;
        adv(P);
    }
    const jtok *t = cur(P);
    if (t->type != JT_NAME) {
        perr(P, t, "expected a test name after 'is', got %s", tok_desc(t));
        return NULL;
    }
    n->name = t->text;
    adv(P);
    n->test = jinja_find_test(n->name); /* NULL: checked by check_names() */
    const jtok *c = cur(P);
    if (is_op(c, "(")) {
        if (parse_call_args(P, n)) return NULL;
        if (n->n_kw) {
            perr(P, c, "kiln does not support keyword arguments to tests");
            return NULL;
        }
    } else if ((c->type == JT_NAME || c->type == JT_STRING || c->type == JT_INT ||
                c->type == JT_FLOAT || is_op(c, "[") || is_op(c, "{")) &&
               !is_name(c, "else") && !is_name(c, "or") && !is_name(c, "and")) {
        if (is_name(c, "is")) {
            perr(P, c, "you cannot chain multiple tests with is");
            return NULL;
        }
        jnode *arg = parse_primary(P);
        if (!arg || !(arg = parse_postfix(P, arg))) return NULL;
        n->items = kiln_arena_alloc(P->a, sizeof(jnode *));
        if (!n->items) return NULL;
        n->items[0] = arg;
        n->n_items = 1;
    }
    return n;
}

static jnode *parse_filter_expr(parser *P, jnode *node) {
    for (;;) {
        const jtok *t = cur(P);
        if (is_op(t, "|")) {
            adv(P);
            if (!(node = parse_filter(P, node))) return NULL;
        } else if (is_name(t, "is")) {
            adv(P);
            if (!(node = parse_test(P, node, t))) return NULL;
        } else if (is_op(t, "(")) {
            jnode *n = mk(P, JN_CALL, t);
            if (!n) return NULL;
            n->a = node;
            if (parse_call_args(P, n)) return NULL;
            node = n;
        } else {
            return node;
        }
    }
}

static jnode *parse_unary(parser *P, bool with_filter) {
    const jtok *t = cur(P);
    jnode *node;
    if (++P->depth > P_MAX_DEPTH) {
        perr(P, t, "expression nested too deeply");
        return NULL;
    }
    if (is_op(t, "-") || is_op(t, "+")) {
        adv(P);
        jnode *x = parse_unary(P, false);
        if (!x || !(node = mk(P, t->text[0] == '-' ? JN_NEG : JN_POS, t))) return NULL;
        node->a = x;
    } else {
        node = parse_primary(P);
        if (!node) return NULL;
    }
    node = parse_postfix(P, node);
    if (node && with_filter) node = parse_filter_expr(P, node);
    P->depth--;
    return node;
}

static jnode *binop(parser *P, const jtok *at, int op, jnode *l, jnode *r) {
    if (!l || !r) return NULL;
    jnode *n = mk(P, JN_BINOP, at);
    if (!n) return NULL;
    n->op = (uint8_t)op;
    n->a = l;
    n->b = r;
    return n;
}

static jnode *parse_pow(parser *P) {
    jnode *l = parse_unary(P, true);
    while (l && is_op(cur(P), "**")) {
        const jtok *t = cur(P);
        adv(P);
        l = binop(P, t, JOP_POW, l, parse_unary(P, true));
    }
    return l;
}

static jnode *parse_math2(parser *P) {
    jnode *l = parse_pow(P);
    for (;;) {
        const jtok *t = cur(P);
        int op = is_op(t, "*")    ? JOP_MUL
                 : is_op(t, "/")  ? JOP_DIV
                 : is_op(t, "//") ? JOP_FLOORDIV
                 : is_op(t, "%")  ? JOP_MOD
                                  : 0;
        if (!l || !op) return l;
        adv(P);
        l = binop(P, t, op, l, parse_pow(P));
    }
}

static jnode *parse_concat(parser *P) {
    jnode *l = parse_math2(P);
    while (l && is_op(cur(P), "~")) {
        const jtok *t = cur(P);
        adv(P);
        l = binop(P, t, JOP_CONCAT, l, parse_math2(P));
    }
    return l;
}

static jnode *parse_math1(parser *P) {
    jnode *l = parse_concat(P);
    for (;;) {
        const jtok *t = cur(P);
        int op = is_op(t, "+") ? JOP_ADD : is_op(t, "-") ? JOP_SUB : 0;
        if (!l || !op) return l;
        adv(P);
        l = binop(P, t, op, l, parse_concat(P));
    }
}

static jnode *parse_compare(parser *P) {
    const jtok *start = cur(P);
    jnode *expr = parse_math1(P);
    if (!expr) return NULL;
    nvec ops = {0};
    uint8_t opcodes[64];
    for (;;) {
        const jtok *t = cur(P);
        int op = 0;
        if (is_op(t, "=="))
            op = JOP_EQ;
        else if (is_op(t, "!="))
            op = JOP_NE;
        else if (is_op(t, "<"))
            op = JOP_LT;
        else if (is_op(t, "<="))
            op = JOP_LE;
        else if (is_op(t, ">"))
            op = JOP_GT;
        else if (is_op(t, ">="))
            op = JOP_GE;
        else if (is_name(t, "in"))
            op = JOP_IN;
        else if (is_name(t, "not") && is_name(peek(P, 1), "in")) {
            op = JOP_NOTIN;
            adv(P);
        }
        if (!op) break;
        adv(P);
        if (ops.n >= 64) {
            perr(P, t, "comparison chain too long");
            return NULL;
        }
        jnode *r = parse_math1(P);
        if (!r || nv_push(P, &ops, r, NULL)) return NULL;
        opcodes[ops.n - 1] = (uint8_t)op;
    }
    if (!ops.n) return expr;
    jnode *n = mk(P, JN_COMPARE, start);
    if (!n) return NULL;
    n->a = expr;
    n->items = ops.v;
    n->n_items = ops.n;
    n->cmp_ops = kiln_arena_alloc(P->a, ops.n);
    if (!n->cmp_ops) return NULL;
    memcpy(n->cmp_ops, opcodes, ops.n);
    return n;
}

static jnode *parse_not(parser *P) {
    const jtok *t = cur(P);
    if (is_name(t, "not")) {
        adv(P);
        if (++P->depth > P_MAX_DEPTH) {
            perr(P, t, "expression nested too deeply");
            return NULL;
        }
        jnode *x = parse_not(P);
        P->depth--;
        jnode *n = x ? mk(P, JN_NOT, t) : NULL;
        if (n) n->a = x;
        return n;
    }
    return parse_compare(P);
}

static jnode *parse_and(parser *P) {
    jnode *l = parse_not(P);
    while (l && is_name(cur(P), "and")) {
        const jtok *t = cur(P);
        adv(P);
        jnode *r = parse_not(P);
        jnode *n = r ? mk(P, JN_AND, t) : NULL;
        if (!n) return NULL;
        n->a = l;
        n->b = r;
        l = n;
    }
    return l;
}

static jnode *parse_or(parser *P) {
    jnode *l = parse_and(P);
    while (l && is_name(cur(P), "or")) {
        const jtok *t = cur(P);
        adv(P);
        jnode *r = parse_and(P);
        jnode *n = r ? mk(P, JN_OR, t) : NULL;
        if (!n) return NULL;
        n->a = l;
        n->b = r;
        l = n;
    }
    return l;
}

static jnode *parse_condexpr(parser *P) {
    jnode *e1 = parse_or(P);
    while (e1 && is_name(cur(P), "if")) {
        const jtok *t = cur(P);
        adv(P);
        jnode *cond = parse_or(P);
        if (!cond) return NULL;
        jnode *e3 = NULL;
        if (is_name(cur(P), "else")) {
            adv(P);
            if (!(e3 = parse_condexpr(P))) return NULL;
        }
        jnode *n = mk(P, JN_COND, t);
        if (!n) return NULL;
        n->a = cond;
        n->b = e1;
        n->c = e3;
        e1 = n;
    }
    return e1;
}

static jnode *parse_expression(parser *P, bool with_condexpr) {
    if (++P->depth > P_MAX_DEPTH) {
        perr(P, cur(P), "expression nested too deeply");
        return NULL;
    }
    jnode *n = with_condexpr ? parse_condexpr(P) : parse_or(P);
    P->depth--;
    return n;
}

static bool tuple_end(parser *P, bool explicit_parens) {
    const jtok *t = cur(P);
    if (t->type == JT_VAR_END || t->type == JT_BLOCK_END || t->type == JT_EOF) return true;
    if (explicit_parens && is_op(t, ")")) return true;
    if (is_name(t, "in") || is_name(t, "recursive") || is_name(t, "if")) return true;
    return false;
}

static jnode *parse_tuple(parser *P, bool with_condexpr, bool explicit_parens) {
    const jtok *start = cur(P);
    nvec v = {0};
    bool comma = false;
    for (;;) {
        if (v.n) {
            if (!is_op(cur(P), ",")) break;
            adv(P);
            comma = true;
        }
        if (v.n && tuple_end(P, explicit_parens)) break;
        if (!v.n && explicit_parens && is_op(cur(P), ")")) break;
        jnode *x = parse_expression(P, with_condexpr);
        if (!x || nv_push(P, &v, x, NULL)) return NULL;
    }
    if (v.n == 1 && !comma) return v.v[0];
    jnode *n = mk(P, JN_TUPLE, start);
    if (!n) return NULL;
    n->items = v.v;
    n->n_items = v.n;
    return n;
}

/* ---- statements -------------------------------------------------------------------- */

static jnode *parse_body(parser *P, const char *const *ends, const char **which);

static int block_end(parser *P) {
    return expect_type(P, JT_BLOCK_END, "'%}'");
}

/* name | name.attr (set only) | name, name, ... */
static jnode *parse_assign_target(parser *P, bool with_namespace) {
    const jtok *start = cur(P);
    nvec v = {0};
    for (;;) {
        const jtok *t = cur(P);
        if (t->type != JT_NAME) {
            perr(P, t, "expected a name to assign to, got %s", tok_desc(t));
            return NULL;
        }
        jnode *n = mk(P, JN_NAME, t);
        if (!n) return NULL;
        n->name = t->text;
        adv(P);
        if (with_namespace && is_op(cur(P), ".") && !v.n) {
            adv(P);
            const jtok *attr = cur(P);
            if (attr->type != JT_NAME) {
                perr(P, attr, "expected an attribute name");
                return NULL;
            }
            jnode *g = mk(P, JN_GETATTR, t);
            if (!g) return NULL;
            g->a = n;
            g->name = attr->text;
            adv(P);
            return g;
        }
        if (nv_push(P, &v, n, NULL)) return NULL;
        if (!is_op(cur(P), ",")) break;
        adv(P);
    }
    if (v.n == 1) return v.v[0];
    jnode *tup = mk(P, JN_TUPLE, start);
    if (!tup) return NULL;
    tup->items = v.v;
    tup->n_items = v.n;
    return tup;
}

static int parse_params(parser *P, jnode *n) {
    /* at '(' */
    adv(P);
    nvec v = {0};
    while (!is_op(cur(P), ")")) {
        if (v.n && expect_op(P, ",")) return -1;
        if (is_op(cur(P), ")")) break;
        const jtok *t = cur(P);
        if (t->type != JT_NAME) return perr(P, t, "expected a parameter name, got %s", tok_desc(t));
        adv(P);
        jnode *def = NULL;
        if (is_op(cur(P), "=")) {
            adv(P);
            if (!(def = parse_expression(P, true))) return -1;
        } else if (v.n && v.v[v.n - 1]) {
            return perr(P, t, "non-default argument follows default argument");
        }
        if (nv_push(P, &v, def, t->text)) return -1;
    }
    adv(P);
    n->names = v.names;
    n->kwvals = v.v;
    n->n_kw = v.n;
    return 0;
}

static void scan_names(const jnode *n, jnode *m, int depth) {
    if (!n || depth > 1000) return;
    if (n->kind == JN_NAME) {
        if (!strcmp(n->name, "caller")) m->uses_caller = true;
        if (!strcmp(n->name, "varargs")) m->uses_varargs = true;
        if (!strcmp(n->name, "kwargs")) m->uses_kwargs = true;
    }
    scan_names(n->a, m, depth + 1);
    scan_names(n->b, m, depth + 1);
    scan_names(n->c, m, depth + 1);
    scan_names(n->d, m, depth + 1);
    for (size_t i = 0; i < n->n_items; i++) scan_names(n->items[i], m, depth + 1);
    if (n->kind != JN_MACRO && n->kind != JN_CALLBLOCK)
        for (size_t i = 0; i < n->n_kw; i++) scan_names(n->kwvals[i], m, depth + 1);
}

static void set_body(jnode *n, jnode *body) {
    n->items = body->items;
    n->n_items = body->n_items;
}

static jnode *parse_filter_chain(parser *P) {
    jnode *chain = NULL;
    for (bool first = true; first || is_op(cur(P), "|"); first = false) {
        if (!first) adv(P);
        if (!(chain = parse_filter(P, chain))) return NULL;
    }
    return chain;
}

static jnode *parse_statement(parser *P) {
    const jtok *t = cur(P);
    if (t->type != JT_NAME) {
        perr(P, t, "expected a statement name, got %s", tok_desc(t));
        return NULL;
    }
    const char *kw = t->text;
    const char *which = NULL;
    adv(P);
    if (!strcmp(kw, "if")) {
        jnode *root = mk(P, JN_IF, t), *node = root;
        if (!root) return NULL;
        for (;;) {
            if (!(node->a = parse_tuple(P, false, false)) || block_end(P)) return NULL;
            static const char *const ends[] = {"elif", "else", "endif", NULL};
            jnode *body = parse_body(P, ends, &which);
            if (!body) return NULL;
            set_body(node, body);
            if (!strcmp(which, "elif")) {
                jnode *e = mk(P, JN_IF, cur(P));
                if (!e) return NULL;
                node->c = e;
                node = e;
                continue;
            }
            if (!strcmp(which, "else")) {
                if (block_end(P)) return NULL;
                static const char *const ends2[] = {"endif", NULL};
                if (!(node->c = parse_body(P, ends2, &which))) return NULL;
            }
            break;
        }
        return block_end(P) ? NULL : root;
    }
    if (!strcmp(kw, "for")) {
        jnode *n = mk(P, JN_FOR, t);
        if (!n || !(n->target = parse_assign_target(P, false))) return NULL;
        if (!is_name(cur(P), "in")) {
            perr(P, cur(P), "expected 'in' in for loop, got %s", tok_desc(cur(P)));
            return NULL;
        }
        adv(P);
        if (!(n->a = parse_tuple(P, false, false))) return NULL;
        if (is_name(cur(P), "if")) {
            adv(P);
            if (!(n->b = parse_expression(P, true))) return NULL;
        }
        if (is_name(cur(P), "recursive")) {
            perr(P, cur(P), "kiln does not support recursive for loops");
            return NULL;
        }
        if (block_end(P)) return NULL;
        static const char *const ends[] = {"endfor", "else", NULL};
        jnode *body = parse_body(P, ends, &which);
        if (!body) return NULL;
        set_body(n, body);
        if (!strcmp(which, "else")) {
            if (block_end(P)) return NULL;
            static const char *const ends2[] = {"endfor", NULL};
            if (!(n->c = parse_body(P, ends2, &which))) return NULL;
        }
        return block_end(P) ? NULL : n;
    }
    if (!strcmp(kw, "set")) {
        jnode *target = parse_assign_target(P, true);
        if (!target) return NULL;
        if (is_op(cur(P), "=")) {
            adv(P);
            jnode *n = mk(P, JN_SET, t);
            if (!n) return NULL;
            n->target = target;
            if (!(n->a = parse_tuple(P, true, false)) || block_end(P)) return NULL;
            return n;
        }
        jnode *n = mk(P, JN_SETBLOCK, t);
        if (!n) return NULL;
        n->target = target;
        if (target->kind != JN_NAME) {
            perr(P, t, "kiln supports block set only to a plain name");
            return NULL;
        }
        if (is_op(cur(P), "|") && (adv(P), !(n->b = parse_filter_chain(P)))) return NULL;
        if (block_end(P)) return NULL;
        static const char *const ends[] = {"endset", NULL};
        jnode *body = parse_body(P, ends, &which);
        if (!body) return NULL;
        set_body(n, body);
        return block_end(P) ? NULL : n;
    }
    if (!strcmp(kw, "macro")) {
        jnode *n = mk(P, JN_MACRO, t);
        if (!n) return NULL;
        if (cur(P)->type != JT_NAME) {
            perr(P, cur(P), "expected a macro name");
            return NULL;
        }
        n->name = cur(P)->text;
        adv(P);
        if (!is_op(cur(P), "(")) {
            perr(P, cur(P), "expected '(' after the macro name");
            return NULL;
        }
        if (parse_params(P, n) || block_end(P)) return NULL;
        static const char *const ends[] = {"endmacro", NULL};
        jnode *body = parse_body(P, ends, &which);
        if (!body) return NULL;
        set_body(n, body);
        if (cur(P)->type == JT_NAME && !strcmp(cur(P)->text, n->name)) adv(P);
        for (size_t i = 0; i < n->n_items; i++) scan_names(n->items[i], n, 0);
        return block_end(P) ? NULL : n;
    }
    if (!strcmp(kw, "call")) {
        jnode *n = mk(P, JN_CALLBLOCK, t);
        if (!n) return NULL;
        if (is_op(cur(P), "(") && parse_params(P, n)) return NULL;
        if (!(n->a = parse_expression(P, true))) return NULL;
        if (n->a->kind != JN_CALL) {
            perr(P, t, "expected a call expression after 'call'");
            return NULL;
        }
        if (block_end(P)) return NULL;
        static const char *const ends[] = {"endcall", NULL};
        jnode *body = parse_body(P, ends, &which);
        if (!body) return NULL;
        set_body(n, body);
        for (size_t i = 0; i < n->n_items; i++) scan_names(n->items[i], n, 0);
        return block_end(P) ? NULL : n;
    }
    if (!strcmp(kw, "filter")) {
        jnode *n = mk(P, JN_FILTERBLOCK, t);
        if (!n || !(n->b = parse_filter_chain(P)) || block_end(P)) return NULL;
        static const char *const ends[] = {"endfilter", NULL};
        jnode *body = parse_body(P, ends, &which);
        if (!body) return NULL;
        set_body(n, body);
        return block_end(P) ? NULL : n;
    }
    if (!strcmp(kw, "with")) {
        jnode *n = mk(P, JN_WITH, t);
        if (!n) return NULL;
        nvec v = {0};
        while (cur(P)->type != JT_BLOCK_END) {
            if (v.n && expect_op(P, ",")) return NULL;
            const jtok *nm = cur(P);
            if (nm->type != JT_NAME) {
                perr(P, nm, "expected a name in with, got %s", tok_desc(nm));
                return NULL;
            }
            adv(P);
            if (expect_op(P, "=")) return NULL;
            jnode *val = parse_expression(P, true);
            if (!val || nv_push(P, &v, val, nm->text)) return NULL;
        }
        n->names = v.names;
        n->kwvals = v.v;
        n->n_kw = v.n;
        if (block_end(P)) return NULL;
        static const char *const ends[] = {"endwith", NULL};
        jnode *body = parse_body(P, ends, &which);
        if (!body) return NULL;
        set_body(n, body);
        return block_end(P) ? NULL : n;
    }
    if (!strcmp(kw, "generation")) {
        /* transformers' AssistantTracker extension: a call block rendering its body
         * unchanged, i.e. a body in its own scope */
        jnode *n = mk(P, JN_WITH, t);
        if (!n || block_end(P)) return NULL;
        static const char *const ends[] = {"endgeneration", NULL};
        jnode *body = parse_body(P, ends, &which);
        if (!body || block_end(P)) return NULL;
        set_body(n, body);
        return n;
    }
    if (!strcmp(kw, "break") || !strcmp(kw, "continue")) {
        jnode *n = mk(P, kw[0] == 'b' ? JN_BREAK : JN_CONTINUE, t);
        return !n || block_end(P) ? NULL : n;
    }
    static const char *const unsupported[] = {"include", "import",     "from",  "extends",
                                              "block",   "autoescape", "trans", NULL};
    for (int i = 0; unsupported[i]; i++)
        if (!strcmp(kw, unsupported[i])) {
            perr(P, t, "kiln does not support the '%s' statement", kw);
            return NULL;
        }
    perr(P, t, "encountered unknown tag '%s'", kw);
    return NULL;
}

/* Parses statements until a block tag whose name is in ends (then *which is that
 * name and the parser sits after it) or EOF (only when ends is NULL). */
static jnode *parse_body(parser *P, const char *const *ends, const char **which) {
    const jtok *start = cur(P);
    nvec v = {0};
    if (++P->depth > P_MAX_DEPTH) {
        perr(P, start, "statements nested too deeply");
        return NULL;
    }
    for (;;) {
        const jtok *t = cur(P);
        if (t->type == JT_EOF) {
            if (ends) {
                perr(P, t, "unexpected end of template, expected '%s'", ends[0]);
                return NULL;
            }
            break;
        }
        if (t->type == JT_DATA) {
            jnode *n = mk(P, JN_DATA, t);
            if (!n) return NULL;
            n->value.type = JV_STR;
            n->value.u.str.s = t->text;
            n->value.u.str.n = t->len;
            adv(P);
            if (nv_push(P, &v, n, NULL)) return NULL;
        } else if (t->type == JT_VAR_BEGIN) {
            adv(P);
            jnode *n = mk(P, JN_OUTPUT, t);
            if (!n || !(n->a = parse_tuple(P, true, false))) return NULL;
            if (expect_type(P, JT_VAR_END, "'}}'")) return NULL;
            if (nv_push(P, &v, n, NULL)) return NULL;
        } else if (t->type == JT_BLOCK_BEGIN) {
            adv(P);
            const jtok *nm = cur(P);
            if (ends && nm->type == JT_NAME) {
                bool hit = false;
                for (int i = 0; ends[i]; i++)
                    if (!strcmp(nm->text, ends[i])) {
                        *which = ends[i];
                        hit = true;
                    }
                if (hit) {
                    adv(P);
                    break;
                }
            }
            if (nm->type == JT_NAME && (!strncmp(nm->text, "end", 3) || !strcmp(nm->text, "elif") ||
                                        !strcmp(nm->text, "else"))) {
                perr(P, nm, "unexpected '%s'%s%s", nm->text, ends ? ", expected " : "",
                     ends ? ends[0] : "");
                return NULL;
            }
            jnode *n = parse_statement(P);
            if (!n || nv_push(P, &v, n, NULL)) return NULL;
        } else {
            perr(P, t, "unexpected %s", tok_desc(t));
            return NULL;
        }
    }
    P->depth--;
    jnode *body = mk(P, JN_BODY, start);
    if (!body) return NULL;
    body->items = v.v;
    body->n_items = v.n;
    return body;
}

/* jinja2 resolves filters and tests at compile time, except inside `if` statements and
 * conditional expressions ("soft" frames), where an unknown name fails only when it is
 * evaluated; bodies of loops, macros, call/filter/set blocks start hard frames again. */
static int check_names(parser *P, const jnode *n, bool soft, int depth) {
    if (!n || depth > 2 * P_MAX_DEPTH) return 0;
    if (!soft && ((n->kind == JN_FILTER && !n->filter) || (n->kind == JN_TEST && !n->test))) {
        jtok at = {.line = n->line, .col = n->col};
        return perr(P, &at, "no %s named '%s'", n->kind == JN_FILTER ? "filter" : "test", n->name);
    }
    bool s = soft;
    bool items_soft = soft;
    switch (n->kind) {
    case JN_IF:
    case JN_COND:
        s = items_soft = true;
        break;
    case JN_FOR:
    case JN_MACRO:
    case JN_CALLBLOCK:
    case JN_FILTERBLOCK:
    case JN_SETBLOCK:
    case JN_WITH:
        items_soft = false;
        break;
    default:
        break;
    }
    const jnode *kids[] = {n->a, n->b, n->c, n->d, n->target};
    for (size_t i = 0; i < 5; i++) {
        bool ks = s;
        if (n->kind == JN_FOR && kids[i] == n->c) ks = false; /* else body */
        if (n->kind == JN_IF && kids[i] == n->c) ks = true;
        if (check_names(P, kids[i], ks, depth + 1)) return -1;
    }
    for (size_t i = 0; i < n->n_items; i++)
        if (check_names(P, n->items[i], items_soft, depth + 1)) return -1;
    for (size_t i = 0; i < n->n_kw; i++)
        if (check_names(P, n->kwvals[i], s, depth + 1)) return -1;
    return 0;
}

int jinja_parse_tokens(const jlexed *lx, kiln_arena *a, jnode **root, kiln_err *err) {
    parser P = {.t = lx->toks, .n = lx->n, .a = a, .err = err};
    const char *which = NULL;
    *root = parse_body(&P, NULL, &which);
    if (!*root) return -1;
    return check_names(&P, *root, false, 0);
}
