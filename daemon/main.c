/* SPDX-License-Identifier: MIT */
/* dsd: the dsd daemon. It serves libdsclient clients on a Unix socket (server.h) with
 * one engine thread (engine_loop.h), or runs one generation and exits (--generate). */
#include <assert.h>
#include <getopt.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>

#include "engine.h"
#include "engine_loop.h"
#include "listener.h"
#include "log.h"
#include "server.h"

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
/* Serving. The defaults come from server_options_init() and sched_limits_check(); when
 * the dsd.json configuration lands it fills these before the flags override them. */
static ServerOptions arg_server;
static HttpConfig arg_http;
static SchedLimits arg_limits;
static uint64_t arg_kv_bytes;

static void help(void)
{
        printf("Usage: dsd --model DIR [--socket PATH] [SERVING OPTIONS]\n"
               "       dsd --model DIR --generate TEXT [OPTIONS]\n"
               "\n"
               "Loads a Hugging Face model directory (Qwen2/Llama; AWQ INT4, FP16, BF16 or F32\n"
               "safetensors with tokenizer.json) and serves libdsclient clients on a Unix\n"
               "socket until SIGTERM or SIGINT. With --generate it generates a continuation of\n"
               "TEXT instead, prints only the generated text on stdout and a one-line summary\n"
               "on stderr, and exits.\n"
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
               "  --kv-bytes N         KV cache budget in bytes (default: one full context)\n"
               "\n"
               "Serving options:\n"
               "  --socket PATH        listening socket (default /run/dsd/dsd.sock)\n"
               "  --max-batch N        sequences admitted at once (default 32)\n"
               "  --step-tokens N      tokens one step computes at most (default 512)\n"
               "  --queue N            requests waiting for admission; more get 'busy' (256)\n"
               "  --max-clients N      connections at once (default 256)\n"
               "  --max-requests N     requests in flight per client (default 64)\n"
               "  --client-buffer N    undelivered event records per client before its\n"
               "                       requests pause (default 4096)\n"
               "  --slow-timeout-ms N  paused this long, they fail as too slow (default 5000)\n"
               "  --allow-uid UID      also allow this uid (repeatable; default root and the\n"
               "                       group dsd, else the daemon's own uid)\n"
               "  --allow-gid GID      also allow this gid (repeatable)\n"
               "  --http-listen ADDR   OpenAI-compatible HTTP on a Unix path or host:port\n"
               "                       (host defaults to 127.0.0.1; docs/http.md)\n"
               "  --http-config JSON   the dsd.json \"http\" object (timeouts, limits, token)\n"
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

/* --allow-uid/--allow-gid parse into the id arrays as u32. */
static_assert(sizeof(uid_t) == sizeof(uint32_t) && sizeof(gid_t) == sizeof(uint32_t), "ids");

static int parse_id(const char *opt, const char *s, uint32_t *ids, size_t *n)
{
        uint32_t v;
        int r = parse_u32(opt, s, &v);
        if (r < 0)
                return r;
        if (*n >= SERVER_IDS_MAX) {
                fprintf(stderr, "dsd: %s: at most %u ids\n", opt, SERVER_IDS_MAX);
                return -E2BIG;
        }
        ids[(*n)++] = v;
        return 0;
}

static int parse_argv(int argc, char **argv)
{
        enum {
                ARG_MODEL = 0x100, ARG_GENERATE, ARG_MAX_TOKENS, ARG_TEMPERATURE, ARG_TOP_K,
                ARG_TOP_P, ARG_SEED, ARG_CHAT, ARG_BACKEND, ARG_QUANTIZE, ARG_THREADS,
                ARG_VERSION, ARG_KV_BYTES, ARG_SOCKET, ARG_MAX_BATCH, ARG_STEP_TOKENS, ARG_QUEUE,
                ARG_MAX_CLIENTS, ARG_MAX_REQUESTS, ARG_CLIENT_BUFFER, ARG_SLOW_TIMEOUT,
                ARG_ALLOW_UID, ARG_ALLOW_GID, ARG_HTTP_LISTEN, ARG_HTTP_CONFIG,
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
                { "kv-bytes", required_argument, NULL, ARG_KV_BYTES },
                { "socket", required_argument, NULL, ARG_SOCKET },
                { "max-batch", required_argument, NULL, ARG_MAX_BATCH },
                { "step-tokens", required_argument, NULL, ARG_STEP_TOKENS },
                { "queue", required_argument, NULL, ARG_QUEUE },
                { "max-clients", required_argument, NULL, ARG_MAX_CLIENTS },
                { "max-requests", required_argument, NULL, ARG_MAX_REQUESTS },
                { "client-buffer", required_argument, NULL, ARG_CLIENT_BUFFER },
                { "slow-timeout-ms", required_argument, NULL, ARG_SLOW_TIMEOUT },
                { "allow-uid", required_argument, NULL, ARG_ALLOW_UID },
                { "allow-gid", required_argument, NULL, ARG_ALLOW_GID },
                { "http-listen", required_argument, NULL, ARG_HTTP_LISTEN },
                { "http-config", required_argument, NULL, ARG_HTTP_CONFIG },
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
                case ARG_KV_BYTES:
                        r = parse_u64("--kv-bytes", optarg, &arg_kv_bytes);
                        break;
                case ARG_SOCKET:
                        arg_server.socket_path = optarg;
                        break;
                case ARG_MAX_BATCH:
                        r = parse_u32("--max-batch", optarg, &arg_limits.max_seqs);
                        break;
                case ARG_STEP_TOKENS:
                        r = parse_u32("--step-tokens", optarg, &arg_limits.step_tokens);
                        break;
                case ARG_QUEUE:
                        r = parse_u32("--queue", optarg, &arg_limits.max_queued);
                        break;
                case ARG_MAX_CLIENTS:
                        r = parse_u32("--max-clients", optarg, &arg_server.max_clients);
                        break;
                case ARG_MAX_REQUESTS:
                        r = parse_u32("--max-requests", optarg, &arg_server.max_requests);
                        break;
                case ARG_CLIENT_BUFFER:
                        r = parse_u32("--client-buffer", optarg, &arg_server.max_pending);
                        break;
                case ARG_SLOW_TIMEOUT:
                        r = parse_u32("--slow-timeout-ms", optarg, &arg_server.slow_timeout_ms);
                        break;
                case ARG_ALLOW_UID:
                        r = parse_id("--allow-uid", optarg, (uint32_t *) arg_server.allow_uids,
                                &arg_server.n_allow_uids);
                        break;
                case ARG_ALLOW_GID:
                        r = parse_id("--allow-gid", optarg, (uint32_t *) arg_server.allow_gids,
                                &arg_server.n_allow_gids);
                        break;
                case ARG_HTTP_LISTEN:
                        if (strlen(optarg) >= sizeof(arg_http.listen)) {
                                fprintf(stderr, "dsd: --http-listen: too long\n");
                                return -EINVAL;
                        }
                        strcpy(arg_http.listen, optarg);
                        break;
                case ARG_HTTP_CONFIG: {
                        DsError err = {};
                        cJSON *j = cJSON_Parse(optarg);
                        r = j ? http_config_parse(j, &arg_http, &err)
                              : ds_error(&err, -EINVAL, "not valid JSON");
                        cJSON_Delete(j);
                        if (r < 0)
                                fprintf(stderr, "dsd: --http-config: %s\n", err.msg);
                        break;
                }
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
        if (!arg_generate && (arg_server.max_clients == 0 || arg_server.max_requests == 0 ||
                                     arg_server.max_pending == 0)) {
                fprintf(stderr, "dsd: --max-clients, --max-requests and --client-buffer must be "
                                "at least 1\n");
                return -EINVAL;
        }
        return 0;
}

static void emit_stdout(void *userdata, const char *text, size_t len)
{
        fwrite(text, 1, len, stdout);
        fflush(stdout);
}

/* Serves until SIGTERM/SIGINT. Cleanup runs in reverse: server, engine loop (joins the
 * engine thread), its eventfd, then the engine. */
static int serve(Engine *e)
{
        _cleanup_close_ int notify_fd = -EBADF;
        _cleanup_(engine_loop_freep) EngineLoop *loop = NULL;
        _cleanup_(server_freep) Server *srv = NULL;
        DsError err = {};
        sigset_t mask;
        int r;

        r = sched_limits_check(&arg_limits, &err);
        if (r < 0)
                return log_error_errno(r, "Invalid limits: %s", err.msg);
        arg_server.max_queue = arg_limits.max_queued;

        /* Blocked in every thread (the engine thread inherits the mask): the I/O thread
         * reads them from its signalfd. A client that vanishes must not kill us either. */
        sigemptyset(&mask);
        sigaddset(&mask, SIGTERM);
        sigaddset(&mask, SIGINT);
        r = pthread_sigmask(SIG_BLOCK, &mask, NULL);
        if (r != 0)
                return log_error_errno(r, "Failed to block SIGTERM and SIGINT: %m");
        signal(SIGPIPE, SIG_IGN);

        notify_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        if (notify_fd < 0)
                return log_error_errno(errno, "Failed to create an eventfd: %m");
        r = engine_loop_start(e, &arg_limits, notify_fd, &loop, &err);
        if (r < 0)
                return log_error_errno(r, "Failed to start the engine thread: %s", err.msg);
        r = server_new(e, loop, notify_fd, &arg_server, &srv, &err);
        if (r < 0)
                return log_error_errno(r, "Failed to set up the server: %s", err.msg);
        log_info("Serving '%s' on %s: %s backend, %u KV blocks of %u positions, batch %u, "
                 "queue %u, load %.2f s",
                arg_model, arg_server.socket_path, e->ops->name, e->kv.n_total, e->block_tokens,
                arg_limits.max_seqs, arg_limits.max_queued, (double) e->load_usec / 1e6);
        r = server_run(srv);
        if (r < 0)
                return r;
        log_info("Stopped");
        return 0;
}

int main(int argc, char **argv)
{
        _cleanup_(engine_freep) Engine *e = NULL;
        DsError err = {};
        GenResult res = {};
        int r;

        server_options_init(&arg_server);
        http_config_init(&arg_http);
        arg_server.http = &arg_http;
        if (parse_argv(argc, argv) < 0)
                return EXIT_FAILURE;

        EngineOptions eo = {
                .backend = arg_backend,
                .quantize_int4 = arg_quantize,
                .threads = arg_threads,
                .kv_bytes = arg_kv_bytes,
                .verbose = arg_generate != NULL,
        };
        r = engine_open(arg_model, &eo, &e, &err);
        if (r < 0) {
                log_error("Failed to load model '%s': %s", arg_model, err.msg);
                return EXIT_FAILURE;
        }
        if (!arg_generate)
                return serve(e) < 0 ? EXIT_FAILURE : EXIT_SUCCESS;

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
                "finish %s, load %.2f s, KV %llu bytes/token\n",
                e->ops->name, res.prompt_tokens, (double) res.prefill_usec / 1e3,
                res.generated_tokens, secs > 0 ? res.generated_tokens / secs : 0.0,
                finish_reason_name(res.finish), (double) e->load_usec / 1e6,
                (unsigned long long) e->ops->kv_bytes_per_token(e->be));
        return EXIT_SUCCESS;
}
