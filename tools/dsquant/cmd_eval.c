/* SPDX-License-Identifier: MIT */
/* dsquant eval: one forward pass from position 0 over a list of ids (writing every
 * position's float32 logits) or over a tokenized text (printing its perplexity), through
 * the same backend interface the daemon uses. Timings go to stderr. */
#include <cjson/cJSON.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend.h"
#include "commands.h"
#include "model.h"
#include "tokenizer.h"

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the logits file is written in host order, which must be little-endian"
#endif

#define EVAL_BLOCK_TOKENS 16
#define EVAL_CHUNK        64 /* positions per step in --text mode, whose logits are kept */

static const char *arg_model;
static const char *arg_ids;
static const char *arg_logits_out;
static const char *arg_text;
static const char *arg_backend = "cpu";
static uint32_t arg_threads;
static uint32_t arg_decode;
static bool arg_lm_head_int8;

static void eval_help(FILE *f)
{
        fprintf(f,
                "Usage: dsquant eval --model DIR (--ids FILE.json [--logits-out OUT.f32]\n"
                "                    [--decode N] | --text FILE)\n\n"
                "Run one forward pass from position 0 and either write the logits of every\n"
                "position as float32 little-endian [n][vocab_size], or print the perplexity of\n"
                "a text tokenized with DIR/tokenizer.json (BOS prepended when the tokenizer\n"
                "adds one). --ids takes --logits-out, --decode or both. Timings go to stderr.\n\n"
                "  --model DIR           the checkpoint directory\n"
                "  --ids FILE.json       a JSON array of token ids\n"
                "  --logits-out OUT.f32  where --ids mode writes the logits\n"
                "  --text FILE           a UTF-8 text whose perplexity to print\n"
                "  --decode N            after --ids, greedy-decode N more tokens and print them\n"
                "  --backend NAME        cpu (default), cuda or auto\n"
                "  --threads N           CPU worker threads\n"
                "  --lm-head-int8        quantize the lm_head to 8 bits a weight (a float32 scale\n"
                "                        per group of 128 inputs) at load, as dsd --lm-head-int8\n"
                "  -h, --help            show this help\n");
}

static int parse_uint(const char *opt, const char *s, uint32_t *ret)
{
        char *end;
        unsigned long v;

        errno = 0;
        v = strtoul(s, &end, 10);
        if (errno || end == s || *end || v > UINT32_MAX || s[0] == '-') {
                fprintf(stderr, "dsquant eval: option '%s': bad number '%s'\n", opt, s);
                return -EINVAL;
        }
        *ret = (uint32_t) v;
        return 0;
}

/* Returns 1 to run, 0 to exit successfully (--help), or a negative code. */
static int parse_argv(int argc, char **argv)
{
        static const struct option options[] = {
                {"model", required_argument, NULL, 'm'},
                {"ids", required_argument, NULL, 'i'},
                {"logits-out", required_argument, NULL, 'o'},
                {"text", required_argument, NULL, 't'},
                {"decode", required_argument, NULL, 'd'},
                {"backend", required_argument, NULL, 'b'},
                {"threads", required_argument, NULL, 'j'},
                {"lm-head-int8", no_argument, NULL, 'q'},
                {"help", no_argument, NULL, 'h'},
                {},
        };
        int c;

        opterr = 0;
        optind = 1;
        while ((c = getopt_long(argc, argv, "+:h", options, NULL)) >= 0)
                switch (c) {
                case 'm':
                        arg_model = optarg;
                        break;
                case 'i':
                        arg_ids = optarg;
                        break;
                case 'o':
                        arg_logits_out = optarg;
                        break;
                case 't':
                        arg_text = optarg;
                        break;
                case 'd':
                        if (parse_uint("--decode", optarg, &arg_decode) < 0)
                                return -EINVAL;
                        break;
                case 'b':
                        arg_backend = optarg;
                        break;
                case 'j':
                        if (parse_uint("--threads", optarg, &arg_threads) < 0)
                                return -EINVAL;
                        break;
                case 'q':
                        arg_lm_head_int8 = true;
                        break;
                case 'h':
                        eval_help(stdout);
                        return 0;
                case ':':
                        fprintf(stderr, "dsquant eval: option '%s' needs an argument\n",
                                argv[optind - 1]);
                        return -EINVAL;
                default:
                        fprintf(stderr, "dsquant eval: unknown option '%s' (try --help)\n",
                                argv[optind - 1]);
                        return -EINVAL;
                }
        if (optind < argc) {
                fprintf(stderr, "dsquant eval: unexpected argument '%s'\n", argv[optind]);
                return -EINVAL;
        }
        if (!arg_model) {
                fprintf(stderr, "dsquant eval: --model DIR is required\n");
                return -EINVAL;
        }
        if (!!arg_ids == !!arg_text) {
                fprintf(stderr, "dsquant eval: give exactly one of --ids and --text\n");
                return -EINVAL;
        }
        if (arg_ids && !arg_logits_out && arg_decode == 0) {
                fprintf(stderr, "dsquant eval: --ids needs --logits-out (or --decode)\n");
                return -EINVAL;
        }
        if (arg_text && (arg_logits_out || arg_decode)) {
                fprintf(stderr, "dsquant eval: --logits-out and --decode go with --ids\n");
                return -EINVAL;
        }
        return 1;
}

static double now_s(void)
{
        struct timespec ts;

        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (double) ts.tv_sec + (double) ts.tv_nsec * 1e-9;
}

/* The whole of path, NUL-terminated, in *ret (malloc'ed). */
static int read_file(const char *path, char **ret, size_t *ret_len)
{
        _cleanup_free_ char *buf = NULL;
        size_t len = 0, cap = 0;
        FILE *f = fopen(path, "re");

        if (!f)
                return -errno;
        for (;;) {
                if (len + 4096 + 1 > cap) {
                        cap = (len + 4096 + 1) * 2;
                        char *n = realloc(buf, cap);
                        if (!n) {
                                fclose(f);
                                return -ENOMEM;
                        }
                        buf = n;
                }
                size_t got = fread(buf + len, 1, cap - len - 1, f);
                len += got;
                if (got == 0)
                        break;
        }
        int r = ferror(f) ? -EIO : 0;
        fclose(f);
        if (r < 0)
                return r;
        buf[len] = 0;
        *ret = TAKE_PTR(buf);
        *ret_len = len;
        return 0;
}

static int read_ids(const char *path, uint32_t vocab, int32_t **ret, uint32_t *ret_n)
{
        _cleanup_free_ char *text = NULL;
        _cleanup_free_ int32_t *ids = NULL;
        size_t len;
        int r;

        r = read_file(path, &text, &len);
        if (r < 0) {
                fprintf(stderr, "dsquant eval: Failed to read '%s': %s\n", path, strerror(-r));
                return r;
        }
        cJSON *root = cJSON_ParseWithLength(text, len);
        if (!cJSON_IsArray(root) || cJSON_GetArraySize(root) == 0) {
                cJSON_Delete(root);
                fprintf(stderr, "dsquant eval: '%s' is not a non-empty JSON array of ids\n", path);
                return -DS_ERR_FORMAT;
        }
        uint32_t n = (uint32_t) cJSON_GetArraySize(root);
        ids = calloc(n, sizeof(int32_t));
        if (!ids) {
                cJSON_Delete(root);
                return -ENOMEM;
        }
        uint32_t i = 0;
        const cJSON *item;
        cJSON_ArrayForEach(item, root)
        {
                double v = item->valuedouble;
                if (!cJSON_IsNumber(item) || v != floor(v) || v < 0 || v >= vocab) {
                        cJSON_Delete(root);
                        fprintf(stderr, "dsquant eval: '%s': element %u is not an id below %u\n",
                                path, i, vocab);
                        return -DS_ERR_FORMAT;
                }
                ids[i++] = (int32_t) v;
        }
        cJSON_Delete(root);
        *ret = TAKE_PTR(ids);
        *ret_n = n;
        return 0;
}

static int read_text_ids(const char *dir, const char *path, int32_t **ret, uint32_t *ret_n)
{
        _cleanup_(tokenizer_freep) Tokenizer *t = NULL;
        _cleanup_free_ char *text = NULL, *tok_path = NULL, *cfg_path = NULL;
        _cleanup_free_ int32_t *ids = NULL;
        DsError err = {};
        bool unknown_template;
        size_t len, n;
        int r;

        if (asprintf(&tok_path, "%s/tokenizer.json", dir) < 0 ||
                asprintf(&cfg_path, "%s/tokenizer_config.json", dir) < 0)
                return -ENOMEM;
        r = tokenizer_load(tok_path, &t, &err);
        if (r < 0) {
                fprintf(stderr, "dsquant eval: Failed to load '%s': %s\n", tok_path, err.msg);
                return r;
        }
        r = tokenizer_load_config(t, cfg_path, &unknown_template, &err);
        if (r < 0) {
                fprintf(stderr, "dsquant eval: Failed to load '%s': %s\n", cfg_path, err.msg);
                return r;
        }
        r = read_file(path, &text, &len);
        if (r < 0) {
                fprintf(stderr, "dsquant eval: Failed to read '%s': %s\n", path, strerror(-r));
                return r;
        }
        r = tokenizer_encode(t, text, len, &ids, &n, &err);
        if (r < 0) {
                fprintf(stderr, "dsquant eval: Failed to tokenize '%s': %s\n", path, err.msg);
                return r;
        }

        /* BOS in front when the tokenizer adds one. */
        bool bos = tokenizer_add_bos(t) && tokenizer_bos(t) >= 0;
        int32_t *all = malloc((n + bos) * sizeof(int32_t));
        if (!all)
                return -ENOMEM;
        if (bos)
                all[0] = tokenizer_bos(t);
        memcpy(all + bos, ids, n * sizeof(int32_t));
        if (n + bos < 2 || n + bos > UINT32_MAX) {
                free(all);
                fprintf(stderr, "dsquant eval: '%s': %zu tokens; perplexity needs at least 2\n",
                        path, n + bos);
                return -EINVAL;
        }
        *ret = all;
        *ret_n = (uint32_t) (n + bos);
        return 0;
}

/* -log softmax(row)[target], over the full vocab_size as transformers computes it. */
static double nll(const float *row, uint32_t vocab, int32_t target)
{
        float max = row[0];
        for (uint32_t i = 1; i < vocab; i++)
                max = fmaxf(max, row[i]);
        double sum = 0;
        for (uint32_t i = 0; i < vocab; i++)
                sum += exp((double) row[i] - max);
        return log(sum) + max - row[target];
}

static const BackendOps *ops; /* the --backend table */

static void backend_freep(Backend **b)
{
        if (*b)
                ops->free(*b);
}

int cmd_eval(int argc, char **argv)
{
        _cleanup_(model_freep) Model *m = NULL;
        _cleanup_(backend_freep) Backend *b = NULL;
        _cleanup_free_ int32_t *ids = NULL;
        _cleanup_free_ uint32_t *blocks = NULL;
        _cleanup_free_ float *logits = NULL;
        DsError err = {};
        uint32_t n = 0;
        int r;

        r = parse_argv(argc, argv);
        if (r <= 0)
                return r < 0 ? EXIT_FAILURE : EXIT_SUCCESS;

        ops = backend_find(arg_backend);
        if (!ops) {
                fprintf(stderr, "dsquant eval: backend '%s' is not available\n", arg_backend);
                return EXIT_FAILURE;
        }

        double t0 = now_s();
        r = model_load(arg_model, &(ModelOptions){.lm_head_int8 = arg_lm_head_int8}, &m, &err);
        if (r < 0) {
                fprintf(stderr, "dsquant eval: Failed to load model '%s': %s\n", arg_model,
                        err.msg[0] ? err.msg : ds_strerror_internal(r));
                return EXIT_FAILURE;
        }
        const BkConfig *c = &m->bk.cfg;

        r = arg_ids ? read_ids(arg_ids, c->vocab_size, &ids, &n)
                    : read_text_ids(arg_model, arg_text, &ids, &n);
        if (r < 0)
                return EXIT_FAILURE;
        uint64_t positions = (uint64_t) n + arg_decode;
        if (positions > c->max_positions) {
                fprintf(stderr, "dsquant eval: %llu positions, past the model's limit of %u\n",
                        (unsigned long long) positions, c->max_positions);
                return EXIT_FAILURE;
        }

        uint32_t n_blocks = (uint32_t) ((positions + EVAL_BLOCK_TOKENS - 1) / EVAL_BLOCK_TOKENS);
        r = ops->create(&(BkOptions){.threads = arg_threads}, &b, &err);
        if (r >= 0)
                r = ops->load(b, &m->bk, &err);
        if (r >= 0) {
                uint64_t bytes = ops->kv_bytes_per_token(b) * EVAL_BLOCK_TOKENS * n_blocks;
                int64_t got = ops->kv_init(b, EVAL_BLOCK_TOKENS, bytes, &err);
                r = got < 0 ? (int) got : 0;
        }
        if (r < 0) {
                fprintf(stderr, "dsquant eval: Failed to set up backend '%s' for '%s': %s\n",
                        ops->name, arg_model, err.msg);
                return EXIT_FAILURE;
        }
        blocks = calloc(n_blocks, sizeof(uint32_t));
        if (!blocks)
                return EXIT_FAILURE;
        for (uint32_t i = 0; i < n_blocks; i++)
                blocks[i] = i;
        double t_load = now_s() - t0;

        /* --ids keeps every row; --text walks the text in chunks, one chunk of rows kept. */
        uint32_t chunk = arg_ids ? n : MIN(n, EVAL_CHUNK);
        logits = malloc((size_t) chunk * c->vocab_size * sizeof(float));
        if (!logits) {
                fprintf(stderr, "dsquant eval: out of memory for %u rows of logits\n", chunk);
                return EXIT_FAILURE;
        }

        double t1 = now_s(), sum_nll = 0;
        int32_t next = -1;
        for (uint32_t pos = 0; pos < n; pos += chunk) {
                uint32_t len = MIN(chunk, n - pos);
                BkSeq s = {
                        .tokens = ids + pos,
                        .n_tokens = len,
                        .pos = pos,
                        .blocks = blocks,
                        .n_blocks = n_blocks,
                        .sample = arg_decode > 0 && pos + len == n,
                        .sampling = {.temperature = 0, .repetition_penalty = 1},
                        .logits = logits,
                };
                r = ops->step(b, &s, 1, &next, &err);
                if (r < 0) {
                        fprintf(stderr, "dsquant eval: forward pass over '%s' failed: %s\n",
                                arg_model, err.msg);
                        return EXIT_FAILURE;
                }
                if (arg_text)
                        for (uint32_t i = 0; i < len && pos + i + 1 < n; i++)
                                sum_nll += nll(logits + (size_t) i * c->vocab_size, c->vocab_size,
                                        ids[pos + i + 1]);
        }
        double t_prefill = now_s() - t1;
        fprintf(stderr, "dsquant eval: %s; load %.3f s; %u positions in %.3f s (%.1f tokens/s)\n",
                m->info.quant, t_load, n, t_prefill, n / t_prefill);

        if (arg_logits_out) {
                FILE *f = fopen(arg_logits_out, "we");
                if (!f || fwrite(logits, sizeof(float) * c->vocab_size, n, f) != n) {
                        fprintf(stderr, "dsquant eval: Failed to write '%s': %m\n", arg_logits_out);
                        if (f)
                                fclose(f);
                        return EXIT_FAILURE;
                }
                if (fclose(f) != 0) {
                        fprintf(stderr, "dsquant eval: Failed to write '%s': %m\n", arg_logits_out);
                        return EXIT_FAILURE;
                }
        }

        if (arg_text)
                printf("perplexity %.4f over %u tokens\n", exp(sum_nll / (n - 1)), n - 1);

        /* Greedy decode, one token per step, to time the decode path. */
        if (arg_decode > 0) {
                double t2 = now_s();
                printf("%d", next);
                for (uint32_t i = 1; i < arg_decode; i++) {
                        BkSeq s = {
                                .tokens = &next,
                                .n_tokens = 1,
                                .pos = n + i - 1,
                                .blocks = blocks,
                                .n_blocks = n_blocks,
                                .sample = true,
                                .sampling = {.temperature = 0, .repetition_penalty = 1},
                        };
                        r = ops->step(b, &s, 1, &next, &err);
                        if (r < 0) {
                                fprintf(stderr, "dsquant eval: decode step over '%s' failed: %s\n",
                                        arg_model, err.msg);
                                return EXIT_FAILURE;
                        }
                        printf(" %d", next);
                }
                printf("\n");
                double t_decode = now_s() - t2;
                if (arg_decode > 1)
                        fprintf(stderr, "dsquant eval: %u decode steps in %.3f s (%.1f tokens/s)\n",
                                arg_decode - 1, t_decode, (arg_decode - 1) / t_decode);
        }
        return EXIT_SUCCESS;
}
