/*
 * jinja_int.h — internals of kiln's Jinja-subset engine, shared by jinja_lex.c,
 * jinja_parse.c, jinja_eval.c, jinja_value.c, jinja_builtins.c and jinja_json.c.
 * Nothing outside src/tok/jinja*.c includes this; the public entry points are in
 * jinja.h.
 *
 * Memory: every value, string and AST node lives in an arena (kiln_arena). The parser
 * owns one arena for the AST (freed with the template); a render owns another for all
 * values it creates (freed when the render ends). Values are small structs passed by
 * value; strings, lists and dicts point into the arena and are immutable once built,
 * except namespaces (`namespace()`), which are the only mutable objects, as in Jinja's
 * ImmutableSandboxedEnvironment.
 *
 * Errors: functions return 0 on success and -1 on failure after filling the context's
 * error (message with "line L, column C"), like jinja2's TemplateSyntaxError /
 * UndefinedError / TypeError / SecurityError / TemplateError.
 */
#ifndef KILN_TOK_JINJA_INT_H
#define KILN_TOK_JINJA_INT_H

#include "base/mem.h"
#include "base/status.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- values ------------------------------------------------------------------------ */

typedef enum jv_type {
    JV_UNDEF = 0, /* jinja2.Undefined: renders as "", fails on attribute access/calls */
    JV_NONE,
    JV_BOOL,
    JV_INT,
    JV_FLOAT,
    JV_STR,
    JV_LIST, /* list or tuple (jlist.tuple) */
    JV_DICT,
    JV_NS,   /* namespace(): mutable attribute bag */
    JV_FUNC, /* builtin, bound method or macro */
    JV_LOOP, /* the `loop` object of a for loop */
} jv_type;

typedef struct jlist jlist;
typedef struct jdict jdict;
typedef struct jctx jctx;
typedef struct jscope jscope;
typedef struct jfunc jfunc;
typedef struct jloop jloop;

typedef struct jv {
    uint8_t type;
    uint8_t unsafe; /* JV_UNDEF: produced by a blocked attribute (SecurityError) */
    uint8_t markup; /* JV_STR: a markupsafe.Markup (from |safe, |escape): `+` escapes */
    union {
        bool b;
        int64_t i;
        double f;
        struct {
            const char *s; /* UTF-8, NUL-terminated, immutable */
            size_t n;
        } str;
        jlist *list;
        jdict *dict; /* JV_DICT and JV_NS */
        jfunc *fn;
        jloop *loop;
        const char *undef_name; /* what was undefined, for messages (may be NULL) */
    } u;
} jv;

/* Lazy objects of Python that jinja2 filters return are lists with a kind, so that
 * kiln fails where Python fails (tojson of a generator, len() of one) and a generator
 * is consumed by its first iteration, as in Python. */
enum {
    JL_LIST = 0,
    JL_ITER,  /* generator / list_reverseiterator: no len, always true, consumed once */
    JL_VIEW,  /* dict_keys / dict_values / dict_items: len, not JSON serializable */
    JL_RANGE, /* range: len, not JSON serializable */
};

struct jlist {
    size_t n, cap;
    jv *items;
    bool tuple;
    uint8_t kind;      /* JL_* */
    const char *kname; /* Python type name for kinds other than JL_LIST */
    size_t pos;        /* JL_ITER: items before pos were consumed */
};

struct jdict {
    size_t n, cap;
    jv *keys;
    jv *vals;
};

/* ---- lexer tokens ------------------------------------------------------------------ */

typedef enum jtok_type {
    JT_EOF = 0,
    JT_DATA,        /* template text */
    JT_VAR_BEGIN,   /* {{ */
    JT_VAR_END,     /* }} */
    JT_BLOCK_BEGIN, /* {% */
    JT_BLOCK_END,   /* %} */
    JT_NAME,
    JT_STRING, /* text holds the unescaped value */
    JT_INT,
    JT_FLOAT,
    JT_OP, /* text holds the operator: + - * / // % ** ~ ( ) [ ] { } . , : | = == != < > <= >= ; */
} jtok_type;

typedef struct jtok {
    uint8_t type;
    int line, col;
    const char *text; /* NUL-terminated, in the parser arena */
    size_t len;
    int64_t ival;
    double fval;
} jtok;

typedef struct jlexed {
    jtok *toks;
    size_t n;
} jlexed;

/* Tokenizes src with trim_blocks and lstrip_blocks on (the Hugging Face settings),
 * normalizing newlines and dropping one trailing newline as jinja2 does. */
int jinja_lex(const char *src, size_t len, kiln_arena *a, jlexed *out, kiln_err *err);

/* ---- AST --------------------------------------------------------------------------- */

typedef enum jnode_kind {
    /* statements */
    JN_BODY,        /* items: statements */
    JN_DATA,        /* str: text */
    JN_OUTPUT,      /* a: expression */
    JN_IF,          /* a: cond, items: then, c: else (JN_BODY or JN_IF for elif) or NULL */
    JN_FOR,         /* target, a: iterable, b: filter cond or NULL, items: body, c: else body */
    JN_SET,         /* target, a: value */
    JN_SETBLOCK,    /* target, items: body, b: filter chain (JN_FILTER with a == NULL) or NULL */
    JN_MACRO,       /* name, params/defaults, items: body */
    JN_CALLBLOCK,   /* a: call expr, params/defaults: caller's, items: body */
    JN_FILTERBLOCK, /* b: filter chain, items: body */
    JN_WITH,        /* targets (names) + kwvals (values), items: body */
    JN_BREAK,
    JN_CONTINUE,
    /* expressions */
    JN_CONST,   /* value */
    JN_NAME,    /* name */
    JN_GETATTR, /* a.name */
    JN_GETITEM, /* a[b] */
    JN_SLICE,   /* a[b:c:d] — b, c, d may be NULL */
    JN_CALL,    /* a(items..., names=kwvals) */
    JN_FILTER,  /* a | name(items..., names=kwvals); a == NULL: applied to a block body */
    JN_TEST,    /* a is [not] name(items...) — op: 1 when negated */
    JN_NOT,     /* not a */
    JN_NEG,     /* -a */
    JN_POS,     /* +a */
    JN_BINOP,   /* a op b: op is one of JOP_* */
    JN_COMPARE, /* a op1 items[0] op2 items[1] ...: ops in cmp_ops */
    JN_AND,
    JN_OR,
    JN_COND, /* b if a else c (c may be NULL: undefined) */
    JN_LIST, /* items */
    JN_TUPLE,
    JN_DICT, /* items: keys, kwvals: values */
} jnode_kind;

enum {
    JOP_ADD = 1,
    JOP_SUB,
    JOP_MUL,
    JOP_DIV,
    JOP_FLOORDIV,
    JOP_MOD,
    JOP_POW,
    JOP_CONCAT,
    JOP_EQ,
    JOP_NE,
    JOP_LT,
    JOP_LE,
    JOP_GT,
    JOP_GE,
    JOP_IN,
    JOP_NOTIN,
};

typedef struct jnode jnode;
typedef int (*jfilter_fn)(jctx *c, const jnode *at, jv in, jv *args, size_t nargs, const char **kwn,
                          jv *kwv, size_t nkw, jv *out);
typedef int (*jtest_fn)(jctx *c, const jnode *at, jv in, jv *args, size_t nargs, bool *out);

struct jnode {
    uint8_t kind;
    uint8_t op;
    int line, col;
    const char *name;
    jv value;
    jnode *a, *b, *c, *d;
    jnode *target; /* JN_NAME, JN_GETATTR (namespace) or JN_TUPLE of JN_NAME */
    jnode **items;
    size_t n_items;
    const char **names; /* kwargs names, macro/caller param names, with-targets */
    jnode **kwvals;     /* kwargs values, param defaults (NULL: none), dict values */
    size_t n_kw;
    uint8_t *cmp_ops;  /* JN_COMPARE: one per items[] */
    jfilter_fn filter; /* JN_FILTER: resolved at parse time (unknown names fail there) */
    jtest_fn test;     /* JN_TEST */
    /* macro/caller bodies: which special names they reference */
    bool uses_caller, uses_varargs, uses_kwargs;
};

/* Parses tokens into an AST; unknown filters/tests and unsupported statements are
 * errors with line and column. */
int jinja_parse_tokens(const jlexed *lx, kiln_arena *a, jnode **root, kiln_err *err);

/* ---- functions --------------------------------------------------------------------- */

typedef int (*jbuiltin_fn)(jctx *c, const jnode *at, jv self, jv *args, size_t nargs,
                           const char **kwn, jv *kwv, size_t nkw, jv *out);

struct jfunc {
    const char *name;
    jbuiltin_fn builtin; /* NULL for macros */
    jv self;             /* bound object for methods */
    const jnode *macro;  /* JN_MACRO or JN_CALLBLOCK (caller) */
    jscope *closure;
    jv caller;        /* the caller a macro gets from a call block (JV_UNDEF if none) */
    bool unsafe_call; /* calling it raises SecurityError (mutating method) */
};

struct jloop {
    jlist *items;
    size_t index0;
    int depth;
    jv last_changed;
    bool has_changed;
};

/* ---- render context ---------------------------------------------------------------- */

typedef struct jbuf {
    char *p;
    size_t n, cap;
    bool oom;
} jbuf;

struct jscope {
    jscope *parent;
    size_t n, cap;
    const char **names;
    jv *vals;
};

struct jctx {
    kiln_arena *a;
    kiln_err *err;
    jscope *globals;     /* the context: messages, tools, ..., range, namespace, ... */
    jbuf *out;           /* where output goes (swapped for macros, set blocks, filters) */
    int depth;           /* recursion depth (macros, nested expressions) */
    size_t budget;       /* bytes of values we may still allocate */
    const char *now_iso; /* strftime_now time (NULL: local time) */
    int ctl;             /* 1 break, 2 continue pending */
    uint64_t steps_left; /* evaluation steps before the render is stopped */
    size_t max_out;      /* output bytes limit (per buffer) */
};

#define JINJA_MAX_DEPTH      200
#define JINJA_MAX_RANGE      1000000
#define JINJA_DEFAULT_BUDGET ((size_t)1 << 30)
#define JINJA_DEFAULT_STEPS  ((uint64_t)100000000)

#define JTRY(expr)                                                                                 \
    do {                                                                                           \
        if ((expr) != 0) return -1;                                                                \
    } while (0)

/* errors: fill c->err with "line L, column C: <msg>" and return -1 */
int jerr(jctx *c, const jnode *at, const char *fmt, ...) KILN_PRINTF(3, 4);

/* buffers */
void jbuf_put(jbuf *b, const char *s, size_t n);
void jbuf_putc(jbuf *b, char ch);
void jbuf_puts(jbuf *b, const char *s);
void jbuf_printf(jbuf *b, const char *fmt, ...) KILN_PRINTF(2, 3);
void jbuf_free(jbuf *b);

/* value construction (arena-backed; NULL/JV_UNDEF results only on out-of-memory, which
 * the caller reports through jv_oom) */
jv jv_undef(const char *name);
jv jv_none(void);
jv jv_bool(bool b);
jv jv_int(int64_t i);
jv jv_float(double f);
jv jv_str(jctx *c, const char *s, size_t n); /* copies */
jv jv_str_lit(const char *s);                /* static / arena string, not copied */
jv jv_str_buf(jctx *c, jbuf *b);             /* copies the buffer and frees it */
jlist *jl_new(jctx *c, size_t cap);
int jl_push(jctx *c, jlist *l, jv v);
jv jv_list(jlist *l);
jdict *jd_new(jctx *c, size_t cap);
int jd_set(jctx *c, jdict *d, jv key, jv val); /* replaces an existing key */
bool jd_get(const jdict *d, jv key, jv *out);
bool jd_get_str(const jdict *d, const char *key, jv *out);
jv jv_dict(jdict *d);
jv jv_func(jctx *c, const char *name, jbuiltin_fn fn, jv self);
int jv_oom(jctx *c, const jnode *at);
void *jalloc(jctx *c, size_t n);

/* Python semantics */
bool jv_truthy(jv v);
bool jv_eq(jv a, jv b);
/* <0, 0, >0; -1 return with error when the types do not order */
int jv_cmp(jctx *c, const jnode *at, jv a, jv b, int *out);
const char *jv_type_name(jv v); /* Python type name: 'str', 'int', 'dict', ... */
bool jv_is_num(jv v);           /* int, float or bool */
double jv_num(jv v);
/* str(v) and repr(v) appended to b */
void jv_str_into(jbuf *b, jv v);
void jv_repr_into(jbuf *b, jv v);
/* str(v) as a value (strings returned as is) */
jv jv_to_str(jctx *c, jv v);
/* number of code points of a UTF-8 string */
size_t ju_len(const char *s, size_t n);
/* byte offset of code point index i (i <= length) */
size_t ju_offset(const char *s, size_t n, size_t i);
void jfloat_repr(double f, char out[32]);

/* iteration: list of the items `for x in v` visits; error for non-iterables */
int jv_iter(jctx *c, const jnode *at, jv v, jlist **out);
int64_t jv_len(jv v, bool *ok);
/* Fails for values whose Python str() kiln cannot reproduce (generators: addresses). */
int jv_check_printable(jctx *c, const jnode *at, jv v);
/* Marks a list as a lazy object of the given kind and Python type name. */
jv jv_lazy(jlist *l, int kind, const char *kname);
/* HTML escaping as markupsafe.escape (for |escape and Markup + str) */
void jhtml_escape_into(jbuf *b, const char *s, size_t n);

/* JSON (jansson in, Python json.dumps out) */
struct json_t;
int jv_from_json(jctx *c, const struct json_t *j, jv *out);
int jv_tojson(jctx *c, const jnode *at, jbuf *b, jv v, int indent, const char *item_sep,
              const char *key_sep, bool sort_keys, bool ascii, int level);

/* builtins (jinja_builtins.c, jinja_filters.c) */
jfilter_fn jinja_find_filter(const char *name);
jtest_fn jinja_find_test(const char *name);
/* Attribute lookup with sandbox rules (methods of str/list/dict, then keys). */
int jinja_getattr(jctx *c, const jnode *at, jv obj, const char *name, jv *out);
int jinja_getitem(jctx *c, const jnode *at, jv obj, jv key, jv *out);
/* Adds range, namespace, dict, raise_exception, strftime_now to a scope. */
int jinja_add_globals(jctx *c, jscope *s);
int jscope_set(jctx *c, jscope *s, const char *name, jv v);

/* evaluator entry points used by filters that call back (map with a filter name etc.) */
int jinja_call(jctx *c, const jnode *at, jv fn, jv *args, size_t nargs, const char **kwn, jv *kwv,
               size_t nkw, jv *out);

#endif /* KILN_TOK_JINJA_INT_H */
