/* SPDX-License-Identifier: MIT */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "out_files.h"

int out_dir_prepare(const char *dir, DsError *err)
{
        struct stat st;

        if (mkdir(dir, 0755) == 0)
                return 0;
        if (errno != EEXIST)
                return ds_error(
                        err, -errno, "%s: cannot create directory: %s", dir, strerror(errno));
        if (stat(dir, &st) < 0)
                return ds_error(err, -errno, "%s: %s", dir, strerror(errno));
        if (!S_ISDIR(st.st_mode))
                return ds_error(err, -ENOTDIR, "%s: exists and is not a directory", dir);
        return 0;
}

static void unlinkp(char **path)
{
        if (*path) {
                unlink(*path);
                free(*path);
        }
}

int out_write_text(const char *dir, const char *name, const char *text, size_t len, DsError *err)
{
        _cleanup_free_ char *path = NULL;
        _cleanup_(unlinkp) char *tmp = NULL;
        _cleanup_close_ int fd = -EBADF;

        if (asprintf(&path, "%s/%s", dir, name) < 0 || asprintf(&tmp, "%s.tmpXXXXXX", path) < 0) {
                tmp = NULL;
                return ds_error(err, -ENOMEM, "out of memory");
        }
        fd = mkostemp(tmp, O_CLOEXEC);
        if (fd < 0) {
                int r = -errno;
                free(TAKE_PTR(tmp));
                return ds_error(err, r, "%s: creating a temporary file: %s", path, strerror(-r));
        }
        if (fchmod(fd, 0644) < 0)
                return ds_error(err, -errno, "%s: fchmod: %s", tmp, strerror(errno));
        for (size_t done = 0; done < len;) {
                ssize_t k = write(fd, text + done, len - done);
                if (k < 0 && errno == EINTR)
                        continue;
                if (k < 0)
                        return ds_error(err, -errno, "%s: write: %s", tmp, strerror(errno));
                done += (size_t) k;
        }
        if (fsync(fd) < 0)
                return ds_error(err, -errno, "%s: fsync: %s", tmp, strerror(errno));
        if (close(TAKE_FD(fd)) < 0)
                return ds_error(err, -errno, "%s: close: %s", tmp, strerror(errno));
        if (rename(tmp, path) < 0)
                return ds_error(err, -errno, "renaming %s to %s: %s", tmp, path, strerror(errno));
        free(TAKE_PTR(tmp));
        return 0;
}

int out_write_json(const char *dir, const char *name, const cJSON *json, DsError *err)
{
        _cleanup_free_ char *text = cJSON_Print(json);

        if (!text)
                return ds_error(err, -ENOMEM, "%s/%s: out of memory", dir, name);

        size_t len = strlen(text);
        _cleanup_free_ char *line = malloc(len + 2);
        if (!line)
                return ds_error(err, -ENOMEM, "%s/%s: out of memory", dir, name);
        memcpy(line, text, len);
        line[len] = '\n';
        line[len + 1] = 0;
        return out_write_text(dir, name, line, len + 1, err);
}
