/*
 * cmd_kernels.c — `kiln kernels [--op OP] [--backend B] [--json]`: the kernel registry,
 * per provider, with availability on this machine and each kernel's constraints.
 */
#include "base/cpu.h"
#include "base/mem.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "kernels/select.h"

#include <jansson.h>
#include <stdio.h>
#include <string.h>

static void dtypes(uint64_t m, char *buf, size_t n) {
    size_t w = 0;
    buf[0] = 0;
    if ((m & KILN_DT_QUANTS) == KILN_DT_QUANTS) {
        w += (size_t)snprintf(buf, n, "quants");
        m &= ~KILN_DT_QUANTS;
    }
    for (int i = 0; i < 64 && w < n; i++)
        if (m & (1ull << i))
            w += (size_t)snprintf(buf + w, n - w, "%s%s", w ? "," : "",
                                  kiln_dtype_name((uint32_t)i));
    if (!buf[0]) snprintf(buf, n, "-");
}

static void bits(uint32_t m, const char *(*name)(uint32_t), char *buf, size_t n) {
    size_t w = 0;
    buf[0] = 0;
    for (int i = 0; i < 32 && w < n; i++)
        if (m & (1u << i)) {
            const char *s = name(1u << i);
            w += (size_t)snprintf(buf + w, n - w, "%s%s", w ? "," : "", s ? s : "?");
        }
    if (!buf[0]) snprintf(buf, n, "-");
}

/* Why a kernel cannot run on this machine's backend b (empty when it can). */
static void why_not(const kiln_registry *r, const kiln_reg_kernel *k, int backend, char *buf,
                    size_t n) {
    const kiln_reg_provider *p = &r->providers[k->provider];
    buf[0] = 0;
    if (!p->available)
        snprintf(buf, n, "provider unavailable: %s", p->why);
    else if (k->undeclared)
        snprintf(buf, n, "not declared in %s", p->descriptor_path);
    else if (!k->spec.fn.any)
        snprintf(buf, n, "not built into this binary");
    else if (k->spec.platform == KILN_PLATFORM_HOST &&
             (kiln_cpu_info()->isa & k->spec.isa) != k->spec.isa) {
        char isa[200];
        kiln_isa_names(k->spec.isa & ~kiln_cpu_info()->isa, isa, sizeof isa);
        snprintf(buf, n, "CPU lacks %s", isa);
    } else if (backend >= 0 && k->spec.platform != kiln_backend_platform((kiln_backend_id)backend))
        snprintf(buf, n, "runs on %s", kiln_platform_name(k->spec.platform));
    else if (backend == KILN_BACKEND_REF && !p->p->fallback)
        snprintf(buf, n, "the ref backend runs the reference kernels only");
}

int kiln_cmd_kernels(int argc, char **argv) {
    static const kiln_cmd_usage u = {
        "kiln kernels [--op OP] [--backend B] [--json]",
        "Lists every kernel kiln knows, grouped by provider, with whether it can run here "
        "and why not. Providers whose library is missing are listed as unavailable. "
        "Descriptors are read from $KILN_DESCRIPTOR_DIR."};
    kiln_opt opts[] = {
        {"op", 0, true, "OP",
         "only this op (matmul, embed, rms_norm, rope, kv_write, attention, "
         "glu, add)",
         false, NULL},
        {"backend", 'b', true, "B", "only kernels for this backend's platform (ref, cpu, cuda)",
         false, NULL},
        {"json", 0, false, NULL, "machine-readable output", false, NULL},
    };
    const char *pos[4];
    int n_pos;
    int r = kiln_args_parse(argc, argv, &u, opts, KILN_NOPTS(opts), pos, 4, &n_pos);
    if (r == KILN_ARGS_HELP) return 0;
    if (r == KILN_ARGS_ERROR) return 2;
    int op = -1, backend = -1;
    if (opts[0].seen) {
        kiln_kop k;
        if (!kiln_kop_from_name(opts[0].value, &k)) {
            fprintf(stderr, "kiln kernels: unknown op '%s'\n", opts[0].value);
            return 2;
        }
        op = (int)k;
    }
    if (opts[1].seen) {
        kiln_backend_id b;
        if (!kiln_backend_from_name(opts[1].value, &b)) {
            fprintf(stderr, "kiln kernels: unknown backend '%s' (ref, cpu, cuda)\n", opts[1].value);
            return 2;
        }
        backend = (int)b;
    }
    const kiln_registry *reg = kiln_registry_default();
    if (kiln_registry_default_error()[0]) {
        fprintf(stderr, "kiln kernels: registry: %s\n", kiln_registry_default_error());
        return 1;
    }
    bool json = opts[2].seen;
    json_t *jroot = json ? json_array() : NULL;
    for (int pi = 0; pi < reg->n_providers; pi++) {
        const kiln_reg_provider *p = &reg->providers[pi];
        bool header = false;
        for (int ki = 0; ki < reg->n_kernels; ki++) {
            const kiln_reg_kernel *k = &reg->kernels[ki];
            const kiln_kernel_spec *s = &k->spec;
            if (k->provider != pi) continue;
            if (op >= 0 && (int)s->op != op) continue;
            if (backend >= 0 && (s->platform != kiln_backend_platform((kiln_backend_id)backend) ||
                                 (s->backends && !(s->backends & KILN_BACKEND_BIT(backend)))))
                continue;
            char why[700], w[300], f[300], pr[200], isa[200];
            why_not(reg, k, backend, why, sizeof why);
            dtypes(s->w_dtypes, w, sizeof w);
            bits(s->features, kiln_kfeat_name, f, sizeof f);
            bits(s->props, kiln_kprop_name, pr, sizeof pr);
            kiln_isa_names(s->isa, isa, sizeof isa);
            if (json) {
                json_t *o = json_object();
                json_object_set_new(o, "id", json_string(s->id));
                json_object_set_new(o, "op", json_string(kiln_kop_name(s->op)));
                json_object_set_new(o, "provider", json_string(p->p->name));
                json_object_set_new(o, "platform", json_string(kiln_platform_name(s->platform)));
                json_object_set_new(o, "priority", json_integer(s->priority));
                json_object_set_new(o, "w_dtypes", json_string(w));
                json_object_set_new(o, "isa", json_string(isa));
                json_object_set_new(o, "features", json_string(f));
                json_object_set_new(o, "properties", json_string(pr));
                json_object_set_new(o, "available", json_boolean(!why[0]));
                if (why[0]) json_object_set_new(o, "why", json_string(why));
                json_array_append_new(jroot, o);
                continue;
            }
            if (!header) {
                printf("%s — %s: %s%s%s\n", p->p->name, p->p->summary ? p->p->summary : "",
                       p->available ? "available" : "UNAVAILABLE (", p->available ? "" : p->why,
                       p->available ? "" : ")");
                if (p->has_descriptor)
                    printf("  descriptor %s (hash %016llx)\n", p->descriptor_path,
                           (unsigned long long)p->descriptor_hash);
                header = true;
            }
            printf("  %-32s %-9s prio %3d  %s\n", s->id, kiln_kop_name(s->op), s->priority,
                   why[0] ? why : "ok");
            printf("      weights %s; isa %s; features %s; %s", w, isa[0] ? isa : "-", f, pr);
            if (s->max_tokens) printf("; max tokens %lld", (long long)s->max_tokens);
            if (s->good_tokens) printf("; best from %lld tokens", (long long)s->good_tokens);
            if (s->head_dim_max) printf("; head dim %d-%d", s->head_dim_min, s->head_dim_max);
            if (s->summary) printf("\n      %s", s->summary);
            printf("\n");
        }
        /* a provider compiled without its library has no kernels: still say so */
        if (!json && !header && op < 0 && backend < 0)
            printf("%s — %s: %s%s%s (no kernels)\n", p->p->name, p->p->summary ? p->p->summary : "",
                   p->available ? "available" : "UNAVAILABLE (", p->available ? "" : p->why,
                   p->available ? "" : ")");
    }
    if (json) {
        char *txt = kiln_adopt(json_dumps(jroot, JSON_INDENT(1)));
        if (txt) puts(txt);
        kiln_free(txt);
        json_decref(jroot);
    }
    return 0;
}
