/* SPDX-License-Identifier: MIT */
/* dsd: the dsd daemon. Today it runs one generation and exits (--generate); serving
 * libdsclient clients is the next piece of work. */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "log.h"

static const char *arg_model;
static const char *arg_generate;
static const char *arg_backend = "auto";
static uint32_t arg_max_tokens = 256;
static float arg_temperature = 0.0f;
static uint32_t arg_top_k;
static float arg_top_p = 1.0f;
static uint64_t arg_seed;
static uint32_t arg_threads;
static bool arg_chat;
static bool arg_quantize;

static void help(void)
{
        printf("Usage: dsd --model DIR --generate TEXT [OPTIONS]\n"
               "\n"
               "Loads a Hugging Face model directory (Qwen2/Llama; AWQ INT4, FP16, BF16 or F32\n"
               "safetensors with tokenizer.json), generates a continuation of TEXT, prints only\n"
               "the generated text on stdout and a one-line summary on stderr, and exits.\n"
               "The serving daemon (libdsclient clients) is not built yet.\n"
               "\n"
               "Options:\n"
               "  --model DIR          model directory (config.json, *.safetensors, tokenizer.json)\n"
               "  --generate TEXT      the prompt\n"
               "  --max-tokens N       most tokens to generate (default 256)\n"
               "  --temperature T      0 means greedy (default 0)\n"
               "  --top-k K            sample among the K most likely tokens (default 0: all)\n"
               "  --top-p P            nucleus sampling threshold (default 1: off)\n"
               "  --seed S             seed of the sampler (default 0)\n"
               "  --chat               wrap TEXT as a user turn of the model's chat template\n"
               "  --backend NAME       cpu or auto (default auto)\n"
               "  --quantize-at-load   quantize FP16/BF16/F32 linear layers to INT4 (group 128)\n"
               "  --threads N          CPU backend threads (default 1)\n"
               "  --help, --version\n");
}

static int parse_u32(const char *opt, const char *s, uint32_t *ret)
{
        char *end;
        errno = 0;
        unsigned long long v = strtoull(s, &end, 10);
        if (errno || end == s || *end || v > UINT32_MAX || s[0] == '-') {
                fprintf(stderr, "dsd: %s: '%s' is not a non-negative integer\n", opt, s);
                return -EINVAL;
        }
        *ret = (uint32_t) v;
        return 0;
}

static int parse_float(const char *opt, const char *s, float lo, float hi, float *ret)
{
        char *end;
        errno = 0;
        float v = strtof(s, &end);
        if (errno || end == s || *end || !isfinite(v) || v < lo || v > hi) {
                fprintf(stderr, "dsd: %s: '%s' is not a number in [%g, %g]\n", opt, s, lo, hi);
                return -EINVAL;
        }
        *ret = v;
        return 0;
}

static int parse_argv(int argc, char **argv)
{
        enum {
                ARG_MODEL = 0x100, ARG_GENERATE, ARG_MAX_TOKENS, ARG_TEMPERATURE, ARG_TOP_K,
                ARG_TOP_P, ARG_SEED, ARG_CHAT, ARG_BACKEND, ARG_QUANTIZE, ARG_THREADS,
                ARG_VERSION,
        };
        static const struct option options[] = {
                { "help", no_argument, NULL, 'h' },
                { "version", no_argument, NULL, ARG_VERSION },
                { "model", required_argument, NULL, ARG_MODEL },
                { "generate", required_argument, NULL, ARG_GENERATE },
                { "max-tokens", required_argument, NULL, ARG_MAX_TOKENS },
                { "temperature", required_argument, NULL, ARG_TEMPERATURE },
                { "top-k", required_argument, NULL, ARG_TOP_K },
                { "top-p", required_argument, NULL, ARG_TOP_P },
                { "seed", required_argument, NULL, ARG_SEED },
                { "chat", no_argument, NULL, ARG_CHAT },
                { "backend", required_argument, NULL, ARG_BACKEND },
                { "quantize-at-load", no_argument, NULL, ARG_QUANTIZE },
                { "threads", required_argument, NULL, ARG_THREADS },
                {}
        };
        uint32_t seed32;
        int c;

        while ((c = getopt_long(argc, argv, "h", options, NULL)) >= 0) {
                int r = 0;
                switch (c) {
                case 'h':
                        help();
                        exit(EXIT_SUCCESS);
                case ARG_VERSION:
                        printf("dsd %s\n", DSD_VERSION);
                        exit(EXIT_SUCCESS);
                case ARG_MODEL:
                        arg_model = optarg;
                        break;
                case ARG_GENERATE:
                        arg_generate = optarg;
                        break;
                case ARG_MAX_TOKENS:
                        r = parse_u32("--max-tokens", optarg, &arg_max_tokens);
                        break;
                case ARG_TEMPERATURE:
                        r = parse_float("--temperature", optarg, 0.0f, 100.0f, &arg_temperature);
                        break;
                case ARG_TOP_K:
                        r = parse_u32("--top-k", optarg, &arg_top_k);
                        break;
                case ARG_TOP_P:
                        r = parse_float("--top-p", optarg, 0.0f, 1.0f, &arg_top_p);
                        break;
                case ARG_SEED:
                        r = parse_u32("--seed", optarg, &seed32);
                        arg_seed = seed32;
                        break;
                case ARG_CHAT:
                        arg_chat = true;
                        break;
                case ARG_BACKEND:
                        arg_backend = optarg;
                        break;
                case ARG_QUANTIZE:
                        arg_quantize = true;
                        break;
                case ARG_THREADS:
                        r = parse_u32("--threads", optarg, &arg_threads);
                        break;
                default:
                        return -EINVAL; /* getopt named the option */
                }
                if (r < 0)
                        return r;
        }
        if (optind < argc) {
                fprintf(stderr, "dsd: unexpected argument '%s'\n", argv[optind]);
                return -EINVAL;
        }
        if (!arg_model) {
                fprintf(stderr, "dsd: --model DIR is required (see --help)\n");
                return -EINVAL;
        }
        if (!arg_generate) {
                fprintf(stderr, "dsd: only --generate TEXT is implemented; the serving daemon "
                                "is not built yet\n");
                return -EINVAL;
        }
        return 0;
}

static void emit_stdout(void *userdata, const char *text, size_t len)
{
        fwrite(text, 1, len, stdout);
        fflush(stdout);
}

int main(int argc, char **argv)
{
        _cleanup_(engine_freep) Engine *e = NULL;
        DsError err = {};
        GenResult res = {};
        int r;

        if (parse_argv(argc, argv) < 0)
                return EXIT_FAILURE;

        EngineOptions eo = {
                .backend = arg_backend,
                .quantize_int4 = arg_quantize,
                .threads = arg_threads,
                .verbose = true,
        };
        r = engine_open(arg_model, &eo, &e, &err);
        if (r < 0) {
                log_error("Failed to load model '%s': %s", arg_model, err.msg);
                return EXIT_FAILURE;
        }

        GenParams gp = {
                .max_tokens = arg_max_tokens,
                .sampling = {
                        .temperature = arg_temperature,
                        .top_k = arg_top_k,
                        .top_p = arg_top_p,
                        .repetition_penalty = 1.0f,
                        .seed = arg_seed,
                },
                .chat = arg_chat,
        };
        r = engine_generate(e, arg_generate, &gp, emit_stdout, NULL, &res, &err);
        if (r < 0) {
                log_error("Failed to generate: %s", err.msg);
                return EXIT_FAILURE;
        }
        double secs = (double) res.decode_usec / 1e6;
        fprintf(stderr,
                "dsd: %s backend, %u prompt tokens (%.1f ms), %u generated tokens, %.1f tokens/s, "
                "finish %s, load %.2f s\n",
                e->ops->name, res.prompt_tokens, (double) res.prefill_usec / 1e3,
                res.generated_tokens, secs > 0 ? res.generated_tokens / secs : 0.0,
                finish_reason_name(res.finish), (double) e->load_usec / 1e6);
        return EXIT_SUCCESS;
}
