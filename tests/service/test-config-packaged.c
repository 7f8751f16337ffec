/* SPDX-License-Identifier: MIT */
/* packaging/dsd.json, the file the packages install as /etc/dsd/dsd.json, parses and
 * holds exactly the built-in defaults, with every field written out. */
#include <stdio.h>
#include <string.h>

#include "config.h"
#include "test_util.h"

int main(void)
{
        _cleanup_free_ char *file = NULL, *defaults = NULL;
        const char *src = getenv("DSD_SOURCE");
        DsdConfig c, d;
        DsError err = {};
        char path[4096];
        int r;

        CHECK(src, "DSD_SOURCE is not set; run through 'meson test'");
        snprintf(path, sizeof(path), "%s/packaging/dsd.json", src);
        r = config_load(path, false, &c, &err);
        CHECK(r == 1, "%s", err.msg);
        config_init(&d);
        CHECK(config_to_json(&c, &file) == 0 && config_to_json(&d, &defaults) == 0, "to_json");
        CHECK(strcmp(file, defaults) == 0, "%s differs from the defaults:\n%s\nwant:\n%s", path,
                file, defaults);

        /* Every field is written out, so that the file documents the whole schema: the
         * file has as many members as config_to_json() prints. */
        size_t n_file = 0, n_defaults = 0;
        FILE *f = fopen(path, "re");
        CHECK(f, "open %s", path);
        for (int ch; (ch = fgetc(f)) != EOF;)
                n_file += ch == ':';
        fclose(f);
        for (const char *p = defaults; *p; p++)
                n_defaults += *p == ':';
        CHECK(n_file == n_defaults, "%s has %zu members, the schema %zu", path, n_file, n_defaults);
        printf("test-config-packaged: %s holds the defaults\n", path);
        return 0;
}
