/*
 * select.c — the selection pipeline (policy lock -> cache -> filter -> score), reason
 * messages, the sharded selection cache, and the selector's state (policy, PerfDB
 * table, circuit-breaker health bits).
 *
 * Cache soundness: a key holds every field of kiln_sel_ctx exactly (validity fields and
 * the performance buckets alike) plus the selector's state hash (registry incl. provider
 * availability and descriptor hashes, policy, PerfDB table, health generation), and a hit
 * needs the whole key to compare equal (memcmp), not just its hash. So a context that
 * differs in any field, or a selector whose state changed, never hits.
 */
#include "kernels/select.h"
#include "base/mem.h"

#include "base/cpu.h"
#include "base/hash.h"
#include "base/log.h"
#include "kernels/perfdb.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- buckets ---- */

static const int64_t tok_max[KILN_TOK_BUCKETS] = {1, 8, 64, 512, INT64_MAX};
static const int64_t seq_max_b[KILN_SEQ_BUCKETS] = {512, 4096, 32768, INT64_MAX};
static const char *const tok_names[KILN_TOK_BUCKETS] = {"1", "2-8", "9-64", "65-512", ">512"};
static const char *const seq_names[KILN_SEQ_BUCKETS] = {"<=512", "<=4K", "<=32K", ">32K"};

int64_t kiln_tok_bucket_max(int b) {
    return b >= 0 && b < KILN_TOK_BUCKETS ? tok_max[b] : INT64_MAX;
}
int64_t kiln_seq_bucket_max(int b) {
    return b >= 0 && b < KILN_SEQ_BUCKETS ? seq_max_b[b] : INT64_MAX;
}
const char *kiln_tok_bucket_name(int b) {
    return b >= 0 && b < KILN_TOK_BUCKETS ? tok_names[b] : "?";
}
const char *kiln_seq_bucket_name(int b) {
    return b >= 0 && b < KILN_SEQ_BUCKETS ? seq_names[b] : "?";
}
bool kiln_tok_bucket_from_name(const char *s, int *out) {
    for (int i = 0; i < KILN_TOK_BUCKETS; i++)
        if (s && strcmp(s, tok_names[i]) == 0) {
            *out = i;
            return true;
        }
    return false;
}

void kiln_sel_ctx_init(kiln_sel_ctx *c, kiln_kop op, kiln_backend_id backend) {
    memset(c, 0, sizeof *c);
    c->op = op;
    c->backend = backend;
    c->isa = kiln_backend_platform(backend) == KILN_PLATFORM_HOST ? kiln_cpu_info()->isa : 0;
    c->w_dtype = KILN_DTYPE_NONE;
    c->kv_dtype = KILN_DTYPE_NONE;
    c->act_dtype = KILN_DTYPE_F32;
    c->tokens_max = 1;
}

void kiln_sel_ctx_set_bucket(kiln_sel_ctx *c, int tb, int sb, int64_t max_tokens, int64_t max_seq) {
    c->tok_bucket = tb;
    c->seq_bucket = sb;
    int64_t t = tok_max[tb];
    if (max_tokens > 0 && t > max_tokens) t = max_tokens;
    c->tokens_max = t;
    int64_t s = seq_max_b[sb];
    if (max_seq > 0 && s > max_seq) s = max_seq;
    c->seq_max = c->op == KILN_KOP_ATTENTION ? s : 0;
}

/* ---- reasons ---- */

static const char *const reason_names[KILN_REASON_COUNT] = {
    "PLATFORM_MISMATCH",    "ISA_MISSING",
    "SM_TOO_OLD",           "SM_TOO_NEW",
    "DTYPE_UNSUPPORTED",    "HEAD_DIM_INVALID",
    "HEAD_DIM_ALIGNMENT",   "SEQ_TOO_LONG",
    "GQA_UNSUPPORTED",      "FEATURE_UNSUPPORTED",
    "NON_DETERMINISTIC",    "NOT_BATCH_INVARIANT",
    "GRAPH_UNSAFE",         "WORKSPACE_EXCEEDS_HEADROOM",
    "PROVIDER_UNAVAILABLE", "BACKEND_UNHEALTHY",
    "POLICY_AVOIDED",       "POLICY_LOCKED",
    "TOO_MANY_TOKENS",      "SHAPE_ALIGNMENT",
};

const char *kiln_reason_name(kiln_reason r) {
    return (unsigned)r < KILN_REASON_COUNT ? reason_names[r] : "UNKNOWN";
}

/* ---- the selector ---- */

enum { CACHE_SHARDS = 16, SHARD_SLOTS = 512 };

typedef struct sel_key {
    uint64_t state;
    int32_t op, backend;
    uint32_t isa;
    int32_t sm;
    uint32_t w_dtype, act_dtype, kv_dtype;
    int32_t tok_bucket, seq_bucket;
    int32_t head_dim, n_head, n_kv_head;
    int64_t tokens_max, seq_max, n, k;
    uint32_t features, flags;
    uint64_t headroom;
} sel_key;

typedef struct cache_slot {
    uint64_t hash; /* 0 = empty */
    sel_key key;
    int32_t chosen;
    uint8_t fallback, locked, lock_src;
    float score;
} cache_slot;

typedef struct cache_shard {
    pthread_mutex_t mu;
    int used;
    cache_slot slots[SHARD_SLOTS];
} cache_shard;

#define HEALTH_WORDS ((KILN_REG_MAX_KERNELS + 63) / 64)

struct kiln_selector {
    const kiln_registry *reg;
    const kiln_policy *policy;
    kiln_policy default_policy;
    const kiln_perf_table *perf;
    _Atomic uint64_t health[HEALTH_WORDS];
    _Atomic uint64_t health_gen;
    _Atomic uint64_t state; /* hash of everything that affects choices */
    _Atomic uint64_t hits, misses;
    cache_shard shards[CACHE_SHARDS];
};

static void recompute_state(kiln_selector *s) {
    uint64_t h = kiln_hash_combine(s->reg->hash, s->policy->hash);
    h = kiln_hash_combine(h, s->perf ? kiln_perf_table_hash(s->perf) : 0x9e3779b97f4a7c15ull);
    h = kiln_hash_combine(h, atomic_load(&s->health_gen));
    atomic_store(&s->state, h);
}

static void cache_clear(kiln_selector *s) {
    for (int i = 0; i < CACHE_SHARDS; i++) {
        cache_shard *sh = &s->shards[i];
        pthread_mutex_lock(&sh->mu);
        memset(sh->slots, 0, sizeof sh->slots);
        sh->used = 0;
        pthread_mutex_unlock(&sh->mu);
    }
}

kiln_status kiln_selector_new(const kiln_registry *reg, const kiln_policy *policy,
                              const kiln_perf_table *perf, kiln_selector **out, kiln_err *err) {
    *out = NULL;
    if (!reg) return kiln_err_set(err, KILN_ERR_INVALID_ARG, "selector: no registry");
    kiln_selector *s = kiln_calloc(1, sizeof *s);
    if (!s) return kiln_err_set(err, KILN_ERR_NOMEM, "selector: out of memory");
    s->reg = reg;
    kiln_policy_init(&s->default_policy);
    s->policy = policy ? policy : &s->default_policy;
    s->perf = perf;
    for (int i = 0; i < CACHE_SHARDS; i++) pthread_mutex_init(&s->shards[i].mu, NULL);
    recompute_state(s);
    *out = s;
    return KILN_OK;
}

void kiln_selector_free(kiln_selector *s) {
    if (!s) return;
    for (int i = 0; i < CACHE_SHARDS; i++) pthread_mutex_destroy(&s->shards[i].mu);
    kiln_free(s);
}

const kiln_registry *kiln_selector_registry(const kiln_selector *s) {
    return s->reg;
}
const kiln_policy *kiln_selector_policy(const kiln_selector *s) {
    return s->policy;
}
const kiln_perf_table *kiln_selector_perf(const kiln_selector *s) {
    return s->perf;
}

void kiln_selector_set_policy(kiln_selector *s, const kiln_policy *policy) {
    s->policy = policy ? policy : &s->default_policy;
    recompute_state(s);
    cache_clear(s);
}

void kiln_selector_set_perf(kiln_selector *s, const kiln_perf_table *perf) {
    s->perf = perf;
    recompute_state(s);
    cache_clear(s);
}

void kiln_selector_mark_unhealthy(kiln_selector *s, int ki) {
    if (ki < 0 || ki >= KILN_REG_MAX_KERNELS) return;
    atomic_fetch_or(&s->health[ki / 64], 1ull << (ki % 64));
    atomic_fetch_add(&s->health_gen, 1);
    recompute_state(s);
    cache_clear(s);
}

void kiln_selector_clear_health(kiln_selector *s) {
    for (int i = 0; i < HEALTH_WORDS; i++) atomic_store(&s->health[i], 0);
    atomic_fetch_add(&s->health_gen, 1);
    recompute_state(s);
    cache_clear(s);
}

bool kiln_selector_is_healthy(const kiln_selector *s, int ki) {
    if (ki < 0 || ki >= KILN_REG_MAX_KERNELS) return true;
    return !(atomic_load(&((kiln_selector *)s)->health[ki / 64]) & (1ull << (ki % 64)));
}

void kiln_selector_cache_stats(const kiln_selector *s, uint64_t *hits, uint64_t *misses) {
    kiln_selector *m = (kiln_selector *)s;
    if (hits) *hits = atomic_load(&m->hits);
    if (misses) *misses = atomic_load(&m->misses);
}

uint64_t kiln_selector_state_hash(const kiln_selector *s) {
    return atomic_load(&((kiln_selector *)s)->state);
}

/* ---- policy helpers ---- */

static bool rule_matches(const kiln_policy_rule *r, const kiln_sel_ctx *c) {
    if (r->op >= 0 && r->op != (int)c->op) return false;
    if (r->backend >= 0 && r->backend != (int)c->backend) return false;
    if (r->w_dtypes && (c->w_dtype >= 64 || !(r->w_dtypes & KILN_DT(c->w_dtype)))) return false;
    if (r->tok_buckets && !(r->tok_buckets & (1u << c->tok_bucket))) return false;
    if (r->isa && (c->isa & r->isa) != r->isa) return false;
    if (r->sm_min && c->sm < r->sm_min) return false;
    if (r->sm_max && c->sm > r->sm_max) return false;
    return true;
}

static bool list_matches(const kiln_name_list *l, const kiln_kernel_spec *s, int *index) {
    for (int i = 0; i < l->n; i++)
        if (kiln_policy_name_matches(l->name[i], s)) {
            if (index) *index = i;
            return true;
        }
    return false;
}

/* avoided by the global list or a matching rule */
static bool is_avoided(const kiln_policy *p, const kiln_sel_ctx *c, const kiln_kernel_spec *s) {
    if (list_matches(&p->avoid, s, NULL)) return true;
    for (int i = 0; i < p->n_rules; i++)
        if (rule_matches(&p->rules[i], c) && list_matches(&p->rules[i].avoid, s, NULL)) return true;
    return false;
}

/* preference bonus: matching rules' prefer lists rank first, then the global list */
static double prefer_bonus(const kiln_policy *p, const kiln_sel_ctx *c, const kiln_kernel_spec *s) {
    int rank = 0, idx;
    for (int i = 0; i < p->n_rules; i++) {
        if (!rule_matches(&p->rules[i], c)) continue;
        if (list_matches(&p->rules[i].prefer, s, &idx)) {
            rank += idx;
            goto found;
        }
        rank += p->rules[i].prefer.n;
    }
    if (list_matches(&p->prefer, s, &idx)) {
        rank += idx;
        goto found;
    }
    return 0.0;
found : {
    double b = KILN_SCORE_PREFER_FIRST - 10.0 * rank;
    return b < 10.0 ? 10.0 : b;
}
}

/* the lock for this context: env > first matching rule > file */
static const char *find_lock(const kiln_policy *p, const kiln_sel_ctx *c, int *src) {
    if (p->locks[c->op][0] && p->lock_src[c->op] == KILN_POLICY_SRC_ENV) {
        *src = KILN_POLICY_SRC_ENV;
        return p->locks[c->op];
    }
    for (int i = 0; i < p->n_rules; i++)
        if (p->rules[i].lock[0] && rule_matches(&p->rules[i], c)) {
            *src = KILN_POLICY_SRC_RULE;
            return p->rules[i].lock;
        }
    if (p->locks[c->op][0]) {
        *src = p->lock_src[c->op];
        return p->locks[c->op];
    }
    return NULL;
}

/* ---- filter ---- */

static uint64_t effective_headroom(const kiln_selector *s, const kiln_sel_ctx *c) {
    uint64_t a = c->headroom_bytes, b = s->policy->headroom_bytes;
    if (!a) return b;
    if (!b) return a;
    return a < b ? a : b;
}

static bool want_deterministic(const kiln_selector *s, const kiln_sel_ctx *c) {
    return c->deterministic || s->policy->deterministic;
}
static bool want_batch_invariant(const kiln_selector *s, const kiln_sel_ctx *c) {
    return c->batch_invariant || s->policy->deterministic;
}

static bool dt_in(uint64_t mask, uint32_t dt) {
    return dt < 64 && (mask & KILN_DT(dt));
}

static uint32_t check_kernel(const kiln_selector *s, const kiln_reg_kernel *k,
                             const kiln_sel_ctx *c) {
    const kiln_kernel_spec *sp = &k->spec;
    uint32_t r = 0;
#define FAIL(code) (r |= KILN_REASON_BIT(KILN_REASON_##code))
    if (sp->platform != kiln_backend_platform(c->backend) ||
        (sp->backends && !(sp->backends & KILN_BACKEND_BIT(c->backend))) ||
        (c->backend == KILN_BACKEND_REF && !s->reg->providers[k->provider].p->fallback))
        FAIL(PLATFORM_MISMATCH);
    if (sp->platform == KILN_PLATFORM_HOST && (c->isa & sp->isa) != sp->isa) FAIL(ISA_MISSING);
    if (sp->platform == KILN_PLATFORM_CUDA) {
        if (sp->sm_min && c->sm < sp->sm_min) FAIL(SM_TOO_OLD);
        if (sp->sm_max && c->sm > sp->sm_max) FAIL(SM_TOO_NEW);
    }
    if ((c->w_dtype != KILN_DTYPE_NONE && !dt_in(sp->w_dtypes, c->w_dtype)) ||
        !dt_in(sp->act_dtypes, c->act_dtype) ||
        (c->kv_dtype != KILN_DTYPE_NONE && !dt_in(sp->kv_dtypes, c->kv_dtype)))
        FAIL(DTYPE_UNSUPPORTED);
    if (c->head_dim > 0) {
        if ((sp->head_dim_min && c->head_dim < sp->head_dim_min) ||
            (sp->head_dim_max && c->head_dim > sp->head_dim_max))
            FAIL(HEAD_DIM_INVALID);
        if (sp->head_dim_multiple && c->head_dim % sp->head_dim_multiple) FAIL(HEAD_DIM_ALIGNMENT);
    }
    if (sp->max_seq && c->seq_max > sp->max_seq) FAIL(SEQ_TOO_LONG);
    if ((c->features & KILN_KFEAT_GQA) && !(sp->features & KILN_KFEAT_GQA)) FAIL(GQA_UNSUPPORTED);
    if (sp->max_gqa && c->n_kv_head > 0 && c->n_head / c->n_kv_head > sp->max_gqa)
        FAIL(GQA_UNSUPPORTED);
    if (c->features & ~KILN_KFEAT_GQA & ~sp->features) FAIL(FEATURE_UNSUPPORTED);
    if (want_deterministic(s, c) && !(sp->props & KILN_KPROP_DETERMINISTIC))
        FAIL(NON_DETERMINISTIC);
    if (want_batch_invariant(s, c) && !(sp->props & KILN_KPROP_BATCH_INVARIANT))
        FAIL(NOT_BATCH_INVARIANT);
    if (c->graph_capture && !(sp->props & KILN_KPROP_GRAPH_SAFE)) FAIL(GRAPH_UNSAFE);
    uint64_t headroom = effective_headroom(s, c);
    if (headroom && sp->workspace && sp->workspace(c) > headroom) FAIL(WORKSPACE_EXCEEDS_HEADROOM);
    if (!kiln_registry_kernel_available(s->reg, k)) FAIL(PROVIDER_UNAVAILABLE);
    if (!kiln_selector_is_healthy(s, k->index)) FAIL(BACKEND_UNHEALTHY);
    if (sp->max_tokens && c->tokens_max > sp->max_tokens) FAIL(TOO_MANY_TOKENS);
    if ((sp->k_multiple && c->k % sp->k_multiple) || (sp->n_multiple && c->n % sp->n_multiple))
        FAIL(SHAPE_ALIGNMENT);
    if (s->policy->reference_only) {
        if (!s->reg->providers[k->provider].p->fallback) FAIL(POLICY_AVOIDED);
    } else if (is_avoided(s->policy, c, sp) && !s->reg->providers[k->provider].p->fallback) {
        FAIL(POLICY_AVOIDED);
    }
#undef FAIL
    return r;
}

uint32_t kiln_select_check(const kiln_selector *s, const kiln_reg_kernel *k,
                           const kiln_sel_ctx *c) {
    return check_kernel(s, k, c);
}

/* ---- messages ---- */

static void dtype_set_names(uint64_t mask, char *buf, size_t n) {
    size_t w = 0;
    buf[0] = 0;
    for (int i = 0; i < 64 && w < n; i++)
        if (mask & (1ull << i)) {
            int m = snprintf(buf + w, n - w, "%s%s", w ? "," : "", kiln_dtype_name((uint32_t)i));
            if (m < 0) break;
            w += (size_t)m;
        }
    if (!w) snprintf(buf, n, "none");
}

static void feat_names(uint32_t mask, char *buf, size_t n) {
    size_t w = 0;
    buf[0] = 0;
    for (int i = 0; i < 32 && w < n; i++)
        if (mask & (1u << i)) {
            const char *nm = kiln_kfeat_name(1u << i);
            int m = snprintf(buf + w, n - w, "%s%s", w ? "," : "", nm ? nm : "?");
            if (m < 0) break;
            w += (size_t)m;
        }
}

void kiln_reason_message(kiln_reason r, const kiln_selector *s, const kiln_reg_kernel *k,
                         const kiln_sel_ctx *c, char *buf, size_t n) {
    const kiln_kernel_spec *sp = &k->spec;
    char a[256], b[256];
    switch (r) {
    case KILN_REASON_PLATFORM_MISMATCH:
        if (c->backend == KILN_BACKEND_REF && sp->platform == KILN_PLATFORM_HOST)
            snprintf(buf, n, "the ref backend runs the reference kernels only");
        else
            snprintf(buf, n, "runs on %s, call site is on backend %s",
                     kiln_platform_name(sp->platform), kiln_backend_name(c->backend));
        break;
    case KILN_REASON_ISA_MISSING:
        kiln_isa_names(sp->isa & ~c->isa, a, sizeof a);
        snprintf(buf, n, "needs %s", a);
        break;
    case KILN_REASON_SM_TOO_OLD:
        snprintf(buf, n, "needs sm_%d+, device is sm_%d", sp->sm_min, c->sm);
        break;
    case KILN_REASON_SM_TOO_NEW:
        snprintf(buf, n, "supports up to sm_%d, device is sm_%d", sp->sm_max, c->sm);
        break;
    case KILN_REASON_DTYPE_UNSUPPORTED:
        if (c->w_dtype != KILN_DTYPE_NONE && !dt_in(sp->w_dtypes, c->w_dtype)) {
            dtype_set_names(sp->w_dtypes, a, sizeof a);
            snprintf(buf, n, "weights %s not in {%s}", kiln_dtype_name(c->w_dtype), a);
        } else if (c->kv_dtype != KILN_DTYPE_NONE && !dt_in(sp->kv_dtypes, c->kv_dtype)) {
            dtype_set_names(sp->kv_dtypes, a, sizeof a);
            snprintf(buf, n, "KV %s not in {%s}", kiln_dtype_name(c->kv_dtype), a);
        } else {
            dtype_set_names(sp->act_dtypes, a, sizeof a);
            snprintf(buf, n, "activations %s not in {%s}", kiln_dtype_name(c->act_dtype), a);
        }
        break;
    case KILN_REASON_HEAD_DIM_INVALID:
        snprintf(buf, n, "head dim %d outside [%d, %d]", c->head_dim, sp->head_dim_min,
                 sp->head_dim_max);
        break;
    case KILN_REASON_HEAD_DIM_ALIGNMENT:
        snprintf(buf, n, "head dim %d not a multiple of %d", c->head_dim, sp->head_dim_multiple);
        break;
    case KILN_REASON_SEQ_TOO_LONG:
        snprintf(buf, n, "context up to %lld > max %lld", (long long)c->seq_max,
                 (long long)sp->max_seq);
        break;
    case KILN_REASON_GQA_UNSUPPORTED:
        if (sp->features & KILN_KFEAT_GQA)
            snprintf(buf, n, "group of %d query heads per KV head > max %d",
                     c->n_kv_head > 0 ? c->n_head / c->n_kv_head : 0, sp->max_gqa);
        else
            snprintf(buf, n, "no GQA (%d query heads on %d KV heads)", c->n_head, c->n_kv_head);
        break;
    case KILN_REASON_FEATURE_UNSUPPORTED:
        feat_names(c->features & ~KILN_KFEAT_GQA & ~sp->features, a, sizeof a);
        snprintf(buf, n, "lacks %s", a);
        break;
    case KILN_REASON_NON_DETERMINISTIC:
        snprintf(buf, n, "not deterministic");
        break;
    case KILN_REASON_NOT_BATCH_INVARIANT:
        snprintf(buf, n, "not batch-invariant");
        break;
    case KILN_REASON_GRAPH_UNSAFE:
        snprintf(buf, n, "not CUDA-graph safe");
        break;
    case KILN_REASON_WORKSPACE_EXCEEDS_HEADROOM:
        snprintf(buf, n, "workspace %zu B > headroom %llu B", sp->workspace ? sp->workspace(c) : 0,
                 (unsigned long long)effective_headroom(s, c));
        break;
    case KILN_REASON_PROVIDER_UNAVAILABLE: {
        const kiln_reg_provider *rp = &s->reg->providers[k->provider];
        if (!rp->available)
            snprintf(buf, n, "%s: %s", rp->p->name, rp->why);
        else if (k->undeclared)
            snprintf(buf, n, "not declared in %s", rp->descriptor_path);
        else
            snprintf(buf, n, "not built into this binary");
        break;
    }
    case KILN_REASON_BACKEND_UNHEALTHY:
        snprintf(buf, n, "failed at run time (circuit breaker)");
        break;
    case KILN_REASON_POLICY_AVOIDED:
        snprintf(buf, n, "%s",
                 s->policy->reference_only ? "policy: reference_only" : "policy: avoided");
        break;
    case KILN_REASON_POLICY_LOCKED:
        snprintf(buf, n, "policy locks another kernel");
        break;
    case KILN_REASON_TOO_MANY_TOKENS:
        snprintf(buf, n, "up to %lld tokens > max %lld", (long long)c->tokens_max,
                 (long long)sp->max_tokens);
        break;
    case KILN_REASON_SHAPE_ALIGNMENT:
        snprintf(b, sizeof b, "n=%lld k=%lld", (long long)c->n, (long long)c->k);
        snprintf(buf, n, "%s not multiples of n%%%d k%%%d", b, sp->n_multiple, sp->k_multiple);
        break;
    default:
        snprintf(buf, n, "?");
        break;
    }
}

void kiln_reasons_format(uint32_t mask, const kiln_selector *s, const kiln_reg_kernel *k,
                         const kiln_sel_ctx *c, char *buf, size_t n) {
    size_t w = 0;
    buf[0] = 0;
    for (int r = 0; r < KILN_REASON_COUNT && w < n; r++) {
        if (!(mask & KILN_REASON_BIT(r))) continue;
        char m[320];
        kiln_reason_message((kiln_reason)r, s, k, c, m, sizeof m);
        int x = snprintf(buf + w, n - w, "%s%s (%s)", w ? "; " : "", reason_names[r], m);
        if (x < 0) break;
        w += (size_t)x;
    }
}

/* ---- cache ---- */

static void make_key(const kiln_selector *s, const kiln_sel_ctx *c, sel_key *k) {
    memset(k, 0, sizeof *k);
    k->state = kiln_selector_state_hash(s);
    k->op = (int32_t)c->op;
    k->backend = (int32_t)c->backend;
    k->isa = c->isa;
    k->sm = c->sm;
    k->w_dtype = c->w_dtype;
    k->act_dtype = c->act_dtype;
    k->kv_dtype = c->kv_dtype;
    k->tok_bucket = c->tok_bucket;
    k->seq_bucket = c->seq_bucket;
    k->head_dim = c->head_dim;
    k->n_head = c->n_head;
    k->n_kv_head = c->n_kv_head;
    k->tokens_max = c->tokens_max;
    k->seq_max = c->seq_max;
    k->n = c->n;
    k->k = c->k;
    k->features = c->features;
    k->flags = (uint32_t)c->deterministic | (uint32_t)c->batch_invariant << 1 |
               (uint32_t)c->graph_capture << 2;
    k->headroom = c->headroom_bytes;
}

static bool cache_get(kiln_selector *s, const sel_key *key, uint64_t h, cache_slot *out) {
    cache_shard *sh = &s->shards[h % CACHE_SHARDS];
    bool found = false;
    pthread_mutex_lock(&sh->mu);
    for (uint32_t i = 0, j = (uint32_t)(h >> 8) % SHARD_SLOTS; i < SHARD_SLOTS;
         i++, j = (j + 1) % SHARD_SLOTS) {
        cache_slot *sl = &sh->slots[j];
        if (!sl->hash) break;
        if (sl->hash == h && memcmp(&sl->key, key, sizeof *key) == 0) {
            *out = *sl;
            found = true;
            break;
        }
    }
    pthread_mutex_unlock(&sh->mu);
    return found;
}

static void cache_put(kiln_selector *s, const sel_key *key, uint64_t h, const cache_slot *v) {
    cache_shard *sh = &s->shards[h % CACHE_SHARDS];
    pthread_mutex_lock(&sh->mu);
    if (sh->used >= SHARD_SLOTS * 3 / 4) { /* full: start over (rare; bind-time only) */
        memset(sh->slots, 0, sizeof sh->slots);
        sh->used = 0;
    }
    for (uint32_t i = 0, j = (uint32_t)(h >> 8) % SHARD_SLOTS; i < SHARD_SLOTS;
         i++, j = (j + 1) % SHARD_SLOTS) {
        cache_slot *sl = &sh->slots[j];
        if (sl->hash == h && memcmp(&sl->key, key, sizeof *key) == 0) break; /* present */
        if (!sl->hash) {
            *sl = *v;
            sl->hash = h;
            sl->key = *key;
            sh->used++;
            break;
        }
    }
    pthread_mutex_unlock(&sh->mu);
}

/* ---- scoring and selection ---- */

static void perf_adjust(const kiln_selector *s, const kiln_sel_ctx *c, kiln_sel_cand *cands,
                        int n) {
    if (!s->perf) return;
    uint32_t dt = kiln_perf_ctx_dtype(c);
    char shape[48];
    kiln_perf_ctx_shape(c, shape, sizeof shape);
    const kiln_perf_rec *recs[KILN_REG_MAX_PER_OP] = {0};
    double fastest = 0;
    int measured = 0;
    for (int i = 0; i < n; i++) {
        if (cands[i].reasons) continue;
        recs[i] = kiln_perf_table_find(s->perf, cands[i].k->id_hash, (int)c->op, dt, shape,
                                       c->tok_bucket, c->seq_bucket);
        if (!recs[i] || !(recs[i]->median_us > 0)) {
            recs[i] = NULL;
            continue;
        }
        cands[i].perf_us = recs[i]->median_us;
        if (!measured || recs[i]->median_us < fastest) fastest = recs[i]->median_us;
        measured++;
    }
    if (measured < 2) return; /* nothing to compare against */
    for (int i = 0; i < n; i++) {
        const kiln_perf_rec *r = recs[i];
        if (!r) continue;
        double ratio = r->median_us / fastest;
        double cv = r->variance_us2 > 0 ? sqrt(r->variance_us2) / r->median_us : 0.0;
        double conf = ((double)r->samples / ((double)r->samples + 4.0)) / (1.0 + cv);
        double raw = KILN_SCORE_PERF_MAX_BONUS - 40.0 * (ratio - 1.0);
        if (raw < -KILN_SCORE_PERF_MAX_MALUS) raw = -KILN_SCORE_PERF_MAX_MALUS;
        cands[i].perf_adj = conf * raw;
    }
}

static int cand_order(const void *pa_, const void *pb_) {
    const kiln_sel_cand *a = pa_, *b = pb_;
    /* valid before rejected; higher score first; then registry order */
    if (!a->reasons != !b->reasons) return a->reasons ? 1 : -1;
    if (!a->reasons && a->score != b->score) return a->score > b->score ? -1 : 1;
    int pa = __builtin_popcount(a->reasons), pb = __builtin_popcount(b->reasons);
    if (pa != pb) return pa - pb;
    return a->k->index - b->k->index;
}

static kiln_status no_kernel_error(const kiln_selector *s, const kiln_sel_ctx *c,
                                   const kiln_sel_result *res, const char *why, kiln_err *err) {
    char msg[KILN_ERR_MSG_MAX];
    size_t w = 0;
    int x = snprintf(msg, sizeof msg, "no kernel for %s on %s (%s)", kiln_kop_name(c->op),
                     kiln_backend_name(c->backend), why);
    w = x > 0 ? (size_t)x : 0;
    for (int i = 0; i < res->n_cands && w < sizeof msg; i++) {
        char r[400];
        kiln_reasons_format(res->cands[i].reasons, s, res->cands[i].k, c, r, sizeof r);
        x = snprintf(msg + w, sizeof msg - w, "; %s: %s", res->cands[i].k->spec.id, r);
        if (x < 0) break;
        w += (size_t)x;
    }
    return kiln_err_set(err, KILN_ERR_UNSUPPORTED, "%s", msg);
}

kiln_status kiln_select(kiln_selector *s, const kiln_sel_ctx *c, unsigned flags,
                        kiln_sel_result *res, kiln_err *err) {
    const kiln_registry *reg = s->reg;
    const kiln_policy *p = s->policy;
    res->chosen = NULL;
    res->score = 0;
    res->fallback = res->locked = res->cached = false;
    res->lock_src = 0;
    res->note[0] = 0;
    res->n_cands = 0;
    if ((unsigned)c->op >= KILN_KOP_COUNT || (unsigned)c->backend >= KILN_BACKEND_COUNT ||
        c->tok_bucket < 0 || c->tok_bucket >= KILN_TOK_BUCKETS || c->seq_bucket < 0 ||
        c->seq_bucket >= KILN_SEQ_BUCKETS)
        return kiln_err_set(err, KILN_ERR_INVALID_ARG, "select: malformed context");

    sel_key key;
    make_key(s, c, &key);
    uint64_t h = kiln_hash64(&key, sizeof key, 0) | 1;
    if (!(flags & KILN_SEL_NO_CACHE)) {
        cache_slot hit;
        if (cache_get(s, &key, h, &hit)) {
            atomic_fetch_add_explicit(&s->hits, 1, memory_order_relaxed);
            res->chosen = &reg->kernels[hit.chosen];
            res->score = hit.score;
            res->fallback = hit.fallback;
            res->locked = hit.locked;
            res->lock_src = hit.lock_src;
            res->cached = true;
            return KILN_OK;
        }
    }
    atomic_fetch_add_explicit(&s->misses, 1, memory_order_relaxed);

    /* filter */
    int n = reg->n_by_op[c->op];
    for (int i = 0; i < n; i++) {
        kiln_sel_cand *cd = &res->cands[i];
        cd->k = &reg->kernels[reg->by_op[c->op][i]];
        cd->reasons = check_kernel(s, cd->k, c);
        cd->score = cd->perf_adj = cd->perf_us = 0;
    }
    res->n_cands = n;

    /* lock */
    int lock_src = 0;
    const char *lock = p->reference_only ? NULL : find_lock(p, c, &lock_src);
    int locked = -1;
    if (lock) {
        int named = -1;
        for (int i = 0; i < n; i++) {
            if (!kiln_policy_name_matches(lock, &res->cands[i].k->spec)) continue;
            if (named < 0) named = i;
            if (!(res->cands[i].reasons & KILN_REASONS_HARD)) {
                locked = i;
                break;
            }
        }
        if (locked < 0) {
            if (named < 0)
                snprintf(res->note, sizeof res->note, "lock '%s' names no %s kernel", lock,
                         kiln_kop_name(c->op));
            else
                snprintf(res->note, sizeof res->note, "lock '%s' ignored: kernel invalid here",
                         lock);
            if (p->strict) return no_kernel_error(s, c, res, res->note, err);
            KILN_WARN("kernel policy: %s", res->note);
        } else {
            for (int i = 0; i < n; i++)
                if (i != locked)
                    res->cands[i].reasons |= KILN_REASON_BIT(KILN_REASON_POLICY_LOCKED);
            res->cands[locked].reasons = 0; /* a lock overrides avoid and soft limits */
        }
    }

    /* score */
    for (int i = 0; i < n; i++) {
        kiln_sel_cand *cd = &res->cands[i];
        if (cd->reasons) continue;
        const kiln_kernel_spec *sp = &cd->k->spec;
        cd->score = sp->priority + prefer_bonus(p, c, sp);
        if (sp->good_tokens && c->tokens_max < sp->good_tokens) cd->score += KILN_SCORE_SMALL_BATCH;
    }
    perf_adjust(s, c, res->cands, n);
    for (int i = 0; i < n; i++) res->cands[i].score += res->cands[i].perf_adj;

    int best = -1;
    for (int i = 0; i < n; i++)
        if (!res->cands[i].reasons && (best < 0 || res->cands[i].score > res->cands[best].score))
            best = i;
    if (best >= 0) {
        res->chosen = res->cands[best].k;
        res->score = res->cands[best].score;
        res->locked = locked >= 0;
        res->lock_src = locked >= 0 ? lock_src : 0;
    } else {
        int fb = reg->fallback[c->op];
        const kiln_sel_cand *fc = NULL;
        for (int i = 0; i < n; i++)
            if (res->cands[i].k->index == fb) fc = &res->cands[i];
        if (p->strict || !fc || (fc->reasons & KILN_REASONS_HARD)) {
            qsort(res->cands, (size_t)n, sizeof res->cands[0], cand_order);
            return no_kernel_error(s, c, res,
                                   p->strict ? "strict policy: no valid kernel"
                                             : "the fallback cannot run it either",
                                   err);
        }
        res->chosen = fc->k;
        res->fallback = true;
        res->score = 0;
    }
    /* order: chosen first, then the rest */
    qsort(res->cands, (size_t)n, sizeof res->cands[0], cand_order);
    for (int i = 0; i < n; i++)
        if (res->cands[i].k == res->chosen && i) {
            kiln_sel_cand t = res->cands[i];
            memmove(&res->cands[1], &res->cands[0], sizeof t * (size_t)i);
            res->cands[0] = t;
        }

    cache_slot v = {.chosen = res->chosen->index,
                    .fallback = res->fallback,
                    .locked = res->locked,
                    .lock_src = (uint8_t)res->lock_src,
                    .score = (float)res->score};
    cache_put(s, &key, h, &v);
    return KILN_OK;
}
