/*
 * jinja_eval.c — executes the AST: statements write to the current output buffer,
 * expressions produce values with Python/jinja2 semantics.
 *
 * Scoping follows jinja2: `for` bodies (a fresh scope per iteration), macros, call
 * blocks, `with` and block `set` get their own scope; `if` does not. Names resolve
 * outward; a macro's scope hangs off the scope it was defined in, so it sees later
 * top-level assignments but not its caller's loop variables. Assignments inside a loop
 * do not leak out (which is why templates use namespace()).
 */
#include "tok/jinja.h"
#include "base/mem.h"
#include "tok/jinja_int.h"
#include "base/utf8.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int eval(jctx *c, jscope *s, const jnode *n, jv *out);
static int exec_items(jctx *c, jscope *s, jnode *const *items, size_t n);

/* ---- scopes ------------------------------------------------------------------------ */

static jscope *scope_new(jctx *c, jscope *parent) {
    jscope *s = jalloc(c, sizeof *s);
    if (!s) return NULL;
    memset(s, 0, sizeof *s);
    s->parent = parent;
    return s;
}

int jscope_set(jctx *c, jscope *s, const char *name, jv v) {
    for (size_t i = 0; i < s->n; i++)
        if (!strcmp(s->names[i], name)) {
            s->vals[i] = v;
            return 0;
        }
    if (s->n == s->cap) {
        size_t nc = s->cap ? s->cap * 2 : 8;
        const char **nn = jalloc(c, nc * sizeof *nn);
        jv *nv = jalloc(c, nc * sizeof *nv);
        if (!nn || !nv) return -1;
        if (s->n) {
            memcpy(nn, s->names, s->n * sizeof *nn);
            memcpy(nv, s->vals, s->n * sizeof *nv);
        }
        s->names = nn;
        s->vals = nv;
        s->cap = nc;
    }
    s->names[s->n] = name;
    s->vals[s->n] = v;
    s->n++;
    return 0;
}

static bool scope_get(const jscope *s, const char *name, jv *out) {
    for (; s; s = s->parent)
        for (size_t i = 0; i < s->n; i++)
            if (!strcmp(s->names[i], name)) {
                *out = s->vals[i];
                return true;
            }
    return false;
}

/* ---- helpers ----------------------------------------------------------------------- */

static int undefined_err(jctx *c, const jnode *at, jv v) {
    if (v.unsafe) return jerr(c, at, "%s", v.u.undef_name ? v.u.undef_name : "unsafe access");
    if (v.u.undef_name) return jerr(c, at, "'%s' is undefined", v.u.undef_name);
    return jerr(c, at, "value is undefined");
}

static int assign(jctx *c, jscope *s, const jnode *target, jv v) {
    if (target->kind == JN_NAME) {
        return jscope_set(c, s, target->name, v) ? jv_oom(c, target) : 0;
    }
    if (target->kind == JN_TUPLE) {
        jlist *l;
        JTRY(jv_iter(c, target, v, &l));
        if (l->n != target->n_items)
            return jerr(c, target, "cannot unpack %zu values into %zu names", l->n,
                        target->n_items);
        for (size_t i = 0; i < l->n; i++) JTRY(assign(c, s, target->items[i], l->items[i]));
        return 0;
    }
    if (target->kind == JN_GETATTR) {
        jv ns;
        if (!scope_get(s, target->a->name, &ns) || ns.type != JV_NS)
            return jerr(c, target, "cannot assign attribute on non-namespace object");
        jv key = jv_str_lit(target->name);
        return jd_set(c, ns.u.dict, key, v) ? jv_oom(c, target) : 0;
    }
    return jerr(c, target, "cannot assign to this expression");
}

/* Renders items into a fresh buffer and returns the text as a string value. */
static int capture(jctx *c, jscope *s, jnode *const *items, size_t n, jv *out) {
    jbuf b = {0}, *saved = c->out;
    c->out = &b;
    int rc = exec_items(c, s, items, n);
    c->out = saved;
    if (rc) {
        jbuf_free(&b);
        return -1;
    }
    *out = jv_str_buf(c, &b);
    return out->type == JV_STR ? 0 : jv_oom(c, NULL);
}

static int eval_args(jctx *c, jscope *s, const jnode *n, jv **args, jv **kwv) {
    *args = NULL;
    *kwv = NULL;
    if (n->n_items) {
        if (!(*args = jalloc(c, n->n_items * sizeof(jv)))) return jv_oom(c, n);
        for (size_t i = 0; i < n->n_items; i++) JTRY(eval(c, s, n->items[i], &(*args)[i]));
    }
    if (n->n_kw) {
        if (!(*kwv = jalloc(c, n->n_kw * sizeof(jv)))) return jv_oom(c, n);
        for (size_t i = 0; i < n->n_kw; i++) JTRY(eval(c, s, n->kwvals[i], &(*kwv)[i]));
    }
    return 0;
}

/* Applies a filter node chain (innermost first) to v. */
static int apply_filters(jctx *c, jscope *s, const jnode *f, jv v, jv *out) {
    if (!f) {
        *out = v;
        return 0;
    }
    if (f->a) JTRY(apply_filters(c, s, f->a, v, &v));
    if (!f->filter) return jerr(c, f, "no filter named '%s' found", f->name);
    jv *args, *kwv;
    JTRY(eval_args(c, s, f, &args, &kwv));
    return f->filter(c, f, v, args, f->n_items, f->names, kwv, f->n_kw, out);
}

/* ---- calls ------------------------------------------------------------------------- */

static int call_macro(jctx *c, const jnode *at, jfunc *fn, jv *args, size_t nargs, const char **kwn,
                      jv *kwv, size_t nkw, jv caller, jv *out) {
    const jnode *m = fn->macro;
    const char *mname = m->kind == JN_MACRO ? m->name : "caller";
    if (c->depth > JINJA_MAX_DEPTH) return jerr(c, at, "macro calls nested too deeply");
    jscope *s = scope_new(c, fn->closure);
    if (!s) return jv_oom(c, at);
    size_t np = m->n_kw;
    if (nargs > np && !m->uses_varargs)
        return jerr(c, at, "macro '%s' takes not more than %zu argument(s)", mname, np);
    jlist *varargs = jl_new(c, 0);
    jdict *kwargs = jd_new(c, 0);
    bool *bound = jalloc(c, np + 1);
    if (!varargs || !kwargs || !bound) return jv_oom(c, at);
    memset(bound, 0, np + 1);
    for (size_t i = 0; i < nargs; i++) {
        if (i < np) {
            if (jscope_set(c, s, m->names[i], args[i])) return jv_oom(c, at);
            bound[i] = true;
        } else if (jl_push(c, varargs, args[i])) {
            return jv_oom(c, at);
        }
    }
    for (size_t k = 0; k < nkw; k++) {
        size_t i;
        for (i = 0; i < np; i++)
            if (!strcmp(m->names[i], kwn[k])) break;
        if (i < np) {
            if (bound[i])
                return jerr(c, at, "macro '%s' got multiple values for argument '%s'", mname,
                            kwn[k]);
            if (jscope_set(c, s, m->names[i], kwv[k])) return jv_oom(c, at);
            bound[i] = true;
        } else if (!strcmp(kwn[k], "caller") && m->uses_caller) {
            caller = kwv[k];
        } else if (m->uses_kwargs) {
            if (jd_set(c, kwargs, jv_str_lit(kwn[k]), kwv[k])) return jv_oom(c, at);
        } else {
            return jerr(c, at, "macro '%s' takes no keyword argument '%s'", mname, kwn[k]);
        }
    }
    c->depth++;
    for (size_t i = 0; i < np; i++) {
        if (bound[i]) continue;
        jv v = jv_undef(m->names[i]);
        if (m->kwvals[i] && eval(c, s, m->kwvals[i], &v)) {
            c->depth--;
            return -1;
        }
        if (jscope_set(c, s, m->names[i], v)) return jv_oom(c, at);
    }
    varargs->tuple = true; /* a tuple, as in jinja2 */
    if (jscope_set(c, s, "varargs", jv_list(varargs)) ||
        jscope_set(c, s, "kwargs", jv_dict(kwargs)))
        return jv_oom(c, at);
    if (m->uses_caller && jscope_set(c, s, "caller", caller)) return jv_oom(c, at);
    int saved_ctl = c->ctl;
    c->ctl = 0;
    int rc = capture(c, s, m->items, m->n_items, out);
    c->ctl = saved_ctl;
    c->depth--;
    return rc;
}

int jinja_call(jctx *c, const jnode *at, jv fn, jv *args, size_t nargs, const char **kwn, jv *kwv,
               size_t nkw, jv *out) {
    if (fn.type == JV_UNDEF) return undefined_err(c, at, fn);
    if (fn.type != JV_FUNC) return jerr(c, at, "'%s' object is not callable", jv_type_name(fn));
    jfunc *f = fn.u.fn;
    if (f->unsafe_call)
        return jerr(c, at, "access to attribute '%s' of '%s' object is unsafe.", f->name,
                    jv_type_name(f->self));
    if (f->macro) return call_macro(c, at, f, args, nargs, kwn, kwv, nkw, f->caller, out);
    return f->builtin(c, at, f->self, args, nargs, kwn, kwv, nkw, out);
}

/* ---- arithmetic -------------------------------------------------------------------- */

static int type_err(jctx *c, const jnode *at, const char *op, jv a, jv b) {
    if (a.type == JV_UNDEF) return undefined_err(c, at, a);
    if (b.type == JV_UNDEF) return undefined_err(c, at, b);
    return jerr(c, at, "unsupported operand type(s) for %s: '%s' and '%s'", op, jv_type_name(a),
                jv_type_name(b));
}

static int64_t as_i(jv v) {
    return v.type == JV_INT ? v.u.i : v.u.b;
}
static bool is_intish(jv v) {
    return v.type == JV_INT || v.type == JV_BOOL;
}

static int repeat(jctx *c, const jnode *at, jv seq, int64_t times, jv *out) {
    if (times < 0) times = 0;
    if (seq.type == JV_LIST && seq.u.list->kind)
        return jerr(c, at, "unsupported operand type(s) for *: '%s' and 'int'", seq.u.list->kname);
    /* an empty sequence times 10^18 is empty: the copy loops below must not count to it
     * (a hang found by fuzz_template, session 9) */
    if ((seq.type == JV_STR ? seq.u.str.n : seq.u.list->n) == 0) times = 0;
    if (seq.type == JV_STR) {
        size_t total;
        if (!kiln_size_mul(seq.u.str.n, (size_t)times, &total) || total > c->budget)
            return jv_oom(c, at);
        char *p = jalloc(c, total + 1);
        if (!p) return jv_oom(c, at);
        for (int64_t i = 0; i < times; i++)
            memcpy(p + (size_t)i * seq.u.str.n, seq.u.str.s, seq.u.str.n);
        p[total] = 0;
        out->type = JV_STR;
        out->markup = seq.markup;
        out->u.str.s = p;
        out->u.str.n = total;
        return 0;
    }
    size_t total;
    if (!kiln_size_mul(seq.u.list->n, (size_t)times, &total) || total > JINJA_MAX_RANGE)
        return jv_oom(c, at);
    jlist *l = jl_new(c, total);
    if (!l) return jv_oom(c, at);
    for (int64_t i = 0; i < times; i++)
        for (size_t k = 0; k < seq.u.list->n; k++) l->items[l->n++] = seq.u.list->items[k];
    l->tuple = seq.u.list->tuple;
    *out = jv_list(l);
    return 0;
}

int jinja_str_percent(jctx *c, const jnode *at, jv fmt, jv args, jv *out);

static int binop(jctx *c, const jnode *at, int op, jv a, jv b, jv *out) {
    static const char *const names[] = {"", "+", "-", "*", "/", "//", "%", "**"};
    if (op == JOP_CONCAT) {
        JTRY(jv_check_printable(c, at, a));
        JTRY(jv_check_printable(c, at, b));
        jbuf buf = {0};
        jv_str_into(&buf, a);
        jv_str_into(&buf, b);
        *out = jv_str_buf(c, &buf);
        return out->type == JV_STR ? 0 : jv_oom(c, at);
    }
    if (jv_is_num(a) && jv_is_num(b)) {
        bool ints = is_intish(a) && is_intish(b);
        int64_t x = ints ? as_i(a) : 0, y = ints ? as_i(b) : 0, r;
        double fx = jv_num(a), fy = jv_num(b);
        switch (op) {
        case JOP_ADD:
            if (!ints) break;
            if (__builtin_add_overflow(x, y, &r)) return jerr(c, at, "integer overflow in +");
            *out = jv_int(r);
            return 0;
        case JOP_SUB:
            if (!ints) break;
            if (__builtin_sub_overflow(x, y, &r)) return jerr(c, at, "integer overflow in -");
            *out = jv_int(r);
            return 0;
        case JOP_MUL:
            if (!ints) break;
            if (__builtin_mul_overflow(x, y, &r)) return jerr(c, at, "integer overflow in *");
            *out = jv_int(r);
            return 0;
        case JOP_DIV:
            if (fy == 0.0) return jerr(c, at, "division by zero");
            *out = jv_float(fx / fy);
            return 0;
        case JOP_FLOORDIV:
        case JOP_MOD:
            if (ints) {
                if (y == 0) return jerr(c, at, "integer division or modulo by zero");
                if (x == INT64_MIN && y == -1) return jerr(c, at, "integer overflow");
                int64_t q = x / y, m = x % y;
                if (m != 0 && ((m < 0) != (y < 0))) q--, m += y;
                *out = jv_int(op == JOP_MOD ? m : q);
                return 0;
            }
            if (fy == 0.0) return jerr(c, at, "float division by zero");
            if (op == JOP_MOD) {
                double m = fmod(fx, fy);
                if (m != 0 && ((m < 0) != (fy < 0))) m += fy;
                *out = jv_float(m);
            } else {
                *out = jv_float(floor(fx / fy));
            }
            return 0;
        case JOP_POW:
            if (ints && y >= 0) {
                int64_t acc = 1;
                for (int64_t i = 0; i < y; i++) {
                    if (__builtin_mul_overflow(acc, x, &acc))
                        return jerr(c, at, "integer overflow in **");
                    if (acc == 0 || acc == 1) break;
                }
                *out = jv_int(acc);
                return 0;
            }
            *out = jv_float(pow(fx, fy));
            return 0;
        default:
            break;
        }
        switch (op) {
        case JOP_ADD:
            *out = jv_float(fx + fy);
            return 0;
        case JOP_SUB:
            *out = jv_float(fx - fy);
            return 0;
        case JOP_MUL:
            *out = jv_float(fx * fy);
            return 0;
        default:
            break;
        }
    }
    if (op == JOP_ADD && a.type == JV_STR && b.type == JV_STR && (a.markup || b.markup)) {
        /* markupsafe: Markup + str escapes the plain side and stays Markup */
        jbuf buf = {0};
        if (a.markup)
            jbuf_put(&buf, a.u.str.s, a.u.str.n);
        else
            jhtml_escape_into(&buf, a.u.str.s, a.u.str.n);
        if (b.markup)
            jbuf_put(&buf, b.u.str.s, b.u.str.n);
        else
            jhtml_escape_into(&buf, b.u.str.s, b.u.str.n);
        *out = buf.p ? jv_str_buf(c, &buf) : jv_str_lit("");
        if (out->type != JV_STR) return jv_oom(c, at);
        out->markup = 1;
        return 0;
    }
    if (op == JOP_ADD && a.type == JV_STR && b.type == JV_STR) {
        size_t n;
        if (!kiln_size_add(a.u.str.n, b.u.str.n, &n)) return jv_oom(c, at);
        char *p = jalloc(c, n + 1);
        if (!p) return jv_oom(c, at);
        memcpy(p, a.u.str.s, a.u.str.n);
        memcpy(p + a.u.str.n, b.u.str.s, b.u.str.n);
        p[n] = 0;
        *out = (jv){.type = JV_STR};
        out->unsafe = 0;
        out->u.str.s = p;
        out->u.str.n = n;
        return 0;
    }
    if (op == JOP_ADD && a.type == JV_LIST && b.type == JV_LIST &&
        a.u.list->tuple == b.u.list->tuple && !a.u.list->kind && !b.u.list->kind) {
        jlist *l = jl_new(c, a.u.list->n + b.u.list->n);
        if (!l) return jv_oom(c, at);
        for (size_t i = 0; i < a.u.list->n; i++) l->items[l->n++] = a.u.list->items[i];
        for (size_t i = 0; i < b.u.list->n; i++) l->items[l->n++] = b.u.list->items[i];
        l->tuple = a.u.list->tuple;
        *out = jv_list(l);
        return 0;
    }
    if (op == JOP_MUL && (a.type == JV_STR || a.type == JV_LIST) && is_intish(b))
        return repeat(c, at, a, as_i(b), out);
    if (op == JOP_MUL && (b.type == JV_STR || b.type == JV_LIST) && is_intish(a))
        return repeat(c, at, b, as_i(a), out);
    if (op == JOP_MOD && a.type == JV_STR) return jinja_str_percent(c, at, a, b, out);
    return type_err(c, at, names[op], a, b);
}

static int contains(jctx *c, const jnode *at, jv needle, jv hay, bool *out) {
    switch (hay.type) {
    case JV_STR:
        if (needle.type != JV_STR)
            return jerr(c, at, "'in <string>' requires string as left operand, not %s",
                        jv_type_name(needle));
        *out = needle.u.str.n == 0 ||
               memmem(hay.u.str.s, hay.u.str.n, needle.u.str.s, needle.u.str.n) != NULL;
        return 0;
    case JV_LIST:
        *out = false;
        for (size_t i = 0; i < hay.u.list->n; i++)
            if (jv_eq(hay.u.list->items[i], needle)) *out = true;
        return 0;
    case JV_DICT:
        *out = jd_get(hay.u.dict, needle, NULL);
        return 0;
    case JV_UNDEF:
        *out = false;
        return 0;
    default:
        return jerr(c, at, "argument of type '%s' is not iterable", jv_type_name(hay));
    }
}

static int compare(jctx *c, const jnode *at, int op, jv a, jv b, bool *out) {
    int r;
    switch (op) {
    case JOP_EQ:
        *out = jv_eq(a, b);
        return 0;
    case JOP_NE:
        *out = !jv_eq(a, b);
        return 0;
    case JOP_IN:
        return contains(c, at, a, b, out);
    case JOP_NOTIN:
        JTRY(contains(c, at, a, b, out));
        *out = !*out;
        return 0;
    default:
        if (a.type == JV_UNDEF) return undefined_err(c, at, a);
        if (b.type == JV_UNDEF) return undefined_err(c, at, b);
        JTRY(jv_cmp(c, at, a, b, &r));
        *out = op == JOP_LT ? r < 0 : op == JOP_LE ? r <= 0 : op == JOP_GT ? r > 0 : r >= 0;
        return 0;
    }
}

/* Python slice of a list or string. */
static int slice(jctx *c, const jnode *at, jv obj, jv start, jv stop, jv step, jv *out) {
    int64_t st = 1;
    if (step.type != JV_NONE) {
        if (!is_intish(step)) return jerr(c, at, "slice indices must be integers or None");
        st = as_i(step);
        if (st == 0) return jerr(c, at, "slice step cannot be zero");
    }
    int64_t len;
    size_t slen = 0;
    if (obj.type == JV_STR)
        len = (int64_t)(slen = ju_len(obj.u.str.s, obj.u.str.n));
    else if (obj.type == JV_LIST)
        len = (int64_t)obj.u.list->n;
    else if (obj.type == JV_UNDEF)
        return undefined_err(c, at, obj);
    else
        return jerr(c, at, "'%s' object is not subscriptable", jv_type_name(obj));
    int64_t lo, hi;
    jv ends[2] = {start, stop};
    int64_t vals[2];
    for (int k = 0; k < 2; k++) {
        if (ends[k].type == JV_NONE) {
            vals[k] = k == 0 ? (st > 0 ? 0 : len - 1) : (st > 0 ? len : -1);
            continue;
        }
        if (!is_intish(ends[k])) return jerr(c, at, "slice indices must be integers or None");
        int64_t v = as_i(ends[k]);
        if (v < 0) {
            v += len;
            if (v < 0) v = st < 0 ? -1 : 0;
        } else if (v >= len) {
            v = st < 0 ? len - 1 : len;
        }
        vals[k] = v;
    }
    lo = vals[0];
    hi = vals[1];
    if (obj.type == JV_STR) {
        /* byte offsets of every code point */
        size_t *offs = jalloc(c, (slen + 1) * sizeof *offs);
        if (!offs) return jv_oom(c, at);
        size_t k = 0;
        for (size_t p = 0; p < obj.u.str.n; p++)
            if (((unsigned char)obj.u.str.s[p] & 0xC0) != 0x80) offs[k++] = p;
        offs[slen] = obj.u.str.n;
        jbuf b = {0};
        for (int64_t i = lo; st > 0 ? i < hi : i > hi; i += st)
            jbuf_put(&b, obj.u.str.s + offs[i], offs[i + 1] - offs[i]);
        *out = jv_str_buf(c, &b);
        return out->type == JV_STR ? 0 : jv_oom(c, at);
    }
    jlist *l = jl_new(c, 0);
    if (!l) return jv_oom(c, at);
    for (int64_t i = lo; st > 0 ? i < hi : i > hi; i += st)
        if (jl_push(c, l, obj.u.list->items[i])) return jv_oom(c, at);
    l->tuple = obj.u.list->tuple;
    *out = jv_list(l);
    return 0;
}

/* ---- expressions ------------------------------------------------------------------- */

static int eval(jctx *c, jscope *s, const jnode *n, jv *out) {
    jv a, b;
    if (c->steps_left-- == 0) return jerr(c, n, "render stopped: step limit reached");
    switch (n->kind) {
    case JN_CONST:
        *out = n->value;
        return 0;
    case JN_NAME:
        if (!scope_get(s, n->name, out)) *out = jv_undef(n->name);
        return 0;
    case JN_GETATTR:
        JTRY(eval(c, s, n->a, &a));
        return jinja_getattr(c, n, a, n->name, out);
    case JN_GETITEM:
        JTRY(eval(c, s, n->a, &a));
        JTRY(eval(c, s, n->b, &b));
        return jinja_getitem(c, n, a, b, out);
    case JN_SLICE: {
        jv parts[3] = {jv_none(), jv_none(), jv_none()};
        JTRY(eval(c, s, n->a, &a));
        if (n->b) JTRY(eval(c, s, n->b, &parts[0]));
        if (n->c) JTRY(eval(c, s, n->c, &parts[1]));
        if (n->d) JTRY(eval(c, s, n->d, &parts[2]));
        return slice(c, n, a, parts[0], parts[1], parts[2], out);
    }
    case JN_CALL: {
        jv *args, *kwv;
        JTRY(eval(c, s, n->a, &a));
        JTRY(eval_args(c, s, n, &args, &kwv));
        return jinja_call(c, n, a, args, n->n_items, n->names, kwv, n->n_kw, out);
    }
    case JN_FILTER: {
        jv *args, *kwv;
        if (!n->filter) return jerr(c, n, "no filter named '%s' found", n->name);
        JTRY(eval(c, s, n->a, &a));
        JTRY(eval_args(c, s, n, &args, &kwv));
        return n->filter(c, n, a, args, n->n_items, n->names, kwv, n->n_kw, out);
    }
    case JN_TEST: {
        jv *args, *kwv;
        bool r;
        if (!n->test) return jerr(c, n, "no test named '%s' found", n->name);
        JTRY(eval(c, s, n->a, &a));
        JTRY(eval_args(c, s, n, &args, &kwv));
        JTRY(n->test(c, n, a, args, n->n_items, &r));
        *out = jv_bool(n->op ? !r : r);
        return 0;
    }
    case JN_NOT:
        JTRY(eval(c, s, n->a, &a));
        *out = jv_bool(!jv_truthy(a));
        return 0;
    case JN_NEG:
    case JN_POS:
        JTRY(eval(c, s, n->a, &a));
        if (a.type == JV_INT) {
            if (n->kind == JN_NEG && a.u.i == INT64_MIN) return jerr(c, n, "integer overflow");
            *out = jv_int(n->kind == JN_NEG ? -a.u.i : a.u.i);
        } else if (a.type == JV_BOOL) {
            *out = jv_int(n->kind == JN_NEG ? -(int64_t)a.u.b : a.u.b);
        } else if (a.type == JV_FLOAT) {
            *out = jv_float(n->kind == JN_NEG ? -a.u.f : a.u.f);
        } else if (a.type == JV_UNDEF) {
            return undefined_err(c, n, a);
        } else {
            return jerr(c, n, "bad operand type for unary %c: '%s'", n->kind == JN_NEG ? '-' : '+',
                        jv_type_name(a));
        }
        return 0;
    case JN_BINOP:
        JTRY(eval(c, s, n->a, &a));
        JTRY(eval(c, s, n->b, &b));
        return binop(c, n, n->op, a, b, out);
    case JN_COMPARE: {
        JTRY(eval(c, s, n->a, &a));
        for (size_t i = 0; i < n->n_items; i++) {
            bool r;
            JTRY(eval(c, s, n->items[i], &b));
            JTRY(compare(c, n, n->cmp_ops[i], a, b, &r));
            if (!r) {
                *out = jv_bool(false);
                return 0;
            }
            a = b;
        }
        *out = jv_bool(true);
        return 0;
    }
    case JN_AND:
        JTRY(eval(c, s, n->a, &a));
        if (!jv_truthy(a)) {
            *out = a;
            return 0;
        }
        return eval(c, s, n->b, out);
    case JN_OR:
        JTRY(eval(c, s, n->a, &a));
        if (jv_truthy(a)) {
            *out = a;
            return 0;
        }
        return eval(c, s, n->b, out);
    case JN_COND:
        JTRY(eval(c, s, n->a, &a));
        if (jv_truthy(a)) return eval(c, s, n->b, out);
        if (n->c) return eval(c, s, n->c, out);
        *out = jv_undef(NULL);
        return 0;
    case JN_LIST:
    case JN_TUPLE: {
        jlist *l = jl_new(c, n->n_items);
        if (!l) return jv_oom(c, n);
        for (size_t i = 0; i < n->n_items; i++) {
            JTRY(eval(c, s, n->items[i], &l->items[i]));
            l->n = i + 1;
        }
        l->tuple = n->kind == JN_TUPLE;
        *out = jv_list(l);
        return 0;
    }
    case JN_DICT: {
        jdict *d = jd_new(c, n->n_items);
        if (!d) return jv_oom(c, n);
        for (size_t i = 0; i < n->n_items; i++) {
            JTRY(eval(c, s, n->items[i], &a));
            JTRY(eval(c, s, n->kwvals[i], &b));
            if (a.type == JV_LIST && !a.u.list->tuple) return jerr(c, n, "unhashable type: 'list'");
            if (a.type == JV_DICT) return jerr(c, n, "unhashable type: 'dict'");
            if (jd_set(c, d, a, b)) return jv_oom(c, n);
        }
        *out = jv_dict(d);
        return 0;
    }
    default:
        return jerr(c, n, "internal error: node %d is not an expression", n->kind);
    }
}

/* ---- statements -------------------------------------------------------------------- */

static int exec_for(jctx *c, jscope *s, const jnode *n) {
    jv it;
    jlist *items;
    JTRY(eval(c, s, n->a, &it));
    JTRY(jv_iter(c, n->a, it, &items));
    if (n->b) { /* `for x in xs if cond`: filter first, loop vars count the kept items */
        jlist *kept = jl_new(c, items->n);
        if (!kept) return jv_oom(c, n);
        for (size_t i = 0; i < items->n; i++) {
            jscope *fs = scope_new(c, s);
            jv cond;
            if (!fs) return jv_oom(c, n);
            JTRY(assign(c, fs, n->target, items->items[i]));
            JTRY(eval(c, fs, n->b, &cond));
            if (jv_truthy(cond)) kept->items[kept->n++] = items->items[i];
        }
        items = kept;
    }
    jloop *lp = jalloc(c, sizeof *lp);
    if (!lp) return jv_oom(c, n);
    memset(lp, 0, sizeof *lp);
    lp->items = items;

    lp->depth = 1; /* only recursive loops (unsupported) nest depth in jinja2 */
    jv loopv = {.type = JV_LOOP};
    loopv.u.loop = lp;
    for (size_t i = 0; i < items->n; i++) {
        jscope *is = scope_new(c, s);
        if (!is) return jv_oom(c, n);
        lp->index0 = i;
        JTRY(assign(c, is, n->target, items->items[i]));
        if (jscope_set(c, is, "loop", loopv)) return jv_oom(c, n);
        JTRY(exec_items(c, is, n->items, n->n_items));
        if (c->ctl == 1) {
            c->ctl = 0;
            break;
        }
        c->ctl = 0;
    }
    if (items->n == 0 && n->c) {
        jscope *es = scope_new(c, s);
        if (!es) return jv_oom(c, n);
        return exec_items(c, es, n->c->items, n->c->n_items);
    }
    return 0;
}

static int exec_node(jctx *c, jscope *s, const jnode *n) {
    jv v;
    if (c->steps_left-- == 0) return jerr(c, n, "render stopped: step limit reached");
    switch (n->kind) {
    case JN_DATA:
        jbuf_put(c->out, n->value.u.str.s, n->value.u.str.n);
        return 0;
    case JN_OUTPUT:
        JTRY(eval(c, s, n->a, &v));
        JTRY(jv_check_printable(c, n, v));
        jv_str_into(c->out, v);
        return 0;
    case JN_BODY:
        return exec_items(c, s, n->items, n->n_items);
    case JN_IF:
        for (const jnode *b = n; b;) {
            if (b->kind != JN_IF) return exec_items(c, s, b->items, b->n_items);
            JTRY(eval(c, s, b->a, &v));
            if (jv_truthy(v)) return exec_items(c, s, b->items, b->n_items);
            b = b->c;
        }
        return 0;
    case JN_FOR:
        return exec_for(c, s, n);
    case JN_SET:
        JTRY(eval(c, s, n->a, &v));
        return assign(c, s, n->target, v);
    case JN_SETBLOCK: {
        jscope *bs = scope_new(c, s);
        if (!bs) return jv_oom(c, n);
        JTRY(capture(c, bs, n->items, n->n_items, &v));
        JTRY(apply_filters(c, s, n->b, v, &v));
        return assign(c, s, n->target, v);
    }
    case JN_FILTERBLOCK: {
        jscope *bs = scope_new(c, s);
        if (!bs) return jv_oom(c, n);
        JTRY(capture(c, bs, n->items, n->n_items, &v));
        JTRY(apply_filters(c, s, n->b, v, &v));
        jv_str_into(c->out, v);
        return 0;
    }
    case JN_MACRO: {
        jfunc *f = jalloc(c, sizeof *f);
        if (!f) return jv_oom(c, n);
        memset(f, 0, sizeof *f);
        f->name = n->name;
        f->macro = n;
        f->closure = s;
        f->caller = jv_undef("caller");
        jv fv = {.type = JV_FUNC};
        fv.u.fn = f;
        return jscope_set(c, s, n->name, fv) ? jv_oom(c, n) : 0;
    }
    case JN_CALLBLOCK: {
        const jnode *call = n->a;
        jfunc *cf = jalloc(c, sizeof *cf);
        if (!cf) return jv_oom(c, n);
        memset(cf, 0, sizeof *cf);
        cf->name = "caller";
        cf->macro = n;
        cf->closure = s;
        cf->caller = jv_undef("caller");
        jv callerv = {.type = JV_FUNC};
        callerv.u.fn = cf;
        jv fn, *args, *kwv;
        JTRY(eval(c, s, call->a, &fn));
        JTRY(eval_args(c, s, call, &args, &kwv));
        if (fn.type != JV_FUNC || !fn.u.fn->macro)
            return jerr(c, n, "call block needs a macro, got '%s'", jv_type_name(fn));
        if (!fn.u.fn->macro->uses_caller)
            return jerr(c, n,
                        "macro '%s' was invoked with two values for the special caller argument",
                        fn.u.fn->name);
        JTRY(call_macro(c, n, fn.u.fn, args, call->n_items, call->names, kwv, call->n_kw, callerv,
                        &v));
        jv_str_into(c->out, v);
        return 0;
    }
    case JN_WITH: {
        jscope *ws = scope_new(c, s);
        if (!ws) return jv_oom(c, n);
        for (size_t i = 0; i < n->n_kw; i++) {
            JTRY(eval(c, s, n->kwvals[i], &v));
            if (jscope_set(c, ws, n->names[i], v)) return jv_oom(c, n);
        }
        return exec_items(c, ws, n->items, n->n_items);
    }
    case JN_BREAK:
        c->ctl = 1;
        return 0;
    case JN_CONTINUE:
        c->ctl = 2;
        return 0;
    default:
        return jerr(c, n, "internal error: node %d is not a statement", n->kind);
    }
}

static int exec_items(jctx *c, jscope *s, jnode *const *items, size_t n) {
    if (++c->depth > JINJA_MAX_DEPTH * 2) return jerr(c, n ? items[0] : NULL, "nested too deeply");
    for (size_t i = 0; i < n; i++) {
        if (exec_node(c, s, items[i])) {
            c->depth--;
            return -1;
        }
        if (c->out->oom || c->out->n > c->max_out) {
            c->depth--;
            return jerr(c, items[i],
                        "out of memory (or over the render size limit) while rendering");
        }
        if (c->ctl) break;
    }
    c->depth--;
    return 0;
}

/* ---- public entry points ----------------------------------------------------------- */

struct jinja_template {
    kiln_arena arena;
    jnode *root;
};

kiln_status jinja_parse(const char *src, size_t len, jinja_template **out, kiln_err *err) {
    *out = NULL;
    size_t bad;
    if (!kiln_utf8_valid(src, len, &bad)) {
        int line = 1, col = 1;
        for (size_t i = 0; i < bad; i++) {
            if (src[i] == '\n')
                line++, col = 1;
            else if (((unsigned char)src[i] & 0xC0) != 0x80)
                col++;
        }
        return kiln_err_set(err, KILN_ERR_FORMAT, "line %d, column %d: template is not valid UTF-8",
                            line, col);
    }
    jinja_template *t = kiln_calloc(1, sizeof *t);
    if (!t) return kiln_err_set(err, KILN_ERR_NOMEM, "template: out of memory");
    kiln_arena_init(&t->arena, 64 * 1024);
    jlexed lx;
    if (jinja_lex(src, len, &t->arena, &lx, err) ||
        jinja_parse_tokens(&lx, &t->arena, &t->root, err)) {
        jinja_free(t);
        return err && err->code ? err->code : KILN_ERR_FORMAT;
    }
    *out = t;
    return KILN_OK;
}

void jinja_free(jinja_template *t) {
    if (!t) return;
    kiln_arena_free(&t->arena);
    kiln_free(t);
}

kiln_status jinja_render(const jinja_template *t, const jinja_vars *vars, char **out,
                         size_t *out_len, kiln_err *err) {
    *out = NULL;
    if (out_len) *out_len = 0;
    kiln_arena a;
    kiln_arena_init(&a, 256 * 1024);
    jbuf b = {0};
    jctx c = {.a = &a, .err = err, .out = &b, .budget = JINJA_DEFAULT_BUDGET};
    if (vars->max_bytes) c.budget = vars->max_bytes;
    c.now_iso = vars->now_iso;
    c.max_out = c.budget;
    c.steps_left = vars->max_steps ? vars->max_steps : JINJA_DEFAULT_STEPS;
    int rc = 0;
    jscope *g = scope_new(&c, NULL);
    if (!g || jinja_add_globals(&c, g)) rc = g ? -1 : jv_oom(&c, NULL);
    c.globals = g;
    for (size_t i = 0; !rc && i < vars->n; i++) {
        jv v;
        if (vars->json[i]) {
            rc = jv_from_json(&c, vars->json[i], &v);
        } else if (vars->str[i]) {
            if (!kiln_utf8_valid(vars->str[i], strlen(vars->str[i]), NULL)) {
                rc = jerr(&c, NULL, "variable '%s' is not valid UTF-8", vars->names[i]);
                break;
            }
            v = jv_str(&c, vars->str[i], strlen(vars->str[i]));
            if (v.type != JV_STR) rc = jv_oom(&c, NULL);
        } else {
            v = jv_bool(vars->boolean[i]);
        }
        if (!rc && jscope_set(&c, g, vars->names[i], v)) rc = jv_oom(&c, NULL);
    }
    if (!rc) {
        /* top-level statements run in a scope below the globals, like jinja2's context */
        jscope *top = scope_new(&c, g);
        if (!top)
            rc = jv_oom(&c, NULL);
        else
            rc = exec_items(&c, top, t->root->items, t->root->n_items);
    }
    kiln_arena_free(&a);
    if (!rc && b.oom) rc = jv_oom(&c, NULL);
    if (rc) {
        jbuf_free(&b);
        return err && err->code ? err->code : KILN_ERR_FORMAT;
    }
    if (!b.p) {
        b.p = kiln_malloc(1);
        if (!b.p) return kiln_err_set(err, KILN_ERR_NOMEM, "template: out of memory");
        b.p[0] = 0;
    }
    *out = b.p;
    if (out_len) *out_len = b.n;
    return KILN_OK;
}

static bool vars_slot(jinja_vars *v, const char *name, size_t *slot) {
    for (size_t i = 0; i < v->n; i++)
        if (!strcmp(v->names[i], name)) {
            *slot = i;
            return true;
        }
    if (v->n >= JINJA_MAX_VARS) return false;
    *slot = v->n++;
    v->names[*slot] = name;
    return true;
}

bool jinja_vars_json(jinja_vars *v, const char *name, const struct json_t *value) {
    size_t i;
    if (!vars_slot(v, name, &i)) return false;
    v->json[i] = value;
    v->str[i] = NULL;
    return true;
}

bool jinja_vars_str(jinja_vars *v, const char *name, const char *value) {
    size_t i;
    if (!vars_slot(v, name, &i)) return false;
    v->json[i] = NULL;
    v->str[i] = value;
    return true;
}

bool jinja_vars_bool(jinja_vars *v, const char *name, bool value) {
    size_t i;
    if (!vars_slot(v, name, &i)) return false;
    v->json[i] = NULL;
    v->str[i] = NULL;
    v->boolean[i] = value;
    return true;
}
