/* SPDX-License-Identifier: MIT */
/* st_writer: a file with mixed dtypes, copied and streamed tensors, read back with the
 * project's reader and checked byte by byte; argument errors; a failing generator leaves
 * neither the file nor its temporary behind. */
#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "st_writer.h"
#include "test_util.h"

static char dir[] = "/tmp/test-st-writer-XXXXXX";

/* Byte i of a streamed tensor is a function of its index, so any misplaced chunk shows. */
static uint8_t pattern(uint64_t i)
{
        return (uint8_t) (i * 131 + (i >> 13));
}

static int fill_pattern(void *userdata, uint64_t offset, void *buf, size_t n_bytes, DsError *err)
{
        size_t *calls = userdata;
        uint8_t *b = buf;

        CHECK(offset % 4 == 0 && n_bytes <= ST_WRITER_CHUNK, "chunk at %llu of %zu bytes",
                (unsigned long long) offset, n_bytes);
        for (size_t i = 0; i < n_bytes; i++)
                b[i] = pattern(offset + i);
        (*calls)++;
        return 0;
}

static int fill_fail(void *userdata, uint64_t offset, void *buf, size_t n_bytes, DsError *err)
{
        return ds_error(err, -EIO, "generator failed on purpose");
}

static uint64_t u64_le(const uint8_t *p)
{
        uint64_t v = 0;

        for (int i = 7; i >= 0; i--)
                v = v << 8 | p[i];
        return v;
}

static uint8_t *read_all(const char *path, size_t *ret_size)
{
        FILE *f = fopen(path, "rb");
        CHECK(f, "open %s", path);
        CHECK(fseek(f, 0, SEEK_END) == 0, "seek");
        long size = ftell(f);
        rewind(f);
        uint8_t *buf = malloc((size_t) size);
        CHECK(buf && fread(buf, 1, (size_t) size, f) == (size_t) size, "read %s", path);
        fclose(f);
        *ret_size = (size_t) size;
        return buf;
}

static size_t dir_entries(void)
{
        DIR *d = opendir(dir);
        struct dirent *e;
        size_t n = 0;

        CHECK(d, "opendir");
        while ((e = readdir(d)))
                n += e->d_name[0] != '.';
        closedir(d);
        return n;
}

static void check_roundtrip(void)
{
        _cleanup_(st_writer_freep) StWriter *w = NULL;
        char path[256];
        DsError err = {0};
        float f32[6] = {1.5f, -2.0f, 0.25f, 3.0f, -0.125f, 8.0f};
        uint16_t f16[3] = {0x3C00, 0xC000, 0x3800};
        int32_t i32[4] = {-1, 0, 0x12345678, INT32_MIN};
        uint8_t u8[5] = {1, 2, 3, 4, 5};
        /* Odd sizes everywhere, so the header and offsets land off any alignment. */
        uint64_t s_f32[2] = {2, 3}, s_f16[1] = {3}, s_i32[2] = {4, 1}, s_u8[1] = {5};
        uint64_t s_big[2] = {3, ST_WRITER_CHUNK / 4 + 7}; /* three chunks and a bit */
        uint64_t big_bytes = s_big[0] * s_big[1] * 4;
        size_t calls = 0;

        snprintf(path, sizeof(path), "%s/a.safetensors", dir);
        CHECK(st_writer_new(&w) == 0, "new");
        CHECK(st_writer_add_metadata(w, "format", "pt") == 0, "metadata");
        CHECK(st_writer_add(w, "weights.f32", ST_F32, 2, s_f32, f32, sizeof(f32)) == 0, "add f32");
        CHECK(st_writer_add(w, "b.f16", ST_F16, 1, s_f16, f16, sizeof(f16)) == 0, "add f16");
        CHECK(st_writer_add_lazy(w, "big", ST_I32, 2, s_big, fill_pattern, &calls) == 0,
                "add lazy");
        CHECK(st_writer_add(w, "ints", ST_I32, 2, s_i32, i32, sizeof(i32)) == 0, "add i32");
        CHECK(st_writer_add(w, "z", ST_U8, 1, s_u8, u8, sizeof(u8)) == 0, "add u8");
        CHECK(st_writer_add(w, "scalar", ST_F32, 0, NULL, f32, 4) == 0, "add scalar");

        /* Bad arguments are refused and leave the writer usable. */
        CHECK(st_writer_add(w, "ints", ST_I32, 2, s_i32, i32, sizeof(i32)) == -EEXIST, "duplicate");
        CHECK(st_writer_add(w, "short", ST_I32, 2, s_i32, i32, sizeof(i32) - 4) == -EINVAL, "size");
        CHECK(st_writer_add(w, "__metadata__", ST_U8, 1, s_u8, u8, 5) == -EINVAL, "reserved name");
        CHECK(st_writer_add(w, "", ST_U8, 1, s_u8, u8, 5) == -EINVAL, "empty name");
        CHECK(st_writer_add(w, "bad", _ST_DTYPE_MAX, 1, s_u8, u8, 5) == -EINVAL, "dtype");
        CHECK(st_writer_add(w, "deep", ST_U8, ST_MAX_DIMS + 1, s_u8, u8, 5) == -EINVAL, "dims");
        uint64_t huge[2] = {UINT64_MAX / 2, 4};
        CHECK(st_writer_add_lazy(w, "huge", ST_F32, 2, huge, fill_pattern, &calls) == -EINVAL,
                "overflow");
        CHECK(st_writer_add_lazy(w, "nofill", ST_F32, 1, s_u8, NULL, NULL) == -EINVAL, "no fill");

        CHECK(st_writer_write(w, path, &err) == 0, "write: %s", err.msg);
        CHECK(calls == 4, "the streamed tensor took %zu chunks", calls);
        CHECK(dir_entries() == 1, "temporary file left behind");

        size_t size;
        uint8_t *file = read_all(path, &size);
        uint64_t hlen = u64_le(file);
        CHECK(hlen % 8 == 0, "header length %llu is not a multiple of 8",
                (unsigned long long) hlen);
        CHECK(8 + hlen <= size, "header past the end");
        const char *hdr = (const char *) file + 8;
        CHECK(hdr[0] == '{', "header does not start with {");
        size_t close_at = hlen;
        while (close_at > 0 && hdr[close_at - 1] == ' ')
                close_at--;
        CHECK(close_at > 0 && hdr[close_at - 1] == '}' && hlen - close_at < 8,
                "header is not JSON padded with fewer than 8 spaces");
        CHECK(memmem(hdr, hlen, "\"__metadata__\":{\"format\":\"pt\"}", 30), "metadata missing");

        const uint8_t *data = file + 8 + hlen;
        uint64_t want_off = 0;
        struct {
                const char *name;
                StDtype dtype;
                uint64_t n_bytes;
                const void *bytes; /* NULL: the pattern */
        } want[] = {
                {"weights.f32", ST_F32, sizeof(f32), f32},
                {"b.f16", ST_F16, sizeof(f16), f16},
                {"big", ST_I32, big_bytes, NULL},
                {"ints", ST_I32, sizeof(i32), i32},
                {"z", ST_U8, sizeof(u8), u8},
                {"scalar", ST_F32, 4, f32},
        };
        CHECK(size == 8 + hlen + sizeof(f32) + sizeof(f16) + big_bytes + sizeof(i32) + sizeof(u8) +
                                4,
                "file size %zu", size);

        StFile *sf = NULL;
        CHECK(st_file_open(path, &sf, &err) == 0, "st_file_open: %s", err.msg);
        size_t n;
        const StTensor *t = st_file_tensors(sf, &n);
        CHECK(n == ELEMENTSOF(want), "%zu tensors", n);

        const uint8_t *base = NULL; /* the data buffer inside the reader's mapping */
        for (size_t j = 0; j < n; j++)
                if (!strcmp(t[j].name, "weights.f32"))
                        base = t[j].data;
        CHECK(base, "weights.f32 missing");

        for (size_t i = 0; i < ELEMENTSOF(want); i++) {
                const StTensor *found = NULL;
                for (size_t j = 0; j < n; j++)
                        if (!strcmp(t[j].name, want[i].name))
                                found = &t[j];
                CHECK(found, "%s missing", want[i].name);
                CHECK(found->dtype == want[i].dtype, "%s dtype", want[i].name);
                CHECK(found->n_bytes == want[i].n_bytes, "%s size", want[i].name);
                /* In the order added, contiguous from the start of the data buffer. */
                CHECK((const uint8_t *) found->data == base + want_off, "%s offset", want[i].name);
                CHECK(!memcmp(found->data, data + want_off, want[i].n_bytes), "%s read back",
                        want[i].name);
                if (want[i].bytes)
                        CHECK(!memcmp(data + want_off, want[i].bytes, want[i].n_bytes), "%s bytes",
                                want[i].name);
                else
                        for (uint64_t k = 0; k < want[i].n_bytes; k++)
                                CHECK(data[want_off + k] == pattern(k), "%s byte %llu",
                                        want[i].name, (unsigned long long) k);
                want_off += want[i].n_bytes;
        }
        const StTensor *f = NULL;
        for (size_t j = 0; j < n; j++)
                if (!strcmp(t[j].name, "weights.f32"))
                        f = &t[j];
        CHECK(f->n_dims == 2 && f->shape[0] == 2 && f->shape[1] == 3, "weights.f32 shape");
        for (size_t j = 0; j < n; j++)
                if (!strcmp(t[j].name, "scalar"))
                        CHECK(t[j].n_dims == 0 && t[j].numel == 1, "scalar shape");

        st_file_free(sf);
        free(file);
        CHECK(unlink(path) == 0, "unlink");
}

/* A generator that fails: the error comes back with context, nothing is left on disk,
 * and a file already under that name survives untouched. */
static void check_failure_leaves_nothing(void)
{
        _cleanup_(st_writer_freep) StWriter *w = NULL;
        char path[256];
        DsError err = {0};
        uint64_t shape[1] = {16};
        uint8_t u8[16] = {0};

        snprintf(path, sizeof(path), "%s/b.safetensors", dir);
        FILE *old = fopen(path, "w");
        CHECK(old && fputs("old", old) >= 0 && fclose(old) == 0, "old file");

        CHECK(st_writer_new(&w) == 0, "new");
        CHECK(st_writer_add(w, "first", ST_U8, 1, shape, u8, sizeof(u8)) == 0, "add");
        CHECK(st_writer_add_lazy(w, "broken", ST_F32, 1, shape, fill_fail, NULL) == 0, "add lazy");
        CHECK(st_writer_write(w, path, &err) == -EIO, "write did not fail");
        CHECK(strstr(err.msg, "broken") && strstr(err.msg, "on purpose") && strstr(err.msg, path),
                "message: %s", err.msg);
        CHECK(dir_entries() == 1, "temporary file left behind");

        size_t size;
        uint8_t *kept = read_all(path, &size);
        CHECK(size == 3 && !memcmp(kept, "old", 3), "old file changed");
        free(kept);
        CHECK(unlink(path) == 0, "unlink");

        /* Without a DsError the code still comes back. */
        CHECK(st_writer_write(w, path, NULL) == -EIO, "write without err did not fail");

        /* An unwritable place is an error naming the path. */
        CHECK(st_writer_write(w, "/nonexistent-dir/x.safetensors", &err) == -ENOENT, "bad dir");
        CHECK(strstr(err.msg, "/nonexistent-dir/x.safetensors"), "message: %s", err.msg);
}

int main(void)
{
        CHECK(mkdtemp(dir), "mkdtemp");
        check_roundtrip();
        check_failure_leaves_nothing();
        CHECK(dir_entries() == 0, "files left behind");
        CHECK(rmdir(dir) == 0, "rmdir");
        return 0;
}
