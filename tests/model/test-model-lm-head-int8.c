/* SPDX-License-Identifier: MIT */
/* ModelOptions.lm_head_int8 on small dense Llama checkpoints written here: tied and
 * untied, F32, F16 and BF16, with the data aligned and (an odd header) misaligned. The
 * lm_head must come back as BK_LINEAR_Q8 of the expected group whose every q and scale are
 * the q8_pack.h formula applied to the weights as this test decodes them from its own
 * bytes; the embedding must stay as it was; bk_model_check must accept the model; and
 * ModelInfo.quant must say so. A width of no group (48) is refused naming the lm_head and
 * the width. */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model.h"
#include "test_util.h"

#define VOCAB 9000 /* over twice Q8_MIN_ROWS: the loader quantizes in two threads or more */
#define INTER 128

typedef enum { F32, F16, BF16 } Dt;
static const char *const dt_file[] = {"F32", "F16", "BF16"};
static const char *const dt_quant[] = {"f32", "f16", "bf16"};

typedef struct Tensor {
        char name[96];
        uint64_t d0, d1; /* d1 0 for a vector */
        uint8_t *data;
        size_t n_bytes;
} Tensor;

static Tensor tensors[16];
static size_t n_tensors;

static uint64_t rng_state = 42;

static double urand(void)
{
        rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
        return (double) (rng_state >> 11) / 4503599627370496.0 - 1.0;
}

/* Encodings of float v written by hand, and their decoding by arithmetic: the test does
 * not take either from common/half.h. bf16 truncates and f16 keeps values in its normal
 * range, which is all a test weight needs. */
static uint16_t enc_bf16(float v)
{
        uint32_t u;
        memcpy(&u, &v, 4);
        return (uint16_t) (u >> 16);
}

static float dec_bf16(uint16_t b)
{
        uint32_t u = (uint32_t) b << 16;
        float v;
        memcpy(&v, &u, 4);
        return v;
}

static uint16_t enc_f16(float v)
{
        int e;
        float m = frexpf(fabsf(v), &e); /* v = m * 2^e, m in [0.5, 1) */
        uint16_t sign = v < 0 ? 0x8000 : 0;
        if (v == 0.0f)
                return sign;
        CHECK(e - 1 >= -14 && e - 1 <= 15, "%g is outside f16's normal range", v);
        uint32_t mant = (uint32_t) lrintf((m * 2.0f - 1.0f) * 1024.0f);
        if (mant == 1024) { /* rounded up to the next power of two */
                mant = 0;
                e++;
        }
        return (uint16_t) (sign | (uint32_t) (e - 1 + 15) << 10 | mant);
}

static float dec_f16(uint16_t h)
{
        int e = (h >> 10) & 31, m = h & 1023;
        float v = e == 0 ? ldexpf((float) m, -24) : ldexpf((float) (m | 1024), e - 25);
        return (h & 0x8000) ? -v : v;
}

/* Element i of a tensor's bytes in dtype dt, as this test reads it. */
static float elem(const uint8_t *p, Dt dt, size_t i)
{
        uint16_t h;
        float f;

        if (dt == F32) {
                memcpy(&f, p + 4 * i, 4);
                return f;
        }
        memcpy(&h, p + 2 * i, 2);
        return dt == F16 ? dec_f16(h) : dec_bf16(h);
}

/* A tensor of random values of scale mag, its magnitude varying by a factor up to 30
 * every 16 elements so that the groups' scales differ. */
static void add(const char *name, uint64_t d0, uint64_t d1, Dt dt, double mag)
{
        size_t n = d0 * (d1 ? d1 : 1), size = dt == F32 ? 4 : 2;
        Tensor *t = &tensors[n_tensors++];

        CHECK(n_tensors <= ELEMENTSOF(tensors), "too many tensors");
        snprintf(t->name, sizeof(t->name), "%s", name);
        t->d0 = d0;
        t->d1 = d1;
        t->n_bytes = n * size;
        t->data = malloc(t->n_bytes);
        CHECK(t->data, "oom");
        double m = mag;
        for (size_t i = 0; i < n; i++) {
                if (i % 16 == 0)
                        m = mag * pow(30.0, (urand() + 1.0) / 2.0);
                float v = (float) (m * urand());
                if (dt == F16 && fabsf(v) < 1e-4f)
                        v = 0.0f; /* kept out of f16's subnormals, which enc_f16 does not do */
                if (dt == F32)
                        memcpy(t->data + 4 * i, &v, 4);
                else {
                        uint16_t h = dt == F16 ? enc_f16(v) : enc_bf16(v);
                        memcpy(t->data + 2 * i, &h, 2);
                }
        }
}

static const Tensor *find(const char *name)
{
        for (size_t i = 0; i < n_tensors; i++)
                if (!strcmp(tensors[i].name, name))
                        return &tensors[i];
        CHECK(false, "no tensor %s", name);
        return NULL;
}

static void write_file(const char *path, const char *text)
{
        FILE *f = fopen(path, "wb");
        CHECK(f && fputs(text, f) >= 0 && fclose(f) == 0, "write %s", path);
}

/* A one-layer Llama of width h in dir; odd: an unpadded header of odd length, so that
 * every tensor is misaligned in the map. */
static void make_checkpoint(const char *dir, uint32_t h, Dt dt, bool tied, bool odd)
{
        char path[4096], json[1024];
        static const char *const square[] = {"q_proj", "k_proj", "v_proj", "o_proj"};

        for (size_t i = 0; i < n_tensors; i++)
                free(tensors[i].data);
        n_tensors = 0;
        add("model.embed_tokens.weight", VOCAB, h, dt, 0.05);
        add("model.layers.0.input_layernorm.weight", h, 0, dt, 1.0);
        for (size_t i = 0; i < ELEMENTSOF(square); i++) {
                char name[96];
                snprintf(name, sizeof(name), "model.layers.0.self_attn.%s.weight", square[i]);
                add(name, h, h, dt, 0.05);
        }
        add("model.layers.0.post_attention_layernorm.weight", h, 0, dt, 1.0);
        add("model.layers.0.mlp.gate_proj.weight", INTER, h, dt, 0.05);
        add("model.layers.0.mlp.up_proj.weight", INTER, h, dt, 0.05);
        add("model.layers.0.mlp.down_proj.weight", h, INTER, dt, 0.05);
        add("model.norm.weight", h, 0, dt, 1.0);
        if (!tied)
                add("lm_head.weight", VOCAB, h, dt, 0.05);

        snprintf(json, sizeof(json),
                "{\"architectures\":[\"LlamaForCausalLM\"],\"model_type\":\"llama\","
                "\"hidden_size\":%u,\"intermediate_size\":%u,\"num_hidden_layers\":1,"
                "\"num_attention_heads\":1,\"num_key_value_heads\":1,\"head_dim\":%u,"
                "\"vocab_size\":%u,\"max_position_embeddings\":64,\"rms_norm_eps\":1e-06,"
                "\"hidden_act\":\"silu\",\"tie_word_embeddings\":%s,\"bos_token_id\":1,"
                "\"eos_token_id\":2,\"rope_theta\":10000.0}",
                h, INTER, h, VOCAB, tied ? "true" : "false");
        snprintf(path, sizeof(path), "%s/config.json", dir);
        write_file(path, json);

        size_t cap = 8192, len = 0;
        char *hdr = malloc(cap);
        uint64_t at = 0;
        CHECK(hdr, "oom");
        len += (size_t) snprintf(hdr, cap, "{");
        for (size_t i = 0; i < n_tensors; i++) {
                const Tensor *t = &tensors[i];
                char shape[64];
                if (t->d1)
                        snprintf(shape, sizeof(shape), "%llu,%llu", (unsigned long long) t->d0,
                                (unsigned long long) t->d1);
                else
                        snprintf(shape, sizeof(shape), "%llu", (unsigned long long) t->d0);
                len += (size_t) snprintf(hdr + len, cap - len,
                        "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[%s],\"data_offsets\":[%llu,%llu]}",
                        i ? "," : "", t->name, dt_file[dt], shape, (unsigned long long) at,
                        (unsigned long long) (at + t->n_bytes));
                at += t->n_bytes;
        }
        len += (size_t) snprintf(hdr + len, cap - len, "}");
        CHECK(len + 8 < cap, "header too long");
        while (odd ? len % 2 == 0 : len % 8 != 0)
                hdr[len++] = ' ';

        snprintf(path, sizeof(path), "%s/model.safetensors", dir);
        FILE *f = fopen(path, "wb");
        uint8_t n8[8];
        CHECK(f, "create %s", path);
        for (int i = 0; i < 8; i++)
                n8[i] = (uint8_t) ((uint64_t) len >> (8 * i));
        CHECK(fwrite(n8, 1, 8, f) == 8 && fwrite(hdr, 1, len, f) == len, "write header");
        for (size_t i = 0; i < n_tensors; i++)
                CHECK(fwrite(tensors[i].data, 1, tensors[i].n_bytes, f) == tensors[i].n_bytes,
                        "write %s", tensors[i].name);
        CHECK(fclose(f) == 0, "close %s", path);
        free(hdr);
}

/* The lm_head of m against q8_pack.h's formula on the weights src (VOCAB rows of h) as
 * this test decodes them. */
static void check_q8(
        const char *what, const BkLinear *l, const uint8_t *src, Dt dt, uint32_t h, uint32_t gs)
{
        CHECK(l->kind == BK_LINEAR_Q8 && l->in == h && l->out == VOCAB && l->group_size == gs,
                "%s: lm_head kind %d, %u -> %u, group %u; want Q8 %u -> %u, group %u", what,
                (int) l->kind, l->in, l->out, l->group_size, h, VOCAB, gs);
        CHECK(l->q8 && l->q8_scales && !l->bias.data, "%s: tensors", what);
        for (uint32_t o = 0; o < VOCAB; o++)
                for (uint32_t g = 0; g < h / gs; g++) {
                        float amax = 0.0f;
                        for (uint32_t k = g * gs; k < (g + 1) * gs; k++)
                                amax = fmaxf(amax, fabsf(elem(src, dt, (size_t) o * h + k)));
                        float s = amax / 127.0f;
                        CHECK(l->q8_scales[(size_t) o * (h / gs) + g] == s,
                                "%s: row %u group %u: scale %a, want %a", what, o, g,
                                l->q8_scales[(size_t) o * (h / gs) + g], s);
                        for (uint32_t k = g * gs; k < (g + 1) * gs; k++) {
                                float w = elem(src, dt, (size_t) o * h + k);
                                int want = s == 0.0f ? 0
                                                     : (int) fmaxf(-127.0f,
                                                               fminf(127.0f, rintf(w / s)));
                                CHECK(l->q8[(size_t) o * h + k] == want,
                                        "%s: W[%u][%u] = %a: q %d, want %d", what, o, k, w,
                                        l->q8[(size_t) o * h + k], want);
                        }
                }
}

static void check_case(const char *dir, uint32_t h, uint32_t gs, Dt dt, bool tied, bool odd)
{
        _cleanup_(model_freep) Model *plain = NULL, *m = NULL;
        char what[96], want[64];
        DsError err = {};
        int r;

        snprintf(what, sizeof(what), "hidden %u %s %s%s", h, dt_file[dt], tied ? "tied" : "untied",
                odd ? " misaligned" : "");
        make_checkpoint(dir, h, dt, tied, odd);

        r = model_load(dir, &(ModelOptions){0}, &plain, &err);
        CHECK(r == 0, "%s: plain load: %s", what, err.msg);
        CHECK(plain->bk.lm_head.kind == BK_LINEAR_DENSE, "%s: plain lm_head not dense", what);
        CHECK(!strcmp(plain->info.quant, dt_quant[dt]), "%s: quant '%s'", what, plain->info.quant);

        r = model_load(dir, &(ModelOptions){.lm_head_int8 = true}, &m, &err);
        CHECK(r == 0, "%s: int8 load: %s", what, err.msg);
        const Tensor *src = find(tied ? "model.embed_tokens.weight" : "lm_head.weight");
        check_q8(what, &m->bk.lm_head, src->data, dt, h, gs);

        /* The embedding is the same table as without the option. */
        const Tensor *embed = find("model.embed_tokens.weight");
        CHECK(m->bk.embed.dtype == plain->bk.embed.dtype &&
                        !memcmp(m->bk.embed.data, embed->data, embed->n_bytes),
                "%s: embedding changed", what);

        snprintf(want, sizeof(want), "%s, lm_head int8 g%u", dt_quant[dt], gs);
        CHECK(!strcmp(m->info.quant, want), "%s: quant '%s', want '%s'", what, m->info.quant, want);
        CHECK(bk_model_check(&m->bk, &err) == 0, "%s: bk_model_check: %s", what, err.msg);

        /* With quantize_int4 as well, where the width allows it. */
        if (h % 128 == 0) {
                _cleanup_(model_freep) Model *both = NULL;
                r = model_load(dir, &(ModelOptions){.quantize_int4 = true, .lm_head_int8 = true},
                        &both, &err);
                CHECK(r == 0, "%s: int4 + int8 load: %s", what, err.msg);
                snprintf(want, sizeof(want), "int4-at-load g128, lm_head int8 g%u", gs);
                CHECK(!strcmp(both->info.quant, want), "%s: quant '%s'", what, both->info.quant);
                CHECK(both->bk.layers[0].q.kind == BK_LINEAR_AWQ, "%s: q_proj not INT4", what);
                check_q8(what, &both->bk.lm_head, src->data, dt, h, gs);
        }
        printf("%s: lm_head Q8 g%u matches the formula; quant '%s'\n", what, gs, m->info.quant);
}

int main(void)
{
        char dir[] = "/tmp/dsd-test-lm-head-int8-XXXXXX", path[4096];
        static const struct {
                uint32_t h, gs;
        } widths[] = {{96, 32}, {192, 64}, {256, 128}};
        DsError err = {};
        int r;

        CHECK(mkdtemp(dir), "mkdtemp");
        for (size_t i = 0; i < ELEMENTSOF(widths); i++)
                for (Dt dt = F32; dt <= BF16; dt++)
                        for (int tied = 0; tied < 2; tied++)
                                for (int odd = 0; odd < 2; odd++)
                                        check_case(dir, widths[i].h, widths[i].gs, dt, tied, odd);

        /* A width of no group of 32, 64 or 128: loads as it is, refused with the option. */
        for (int tied = 0; tied < 2; tied++) {
                _cleanup_(model_freep) Model *plain = NULL, *m = NULL;
                make_checkpoint(dir, 48, F16, tied, false);
                r = model_load(dir, NULL, &plain, &err);
                CHECK(r == 0, "hidden 48: plain load: %s", err.msg);
                err = (DsError){};
                r = model_load(dir, &(ModelOptions){.lm_head_int8 = true}, &m, &err);
                CHECK(r == -DS_ERR_UNSUPPORTED && !m, "hidden 48 %s: int8 load gave %d",
                        tied ? "tied" : "untied", r);
                CHECK(strstr(err.msg, "lm_head") && strstr(err.msg, "width 48") &&
                                strstr(err.msg, "multiple of 32"),
                        "hidden 48: message '%s'", err.msg);
                printf("hidden 48 %s: refused: %s\n", tied ? "tied" : "untied", err.msg);
        }

        for (size_t i = 0; i < n_tensors; i++)
                free(tensors[i].data);
        snprintf(path, sizeof(path), "%s/model.safetensors", dir);
        unlink(path);
        snprintf(path, sizeof(path), "%s/config.json", dir);
        unlink(path);
        rmdir(dir);
        return 0;
}
