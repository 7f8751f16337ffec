/* SPDX-License-Identifier: MIT */
/* Stand-in for libFuzzer's driver: runs LLVMFuzzerTestOneInput over every corpus file
 * named on the command line (files or directories), then over deterministic mutations of
 * them (bit flips, truncations, byte overwrites, splices), so that the default test suite
 * drives each parser with hostile input under the sanitizers. FUZZ_ITERATIONS sets the
 * number of mutations per corpus file (default 1000). */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

typedef struct Input {
        uint8_t *data;
        size_t size;
} Input;

static Input *inputs;
static size_t n_inputs;

static void add_file(const char *path)
{
        FILE *f = fopen(path, "rb");
        if (!f) {
                fprintf(stderr, "fuzz: cannot open %s\n", path);
                exit(1);
        }
        fseek(f, 0, SEEK_END);
        long size = ftell(f);
        fseek(f, 0, SEEK_SET);
        uint8_t *buf = malloc(size > 0 ? (size_t) size : 1);
        if (!buf || fread(buf, 1, (size_t) size, f) != (size_t) size) {
                fprintf(stderr, "fuzz: cannot read %s\n", path);
                exit(1);
        }
        fclose(f);
        inputs = realloc(inputs, (n_inputs + 1) * sizeof(*inputs));
        if (!inputs)
                exit(1);
        inputs[n_inputs++] = (Input){buf, (size_t) size};
}

static void add_path(const char *path)
{
        struct stat st;

        if (stat(path, &st) < 0) {
                fprintf(stderr, "fuzz: no such corpus path %s\n", path);
                exit(1);
        }
        if (!S_ISDIR(st.st_mode)) {
                add_file(path);
                return;
        }
        DIR *d = opendir(path);
        struct dirent *de;
        while (d && (de = readdir(d))) {
                char p[4096];
                if (de->d_name[0] == '.')
                        continue;
                snprintf(p, sizeof(p), "%s/%s", path, de->d_name);
                add_path(p);
        }
        if (d)
                closedir(d);
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint64_t rng(void)
{
        uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        return z ^ (z >> 31);
}

static size_t mutate(const Input *in, uint8_t *out, size_t cap)
{
        size_t n = in->size < cap ? in->size : cap;
        memcpy(out, in->data, n);
        unsigned rounds = 1 + rng() % 4;
        for (unsigned r = 0; r < rounds; r++) {
                switch (rng() % 5) {
                case 0: /* flip a bit */
                        if (n)
                                out[rng() % n] ^= (uint8_t) (1u << (rng() % 8));
                        break;
                case 1: /* truncate */
                        if (n)
                                n = rng() % n;
                        break;
                case 2: /* overwrite a byte with an interesting value */
                        if (n) {
                                static const uint8_t vals[] = {0, 0xff, 0x7f, 0x80, '"', '{', '}',
                                        '[', ']', ',', ':', '\\', '9', '-'};
                                out[rng() % n] = vals[rng() % sizeof(vals)];
                        }
                        break;
                case 3: /* splice in a chunk of another input */
                        if (n_inputs) {
                                const Input *o = &inputs[rng() % n_inputs];
                                if (o->size) {
                                        size_t off = rng() % o->size;
                                        size_t len = 1 + rng() % 64;
                                        size_t at = n ? rng() % n : 0;
                                        if (len > o->size - off)
                                                len = o->size - off;
                                        if (at + len > cap)
                                                len = cap - at;
                                        memcpy(out + at, o->data + off, len);
                                        if (at + len > n)
                                                n = at + len;
                                }
                        }
                        break;
                default: /* overwrite 8 bytes with a random little-endian integer */
                        if (n >= 8) {
                                uint64_t v = rng() >> (rng() % 64);
                                memcpy(out + rng() % (n - 7), &v, 8);
                        }
                        break;
                }
        }
        return n;
}

int main(int argc, char **argv)
{
        const char *it = getenv("FUZZ_ITERATIONS");
        unsigned long iterations = it ? strtoul(it, NULL, 10) : 1000;
        unsigned long runs = 0;

        for (int i = 1; i < argc; i++)
                add_path(argv[i]);
        if (!n_inputs) {
                fprintf(stderr, "fuzz: empty corpus\n");
                return 1;
        }
        for (size_t i = 0; i < n_inputs; i++, runs++)
                LLVMFuzzerTestOneInput(inputs[i].data, inputs[i].size);
        for (size_t i = 0; i < n_inputs; i++) {
                size_t cap = inputs[i].size + 128;
                uint8_t *buf = malloc(cap);
                if (!buf)
                        return 1;
                for (unsigned long k = 0; k < iterations; k++, runs++) {
                        size_t n = mutate(&inputs[i], buf, cap);
                        /* A fresh exact-size copy, so ASan sees reads past the end. */
                        uint8_t *exact = malloc(n ? n : 1);
                        if (!exact)
                                return 1;
                        memcpy(exact, buf, n);
                        LLVMFuzzerTestOneInput(exact, n);
                        free(exact);
                }
                free(buf);
        }
        printf("fuzz: %lu inputs ran, no crash\n", runs);
        for (size_t i = 0; i < n_inputs; i++)
                free(inputs[i].data);
        free(inputs);
        return 0;
}
