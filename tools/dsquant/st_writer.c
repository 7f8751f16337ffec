/* SPDX-License-Identifier: MIT */
#include <cjson/cJSON.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "st_writer.h"

DEFINE_TRIVIAL_CLEANUP_FUNC(cJSON *, cJSON_Delete);

typedef struct StEntry {
        char *name;
        StDtype dtype;
        uint32_t n_dims;
        uint64_t shape[ST_MAX_DIMS];
        uint64_t n_bytes;
        void *data; /* owned copy, or NULL when fill produces the bytes */
        StFillFn fill;
        void *userdata;
} StEntry;

struct StWriter {
        StEntry *entries; /* in the order added, which is the order in the file */
        size_t n, cap;
        cJSON *metadata; /* NULL until the first st_writer_add_metadata() */
};

int st_writer_new(StWriter **ret)
{
        StWriter *w = calloc(1, sizeof(*w));

        if (!w)
                return -ENOMEM;
        *ret = w;
        return 0;
}

StWriter *st_writer_free(StWriter *w)
{
        if (!w)
                return NULL;
        for (size_t i = 0; i < w->n; i++) {
                free(w->entries[i].name);
                free(w->entries[i].data);
        }
        free(w->entries);
        cJSON_Delete(w->metadata);
        free(w);
        return NULL;
}

/* Validates a new tensor and appends its entry (without data); returns the entry. */
static int entry_append(StWriter *w, const char *name, StDtype dtype, uint32_t n_dims,
        const uint64_t *shape, StEntry **ret)
{
        if (!w || !name || !*name || !strcmp(name, "__metadata__"))
                return -EINVAL;
        if (dtype < 0 || dtype >= _ST_DTYPE_MAX || n_dims > ST_MAX_DIMS || (n_dims && !shape))
                return -EINVAL;
        for (size_t i = 0; i < w->n; i++)
                if (!strcmp(w->entries[i].name, name))
                        return -EEXIST;

        uint64_t n_bytes = st_dtype_size(dtype);
        for (uint32_t d = 0; d < n_dims; d++)
                if (__builtin_mul_overflow(n_bytes, shape[d], &n_bytes))
                        return -EINVAL;

        if (w->n == w->cap) {
                size_t cap = w->cap ? w->cap * 2 : 64;
                StEntry *e = reallocarray(w->entries, cap, sizeof(*e));
                if (!e)
                        return -ENOMEM;
                w->entries = e;
                w->cap = cap;
        }

        char *copy = strdup(name);
        if (!copy)
                return -ENOMEM;

        StEntry *e = &w->entries[w->n++];
        *e = (StEntry){.name = copy, .dtype = dtype, .n_dims = n_dims, .n_bytes = n_bytes};
        if (n_dims)
                memcpy(e->shape, shape, n_dims * sizeof(*shape));
        *ret = e;
        return 0;
}

/* Undoes the last entry_append() after a later failure. */
static void entry_drop_last(StWriter *w)
{
        free(w->entries[--w->n].name);
}

int st_writer_add(StWriter *w, const char *name, StDtype dtype, uint32_t n_dims,
        const uint64_t *shape, const void *data, size_t n_bytes)
{
        StEntry *e;
        int r = entry_append(w, name, dtype, n_dims, shape, &e);
        if (r < 0)
                return r;

        if (e->n_bytes != n_bytes || (n_bytes && !data)) {
                entry_drop_last(w);
                return -EINVAL;
        }
        /* malloc(0) may return NULL; a zero-size tensor needs no copy. */
        if (n_bytes) {
                e->data = malloc(n_bytes);
                if (!e->data) {
                        entry_drop_last(w);
                        return -ENOMEM;
                }
                memcpy(e->data, data, n_bytes);
        }
        return 0;
}

int st_writer_add_lazy(StWriter *w, const char *name, StDtype dtype, uint32_t n_dims,
        const uint64_t *shape, StFillFn fill, void *userdata)
{
        if (!fill)
                return -EINVAL;

        StEntry *e;
        int r = entry_append(w, name, dtype, n_dims, shape, &e);
        if (r < 0)
                return r;
        e->fill = fill;
        e->userdata = userdata;
        return 0;
}

int st_writer_add_metadata(StWriter *w, const char *key, const char *value)
{
        if (!w || !key || !value)
                return -EINVAL;
        if (!w->metadata) {
                w->metadata = cJSON_CreateObject();
                if (!w->metadata)
                        return -ENOMEM;
        }
        cJSON_DeleteItemFromObjectCaseSensitive(w->metadata, key);
        if (!cJSON_AddStringToObject(w->metadata, key, value))
                return -ENOMEM;
        return 0;
}

/* cJSON keeps numbers as doubles and prints large ones in exponent form; offsets of
 * multi-gigabyte files must be exact integers, so they go in as raw text. */
static bool add_u64(cJSON *array, uint64_t v)
{
        char buf[24];

        snprintf(buf, sizeof(buf), "%" PRIu64, v);
        return cJSON_AddItemToArray(array, cJSON_CreateRaw(buf));
}

/* The header JSON, unpadded. *ret is malloc'ed by cJSON. */
static int header_build(const StWriter *w, char **ret)
{
        _cleanup_(cJSON_Deletep) cJSON *root = cJSON_CreateObject();
        uint64_t offset = 0;

        if (!root)
                return -ENOMEM;
        if (w->metadata) {
                cJSON *m = cJSON_Duplicate(w->metadata, true);
                if (!m || !cJSON_AddItemToObject(root, "__metadata__", m)) {
                        cJSON_Delete(m);
                        return -ENOMEM;
                }
        }
        for (size_t i = 0; i < w->n; i++) {
                const StEntry *e = &w->entries[i];
                cJSON *t = cJSON_AddObjectToObject(root, e->name);
                cJSON *shape = t ? cJSON_AddArrayToObject(t, "shape") : NULL;
                cJSON *offs = shape ? cJSON_AddArrayToObject(t, "data_offsets") : NULL;

                if (!offs || !cJSON_AddStringToObject(t, "dtype", st_dtype_name(e->dtype)))
                        return -ENOMEM;
                for (uint32_t d = 0; d < e->n_dims; d++)
                        if (!add_u64(shape, e->shape[d]))
                                return -ENOMEM;
                if (!add_u64(offs, offset) || !add_u64(offs, offset + e->n_bytes))
                        return -ENOMEM;
                offset += e->n_bytes;
        }

        char *s = cJSON_PrintUnformatted(root);
        if (!s)
                return -ENOMEM;
        *ret = s;
        return 0;
}

static int write_all(int fd, const void *buf, size_t n)
{
        const uint8_t *p = buf;

        while (n > 0) {
                ssize_t k = write(fd, p, n);
                if (k < 0) {
                        if (errno == EINTR)
                                continue;
                        return -errno;
                }
                p += k;
                n -= (size_t) k;
        }
        return 0;
}

static int entry_write(int fd, const StEntry *e, uint8_t **chunk, DsError *err)
{
        if (!e->fill) {
                int r = write_all(fd, e->data, e->n_bytes);
                return r < 0 ? ds_error(err, r, "writing tensor %s: %s", e->name, strerror(-r)) : 0;
        }

        if (!*chunk) {
                *chunk = malloc(ST_WRITER_CHUNK);
                if (!*chunk)
                        return ds_error(err, -ENOMEM, "out of memory");
        }
        /* Chunks start at multiples of the dtype size (ST_WRITER_CHUNK is a multiple of
         * every dtype size), so a generator never sees half an element. */
        for (uint64_t off = 0; off < e->n_bytes; off += ST_WRITER_CHUNK) {
                size_t n = (size_t) MIN((uint64_t) ST_WRITER_CHUNK, e->n_bytes - off);
                int r = e->fill(e->userdata, off, *chunk, n, err);
                if (r < 0) {
                        ds_error_prefix(err, "tensor %s", e->name);
                        return r;
                }
                r = write_all(fd, *chunk, n);
                if (r < 0)
                        return ds_error(err, r, "writing tensor %s: %s", e->name, strerror(-r));
        }
        return 0;
}

static void unlinkp(char **path)
{
        if (*path) {
                unlink(*path);
                free(*path);
        }
}

int st_writer_write(StWriter *w, const char *path, DsError *err)
{
        _cleanup_free_ char *header = NULL;
        _cleanup_free_ uint8_t *chunk = NULL;
        _cleanup_(unlinkp) char *tmp = NULL;
        _cleanup_close_ int fd = -EBADF;
        int r;

        if (!w || !path)
                return ds_error(err, -EINVAL, "st_writer_write: no writer or path");

        r = header_build(w, &header);
        if (r < 0)
                return ds_error(err, r, "%s: building the header: %s", path, strerror(-r));

        /* The reference writer pads with spaces so that the data buffer starts 8-aligned. */
        size_t len = strlen(header);
        size_t padded = (len + 7) & ~(size_t) 7;
        if (padded > ST_HEADER_MAX)
                return ds_error(err, -E2BIG, "%s: header of %zu bytes is over the %llu limit", path,
                        padded, ST_HEADER_MAX);

        if (asprintf(&tmp, "%s.tmpXXXXXX", path) < 0) {
                tmp = NULL;
                return ds_error(err, -ENOMEM, "out of memory");
        }
        fd = mkostemp(tmp, O_CLOEXEC);
        if (fd < 0) {
                r = -errno;
                free(TAKE_PTR(tmp));
                return ds_error(err, r, "%s: creating a temporary file: %s", path, strerror(-r));
        }
        /* mkostemp creates 0600; a checkpoint is meant to be read by the daemon's user. */
        if (fchmod(fd, 0644) < 0)
                return ds_error(err, -errno, "%s: fchmod: %s", tmp, strerror(errno));

        uint8_t size_le[8];
        for (int i = 0; i < 8; i++)
                size_le[i] = (uint8_t) ((uint64_t) padded >> (8 * i));
        static const char spaces[8] = "        ";
        r = write_all(fd, size_le, sizeof(size_le));
        if (r >= 0)
                r = write_all(fd, header, len);
        if (r >= 0)
                r = write_all(fd, spaces, padded - len);
        if (r < 0)
                return ds_error(err, r, "%s: writing the header: %s", tmp, strerror(-r));

        for (size_t i = 0; i < w->n; i++) {
                r = entry_write(fd, &w->entries[i], &chunk, err);
                if (r < 0) {
                        ds_error_prefix(err, "%s", path);
                        return r;
                }
        }

        /* Durable before it becomes visible: a crash leaves the old file or the new
         * one, never a truncated checkpoint under the final name. */
        if (fsync(fd) < 0)
                return ds_error(err, -errno, "%s: fsync: %s", tmp, strerror(errno));
        if (close(TAKE_FD(fd)) < 0)
                return ds_error(err, -errno, "%s: close: %s", tmp, strerror(errno));
        if (rename(tmp, path) < 0)
                return ds_error(err, -errno, "renaming %s to %s: %s", tmp, path, strerror(errno));
        free(TAKE_PTR(tmp));
        return 0;
}
