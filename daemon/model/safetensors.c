/* SPDX-License-Identifier: MIT */
/* safetensors reading: the file is mapped read-only and tensors are pointers into the map;
 * only the JSON header is copied (to NUL-terminate it for cJSON). */
#include "safetensors.h"

#include <cjson/cJSON.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include "macro.h"

static const struct {
        const char *name;
        size_t size;
} dtypes[_ST_DTYPE_MAX] = {
        [ST_BOOL] = {"BOOL", 1},
        [ST_U8] = {"U8", 1},
        [ST_I8] = {"I8", 1},
        [ST_F8_E5M2] = {"F8_E5M2", 1},
        [ST_F8_E4M3] = {"F8_E4M3", 1},
        [ST_I16] = {"I16", 2},
        [ST_U16] = {"U16", 2},
        [ST_F16] = {"F16", 2},
        [ST_BF16] = {"BF16", 2},
        [ST_I32] = {"I32", 4},
        [ST_U32] = {"U32", 4},
        [ST_F32] = {"F32", 4},
        [ST_F64] = {"F64", 8},
        [ST_I64] = {"I64", 8},
        [ST_U64] = {"U64", 8},
};

const char *st_dtype_name(StDtype t)
{
        if (t < 0 || t >= _ST_DTYPE_MAX)
                return "invalid";
        return dtypes[t].name;
}

size_t st_dtype_size(StDtype t)
{
        if (t < 0 || t >= _ST_DTYPE_MAX)
                return 0;
        return dtypes[t].size;
}

static StDtype dtype_from_name(const char *s)
{
        for (StDtype t = 0; t < _ST_DTYPE_MAX; t++)
                if (!strcmp(s, dtypes[t].name))
                        return t;
        return _ST_DTYPE_INVALID;
}

void st_tensors_free(StTensor *t, size_t n)
{
        if (!t)
                return;
        for (size_t i = 0; i < n; i++)
                free(t[i].name);
        free(t);
}

static void cjson_deletep(cJSON **j)
{
        cJSON_Delete(*j);
}

/* Integers in JSON arrive as doubles: exact up to 2^53, which bounds every offset and
 * dimension a real file can hold. */
#define ST_JSON_INT_MAX 9007199254740992.0

static bool json_uint(const cJSON *j, uint64_t *ret)
{
        if (!cJSON_IsNumber(j))
                return false;
        double d = j->valuedouble;
        if (!isfinite(d) || d < 0 || d > ST_JSON_INT_MAX || d != floor(d))
                return false;
        *ret = (uint64_t) d;
        return true;
}

/* The reference reader takes the header as a Rust str, so it must be valid UTF-8:
 * no overlong forms, no surrogates, nothing past U+10FFFF. */
static bool utf8_valid(const uint8_t *s, size_t n)
{
        size_t i = 0;

        while (i < n) {
                uint8_t c = s[i];
                size_t len;
                uint32_t cp;

                if (c < 0x80) {
                        i++;
                        continue;
                }
                if (c >= 0xc2 && c <= 0xdf)
                        len = 2, cp = c & 0x1f;
                else if (c >= 0xe0 && c <= 0xef)
                        len = 3, cp = c & 0x0f;
                else if (c >= 0xf0 && c <= 0xf4)
                        len = 4, cp = c & 0x07;
                else
                        return false;
                if (n - i < len)
                        return false;
                for (size_t k = 1; k < len; k++) {
                        if ((s[i + k] & 0xc0) != 0x80)
                                return false;
                        cp = cp << 6 | (s[i + k] & 0x3f);
                }
                if ((len == 3 && cp < 0x800) || (len == 4 && (cp < 0x10000 || cp > 0x10ffff)) ||
                        (cp >= 0xd800 && cp <= 0xdfff))
                        return false;
                i += len;
        }
        return true;
}

/* Formats a shape as "[4, 8]" for messages. */
static const char *shape_str(const StTensor *t, char *buf, size_t size)
{
        size_t at = 0;

        at += (size_t) snprintf(buf, size, "[");
        for (uint32_t i = 0; i < t->n_dims && at < size; i++)
                at += (size_t) snprintf(
                        buf + at, size - at, "%s%" PRIu64, i ? ", " : "", t->shape[i]);
        if (at < size)
                snprintf(buf + at, size - at, "]");
        return buf;
}

/* Fills everything but data from one header entry; ret_begin/ret_end are the offsets. */
static int parse_entry(const char *file, const cJSON *e, StTensor *t, uint64_t *ret_begin,
        uint64_t *ret_end, DsError *err)
{
        const char *name = e->string;
        const cJSON *dtype, *shape, *offsets, *d;
        uint64_t begin, end, numel = 1, n_bytes;
        char sbuf[256];

        if (!cJSON_IsObject(e))
                return ds_error(
                        err, -DS_ERR_FORMAT, "%s: tensor '%s': entry is not an object", file, name);

        dtype = cJSON_GetObjectItemCaseSensitive(e, "dtype");
        if (!cJSON_IsString(dtype))
                return ds_error(err, -DS_ERR_FORMAT,
                        "%s: tensor '%s': 'dtype' is missing or not a string", file, name);
        t->dtype = dtype_from_name(dtype->valuestring);
        if (t->dtype < 0)
                return ds_error(err, -DS_ERR_FORMAT, "%s: tensor '%s': unknown dtype '%.32s'", file,
                        name, dtype->valuestring);

        shape = cJSON_GetObjectItemCaseSensitive(e, "shape");
        if (!cJSON_IsArray(shape))
                return ds_error(err, -DS_ERR_FORMAT,
                        "%s: tensor '%s': 'shape' is missing or not an array", file, name);
        t->n_dims = 0;
        cJSON_ArrayForEach(d, shape)
        {
                if (t->n_dims == ST_MAX_DIMS)
                        return ds_error(err, -DS_ERR_FORMAT,
                                "%s: tensor '%s': shape has more than %d dimensions", file, name,
                                ST_MAX_DIMS);
                if (!json_uint(d, &t->shape[t->n_dims]))
                        return ds_error(err, -DS_ERR_FORMAT,
                                "%s: tensor '%s': shape dimension %u is not a non-negative integer",
                                file, name, t->n_dims);
                if (__builtin_mul_overflow(numel, t->shape[t->n_dims], &numel))
                        return ds_error(err, -DS_ERR_FORMAT,
                                "%s: tensor '%s': shape overflows the element count", file, name);
                t->n_dims++;
        }
        if (__builtin_mul_overflow(numel, (uint64_t) st_dtype_size(t->dtype), &n_bytes))
                return ds_error(err, -DS_ERR_FORMAT,
                        "%s: tensor '%s': shape overflows the byte count", file, name);
        t->numel = numel;
        t->n_bytes = n_bytes;

        offsets = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
        if (!cJSON_IsArray(offsets) || cJSON_GetArraySize(offsets) != 2)
                return ds_error(err, -DS_ERR_FORMAT,
                        "%s: tensor '%s': 'data_offsets' is missing or not a pair", file, name);
        if (!json_uint(offsets->child, &begin) || !json_uint(offsets->child->next, &end))
                return ds_error(err, -DS_ERR_FORMAT,
                        "%s: tensor '%s': data_offsets are not non-negative integers", file, name);
        if (begin > end)
                return ds_error(err, -DS_ERR_FORMAT,
                        "%s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64
                        "] end before they begin",
                        file, name, begin, end);
        if (end - begin != n_bytes)
                return ds_error(err, -DS_ERR_FORMAT,
                        "%s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64 "] hold %" PRIu64
                        " bytes but shape %s of %s needs %" PRIu64,
                        file, name, begin, end, end - begin, shape_str(t, sbuf, sizeof(sbuf)),
                        st_dtype_name(t->dtype), n_bytes);
        *ret_begin = begin;
        *ret_end = end;
        return 0;
}

static int check_metadata(const char *file, const cJSON *m, DsError *err)
{
        const cJSON *v;

        if (!cJSON_IsObject(m))
                return ds_error(err, -DS_ERR_FORMAT, "%s: '__metadata__' is not an object", file);
        cJSON_ArrayForEach(v, m) if (!cJSON_IsString(v)) return ds_error(err, -DS_ERR_FORMAT,
                "%s: '__metadata__' entry '%s' is not a string", file, v->string);
        return 0;
}

typedef struct Span {
        uint64_t begin, end;
        size_t tensor;
        const char *name;
} Span;

static int span_name_cmp(const void *a, const void *b)
{
        return strcmp(((const Span *) a)->name, ((const Span *) b)->name);
}

static int span_cmp(const void *a, const void *b)
{
        const Span *x = a, *y = b;

        if (x->begin != y->begin)
                return x->begin < y->begin ? -1 : 1;
        if (x->end != y->end)
                return x->end < y->end ? -1 : 1;
        return 0;
}

static int tensor_name_cmp(const void *a, const void *b)
{
        return strcmp(((const StTensor *) a)->name, ((const StTensor *) b)->name);
}

/* The reference reader's layout rule: sorted by offset, the entries tile the data buffer
 * exactly, from 0 to its end, with no gap and no overlap. */
static int check_layout(
        const char *file, const StTensor *t, Span *spans, size_t n, uint64_t data_len, DsError *err)
{
        uint64_t at = 0;

        qsort(spans, n, sizeof(*spans), span_cmp);
        for (size_t i = 0; i < n; i++) {
                const char *name = t[spans[i].tensor].name;

                if (spans[i].end > data_len)
                        return ds_error(err, -DS_ERR_FORMAT,
                                "%s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64
                                "] run past the data buffer of %" PRIu64 " bytes",
                                file, name, spans[i].begin, spans[i].end, data_len);
                if (spans[i].begin < at)
                        return ds_error(err, -DS_ERR_FORMAT,
                                "%s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64
                                "] overlap the previous tensor, which ends at %" PRIu64,
                                file, name, spans[i].begin, spans[i].end, at);
                if (spans[i].begin > at)
                        return ds_error(err, -DS_ERR_FORMAT,
                                "%s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64
                                "] leave a gap after offset %" PRIu64,
                                file, name, spans[i].begin, spans[i].end, at);
                at = spans[i].end;
        }
        if (at != data_len)
                return ds_error(err, -DS_ERR_FORMAT,
                        "%s: tensors end at offset %" PRIu64 " but the data buffer holds %" PRIu64
                        " bytes",
                        file, at, data_len);
        return 0;
}

int st_parse(const char *name, const uint8_t *buf, size_t size, StTensor **ret_tensors,
        size_t *ret_n, DsError *err)
{
        _cleanup_(cjson_deletep) cJSON *root = NULL;
        _cleanup_free_ char *header = NULL;
        _cleanup_free_ Span *spans = NULL;
        StTensor *tensors = NULL;
        const char *end = NULL;
        const cJSON *e;
        uint64_t hlen = 0, data_len;
        size_t n = 0, cap;
        int r;

        if (!buf && size > 0)
                return -EINVAL;
        if (size < 8)
                return ds_error(err, -DS_ERR_FORMAT,
                        "%s: file is %zu bytes, too short for the 8-byte header length", name,
                        size);
        for (int i = 7; i >= 0; i--)
                hlen = hlen << 8 | buf[i];
        if (hlen > ST_HEADER_MAX)
                return ds_error(err, -DS_ERR_FORMAT,
                        "%s: header length %" PRIu64 " is over the limit of %llu bytes", name, hlen,
                        ST_HEADER_MAX);
        if (hlen > size - 8)
                return ds_error(err, -DS_ERR_FORMAT,
                        "%s: header length %" PRIu64 " runs past the end of the %zu-byte file",
                        name, hlen, size);
        data_len = size - 8 - hlen;

        /* cJSON wants a NUL-terminated string; the header is small next to the data. */
        header = malloc(hlen + 1);
        if (!header)
                return -ENOMEM;
        memcpy(header, buf + 8, hlen);
        header[hlen] = 0;
        if (strlen(header) != hlen)
                return ds_error(err, -DS_ERR_FORMAT, "%s: header holds a NUL byte", name);
        if (!utf8_valid(buf + 8, hlen))
                return ds_error(err, -DS_ERR_FORMAT, "%s: header is not valid UTF-8", name);
        root = cJSON_ParseWithOpts(header, &end, false);
        if (!root)
                return ds_error(err, -DS_ERR_FORMAT, "%s: header is not valid JSON (near byte %zu)",
                        name, (size_t) (cJSON_GetErrorPtr() ? cJSON_GetErrorPtr() - header : 0));
        /* The reference writer pads with spaces; anything else after the JSON is garbage. */
        for (const char *p = end; *p; p++)
                if (!strchr(" \t\r\n", *p))
                        return ds_error(err, -DS_ERR_FORMAT,
                                "%s: header has trailing bytes after the JSON (at byte %zu)", name,
                                (size_t) (p - header));
        if (!cJSON_IsObject(root))
                return ds_error(err, -DS_ERR_FORMAT, "%s: header is not a JSON object", name);

        cap = (size_t) cJSON_GetArraySize(root);
        tensors = calloc(cap ? cap : 1, sizeof(*tensors));
        spans = calloc(cap ? cap : 1, sizeof(*spans));
        if (!tensors || !spans) {
                free(tensors);
                return -ENOMEM;
        }

        cJSON_ArrayForEach(e, root)
        {
                StTensor *t = &tensors[n];

                if (!strcmp(e->string, "__metadata__")) {
                        r = check_metadata(name, e, err);
                        if (r < 0)
                                goto fail;
                        continue;
                }
                r = parse_entry(name, e, t, &spans[n].begin, &spans[n].end, err);
                if (r < 0)
                        goto fail;
                t->name = strdup(e->string);
                if (!t->name) {
                        r = -ENOMEM;
                        goto fail;
                }
                t->file = name;
                spans[n].tensor = n;
                spans[n].name = t->name;
                n++;
        }

        /* A name listed twice is checked first: it is the cause of the overlap it makes. */
        qsort(spans, n, sizeof(*spans), span_name_cmp);
        for (size_t i = 1; i < n; i++)
                if (!strcmp(spans[i - 1].name, spans[i].name)) {
                        r = ds_error(err, -DS_ERR_FORMAT, "%s: tensor '%s' is listed twice", name,
                                spans[i].name);
                        goto fail;
                }
        r = check_layout(name, tensors, spans, n, data_len, err);
        if (r < 0)
                goto fail;
        for (size_t i = 0; i < n; i++)
                tensors[spans[i].tensor].data = buf + 8 + hlen + spans[i].begin;
        qsort(tensors, n, sizeof(*tensors), tensor_name_cmp);

        *ret_tensors = tensors;
        *ret_n = n;
        return 0;
fail:
        st_tensors_free(tensors, n);
        return r;
}

// --- One mapped file

struct StFile {
        char *path;
        void *map;
        size_t size;
        StTensor *tensors; /* sorted by name, pointing into map */
        size_t n;
};

StFile *st_file_free(StFile *f)
{
        if (!f)
                return NULL;
        st_tensors_free(f->tensors, f->n);
        if (f->map)
                munmap(f->map, f->size);
        free(f->path);
        free(f);
        return NULL;
}
DEFINE_TRIVIAL_CLEANUP_FUNC(StFile *, st_file_free);

int st_file_open(const char *path, StFile **ret, DsError *err)
{
        _cleanup_(st_file_freep) StFile *f = NULL;
        _cleanup_close_ int fd = -EBADF;
        struct stat st;
        void *map;
        int r;

        fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
                return ds_error(err, -errno, "%s: cannot open: %s", path, strerror(errno));
        if (fstat(fd, &st) < 0)
                return ds_error(err, -errno, "%s: cannot stat: %s", path, strerror(errno));
        if (!S_ISREG(st.st_mode))
                return ds_error(err, -EINVAL, "%s: not a regular file", path);

        f = calloc(1, sizeof(*f));
        if (!f)
                return -ENOMEM;
        f->path = strdup(path);
        if (!f->path)
                return -ENOMEM;
        if ((uint64_t) st.st_size > SIZE_MAX)
                return ds_error(err, -EFBIG, "%s: file too large to map", path);
        /* mmap refuses a zero length; st_parse then reports the file as too short. */
        if (st.st_size > 0) {
                map = mmap(NULL, (size_t) st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
                if (map == MAP_FAILED)
                        return ds_error(err, -errno, "%s: cannot map: %s", path, strerror(errno));
                f->map = map;
                f->size = (size_t) st.st_size;
        }

        r = st_parse(f->path, f->map, f->size, &f->tensors, &f->n, err);
        if (r < 0)
                return r;
        *ret = TAKE_PTR(f);
        return 0;
}

const StTensor *st_file_tensors(const StFile *f, size_t *ret_n)
{
        *ret_n = f->n;
        return f->tensors;
}

// --- A checkpoint directory: one file, or shards by index

struct StArchive {
        char *name; /* the index file, or the single file: what messages about it name */
        StFile **files;
        size_t n_files;
        const StTensor **index; /* every tensor of every file, sorted by name */
        size_t n;
};

StArchive *st_archive_free(StArchive *a)
{
        if (!a)
                return NULL;
        for (size_t i = 0; i < a->n_files; i++)
                st_file_free(a->files[i]);
        free(a->files);
        free(a->index);
        free(a->name);
        free(a);
        return NULL;
}
DEFINE_TRIVIAL_CLEANUP_FUNC(StArchive *, st_archive_free);

static int index_cmp(const void *a, const void *b)
{
        return strcmp((*(const StTensor *const *) a)->name, (*(const StTensor *const *) b)->name);
}

static int archive_add_file(StArchive *a, const char *path, DsError *err)
{
        StFile **files, *f;
        int r;

        files = realloc(a->files, (a->n_files + 1) * sizeof(*files));
        if (!files)
                return -ENOMEM;
        a->files = files;
        r = st_file_open(path, &f, err);
        if (r < 0)
                return r;
        a->files[a->n_files++] = f;
        return 0;
}

static int archive_build_index(StArchive *a, DsError *err)
{
        size_t n = 0, k = 0;

        for (size_t i = 0; i < a->n_files; i++)
                n += a->files[i]->n;
        a->index = calloc(n ? n : 1, sizeof(*a->index));
        if (!a->index)
                return -ENOMEM;
        for (size_t i = 0; i < a->n_files; i++)
                for (size_t j = 0; j < a->files[i]->n; j++)
                        a->index[k++] = &a->files[i]->tensors[j];
        qsort(a->index, n, sizeof(*a->index), index_cmp);
        a->n = n;
        for (size_t i = 1; i < n; i++)
                if (!strcmp(a->index[i - 1]->name, a->index[i]->name))
                        return ds_error(err, -DS_ERR_FORMAT, "tensor '%s' is in both %s and %s",
                                a->index[i]->name, a->index[i - 1]->file, a->index[i]->file);
        return 0;
}

int st_read_text(const char *path, size_t max, char **ret, size_t *ret_len, DsError *err)
{
        _cleanup_close_ int fd = -EBADF;
        _cleanup_free_ char *buf = NULL;
        struct stat st;
        size_t got = 0;

        fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
                return ds_error(err, -errno, "%s: cannot open: %s", path, strerror(errno));
        if (fstat(fd, &st) < 0)
                return ds_error(err, -errno, "%s: cannot stat: %s", path, strerror(errno));
        if (!S_ISREG(st.st_mode))
                return ds_error(err, -EINVAL, "%s: not a regular file", path);
        if ((uint64_t) st.st_size > max)
                return ds_error(err, -EFBIG, "%s: file is over %zu bytes", path, max);
        buf = malloc((size_t) st.st_size + 1);
        if (!buf)
                return -ENOMEM;
        while (got < (size_t) st.st_size) {
                ssize_t k = read(fd, buf + got, (size_t) st.st_size - got);
                if (k < 0 && errno == EINTR)
                        continue;
                if (k < 0)
                        return ds_error(err, -errno, "%s: cannot read: %s", path, strerror(errno));
                if (k == 0)
                        break;
                got += (size_t) k;
        }
        buf[got] = 0;
        *ret = TAKE_PTR(buf);
        *ret_len = got;
        return 0;
}

/* A shard name is a plain file name in the checkpoint directory. */
static bool shard_name_ok(const char *s)
{
        return *s && !strchr(s, '/') && !strstr(s, "..");
}

static int archive_open_sharded(StArchive *a, const char *dir, const char *index_path, DsError *err)
{
        _cleanup_(cjson_deletep) cJSON *root = NULL;
        _cleanup_free_ char *text = NULL;
        const cJSON *map, *e;
        size_t len;
        int r;

        r = st_read_text(index_path, 64u << 20, &text, &len, err);
        if (r < 0)
                return r;
        if (strlen(text) == len)
                root = cJSON_ParseWithOpts(text, NULL, true);
        if (!cJSON_IsObject(root))
                return ds_error(err, -DS_ERR_FORMAT, "%s: not a JSON object", index_path);
        map = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
        if (!cJSON_IsObject(map) || !map->child)
                return ds_error(
                        err, -DS_ERR_FORMAT, "%s: 'weight_map' is missing or empty", index_path);

        /* Open each named shard once, in order of first mention. */
        cJSON_ArrayForEach(e, map)
        {
                _cleanup_free_ char *path = NULL;
                bool seen = false;

                if (!cJSON_IsString(e))
                        return ds_error(err, -DS_ERR_FORMAT,
                                "%s: weight_map entry '%s' is not a file name", index_path,
                                e->string);
                if (!shard_name_ok(e->valuestring))
                        return ds_error(err, -DS_ERR_FORMAT,
                                "%s: weight_map entry '%s' names shard '%s', which is not a plain "
                                "file name",
                                index_path, e->string, e->valuestring);
                if (asprintf(&path, "%s/%s", dir, e->valuestring) < 0) {
                        path = NULL;
                        return -ENOMEM;
                }
                for (size_t i = 0; i < a->n_files && !seen; i++)
                        seen = !strcmp(a->files[i]->path, path);
                if (seen)
                        continue;
                r = archive_add_file(a, path, err);
                if (r < 0)
                        return ds_error_prefix(
                                err, "%s: weight_map entry '%s'", index_path, e->string);
        }

        r = archive_build_index(a, err);
        if (r < 0)
                return r;

        /* weight_map and the shards must agree both ways. */
        cJSON_ArrayForEach(e, map)
        {
                const StTensor *t = st_archive_find(a, e->string);
                const char *base;

                if (!t)
                        return ds_error(err, -DS_ERR_FORMAT,
                                "%s: tensor '%s' is mapped to %s but that shard does not hold it",
                                index_path, e->string, e->valuestring);
                base = strrchr(t->file, '/');
                base = base ? base + 1 : t->file;
                if (strcmp(base, e->valuestring))
                        return ds_error(err, -DS_ERR_FORMAT,
                                "%s: tensor '%s' is mapped to %s but is held by %s", index_path,
                                e->string, e->valuestring, t->file);
        }
        for (size_t i = 0; i < a->n; i++)
                if (!cJSON_GetObjectItemCaseSensitive(map, a->index[i]->name))
                        return ds_error(err, -DS_ERR_FORMAT,
                                "%s: tensor '%s' is not in the weight_map of %s", a->index[i]->file,
                                a->index[i]->name, index_path);
        /* Duplicate keys in weight_map would each pass the checks above; count them. */
        if ((size_t) cJSON_GetArraySize(map) != a->n)
                return ds_error(
                        err, -DS_ERR_FORMAT, "%s: weight_map lists a tensor twice", index_path);
        return 0;
}

int st_archive_open(const char *dir, StArchive **ret, DsError *err)
{
        _cleanup_(st_archive_freep) StArchive *a = NULL;
        _cleanup_free_ char *index_path = NULL, *single = NULL;
        int r;

        a = calloc(1, sizeof(*a));
        if (!a)
                return -ENOMEM;
        if (asprintf(&index_path, "%s/model.safetensors.index.json", dir) < 0) {
                index_path = NULL;
                return -ENOMEM;
        }
        if (asprintf(&single, "%s/model.safetensors", dir) < 0) {
                single = NULL;
                return -ENOMEM;
        }

        if (access(index_path, F_OK) == 0) {
                a->name = TAKE_PTR(index_path);
                r = archive_open_sharded(a, dir, a->name, err);
        } else {
                a->name = TAKE_PTR(single);
                r = archive_add_file(a, a->name, err);
                if (r >= 0)
                        r = archive_build_index(a, err);
        }
        if (r < 0)
                return r;
        *ret = TAKE_PTR(a);
        return 0;
}

const StTensor *st_archive_find(const StArchive *a, const char *name)
{
        size_t lo = 0, hi = a->n;

        while (lo < hi) {
                size_t mid = lo + (hi - lo) / 2;
                int c = strcmp(name, a->index[mid]->name);
                if (c == 0)
                        return a->index[mid];
                if (c < 0)
                        hi = mid;
                else
                        lo = mid + 1;
        }
        return NULL;
}

const StTensor *st_archive_tensor(const StArchive *a, size_t i)
{
        return i < a->n ? a->index[i] : NULL;
}

size_t st_archive_size(const StArchive *a)
{
        return a->n;
}

const char *st_archive_name(const StArchive *a)
{
        return a->name;
}

size_t st_archive_n_files(const StArchive *a)
{
        return a->n_files;
}
