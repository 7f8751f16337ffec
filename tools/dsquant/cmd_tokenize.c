/* SPDX-License-Identifier: MIT */
/* dsquant tokenize / detokenize: text <-> ids through a tokenizer.json, one JSON value per
 * line, for checking dsd's tokenizer against other implementations. No special tokens are
 * added. The first bad line stops the command with a message naming the line. */
#include <cjson/cJSON.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "tokenizer.h"

static const char *arg_tokenizer;

static void help(FILE *f, const char *name)
{
        bool tok = !strcmp(name, "tokenize");
        fprintf(f,
                "Usage: dsquant %s --tokenizer FILE\n\n"
                "%s\n\n"
                "  --tokenizer FILE   a Hugging Face tokenizer.json\n"
                "  -h, --help         show this help\n",
                name,
                tok ? "Read one JSON string per line on stdin and write its token ids as one JSON\n"
                      "array per line.\n"
                      "No BOS/EOS is added; special tokens written in the text are recognised."
                    : "Read one JSON array of token ids per line on stdin and write the decoded "
                      "text\n"
                      "as one JSON string per line. Special tokens come out as their text; an id\n"
                      "outside the vocabulary is an error.");
}

/* Returns 1 to go on, 0 to exit successfully (--help), negative on a usage error. */
static int parse_argv(int argc, char **argv)
{
        static const struct option options[] = {
                {"tokenizer", required_argument, NULL, 't'},
                {"help", no_argument, NULL, 'h'},
                {},
        };
        int c;

        opterr = 0;
        optind = 1;
        while ((c = getopt_long(argc, argv, "+:h", options, NULL)) >= 0)
                switch (c) {
                case 't':
                        arg_tokenizer = optarg;
                        break;
                case 'h':
                        help(stdout, argv[0]);
                        return 0;
                case ':':
                        fprintf(stderr, "dsquant %s: option '%s' needs an argument\n", argv[0],
                                argv[optind - 1]);
                        return -EINVAL;
                default:
                        fprintf(stderr, "dsquant %s: unknown option '%s' (try --help)\n", argv[0],
                                argv[optind - 1]);
                        return -EINVAL;
                }
        if (optind < argc) {
                fprintf(stderr, "dsquant %s: unexpected argument '%s'\n", argv[0], argv[optind]);
                return -EINVAL;
        }
        if (!arg_tokenizer) {
                fprintf(stderr, "dsquant %s: --tokenizer FILE is required\n", argv[0]);
                return -EINVAL;
        }
        return 1;
}

static int hex4(const char *s, unsigned *ret)
{
        unsigned v = 0;
        for (int i = 0; i < 4; i++) {
                char c = s[i];
                int d = c >= '0' && c <= '9'                     ? c - '0'
                        : (c | 0x20) >= 'a' && (c | 0x20) <= 'f' ? (c | 0x20) - 'a' + 10
                                                                 : -1;
                if (d < 0)
                        return -EINVAL;
                v = v * 16 + (unsigned) d;
        }
        *ret = v;
        return 0;
}

/* Parses a line holding one JSON string into *ret (malloc'ed, may hold NUL bytes, which
 * cJSON cannot return). */
static int parse_json_string(const char *s, size_t len, char **ret, size_t *ret_len)
{
        _cleanup_free_ char *out = malloc(len + 1);
        size_t i = 0, n = 0;

        if (!out)
                return -ENOMEM;
        while (i < len && strchr(" \t\r\n", s[i]))
                i++;
        if (i >= len || s[i++] != '"')
                return -EINVAL;
        for (;;) {
                if (i >= len || (unsigned char) s[i] < 0x20)
                        return -EINVAL;
                char c = s[i++];
                if (c == '"')
                        break;
                if (c != '\\') {
                        out[n++] = c;
                        continue;
                }
                if (i >= len)
                        return -EINVAL;
                c = s[i++];
                const char *from = "\"\\/bfnrt", *to = "\"\\/\b\f\n\r\t", *p = strchr(from, c);
                if (c && p) {
                        out[n++] = to[p - from];
                        continue;
                }
                unsigned cp, lo;
                if (c != 'u' || len - i < 4 || hex4(s + i, &cp) < 0)
                        return -EINVAL;
                i += 4;
                if (cp >= 0xdc00 && cp <= 0xdfff)
                        return -EINVAL;
                if (cp >= 0xd800 && cp <= 0xdbff) {
                        if (len - i < 6 || s[i] != '\\' || s[i + 1] != 'u' ||
                                hex4(s + i + 2, &lo) < 0 || lo < 0xdc00 || lo > 0xdfff)
                                return -EINVAL;
                        i += 6;
                        cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
                }
                /* UTF-8 is never longer than the escape it came from. */
                if (cp < 0x80)
                        out[n++] = (char) cp;
                else if (cp < 0x800) {
                        out[n++] = (char) (0xc0 | cp >> 6);
                        out[n++] = (char) (0x80 | (cp & 0x3f));
                } else if (cp < 0x10000) {
                        out[n++] = (char) (0xe0 | cp >> 12);
                        out[n++] = (char) (0x80 | ((cp >> 6) & 0x3f));
                        out[n++] = (char) (0x80 | (cp & 0x3f));
                } else {
                        out[n++] = (char) (0xf0 | cp >> 18);
                        out[n++] = (char) (0x80 | ((cp >> 12) & 0x3f));
                        out[n++] = (char) (0x80 | ((cp >> 6) & 0x3f));
                        out[n++] = (char) (0x80 | (cp & 0x3f));
                }
        }
        while (i < len && strchr(" \t\r\n", s[i]))
                i++;
        if (i != len)
                return -EINVAL;
        out[n] = 0;
        *ret_len = n;
        *ret = TAKE_PTR(out);
        return 0;
}

static void print_json_string(const char *s, size_t len)
{
        putchar('"');
        for (size_t i = 0; i < len; i++) {
                unsigned char c = (unsigned char) s[i];
                if (c == '"' || c == '\\')
                        printf("\\%c", c);
                else if (c == '\n')
                        fputs("\\n", stdout);
                else if (c == '\t')
                        fputs("\\t", stdout);
                else if (c == '\r')
                        fputs("\\r", stdout);
                else if (c < 0x20 || c == 0x7f)
                        printf("\\u%04x", c);
                else
                        putchar(c);
        }
        fputs("\"\n", stdout);
}

static int load(Tokenizer **ret, const char *name)
{
        DsError err = {};
        int r = tokenizer_load(arg_tokenizer, ret, &err);
        if (r < 0)
                fprintf(stderr, "dsquant %s: %s\n", name, err.msg);
        return r;
}

int cmd_tokenize(int argc, char **argv)
{
        _cleanup_(tokenizer_freep) Tokenizer *t = NULL;
        _cleanup_free_ char *line = NULL;
        size_t cap = 0, lineno = 0;
        ssize_t len;
        int r;

        r = parse_argv(argc, argv);
        if (r <= 0)
                return r < 0 ? EXIT_FAILURE : EXIT_SUCCESS;
        if (load(&t, argv[0]) < 0)
                return EXIT_FAILURE;

        while ((len = getline(&line, &cap, stdin)) >= 0) {
                _cleanup_free_ char *text = NULL;
                _cleanup_free_ int32_t *ids = NULL;
                DsError err = {};
                size_t text_len, n;

                lineno++;
                r = parse_json_string(line, (size_t) len, &text, &text_len);
                if (r < 0) {
                        fprintf(stderr, "dsquant tokenize: <stdin>:%zu: %s\n", lineno,
                                r == -ENOMEM ? "out of memory" : "expected one JSON string");
                        return EXIT_FAILURE;
                }
                r = tokenizer_encode(t, text, text_len, &ids, &n, &err);
                if (r < 0) {
                        fprintf(stderr, "dsquant tokenize: <stdin>:%zu: %s\n", lineno, err.msg);
                        return EXIT_FAILURE;
                }
                putchar('[');
                for (size_t i = 0; i < n; i++)
                        printf(i ? ",%d" : "%d", ids[i]);
                fputs("]\n", stdout);
        }
        if (fflush(stdout) != 0 || ferror(stdout)) {
                fprintf(stderr, "dsquant tokenize: cannot write the output\n");
                return EXIT_FAILURE;
        }
        return EXIT_SUCCESS;
}

static void cjson_deletep(cJSON **j)
{
        cJSON_Delete(*j);
}

int cmd_detokenize(int argc, char **argv)
{
        _cleanup_(tokenizer_freep) Tokenizer *t = NULL;
        _cleanup_free_ char *line = NULL;
        size_t cap = 0, lineno = 0;
        ssize_t len;
        int r;

        r = parse_argv(argc, argv);
        if (r <= 0)
                return r < 0 ? EXIT_FAILURE : EXIT_SUCCESS;
        if (load(&t, argv[0]) < 0)
                return EXIT_FAILURE;

        while ((len = getline(&line, &cap, stdin)) >= 0) {
                const char *end = NULL;
                _cleanup_(cjson_deletep) cJSON *arr =
                        cJSON_ParseWithLengthOpts(line, (size_t) len, &end, false);
                _cleanup_free_ int32_t *ids = NULL;
                _cleanup_free_ char *text = NULL;
                DsError err = {};
                const cJSON *e;
                size_t n = 0, text_len;

                lineno++;
                while (end && end < line + len && strchr(" \t\r\n", *end))
                        end++;
                if (!cJSON_IsArray(arr) || end != line + len) {
                        fprintf(stderr,
                                "dsquant detokenize: <stdin>:%zu: expected one JSON array of ids\n",
                                lineno);
                        return EXIT_FAILURE;
                }
                ids = malloc(((size_t) cJSON_GetArraySize(arr) + 1) * sizeof(*ids));
                if (!ids) {
                        fprintf(stderr, "dsquant detokenize: out of memory\n");
                        return EXIT_FAILURE;
                }
                cJSON_ArrayForEach(e, arr)
                {
                        double v = e->valuedouble;
                        if (!cJSON_IsNumber(e) || !(v >= 0 && v <= INT32_MAX) ||
                                v != (double) (int32_t) v) {
                                fprintf(stderr,
                                        "dsquant detokenize: <stdin>:%zu: element %zu is not a "
                                        "token id\n",
                                        lineno, n);
                                return EXIT_FAILURE;
                        }
                        if (v >= tokenizer_n_vocab(t)) {
                                fprintf(stderr,
                                        "dsquant detokenize: <stdin>:%zu: element %zu: id %d is "
                                        "outside the vocabulary of %" PRIu32 " ids\n",
                                        lineno, n, (int32_t) v, tokenizer_n_vocab(t));
                                return EXIT_FAILURE;
                        }
                        ids[n++] = (int32_t) v;
                }
                r = tokenizer_decode(t, ids, n, &text, &text_len, &err);
                if (r < 0) {
                        fprintf(stderr, "dsquant detokenize: <stdin>:%zu: %s\n", lineno, err.msg);
                        return EXIT_FAILURE;
                }
                print_json_string(text, text_len);
        }
        if (fflush(stdout) != 0 || ferror(stdout)) {
                fprintf(stderr, "dsquant detokenize: cannot write the output\n");
                return EXIT_FAILURE;
        }
        return EXIT_SUCCESS;
}
