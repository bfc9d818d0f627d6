/*
 * descriptor.c — capabilities descriptors: JSON files that narrow a provider's specs.
 *
 *   { "schema": "kiln.kernel-descriptor", "schema_version": 1, "provider": "openblas",
 *     "version": "0.3.21",
 *     "kernels": { "openblas.sgemm.matmul.f32": {
 *         "w_dtypes": ["f32"], "act_dtypes": ["f32"], "kv_dtypes": [],
 *         "isa": ["avx2"], "sm_min": 0, "sm_max": 0,
 *         "head_dim_min": 0, "head_dim_max": 0, "head_dim_multiple": 0,
 *         "max_tokens": 0, "max_seq": 0, "k_multiple": 0, "n_multiple": 0,
 *         "features": ["bias"], "properties": ["deterministic"], "priority": 50 } } }
 *
 * Fail closed: a wrong schema name/version, an unknown field (top level or per kernel),
 * an unknown kernel id, dtype, ISA, feature or property name, a wrong type -> the whole
 * descriptor is rejected. A capability set the descriptor leaves out (w_dtypes,
 * act_dtypes, kv_dtypes, features, properties) is empty: unsupported. A descriptor can
 * only narrow: sets are intersected with the static spec, limits tightened, ISA
 * requirements added. A kernel the descriptor does not list is undeclared (unavailable).
 */
#include "base/hash.h"
#include "kernels/registry.h"

#include <jansson.h>
#include <string.h>

static const char *const top_keys[] = {"schema", "schema_version", "provider", "version",
                                       "kernels"};
static const char *const kernel_keys[] = {
    "w_dtypes",     "act_dtypes",   "kv_dtypes",         "isa",        "sm_min",  "sm_max",
    "head_dim_min", "head_dim_max", "head_dim_multiple", "max_tokens", "max_seq", "max_gqa",
    "k_multiple",   "n_multiple",   "features",          "properties", "priority"};

static bool known(const char *key, const char *const *keys, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (strcmp(key, keys[i]) == 0) return true;
    return false;
}

static const struct {
    const char *name;
    uint32_t bit;
} isa_names[] = {
    {"sse4.2", KILN_ISA_SSE42},
    {"avx", KILN_ISA_AVX},
    {"avx2", KILN_ISA_AVX2},
    {"fma", KILN_ISA_FMA},
    {"f16c", KILN_ISA_F16C},
    {"avx512f", KILN_ISA_AVX512F},
    {"avx512bw", KILN_ISA_AVX512BW},
    {"avx512vl", KILN_ISA_AVX512VL},
    {"avx512dq", KILN_ISA_AVX512DQ},
    {"avx512vnni", KILN_ISA_AVX512VNNI},
    {"avx512bf16", KILN_ISA_AVX512BF16},
    {"avxvnni", KILN_ISA_AVXVNNI},
    {"amx_tile", KILN_ISA_AMX_TILE},
    {"amx_int8", KILN_ISA_AMX_INT8},
    {"amx_bf16", KILN_ISA_AMX_BF16},
};

bool kiln_isa_bit_from_name(const char *name, uint32_t *bit);
bool kiln_isa_bit_from_name(const char *name, uint32_t *bit) {
    for (size_t i = 0; i < sizeof isa_names / sizeof isa_names[0]; i++)
        if (strcmp(name, isa_names[i].name) == 0) {
            *bit = isa_names[i].bit;
            return true;
        }
    return false;
}

typedef enum { SET_DTYPE, SET_ISA, SET_FEAT, SET_PROP } set_kind;

static kiln_status parse_set(json_t *v, set_kind kind, const char *where, const char *field,
                             uint64_t *out, kiln_err *err) {
    *out = 0;
    if (!json_is_array(v))
        return kiln_err_set(err, KILN_ERR_FORMAT, "%s: '%s' must be an array of strings", where,
                            field);
    size_t i;
    json_t *e;
    json_array_foreach(v, i, e) {
        const char *s = json_string_value(e);
        if (!s)
            return kiln_err_set(err, KILN_ERR_FORMAT, "%s: '%s'[%zu] is not a string", where, field,
                                i);
        uint32_t bit = 0;
        uint64_t bit64 = 0;
        kiln_dtype dt;
        bool ok = false;
        switch (kind) {
        case SET_DTYPE:
            ok = kiln_dtype_from_name(s, &dt) && (unsigned)dt < 64;
            if (ok) bit64 = KILN_DT(dt);
            break;
        case SET_ISA:
            ok = kiln_isa_bit_from_name(s, &bit);
            break;
        case SET_FEAT:
            ok = kiln_kfeat_from_name(s, &bit);
            break;
        case SET_PROP:
            ok = kiln_kprop_from_name(s, &bit);
            break;
        }
        if (!ok)
            return kiln_err_set(err, KILN_ERR_FORMAT, "%s: '%s': unknown name '%s'", where, field,
                                s);
        *out |= kind == SET_DTYPE ? bit64 : bit;
    }
    return KILN_OK;
}

static kiln_status parse_int(json_t *v, const char *where, const char *field, int64_t lo,
                             int64_t hi, int64_t *out, kiln_err *err) {
    if (!json_is_integer(v))
        return kiln_err_set(err, KILN_ERR_FORMAT, "%s: '%s' must be an integer", where, field);
    json_int_t x = json_integer_value(v);
    if (x < lo || x > hi)
        return kiln_err_set(err, KILN_ERR_FORMAT, "%s: '%s' = %lld outside [%lld, %lld]", where,
                            field, (long long)x, (long long)lo, (long long)hi);
    *out = (int64_t)x;
    return KILN_OK;
}

/* tighten a lower bound / upper bound / multiple (0 = none) */
static int64_t tighten_min(int64_t a, int64_t b) {
    return a > b ? a : b;
}
static int64_t tighten_max(int64_t a, int64_t b) {
    if (a == 0) return b;
    if (b == 0) return a;
    return a < b ? a : b;
}
static int64_t tighten_mult(int64_t a, int64_t b) {
    if (a == 0) return b;
    if (b == 0 || a % b == 0) return a;
    if (b % a == 0) return b;
    return a * b;
}

static kiln_status apply_kernel(json_t *obj, const char *where, kiln_kernel_spec *s,
                                kiln_err *err) {
    if (!json_is_object(obj))
        return kiln_err_set(err, KILN_ERR_FORMAT, "%s: must be an object", where);
    const char *key;
    json_t *v;
    json_object_foreach(obj, key, v) {
        if (!known(key, kernel_keys, sizeof kernel_keys / sizeof kernel_keys[0]))
            return kiln_err_set(err, KILN_ERR_FORMAT, "%s: unknown field '%s'", where, key);
    }
    uint64_t set;
    /* capability sets: missing = empty */
    static const struct {
        const char *field;
        set_kind kind;
    } sets[] = {{"w_dtypes", SET_DTYPE},
                {"act_dtypes", SET_DTYPE},
                {"kv_dtypes", SET_DTYPE},
                {"features", SET_FEAT},
                {"properties", SET_PROP}};
    uint64_t vals[5] = {0};
    for (int i = 0; i < 5; i++) {
        json_t *x = json_object_get(obj, sets[i].field);
        if (x) KILN_TRY(parse_set(x, sets[i].kind, where, sets[i].field, &vals[i], err));
    }
    s->w_dtypes &= vals[0];
    s->act_dtypes &= vals[1];
    s->kv_dtypes &= vals[2];
    s->features &= (uint32_t)vals[3];
    s->props &= (uint32_t)vals[4];
    json_t *x = json_object_get(obj, "isa");
    if (x) {
        KILN_TRY(parse_set(x, SET_ISA, where, "isa", &set, err));
        s->isa |= (uint32_t)set;
    }
    int64_t n = 0;
#define LIMIT(field, hi, how)                                                                      \
    if ((x = json_object_get(obj, #field))) {                                                      \
        KILN_TRY(parse_int(x, where, #field, 0, hi, &n, err));                                     \
        s->field = how(s->field, n);                                                               \
    }
    LIMIT(sm_min, 1000, tighten_min)
    LIMIT(sm_max, 1000, tighten_max)
    LIMIT(head_dim_min, 65536, tighten_min)
    LIMIT(head_dim_max, 65536, tighten_max)
    LIMIT(head_dim_multiple, 65536, tighten_mult)
    LIMIT(max_tokens, INT64_C(1) << 40, tighten_max)
    LIMIT(max_seq, INT64_C(1) << 40, tighten_max)
    LIMIT(max_gqa, 65536, tighten_max)
    LIMIT(k_multiple, 65536, tighten_mult)
    LIMIT(n_multiple, 65536, tighten_mult)
#undef LIMIT
    if ((x = json_object_get(obj, "priority"))) {
        KILN_TRY(parse_int(x, where, "priority", 0, 100, &n, err));
        s->priority = (int32_t)n;
    }
    return KILN_OK;
}

kiln_status kiln_descriptor_apply(const char *text, size_t len, const char *path,
                                  const char *provider, kiln_kernel_spec *specs, bool *declared,
                                  int n_specs, uint64_t *hash_out, kiln_err *err) {
    json_error_t je;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    if (!root) return kiln_err_set(err, KILN_ERR_FORMAT, "%s:%d: %s", path, je.line, je.text);
    kiln_status st = KILN_OK;
    kiln_kernel_spec tmp[KILN_REG_MAX_PER_OP * 2];
    bool decl[KILN_REG_MAX_PER_OP * 2];
    if (n_specs > (int)(sizeof tmp / sizeof tmp[0])) {
        json_decref(root);
        return kiln_err_set(err, KILN_ERR_RANGE, "%s: too many kernels", path);
    }
    memcpy(tmp, specs, sizeof tmp[0] * (size_t)n_specs);
    memset(decl, 0, sizeof decl);
    if (!json_is_object(root)) {
        st = kiln_err_set(err, KILN_ERR_FORMAT, "%s: top level must be an object", path);
        goto done;
    }
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v) {
        if (!known(key, top_keys, sizeof top_keys / sizeof top_keys[0])) {
            st = kiln_err_set(err, KILN_ERR_FORMAT, "%s: unknown field '%s'", path, key);
            goto done;
        }
    }
    const char *schema = json_string_value(json_object_get(root, "schema"));
    if (!schema || strcmp(schema, KILN_DESCRIPTOR_SCHEMA) != 0) {
        st = kiln_err_set(err, KILN_ERR_FORMAT, "%s: 'schema' must be \"%s\"", path,
                          KILN_DESCRIPTOR_SCHEMA);
        goto done;
    }
    json_t *ver = json_object_get(root, "schema_version");
    if (!json_is_integer(ver) || json_integer_value(ver) != KILN_DESCRIPTOR_VERSION) {
        st = kiln_err_set(err, KILN_ERR_FORMAT,
                          "%s: unsupported 'schema_version' (this kiln reads version %d)", path,
                          KILN_DESCRIPTOR_VERSION);
        goto done;
    }
    const char *prov = json_string_value(json_object_get(root, "provider"));
    if (!prov || strcmp(prov, provider) != 0) {
        st = kiln_err_set(err, KILN_ERR_FORMAT, "%s: 'provider' must be \"%s\"", path, provider);
        goto done;
    }
    json_t *v2 = json_object_get(root, "version");
    if (v2 && !json_is_string(v2)) {
        st = kiln_err_set(err, KILN_ERR_FORMAT, "%s: 'version' must be a string", path);
        goto done;
    }
    json_t *kernels = json_object_get(root, "kernels");
    if (!json_is_object(kernels)) {
        st = kiln_err_set(err, KILN_ERR_FORMAT, "%s: 'kernels' must be an object", path);
        goto done;
    }
    json_object_foreach(kernels, key, v) {
        int found = -1;
        for (int i = 0; i < n_specs; i++)
            if (strcmp(tmp[i].id, key) == 0) found = i;
        if (found < 0) {
            st = kiln_err_set(err, KILN_ERR_FORMAT, "%s: unknown kernel '%s' for provider %s", path,
                              key, provider);
            goto done;
        }
        char where[512];
        snprintf(where, sizeof where, "%s: kernel '%s'", path, key);
        st = apply_kernel(v, where, &tmp[found], err);
        if (st) goto done;
        decl[found] = true;
    }
    memcpy(specs, tmp, sizeof tmp[0] * (size_t)n_specs);
    memcpy(declared, decl, sizeof decl[0] * (size_t)n_specs);
    if (hash_out) *hash_out = kiln_hash64(text, len, 0x64657363u) | 1; /* never 0 */
done:
    json_decref(root);
    return st;
}
