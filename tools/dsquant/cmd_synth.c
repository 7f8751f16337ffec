/* SPDX-License-Identifier: MIT */
/* dsquant synth: a deterministic synthetic AWQ INT4 checkpoint with the real layout and
 * random weights, for the embedded default model, tests and benchmarks. Every value is a
 * hash of (seed, tensor name, element index), so tensors are generated chunk by chunk
 * while the file is written, in any order, and the same seed gives the same bytes. */
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "awq_pack.h"
#include "commands.h"
#include "half.h"
#include "log.h"
#include "out_files.h"
#include "st_writer.h"
#include "synth_tokenizer.h"

static const char *arg_shape;
static const char *arg_config;
static uint64_t arg_seed = 1;

typedef struct SynthShape {
        const char *name;
        /* Qwen2ForCausalLM (q/k/v biases), LlamaForCausalLM, or DeepseekV2ForCausalLM (MLA
         * without q LoRA, softmax-greedy MoE, YaRN) */
        const char *arch;
        uint32_t hidden, intermediate, n_layers, n_heads, n_kv_heads, head_dim, vocab;
        uint32_t max_pos, group_size;
        double rope_theta, rms_eps;
        bool tied;
        /* DeepseekV2ForCausalLM only */
        uint32_t kv_lora_rank, qk_nope, qk_rope, v_head;
        uint32_t n_routed, n_shared, top_k, expert_dim, first_dense;
        double yarn_factor, yarn_mscale; /* mscale and mscale_all_dim alike */
        uint32_t yarn_original_max_pos;
} SynthShape;

/* clang-format off */
static const SynthShape SHAPES[] = {
        { "tiny", "Qwen2ForCausalLM", 256, 768, 2, 4, 2, 64, 512, 2048, 128, 10000.0, 1e-6, false },
        /* DeepSeek-R1-Distill-Qwen-7B and -32B (shared/docs/formats.md). */
        { "qwen2-7b", "Qwen2ForCausalLM", 3584, 18944, 28, 28, 4, 128, 152064, 131072, 128, 10000.0, 1e-6, false },
        { "qwen2-32b", "Qwen2ForCausalLM", 5120, 27648, 64, 40, 8, 128, 152064, 131072, 128, 1000000.0, 1e-5, false },
        /* A small MoE + MLA model for tests: the first layer dense, then 8 experts, top 2. */
        { "tiny-moe", "DeepseekV2ForCausalLM", 256, 512, 3, 4, 4, 64, 512, 163840, 128, 10000.0, 1e-6, false,
          128, 64, 32, 64, 8, 2, 2, 128, 1, 40.0, 0.707, 4096 },
        /* DeepSeek-V2-Lite (shared/docs/formats.md). Group 64: the dense layer's 10944
         * inputs to down_proj are not a multiple of 128. */
        { "deepseek-v2-lite", "DeepseekV2ForCausalLM", 2048, 10944, 27, 16, 16, 128, 102400, 163840, 64, 10000.0, 1e-6, false,
          512, 128, 64, 128, 64, 2, 6, 1408, 1, 40.0, 0.707, 4096 },
};
/* clang-format on */

/* Up to this many quantized weights, linears are random float matrices quantized with
 * awq_quantize_rtn(), as a real AWQ checkpoint would be; above it, packed values and
 * scales are drawn directly, which is an order of magnitude faster. */
#define SYNTH_RTN_MAX_WEIGHTS (UINT64_C(1) << 26)

/* Standard deviation of every weight matrix, embedding and bias: keeps activations in
 * the range of a real model without any training. */
#define SYNTH_STD 0.02f

// --- the generator

static uint64_t mix64(uint64_t z)
{
        /* The splitmix64 finalizer. */
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        return z ^ (z >> 31);
}

static uint64_t rand_at(uint64_t key, uint64_t i)
{
        return mix64(key + (i + 1) * 0x9e3779b97f4a7c15ull);
}

/* Approximately standard normal: the sum of four 16-bit uniforms, centred and scaled
 * (Irwin-Hall), from one hash. */
static float normalish(uint64_t key, uint64_t i)
{
        uint64_t h = rand_at(key, i);
        double s = (double) (h & 0xffff) + (double) ((h >> 16) & 0xffff) +
                   (double) ((h >> 32) & 0xffff) + (double) (h >> 48);
        return (float) ((s - 4 * 32767.5) / 37837.2);
}

static uint64_t tensor_key(const char *name)
{
        uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */

        for (const char *c = name; *c; c++)
                h = (h ^ (unsigned char) *c) * 0x100000001b3ull;
        return mix64(h ^ mix64(arg_seed));
}

// --- tensors

typedef enum SynthKind { SYN_NORMAL, SYN_ONES, SYN_QWEIGHT, SYN_QZEROS, SYN_SCALES } SynthKind;

/* One quantized linear layer: in RTN mode its three tensors come from one quantization,
 * cached from the first request until the scales (written last) are done. */
typedef struct SynthLinear {
        uint32_t in, out, gs;
        uint64_t key;
        bool rtn;
        uint32_t *qweight, *qzeros;
        uint16_t *scales;
} SynthLinear;

typedef struct SynthTensor {
        SynthKind kind;
        uint64_t key;
        uint64_t n_bytes;
        SynthLinear *lin;
        int layer; /* >= 0: announce progress when this tensor starts */
} SynthTensor;

typedef struct Synth {
        SynthShape shape;
        SynthTensor *tensors;
        SynthLinear *linears;
        size_t n_tensors, n_linears;
        uint64_t total_bytes;
        bool rtn; /* quantize random float weights rather than draw packed ones */
        bool progress;
} Synth;

static void synth_linear_drop(SynthLinear *l)
{
        free(l->qweight);
        free(l->qzeros);
        free(l->scales);
        l->qweight = l->qzeros = NULL;
        l->scales = NULL;
}

static void synth_done(Synth *s)
{
        for (size_t i = 0; i < s->n_linears; i++)
                synth_linear_drop(&s->linears[i]);
        free(s->linears);
        free(s->tensors);
}

static int synth_linear_quantize(SynthLinear *l, DsError *err)
{
        uint64_t n = (uint64_t) l->in * l->out, g = l->in / l->gs;
        _cleanup_free_ float *w = malloc(n * sizeof(float));

        l->qweight = malloc((size_t) l->in * (l->out / 8) * sizeof(uint32_t));
        l->qzeros = malloc((size_t) g * (l->out / 8) * sizeof(uint32_t));
        l->scales = malloc((size_t) g * l->out * sizeof(uint16_t));
        if (!w || !l->qweight || !l->qzeros || !l->scales) {
                synth_linear_drop(l);
                return ds_error(err, -ENOMEM, "out of memory for a %ux%u linear", l->out, l->in);
        }
        for (uint64_t i = 0; i < n; i++)
                w[i] = SYNTH_STD * normalish(l->key, i);

        int r = awq_quantize_rtn(w, l->in, l->out, l->gs, l->qweight, l->qzeros, l->scales);
        if (r < 0) {
                synth_linear_drop(l);
                return ds_error(
                        err, r, "quantizing a %ux%u linear with group %u", l->out, l->in, l->gs);
        }
        return 0;
}

/* Direct mode: q uniform in 0..15 and zeros in 6..9 give q - z a standard deviation of
 * about 4.6, so this scale gives dequantized weights of about SYNTH_STD. */
#define SYNTH_DIRECT_SCALE (SYNTH_STD / 4.6f)

static uint32_t direct_word(const SynthTensor *t, uint64_t i)
{
        uint64_t h = rand_at(t->key, i);

        if (t->kind == SYN_QWEIGHT)
                return (uint32_t) h;

        uint32_t word = 0;
        for (unsigned k = 0; k < 8; k++)
                word |= (uint32_t) (6 + ((h >> (2 * k)) & 3)) << (4 * k);
        return word;
}

static int synth_fill(void *userdata, uint64_t offset, void *buf, size_t n_bytes, DsError *err)
{
        SynthTensor *t = userdata;
        SynthLinear *l = t->lin;
        int r;

        if (offset == 0 && t->layer >= 0)
                log_info("writing layer %d", t->layer);

        switch (t->kind) {
        case SYN_NORMAL: {
                uint16_t *out = buf;
                for (uint64_t i = 0; i < n_bytes / 2; i++)
                        out[i] = f32_to_f16(SYNTH_STD * normalish(t->key, offset / 2 + i));
                return 0;
        }
        case SYN_ONES: {
                uint16_t *out = buf;
                for (uint64_t i = 0; i < n_bytes / 2; i++)
                        out[i] = 0x3C00; /* 1.0 in binary16 */
                return 0;
        }
        case SYN_QWEIGHT:
        case SYN_QZEROS:
        case SYN_SCALES:
                break;
        }

        if (!l->rtn) {
                if (t->kind == SYN_SCALES) {
                        uint16_t *out = buf;
                        for (uint64_t i = 0; i < n_bytes / 2; i++) {
                                double u = (double) (rand_at(t->key, offset / 2 + i) >> 11) /
                                           9007199254740992.0;
                                out[i] = f32_to_f16(SYNTH_DIRECT_SCALE * (float) (0.75 + 0.5 * u));
                        }
                } else {
                        uint32_t *out = buf;
                        for (uint64_t i = 0; i < n_bytes / 4; i++)
                                out[i] = direct_word(t, offset / 4 + i);
                }
                return 0;
        }

        if (!l->qweight && (r = synth_linear_quantize(l, err)) < 0)
                return r;
        const uint8_t *src = t->kind == SYN_QWEIGHT  ? (const uint8_t *) l->qweight
                             : t->kind == SYN_QZEROS ? (const uint8_t *) l->qzeros
                                                     : (const uint8_t *) l->scales;
        memcpy(buf, src + offset, n_bytes);
        if (t->kind == SYN_SCALES && offset + n_bytes == t->n_bytes)
                synth_linear_drop(l);
        return 0;
}

static int add(Synth *s, StWriter *w, const char *name, SynthKind kind, StDtype dtype,
        uint32_t n_dims, const uint64_t *shape, SynthLinear *lin, int layer, DsError *err)
{
        SynthTensor *t = &s->tensors[s->n_tensors++];
        uint64_t n = st_dtype_size(dtype);

        for (uint32_t d = 0; d < n_dims; d++)
                n *= shape[d];
        *t = (SynthTensor){.kind = kind,
                .key = tensor_key(name),
                .n_bytes = n,
                .lin = lin,
                .layer = s->progress ? layer : -1};
        s->total_bytes += n;

        int r = st_writer_add_lazy(w, name, dtype, n_dims, shape, synth_fill, t);
        if (r < 0)
                return ds_error(err, r, "adding tensor %s: %s", name, strerror(-r));
        return 0;
}

static int add_linear(Synth *s, StWriter *w, int layer, const char *base, uint32_t in, uint32_t out,
        bool bias, DsError *err)
{
        const SynthShape *sh = &s->shape;
        SynthLinear *l = &s->linears[s->n_linears++];
        uint64_t g = in / sh->group_size;
        char name[160];
        int r;

        *l = (SynthLinear){.in = in, .out = out, .gs = sh->group_size};
        snprintf(name, sizeof(name), "model.layers.%d.%s", layer, base);
        l->key = tensor_key(name);

        l->rtn = s->rtn;

        struct {
                const char *suffix;
                SynthKind kind;
                StDtype dtype;
                uint64_t shape[2];
        } parts[] = {
                {"qweight", SYN_QWEIGHT, ST_I32, {in, out / 8}},
                {"qzeros", SYN_QZEROS, ST_I32, {g, out / 8}},
                {"scales", SYN_SCALES, ST_F16, {g, out}},
        };
        for (size_t i = 0; i < ELEMENTSOF(parts); i++) {
                snprintf(name, sizeof(name), "model.layers.%d.%s.%s", layer, base, parts[i].suffix);
                r = add(s, w, name, parts[i].kind, parts[i].dtype, 2, parts[i].shape, l, -1, err);
                if (r < 0)
                        return r;
        }
        if (bias) {
                uint64_t shape[1] = {out};
                snprintf(name, sizeof(name), "model.layers.%d.%s.bias", layer, base);
                return add(s, w, name, SYN_NORMAL, ST_F16, 1, shape, NULL, -1, err);
        }
        return 0;
}

static bool is_deepseek(const SynthShape *sh)
{
        return !strcmp(sh->arch, "DeepseekV2ForCausalLM");
}

/* Linears per DeepSeek layer, at most: q, kv_a, kv_b, o, then the routed and the shared
 * experts' three each (a dense layer has fewer). */
static uint32_t deepseek_layer_linears(const SynthShape *sh)
{
        return 4 + 3 * (sh->n_routed + 1);
}

/* Quantized weights of one DeepSeek layer, MoE or dense. */
static uint64_t deepseek_layer_weights(const SynthShape *sh, bool moe)
{
        uint64_t h = sh->hidden, N = sh->n_heads;
        uint64_t attn = h * N * (sh->qk_nope + sh->qk_rope) + h * (sh->kv_lora_rank + sh->qk_rope) +
                        (uint64_t) sh->kv_lora_rank * N * (sh->qk_nope + sh->v_head) +
                        N * sh->v_head * h;
        uint64_t mlp = moe ? 3 * h * sh->expert_dim * ((uint64_t) sh->n_routed + sh->n_shared)
                           : 3 * h * sh->intermediate;
        return attn + mlp;
}

/* One DeepSeek-V2 decoder layer under the published names: MLA without q LoRA, then the
 * dense MLP or the FP16 router, the routed experts and the shared experts. */
static int add_deepseek_layer(Synth *s, StWriter *w, int L, DsError *err)
{
        const SynthShape *sh = &s->shape;
        uint32_t N = sh->n_heads, h = sh->hidden;
        uint64_t norm[1] = {h}, kv_norm[1] = {sh->kv_lora_rank};
        uint64_t router[2] = {sh->n_routed, h};
        char name[160];
        int r;

        snprintf(name, sizeof(name), "model.layers.%d.input_layernorm.weight", L);
        if ((r = add(s, w, name, SYN_ONES, ST_F16, 1, norm, NULL, L, err)) < 0 ||
                (r = add_linear(s, w, L, "self_attn.q_proj", h, N * (sh->qk_nope + sh->qk_rope),
                         false, err)) < 0 ||
                (r = add_linear(s, w, L, "self_attn.kv_a_proj_with_mqa", h,
                         sh->kv_lora_rank + sh->qk_rope, false, err)) < 0)
                return r;
        snprintf(name, sizeof(name), "model.layers.%d.self_attn.kv_a_layernorm.weight", L);
        if ((r = add(s, w, name, SYN_ONES, ST_F16, 1, kv_norm, NULL, -1, err)) < 0 ||
                (r = add_linear(s, w, L, "self_attn.kv_b_proj", sh->kv_lora_rank,
                         N * (sh->qk_nope + sh->v_head), false, err)) < 0 ||
                (r = add_linear(s, w, L, "self_attn.o_proj", N * sh->v_head, h, false, err)) < 0)
                return r;
        snprintf(name, sizeof(name), "model.layers.%d.post_attention_layernorm.weight", L);
        if ((r = add(s, w, name, SYN_ONES, ST_F16, 1, norm, NULL, -1, err)) < 0)
                return r;

        if ((uint32_t) L < sh->first_dense) {
                if ((r = add_linear(s, w, L, "mlp.gate_proj", h, sh->intermediate, false, err)) <
                                0 ||
                        (r = add_linear(s, w, L, "mlp.up_proj", h, sh->intermediate, false, err)) <
                                0)
                        return r;
                return add_linear(s, w, L, "mlp.down_proj", sh->intermediate, h, false, err);
        }
        snprintf(name, sizeof(name), "model.layers.%d.mlp.gate.weight", L);
        if ((r = add(s, w, name, SYN_NORMAL, ST_F16, 2, router, NULL, -1, err)) < 0)
                return r;
        for (uint32_t e = 0; e <= sh->n_routed; e++) {
                /* The experts, then the shared experts as one MLP of n_shared widths. */
                bool shared = e == sh->n_routed;
                uint32_t width = shared ? sh->n_shared * sh->expert_dim : sh->expert_dim;
                char base[96];
                if (shared && sh->n_shared == 0)
                        break;
                if (shared)
                        snprintf(base, sizeof(base), "mlp.shared_experts");
                else
                        snprintf(base, sizeof(base), "mlp.experts.%u", e);
                const char *parts[] = {"gate_proj", "up_proj", "down_proj"};
                for (size_t i = 0; i < ELEMENTSOF(parts); i++) {
                        char lin[128];
                        snprintf(lin, sizeof(lin), "%s.%s", base, parts[i]);
                        r = i < 2 ? add_linear(s, w, L, lin, h, width, false, err)
                                  : add_linear(s, w, L, lin, width, h, false, err);
                        if (r < 0)
                                return r;
                }
        }
        return 0;
}

static int synth_weights(Synth *s, const char *outdir, DsError *err)
{
        const SynthShape *sh = &s->shape;
        bool biases = !strcmp(sh->arch, "Qwen2ForCausalLM");
        uint32_t q_dim = sh->n_heads * sh->head_dim, kv_dim = sh->n_kv_heads * sh->head_dim;
        uint64_t emb[2] = {sh->vocab, sh->hidden}, norm[1] = {sh->hidden};
        _cleanup_(st_writer_freep) StWriter *w = NULL;
        _cleanup_free_ char *path = NULL;
        char name[160];
        int r;

        size_t layer_linears = is_deepseek(sh) ? deepseek_layer_linears(sh) : 7;
        /* Three tensors per linear, up to one bias each, four norms and a router. */
        s->tensors =
                calloc((size_t) sh->n_layers * (layer_linears * 4 + 5) + 3, sizeof(*s->tensors));
        s->linears = calloc((size_t) sh->n_layers * layer_linears, sizeof(*s->linears));
        if (!s->tensors || !s->linears || asprintf(&path, "%s/model.safetensors", outdir) < 0) {
                path = NULL;
                return ds_error(err, -ENOMEM, "out of memory");
        }
        r = st_writer_new(&w);
        if (r >= 0)
                r = st_writer_add_metadata(w, "format", "pt");
        if (r < 0)
                return ds_error(err, r, "out of memory");

        uint64_t per_layer = (uint64_t) sh->hidden * (q_dim + 2 * kv_dim) +
                             (uint64_t) q_dim * sh->hidden +
                             3 * (uint64_t) sh->hidden * sh->intermediate;
        if (is_deepseek(sh))
                per_layer = deepseek_layer_weights(sh, true);
        s->rtn = per_layer * sh->n_layers <= SYNTH_RTN_MAX_WEIGHTS;
        /* Progress lines only where writing takes long enough to want them. */
        s->progress = (uint64_t) sh->vocab * sh->hidden > (UINT64_C(64) << 20);

        if ((r = add(s, w, "model.embed_tokens.weight", SYN_NORMAL, ST_F16, 2, emb, NULL, -1,
                     err)) < 0)
                return r;
        for (uint32_t i = 0; i < sh->n_layers; i++) {
                int L = (int) i;

                if (is_deepseek(sh)) {
                        if ((r = add_deepseek_layer(s, w, L, err)) < 0)
                                return r;
                        continue;
                }
                snprintf(name, sizeof(name), "model.layers.%d.input_layernorm.weight", L);
                if ((r = add(s, w, name, SYN_ONES, ST_F16, 1, norm, NULL, L, err)) < 0 ||
                        (r = add_linear(s, w, L, "self_attn.q_proj", sh->hidden, q_dim, biases,
                                 err)) < 0 ||
                        (r = add_linear(s, w, L, "self_attn.k_proj", sh->hidden, kv_dim, biases,
                                 err)) < 0 ||
                        (r = add_linear(s, w, L, "self_attn.v_proj", sh->hidden, kv_dim, biases,
                                 err)) < 0 ||
                        (r = add_linear(
                                 s, w, L, "self_attn.o_proj", q_dim, sh->hidden, false, err)) < 0)
                        return r;
                snprintf(name, sizeof(name), "model.layers.%d.post_attention_layernorm.weight", L);
                if ((r = add(s, w, name, SYN_ONES, ST_F16, 1, norm, NULL, -1, err)) < 0 ||
                        (r = add_linear(s, w, L, "mlp.gate_proj", sh->hidden, sh->intermediate,
                                 false, err)) < 0 ||
                        (r = add_linear(s, w, L, "mlp.up_proj", sh->hidden, sh->intermediate, false,
                                 err)) < 0 ||
                        (r = add_linear(s, w, L, "mlp.down_proj", sh->intermediate, sh->hidden,
                                 false, err)) < 0)
                        return r;
        }
        if ((r = add(s, w, "model.norm.weight", SYN_ONES, ST_F16, 1, norm, NULL, -1, err)) < 0)
                return r;
        if (!sh->tied &&
                (r = add(s, w, "lm_head.weight", SYN_NORMAL, ST_F16, 2, emb, NULL, -1, err)) < 0)
                return r;

        return st_writer_write(w, path, err);
}

// --- shapes and the small files

static int json_u32(const cJSON *j, const char *key, bool required, uint32_t def, uint32_t *ret,
        const char *path, DsError *err)
{
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);

        if (!v) {
                if (required)
                        return ds_error(err, -DS_ERR_FORMAT, "%s: \"%s\" is missing", path, key);
                *ret = def;
                return 0;
        }
        if (!cJSON_IsNumber(v) || v->valuedouble < 1 || v->valuedouble > UINT32_MAX ||
                v->valuedouble != floor(v->valuedouble))
                return ds_error(
                        err, -DS_ERR_FORMAT, "%s: \"%s\" is not a positive integer", path, key);
        *ret = (uint32_t) v->valuedouble;
        return 0;
}

static int json_double(
        const cJSON *j, const char *key, double def, double *ret, const char *path, DsError *err)
{
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);

        if (!v) {
                *ret = def;
                return 0;
        }
        if (!cJSON_IsNumber(v) || !(v->valuedouble > 0))
                return ds_error(
                        err, -DS_ERR_FORMAT, "%s: \"%s\" is not a positive number", path, key);
        *ret = v->valuedouble;
        return 0;
}

static int shape_from_config(const char *path, SynthShape *ret, DsError *err)
{
        _cleanup_free_ char *text = NULL;
        _cleanup_(cJSON_Deletep) cJSON *j = NULL;
        SynthShape sh = {.name = path};
        size_t len = 0;
        FILE *f = fopen(path, "re");
        int r;

        if (!f)
                return ds_error(err, -errno, "%s: %s", path, strerror(errno));
        r = getdelim(&text, &len, '\0', f) < 0 && ferror(f) ? -EIO : 0;
        fclose(f);
        if (r < 0 || !text)
                return ds_error(err, -EIO, "%s: cannot read", path);
        j = cJSON_Parse(text);
        if (!cJSON_IsObject(j))
                return ds_error(err, -DS_ERR_FORMAT, "%s: not a JSON object", path);

        const cJSON *arch =
                cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(j, "architectures"), 0);
        if (!cJSON_IsString(arch))
                return ds_error(err, -DS_ERR_FORMAT, "%s: \"architectures\" is missing", path);
        if (!strcmp(arch->valuestring, "Qwen2ForCausalLM"))
                sh.arch = "Qwen2ForCausalLM";
        else if (!strcmp(arch->valuestring, "LlamaForCausalLM"))
                sh.arch = "LlamaForCausalLM";
        else
                return ds_error(err, -DS_ERR_UNSUPPORTED,
                        "%s: architecture %s cannot be synthesized (Qwen2ForCausalLM or "
                        "LlamaForCausalLM)",
                        path, arch->valuestring);

        const cJSON *qc = cJSON_GetObjectItemCaseSensitive(j, "quantization_config");
        const cJSON *tie = cJSON_GetObjectItemCaseSensitive(j, "tie_word_embeddings");
        if ((r = json_u32(j, "hidden_size", true, 0, &sh.hidden, path, err)) < 0 ||
                (r = json_u32(j, "intermediate_size", true, 0, &sh.intermediate, path, err)) < 0 ||
                (r = json_u32(j, "num_hidden_layers", true, 0, &sh.n_layers, path, err)) < 0 ||
                (r = json_u32(j, "num_attention_heads", true, 0, &sh.n_heads, path, err)) < 0 ||
                (r = json_u32(j, "num_key_value_heads", false, sh.n_heads, &sh.n_kv_heads, path,
                         err)) < 0 ||
                (r = json_u32(j, "head_dim", false, sh.hidden / sh.n_heads, &sh.head_dim, path,
                         err)) < 0 ||
                (r = json_u32(j, "vocab_size", true, 0, &sh.vocab, path, err)) < 0 ||
                (r = json_u32(j, "max_position_embeddings", false, 2048, &sh.max_pos, path, err)) <
                        0 ||
                (r = json_u32(qc, "group_size", false, 128, &sh.group_size, path, err)) < 0 ||
                (r = json_double(j, "rope_theta", 10000.0, &sh.rope_theta, path, err)) < 0 ||
                (r = json_double(j, "rms_norm_eps", 1e-6, &sh.rms_eps, path, err)) < 0)
                return r;
        sh.tied = cJSON_IsTrue(tie);
        *ret = sh;
        return 0;
}

static int shape_check(const SynthShape *sh, DsError *err)
{
        uint64_t q_dim = (uint64_t) sh->n_heads * sh->head_dim;
        uint64_t kv_dim = (uint64_t) sh->n_kv_heads * sh->head_dim;

        /* Bounds that keep every size product below 2^64 and every dimension in uint32. */
        if (sh->hidden > (1u << 20) || sh->intermediate > (1u << 20) || sh->n_layers > 1024 ||
                sh->vocab > (1u << 22) || q_dim > (1u << 20) || sh->head_dim == 0)
                return ds_error(err, -EINVAL, "%s: dimensions too large to synthesize", sh->name);
        if (sh->n_kv_heads > sh->n_heads || sh->n_heads % sh->n_kv_heads != 0)
                return ds_error(err, -EINVAL, "%s: %u heads cannot share %u kv heads", sh->name,
                        sh->n_heads, sh->n_kv_heads);
        if (sh->hidden % sh->group_size || q_dim % sh->group_size ||
                sh->intermediate % sh->group_size)
                return ds_error(err, -EINVAL,
                        "%s: group size %u does not divide the inputs of every linear (%u, %" PRIu64
                        ", %u)",
                        sh->name, sh->group_size, sh->hidden, q_dim, sh->intermediate);
        if (sh->hidden % 8 || q_dim % 8 || kv_dim % 8 || sh->intermediate % 8)
                return ds_error(err, -EINVAL,
                        "%s: every linear's output count must be a multiple of 8", sh->name);
        if (is_deepseek(sh) &&
                (sh->kv_lora_rank % sh->group_size || sh->expert_dim % sh->group_size ||
                        (sh->n_heads * sh->v_head) % sh->group_size ||
                        (sh->kv_lora_rank + sh->qk_rope) % 8 || sh->qk_rope % 2 ||
                        sh->top_k > sh->n_routed))
                return ds_error(err, -EINVAL,
                        "%s: the MLA and expert widths must be multiples of the group size %u, "
                        "kv_lora_rank + qk_rope of 8, and top_k at most the experts",
                        sh->name, sh->group_size);
        if (sh->vocab < SYNTH_TOKENIZER_MIN_VOCAB)
                return ds_error(err, -EINVAL,
                        "%s: vocab_size %u is below the %u the tokenizer needs", sh->name,
                        sh->vocab, SYNTH_TOKENIZER_MIN_VOCAB);
        return 0;
}

/* The MLA, MoE and YaRN fields of a DeepSeek-V2 config.json, in the published form. */
static bool write_deepseek_config(const SynthShape *sh, cJSON *j)
{
        bool ok = cJSON_AddNullToObject(j, "q_lora_rank") &&
                  cJSON_AddNumberToObject(j, "kv_lora_rank", sh->kv_lora_rank) &&
                  cJSON_AddNumberToObject(j, "qk_nope_head_dim", sh->qk_nope) &&
                  cJSON_AddNumberToObject(j, "qk_rope_head_dim", sh->qk_rope) &&
                  cJSON_AddNumberToObject(j, "v_head_dim", sh->v_head) &&
                  cJSON_AddNumberToObject(j, "n_routed_experts", sh->n_routed) &&
                  cJSON_AddNumberToObject(j, "n_shared_experts", sh->n_shared) &&
                  cJSON_AddNumberToObject(j, "num_experts_per_tok", sh->top_k) &&
                  cJSON_AddNumberToObject(j, "moe_intermediate_size", sh->expert_dim) &&
                  cJSON_AddNumberToObject(j, "first_k_dense_replace", sh->first_dense) &&
                  cJSON_AddNumberToObject(j, "moe_layer_freq", 1) &&
                  cJSON_AddNumberToObject(j, "n_group", 1) &&
                  cJSON_AddNumberToObject(j, "topk_group", 1) &&
                  cJSON_AddStringToObject(j, "topk_method", "greedy") &&
                  cJSON_AddStringToObject(j, "scoring_func", "softmax") &&
                  cJSON_AddFalseToObject(j, "norm_topk_prob") &&
                  cJSON_AddNumberToObject(j, "routed_scaling_factor", 1.0);
        cJSON *y = ok ? cJSON_AddObjectToObject(j, "rope_scaling") : NULL;
        return y && cJSON_AddStringToObject(y, "type", "yarn") &&
               cJSON_AddNumberToObject(y, "factor", sh->yarn_factor) &&
               cJSON_AddNumberToObject(
                       y, "original_max_position_embeddings", sh->yarn_original_max_pos) &&
               cJSON_AddNumberToObject(y, "beta_fast", 32) &&
               cJSON_AddNumberToObject(y, "beta_slow", 1) &&
               cJSON_AddNumberToObject(y, "mscale", sh->yarn_mscale) &&
               cJSON_AddNumberToObject(y, "mscale_all_dim", sh->yarn_mscale);
}

static int write_config(
        const SynthShape *sh, const SynthTokens *tok, const char *outdir, DsError *err)
{
        _cleanup_(cJSON_Deletep) cJSON *j = cJSON_CreateObject();
        bool qwen2 = !strcmp(sh->arch, "Qwen2ForCausalLM"), ds = is_deepseek(sh);
        cJSON *arch = j ? cJSON_AddArrayToObject(j, "architectures") : NULL;
        cJSON *a = arch ? cJSON_CreateString(sh->arch) : NULL;
        bool ok = a && cJSON_AddItemToArray(arch, a);

        if (!ok)
                cJSON_Delete(a);
        ok = ok && cJSON_AddStringToObject(j, "model_type",
                           qwen2 ? "qwen2"
                           : ds  ? "deepseek_v2"
                                 : "llama");
        ok = ok && cJSON_AddNumberToObject(j, "hidden_size", sh->hidden);
        ok = ok && cJSON_AddNumberToObject(j, "intermediate_size", sh->intermediate);
        ok = ok && cJSON_AddNumberToObject(j, "num_hidden_layers", sh->n_layers);
        ok = ok && cJSON_AddNumberToObject(j, "num_attention_heads", sh->n_heads);
        ok = ok && cJSON_AddNumberToObject(j, "num_key_value_heads", sh->n_kv_heads);
        ok = ok && cJSON_AddNumberToObject(j, "head_dim", sh->head_dim);
        ok = ok && cJSON_AddNumberToObject(j, "vocab_size", sh->vocab);
        ok = ok && cJSON_AddNumberToObject(j, "max_position_embeddings", sh->max_pos);
        ok = ok && cJSON_AddNumberToObject(j, "rope_theta", sh->rope_theta);
        ok = ok && cJSON_AddNumberToObject(j, "rms_norm_eps", sh->rms_eps);
        ok = ok && cJSON_AddStringToObject(j, "hidden_act", "silu");
        ok = ok && cJSON_AddBoolToObject(j, "tie_word_embeddings", sh->tied);
        if (qwen2)
                ok = ok && cJSON_AddFalseToObject(j, "use_sliding_window");
        if (ds)
                ok = ok && write_deepseek_config(sh, j);
        ok = ok && cJSON_AddNumberToObject(j, "bos_token_id", tok->endoftext);

        cJSON *eos = ok ? cJSON_AddArrayToObject(j, "eos_token_id") : NULL;
        cJSON *e0 = eos ? cJSON_CreateNumber(tok->endoftext) : NULL;
        cJSON *e1 = eos ? cJSON_CreateNumber(tok->im_end) : NULL;
        ok = e0 && e1 && cJSON_AddItemToArray(eos, e0) && cJSON_AddItemToArray(eos, e1);
        if (!ok) {
                cJSON_Delete(e0);
                cJSON_Delete(e1);
        }
        ok = ok && cJSON_AddStringToObject(j, "torch_dtype", "float16");

        cJSON *qc = ok ? cJSON_AddObjectToObject(j, "quantization_config") : NULL;
        ok = qc && cJSON_AddStringToObject(qc, "quant_method", "awq") &&
             cJSON_AddNumberToObject(qc, "bits", 4) &&
             cJSON_AddNumberToObject(qc, "group_size", sh->group_size) &&
             cJSON_AddTrueToObject(qc, "zero_point") &&
             cJSON_AddStringToObject(qc, "version", "gemm") &&
             cJSON_AddNullToObject(qc, "modules_to_not_convert");
        /* Marks the weights as random, for tools and for people reading the file. */
        ok = ok && cJSON_AddTrueToObject(j, "_dsd_synthetic");
        /* A string: seeds go up to 2^64, beyond what a JSON number holds exactly. */
        char seed[24];
        snprintf(seed, sizeof(seed), "%" PRIu64, arg_seed);
        ok = ok && cJSON_AddStringToObject(j, "_dsd_seed", seed);
        if (!ok)
                return ds_error(err, -ENOMEM, "out of memory");
        return out_write_json(outdir, "config.json", j, err);
}

static int write_readme(const SynthShape *sh, const char *outdir, DsError *err)
{
        _cleanup_free_ char *text = NULL;
        int n = asprintf(&text,
                "# Synthetic checkpoint (%s, seed %" PRIu64 ")\n"
                "\n"
                "Written by `dsquant synth`. The weights are random: the layout is that of a real\n"
                "AutoAWQ INT4 (GEMM, group size %u) %s checkpoint, but the text this model\n"
                "produces is meaningless. The tokenizer is a small synthetic byte-level BPE with "
                "the\n"
                "ChatML special tokens. Use it for tests and benchmarks only.\n",
                sh->name, arg_seed, sh->group_size, sh->arch);

        if (n < 0)
                return ds_error(err, -ENOMEM, "out of memory");
        return out_write_text(outdir, "README.md", text, (size_t) n, err);
}

// --- the command

static void help(FILE *out)
{
        fprintf(out,
                "Usage: dsquant synth (--shape NAME | --config FILE) OUTDIR [--seed S]\n"
                "\n"
                "Writes a synthetic AWQ INT4 checkpoint into OUTDIR (created if missing): "
                "config.json\n"
                "(with quantization_config awq/4 bits/gemm and \"_dsd_synthetic\": true),\n"
                "model.safetensors (FP16 embeddings, norms, biases and lm_head; qweight, qzeros "
                "and\n"
                "scales for every decoder linear), tokenizer.json, tokenizer_config.json (a small\n"
                "byte-level BPE with <|endoftext|>, <|im_start|>, <|im_end|> and a ChatML "
                "template)\n"
                "and README.md. The weights are random, so the model's text is meaningless; the\n"
                "layout and the cost of running it are those of a real model.\n"
                "\n"
                "The same shape and seed give byte-identical files. Checkpoints with up to 64M\n"
                "quantized weights are random float matrices quantized by round-to-nearest; "
                "larger\n"
                "ones get random packed weights and scales directly, for speed. Large shapes are\n"
                "generated while they are written, so memory use stays small.\n"
                "\n"
                "Options:\n"
                "  --shape NAME    tiny       Qwen2, hidden 256, 2 layers, vocab 512 (the default "
                "model)\n"
                "                  qwen2-7b   DeepSeek-R1-Distill-Qwen-7B dimensions (about 5.5 "
                "GB)\n"
                "                  qwen2-32b  DeepSeek-R1-Distill-Qwen-32B dimensions (about 19 "
                "GB)\n"
                "                  tiny-moe   DeepSeek-V2 MLA + MoE, hidden 256, 3 layers, 8 "
                "experts\n"
                "                  deepseek-v2-lite  DeepSeek-V2-Lite dimensions, AWQ group 64 "
                "(about 9 GB)\n"
                "  --config FILE   a Hugging Face config.json (Qwen2ForCausalLM or "
                "LlamaForCausalLM)\n"
                "                  giving the dimensions; group size from its quantization_config\n"
                "  --seed S        the random seed (default 1)\n"
                "  -h, --help      show this help\n");
}

int cmd_synth(int argc, char **argv)
{
        static const struct option options[] = {
                {"shape", required_argument, NULL, 's'},
                {"config", required_argument, NULL, 'c'},
                {"seed", required_argument, NULL, 'S'},
                {"help", no_argument, NULL, 'h'},
                {},
        };
        _cleanup_(synth_done) Synth s = {0};
        DsError err = {0};
        SynthTokens tok;
        char *end;
        int c, r;

        optind = 0;
        while ((c = getopt_long(argc, argv, "h", options, NULL)) >= 0)
                switch (c) {
                case 's':
                        arg_shape = optarg;
                        break;
                case 'c':
                        arg_config = optarg;
                        break;
                case 'S':
                        errno = 0;
                        arg_seed = strtoull(optarg, &end, 0);
                        if (errno || end == optarg || *end || optarg[0] == '-') {
                                log_error("synth: --seed '%s' is not an unsigned integer", optarg);
                                return EXIT_FAILURE;
                        }
                        break;
                case 'h':
                        help(stdout);
                        return EXIT_SUCCESS;
                default:
                        return EXIT_FAILURE; /* getopt named the option */
                }

        if (!!arg_shape == !!arg_config) {
                log_error("synth: give exactly one of --shape and --config");
                return EXIT_FAILURE;
        }
        if (argc - optind != 1) {
                log_error("synth: expected one OUTDIR, got %d argument(s)", argc - optind);
                return EXIT_FAILURE;
        }
        const char *outdir = argv[optind];

        if (arg_shape) {
                size_t i;
                for (i = 0; i < ELEMENTSOF(SHAPES); i++)
                        if (!strcmp(arg_shape, SHAPES[i].name))
                                break;
                if (i == ELEMENTSOF(SHAPES)) {
                        log_error("synth: unknown --shape '%s' (tiny, qwen2-7b, qwen2-32b, "
                                  "tiny-moe, deepseek-v2-lite)",
                                arg_shape);
                        return EXIT_FAILURE;
                }
                s.shape = SHAPES[i];
                r = 0;
        } else
                r = shape_from_config(arg_config, &s.shape, &err);

        if (r >= 0)
                r = shape_check(&s.shape, &err);
        if (r >= 0)
                r = out_dir_prepare(outdir, &err);
        if (r >= 0)
                r = synth_tokenizer_write(outdir, s.shape.vocab, &tok, &err);
        if (r >= 0)
                r = write_config(&s.shape, &tok, outdir, &err);
        if (r >= 0)
                r = write_readme(&s.shape, outdir, &err);
        if (r >= 0)
                r = synth_weights(&s, outdir, &err);
        if (r < 0) {
                log_error("synth: %s", err.msg);
                return EXIT_FAILURE;
        }

        log_info("wrote %s: synthetic %s (%s), %u layers, %zu tensors, %" PRIu64
                 " bytes of weights, "
                 "seed %" PRIu64 "; the weights are random",
                outdir, s.shape.arch, s.shape.name, s.shape.n_layers, s.n_tensors, s.total_bytes,
                arg_seed);
        return EXIT_SUCCESS;
}
