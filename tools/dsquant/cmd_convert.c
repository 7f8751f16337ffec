/* SPDX-License-Identifier: MIT */
/* dsquant convert --from llama2c: a llama2.c checkpoint (shared/models/stories260K/README.md)
 * to a Hugging Face Llama directory of float32 safetensors. The weights are copied from
 * a read-only mapping while the file is written, so checkpoints larger than memory work. */
#include <assert.h>
#include <fcntl.h>
#include <getopt.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "commands.h"
#include "log.h"
#include "out_files.h"
#include "st_writer.h"
#include "tokenizer.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
        "llama2.c checkpoints and safetensors are little-endian and copied as-is");

static const char *arg_from;

/* The header of a legacy llama2.c checkpoint: 7 int32. */
typedef struct L2cConfig {
        int32_t dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len;
} L2cConfig;

/* The version 1+ exports of llama2.c's export.py start with this magic ("ak42"). */
#define L2C_MAGIC 0x616b3432

/* Offsets (in floats, from the end of the header) of each tensor of the legacy layout. */
typedef struct L2cLayout {
        uint64_t vocab, dim, hidden, kv_dim, head_size, n_layers;
        uint64_t emb, rms_att, wq, wk, wv, wo, rms_ffn, w1, w2, w3, rms_final, wcls;
        uint64_t end; /* in floats */
        bool tied;
} L2cLayout;

typedef struct L2cFile {
        const char *path;
        void *map;
        size_t size;
        const float *w; /* just past the header */
        L2cConfig cfg;
        L2cLayout lay;
} L2cFile;

static void l2c_file_close(L2cFile *f)
{
        if (f->map)
                munmap(f->map, f->size);
}

/* Adds n floats at *pos to a running offset, failing on overflow. */
static bool advance(uint64_t *pos, uint64_t a, uint64_t b, uint64_t c, uint64_t *ret_start)
{
        uint64_t n;

        if (__builtin_mul_overflow(a, b, &n) || __builtin_mul_overflow(n, c, &n))
                return false;
        *ret_start = *pos;
        return !__builtin_add_overflow(*pos, n, pos);
}

static int l2c_layout(const char *path, const L2cConfig *c, L2cLayout *ret, DsError *err)
{
        L2cLayout l = {0};
        uint64_t skip, pos = 0;

        if (c->dim == L2C_MAGIC)
                return ds_error(err, -DS_ERR_UNSUPPORTED,
                        "%s: a llama2.c version 1+ export (magic \"ak42\"); only the legacy "
                        "(version 0) float32 format is supported",
                        path);
        if (c->dim <= 0 || c->hidden_dim <= 0 || c->n_layers <= 0 || c->n_heads <= 0 ||
                c->n_kv_heads <= 0 || c->vocab_size == 0 || c->vocab_size == INT32_MIN ||
                c->seq_len <= 0)
                return ds_error(err, -DS_ERR_FORMAT,
                        "%s: implausible header (dim %d, hidden_dim %d, n_layers %d, n_heads %d, "
                        "n_kv_heads %d, vocab_size %d, seq_len %d)",
                        path, c->dim, c->hidden_dim, c->n_layers, c->n_heads, c->n_kv_heads,
                        c->vocab_size, c->seq_len);
        if (c->dim % c->n_heads != 0 || (c->dim / c->n_heads) % 2 != 0)
                return ds_error(err, -DS_ERR_FORMAT,
                        "%s: dim %d does not split into %d heads of an even size", path, c->dim,
                        c->n_heads);
        if (c->n_kv_heads > c->n_heads || c->n_heads % c->n_kv_heads != 0)
                return ds_error(err, -DS_ERR_FORMAT, "%s: %d heads cannot share %d kv heads", path,
                        c->n_heads, c->n_kv_heads);

        l.tied = c->vocab_size > 0;
        l.vocab = (uint64_t) (c->vocab_size > 0 ? c->vocab_size : -(int64_t) c->vocab_size);
        l.dim = (uint64_t) c->dim;
        l.hidden = (uint64_t) c->hidden_dim;
        l.n_layers = (uint64_t) c->n_layers;
        l.head_size = l.dim / (uint64_t) c->n_heads;
        l.kv_dim = l.head_size * (uint64_t) c->n_kv_heads;

        /* The order of llama2.c's run.c memory_map_weights(). */
        bool ok = advance(&pos, l.vocab, l.dim, 1, &l.emb) &&
                  advance(&pos, l.n_layers, l.dim, 1, &l.rms_att) &&
                  advance(&pos, l.n_layers, l.dim, l.dim, &l.wq) &&
                  advance(&pos, l.n_layers, l.kv_dim, l.dim, &l.wk) &&
                  advance(&pos, l.n_layers, l.kv_dim, l.dim, &l.wv) &&
                  advance(&pos, l.n_layers, l.dim, l.dim, &l.wo) &&
                  advance(&pos, l.n_layers, l.dim, 1, &l.rms_ffn) &&
                  advance(&pos, l.n_layers, l.hidden, l.dim, &l.w1) &&
                  advance(&pos, l.n_layers, l.dim, l.hidden, &l.w2) &&
                  advance(&pos, l.n_layers, l.hidden, l.dim, &l.w3) &&
                  advance(&pos, l.dim, 1, 1, &l.rms_final) &&
                  /* freq_cis_real and freq_cis_imag, unused: RoPE is recomputed. */
                  advance(&pos, 2, (uint64_t) c->seq_len, l.head_size / 2, &skip);
        l.wcls = l.emb;
        if (ok && !l.tied)
                ok = advance(&pos, l.vocab, l.dim, 1, &l.wcls);
        if (!ok || pos > (UINT64_MAX - sizeof(L2cConfig)) / sizeof(float))
                return ds_error(err, -DS_ERR_FORMAT, "%s: the header's dimensions overflow", path);
        l.end = pos;
        *ret = l;
        return 0;
}

static int l2c_open(const char *path, L2cFile *ret, DsError *err)
{
        _cleanup_close_ int fd = open(path, O_RDONLY | O_CLOEXEC);
        struct stat st;
        L2cFile f = {.path = path};
        int r;

        if (fd < 0)
                return ds_error(err, -errno, "%s: %s", path, strerror(errno));
        if (fstat(fd, &st) < 0)
                return ds_error(err, -errno, "%s: %s", path, strerror(errno));
        if (!S_ISREG(st.st_mode))
                return ds_error(err, -EINVAL, "%s: not a regular file", path);
        if ((uint64_t) st.st_size < sizeof(L2cConfig))
                return ds_error(err, -DS_ERR_FORMAT,
                        "%s: %lld bytes, shorter than the 28-byte header", path,
                        (long long) st.st_size);

        f.size = (size_t) st.st_size;
        f.map = mmap(NULL, f.size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (f.map == MAP_FAILED)
                return ds_error(err, -errno, "%s: mmap: %s", path, strerror(errno));
        memcpy(&f.cfg, f.map, sizeof(f.cfg));
        f.w = (const float *) ((const uint8_t *) f.map + sizeof(L2cConfig));

        r = l2c_layout(path, &f.cfg, &f.lay, err);
        if (r >= 0 && sizeof(L2cConfig) + f.lay.end * sizeof(float) != (uint64_t) f.size)
                r = ds_error(err, -DS_ERR_FORMAT,
                        "%s: %zu bytes, but its header (dim %d, hidden_dim %d, n_layers %d, "
                        "n_heads %d, n_kv_heads %d, vocab_size %d, seq_len %d) needs %llu",
                        path, f.size, f.cfg.dim, f.cfg.hidden_dim, f.cfg.n_layers, f.cfg.n_heads,
                        f.cfg.n_kv_heads, f.cfg.vocab_size, f.cfg.seq_len,
                        (unsigned long long) (sizeof(L2cConfig) + f.lay.end * sizeof(float)));
        if (r < 0) {
                l2c_file_close(&f);
                return r;
        }
        *ret = f;
        return 0;
}

// --- streaming the tensors

/* One output tensor: a [rows][cols] float32 matrix read from src, with the rows of each
 * head reordered when heads is non-zero. */
typedef struct ConvTensor {
        const float *src;
        uint64_t rows, cols;
        uint64_t heads; /* 0: rows copied in order */
        int layer;      /* >= 0: announce progress when this tensor starts */
        int n_layers;
} ConvTensor;

/* Hugging Face's convert_llama_weights_to_hf.py permute(): llama2.c rotates adjacent
 * pairs (2i, 2i+1) of each head, HF Llama rotates halves (i, i + d/2). Output row
 * h*d + j*(d/2) + i takes input row h*d + 2i + j, which is
 * w.view(heads, d/2, 2, cols).transpose(1, 2).reshape(rows, cols). */
static uint64_t permuted_row(const ConvTensor *t, uint64_t row)
{
        if (!t->heads)
                return row;

        uint64_t d = t->rows / t->heads;
        uint64_t h = row / d, rem = row % d;
        uint64_t j = rem / (d / 2), i = rem % (d / 2);
        return h * d + 2 * i + j;
}

static int conv_fill(void *userdata, uint64_t offset, void *buf, size_t n_bytes, DsError *err)
{
        const ConvTensor *t = userdata;
        uint64_t e = offset / sizeof(float), left = n_bytes / sizeof(float);
        float *out = buf;

        if (offset == 0 && t->layer >= 0)
                log_info("convert: layer %d/%d", t->layer + 1, t->n_layers);
        while (left > 0) {
                uint64_t row = e / t->cols, col = e % t->cols;
                uint64_t take = MIN(t->cols - col, left);

                memcpy(out, t->src + permuted_row(t, row) * t->cols + col, take * sizeof(float));
                out += take;
                e += take;
                left -= take;
        }
        return 0;
}

/* The tensors reference f's mapping and specs, which must outlive st_writer_write(). */
static int add_tensor(StWriter *w, const char *name, ConvTensor *spec, DsError *err)
{
        uint64_t shape[2] = {spec->rows, spec->cols};
        uint32_t n_dims = spec->cols == 1 ? 1 : 2;
        int r = st_writer_add_lazy(w, name, ST_F32, n_dims, shape, conv_fill, spec);

        if (r < 0)
                return ds_error(err, r, "adding tensor %s: %s", name, strerror(-r));
        return 0;
}

#define N_LAYER_TENSORS 9

static int write_weights(const L2cFile *f, const char *outdir, DsError *err)
{
        const L2cLayout *l = &f->lay;
        const float *w = f->w;
        int n_layers = f->cfg.n_layers;
        _cleanup_(st_writer_freep) StWriter *sw = NULL;
        _cleanup_free_ ConvTensor *specs =
                calloc((size_t) n_layers * N_LAYER_TENSORS + 3, sizeof(*specs));
        _cleanup_free_ char *path = NULL;
        ConvTensor *s = specs;
        char name[128];
        int r;

        if (!specs || asprintf(&path, "%s/model.safetensors", outdir) < 0) {
                path = NULL;
                return ds_error(err, -ENOMEM, "out of memory");
        }
        r = st_writer_new(&sw);
        if (r >= 0)
                r = st_writer_add_metadata(sw, "format", "pt");
        if (r < 0)
                return ds_error(err, r, "out of memory");

        /* Progress lines only where writing takes long enough to want them. */
        bool progress = l->end * sizeof(float) > (UINT64_C(256) << 20);

        *s = (ConvTensor){w + l->emb, l->vocab, l->dim, 0, -1, n_layers};
        if ((r = add_tensor(sw, "model.embed_tokens.weight", s++, err)) < 0)
                return r;

        for (int i = 0; i < n_layers; i++) {
                uint64_t L = (uint64_t) i;
                struct {
                        const char *suffix;
                        ConvTensor t;
                } layer[N_LAYER_TENSORS] = {
                        {"input_layernorm.weight", {w + l->rms_att + L * l->dim, l->dim, 1, 0,
                                                           progress ? i : -1, n_layers}},
                        {"self_attn.q_proj.weight",
                                {w + l->wq + L * l->dim * l->dim, l->dim, l->dim,
                                        (uint64_t) f->cfg.n_heads, -1, 0}},
                        {"self_attn.k_proj.weight",
                                {w + l->wk + L * l->kv_dim * l->dim, l->kv_dim, l->dim,
                                        (uint64_t) f->cfg.n_kv_heads, -1, 0}},
                        {"self_attn.v_proj.weight",
                                {w + l->wv + L * l->kv_dim * l->dim, l->kv_dim, l->dim, 0, -1, 0}},
                        {"self_attn.o_proj.weight",
                                {w + l->wo + L * l->dim * l->dim, l->dim, l->dim, 0, -1, 0}},
                        {"post_attention_layernorm.weight",
                                {w + l->rms_ffn + L * l->dim, l->dim, 1, 0, -1, 0}},
                        {"mlp.gate_proj.weight",
                                {w + l->w1 + L * l->hidden * l->dim, l->hidden, l->dim, 0, -1, 0}},
                        {"mlp.up_proj.weight",
                                {w + l->w3 + L * l->hidden * l->dim, l->hidden, l->dim, 0, -1, 0}},
                        {"mlp.down_proj.weight",
                                {w + l->w2 + L * l->dim * l->hidden, l->dim, l->hidden, 0, -1, 0}},
                };

                for (size_t j = 0; j < N_LAYER_TENSORS; j++) {
                        snprintf(name, sizeof(name), "model.layers.%d.%s", i, layer[j].suffix);
                        *s = layer[j].t;
                        if ((r = add_tensor(sw, name, s++, err)) < 0)
                                return r;
                }
        }

        *s = (ConvTensor){w + l->rms_final, l->dim, 1, 0, -1, 0};
        if ((r = add_tensor(sw, "model.norm.weight", s++, err)) < 0)
                return r;
        if (!l->tied) {
                *s = (ConvTensor){w + l->wcls, l->vocab, l->dim, 0, -1, 0};
                if ((r = add_tensor(sw, "lm_head.weight", s++, err)) < 0)
                        return r;
        }
        return st_writer_write(sw, path, err);
}

// --- the small files

static int write_config(const L2cFile *f, const char *outdir, DsError *err)
{
        const L2cConfig *c = &f->cfg;
        _cleanup_(cJSON_Deletep) cJSON *j = cJSON_CreateObject();
        cJSON *arch = cJSON_AddArrayToObject(j, "architectures");
        cJSON *eos = cJSON_CreateIntArray((const int[]){2, 1}, 2);
        bool ok = arch && eos;

        ok = ok && cJSON_AddItemToArray(arch, cJSON_CreateString("LlamaForCausalLM"));
        ok = ok && cJSON_AddStringToObject(j, "model_type", "llama");
        ok = ok && cJSON_AddNumberToObject(j, "hidden_size", c->dim);
        ok = ok && cJSON_AddNumberToObject(j, "intermediate_size", c->hidden_dim);
        ok = ok && cJSON_AddNumberToObject(j, "num_hidden_layers", c->n_layers);
        ok = ok && cJSON_AddNumberToObject(j, "num_attention_heads", c->n_heads);
        ok = ok && cJSON_AddNumberToObject(j, "num_key_value_heads", c->n_kv_heads);
        ok = ok && cJSON_AddNumberToObject(j, "vocab_size", (double) f->lay.vocab);
        ok = ok && cJSON_AddNumberToObject(j, "max_position_embeddings", c->seq_len);
        ok = ok && cJSON_AddStringToObject(j, "hidden_act", "silu");
        ok = ok && cJSON_AddNumberToObject(j, "rms_norm_eps", 1e-5);
        ok = ok && cJSON_AddNumberToObject(j, "rope_theta", 10000.0);
        ok = ok && cJSON_AddBoolToObject(j, "tie_word_embeddings", f->lay.tied);
        ok = ok && cJSON_AddNumberToObject(j, "bos_token_id", 1);
        /* llama2.c's run.c ends a story when the model emits BOS (id 1), so BOS is an end
         * token too; --help explains this, since JSON cannot. */
        ok = ok && cJSON_AddItemToObject(j, "eos_token_id", TAKE_PTR(eos));
        ok = ok && cJSON_AddStringToObject(j, "torch_dtype", "float32");
        cJSON_Delete(eos);
        if (!ok)
                return ds_error(err, -ENOMEM, "out of memory");
        return out_write_json(outdir, "config.json", j, err);
}

static int write_tokenizer_config(const char *outdir, DsError *err)
{
        _cleanup_(cJSON_Deletep) cJSON *j = cJSON_CreateObject();
        bool ok = j;

        ok = ok && cJSON_AddStringToObject(j, "bos_token", "<s>");
        ok = ok && cJSON_AddStringToObject(j, "eos_token", "</s>");
        ok = ok && cJSON_AddStringToObject(j, "unk_token", "<unk>");
        ok = ok && cJSON_AddBoolToObject(j, "add_bos_token", true);
        ok = ok && cJSON_AddBoolToObject(j, "add_eos_token", false);
        ok = ok && cJSON_AddStringToObject(j, "tokenizer_class", "LlamaTokenizer");
        if (!ok)
                return ds_error(err, -ENOMEM, "out of memory");
        return out_write_json(outdir, "tokenizer_config.json", j, err);
}

// --- the command

static void help(FILE *out)
{
        fprintf(out,
                "Usage: dsquant convert --from llama2c CHECKPOINT.bin TOKENIZER.bin OUTDIR\n"
                "\n"
                "Converts a legacy (version 0, float32) llama2.c checkpoint and its tokenizer.bin\n"
                "into a Hugging Face Llama model directory, created if missing:\n"
                "  config.json            LlamaForCausalLM; rms_norm_eps 1e-5, rope_theta 10000,\n"
                "                         max_position_embeddings = seq_len, tie_word_embeddings\n"
                "                         when the header's vocab_size is positive\n"
                "  model.safetensors      float32, Hugging Face tensor names; the rows of q_proj "
                "and\n"
                "                         k_proj are permuted from llama2.c's adjacent-pair RoPE "
                "to\n"
                "                         Hugging Face's rotate-half, as "
                "convert_llama_weights_to_hf.py\n"
                "                         does; lm_head.weight only when not tied\n"
                "  tokenizer.json         SentencePiece-style BPE with byte fallback\n"
                "  tokenizer_config.json  <s> as BOS (added), </s> as EOS, no chat template\n"
                "\n"
                "eos_token_id is [2, 1]: besides </s> (2), BOS (1) ends generation, because\n"
                "llama2.c's run.c stops a story when the model emits BOS, and the llama2.c models\n"
                "were trained with BOS between stories.\n"
                "\n"
                "Options:\n"
                "  --from FORMAT   the input format; only 'llama2c'\n"
                "  -h, --help      show this help\n");
}

int cmd_convert(int argc, char **argv)
{
        static const struct option options[] = {
                {"from", required_argument, NULL, 'f'},
                {"help", no_argument, NULL, 'h'},
                {},
        };
        _cleanup_(l2c_file_close) L2cFile f = {0};
        _cleanup_free_ char *tok_json = NULL;
        DsError err = {0};
        int c, r;

        optind = 0;
        while ((c = getopt_long(argc, argv, "h", options, NULL)) >= 0)
                switch (c) {
                case 'f':
                        arg_from = optarg;
                        break;
                case 'h':
                        help(stdout);
                        return EXIT_SUCCESS;
                default:
                        return EXIT_FAILURE; /* getopt named the option */
                }

        if (!arg_from) {
                log_error("convert: --from is required (only 'llama2c' is supported)");
                return EXIT_FAILURE;
        }
        if (strcmp(arg_from, "llama2c") != 0) {
                log_error("convert: unknown --from '%s' (only 'llama2c' is supported)", arg_from);
                return EXIT_FAILURE;
        }
        if (argc - optind != 3) {
                log_error(
                        "convert: expected CHECKPOINT.bin TOKENIZER.bin OUTDIR, got %d argument(s)",
                        argc - optind);
                return EXIT_FAILURE;
        }

        const char *ckpt = argv[optind], *tok = argv[optind + 1], *outdir = argv[optind + 2];

        /* Both inputs are read and checked before anything is written, so that a bad
         * tokenizer does not leave a half-converted directory behind. */
        r = l2c_open(ckpt, &f, &err);
        if (r >= 0)
                r = tokenizer_json_from_llama2c(tok, (uint32_t) f.lay.vocab, &tok_json, &err);
        if (r >= 0)
                r = out_dir_prepare(outdir, &err);
        if (r >= 0)
                r = write_weights(&f, outdir, &err);
        if (r >= 0)
                r = write_config(&f, outdir, &err);
        if (r >= 0)
                r = out_write_text(outdir, "tokenizer.json", tok_json, strlen(tok_json), &err);
        if (r >= 0)
                r = write_tokenizer_config(outdir, &err);
        if (r < 0) {
                log_error("convert: %s", err.msg);
                return EXIT_FAILURE;
        }

        log_info("wrote %s/{config.json,model.safetensors,tokenizer.json,tokenizer_config.json}: "
                 "Llama, %d layers, dim %d, %s classifier",
                outdir, f.cfg.n_layers, f.cfg.dim, f.lay.tied ? "tied" : "separate");
        return EXIT_SUCCESS;
}
