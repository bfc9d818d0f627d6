/* model_file.c — source detection and the unified metadata/tensor view (model_file.h). */
#include "format/model_file.h"
#include "base/mem.h"

#include "base/log.h"
#include "format/gguf.h"
#include "format/hf_map.h"
#include "format/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_JSON_FILE (64u << 20) /* config.json / index.json size limit */

struct kiln_model_file {
    char *path;
    kiln_model_source source;
    kiln_gguf *gguf;
    kiln_safetensors **st;
    size_t n_st;
    kiln_meta st_meta; /* safetensors: the mapped config.json */
    const kiln_meta *meta;
    kiln_tensor_info *tensors;
    const char **src_names;
    kiln_str *names;
    size_t n_tensors;
    kiln_strmap index;
    kiln_model_shard *shards;
    size_t n_shards;
    char *tokenizer_json;
    char arch[64];
    kiln_arena arena;
};

const char *kiln_model_source_name(kiln_model_source s) {
    return s == KILN_SOURCE_GGUF          ? "gguf"
           : s == KILN_SOURCE_SAFETENSORS ? "safetensors"
                                          : "unknown";
}

static bool is_file(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISREG(sb.st_mode);
}
static bool is_dir(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISDIR(sb.st_mode);
}
static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

/* Reads a whole (small) file into a malloc'ed buffer. */
static kiln_status read_file(const char *path, char **out, size_t *len, kiln_err *err) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return kiln_err_errno(err, errno, "opening %s", path);
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        kiln_status st = kiln_err_errno(err, errno, "stat %s", path);
        close(fd);
        return st;
    }
    if ((uint64_t)sb.st_size > MAX_JSON_FILE) {
        close(fd);
        return kiln_err_set(err, KILN_ERR_FORMAT, "%s: %lld bytes, larger than the %u-byte limit",
                            path, (long long)sb.st_size, MAX_JSON_FILE);
    }
    size_t n = (size_t)sb.st_size;
    char *buf = kiln_malloc(n + 1);
    if (!buf) {
        close(fd);
        return kiln_err_set(err, KILN_ERR_NOMEM, "reading %s", path);
    }
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(fd, buf + got, n - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            kiln_status st = r < 0 ? kiln_err_errno(err, errno, "reading %s", path)
                                   : kiln_err_set(err, KILN_ERR_IO, "reading %s: short read", path);
            kiln_free(buf);
            close(fd);
            return st;
        }
        got += (size_t)r;
    }
    close(fd);
    buf[n] = 0;
    *out = buf;
    *len = n;
    return KILN_OK;
}

static kiln_status join(char *out, size_t n, const char *dir, const char *name, kiln_err *err) {
    if (snprintf(out, n, "%s/%s", dir, name) >= (int)n)
        return kiln_err_set(err, KILN_ERR_RANGE, "path too long: %s/%s", dir, name);
    return KILN_OK;
}

static kiln_status alloc_tables(kiln_model_file *mf, size_t n, kiln_err *err) {
    mf->tensors = kiln_calloc(n ? n : 1, sizeof *mf->tensors);
    mf->src_names = kiln_calloc(n ? n : 1, sizeof *mf->src_names);
    mf->names = kiln_calloc(n ? n : 1, sizeof *mf->names);
    if (!mf->tensors || !mf->src_names || !mf->names)
        return kiln_err_set(err, KILN_ERR_NOMEM, "tensor table of %zu", n);
    return KILN_OK;
}

static kiln_status build_index(kiln_model_file *mf, kiln_err *err) {
    size_t dup;
    kiln_status st = kiln_strmap_build(&mf->index, mf->names, mf->n_tensors, &dup, err);
    if (st == KILN_ERR_FORMAT)
        return kiln_err_set(err, st, "%s: two tensors map to the name '%s' (the second is '%s')",
                            mf->path, mf->tensors[dup].name, mf->src_names[dup]);
    return st;
}

/* ---- GGUF ---------------------------------------------------------------------------- */

static kiln_status open_gguf(kiln_model_file *mf, uint32_t flags, kiln_err *err) {
    mf->source = KILN_SOURCE_GGUF;
    KILN_TRY(kiln_gguf_open(mf->path, flags, &mf->gguf, err));
    mf->meta = kiln_gguf_meta(mf->gguf);
    size_t n = kiln_gguf_tensor_count(mf->gguf);
    KILN_TRY(alloc_tables(mf, n, err));
    for (size_t i = 0; i < n; i++) {
        mf->tensors[i] = *kiln_gguf_tensor(mf->gguf, i);
        mf->src_names[i] = mf->tensors[i].name;
        mf->names[i].ptr = mf->tensors[i].name;
        mf->names[i].len = mf->tensors[i].name_len;
    }
    mf->n_tensors = n;
    mf->shards = kiln_calloc(1, sizeof *mf->shards);
    if (!mf->shards) return kiln_err_set(err, KILN_ERR_NOMEM, "shards");
    mf->n_shards = 1;
    mf->shards[0] = (kiln_model_shard){
        .path = kiln_gguf_path(mf->gguf),
        .fd = kiln_gguf_fd(mf->gguf),
        .base = kiln_gguf_base(mf->gguf),
        .size = kiln_gguf_file_size(mf->gguf),
        .data_offset = kiln_gguf_data_offset(mf->gguf),
        .alignment = kiln_gguf_alignment(mf->gguf),
    };
    return build_index(mf, err);
}

/* ---- safetensors -------------------------------------------------------------------- */

/* Shard file names from an index must be plain names inside the model directory. */
static kiln_status check_shard_name(const char *index_path, const char *name, kiln_err *err) {
    if (!*name || strchr(name, '/') || strcmp(name, "..") == 0 || strcmp(name, ".") == 0)
        return kiln_err_set(err, KILN_ERR_FORMAT,
                            "%s: shard file name \"%s\" is not a plain file name in the model "
                            "directory",
                            index_path, name);
    return KILN_OK;
}

static kiln_status open_shard(kiln_model_file *mf, const char *path, uint32_t flags,
                              kiln_err *err) {
    kiln_safetensors **st = kiln_realloc(mf->st, (mf->n_st + 1) * sizeof *st);
    if (!st) return kiln_err_set(err, KILN_ERR_NOMEM, "shards");
    mf->st = st;
    KILN_TRY(kiln_st_open(path, flags, &mf->st[mf->n_st], err));
    mf->n_st++;
    return KILN_OK;
}

/* Opens the shards of an index and checks that the index and the shards agree. */
static kiln_status open_index(kiln_model_file *mf, const char *dir, const char *index_path,
                              uint32_t flags, kiln_err *err) {
    char *text;
    size_t len;
    KILN_TRY(read_file(index_path, &text, &len, err));
    json_error_t je;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    kiln_free(text);
    if (!root)
        return kiln_err_set(err, KILN_ERR_FORMAT, "%s: %s (line %d, column %d)", index_path,
                            je.text, je.line, je.column);
    kiln_status st = KILN_OK;
    json_t *wm = json_object_get(root, "weight_map");
    if (!json_is_object(wm)) {
        st = kiln_err_set(err, KILN_ERR_FORMAT, "%s: \"weight_map\" missing or not an object",
                          index_path);
        goto done;
    }
    /* distinct shard files, in first-seen order */
    json_t *files = json_object();
    if (!files) {
        st = kiln_err_set(err, KILN_ERR_NOMEM, "index");
        goto done;
    }
    const char *tname;
    json_t *fv;
    json_object_foreach(wm, tname, fv) {
        if (!json_is_string(fv)) {
            st = kiln_err_set(err, KILN_ERR_FORMAT, "%s: weight_map[\"%s\"] is not a string",
                              index_path, tname);
            break;
        }
        const char *fname = json_string_value(fv);
        if ((st = check_shard_name(index_path, fname, err))) break;
        if (!json_object_get(files, fname)) {
            char p[PATH_MAX];
            if ((st = join(p, sizeof p, dir, fname, err))) break;
            if ((st = open_shard(mf, p, flags, err))) break;
            json_object_set_new(files, fname, json_integer((json_int_t)mf->n_st - 1));
        }
    }
    /* every index entry exists in its shard, every shard tensor is in the index */
    if (!st) {
        json_object_foreach(wm, tname, fv) {
            json_int_t k = json_integer_value(json_object_get(files, json_string_value(fv)));
            if (!kiln_st_find_tensor(mf->st[k], tname)) {
                st = kiln_err_set(err, KILN_ERR_FORMAT,
                                  "%s: tensor '%s' is listed in shard %s, which does not hold it",
                                  index_path, tname, json_string_value(fv));
                break;
            }
        }
    }
    for (size_t s = 0; !st && s < mf->n_st; s++) {
        for (size_t i = 0; i < kiln_st_tensor_count(mf->st[s]); i++) {
            const kiln_tensor_info *t = kiln_st_tensor(mf->st[s], i);
            json_t *f = json_object_get(wm, t->name);
            if (!f) {
                st = kiln_err_set(err, KILN_ERR_FORMAT, "%s: tensor '%s' is not in the index %s",
                                  kiln_st_path(mf->st[s]), t->name, index_path);
                break;
            }
            if (json_integer_value(json_object_get(files, json_string_value(f))) != (json_int_t)s) {
                st = kiln_err_set(err, KILN_ERR_FORMAT,
                                  "tensor '%s' is in %s and %s (duplicate across shards)", t->name,
                                  kiln_st_path(mf->st[s]), json_string_value(f));
                break;
            }
        }
    }
    json_decref(files);
done:
    json_decref(root);
    return st;
}

static kiln_status open_safetensors(kiln_model_file *mf, const char *dir, const char *index_path,
                                    const char *single, uint32_t flags, kiln_err *err) {
    mf->source = KILN_SOURCE_SAFETENSORS;
    kiln_meta_init(&mf->st_meta);
    mf->meta = &mf->st_meta;
    char p[PATH_MAX];
    KILN_TRY(join(p, sizeof p, dir, "config.json", err));
    if (is_file(p)) {
        char *text;
        size_t len;
        KILN_TRY(read_file(p, &text, &len, err));
        kiln_status st = kiln_hf_config_to_meta(text, len, p, &mf->st_meta, err);
        kiln_free(text);
        KILN_TRY(st);
    } else {
        KILN_WARN("%s: no config.json next to the model: no metadata, tensor names unmapped",
                  mf->path);
    }
    kiln_str arch;
    if (kiln_meta_opt_str(mf->meta, "general.architecture", "", &arch, NULL) == KILN_OK)
        snprintf(mf->arch, sizeof mf->arch, "%.*s", (int)arch.len, arch.ptr);
    KILN_TRY(join(p, sizeof p, dir, "tokenizer.json", err));
    if (is_file(p) && !(mf->tokenizer_json = kiln_strdup(p)))
        return kiln_err_set(err, KILN_ERR_NOMEM, "path");

    if (index_path) {
        KILN_TRY(open_index(mf, dir, index_path, flags, err));
    } else {
        KILN_TRY(open_shard(mf, single, flags, err));
    }
    size_t n = 0;
    for (size_t s = 0; s < mf->n_st; s++) n += kiln_st_tensor_count(mf->st[s]);
    KILN_TRY(alloc_tables(mf, n, err));
    mf->shards = kiln_calloc(mf->n_st ? mf->n_st : 1, sizeof *mf->shards);
    if (!mf->shards) return kiln_err_set(err, KILN_ERR_NOMEM, "shards");
    mf->n_shards = mf->n_st;
    size_t k = 0;
    for (size_t s = 0; s < mf->n_st; s++) {
        const kiln_safetensors *sf = mf->st[s];
        mf->shards[s] = (kiln_model_shard){
            .path = kiln_st_path(sf),
            .fd = kiln_st_fd(sf),
            .base = kiln_st_base(sf),
            .size = kiln_st_file_size(sf),
            .data_offset = kiln_st_data_offset(sf),
            .alignment = kiln_st_alignment(sf),
        };
        for (size_t i = 0; i < kiln_st_tensor_count(sf); i++, k++) {
            kiln_tensor_info t = *kiln_st_tensor(sf, i);
            mf->src_names[k] = t.name;
            char mapped[512];
            uint32_t fixup = KILN_FIXUP_NONE;
            if (mf->arch[0])
                kiln_hf_tensor_name(mf->arch, t.name, mapped, sizeof mapped, &fixup);
            else
                snprintf(mapped, sizeof mapped, "%s", t.name);
            size_t ml = strlen(mapped);
            char *nm = kiln_arena_strndup(&mf->arena, mapped, ml);
            if (!nm) return kiln_err_set(err, KILN_ERR_NOMEM, "tensor name");
            t.name = nm;
            t.name_len = ml;
            t.file = (uint32_t)s;
            t.fixup = fixup;
            mf->tensors[k] = t;
            mf->names[k].ptr = nm;
            mf->names[k].len = ml;
        }
    }
    mf->n_tensors = n;
    return build_index(mf, err);
}

/* ---- open / close -------------------------------------------------------------------- */

static kiln_status detect_and_open(kiln_model_file *mf, uint32_t flags, kiln_err *err) {
    const char *path = mf->path;
    char p[PATH_MAX], dir[PATH_MAX];
    if (is_dir(path)) {
        KILN_TRY(join(p, sizeof p, path, "model.safetensors.index.json", err));
        if (is_file(p)) return open_safetensors(mf, path, p, NULL, flags, err);
        KILN_TRY(join(p, sizeof p, path, "model.safetensors", err));
        if (is_file(p)) return open_safetensors(mf, path, NULL, p, flags, err);
        return kiln_err_set(err, KILN_ERR_NOT_FOUND,
                            "%s: a directory without model.safetensors.index.json or "
                            "model.safetensors",
                            path);
    }
    struct stat sb;
    if (stat(path, &sb) != 0) return kiln_err_errno(err, errno, "opening %s", path);
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash)
        *slash = 0;
    else
        snprintf(dir, sizeof dir, ".");
    if (ends_with(path, ".json")) return open_safetensors(mf, dir, path, NULL, flags, err);
    /* sniff the magic */
    char magic[4] = {0};
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return kiln_err_errno(err, errno, "opening %s", path);
    ssize_t r = read(fd, magic, 4);
    close(fd);
    if (r == 4 && memcmp(magic, "GGUF", 4) == 0) return open_gguf(mf, flags, err);
    if (ends_with(path, ".safetensors")) return open_safetensors(mf, dir, NULL, path, flags, err);
    if (ends_with(path, ".gguf")) return open_gguf(mf, flags, err); /* reports the bad magic */
    return kiln_err_set(err, KILN_ERR_FORMAT,
                        "%s: neither a GGUF file (magic \"GGUF\") nor a .safetensors file or "
                        "model directory",
                        path);
}

kiln_status kiln_model_file_open(const char *path, uint32_t flags, kiln_model_file **out,
                                 kiln_err *err) {
    *out = NULL;
    kiln_model_file *mf = kiln_calloc(1, sizeof *mf);
    if (!mf || !(mf->path = kiln_strdup(path))) {
        kiln_free(mf);
        return kiln_err_set(err, KILN_ERR_NOMEM, "model file");
    }
    kiln_arena_init(&mf->arena, 64 * 1024);
    kiln_status st = detect_and_open(mf, flags, err);
    if (st) {
        kiln_model_file_close(mf);
        return st;
    }
    if (mf->source == KILN_SOURCE_GGUF) {
        kiln_str arch;
        if (kiln_meta_opt_str(mf->meta, "general.architecture", "", &arch, NULL) == KILN_OK)
            snprintf(mf->arch, sizeof mf->arch, "%.*s", (int)arch.len, arch.ptr);
    }
    *out = mf;
    return KILN_OK;
}

void kiln_model_file_close(kiln_model_file *mf) {
    if (!mf) return;
    kiln_gguf_close(mf->gguf);
    for (size_t i = 0; i < mf->n_st; i++) kiln_st_close(mf->st[i]);
    kiln_free(mf->st);
    if (mf->source == KILN_SOURCE_SAFETENSORS) kiln_meta_free(&mf->st_meta);
    kiln_strmap_free(&mf->index);
    kiln_free(mf->tensors);
    kiln_free(mf->src_names);
    kiln_free(mf->names);
    kiln_free(mf->shards);
    kiln_free(mf->tokenizer_json);
    kiln_arena_free(&mf->arena);
    kiln_free(mf->path);
    kiln_free(mf);
}

kiln_model_source kiln_model_file_source(const kiln_model_file *mf) {
    return mf->source;
}
const char *kiln_model_file_path(const kiln_model_file *mf) {
    return mf->path;
}
const char *kiln_model_file_arch(const kiln_model_file *mf) {
    return mf->arch;
}
const kiln_meta *kiln_model_file_meta(const kiln_model_file *mf) {
    return mf->meta;
}
size_t kiln_model_file_tensor_count(const kiln_model_file *mf) {
    return mf->n_tensors;
}
const kiln_tensor_info *kiln_model_file_tensor(const kiln_model_file *mf, size_t i) {
    return i < mf->n_tensors ? &mf->tensors[i] : NULL;
}
const kiln_tensor_info *kiln_model_file_find_tensor(const kiln_model_file *mf, const char *name) {
    int64_t i = kiln_strmap_find(&mf->index, mf->names, kiln_str_c(name));
    return i < 0 ? NULL : &mf->tensors[i];
}
const char *kiln_model_file_tensor_src_name(const kiln_model_file *mf, size_t i) {
    return i < mf->n_tensors ? mf->src_names[i] : NULL;
}
size_t kiln_model_file_shard_count(const kiln_model_file *mf) {
    return mf->n_shards;
}
const kiln_model_shard *kiln_model_file_shard(const kiln_model_file *mf, size_t i) {
    return i < mf->n_shards ? &mf->shards[i] : NULL;
}
const char *kiln_model_file_tokenizer_json(const kiln_model_file *mf) {
    return mf->tokenizer_json;
}
uint64_t kiln_model_file_tensor_bytes(const kiln_model_file *mf) {
    uint64_t s = 0;
    for (size_t i = 0; i < mf->n_tensors; i++) s += mf->tensors[i].nbytes;
    return s;
}
