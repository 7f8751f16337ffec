/* SPDX-License-Identifier: MIT */
/* Quantize-at-load: tiny-llama-awq's decoder linears are dequantized (W = (q - z) * s),
 * transposed to the nn.Linear [out][in] layout and written as FP16 into a dense checkpoint
 * (config.json without quantization_config). Loading that with quantize_int4 must give AWQ
 * linears of group 128 whose weights are within half a quantization step of the FP16 ones.
 * The file's header is left unpadded with an odd length, so every mapped tensor is
 * misaligned and the loader's realigning copies are exercised too. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "awq_pack.h"
#include "half.h"
#include "model.h"
#include "test_util.h"

typedef struct Entry {
        char name[128];
        const char *dtype;
        uint32_t n_dims;
        uint64_t shape[2];
        const void *data;
        size_t n_bytes;
        void *owned;
} Entry;

static Entry entries[128];
static size_t n_entries;

static void add(const char *name, const char *dtype, uint32_t n_dims, uint64_t d0, uint64_t d1,
        const void *data, size_t n_bytes, void *owned)
{
        CHECK(n_entries < ELEMENTSOF(entries), "too many tensors");
        Entry *e = &entries[n_entries++];
        snprintf(e->name, sizeof(e->name), "%s", name);
        e->dtype = dtype;
        e->n_dims = n_dims;
        e->shape[0] = d0;
        e->shape[1] = d1;
        e->data = data;
        e->n_bytes = n_bytes;
        e->owned = owned;
}

/* Writes entries as safetensors with a header of odd length (no padding): the data buffer
 * then starts at an odd file offset. */
static void write_safetensors(const char *path)
{
        size_t cap = 1 << 16, len = 0;
        char *h = malloc(cap);
        uint64_t at = 0;

        CHECK(h, "oom");
        len += (size_t) snprintf(h + len, cap - len, "{");
        for (size_t i = 0; i < n_entries; i++) {
                const Entry *e = &entries[i];
                len += (size_t) snprintf(h + len, cap - len,
                        "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[%llu", i ? "," : "", e->name,
                        e->dtype, (unsigned long long) e->shape[0]);
                if (e->n_dims == 2)
                        len += (size_t) snprintf(
                                h + len, cap - len, ",%llu", (unsigned long long) e->shape[1]);
                len += (size_t) snprintf(h + len, cap - len, "],\"data_offsets\":[%llu,%llu]}",
                        (unsigned long long) at, (unsigned long long) (at + e->n_bytes));
                at += e->n_bytes;
        }
        len += (size_t) snprintf(h + len, cap - len, "}");
        CHECK(len < cap - 2, "header too long");
        if (len % 2 == 0)
                h[len++] = ' ';

        FILE *f = fopen(path, "wb");
        uint8_t n8[8];
        CHECK(f, "cannot create %s", path);
        for (int i = 0; i < 8; i++)
                n8[i] = (uint8_t) ((uint64_t) len >> (8 * i));
        CHECK(fwrite(n8, 1, 8, f) == 8 && fwrite(h, 1, len, f) == len, "write header");
        for (size_t i = 0; i < n_entries; i++)
                CHECK(fwrite(entries[i].data, 1, entries[i].n_bytes, f) == entries[i].n_bytes,
                        "write %s", entries[i].name);
        CHECK(fclose(f) == 0, "close %s", path);
        free(h);
}

/* The source config.json without its quantization_config, or (skip set) with
 * modules_to_not_convert = [skip]. */
static void write_config(const char *src_dir, const char *dst, const char *skip)
{
        char path[4096];
        FILE *f;
        long size;

        snprintf(path, sizeof(path), "%s/config.json", src_dir);
        f = fopen(path, "rb");
        CHECK(f, "cannot open %s", path);
        fseek(f, 0, SEEK_END);
        size = ftell(f);
        fseek(f, 0, SEEK_SET);
        char *text = malloc((size_t) size + 1);
        CHECK(text && fread(text, 1, (size_t) size, f) == (size_t) size, "read %s", path);
        text[size] = 0;
        fclose(f);

        cJSON *root = cJSON_Parse(text);
        CHECK(root, "parse %s", path);
        if (skip) {
                cJSON *q = cJSON_GetObjectItem(root, "quantization_config");
                const char *names[] = {skip};
                CHECK(q, "no quantization_config in %s", path);
                cJSON_ReplaceItemInObject(
                        q, "modules_to_not_convert", cJSON_CreateStringArray(names, 1));
        } else
                cJSON_DeleteItemFromObject(root, "quantization_config");
        char *out = cJSON_Print(root);
        f = fopen(dst, "wb");
        CHECK(out && f && fputs(out, f) >= 0 && fclose(f) == 0, "write %s", dst);
        cJSON_free(out);
        cJSON_Delete(root);
        free(text);
}

/* The FP16 [out][in] weight of an AWQ linear: W^T with W[k][n] = (q - z) * s. */
static uint16_t *dense_from_awq(const BkLinear *lin)
{
        uint16_t *w = malloc((size_t) lin->in * lin->out * sizeof(*w));
        CHECK(w, "oom");
        for (uint32_t n = 0; n < lin->out; n++)
                for (uint32_t k = 0; k < lin->in; k++)
                        w[(size_t) n * lin->in + k] = f32_to_f16(awq_weight(lin->qweight,
                                lin->qzeros, lin->scales, lin->out, lin->group_size, k, n));
        return w;
}

static const char *const lin_names[7] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
        "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"};

static const BkLinear *layer_linear(const BkLayer *L, size_t i)
{
        const BkLinear *all[7] = {&L->q, &L->k, &L->v, &L->o, &L->gate, &L->up, &L->down};
        return all[i];
}

static void add_vector(const StArchive *a, const char *name)
{
        const StTensor *t = st_archive_find(a, name);
        CHECK(t, "%s missing", name);
        add(name, st_dtype_name(t->dtype), t->n_dims, t->shape[0], t->n_dims > 1 ? t->shape[1] : 0,
                t->data, t->n_bytes, NULL);
}

int main(void)
{
        const char *src = test_shared("fixtures/tiny-llama-awq");
        _cleanup_(model_freep) Model *ref = NULL, *m = NULL;
        char dir[] = "/tmp/dsd-test-quantize-XXXXXX", path[4096];
        DsError err = {};
        int r;

        r = model_load(src, NULL, &ref, &err);
        CHECK(r == 0, "%s", err.msg);
        CHECK(mkdtemp(dir), "mkdtemp");

        add_vector(ref->archive, "model.embed_tokens.weight");
        for (uint32_t l = 0; l < ref->bk.cfg.n_layers; l++) {
                const BkLayer *L = &ref->bk.layers[l];
                char name[128];

                snprintf(name, sizeof(name), "model.layers.%u.input_layernorm.weight", l);
                add_vector(ref->archive, name);
                snprintf(name, sizeof(name), "model.layers.%u.post_attention_layernorm.weight", l);
                add_vector(ref->archive, name);
                for (size_t i = 0; i < ELEMENTSOF(lin_names); i++) {
                        const BkLinear *lin = layer_linear(L, i);
                        uint16_t *w = dense_from_awq(lin);
                        snprintf(name, sizeof(name), "model.layers.%u.%s.weight", l, lin_names[i]);
                        add(name, "F16", 2, lin->out, lin->in, w, (size_t) lin->in * lin->out * 2,
                                w);
                }
        }
        add_vector(ref->archive, "model.norm.weight");
        add_vector(ref->archive, "lm_head.weight");
        snprintf(path, sizeof(path), "%s/model.safetensors", dir);
        write_safetensors(path);
        snprintf(path, sizeof(path), "%s/config.json", dir);
        write_config(src, path, NULL);

        /* Dense load first: every tensor sits at an odd address in the map, so each must
         * come back as an aligned copy with the same bytes. */
        {
                _cleanup_(model_freep) Model *d = NULL;
                r = model_load(dir, NULL, &d, &err);
                CHECK(r == 0, "dense load: %s", err.msg);
                CHECK(!strcmp(d->info.quant, "f16"), "quant '%s'", d->info.quant);
                CHECK(d->bk.layers[0].q.kind == BK_LINEAR_DENSE, "dense q");
                CHECK((uintptr_t) d->bk.embed.data % 2 == 0, "embed not realigned");
                CHECK((uintptr_t) d->bk.layers[1].down.w.data % 2 == 0, "down not realigned");
                CHECK(!memcmp(d->bk.embed.data, ref->bk.embed.data, 1024 * 512 * 2),
                        "realigned embedding differs");
                CHECK(!memcmp(d->bk.layers[1].down.w.data, entries[n_entries - 3].data,
                              entries[n_entries - 3].n_bytes),
                        "realigned down_proj differs");
                CHECK(d->n_owned > 0, "no realigned copies were made");
        }

        ModelOptions opt = {.quantize_int4 = true};
        r = model_load(dir, &opt, &m, &err);
        CHECK(r == 0, "quantized load: %s", err.msg);
        CHECK(!strcmp(m->info.quant, "int4-at-load g128"), "quant '%s'", m->info.quant);
        CHECK(m->bk.lm_head.kind == BK_LINEAR_DENSE, "lm_head must stay dense");

        size_t e = 1;
        for (uint32_t l = 0; l < m->bk.cfg.n_layers; l++) {
                e += 2; /* the norms */
                for (size_t i = 0; i < ELEMENTSOF(lin_names); i++, e++) {
                        const BkLinear *lin = layer_linear(&m->bk.layers[l], i);
                        const uint16_t *w = entries[e].data;
                        double worst = 0;

                        CHECK(lin->kind == BK_LINEAR_AWQ && lin->group_size == 128,
                                "layer %u %s: not AWQ g128", l, lin_names[i]);
                        CHECK((uintptr_t) lin->qweight % 4 == 0 && (uintptr_t) lin->scales % 2 == 0,
                                "alignment");
                        for (uint32_t n = 0; n < lin->out; n++)
                                for (uint32_t k = 0; k < lin->in; k++) {
                                        float want = f16_to_f32(w[(size_t) n * lin->in + k]);
                                        float got = awq_weight(lin->qweight, lin->qzeros,
                                                lin->scales, lin->out, 128, k, n);
                                        float step = f16_to_f32(
                                                lin->scales[(size_t) (k / 128) * lin->out + n]);
                                        double rel = fabs(got - want) / step;
                                        /* Half a step. At the ends of a group's range the
                                         * clamp to 15 adds up to 15 times the fp16 rounding
                                         * of the scale (2^-11), which the AutoAWQ rule keeps. */
                                        CHECK(rel <= 0.5 + 15.0 / 2048 + 1e-6,
                                                "layer %u %s W[%u][%u]: %g vs %g, step %g", l,
                                                lin_names[i], k, n, got, want, step);
                                        worst = fmax(worst, rel);
                                }
                        printf("layer %u %-16s worst error %.3f steps\n", l, lin_names[i], worst);
                }
        }

        /* A mixed checkpoint: AWQ everywhere but the down projections, which
         * modules_to_not_convert keeps dense. Loaded as is, down stays dense; with
         * quantize_int4 it is quantized like any dense decoder linear. */
        size_t n_dense = n_entries;
        for (size_t i = 0; i < n_dense; i++) {
                Entry *d = &entries[i];
                char prefix[128];
                if (!strstr(d->name, "_proj.weight") || strstr(d->name, "down_proj"))
                        continue;
                snprintf(prefix, sizeof(prefix), "%.*s", (int) (strlen(d->name) - 7), d->name);
                static const char *const parts[] = {"qweight", "qzeros", "scales"};
                for (size_t k = 0; k < ELEMENTSOF(parts); k++) {
                        char name[160];
                        snprintf(name, sizeof(name), "%s.%s", prefix, parts[k]);
                        add_vector(ref->archive, name);
                }
                d->n_bytes = 0; /* drops the dense copy from the file below */
        }
        size_t k = 0;
        for (size_t i = 0; i < n_entries; i++)
                if (entries[i].n_bytes || !strstr(entries[i].name, "_proj.weight"))
                        entries[k++] = entries[i];
                else
                        free(entries[i].owned);
        n_entries = k;
        snprintf(path, sizeof(path), "%s/model.safetensors", dir);
        write_safetensors(path);
        snprintf(path, sizeof(path), "%s/config.json", dir);
        write_config(src, path, "mlp.down_proj");
        {
                _cleanup_(model_freep) Model *x = NULL, *y = NULL;
                r = model_load(dir, NULL, &x, &err);
                CHECK(r == 0, "mixed load: %s", err.msg);
                CHECK(!strcmp(x->info.quant, "awq-int4 g128"), "quant '%s'", x->info.quant);
                for (uint32_t l = 0; l < x->bk.cfg.n_layers; l++) {
                        const BkLayer *L = &x->bk.layers[l];
                        CHECK(L->q.kind == BK_LINEAR_AWQ && L->up.kind == BK_LINEAR_AWQ,
                                "layer %u: AWQ linears", l);
                        CHECK(L->down.kind == BK_LINEAR_DENSE && L->down.w.dtype == BK_DT_F16,
                                "layer %u: down_proj must stay dense", l);
                        CHECK(!memcmp(L->q.qweight, ref->bk.layers[l].q.qweight, 512 * 64 * 4),
                                "layer %u: q_proj differs", l);
                }
                ModelOptions q = {.quantize_int4 = true};
                r = model_load(dir, &q, &y, &err);
                CHECK(r == 0, "mixed quantized load: %s", err.msg);
                CHECK(y->bk.layers[0].down.kind == BK_LINEAR_AWQ &&
                                y->bk.layers[0].down.group_size == 128,
                        "down_proj not quantized at load");
        }

        for (size_t i = 0; i < n_entries; i++)
                free(entries[i].owned);
        snprintf(path, sizeof(path), "%s/model.safetensors", dir);
        unlink(path);
        snprintf(path, sizeof(path), "%s/config.json", dir);
        unlink(path);
        rmdir(dir);
        return 0;
}
