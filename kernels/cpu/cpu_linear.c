/* SPDX-License-Identifier: MIT */
#include <assert.h>
#include <string.h>

#include "cpu_linear.h"
#include "half.h"

/* Layers with fewer weights than this run on the calling thread: waking the workers
 * would cost more than it saves. */
#define PARALLEL_MIN_WEIGHTS 65536

/* Output columns an AWQ pass works on at once: their accumulators, for every row of a
 * tile, stay in L1 while the pass walks down all the inputs. A multiple of 8. */
#define AWQ_COLS 128

/* Logical column j of a packed AWQ word is nibble AWQ_NIBBLE[j] (docs/formats.md). */
static const unsigned AWQ_NIBBLE[8] = {0, 4, 1, 5, 2, 6, 3, 7};

float cpu_tensor_get(BkTensor t, size_t i)
{
        switch (t.dtype) {
        case BK_DT_F32:
                return ((const float *) t.data)[i];
        case BK_DT_F16:
                return f16_to_f32(((const uint16_t *) t.data)[i]);
        case BK_DT_BF16:
                return bf16_to_f32(((const uint16_t *) t.data)[i]);
        default:
                assert(!"bad dtype");
                return 0.0f;
        }
}

int cpu_linear_check(const BkLinear *l, uint32_t in, uint32_t out, const char *what, DsError *err)
{
        if (l->in != in || l->out != out)
                return ds_error(err, -DS_ERR_FORMAT, "%s: shape %u→%u, expected %u→%u", what, l->in,
                        l->out, in, out);
        if (l->bias.data && (unsigned) l->bias.dtype >= _BK_DT_MAX)
                return ds_error(err, -DS_ERR_FORMAT, "%s: bad bias dtype", what);

        switch (l->kind) {
        case BK_LINEAR_DENSE:
                if (!l->w.data || (unsigned) l->w.dtype >= _BK_DT_MAX)
                        return ds_error(err, -DS_ERR_FORMAT, "%s: no dense weight", what);
                return 0;
        case BK_LINEAR_AWQ:
                if (!l->qweight || !l->qzeros || !l->scales)
                        return ds_error(err, -DS_ERR_FORMAT, "%s: AWQ tensors missing", what);
                if (l->group_size == 0 || in % l->group_size != 0 || out % 8 != 0)
                        return ds_error(err, -DS_ERR_FORMAT,
                                "%s: AWQ needs in %% group_size == 0 and out %% 8 == 0 "
                                "(in %u, out %u, group %u)",
                                what, in, out, l->group_size);
                return 0;
        case BK_LINEAR_Q8:
                if (!l->q8 || !l->q8_scales)
                        return ds_error(err, -DS_ERR_FORMAT, "%s: 8-bit tensors missing", what);
                if ((l->group_size != 32 && l->group_size != 64 && l->group_size != 128) ||
                        in % l->group_size != 0)
                        return ds_error(err, -DS_ERR_FORMAT,
                                "%s: 8-bit rows need a group of 32, 64 or 128 dividing in "
                                "(in %u, group %u)",
                                what, in, l->group_size);
                return 0;
        default:
                return ds_error(err, -DS_ERR_UNSUPPORTED, "%s: unknown linear kind %d", what,
                        (int) l->kind);
        }
}

size_t cpu_linear_scratch_size(const BkLinear *l)
{
        return l->kind == BK_LINEAR_AWQ ? 3 * AWQ_COLS : l->in;
}

/* Sum of a[i] * b[i] in eight interleaved lanes added up in a fixed order: vectorizable,
 * and the same bits for the same inputs every time. */
static float dot(const float *a, const float *b, uint32_t n)
{
        float lane[8] = {0};
        uint32_t i = 0;

        for (; i + 8 <= n; i += 8)
                for (uint32_t j = 0; j < 8; j++)
                        lane[j] += a[i + j] * b[i + j];
        for (; i < n; i++)
                lane[i % 8] += a[i] * b[i];
        return ((lane[0] + lane[1]) + (lane[2] + lane[3])) +
               ((lane[4] + lane[5]) + (lane[6] + lane[7]));
}

/* w: [out][in]. Outputs o0 .. o1 - 1. Each weight row is widened once (wrow: (in)) and
 * used by every row of x. */
static void linear_dense(const BkLinear *l, const float *x, uint32_t rows, float *y, float *wrow,
        uint32_t o0, uint32_t o1)
{
        for (uint32_t o = o0; o < o1; o++) {
                const float *w = wrow;
                const uint16_t *h = (const uint16_t *) l->w.data + (size_t) o * l->in;
                switch (l->w.dtype) {
                case BK_DT_F32:
                        w = (const float *) l->w.data + (size_t) o * l->in;
                        break;
                case BK_DT_F16:
                        for (uint32_t i = 0; i < l->in; i++)
                                wrow[i] = f16_to_f32(h[i]);
                        break;
                default:
                        for (uint32_t i = 0; i < l->in; i++)
                                wrow[i] = bf16_to_f32(h[i]);
                        break;
                }
                for (uint32_t r = 0; r < rows; r++)
                        y[(size_t) r * l->out + o] = dot(x + (size_t) r * l->in, w, l->in);
        }
}

/* q8: [out][in], q8_scales: [out][in / gs]. Outputs o0 .. o1 - 1. Each weight row is
 * widened to float once (wrow: (in)) and used by every row of x; y is the sum over the
 * groups in order of the group's scale times its dot product, the formula of backend.h. */
static void linear_q8(const BkLinear *l, const float *x, uint32_t rows, float *y, float *wrow,
        uint32_t o0, uint32_t o1)
{
        const uint32_t gs = l->group_size, groups = l->in / gs;

        for (uint32_t o = o0; o < o1; o++) {
                const int8_t *q = l->q8 + (size_t) o * l->in;
                const float *s = l->q8_scales + (size_t) o * groups;
                for (uint32_t i = 0; i < l->in; i++)
                        wrow[i] = (float) q[i];
                for (uint32_t r = 0; r < rows; r++) {
                        const float *xr = x + (size_t) r * l->in;
                        float acc = 0.0f;
                        for (uint32_t g = 0; g < groups; g++)
                                acc += s[g] * dot(xr + (size_t) g * gs, wrow + (size_t) g * gs, gs);
                        y[(size_t) r * l->out + o] = acc;
                }
        }
}

/* w[n] = (q[n] - zero[n]) * scale[n] for the nb columns of one packed input row. */
static void awq_dequant_row(const uint32_t *restrict qw, const float *restrict zero,
        const float *restrict scale, float *restrict w, uint32_t nb)
{
        for (uint32_t c = 0; c < nb / 8; c++) {
                uint32_t word = qw[c];
                float q[8];
                /* AWQ_NIBBLE[j] spelled out, so that the shifts are constants. */
                q[0] = (float) (word & 0xF);
                q[1] = (float) ((word >> 16) & 0xF);
                q[2] = (float) ((word >> 4) & 0xF);
                q[3] = (float) ((word >> 20) & 0xF);
                q[4] = (float) ((word >> 8) & 0xF);
                q[5] = (float) ((word >> 24) & 0xF);
                q[6] = (float) ((word >> 12) & 0xF);
                q[7] = (float) (word >> 28);
                for (uint32_t j = 0; j < 8; j++)
                        w[8 * c + j] = (q[j] - zero[8 * c + j]) * scale[8 * c + j];
        }
}

/* y[n] += a * x[n] for n a multiple of 8, in blocks of 8 that compilers vectorize. */
static void axpy8(float *restrict y, float a, const float *restrict x, uint32_t n)
{
        for (uint32_t i = 0; i < n; i += 8)
                for (uint32_t j = 0; j < 8; j++)
                        y[i + j] += a * x[i + j];
}

/* W[k][n] = (q[k][n] - z[k/gs][n]) * s[k/gs][n], dequantized one input row of one column
 * block at a time and accumulated into y in ascending k: y[r][n] += x[r][k] * W[k][n].
 * Column blocks b0 .. b1 - 1. scratch: (3, AWQ_COLS) zeros, scales and the dequantized
 * row. */
static void linear_awq(const BkLinear *l, const float *x, uint32_t rows, float *y, float *scratch,
        uint32_t b0, uint32_t b1)
{
        const uint32_t words = l->out / 8; /* packed words per row of qweight / qzeros */
        float *zero = scratch, *scale = scratch + AWQ_COLS, *w = scratch + 2 * AWQ_COLS;

        for (uint32_t n0 = b0 * AWQ_COLS; n0 < MIN(l->out, b1 * AWQ_COLS); n0 += AWQ_COLS) {
                uint32_t nb = MIN(AWQ_COLS, l->out - n0);

                for (uint32_t r = 0; r < rows; r++)
                        memset(y + (size_t) r * l->out + n0, 0, nb * sizeof(float));

                for (uint32_t g = 0; g < l->in / l->group_size; g++) {
                        /* This group's zero points and scales for the block's columns. */
                        const uint32_t *qz = l->qzeros + (size_t) g * words + n0 / 8;
                        const uint16_t *sc = l->scales + (size_t) g * l->out + n0;
                        for (uint32_t n = 0; n < nb; n++) {
                                zero[n] = (float) ((qz[n / 8] >> (4 * AWQ_NIBBLE[n % 8])) & 0xF);
                                scale[n] = f16_to_f32(sc[n]);
                        }

                        for (uint32_t k = g * l->group_size; k < (g + 1) * l->group_size; k++) {
                                awq_dequant_row(l->qweight + (size_t) k * words + n0 / 8, zero,
                                        scale, w, nb);
                                for (uint32_t r = 0; r < rows; r++)
                                        axpy8(y + (size_t) r * l->out + n0,
                                                x[(size_t) r * l->in + k], w, nb);
                        }
                }
        }
}

typedef struct {
        const BkLinear *l;
        const float *x;
        uint32_t rows;
        float *y;
        float *scratch; /* (parts, cpu_linear_scratch_size(l)) */
        uint32_t units; /* AWQ column blocks, or dense or 8-bit outputs, split among the parts */
} LinearJob;

/* One part's share of the output columns: each output is summed by one part alone, in
 * the order one thread would sum it. */
static void linear_part(void *arg, uint32_t part, uint32_t parts)
{
        const LinearJob *j = arg;
        uint32_t u0 = (uint32_t) ((uint64_t) j->units * part / parts);
        uint32_t u1 = (uint32_t) ((uint64_t) j->units * (part + 1) / parts);
        float *scratch = j->scratch + part * cpu_linear_scratch_size(j->l);

        switch (j->l->kind) {
        case BK_LINEAR_AWQ:
                linear_awq(j->l, j->x, j->rows, j->y, scratch, u0, u1);
                break;
        case BK_LINEAR_Q8:
                linear_q8(j->l, j->x, j->rows, j->y, scratch, u0, u1);
                break;
        default:
                linear_dense(j->l, j->x, j->rows, j->y, scratch, u0, u1);
                break;
        }
}

void cpu_linear(
        const BkLinear *l, const float *x, uint32_t rows, float *y, float *scratch, CpuPool *pool)
{
        LinearJob job = {.l = l, .x = x, .rows = rows, .y = y, .scratch = scratch};
        uint32_t parts = 1;

        job.units = l->kind == BK_LINEAR_AWQ ? (l->out + AWQ_COLS - 1) / AWQ_COLS : l->out;
        if ((uint64_t) l->in * l->out >= PARALLEL_MIN_WEIGHTS)
                parts = MIN(cpu_pool_threads(pool), job.units);
        cpu_pool_run(pool, linear_part, &job, MAX(parts, 1u));

        if (l->bias.data)
                for (uint32_t o = 0; o < l->out; o++) {
                        float b = cpu_tensor_get(l->bias, o);
                        for (uint32_t r = 0; r < rows; r++)
                                y[(size_t) r * l->out + o] += b;
                }
}

void cpu_linear_row(const BkLinear *l, uint32_t k, float *row)
{
        if (l->kind == BK_LINEAR_Q8) {
                const uint32_t groups = l->in / l->group_size;
                for (uint32_t n = 0; n < l->out; n++)
                        row[n] = (float) l->q8[(size_t) n * l->in + k] *
                                 l->q8_scales[(size_t) n * groups + k / l->group_size];
                return;
        }
        if (l->kind != BK_LINEAR_AWQ) {
                for (uint32_t n = 0; n < l->out; n++)
                        row[n] = cpu_tensor_get(l->w, (size_t) n * l->in + k);
                return;
        }

        const uint32_t words = l->out / 8;
        const uint32_t *qw = l->qweight + (size_t) k * words;
        const uint32_t *qz = l->qzeros + (size_t) (k / l->group_size) * words;
        const uint16_t *sc = l->scales + (size_t) (k / l->group_size) * l->out;
        for (uint32_t n = 0; n < l->out; n++) {
                unsigned shift = 4 * AWQ_NIBBLE[n % 8];
                float q = (float) ((qw[n / 8] >> shift) & 0xF);
                float z = (float) ((qz[n / 8] >> shift) & 0xF);
                row[n] = (q - z) * f16_to_f32(sc[n]);
        }
}
