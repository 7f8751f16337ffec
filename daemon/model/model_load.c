/* SPDX-License-Identifier: MIT */
/* A checkpoint directory into a BkModel. Tensors are used in place from the read-only maps;
 * the only copies are of tensors whose mapped address is misaligned for their element type
 * and of linears quantized at load (to INT4, and the lm_head to 8 bits). */
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "awq_pack.h"
#include "half.h"
#include "model.h"
#include "q8_pack.h"

#define QUANT_GROUP 128

/* Threads that quantize the lm_head to 8 bits, and the rows a thread takes at least: in one
 * thread, 7B's lm_head added 2.2 s to bench-cuda's load on the H200's host (docs/PERF.md,
 * thirty-ninth session, run 5). */
#define Q8_THREADS  16
#define Q8_MIN_ROWS 4096

typedef struct Loader {
        Model *m;
        const ModelOptions *opt;
        DsError *err;
} Loader;

Model *model_free(Model *m)
{
        if (!m)
                return NULL;
        for (size_t i = 0; i < m->n_owned; i++)
                free(m->owned[i]);
        free(m->owned);
        free(m->bk.layers);
        st_archive_free(m->archive);
        free(m->dir);
        free(m);
        return NULL;
}

/* Allocates size bytes aligned for any element type and records them in m->owned. */
static void *model_alloc(Model *m, size_t size)
{
        void **owned, *p = NULL;

        owned = realloc(m->owned, (m->n_owned + 1) * sizeof(*owned));
        if (!owned)
                return NULL;
        m->owned = owned;
        if (posix_memalign(&p, 64, size ? size : 1) != 0)
                return NULL;
        m->owned[m->n_owned++] = p;
        return p;
}

static const char *shape_str(const uint64_t *shape, uint32_t n, char *buf, size_t size)
{
        size_t at = 0;

        at += (size_t) snprintf(buf, size, "[");
        for (uint32_t i = 0; i < n && at < size; i++)
                at += (size_t) snprintf(buf + at, size - at, "%s%" PRIu64, i ? ", " : "", shape[i]);
        if (at < size)
                snprintf(buf + at, size - at, "]");
        return buf;
}

static bool dtype_is_float(StDtype t)
{
        return t == ST_F32 || t == ST_F16 || t == ST_BF16;
}

static BkDtype bk_dtype(StDtype t)
{
        return t == ST_F32 ? BK_DT_F32 : t == ST_F16 ? BK_DT_F16 : BK_DT_BF16;
}

/* Finds name and checks its shape; want_float accepts F32/F16/BF16, otherwise the dtype
 * must be exactly want. */
static int get_tensor(Loader *L, const char *name, bool want_float, StDtype want, uint32_t n_dims,
        uint64_t d0, uint64_t d1, const StTensor **ret)
{
        const StArchive *a = L->m->archive;
        const StTensor *t = st_archive_find(a, name);
        uint64_t shape[2] = {d0, d1};
        char got[128], exp[64];

        if (!t)
                return ds_error(L->err, -DS_ERR_FORMAT, "%s: tensor '%s' is missing",
                        st_archive_name(a), name);
        if (want_float ? !dtype_is_float(t->dtype) : t->dtype != want)
                return ds_error(L->err, -DS_ERR_FORMAT, "%s: tensor '%s': dtype %s, expected %s",
                        t->file, name, st_dtype_name(t->dtype),
                        want_float ? "F32, F16 or BF16" : st_dtype_name(want));
        if (t->n_dims != n_dims || t->shape[0] != d0 || (n_dims > 1 && t->shape[1] != d1))
                return ds_error(L->err, -DS_ERR_FORMAT,
                        "%s: tensor '%s': shape %s, but config.json implies %s", t->file, name,
                        shape_str(t->shape, t->n_dims, got, sizeof(got)),
                        shape_str(shape, n_dims, exp, sizeof(exp)));
        *ret = t;
        return 0;
}

/* The tensor's data, copied into an owned buffer only when the map leaves it misaligned
 * for its element size (safetensors does not promise alignment). */
static int tensor_data(Loader *L, const StTensor *t, const void **ret)
{
        void *copy;

        if ((uintptr_t) t->data % st_dtype_size(t->dtype) == 0) {
                *ret = t->data;
                return 0;
        }
        copy = model_alloc(L->m, t->n_bytes);
        if (!copy)
                return -ENOMEM;
        memcpy(copy, t->data, t->n_bytes);
        *ret = copy;
        return 0;
}

static int load_vector(Loader *L, const char *name, uint32_t n, BkTensor *ret)
{
        const StTensor *t;
        int r;

        r = get_tensor(L, name, true, 0, 1, n, 0, &t);
        if (r < 0)
                return r;
        ret->dtype = bk_dtype(t->dtype);
        return tensor_data(L, t, &ret->data);
}

/* Element i of a float tensor as float32; memcpy because mapped data may be misaligned. */
static float tensor_float(const StTensor *t, uint64_t i)
{
        const uint8_t *p = t->data;
        uint16_t h;
        float f;

        if (t->dtype == ST_F32) {
                memcpy(&f, p + 4 * i, 4);
                return f;
        }
        memcpy(&h, p + 2 * i, 2);
        return t->dtype == ST_F16 ? f16_to_f32(h) : bf16_to_f32(h);
}

/* Round-to-nearest INT4 of the dense [out][in] weight t, into owned AWQ buffers. The
 * mapped weight is read in place, so a misaligned one costs no aligned copy. */
static int quantize_linear(Loader *L, const StTensor *t, BkLinear *lin)
{
        _cleanup_free_ float *w = NULL;
        uint64_t n = (uint64_t) lin->in * lin->out;
        uint32_t groups = lin->in / QUANT_GROUP;
        uint32_t *qweight, *qzeros;
        uint16_t *scales;
        int r;

        if (lin->in % QUANT_GROUP != 0 || lin->out % 8 != 0)
                return ds_error(L->err, -DS_ERR_UNSUPPORTED,
                        "%s: tensor '%s': cannot quantize [%u, %u] to INT4: inputs must be a "
                        "multiple of %u and outputs of 8",
                        t->file, t->name, lin->out, lin->in, QUANT_GROUP);
        w = malloc(n * sizeof(*w));
        if (!w)
                return -ENOMEM;
        for (uint64_t i = 0; i < n; i++)
                w[i] = tensor_float(t, i);
        qweight = model_alloc(L->m, (size_t) lin->in * (lin->out / 8) * sizeof(*qweight));
        qzeros = qweight ? model_alloc(L->m, (size_t) groups * (lin->out / 8) * sizeof(*qzeros))
                         : NULL;
        scales = qzeros ? model_alloc(L->m, (size_t) groups * lin->out * sizeof(*scales)) : NULL;
        if (!scales)
                return -ENOMEM;
        r = awq_quantize_rtn(w, lin->in, lin->out, QUANT_GROUP, qweight, qzeros, scales);
        if (r < 0)
                return ds_error(
                        L->err, r, "%s: tensor '%s': INT4 quantization failed", t->file, t->name);

        lin->kind = BK_LINEAR_AWQ;
        lin->qweight = qweight;
        lin->qzeros = qzeros;
        lin->scales = scales;
        lin->group_size = QUANT_GROUP;
        return 0;
}

static bool not_converted(const ModelInfo *info, const char *prefix)
{
        for (uint32_t i = 0; i < info->n_not_convert; i++)
                if (strstr(prefix, info->not_convert[i]))
                        return true;
        return false;
}

/* prefix is the module name ("model.layers.0.self_attn.q_proj"); in_block marks the
 * decoder-block linears that AutoAWQ quantizes and quantize-at-load may. */
static int load_linear(Loader *L, const char *prefix, uint32_t in, uint32_t out, bool bias,
        bool in_block, BkLinear *ret)
{
        const ModelInfo *info = &L->m->info;
        uint32_t gs = info->group_size;
        char name[512];
        const StTensor *t;
        int r;

        *ret = (BkLinear){.in = in, .out = out};
        if (in_block && gs && !not_converted(info, prefix)) {
                const void *p;

                if (in % gs != 0 || out % 8 != 0)
                        return ds_error(L->err, -DS_ERR_FORMAT,
                                "%s: '%s' has %u inputs and %u outputs, which AWQ group size %u "
                                "cannot pack",
                                st_archive_name(L->m->archive), prefix, in, out, gs);
                ret->kind = BK_LINEAR_AWQ;
                ret->group_size = gs;
                snprintf(name, sizeof(name), "%s.qweight", prefix);
                if ((r = get_tensor(L, name, false, ST_I32, 2, in, out / 8, &t)) < 0 ||
                        (r = tensor_data(L, t, &p)) < 0)
                        return r;
                ret->qweight = p;
                snprintf(name, sizeof(name), "%s.qzeros", prefix);
                if ((r = get_tensor(L, name, false, ST_I32, 2, in / gs, out / 8, &t)) < 0 ||
                        (r = tensor_data(L, t, &p)) < 0)
                        return r;
                ret->qzeros = p;
                snprintf(name, sizeof(name), "%s.scales", prefix);
                if ((r = get_tensor(L, name, false, ST_F16, 2, in / gs, out, &t)) < 0 ||
                        (r = tensor_data(L, t, &p)) < 0)
                        return r;
                ret->scales = p;
        } else {
                snprintf(name, sizeof(name), "%s.weight", prefix);
                /* A dense config over an AWQ file is the likeliest cause of this miss. */
                if (!st_archive_find(L->m->archive, name)) {
                        char qname[512];
                        snprintf(qname, sizeof(qname), "%s.qweight", prefix);
                        if (st_archive_find(L->m->archive, qname))
                                return ds_error(L->err, -DS_ERR_FORMAT,
                                        "%s: tensor '%s' is missing, but '%s' is present: "
                                        "config.json lacks its AWQ quantization_config",
                                        st_archive_name(L->m->archive), name, qname);
                }
                r = get_tensor(L, name, true, 0, 2, out, in, &t);
                if (r < 0)
                        return r;
                if (in_block && L->opt && L->opt->quantize_int4)
                        r = quantize_linear(L, t, ret);
                else {
                        ret->kind = BK_LINEAR_DENSE;
                        ret->w.dtype = bk_dtype(t->dtype);
                        r = tensor_data(L, t, &ret->w.data);
                }
                if (r < 0)
                        return r;
        }

        if (bias) {
                snprintf(name, sizeof(name), "%s.bias", prefix);
                r = load_vector(L, name, out, &ret->bias);
                if (r < 0)
                        return r;
        }
        return 0;
}

/* A SwiGLU MLP of width dim at prefix ("model.layers.3.mlp.experts.5"). */
static int load_mlp(Loader *L, const char *prefix, uint32_t dim, bool bias, BkExpert *ret)
{
        uint32_t hidden = L->m->bk.cfg.hidden;
        char name[256];
        int r;

        snprintf(name, sizeof(name), "%s.gate_proj", prefix);
        r = load_linear(L, name, hidden, dim, bias, true, &ret->gate);
        if (r < 0)
                return r;
        snprintf(name, sizeof(name), "%s.up_proj", prefix);
        r = load_linear(L, name, hidden, dim, bias, true, &ret->up);
        if (r < 0)
                return r;
        snprintf(name, sizeof(name), "%s.down_proj", prefix);
        return load_linear(L, name, dim, hidden, bias, true, &ret->down);
}

/* MLA: q_proj or q_a_proj/q_a_layernorm/q_b_proj, kv_a_proj_with_mqa, kv_a_layernorm,
 * kv_b_proj and o_proj, all decoder-block linears (AWQ in an AWQ checkpoint). */
static int load_mla(Loader *L, uint32_t l, BkLayer *ret)
{
        const BkConfig *c = &L->m->bk.cfg;
        const BkMlaConfig *m = &c->mla;
        uint32_t q_dim = c->n_heads * (m->qk_nope_dim + m->qk_rope_dim);
        char name[256];
        int r;

        if (m->q_lora_rank) {
                snprintf(name, sizeof(name), "model.layers.%u.self_attn.q_a_proj", l);
                r = load_linear(L, name, c->hidden, m->q_lora_rank, false, true, &ret->mla.q_a);
                if (r < 0)
                        return r;
                snprintf(name, sizeof(name), "model.layers.%u.self_attn.q_a_layernorm.weight", l);
                r = load_vector(L, name, m->q_lora_rank, &ret->mla.q_a_norm);
                if (r < 0)
                        return r;
                snprintf(name, sizeof(name), "model.layers.%u.self_attn.q_b_proj", l);
                r = load_linear(L, name, m->q_lora_rank, q_dim, false, true, &ret->mla.q_b);
        } else {
                snprintf(name, sizeof(name), "model.layers.%u.self_attn.q_proj", l);
                r = load_linear(L, name, c->hidden, q_dim, false, true, &ret->q);
        }
        if (r < 0)
                return r;
        snprintf(name, sizeof(name), "model.layers.%u.self_attn.kv_a_proj_with_mqa", l);
        r = load_linear(
                L, name, c->hidden, m->kv_lora_rank + m->qk_rope_dim, false, true, &ret->mla.kv_a);
        if (r < 0)
                return r;
        snprintf(name, sizeof(name), "model.layers.%u.self_attn.kv_a_layernorm.weight", l);
        r = load_vector(L, name, m->kv_lora_rank, &ret->mla.kv_a_norm);
        if (r < 0)
                return r;
        snprintf(name, sizeof(name), "model.layers.%u.self_attn.kv_b_proj", l);
        r = load_linear(L, name, m->kv_lora_rank, c->n_heads * (m->qk_nope_dim + m->v_head_dim),
                false, true, &ret->mla.kv_b);
        if (r < 0)
                return r;
        snprintf(name, sizeof(name), "model.layers.%u.self_attn.o_proj", l);
        return load_linear(L, name, c->n_heads * m->v_head_dim, c->hidden, false, true, &ret->o);
}

/* The router (FP16 as AutoAWQ leaves it, or any float dtype), V3's correction bias, the
 * routed experts under their published per-expert names, and the shared experts. */
static int load_moe(Loader *L, uint32_t l, BkMoe *ret)
{
        const BkConfig *c = &L->m->bk.cfg;
        const BkMoeConfig *mc = &c->moe;
        const StTensor *t;
        char name[256];
        int r;

        snprintf(name, sizeof(name), "model.layers.%u.mlp.gate.weight", l);
        r = get_tensor(L, name, true, 0, 2, mc->n_routed, c->hidden, &t);
        if (r < 0)
                return r;
        ret->router.dtype = bk_dtype(t->dtype);
        r = tensor_data(L, t, &ret->router.data);
        if (r < 0)
                return r;
        if (mc->topk_method == BK_TOPK_NOAUX_TC) {
                snprintf(name, sizeof(name), "model.layers.%u.mlp.gate.e_score_correction_bias", l);
                r = load_vector(L, name, mc->n_routed, &ret->score_bias);
                if (r < 0)
                        return r;
        }

        ret->experts = model_alloc(L->m, (size_t) mc->n_routed * sizeof(*ret->experts));
        if (!ret->experts)
                return -ENOMEM;
        for (uint32_t e = 0; e < mc->n_routed; e++) {
                snprintf(name, sizeof(name), "model.layers.%u.mlp.experts.%u", l, e);
                r = load_mlp(L, name, mc->expert_dim, false, &ret->experts[e]);
                if (r < 0)
                        return r;
        }
        if (mc->n_shared == 0)
                return 0;
        snprintf(name, sizeof(name), "model.layers.%u.mlp.shared_experts", l);
        return load_mlp(L, name, mc->n_shared * mc->expert_dim, false, &ret->shared);
}

/* The rule of docs/formats.md: MoE from first_k_dense_replace on, every moe_layer_freq. */
static bool layer_is_moe(const BkMoeConfig *mc, uint32_t l)
{
        return mc->n_routed > 0 && l >= mc->first_dense && l % mc->layer_freq == 0;
}

static int load_layer_deepseek(Loader *L, uint32_t l, BkLayer *ret)
{
        const BkConfig *c = &L->m->bk.cfg;
        char name[256];
        int r;

        snprintf(name, sizeof(name), "model.layers.%u.input_layernorm.weight", l);
        r = load_vector(L, name, c->hidden, &ret->attn_norm);
        if (r < 0)
                return r;
        r = load_mla(L, l, ret);
        if (r < 0)
                return r;
        snprintf(name, sizeof(name), "model.layers.%u.post_attention_layernorm.weight", l);
        r = load_vector(L, name, c->hidden, &ret->mlp_norm);
        if (r < 0)
                return r;
        if (layer_is_moe(&c->moe, l))
                return load_moe(L, l, &ret->moe);

        BkExpert dense;
        snprintf(name, sizeof(name), "model.layers.%u.mlp", l);
        r = load_mlp(L, name, c->intermediate, false, &dense);
        if (r < 0)
                return r;
        ret->gate = dense.gate;
        ret->up = dense.up;
        ret->down = dense.down;
        return 0;
}

static int load_layer(Loader *L, uint32_t l, BkLayer *ret)
{
        const BkConfig *c = &L->m->bk.cfg;
        const ModelInfo *info = &L->m->info;
        uint32_t q_dim = c->n_heads * c->head_dim, kv_dim = c->n_kv_heads * c->head_dim;
        static const struct {
                const char *name;
                size_t off;
        } attn[] = {
                {"q_proj", offsetof(BkLayer, q)},
                {"k_proj", offsetof(BkLayer, k)},
                {"v_proj", offsetof(BkLayer, v)},
        };
        char name[256];
        int r;

        if (bk_is_mla(c))
                return load_layer_deepseek(L, l, ret);

        snprintf(name, sizeof(name), "model.layers.%u.input_layernorm.weight", l);
        r = load_vector(L, name, c->hidden, &ret->attn_norm);
        if (r < 0)
                return r;
        for (size_t i = 0; i < ELEMENTSOF(attn); i++) {
                snprintf(name, sizeof(name), "model.layers.%u.self_attn.%s", l, attn[i].name);
                r = load_linear(L, name, c->hidden, i == 0 ? q_dim : kv_dim, info->qkv_bias, true,
                        (BkLinear *) ((char *) ret + attn[i].off));
                if (r < 0)
                        return r;
        }
        snprintf(name, sizeof(name), "model.layers.%u.self_attn.o_proj", l);
        r = load_linear(L, name, q_dim, c->hidden, info->o_bias, true, &ret->o);
        if (r < 0)
                return r;

        snprintf(name, sizeof(name), "model.layers.%u.post_attention_layernorm.weight", l);
        r = load_vector(L, name, c->hidden, &ret->mlp_norm);
        if (r < 0)
                return r;
        snprintf(name, sizeof(name), "model.layers.%u.mlp.gate_proj", l);
        r = load_linear(L, name, c->hidden, c->intermediate, info->mlp_bias, true, &ret->gate);
        if (r < 0)
                return r;
        snprintf(name, sizeof(name), "model.layers.%u.mlp.up_proj", l);
        r = load_linear(L, name, c->hidden, c->intermediate, info->mlp_bias, true, &ret->up);
        if (r < 0)
                return r;
        snprintf(name, sizeof(name), "model.layers.%u.mlp.down_proj", l);
        return load_linear(L, name, c->intermediate, c->hidden, info->mlp_bias, true, &ret->down);
}

/* Widens row o of the dense [out][in] weight w of dtype dt into row. w is read in place,
 * since a mapped tensor may be misaligned for its element type. */
static void widen_row(const void *w, BkDtype dt, uint32_t in, uint32_t o, float *row)
{
        const uint8_t *p = (const uint8_t *) w + (size_t) o * in * (dt == BK_DT_F32 ? 4 : 2);

        switch (dt) {
        case BK_DT_F32:
                memcpy(row, p, (size_t) in * sizeof(float));
                break;
        case BK_DT_F16:
                f16_row_to_f32(p, in, row);
                break;
        default:
                bf16_row_to_f32(p, in, row);
                break;
        }
}

/* Rows part / parts of the 8-bit lm_head; each row is quantized alone, so any split gives
 * the same bytes. */
typedef struct Q8Part {
        const void *w;
        BkDtype dt;
        uint32_t in, out, gs, part, parts;
        int8_t *q;
        float *scales;
        int r;
} Q8Part;

static void *quantize_q8_part(void *arg)
{
        Q8Part *j = arg;
        uint32_t o0 = (uint32_t) ((uint64_t) j->out * j->part / j->parts);
        uint32_t o1 = (uint32_t) ((uint64_t) j->out * (j->part + 1) / j->parts);
        float *row = malloc((size_t) j->in * sizeof(*row));

        if (!row) {
                j->r = -ENOMEM;
                return NULL;
        }
        for (uint32_t o = o0; o < o1; o++) {
                widen_row(j->w, j->dt, j->in, o, row);
                q8_quantize_row(row, j->in, j->gs, j->q + (size_t) o * j->in,
                        j->scales + (size_t) o * (j->in / j->gs));
        }
        free(row);
        return NULL;
}

/* The lm_head as 8-bit rows (q8_pack.h) in owned buffers, from w, its dense [out][in]
 * weight of dtype dt, a row at a time in each thread: a float32 copy of 7B's lm_head would
 * take 2 GiB. name is the tensor's, for messages. */
static int quantize_q8(Loader *L, const char *name, const void *w, BkDtype dt, BkLinear *lin)
{
        uint32_t gs = q8_group_size(lin->in);
        Q8Part parts[Q8_THREADS];
        pthread_t tid[Q8_THREADS];
        bool started[Q8_THREADS] = {false};
        int8_t *q;
        float *scales;
        int r = 0;

        if (gs == 0)
                return ds_error(L->err, -DS_ERR_UNSUPPORTED,
                        "%s: cannot quantize lm_head '%s' to 8 bits: its width %u (hidden_size) "
                        "is not a multiple of 32",
                        st_archive_name(L->m->archive), name, lin->in);
        q = model_alloc(L->m, (size_t) lin->out * lin->in);
        scales = q ? model_alloc(L->m, (size_t) lin->out * (lin->in / gs) * sizeof(*scales)) : NULL;
        if (!scales)
                return -ENOMEM;

        long cpus = sysconf(_SC_NPROCESSORS_ONLN);
        uint32_t n = (uint32_t) MIN((long) Q8_THREADS, MAX(cpus, 1L));
        n = MAX(1u, MIN(n, lin->out / Q8_MIN_ROWS));
        for (uint32_t i = 0; i < n; i++)
                parts[i] = (Q8Part){w, dt, lin->in, lin->out, gs, i, n, q, scales, 0};
        /* part 0 on this thread; a part whose thread cannot start runs here too */
        for (uint32_t i = 1; i < n; i++)
                started[i] = pthread_create(&tid[i], NULL, quantize_q8_part, &parts[i]) == 0;
        quantize_q8_part(&parts[0]);
        for (uint32_t i = 1; i < n; i++) {
                if (started[i])
                        pthread_join(tid[i], NULL);
                else
                        quantize_q8_part(&parts[i]);
        }
        for (uint32_t i = 0; i < n; i++)
                r = r < 0 ? r : parts[i].r;
        if (r < 0)
                return ds_error(L->err, r, "%s: quantizing lm_head '%s' to 8 bits: out of memory",
                        st_archive_name(L->m->archive), name);

        *lin = (BkLinear){.kind = BK_LINEAR_Q8,
                .in = lin->in,
                .out = lin->out,
                .group_size = gs,
                .q8 = q,
                .q8_scales = scales};
        return 0;
}

/* The lm_head: the embedding as a dense linear when tied, else lm_head.weight, dense
 * whatever the checkpoint's quantization (AutoAWQ leaves it in FP16, and load_linear()
 * reads it dense outside the decoder blocks), so with lm_head_int8 there is always a
 * dense weight to quantize. The embedding itself stays as it is. */
static int load_lm_head(Loader *L)
{
        const BkConfig *c = &L->m->bk.cfg;
        BkLinear *lin = &L->m->bk.lm_head;
        const StTensor *t;
        int r;

        if (L->m->info.tie_embeddings) {
                *lin = (BkLinear){.kind = BK_LINEAR_DENSE,
                        .in = c->hidden,
                        .out = c->vocab_size,
                        .w = L->m->bk.embed};
                if (!L->opt || !L->opt->lm_head_int8)
                        return 0;
                return quantize_q8(L, "model.embed_tokens.weight", lin->w.data, lin->w.dtype, lin);
        }
        if (!L->opt || !L->opt->lm_head_int8)
                return load_linear(L, "lm_head", c->hidden, c->vocab_size, false, false, lin);

        /* Quantized from the map in place, so a misaligned lm_head.weight costs no aligned
         * copy. */
        r = get_tensor(L, "lm_head.weight", true, 0, 2, c->vocab_size, c->hidden, &t);
        if (r < 0)
                return r;
        *lin = (BkLinear){.in = c->hidden, .out = c->vocab_size};
        return quantize_q8(L, "lm_head.weight", t->data, bk_dtype(t->dtype), lin);
}

/* What ModelInfo.quant says once the weights are known. */
static void describe_quant(Model *m, const ModelOptions *opt)
{
        static const char *const names[_BK_DT_MAX] = {
                [BK_DT_F32] = "f32",
                [BK_DT_F16] = "f16",
                [BK_DT_BF16] = "bf16",
        };
        size_t at;

        /* An AWQ checkpoint keeps the config's "awq-int4 gN". */
        if (m->info.group_size == 0) {
                if (opt && opt->quantize_int4)
                        snprintf(m->info.quant, sizeof(m->info.quant), "int4-at-load g%u",
                                QUANT_GROUP);
                else
                        snprintf(m->info.quant, sizeof(m->info.quant), "%s",
                                names[m->bk.layers[0].o.w.dtype]);
        }
        /* At most 20 + 19 characters of the 63. */
        at = strlen(m->info.quant);
        if (m->bk.lm_head.kind == BK_LINEAR_Q8)
                snprintf(m->info.quant + at, sizeof(m->info.quant) - at, ", lm_head int8 g%u",
                        m->bk.lm_head.group_size);
}

int model_load(const char *dir, const ModelOptions *opt, Model **ret, DsError *err)
{
        _cleanup_(model_freep) Model *m = NULL;
        const StTensor *t;
        BkConfig *c;
        Loader L;
        int r;

        if (!dir || !ret)
                return -EINVAL;
        m = calloc(1, sizeof(*m));
        if (!m)
                return -ENOMEM;
        m->dir = strdup(dir);
        if (!m->dir)
                return -ENOMEM;
        L = (Loader){m, opt, err};
        c = &m->bk.cfg;

        r = model_config_load(dir, c, &m->info, err);
        if (r < 0)
                return r;
        r = st_archive_open(dir, &m->archive, err);
        if (r < 0)
                return r;

        r = get_tensor(&L, "model.embed_tokens.weight", true, 0, 2, c->vocab_size, c->hidden, &t);
        if (r < 0)
                return r;
        m->bk.embed.dtype = bk_dtype(t->dtype);
        r = tensor_data(&L, t, &m->bk.embed.data);
        if (r < 0)
                return r;

        m->bk.layers = calloc(c->n_layers, sizeof(*m->bk.layers));
        if (!m->bk.layers)
                return -ENOMEM;
        for (uint32_t l = 0; l < c->n_layers; l++) {
                r = load_layer(&L, l, &m->bk.layers[l]);
                if (r < 0)
                        return r;
                if (opt && opt->progress)
                        opt->progress(opt->userdata, l + 1, c->n_layers);
        }

        r = load_vector(&L, "model.norm.weight", c->hidden, &m->bk.final_norm);
        if (r < 0)
                return r;
        r = load_lm_head(&L);
        if (r < 0)
                return r;

        describe_quant(m, opt);
        *ret = TAKE_PTR(m);
        return 0;
}
