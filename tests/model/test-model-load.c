/* SPDX-License-Identifier: MIT */
/* model_load on the shared fixtures: dimensions against their config.json, AWQ weights
 * against values decoded here straight from the file bytes (with AutoAWQ's pack ORDER, not
 * the loader's REV table), and the sharded copy of tiny-llama byte-identical to the single
 * file. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "awq_pack.h"
#include "model.h"
#include "test_util.h"

/* AutoAWQ packs output column 8c + ORDER[i] into nibble i of word c. */
static const unsigned ORDER[8] = {0, 2, 4, 6, 1, 3, 5, 7};

typedef struct RawFile {
        uint8_t *buf;
        size_t size;
        const char *header; /* NUL-terminated copy */
        size_t data_start;
} RawFile;

static RawFile raw_open(const char *path)
{
        RawFile f = {};
        FILE *fp = fopen(path, "rb");
        uint64_t n = 0;

        CHECK(fp, "cannot open %s", path);
        fseek(fp, 0, SEEK_END);
        f.size = (size_t) ftell(fp);
        fseek(fp, 0, SEEK_SET);
        f.buf = malloc(f.size);
        CHECK(f.buf && fread(f.buf, 1, f.size, fp) == f.size, "cannot read %s", path);
        fclose(fp);
        for (int i = 7; i >= 0; i--)
                n = n << 8 | f.buf[i];
        char *h = malloc(n + 1);
        CHECK(h, "oom");
        memcpy(h, f.buf + 8, n);
        h[n] = 0;
        f.header = h;
        f.data_start = 8 + n;
        return f;
}

static void raw_close(RawFile *f)
{
        free(f->buf);
        free((char *) f->header);
}

/* The bytes of one tensor, found by text search in the header as the writer printed it:
 * "NAME":{"dtype":"..","shape":[..],"data_offsets":[a,b]}. */
static const uint8_t *raw_tensor(const RawFile *f, const char *name, size_t *ret_len)
{
        char key[512];
        unsigned long long a, b;

        snprintf(key, sizeof(key), "\"%s\":", name);
        const char *p = strstr(f->header, key);
        CHECK(p, "tensor %s not in header", name);
        p = strstr(p, "\"data_offsets\":[");
        CHECK(p && sscanf(p, "\"data_offsets\":[%llu,%llu]", &a, &b) == 2, "offsets of %s", name);
        *ret_len = (size_t) (b - a);
        return f->buf + f->data_start + a;
}

static uint32_t le32(const uint8_t *p)
{
        return (uint32_t) p[0] | (uint32_t) p[1] << 8 | (uint32_t) p[2] << 16 |
               (uint32_t) p[3] << 24;
}

/* IEEE half decoded by arithmetic, independently of common/half.h. */
static float half_value(uint16_t h)
{
        int e = (h >> 10) & 31, m = h & 1023;
        float v = e == 0 ? ldexpf((float) m, -24) : ldexpf((float) (m | 1024), e - 25);
        return (h & 0x8000) ? -v : v;
}

static unsigned raw_nibble(const uint8_t *packed, uint32_t out, uint32_t row, uint32_t col)
{
        uint32_t word = le32(packed + 4 * ((size_t) row * (out / 8) + col / 8));
        for (unsigned i = 0; i < 8; i++)
                if (ORDER[i] == col % 8)
                        return (word >> (4 * i)) & 0xF;
        return 99;
}

static void check_awq_values(const RawFile *f, const char *prefix, const BkLinear *lin)
{
        char name[256];
        size_t len;

        snprintf(name, sizeof(name), "%s.qweight", prefix);
        const uint8_t *qw = raw_tensor(f, name, &len);
        CHECK(len == (size_t) lin->in * lin->out / 2, "%s size", name);
        snprintf(name, sizeof(name), "%s.qzeros", prefix);
        const uint8_t *qz = raw_tensor(f, name, &len);
        snprintf(name, sizeof(name), "%s.scales", prefix);
        const uint8_t *sc = raw_tensor(f, name, &len);

        uint64_t seed = 12345;
        for (int i = 0; i < 64; i++) {
                seed = seed * 6364136223846793005ull + 1442695040888963407ull;
                uint32_t k = (uint32_t) (seed >> 33) % lin->in;
                uint32_t n = (uint32_t) (seed >> 13) % lin->out;
                uint32_t g = k / lin->group_size;
                int q = (int) raw_nibble(qw, lin->out, k, n);
                int z = (int) raw_nibble(qz, lin->out, g, n);
                const uint8_t *s = sc + 2 * ((size_t) g * lin->out + n);
                float want = (float) (q - z) * half_value((uint16_t) (s[0] | s[1] << 8));
                float got = awq_weight(
                        lin->qweight, lin->qzeros, lin->scales, lin->out, lin->group_size, k, n);
                CHECK(got == want, "%s W[%u][%u]: loader %g, file %g", prefix, k, n, got, want);
        }
}

static void check_aligned(const void *p, size_t align, const char *what)
{
        CHECK(p && (uintptr_t) p % align == 0, "%s: %p not aligned to %zu", what, p, align);
}

static void check_awq_linear(
        const BkLinear *lin, uint32_t in, uint32_t out, bool bias, const char *what)
{
        CHECK(lin->kind == BK_LINEAR_AWQ, "%s: not AWQ", what);
        CHECK(lin->in == in && lin->out == out, "%s: [%u, %u], want [%u, %u]", what, lin->in,
                lin->out, in, out);
        CHECK(lin->group_size == 128, "%s: group %u", what, lin->group_size);
        check_aligned(lin->qweight, 4, what);
        check_aligned(lin->qzeros, 4, what);
        check_aligned(lin->scales, 2, what);
        CHECK(!!lin->bias.data == bias, "%s: bias %s", what, bias ? "missing" : "unexpected");
}

static unsigned progress_calls;

static void progress(void *userdata, uint32_t done, uint32_t n)
{
        CHECK(userdata == &progress_calls, "userdata");
        CHECK(done == ++progress_calls && done <= n, "progress %u/%u after %u calls", done, n,
                progress_calls);
}

typedef struct Expect {
        const char *dir;
        BkArch arch;
        uint32_t intermediate, kv_heads;
        float theta;
        int32_t bos, eos;
} Expect;

static Model *check_fixture(const Expect *e)
{
        ModelOptions opt = {.progress = progress, .userdata = &progress_calls};
        Model *m = NULL;
        DsError err = {};
        BkConfig cfg;
        ModelInfo info;
        int r;

        r = model_config_load(test_shared(e->dir), &cfg, &info, &err);
        CHECK(r == 0, "%s: %s", e->dir, err.msg);
        progress_calls = 0;
        r = model_load(test_shared(e->dir), &opt, &m, &err);
        CHECK(r == 0, "%s: %s", e->dir, err.msg);
        CHECK(progress_calls == 2, "%s: %u progress calls", e->dir, progress_calls);
        CHECK(!memcmp(&cfg, &m->bk.cfg, sizeof(cfg)), "%s: config differs from model_config_load",
                e->dir);

        const BkConfig *c = &m->bk.cfg;
        CHECK(c->arch == e->arch && c->hidden == 512 && c->intermediate == e->intermediate &&
                        c->n_layers == 2 && c->n_heads == 4 && c->n_kv_heads == e->kv_heads &&
                        c->head_dim == 128 && c->vocab_size == 1024 && c->vocab_sample == 1024 &&
                        c->max_positions == 4096,
                "%s: dimensions", e->dir);
        CHECK(fabsf(c->rms_eps - 1e-6f) < 1e-12f, "%s: eps %g", e->dir, c->rms_eps);
        CHECK(c->rope.type == BK_ROPE_DEFAULT && c->rope.theta == e->theta, "%s: rope %g", e->dir,
                c->rope.theta);
        CHECK(m->info.bos_id == e->bos, "%s: bos %d", e->dir, m->info.bos_id);
        CHECK(e->eos < 0 ? m->info.n_eos == 0
                         : (m->info.n_eos == 1 && m->info.eos_ids[0] == e->eos),
                "%s: eos", e->dir);
        CHECK(!strcmp(m->info.quant, "awq-int4 g128"), "%s: quant '%s'", e->dir, m->info.quant);

        bool qkv_bias = e->arch == BK_ARCH_QWEN2;
        uint32_t kv = e->kv_heads * 128;
        for (uint32_t l = 0; l < 2; l++) {
                const BkLayer *L = &m->bk.layers[l];
                check_awq_linear(&L->q, 512, 512, qkv_bias, "q");
                check_awq_linear(&L->k, 512, kv, qkv_bias, "k");
                check_awq_linear(&L->v, 512, kv, qkv_bias, "v");
                check_awq_linear(&L->o, 512, 512, false, "o");
                check_awq_linear(&L->gate, 512, e->intermediate, false, "gate");
                check_awq_linear(&L->up, 512, e->intermediate, false, "up");
                check_awq_linear(&L->down, e->intermediate, 512, false, "down");
                CHECK(L->attn_norm.dtype == BK_DT_F16 && L->mlp_norm.dtype == BK_DT_F16, "norms");
                check_aligned(L->attn_norm.data, 2, "attn_norm");
        }
        CHECK(m->bk.embed.dtype == BK_DT_F16, "embed dtype");
        CHECK(m->bk.lm_head.kind == BK_LINEAR_DENSE && m->bk.lm_head.in == 512 &&
                        m->bk.lm_head.out == 1024 && m->bk.lm_head.w.data != m->bk.embed.data,
                "lm_head");
        return m;
}

static void check_values(const Model *m, const char *file)
{
        static const char *const lins[] = {"self_attn.q_proj", "self_attn.k_proj",
                "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj",
                "mlp.down_proj"};
        RawFile f = raw_open(test_shared(file));
        char prefix[128];

        for (uint32_t l = 0; l < m->bk.cfg.n_layers; l++) {
                const BkLayer *L = &m->bk.layers[l];
                const BkLinear *ptrs[] = {&L->q, &L->k, &L->v, &L->o, &L->gate, &L->up, &L->down};
                for (size_t i = 0; i < ELEMENTSOF(lins); i++) {
                        snprintf(prefix, sizeof(prefix), "model.layers.%u.%s", l, lins[i]);
                        check_awq_values(&f, prefix, ptrs[i]);
                }
        }
        size_t len;
        const uint8_t *embed = raw_tensor(&f, "model.embed_tokens.weight", &len);
        CHECK(len == 1024 * 512 * 2 && !memcmp(embed, m->bk.embed.data, len), "embedding bytes");
        raw_close(&f);
}

static void same_linear(const BkLinear *a, const BkLinear *b)
{
        size_t gs = a->group_size, words = (size_t) a->in * a->out / 8;

        CHECK(a->kind == b->kind && a->in == b->in && a->out == b->out &&
                        a->group_size == b->group_size,
                "linear descriptions differ");
        CHECK(!memcmp(a->qweight, b->qweight, words * 4), "qweight differs");
        CHECK(!memcmp(a->qzeros, b->qzeros, words / gs * 4), "qzeros differs");
        CHECK(!memcmp(a->scales, b->scales, (size_t) a->in / gs * a->out * 2), "scales differ");
}

static void check_same(const Model *a, const Model *b)
{
        size_t n = st_archive_size(a->archive);

        CHECK(n == st_archive_size(b->archive), "tensor counts %zu vs %zu", n,
                st_archive_size(b->archive));
        CHECK(st_archive_n_files(b->archive) == 2, "sharded archive has %zu files",
                st_archive_n_files(b->archive));
        for (size_t i = 0; i < n; i++) {
                const StTensor *x = st_archive_tensor(a->archive, i);
                const StTensor *y = st_archive_find(b->archive, x->name);
                CHECK(y, "%s missing from the shards", x->name);
                CHECK(x->dtype == y->dtype && x->n_dims == y->n_dims &&
                                !memcmp(x->shape, y->shape, sizeof(x->shape)) &&
                                x->n_bytes == y->n_bytes,
                        "%s: descriptions differ", x->name);
                CHECK(!memcmp(x->data, y->data, x->n_bytes), "%s: bytes differ", x->name);
        }
        for (uint32_t l = 0; l < a->bk.cfg.n_layers; l++) {
                const BkLayer *x = &a->bk.layers[l], *y = &b->bk.layers[l];
                same_linear(&x->q, &y->q);
                same_linear(&x->k, &y->k);
                same_linear(&x->v, &y->v);
                same_linear(&x->o, &y->o);
                same_linear(&x->gate, &y->gate);
                same_linear(&x->up, &y->up);
                same_linear(&x->down, &y->down);
        }
        CHECK(!memcmp(a->bk.lm_head.w.data, b->bk.lm_head.w.data, 1024 * 512 * 2), "lm_head");
        CHECK(!memcmp(a->bk.final_norm.data, b->bk.final_norm.data, 512 * 2), "final norm");
}

int main(void)
{
        static const Expect qwen2 = {
                "fixtures/tiny-qwen2-awq", BK_ARCH_QWEN2, 1408, 2, 10000.0f, -1, -1};
        static const Expect llama = {
                "fixtures/tiny-llama-awq", BK_ARCH_LLAMA, 1024, 1, 500000.0f, 1, 2};
        static const Expect sharded = {
                "fixtures/tiny-llama-awq-sharded", BK_ARCH_LLAMA, 1024, 1, 500000.0f, 1, 2};
        _cleanup_(model_freep) Model *q = NULL, *l = NULL, *s = NULL;

        q = check_fixture(&qwen2);
        check_values(q, "fixtures/tiny-qwen2-awq/model.safetensors");
        CHECK(st_archive_find(q->archive, "model.layers.1.self_attn.k_proj.bias"), "bias");
        CHECK(q->bk.layers[1].k.bias.dtype == BK_DT_F16, "bias dtype");

        l = check_fixture(&llama);
        check_values(l, "fixtures/tiny-llama-awq/model.safetensors");
        s = check_fixture(&sharded);
        check_same(l, s);
        printf("fixtures load, AWQ values match the file, shards match the single file\n");
        return 0;
}
