/*
 * main.c — kiln-gen command line. See docs/GENERATOR.md.
 */
#include "gen.h"

#include "base/log.h"
#include "format/dtype.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

static void usage(FILE *f) {
    fprintf(f, "usage: kiln-gen [options] -o OUT\n"
               "Writes a synthetic model with random weights (deterministic by --seed).\n"
               "\n"
               "  -o, --out PATH        output: a .gguf file, or a directory for --format hf\n"
               "  -p, --preset NAME     model shape (default tiny); --list-presets shows them\n"
               "  -f, --family NAME     llama | qwen2 | qwen3 | gemma3 (for tiny; default llama)\n"
               "  -t, --type TYPE       weight type: f32 f16 bf16 q8_0 q4_0 q4_1 q5_0 q5_1 q2_K\n"
               "                        q3_K q4_K q5_K q6_K (default f16; norms and biases\n"
               "                        stay f32; --format hf takes f32 f16 bf16)\n"
               "      --format FMT      gguf (default) | hf (safetensors + config.json +\n"
               "                        tokenizer.json)\n"
               "  -s, --seed N          random seed (default 1)\n"
               "      --vocab FILE      copy the tokenizer of a GGUF file (sets the vocab size)\n"
               "      --layers N, --hidden N, --ffn N, --heads N, --kv-heads N, --head-dim N,\n"
               "      --n-vocab N, --ctx N, --rope-theta X, --tied 0|1, --sliding-window N\n"
               "                        override the preset's shape\n"
               "      --shard-mb N      hf: shard safetensors above N MiB (default 2000)\n"
               "      --threads N       threads (default: all CPUs)\n"
               "  -q, --quiet           no progress or summary\n"
               "      --list-presets    list presets and exit\n"
               "  -h, --help            this help\n");
}

static bool parse_i64(const char *s, int64_t *out) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < 0) return false;
    *out = v;
    return true;
}

static int bad(const char *msg, const char *arg) {
    fprintf(stderr, "kiln-gen: %s%s%s\n", msg, arg ? ": " : "", arg ? arg : "");
    usage(stderr);
    return 2;
}

int main(int argc, char **argv) {
    const char *out = NULL, *preset = "tiny", *family_s = NULL, *type_s = "f16", *format = "gguf",
               *vocab_path = NULL;
    int64_t seed = 1, threads = 0, shard_mb = 2000;
    bool quiet = false;
    struct ov {
        const char *flag;
        int64_t v;
        bool set;
    } ovs[] = {{"--layers", 0, false},        {"--hidden", 0, false},   {"--ffn", 0, false},
               {"--heads", 0, false},         {"--kv-heads", 0, false}, {"--head-dim", 0, false},
               {"--n-vocab", 0, false},       {"--ctx", 0, false},      {"--tied", 0, false},
               {"--sliding-window", 0, false}};
    const size_t n_ovs = sizeof ovs / sizeof ovs[0];
    const char *rope_theta = NULL;

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *val = i + 1 < argc ? argv[i + 1] : NULL;
#define OPT(s, l) (strcmp(a, s) == 0 || strcmp(a, l) == 0)
        if (OPT("-h", "--help")) {
            usage(stdout);
            return 0;
        } else if (strcmp(a, "--list-presets") == 0) {
            gen_list_presets();
            return 0;
        } else if (OPT("-q", "--quiet")) {
            quiet = true;
            continue;
        }
        if (a[0] != '-') return bad("unexpected argument", a);
        if (!val) return bad("missing value for", a);
        i++;
        if (OPT("-o", "--out"))
            out = val;
        else if (OPT("-p", "--preset"))
            preset = val;
        else if (OPT("-f", "--family"))
            family_s = val;
        else if (OPT("-t", "--type"))
            type_s = val;
        else if (strcmp(a, "--format") == 0)
            format = val;
        else if (strcmp(a, "--vocab") == 0)
            vocab_path = val;
        else if (strcmp(a, "--rope-theta") == 0)
            rope_theta = val;
        else if (OPT("-s", "--seed")) {
            if (!parse_i64(val, &seed)) return bad("bad --seed", val);
        } else if (strcmp(a, "--threads") == 0) {
            if (!parse_i64(val, &threads) || threads > 1024) return bad("bad --threads", val);
        } else if (strcmp(a, "--shard-mb") == 0) {
            if (!parse_i64(val, &shard_mb) || shard_mb < 1) return bad("bad --shard-mb", val);
        } else {
            size_t k = 0;
            while (k < n_ovs && strcmp(a, ovs[k].flag) != 0) k++;
            if (k == n_ovs) return bad("unknown option", a);
            if (!parse_i64(val, &ovs[k].v)) return bad("bad value", a);
            ovs[k].set = true;
        }
#undef OPT
    }
    if (!out) return bad("missing -o OUT", NULL);
    const bool hf = strcmp(format, "hf") == 0;
    if (!hf && strcmp(format, "gguf") != 0) return bad("unknown --format", format);

    gen_family family = GEN_LLAMA;
    if (family_s && !gen_family_parse(family_s, &family)) return bad("unknown --family", family_s);
    kiln_err err;
    kiln_err_clear(&err);
    gen_model m = {0};
    gen_config *c = &m.cfg;
    if (gen_preset(preset, family, family_s != NULL, c, &err)) {
        fprintf(stderr, "kiln-gen: %s\n", err.msg);
        return 2;
    }
    kiln_dtype type;
    bool mix_m = false;
    if (strcasecmp(type_s, "q4_K_M") == 0 || strcasecmp(type_s, "q5_K_M") == 0) {
        type = type_s[1] == '4' ? KILN_DTYPE_Q4_K : KILN_DTYPE_Q5_K;
        mix_m = true;
    } else if (!kiln_dtype_from_name(type_s, &type)) {
        return bad("unknown --type", type_s);
    }
    if (hf && type != KILN_DTYPE_F32 && type != KILN_DTYPE_F16 && type != KILN_DTYPE_BF16)
        return bad("--format hf stores f32, f16 or bf16", type_s);
    c->type = type;
    c->mix_m = mix_m;
    c->seed = (uint64_t)seed;
    int64_t *targets[] = {&c->n_layer,   &c->n_embd,   &c->n_ff,    &c->n_head,
                          &c->n_head_kv, &c->head_dim, &c->n_vocab, &c->n_ctx};
    for (size_t k = 0; k < 8; k++)
        if (ovs[k].set) *targets[k] = ovs[k].v;
    if (ovs[8].set) c->tied = ovs[8].v != 0;
    if (ovs[9].set) c->sliding_window = ovs[9].v;
    if (ovs[1].set && !ovs[5].set && c->family != GEN_GEMMA3 && c->family != GEN_QWEN3)
        c->head_dim = c->n_embd / c->n_head; /* keep hidden = heads x head_dim */
    if (rope_theta) c->rope_theta = strtof(rope_theta, NULL);

    gen_vocab v = {0};
    kiln_status st = KILN_OK;
    if (vocab_path) {
        st = gen_vocab_from_gguf(vocab_path, &v, &err);
        if (!st) {
            if (ovs[6].set && ovs[6].v != (int64_t)v.n)
                st = kiln_err_set(&err, KILN_ERR_INVALID_ARG,
                                  "--n-vocab %lld contradicts the %zu tokens of %s",
                                  (long long)ovs[6].v, v.n, vocab_path);
            c->n_vocab = (int64_t)v.n;
        }
    } else {
        st = gen_vocab_builtin((size_t)c->n_vocab, &v, &err);
    }
    if (!st) {
        c->bos_id = v.bos_id, c->eos_id = v.eos_id;
        c->vocab_from_file = vocab_path != NULL;
        snprintf(c->name, sizeof c->name, "kiln-gen %s %s seed %llu", c->preset,
                 gen_family_name(c->family), (unsigned long long)c->seed);
        st = gen_config_check(c, &err);
    }
    if (!st) st = gen_model_build(&m, &err);
    if (!st && !quiet)
        fprintf(stderr,
                "kiln-gen: %s %s, %lld layers, hidden %lld, vocab %lld, %.1f M params, %s\n",
                c->preset, gen_family_name(c->family), (long long)c->n_layer, (long long)c->n_embd,
                (long long)c->n_vocab, (double)gen_param_count(&m) / 1e6, kiln_dtype_name(c->type));
    if (!st) {
        if (hf) {
            st = gen_write_hf(&m, &v, out, (uint64_t)shard_mb << 20, (int)threads, &err);
        } else {
            gen_gguf_opts o = {vocab_path, (int)threads, !quiet};
            st = gen_write_gguf(&m, &v, out, &o, &err);
        }
    }
    gen_model_free(&m);
    gen_vocab_free(&v);
    if (st) {
        fprintf(stderr, "kiln-gen: %s\n", err.msg);
        return 1;
    }
    return 0;
}
