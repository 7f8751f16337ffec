/* SPDX-License-Identifier: MIT */
/* dsd: the dsd daemon. It serves libdsclient clients on a Unix socket as a system service
 * (service.h: dsd.json, D-Bus, systemd), or runs one generation and exits (--generate). */
#include <assert.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>

#include "config.h"
#include "engine.h"
#include "log.h"
#include "service.h"

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
static bool arg_lm_head_int8;
/* Serving: the flags become overrides of dsd.json fields (applied again at every reload),
 * or service options where the file has no field. */
#define OVERRIDES_MAX 64
static ConfigOverride arg_overrides[OVERRIDES_MAX];
static size_t arg_n_overrides;
static ServiceOptions arg_service;
static char arg_allow_uids[1024], arg_allow_gids[1024];
static uint64_t arg_kv_bytes;
/* The first option given that only one of the two modes uses: the other mode refuses it
 * rather than ignore it. */
static const char *arg_serving_only, *arg_generate_only;

static void help(void)
{
        printf("Usage: dsd [--config FILE] [--model DIR] [SERVING OPTIONS]\n"
               "       dsd --model DIR --generate TEXT [OPTIONS]\n"
               "\n"
               "Loads a Hugging Face model directory (Qwen2, Llama, DeepSeek-V2/V3; AWQ INT4,\n"
               "FP16, BF16 or F32 safetensors with tokenizer.json) and serves libdsclient\n"
               "clients on a Unix socket until SIGTERM or SIGINT, controlled over D-Bus\n"
               "(dsctl) and systemd.\n"
               "Without a model it starts in state no-model until 'dsctl reload MODEL'.\n"
               "With --generate it generates a continuation of TEXT instead, prints only the\n"
               "generated text on stdout and a one-line summary on stderr, and exits.\n"
               "\n"
               "Options:\n"
               "  --model DIR          model directory (config.json, *.safetensors, "
               "tokenizer.json)\n"
               "  --log-level LEVEL    error, warning, notice, info or debug\n"
               "  --backend NAME       cpu, cuda or auto (default auto)\n"
               "  --device N           CUDA device index (default 0)\n"
               "  --quantize-at-load   quantize FP16/BF16/F32 linear layers to INT4 (group 128)\n"
               "  --lm-head-int8       quantize the lm_head to 8 bits a weight (a float32 scale\n"
               "                       per group of 128 inputs) at load: the GPU reads half its\n"
               "                       bytes at 1-16 rows; logits move by about 0.6%%\n"
               "  --no-lm-head-screen  keep no 8-bit copy of an FP16 lm_head on the GPU (half\n"
               "                       its size again), which greedy rows otherwise read\n"
               "                       instead, with the same ids\n"
               "  --threads N          CPU backend threads, at least 1 (default 1)\n"
               "  --kv-bytes N         KV cache budget in bytes (default: "
               "limits.kv_memory_fraction\n"
               "                       with --config, else one full context)\n"
               "\n"
               "Options of --generate only:\n"
               "  --generate TEXT      the prompt\n"
               "  --max-tokens N       most tokens to generate (default 256)\n"
               "  --temperature T      0 means greedy (default 0)\n"
               "  --top-k K            sample among the K most likely tokens (default 0: all)\n"
               "  --top-p P            nucleus sampling threshold (default 1: off)\n"
               "  --seed S             seed of the sampler (default 0)\n"
               "  --chat               wrap TEXT as a user turn of the model's chat template\n"
               "\n"
               "Serving options (refused with --generate):\n"
               "  --config FILE        dsd.json (docs/operations.md); flags override its fields.\n"
               "                       Without it: bus none, socket mode 0666, batch 32, 64\n"
               "                       requests per client, KV for one full context\n"
               "  --bus system|session|none  where io.dsd.Daemon1 is served\n"
               "  --socket PATH        listening socket (default /run/dsd/dsd.sock)\n"
               "  --max-batch N        sequences admitted at once (limits.max_batch)\n"
               "  --context-length N   cap the model's context (limits.context_length)\n"
               "  --step-tokens N      tokens one step computes at most, at least 1 (default 512)\n"
               "  --queue N            requests waiting for admission; more get 'busy' (256)\n"
               "  --stop-timeout-sec N SIGTERM lets requests finish this long (default 60)\n"
               "  --max-clients N      connections at once (default 256)\n"
               "  --max-requests N     requests in flight per client\n"
               "  --client-buffer N    undelivered event records per client before its\n"
               "                       requests pause (default 4096)\n"
               "  --slow-timeout-ms N  paused this long, they fail as too slow; at least 1\n"
               "                       (default 5000)\n"
               "  --allow-uid UID      let this uid connect (repeatable; socket.allowed_uids).\n"
               "                       While no uid and no gid is listed, root and the group\n"
               "                       dsd may (root and the daemon's own uid without one)\n"
               "  --allow-gid GID      let this gid connect (repeatable; socket.allowed_gids)\n"
               "  --http-listen ADDR   OpenAI-compatible HTTP on a Unix path or host:port\n"
               "                       (host defaults to 127.0.0.1; docs/http.md)\n"
               "  --http-config JSON   the dsd.json \"http\" object (timeouts, limits, token)\n"
               "\n"
               "  --help, --version\n");
}

static int parse_u32_from(const char *opt, const char *s, uint32_t lo, uint32_t *ret)
{
        char *end;
        errno = 0;
        unsigned long long v = strtoull(s, &end, 10);
        if (errno || end == s || *end || v < lo || v > UINT32_MAX || s[0] == '-') {
                fprintf(stderr, "dsd: %s: '%s' is not an integer in [%" PRIu32 ", %" PRIu32 "]\n",
                        opt, s, lo, UINT32_MAX);
                return -EINVAL;
        }
        *ret = (uint32_t) v;
        return 0;
}

static int parse_u32(const char *opt, const char *s, uint32_t *ret)
{
        return parse_u32_from(opt, s, 0, ret);
}

/* Counts and times for which 0 means nothing: refused rather than taken as "the default",
 * as dsd.json refuses 0 for limits.max_batch, limits.client_max_requests and
 * stop_timeout_sec. */
static int parse_u32_nonzero(const char *opt, const char *s, uint32_t *ret)
{
        return parse_u32_from(opt, s, 1, ret);
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

static int parse_u64(const char *opt, const char *s, uint64_t *ret)
{
        char *end;
        errno = 0;
        unsigned long long v = strtoull(s, &end, 10);
        if (errno || end == s || *end || s[0] == '-') {
                fprintf(stderr, "dsd: %s: '%s' is not a non-negative integer\n", opt, s);
                return -EINVAL;
        }
        *ret = v;
        return 0;
}

static int add_override(const char *source, const char *key, const char *value)
{
        if (arg_n_overrides >= OVERRIDES_MAX) {
                fprintf(stderr, "dsd: %s: too many options\n", source);
                return -E2BIG;
        }
        arg_overrides[arg_n_overrides++] = (ConfigOverride){source, key, value};
        return 0;
}

/* --allow-uid/--allow-gid are repeatable: they collect into one comma-separated list. */
static int add_id(const char *opt, const char *s, char *list, size_t size)
{
        uint32_t v;
        int r = parse_u32(opt, s, &v);
        if (r < 0)
                return r;
        size_t len = strlen(list);
        if ((size_t) snprintf(list + len, size - len, "%s%s", len ? "," : "", s) >= size - len) {
                fprintf(stderr, "dsd: %s: too many ids\n", opt);
                return -E2BIG;
        }
        return 0;
}

static int parse_argv(int argc, char **argv)
{
        enum {
                ARG_MODEL = 0x100,
                ARG_GENERATE,
                ARG_MAX_TOKENS,
                ARG_TEMPERATURE,
                ARG_TOP_K,
                ARG_TOP_P,
                ARG_SEED,
                ARG_CHAT,
                ARG_BACKEND,
                ARG_QUANTIZE,
                ARG_LM_HEAD_INT8,
                ARG_NO_LM_HEAD_SCREEN,
                ARG_THREADS,
                ARG_VERSION,
                ARG_KV_BYTES,
                ARG_SOCKET,
                ARG_MAX_BATCH,
                ARG_STEP_TOKENS,
                ARG_QUEUE,
                ARG_MAX_CLIENTS,
                ARG_MAX_REQUESTS,
                ARG_CLIENT_BUFFER,
                ARG_SLOW_TIMEOUT,
                ARG_ALLOW_UID,
                ARG_ALLOW_GID,
                ARG_HTTP_LISTEN,
                ARG_HTTP_CONFIG,
                ARG_CONFIG,
                ARG_BUS,
                ARG_LOG_LEVEL,
                ARG_DEVICE,
                ARG_CONTEXT_LENGTH,
                ARG_STOP_TIMEOUT,
        };
        static const struct option options[] = {{"help", no_argument, NULL, 'h'},
                {"version", no_argument, NULL, ARG_VERSION},
                {"model", required_argument, NULL, ARG_MODEL},
                {"generate", required_argument, NULL, ARG_GENERATE},
                {"max-tokens", required_argument, NULL, ARG_MAX_TOKENS},
                {"temperature", required_argument, NULL, ARG_TEMPERATURE},
                {"top-k", required_argument, NULL, ARG_TOP_K},
                {"top-p", required_argument, NULL, ARG_TOP_P},
                {"seed", required_argument, NULL, ARG_SEED}, {"chat", no_argument, NULL, ARG_CHAT},
                {"backend", required_argument, NULL, ARG_BACKEND},
                {"quantize-at-load", no_argument, NULL, ARG_QUANTIZE},
                {"lm-head-int8", no_argument, NULL, ARG_LM_HEAD_INT8},
                {"no-lm-head-screen", no_argument, NULL, ARG_NO_LM_HEAD_SCREEN},
                {"threads", required_argument, NULL, ARG_THREADS},
                {"kv-bytes", required_argument, NULL, ARG_KV_BYTES},
                {"socket", required_argument, NULL, ARG_SOCKET},
                {"max-batch", required_argument, NULL, ARG_MAX_BATCH},
                {"step-tokens", required_argument, NULL, ARG_STEP_TOKENS},
                {"queue", required_argument, NULL, ARG_QUEUE},
                {"max-clients", required_argument, NULL, ARG_MAX_CLIENTS},
                {"max-requests", required_argument, NULL, ARG_MAX_REQUESTS},
                {"client-buffer", required_argument, NULL, ARG_CLIENT_BUFFER},
                {"slow-timeout-ms", required_argument, NULL, ARG_SLOW_TIMEOUT},
                {"allow-uid", required_argument, NULL, ARG_ALLOW_UID},
                {"allow-gid", required_argument, NULL, ARG_ALLOW_GID},
                {"http-listen", required_argument, NULL, ARG_HTTP_LISTEN},
                {"http-config", required_argument, NULL, ARG_HTTP_CONFIG},
                {"config", required_argument, NULL, ARG_CONFIG},
                {"bus", required_argument, NULL, ARG_BUS},
                {"log-level", required_argument, NULL, ARG_LOG_LEVEL},
                {"device", required_argument, NULL, ARG_DEVICE},
                {"context-length", required_argument, NULL, ARG_CONTEXT_LENGTH},
                {"stop-timeout-sec", required_argument, NULL, ARG_STOP_TIMEOUT}, {}};
        uint32_t seed32;
        int c, idx = 0;

        while ((c = getopt_long(argc, argv, "h", options, &idx)) >= 0) {
                int r = 0;
                switch (c) {
                case ARG_MAX_TOKENS:
                case ARG_TEMPERATURE:
                case ARG_TOP_K:
                case ARG_TOP_P:
                case ARG_SEED:
                case ARG_CHAT:
                        arg_generate_only = arg_generate_only ?: options[idx].name;
                        break;
                case ARG_CONFIG:
                case ARG_BUS:
                case ARG_SOCKET:
                case ARG_MAX_BATCH:
                case ARG_CONTEXT_LENGTH:
                case ARG_STEP_TOKENS:
                case ARG_QUEUE:
                case ARG_STOP_TIMEOUT:
                case ARG_MAX_CLIENTS:
                case ARG_MAX_REQUESTS:
                case ARG_CLIENT_BUFFER:
                case ARG_SLOW_TIMEOUT:
                case ARG_ALLOW_UID:
                case ARG_ALLOW_GID:
                case ARG_HTTP_LISTEN:
                case ARG_HTTP_CONFIG:
                        arg_serving_only = arg_serving_only ?: options[idx].name;
                        break;
                }
                switch (c) {
                case 'h':
                        help();
                        exit(EXIT_SUCCESS);
                case ARG_VERSION:
                        printf("dsd %s\n", DSD_VERSION);
                        exit(EXIT_SUCCESS);
                case ARG_MODEL:
                        arg_model = optarg;
                        r = add_override("--model", "model", optarg);
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
                        r = add_override("--backend", "backend", optarg);
                        break;
                case ARG_QUANTIZE:
                        arg_quantize = true;
                        r = add_override("--quantize-at-load", "quantize_at_load", "true");
                        break;
                case ARG_LM_HEAD_INT8:
                        arg_lm_head_int8 = true;
                        r = add_override("--lm-head-int8", "lm_head_int8", "true");
                        break;
                case ARG_NO_LM_HEAD_SCREEN:
                        r = add_override("--no-lm-head-screen", "lm_head_screen", "false");
                        break;
                case ARG_THREADS:
                        r = parse_u32_nonzero("--threads", optarg, &arg_threads);
                        break;
                case ARG_KV_BYTES:
                        r = parse_u64("--kv-bytes", optarg, &arg_kv_bytes);
                        break;
                case ARG_SOCKET:
                        r = add_override("--socket", "socket.path", optarg);
                        break;
                case ARG_MAX_BATCH:
                        r = add_override("--max-batch", "limits.max_batch", optarg);
                        break;
                case ARG_CONTEXT_LENGTH:
                        r = add_override("--context-length", "limits.context_length", optarg);
                        break;
                case ARG_STEP_TOKENS:
                        r = parse_u32_nonzero("--step-tokens", optarg, &arg_service.step_tokens);
                        break;
                case ARG_QUEUE:
                        r = add_override("--queue", "limits.queue_length", optarg);
                        break;
                case ARG_MAX_CLIENTS:
                        r = parse_u32_nonzero("--max-clients", optarg, &arg_service.max_clients);
                        break;
                case ARG_MAX_REQUESTS:
                        r = add_override("--max-requests", "limits.client_max_requests", optarg);
                        break;
                case ARG_CLIENT_BUFFER:
                        r = add_override(
                                "--client-buffer", "limits.client_max_pending_events", optarg);
                        break;
                case ARG_SLOW_TIMEOUT:
                        r = parse_u32_nonzero(
                                "--slow-timeout-ms", optarg, &arg_service.slow_timeout_ms);
                        break;
                case ARG_ALLOW_UID:
                        r = add_id("--allow-uid", optarg, arg_allow_uids, sizeof(arg_allow_uids));
                        break;
                case ARG_ALLOW_GID:
                        r = add_id("--allow-gid", optarg, arg_allow_gids, sizeof(arg_allow_gids));
                        break;
                case ARG_HTTP_LISTEN:
                        r = add_override("--http-listen", "http.listen", optarg);
                        break;
                case ARG_HTTP_CONFIG:
                        r = add_override("--http-config", "http", optarg);
                        break;
                case ARG_CONFIG:
                        arg_service.config_path = optarg;
                        break;
                case ARG_BUS:
                        r = add_override("--bus", "bus", optarg);
                        break;
                case ARG_LOG_LEVEL:
                        r = add_override("--log-level", "log_level", optarg);
                        break;
                case ARG_DEVICE:
                        r = add_override("--device", "device", optarg);
                        break;
                case ARG_STOP_TIMEOUT:
                        r = add_override("--stop-timeout-sec", "stop_timeout_sec", optarg);
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
        if (arg_generate && arg_serving_only) {
                fprintf(stderr,
                        "dsd: --%s is a serving option; it does not apply with --generate\n",
                        arg_serving_only);
                return -EINVAL;
        }
        if (!arg_generate && arg_generate_only) {
                fprintf(stderr, "dsd: --%s applies only with --generate\n", arg_generate_only);
                return -EINVAL;
        }
        if (arg_generate && !arg_model) {
                fprintf(stderr, "dsd: --generate needs --model DIR (see --help)\n");
                return -EINVAL;
        }
        if (arg_allow_uids[0] &&
                add_override("--allow-uid", "socket.allowed_uids", arg_allow_uids) < 0)
                return -E2BIG;
        if (arg_allow_gids[0] &&
                add_override("--allow-gid", "socket.allowed_gids", arg_allow_gids) < 0)
                return -E2BIG;
        return 0;
}

/* Without a configuration file dsd keeps the behaviour of a plain command: no bus, a
 * socket anyone may reach (the allow-list decides), a batch of 32 and 64 requests per
 * client. These go first so that the flags override them. */
static const ConfigOverride no_file_defaults[] = {
        {"(no --config)", "bus", "none"},
        {"(no --config)", "socket.mode", "0666"},
        {"(no --config)", "limits.max_batch", "32"},
        {"(no --config)", "limits.client_max_requests", "64"},
};

static int serve(void)
{
        ConfigOverride all[ELEMENTSOF(no_file_defaults) + OVERRIDES_MAX];
        size_t n = 0;
        DsdConfig c;
        DsError err = {};
        int r;

        if (!arg_service.config_path)
                for (size_t i = 0; i < ELEMENTSOF(no_file_defaults); i++)
                        all[n++] = no_file_defaults[i];
        memcpy(all + n, arg_overrides, arg_n_overrides * sizeof(*all));
        arg_service.overrides = all;
        arg_service.n_overrides = n + arg_n_overrides;
        arg_service.threads = arg_threads;
        arg_service.kv_bytes = arg_kv_bytes;

        r = service_read_config(&arg_service, &c, &err);
        if (r < 0) {
                fprintf(stderr, "dsd: %s\n", err.msg);
                return r;
        }
        log_set_max_level(c.log_level);
        return service_run(&arg_service, &c);
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
        DsdConfig c;
        char device[32];
        int r;

        if (parse_argv(argc, argv) < 0)
                return EXIT_FAILURE;
        if (!arg_generate)
                return serve() < 0 ? EXIT_FAILURE : EXIT_SUCCESS;

        /* The flags both modes share are checked as the service checks them. */
        arg_service.overrides = arg_overrides;
        arg_service.n_overrides = arg_n_overrides;
        r = service_read_config(&arg_service, &c, &err);
        if (r < 0) {
                fprintf(stderr, "dsd: %s\n", err.msg);
                return EXIT_FAILURE;
        }
        log_set_max_level(c.log_level);
        config_device(&c, device, sizeof(device));
        EngineOptions eo = {
                .backend = arg_backend,
                .quantize_int4 = arg_quantize,
                .lm_head_int8 = arg_lm_head_int8,
                .threads = arg_threads,
                .kv_bytes = arg_kv_bytes,
                .device = c.backend == CONFIG_BACKEND_CPU ? NULL : device,
                .verbose = true,
        };
        r = engine_open(arg_model, &eo, &e, &err);
        if (r < 0) {
                log_error("Failed to load model '%s': %s", arg_model, err.msg);
                return EXIT_FAILURE;
        }
        GenParams gp = {
                .max_tokens = arg_max_tokens,
                .sampling =
                        {
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
                "dsd: %s backend, %s, %u prompt tokens (%.1f ms), %u generated tokens, "
                "%.1f tokens/s, finish %s, load %.2f s, KV %llu bytes/token\n",
                e->ops->name, e->model->info.quant, res.prompt_tokens,
                (double) res.prefill_usec / 1e3, res.generated_tokens,
                secs > 0 ? res.generated_tokens / secs : 0.0, finish_reason_name(res.finish),
                (double) e->load_usec / 1e6,
                (unsigned long long) e->ops->kv_bytes_per_token(e->be));
        return EXIT_SUCCESS;
}
