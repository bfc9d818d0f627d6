/*
 * pretok.c — BPE pre-tokenizers: the regex list of every tokenizer.ggml.pre kiln
 * supports (as llama.cpp runs them), compiled with PCRE2 + JIT, and the splitter.
 *
 * How llama.cpp runs a regex, and so how kiln must (docs/TOKENIZER.md):
 *  - the input is decoded leniently into code points (invalid bytes -> U+FFFD);
 *  - each regex of the list splits every piece left by the previous one; matches and
 *    the gaps between them both become pieces; a regex sees only its piece (so `$`
 *    and lookaheads stop at the piece end);
 *  - a regex using \p{..} runs on a "collapsed" text of one byte per code point:
 *    ASCII stays, other code points become a class byte (0x0B white space, 0xD1
 *    number, 0xD2 letter, 0xD3 punctuation, 0xD4 mark, 0xD5 symbol, 0xD0 anything
 *    else) and \p{X} becomes a class of that byte plus X's ASCII members. \p{Lu},
 *    \p{Ll}... all mean "letter" there, a llama.cpp quirk kept for identical ids;
 *  - a regex without \p{..} runs on the code points themselves, with non-ASCII white
 *    space replaced by 0x0B (U+000B), so \s sees all Unicode white space.
 */
#include "base/mem.h"
#include "tok/tok_impl.h"
#include "tok/unicode.h"

#include <stdlib.h>
#include <string.h>

/* ---- the regex sets (strings as llama.cpp's llama-vocab.cpp states them) ---- */

#define RE_GPT2         "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"
#define RE_CONTRACTIONS "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
#define RE_LLAMA3                                                                                  \
    RE_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"   \
                    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RE_QWEN2                                                                                   \
    RE_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"        \
                    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RE_GPT4O_BODY(M)                                                                           \
    "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}" M "])([^a-z]))*((?=[\\p{L}" M                              \
    "])([^A-Z]))+" RE_CONTRACTIONS "?|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}" M                         \
    "])([^a-z]))+((?=[\\p{L}" M "])([^A-Z]))*" RE_CONTRACTIONS                                     \
    "?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"

typedef struct regex_set {
    const char *name;
    bool byte_encode;
    const char *re[KILN_PRETOK_MAX_RE];
} regex_set;

enum {
    RS_DEFAULT,
    RS_LLAMA3,
    RS_JAIS2,
    RS_DEEPSEEK_LLM,
    RS_DEEPSEEK3,
    RS_DEEPSEEK_CODER,
    RS_FALCON,
    RS_STARCODER,
    RS_GPT2,
    RS_QWEN2,
    RS_QWEN35,
    RS_PORO,
    RS_VIKING,
    RS_TEKKEN,
    RS_CHAMELEON,
    RS_GPT4O,
    RS_GRANITE_EMB,
    RS_BAILINGMOE,
    RS_SEED_CODER,
    RS_LAGUNA,
    RS_EXAONE_MOE,
    RS_NEWLINES,
    RS_MINICPM5,
    RS_COUNT
};

/* the long non-ASCII literals trip clang-format */
// clang-format off
static const regex_set g_sets[RS_COUNT] = {
    [RS_DEFAULT] = {"default",
                    true,
                    {"[\\p{P}\\$\\+<=>\\^~\\|]+", RE_GPT2, "\\p{N}+", "[0-9][0-9][0-9]"}},
    [RS_LLAMA3] = {"llama3", true, {RE_LLAMA3}},
    [RS_JAIS2] = {"jais-2",
                  true,
                  {RE_CONTRACTIONS
                   "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+"
                   "[\\r\\n]*|\\s*[\\r\\n]+|\\s{512}(?!\\S)|\\s{256}(?!\\S)|"
                   "\\s{128}(?!\\S)|\\s{64}(?!\\S)|\\s{32}(?!\\S)|\\s{16}(?!\\S)|"
                   "\\s{8}(?!\\S)|\\s{4}(?!\\S)|\\s{1,2}(?!\\S)|\\s{1}"}},
    [RS_DEEPSEEK_LLM] = {"deepseek-llm", true, {
        "[\r\n]",
        "\\s?[A-Za-z\u00B5\u00C0-\u00D6\u00D8-\u00F6\u00F8-\u01BA\u01BC-\u01BF\u01C4-"
        "\u0293\u0295-\u02AF\u0370-\u0373\u0376\u0377\u037B-\u037D\u037F\u0386\u0388-"
        "\u038A\u038C\u038E-\u03A1\u03A3-\u03F5\u03F7-\u0481\u048A-\u052F\u0531-"
        "\u0556\u10A0-\u10C5\u13A0-\u13F5\u13F8-\u13FD\u1C90-\u1CBA\u1CBD-\u1CBF"
        "\u1D00-\u1D2B\u1D6B-\u1D77\u1D79-\u1D9A\u1E00-\u1F15\u1F18-\u1F1D\u1F20-"
        "\u1F45\u1F48-\u1F4D\u1F50-\u1F57\u1F59\u1F5B\u1F5D\u1F5F-\u1F7D\u1F80-\u1FB4"
        "\u1FB6-\u1FBC\u1FBE\u1FC2-\u1FC4\u1FC6-\u1FCC\u1FD0-\u1FD3\u1FD6-\u1FDB"
        "\u1FE0-\u1FEC\u1FF2-\u1FF4\u1FF6-\u1FFC\u2102\u2107\u210A-\u2113\u2115\u2119"
        "-\u211D\u2124\u2126\u2128\u212A-\u212D\u212F-\u2134\u2139\u213C-\u213F\u2145"
        "-\u2149\u214E\u2183\u2184\u2C00-\u2C7B\u2C7E-\u2CE4\u2CEB-\u2CEE\u2CF2\u2CF3"
        "\uA640-\uA66D\uA680-\uA69B\uA722-\uA76F\uA771-\uA787\uA78B-\uA78E\uAB70-"
        "\uABBF\uFB00-\uFB06\uFB13-\uFB17\uFF21-\uFF3A\uFF41-\uFF5A\U00010400-"
        "\U0001044F\U000104B0-\U000104D3\U000104D8-\U000104FB\U00010C80-\U00010CB2"
        "\U00010CC0-\U00010CF2\U000118A0-\U000118DF\U0001E900-\U0001E943]+",
        "\\s?[!-/:-~\uFF01-\uFF0F\uFF1A-\uFF5E\u2018-\u201F\u3000-\u3002]+",
        "\\s+$",
        "[\u4E00-\u9FA5\u0800-\u4E00\uAC00-\uD7FF]+",
        "\\p{N}+"}},
    [RS_DEEPSEEK3] =
        {"deepseek-v3",
         true,
         {"\\p{N}{1,3}", "[\u4E00-\u9FA5\u3040-\u309F\u30A0-\u30FF]+",
          "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{"
          "S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"}},
    [RS_DEEPSEEK_CODER] = {"deepseek-coder",
                           true,
                           {"[\r\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", "[\u4E00-\u9FA5\u0800-\u4E00\uAC00-\uD7FF]+",
                            "\\p{N}"}},
    [RS_FALCON] = {"falcon", true, {"[\\p{P}\\$\\+<=>\\^~\\|`]+", RE_GPT2, "[0-9][0-9][0-9]"}},
    [RS_STARCODER] = {"starcoder", true, {"\\p{N}", RE_GPT2}},
    [RS_GPT2] = {"gpt-2", true, {RE_GPT2}},
    [RS_QWEN2] = {"qwen2", true, {RE_QWEN2}},
    [RS_QWEN35] = {"qwen35",
                   true,
                   {RE_CONTRACTIONS
                    "|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{"
                    "M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}},
    [RS_PORO] = {"poro-chat", true, {" ?[^(\\s|.,!?\u2026\u3002\uFF0C\u3001\u0964\u06D4\u060C)]+"}},
    [RS_VIKING] = {"viking", true, {" ?[^(\\s|.,!?\u2026\u3002\uFF0C\u3001\u0964\u06D4\u060C)]+", "\\p{N}"}},
    [RS_TEKKEN] =
        {"tekken",
         true,
         {"[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+|[^\\r\\n\\p{"
          "L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*|\\p{N}| "
          "?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}},
    [RS_CHAMELEON] = {"chameleon",
                      true,
                      {"<sentinel:[0-9]+>", "(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z",
                       "([\\t\\n]|    |  )", "\\p{N}", "[\\p{P}!-/:-@\\[-`{-~]", RE_GPT2}},
    [RS_GPT4O] = {"gpt-4o", true, {RE_GPT4O_BODY("")}},
    [RS_GRANITE_EMB] = {"granite-embed-multi-97m", true, {RE_GPT4O_BODY("\\p{M}")}},
    [RS_BAILINGMOE] = {"bailingmoe",
                       true,
                       {"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|"
                        "\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+"}},
    [RS_SEED_CODER] = {"seed-coder",
                       true,
                       {RE_CONTRACTIONS
                        "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1}| ?[^\\s\\p{L}\\p{N}"
                        "\\r\\n]+|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}},
    [RS_LAGUNA] = {"laguna", true, {"[^\\n]+|[\\n]+", RE_QWEN2}},
    [RS_EXAONE_MOE] = {"exaone-moe",
                       true,
                       {RE_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?(?:\\p{L}\\p{M}*(?: "
                                        "\\p{L}\\p{M}*)*)+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]?|"
                                        "\\s*[\\r\\n]|\\s+(?!\\S)|\\s+"}},
    [RS_NEWLINES] = {"gemma4", false, {"[^\\n]+|[\\n]+"}},
    [RS_MINICPM5] = {"minicpm5",
                     true,
                     {"\\p{N}{1,3}", RE_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}+| "
                                                     "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
                                                     "\\s+(?!\\S)|\\s+"}},
};

// clang-format on

/* tokenizer.ggml.pre names -> regex set and the flags llama.cpp sets with them
 * (clean_spaces, ignore_merges, add_bos, escape_whitespaces; -1 = unchanged). */
static const kiln_pre_info g_pre[] = {
    {"default", RS_DEFAULT, -1, -1, -1, -1},
    {"llama3", RS_LLAMA3, -1, 1, 1, -1},
    {"llama-v3", RS_LLAMA3, -1, 1, 1, -1},
    {"llama-bpe", RS_LLAMA3, -1, 1, 1, -1},
    {"falcon3", RS_LLAMA3, -1, 1, 1, -1},
    {"falcon-h1", RS_LLAMA3, -1, 1, 1, -1},
    {"pixtral", RS_LLAMA3, -1, 1, 1, -1},
    {"midm-2.0", RS_LLAMA3, -1, 1, 1, -1},
    {"lfm2", RS_LLAMA3, -1, 1, 1, -1},
    {"jina-v5-nano", RS_LLAMA3, -1, 1, 1, -1},
    {"dbrx", RS_LLAMA3, -1, -1, -1, -1},
    {"smaug-bpe", RS_LLAMA3, -1, -1, -1, -1},
    {"glm4", RS_LLAMA3, -1, -1, -1, -1}, /* chatglm4: same regex as llama3 */
    {"chatglm-bpe", RS_LLAMA3, -1, -1, -1, -1},
    {"jais-2", RS_JAIS2, -1, -1, -1, -1},
    {"deepseek-llm", RS_DEEPSEEK_LLM, 0, -1, -1, -1},
    {"deepseek-coder", RS_DEEPSEEK_CODER, 0, -1, -1, -1},
    {"deepseek-v3", RS_DEEPSEEK3, 0, -1, -1, -1},
    {"hunyuan-dense", RS_DEEPSEEK3, 0, -1, -1, -1},
    {"joyai-llm", RS_DEEPSEEK3, 0, -1, -1, -1},
    {"falcon", RS_FALCON, -1, -1, -1, -1},
    {"mpt", RS_GPT2, -1, -1, -1, -1},
    {"starcoder", RS_STARCODER, -1, -1, -1, -1},
    {"refact", RS_STARCODER, -1, -1, -1, -1},
    {"command-r", RS_STARCODER, 0, -1, -1, -1},
    {"smollm", RS_STARCODER, 0, -1, -1, -1},
    {"codeshell", RS_STARCODER, -1, -1, -1, -1},
    {"exaone", RS_STARCODER, -1, -1, -1, -1},
    {"minerva-7b", RS_STARCODER, -1, -1, -1, -1},
    {"mellum2", RS_STARCODER, -1, -1, -1, -1},
    {"gpt-2", RS_GPT2, -1, -1, -1, -1},
    {"phi-2", RS_GPT2, -1, -1, -1, -1},
    {"jina-es", RS_GPT2, -1, -1, -1, -1},
    {"jina-de", RS_GPT2, -1, -1, -1, -1},
    {"gigachat", RS_GPT2, -1, -1, -1, -1},
    {"jina-v2-es", RS_GPT2, -1, -1, -1, -1},
    {"jina-v2-de", RS_GPT2, -1, -1, -1, -1},
    {"a.x-4.0", RS_GPT2, -1, -1, -1, -1},
    {"mellum", RS_GPT2, -1, -1, -1, -1},
    {"modern-bert", RS_GPT2, -1, -1, -1, -1},
    {"jina-v1-en", RS_GPT2, -1, -1, -1, -1},
    {"jina-v2-code", RS_GPT2, -1, -1, -1, -1},
    {"roberta-bpe", RS_GPT2, -1, -1, -1, -1},
    {"exaone4", RS_GPT2, -1, -1, -1, -1},
    {"olmo", RS_GPT2, -1, -1, -1, -1},
    {"jais", RS_GPT2, -1, -1, -1, -1},
    {"trillion", RS_GPT2, 0, -1, -1, -1},
    {"granite-docling", RS_GPT2, 0, -1, -1, -1},
    {"qwen2", RS_QWEN2, 0, -1, -1, -1},
    {"deepseek-r1-qwen", RS_QWEN2, 0, -1, -1, -1},
    {"kormo", RS_QWEN2, 0, -1, -1, -1},
    {"f2llmv2", RS_QWEN2, 0, -1, -1, -1},
    {"megrez", RS_QWEN2, -1, -1, -1, -1},
    {"stablelm2", RS_QWEN2, -1, -1, -1, -1},
    {"hunyuan", RS_QWEN2, 0, -1, -1, -1},
    {"solar-open", RS_QWEN2, 0, -1, -1, -1},
    {"grok-2", RS_QWEN2, 0, -1, -1, -1},
    {"qwen35", RS_QWEN35, 0, -1, -1, -1},
    {"poro-chat", RS_PORO, 0, -1, -1, -1},
    {"bloom", RS_PORO, -1, -1, -1, -1},
    {"gpt3-finnish", RS_PORO, -1, -1, -1, -1},
    {"viking", RS_VIKING, 0, -1, -1, -1},
    {"tekken", RS_TEKKEN, 0, 1, 1, -1},
    {"chameleon", RS_CHAMELEON, 0, -1, 1, -1},
    {"gpt-4o", RS_GPT4O, 0, -1, -1, -1},
    {"llama4", RS_GPT4O, 0, -1, -1, -1},
    {"kanana2", RS_GPT4O, 0, -1, -1, -1},
    {"talkie", RS_GPT4O, 0, -1, -1, -1},
    {"minimax-m2", RS_GPT4O, 0, -1, -1, -1},
    {"granite-embed-multi-97m", RS_GRANITE_EMB, 0, 1, -1, -1},
    {"bailingmoe", RS_BAILINGMOE, 0, -1, -1, -1},
    {"bailingmoe2", RS_BAILINGMOE, 0, -1, -1, -1},
    {"llada-moe", RS_BAILINGMOE, 0, -1, -1, -1},
    {"seed-coder", RS_SEED_CODER, 0, -1, -1, -1},
    {"laguna", RS_LAGUNA, 0, -1, -1, -1},
    {"exaone-moe", RS_EXAONE_MOE, -1, -1, -1, -1},
    {"gemma4", RS_NEWLINES, -1, -1, 1, 1},
    {"granite-embed-multi-311m", RS_NEWLINES, -1, -1, 1, 1},
    {"sarvam-moe", RS_NEWLINES, 0, -1, -1, 1},
    {"minicpm5", RS_MINICPM5, -1, 1, -1, -1},
};

const char *kiln_pre_name_at(size_t i) {
    return i < sizeof g_pre / sizeof g_pre[0] ? g_pre[i].name : NULL;
}

const kiln_pre_info *kiln_pre_lookup(const char *name) {
    if (!name || !*name) name = "default";
    for (size_t i = 0; i < sizeof g_pre / sizeof g_pre[0]; i++)
        if (strcmp(g_pre[i].name, name) == 0) return &g_pre[i];
    return NULL;
}

/* ---- collapsing \p{..} for the byte-per-code-point text ---- */

typedef struct ucat {
    const char *pat;
    const char *cls; /* class body (without brackets) */
} ucat;
static const ucat g_ucat[] = {
    {"\\p{N}", "\\x{D1}0-9"},
    {"\\p{L}", "\\x{D2}A-Za-z"},
    {"\\p{P}", "\\x{D3}!-#%-*,-/:;?@\\[-\\]_\\{\\}"},
    {"\\p{M}", "\\x{D4}"},
    {"\\p{S}", "\\x{D5}\\$\\+<->\\^`\\|~"},
    {"\\p{Lu}", "\\x{D2}A-Za-z"},
    {"\\p{Ll}", "\\x{D2}A-Za-z"},
    {"\\p{Lt}", "\\x{D2}A-Za-z"},
    {"\\p{Lm}", "\\x{D2}A-Za-z"},
    {"\\p{Lo}", "\\x{D2}A-Za-z"},
};
#define N_UCAT (sizeof g_ucat / sizeof g_ucat[0])

static bool uses_categories(const char *re) {
    for (size_t i = 0; i < N_UCAT; i++)
        if (strstr(re, g_ucat[i].pat)) return true;
    return false;
}

/* Rewrites \p{X} into classes over the collapsed bytes (out: malloc'ed). */
static kiln_status collapse_regex(const char *re, char **out, kiln_err *err) {
    size_t n = strlen(re), cap = n * 8 + 64, k = 0;
    char *o = kiln_malloc(cap);
    if (!o) return kiln_err_set(err, KILN_ERR_NOMEM, "regex rewrite: out of memory");
    bool inside = false;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)re[i];
        if (c >= 0x80) {
            kiln_free(o);
            return kiln_err_set(err, KILN_ERR_UNSUPPORTED,
                                "pre-tokenizer regex mixes \\p{..} classes and non-ASCII "
                                "characters: %s",
                                re);
        }
        if (c == '[' && (i == 0 || re[i - 1] != '\\')) {
            o[k++] = '[';
            inside = true;
            continue;
        }
        if (inside && c == ']' && re[i - 1] != '\\') {
            o[k++] = ']';
            inside = false;
            continue;
        }
        if (c == '\\' && i + 3 < n && re[i + 1] == 'p' && re[i + 2] == '{') {
            const ucat *u = NULL;
            for (size_t j = 0; j < N_UCAT; j++) {
                size_t pl = strlen(g_ucat[j].pat);
                if (strncmp(re + i, g_ucat[j].pat, pl) == 0) u = &g_ucat[j];
            }
            if (!u) {
                kiln_free(o);
                return kiln_err_set(err, KILN_ERR_UNSUPPORTED,
                                    "pre-tokenizer regex uses an unsupported class at '%.12s'",
                                    re + i);
            }
            if (!inside) o[k++] = '[';
            size_t cl = strlen(u->cls);
            memcpy(o + k, u->cls, cl);
            k += cl;
            if (!inside) o[k++] = ']';
            i += strlen(u->pat) - 1;
            continue;
        }
        o[k++] = (char)c;
    }
    o[k] = 0;
    *out = o;
    return KILN_OK;
}

static kiln_status compile_one(const char *pat, bool utf, pcre2_code **out, kiln_err *err) {
    int ec;
    PCRE2_SIZE eo;
    uint32_t opts = PCRE2_DOLLAR_ENDONLY | (utf ? PCRE2_UTF : 0);
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pat, PCRE2_ZERO_TERMINATED, opts, &ec, &eo, NULL);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(ec, msg, sizeof msg);
        return kiln_err_set(err, KILN_ERR_INTERNAL, "compiling pre-tokenizer regex at %zu: %s",
                            (size_t)eo, (const char *)msg);
    }
    /* JIT is an accelerator: when it is unavailable pcre2_match interprets */
    (void)pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);
    *out = re;
    return KILN_OK;
}

kiln_status kiln_pretok_init(kiln_pretok *p, int set, kiln_err *err) {
    memset(p, 0, sizeof *p);
    if (set < 0 || set >= RS_COUNT)
        return kiln_err_set(err, KILN_ERR_INVALID_ARG, "bad regex set %d", set);
    const regex_set *rs = &g_sets[set];
    p->name = rs->name;
    p->byte_encode = rs->byte_encode;
    for (int i = 0; i < KILN_PRETOK_MAX_RE && rs->re[i]; i++) {
        bool coll = uses_categories(rs->re[i]);
        kiln_status st;
        if (coll) {
            char *c = NULL;
            st = collapse_regex(rs->re[i], &c, err);
            if (st == KILN_OK) {
                st = compile_one(c, false, &p->re[i], err);
                kiln_free(c);
            }
        } else {
            st = compile_one(rs->re[i], true, &p->re[i], err);
        }
        if (st) {
            kiln_pretok_free(p);
            return kiln_err_wrap(err, st, "pre-tokenizer '%s'", rs->name);
        }
        p->collapsed[i] = coll;
        p->any_collapsed |= coll;
        p->any_wide |= !coll;
        p->n_re = i + 1;
    }
    return KILN_OK;
}

void kiln_pretok_free(kiln_pretok *p) {
    for (int i = 0; i < KILN_PRETOK_MAX_RE; i++) pcre2_code_free(p->re[i]);
    memset(p, 0, sizeof *p);
}

void kiln_pretok_buf_free(kiln_pretok_buf *b) {
    kiln_free(b->cps);
    kiln_free(b->utf8);
    kiln_free(b->cp_off);
    kiln_free(b->collapsed);
    kiln_free(b->wide);
    kiln_free(b->wide_b2c);
    kiln_free(b->wide_off);
    kiln_free(b->bounds[0]);
    kiln_free(b->bounds[1]);
    kiln_free(b->s_id);
    kiln_free(b->s_prev);
    kiln_free(b->s_next);
    kiln_free(b->s_off);
    kiln_free(b->s_len);
    kiln_free(b->s_rank);
    kiln_free(b->heap);
    kiln_free(b->enc);
    kiln_free(b->spm_memo);
    kiln_free(b->cache);
    kiln_free(b->cache_text);
    kiln_free(b->cache_ids);
    pcre2_match_data_free(b->md);
    pcre2_match_context_free(b->mctx);
    pcre2_jit_stack_free(b->jstack);
    memset(b, 0, sizeof *b);
}

static bool reserve(void **p, size_t *cap, size_t n, size_t elem) {
    if (*cap >= n) return true;
    size_t nc = *cap ? *cap : 256, bytes;
    while (nc < n) nc *= 2;
    if (!kiln_size_mul(nc, elem, &bytes)) return false;
    void *q = kiln_realloc(*p, bytes);
    if (!q) return false;
    *p = q;
    *cap = nc;
    return true;
}
#define RESERVE(ptr, cap, n) reserve((void **)&(ptr), &(cap), (n), sizeof *(ptr))

static uint8_t collapse_cp(uint32_t cp) {
    if (cp < 128) return (uint8_t)cp;
    uint8_t c = kiln_tok_cpt_class(cp);
    if (c & KILN_TOK_WS) return 0x0B;
    switch (c & KILN_TOK_CAT_MASK) {
    case KILN_TOK_CAT_NUMBER:
        return 0xD1;
    case KILN_TOK_CAT_LETTER:
        return 0xD2;
    case KILN_TOK_CAT_PUNCT:
        return 0xD3;
    case KILN_TOK_CAT_MARK:
        return 0xD4;
    case KILN_TOK_CAT_SYMBOL:
        return 0xD5;
    default:
        return 0xD0;
    }
}

kiln_status kiln_pretok_split(const kiln_pretok *p, kiln_pretok_buf *b, const char *text,
                              size_t len, const uint32_t **pieces, size_t *n_pieces,
                              size_t *utf8_len, kiln_err *err) {
    size_t cap_need;
    if (!kiln_size_add(len, 1, &cap_need) || !RESERVE(b->cps, b->cps_cap, cap_need) ||
        !RESERVE(b->cp_off, b->cp_off_cap, cap_need) ||
        !RESERVE(b->utf8, b->utf8_cap, cap_need * 3))
        return kiln_err_set(err, KILN_ERR_NOMEM, "pre-tokenizer buffers for %zu bytes", len);
    /* lenient decode, then re-encode (invalid bytes become U+FFFD, 3 bytes) */
    size_t ncp = 0, ob = 0;
    const uint8_t *s = (const uint8_t *)text;
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        if (s[i] < 0x80) {
            cp = s[i++];
            b->cp_off[ncp] = (uint32_t)ob;
            b->utf8[ob++] = (char)cp;
        } else {
            i += kiln_tok_decode(s + i, len - i, &cp);
            if (cp > 0x10FFFF) cp = 0xFFFD;
            b->cp_off[ncp] = (uint32_t)ob;
            ob += (size_t)kiln_tok_encode(cp, b->utf8 + ob);
        }
        b->cps[ncp++] = cp;
    }
    b->cp_off[ncp] = (uint32_t)ob;
    *utf8_len = ob;
    if (ob > UINT32_MAX - 1)
        return kiln_err_set(err, KILN_ERR_OVERFLOW, "text of %zu bytes is too long to tokenize",
                            len);

    if (p->any_collapsed) {
        if (!RESERVE(b->collapsed, b->collapsed_cap, ncp + 1))
            return kiln_err_set(err, KILN_ERR_NOMEM, "pre-tokenizer buffers for %zu bytes", len);
        for (size_t i = 0; i < ncp; i++) b->collapsed[i] = collapse_cp(b->cps[i]);
    }
    if (p->any_wide) {
        size_t wcap;
        if (!kiln_size_mul(ncp + 1, 4, &wcap) || !RESERVE(b->wide, b->wide_cap, wcap) ||
            !RESERVE(b->wide_b2c, b->wide_b2c_cap, wcap) ||
            !RESERVE(b->wide_off, b->wide_off_cap, ncp + 1))
            return kiln_err_set(err, KILN_ERR_NOMEM, "pre-tokenizer buffers for %zu bytes", len);
        size_t wb = 0;
        for (size_t i = 0; i < ncp; i++) {
            uint32_t cp = b->cps[i];
            if (cp >= 0x80 && (kiln_tok_cpt_class(cp) & KILN_TOK_WS)) cp = 0x0B;
            if (cp >= 0xD800 && cp <= 0xDFFF) cp = 0xFFFD; /* PCRE2 needs valid UTF-8 */
            b->wide_off[i] = (uint32_t)wb;
            int k = kiln_tok_encode(cp, b->wide + wb);
            for (int j = 0; j < k; j++) b->wide_b2c[wb + (size_t)j] = (uint32_t)i;
            wb += (size_t)k;
        }
        b->wide_b2c[wb] = (uint32_t)ncp;
        b->wide_off[ncp] = (uint32_t)wb;
    }

    if (!RESERVE(b->bounds[0], b->bounds_cap[0], ncp + 2) ||
        !RESERVE(b->bounds[1], b->bounds_cap[1], ncp + 2))
        return kiln_err_set(err, KILN_ERR_NOMEM, "pre-tokenizer buffers for %zu bytes", len);
    if (!b->md) {
        /* the JIT's default 32 KiB machine-stack area serves ordinary text; a large
         * stack is made only when a match runs out (long white-space runs) */
        b->md = pcre2_match_data_create(16, NULL);
        b->mctx = pcre2_match_context_create(NULL);
        if (!b->md || !b->mctx)
            return kiln_err_set(err, KILN_ERR_NOMEM, "regex match data: out of memory");
    }

    uint32_t *cur = b->bounds[0], *nxt = b->bounds[1];
    size_t ncur = 1; /* boundaries: cur[0] = 0, then piece ends */
    cur[0] = 0;
    if (ncp > 0) cur[ncur++] = (uint32_t)ncp;

    for (int r = 0; r < p->n_re; r++) {
        size_t nn = 1;
        nxt[0] = 0;
        bool coll = p->collapsed[r];
        for (size_t k = 0; k + 1 < ncur; k++) {
            uint32_t a = cur[k], e = cur[k + 1];
            const uint8_t *subj;
            size_t slen, base;
            if (coll) {
                subj = b->collapsed + a;
                slen = e - a;
                base = 0;
            } else {
                base = b->wide_off[a];
                subj = (const uint8_t *)b->wide + base;
                slen = b->wide_off[e] - base;
            }
            size_t start = 0, last = 0;
            while (start < slen) {
                int rc = pcre2_match(p->re[r], (PCRE2_SPTR)subj, slen, start,
                                     coll ? 0 : PCRE2_NO_UTF_CHECK, b->md, b->mctx);
                if (rc == PCRE2_ERROR_NOMATCH) break;
                if (rc == PCRE2_ERROR_JIT_STACKLIMIT && !b->jstack) {
                    b->jstack = pcre2_jit_stack_create(64 * 1024, 256 * 1024 * 1024, NULL);
                    if (!b->jstack)
                        return kiln_err_set(err, KILN_ERR_NOMEM, "regex stack: out of memory");
                    pcre2_jit_stack_assign(b->mctx, NULL, b->jstack);
                    continue; /* retry the same match with the large stack */
                }
                if (rc < 0) {
                    PCRE2_UCHAR msg[256];
                    pcre2_get_error_message(rc, msg, sizeof msg);
                    return kiln_err_set(err, KILN_ERR_INTERNAL, "pre-tokenizer '%s': regex: %s",
                                        p->name, (const char *)msg);
                }
                PCRE2_SIZE *ov = pcre2_get_ovector_pointer(b->md);
                size_t ms = ov[0], me = ov[1];
                if (me == ms) { /* empty match: no piece; move on one character */
                    start = ms + 1;
                    if (!coll)
                        while (start < slen && (subj[start] & 0xC0) == 0x80) start++;
                    continue;
                }
                uint32_t cms = coll ? a + (uint32_t)ms : b->wide_b2c[base + ms];
                uint32_t cme = coll ? a + (uint32_t)me : b->wide_b2c[base + me];
                if (ms > last) nxt[nn++] = cms;
                nxt[nn++] = cme;
                last = me;
                start = me;
            }
            if (last < slen) nxt[nn++] = e;
        }
        uint32_t *t = cur;
        cur = nxt;
        nxt = t;
        ncur = nn;
    }
    *pieces = cur;
    *n_pieces = ncur - 1;
    return KILN_OK;
}
