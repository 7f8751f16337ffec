/* SPDX-License-Identifier: MIT */
/* dsquant inspect: load a checkpoint the way the daemon does (every file and tensor
 * validated) and print what it holds. Any invalid file is a non-zero exit with one message
 * naming the file and the tensor or field. */
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "model.h"

static const char *arg_model;

static void inspect_help(FILE *f)
{
        fprintf(f, "Usage: dsquant inspect --model DIR\n\n"
                   "Load the checkpoint in DIR (config.json, model.safetensors or the shards of\n"
                   "model.safetensors.index.json), validate every file and tensor, and print its\n"
                   "architecture, dimensions, quantization, RoPE and a summary of its tensors.\n\n"
                   "  --model DIR   the checkpoint directory\n"
                   "  -h, --help    show this help\n");
}

static int parse_argv(int argc, char **argv)
{
        static const struct option options[] = {
                {"model", required_argument, NULL, 'm'},
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
                case 'h':
                        inspect_help(stdout);
                        return 0;
                case ':':
                        fprintf(stderr, "dsquant inspect: option '%s' needs an argument\n",
                                argv[optind - 1]);
                        return -EINVAL;
                default:
                        fprintf(stderr, "dsquant inspect: unknown option '%s' (try --help)\n",
                                argv[optind - 1]);
                        return -EINVAL;
                }
        if (optind < argc) {
                fprintf(stderr, "dsquant inspect: unexpected argument '%s'\n", argv[optind]);
                return -EINVAL;
        }
        if (!arg_model) {
                fprintf(stderr, "dsquant inspect: --model DIR is required\n");
                return -EINVAL;
        }
        return 1;
}

static void print_rope(const BkRope *r)
{
        switch (r->type) {
        case BK_ROPE_LLAMA3:
                printf("llama3, theta %g, factor %g, low_freq_factor %g, high_freq_factor %g, "
                       "original max positions %u\n",
                        r->theta, r->factor, r->low_freq_factor, r->high_freq_factor,
                        r->original_max_pos);
                break;
        case BK_ROPE_YARN:
                printf("yarn, theta %g, factor %g, original max positions %u, beta_fast %g, "
                       "beta_slow %g, attention_factor %g\n",
                        r->theta, r->factor, r->original_max_pos, r->beta_fast, r->beta_slow,
                        r->attention_factor);
                break;
        default:
                printf("default, theta %g\n", r->theta);
                break;
        }
}

/* One line per tensor kind: the name with its layer number replaced by N, its dtype and
 * shape. Layers whose shapes differ show up as separate lines. */
static int kind_key(const StTensor *t, char *buf, size_t size)
{
        const char *p = strstr(t->name, "layers.");
        size_t at;

        if (p && p[7] >= '0' && p[7] <= '9') {
                const char *q = p + 7;
                while (*q >= '0' && *q <= '9')
                        q++;
                at = (size_t) snprintf(buf, size, "%.*sN%s", (int) (p + 7 - t->name), t->name, q);
        } else
                at = (size_t) snprintf(buf, size, "%s", t->name);
        if (at < size)
                at += (size_t) snprintf(buf + at, size - at, "\t%s\t[", st_dtype_name(t->dtype));
        for (uint32_t i = 0; i < t->n_dims && at < size; i++)
                at += (size_t) snprintf(
                        buf + at, size - at, "%s%" PRIu64, i ? ", " : "", t->shape[i]);
        if (at < size)
                at += (size_t) snprintf(buf + at, size - at, "]");
        return at < size ? 0 : -ENAMETOOLONG;
}

static int keycmp(const void *a, const void *b)
{
        return strcmp(*(char *const *) a, *(char *const *) b);
}

static int print_tensors(const StArchive *a)
{
        size_t n = st_archive_size(a);
        uint64_t bytes[_ST_DTYPE_MAX] = {}, count[_ST_DTYPE_MAX] = {}, total = 0;
        _cleanup_free_ char **keys = NULL;
        _cleanup_free_ char *block = NULL;
        const size_t key_size = 512;

        for (size_t i = 0; i < n; i++) {
                const StTensor *t = st_archive_tensor(a, i);
                bytes[t->dtype] += t->n_bytes;
                count[t->dtype]++;
                total += t->n_bytes;
        }
        printf("tensors:      %zu in %zu file%s, %" PRIu64 " bytes (%.1f MiB)\n", n,
                st_archive_n_files(a), st_archive_n_files(a) == 1 ? "" : "s", total,
                (double) total / (1 << 20));
        for (StDtype d = 0; d < _ST_DTYPE_MAX; d++)
                if (count[d])
                        printf("  %-6s      %" PRIu64 " tensors, %" PRIu64 " bytes\n",
                                st_dtype_name(d), count[d], bytes[d]);

        keys = calloc(n ? n : 1, sizeof(*keys));
        block = malloc((n ? n : 1) * key_size);
        if (!keys || !block)
                return -ENOMEM;
        for (size_t i = 0; i < n; i++) {
                keys[i] = block + i * key_size;
                if (kind_key(st_archive_tensor(a, i), keys[i], key_size) < 0)
                        snprintf(keys[i], key_size, "%.200s...", st_archive_tensor(a, i)->name);
        }
        qsort(keys, n, sizeof(*keys), keycmp);
        printf("kinds:\n");
        for (size_t i = 0; i < n;) {
                size_t j = i + 1;
                while (j < n && !strcmp(keys[i], keys[j]))
                        j++;
                char *name = keys[i], *dtype = strchr(name, '\t'), *shape;
                *dtype++ = 0;
                shape = strchr(dtype, '\t');
                *shape++ = 0;
                printf("  %-56s %-5s %-14s x%zu\n", name, dtype, shape, j - i);
                i = j;
        }
        return 0;
}

int cmd_inspect(int argc, char **argv)
{
        _cleanup_(model_freep) Model *m = NULL;
        DsError err = {};
        const BkConfig *c;
        const ModelInfo *info;
        int r;

        r = parse_argv(argc, argv);
        if (r <= 0)
                return r < 0 ? EXIT_FAILURE : EXIT_SUCCESS;

        r = model_load(arg_model, NULL, &m, &err);
        if (r < 0) {
                fprintf(stderr, "dsquant inspect: %s\n",
                        err.msg[0] ? err.msg : ds_strerror_internal(r));
                return EXIT_FAILURE;
        }
        c = &m->bk.cfg;
        info = &m->info;

        printf("model:        %s\n", arg_model);
        printf("architecture: %s\n", info->architecture);
        printf("dimensions:   hidden %u, intermediate %u, layers %u, heads %u, kv heads %u, "
               "head_dim %u\n",
                c->hidden, c->intermediate, c->n_layers, c->n_heads, c->n_kv_heads, c->head_dim);
        if (c->mla.kv_lora_rank) {
                const BkMlaConfig *mla = &c->mla;
                printf("mla:          q_lora_rank %u, kv_lora_rank %u, nope %u, rope %u, v %u, "
                       "softmax scale %g, KV %u values per token per layer\n",
                        mla->q_lora_rank, mla->kv_lora_rank, mla->qk_nope_dim, mla->qk_rope_dim,
                        mla->v_head_dim, mla->softmax_scale, mla->kv_lora_rank + mla->qk_rope_dim);
        }
        if (c->moe.n_routed) {
                static const char *const methods[_BK_TOPK_MAX] = {
                        "greedy", "group_limited_greedy", "noaux_tc"};
                const BkMoeConfig *mc = &c->moe;
                printf("moe:          %u routed experts (top %u) + %u shared, width %u, dense "
                       "below layer %u, every %u; %s %s, %u groups keep %u, norm_topk_prob %s, "
                       "scaling %g\n",
                        mc->n_routed, mc->top_k, mc->n_shared, mc->expert_dim, mc->first_dense,
                        mc->layer_freq, mc->scoring == BK_SCORING_SIGMOID ? "sigmoid" : "softmax",
                        methods[mc->topk_method], mc->n_group, mc->topk_group,
                        mc->norm_topk_prob ? "yes" : "no", mc->routed_scaling_factor);
        }
        printf("vocabulary:   %u, max positions %u, rms_norm_eps %g, tied embeddings %s\n",
                c->vocab_size, c->max_positions, c->rms_eps, info->tie_embeddings ? "yes" : "no");
        printf("quantization: %s", info->quant);
        for (uint32_t i = 0; i < info->n_not_convert; i++)
                printf("%s%s", i ? ", " : " (not converted: ", info->not_convert[i]);
        printf("%s\n", info->n_not_convert ? ")" : "");
        printf("rope:         ");
        print_rope(&c->rope);
        printf("tokens:       bos ");
        if (info->bos_id >= 0)
                printf("%d", info->bos_id);
        else
                printf("none");
        printf(", eos");
        for (uint32_t i = 0; i < info->n_eos; i++)
                printf(" %d", info->eos_ids[i]);
        printf("%s\n", info->n_eos ? "" : " none");

        r = print_tensors(m->archive);
        if (r < 0) {
                fprintf(stderr, "dsquant inspect: %s\n", ds_strerror_internal(r));
                return EXIT_FAILURE;
        }
        return EXIT_SUCCESS;
}
