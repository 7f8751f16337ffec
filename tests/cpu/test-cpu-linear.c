/* SPDX-License-Identifier: MIT */
/* cpu_linear against a plain double-precision reference on random layers: AWQ INT4 (the
 * packing spelled out independently here, from docs/formats.md's ORDER table), dense
 * F32/F16/BF16 and 8-bit Q8 (backend.h's formula), with and without bias; and every row's
 * output bit-identical whether it is computed alone or among other rows, and (Q8) on one
 * thread or three. */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_linear.h"
#include "half.h"
#include "test_util.h"

#define IN   256
#define OUT  200 /* not a multiple of the kernel's column block */
#define ROWS 5

static const unsigned ORDER[8] = {0, 2, 4, 6, 1, 3, 5, 7}; /* nibble i holds column 8c + ORDER[i] */

static uint32_t rng_state = 7;

static uint32_t rng(void)
{
        rng_state = rng_state * 1664525u + 1013904223u;
        return rng_state >> 8;
}

static float frand(void)
{
        return (float) (rng() % 20001) / 10000.0f - 1.0f;
}

/* Packs q (rows, OUT) nibbles into (rows, OUT/8) words. */
static void pack(const uint8_t *q, uint32_t rows, uint32_t *out)
{
        for (uint32_t r = 0; r < rows; r++)
                for (uint32_t c = 0; c < OUT / 8; c++) {
                        uint32_t w = 0;
                        for (uint32_t i = 0; i < 8; i++)
                                w |= (uint32_t) q[r * OUT + 8 * c + ORDER[i]] << (4 * i);
                        out[r * (OUT / 8) + c] = w;
                }
}

/* y = x · W + b in double, W[k][n] given by weight(). */
static void check_layer(const char *what, const BkLinear *l, const double *w /* (IN, OUT) */)
{
        float x[ROWS * IN], y[ROWS * OUT], y1[OUT];
        float *scratch = calloc(cpu_linear_scratch_size(l), sizeof(float));
        CHECK(scratch, "out of memory");

        for (uint32_t i = 0; i < ROWS * IN; i++)
                x[i] = frand();
        cpu_linear(l, x, ROWS, y, scratch, NULL);

        double err = 0, ref_norm = 0;
        for (uint32_t r = 0; r < ROWS; r++)
                for (uint32_t n = 0; n < OUT; n++) {
                        double ref = l->bias.data ? cpu_tensor_get(l->bias, n) : 0.0;
                        for (uint32_t k = 0; k < IN; k++)
                                ref += (double) x[r * IN + k] * w[k * OUT + n];
                        err = fmax(err, fabs(y[r * OUT + n] - ref));
                        ref_norm = fmax(ref_norm, fabs(ref));
                }
        CHECK(err < 1e-5 * ref_norm, "%s: max error %g (max |y| %g)", what, err, ref_norm);

        for (uint32_t r = 0; r < ROWS; r++) {
                cpu_linear(l, x + r * IN, 1, y1, scratch, NULL);
                CHECK(memcmp(y1, y + r * OUT, sizeof(y1)) == 0, "%s: row %u differs alone", what,
                        r);
        }
        printf("%s: max error %.3g of max |y| %.3g; rows bit-identical alone\n", what, err,
                ref_norm);
        free(scratch);
}

static void test_awq(uint32_t gs, bool bias)
{
        static uint8_t q[IN * OUT], z[IN * OUT];
        static uint32_t qweight[IN * OUT / 8], qzeros[IN * OUT / 8];
        static uint16_t scales[IN * OUT], bias16[OUT];
        static double w[IN * OUT];
        char what[64];

        for (uint32_t i = 0; i < IN * OUT; i++)
                q[i] = (uint8_t) (rng() % 16);
        for (uint32_t i = 0; i < IN / gs * OUT; i++) {
                z[i] = (uint8_t) (rng() % 16);
                scales[i] = f32_to_f16(0.001f + 0.02f * (frand() + 1.0f));
        }
        for (uint32_t i = 0; i < OUT; i++)
                bias16[i] = f32_to_f16(frand());
        pack(q, IN, qweight);
        pack(z, IN / gs, qzeros);
        for (uint32_t k = 0; k < IN; k++)
                for (uint32_t n = 0; n < OUT; n++) {
                        uint32_t g = (k / gs) * OUT + n;
                        w[k * OUT + n] = ((double) q[k * OUT + n] - z[g]) * f16_to_f32(scales[g]);
                }

        BkLinear l = {
                .kind = BK_LINEAR_AWQ,
                .in = IN,
                .out = OUT,
                .qweight = qweight,
                .qzeros = qzeros,
                .scales = scales,
                .group_size = gs,
                .bias = {BK_DT_F16, bias ? bias16 : NULL},
        };
        CHECK(cpu_linear_check(&l, IN, OUT, "awq", NULL) == 0, "awq layer refused");
        snprintf(what, sizeof(what), "awq g%u%s", gs, bias ? " +bias" : "");
        check_layer(what, &l, w);
}

static void test_dense(BkDtype dt, bool bias)
{
        static float wf[OUT * IN], biasf[OUT];
        static uint16_t wh[OUT * IN];
        static double w[IN * OUT];
        const char *names[] = {"f32", "f16", "bf16"};
        char what[64];

        for (uint32_t o = 0; o < OUT; o++)
                for (uint32_t i = 0; i < IN; i++) {
                        float v = frand() * 0.1f;
                        wh[o * IN + i] = dt == BK_DT_F16 ? f32_to_f16(v) : f32_to_bf16(v);
                        wf[o * IN + i] = v;
                        w[i * OUT + o] = dt == BK_DT_F32   ? v
                                         : dt == BK_DT_F16 ? f16_to_f32(wh[o * IN + i])
                                                           : bf16_to_f32(wh[o * IN + i]);
                }
        for (uint32_t o = 0; o < OUT; o++)
                biasf[o] = frand();

        BkLinear l = {
                .kind = BK_LINEAR_DENSE,
                .in = IN,
                .out = OUT,
                .w = {dt, dt == BK_DT_F32 ? (const void *) wf : wh},
                .bias = {BK_DT_F32, bias ? biasf : NULL},
        };
        CHECK(cpu_linear_check(&l, IN, OUT, "dense", NULL) == 0, "dense layer refused");
        snprintf(what, sizeof(what), "dense %s%s", names[dt], bias ? " +bias" : "");
        check_layer(what, &l, w);
}

/* A Q8 layer of random q in -127..127 and scales (group 1 of each row zero), against
 * y[r][o] = bias[o] + sum over g of s[o][g] * sum over k of g of q[o][k] * x[r][k] in
 * double. */
static void test_q8(uint32_t in, uint32_t out, uint32_t gs, uint32_t rows, bool bias, CpuPool *pool)
{
        int8_t *q = malloc((size_t) out * in);
        float *s = malloc((size_t) out * (in / gs) * sizeof(float));
        float *b = malloc(out * sizeof(float));
        float *x = malloc((size_t) rows * in * sizeof(float));
        float *y = malloc((size_t) rows * out * sizeof(float));
        float *y1 = malloc(out * sizeof(float));
        float *yp = malloc((size_t) rows * out * sizeof(float));
        float *row = malloc(out * sizeof(float));
        char what[64];

        CHECK(q && s && b && x && y && y1 && yp && row, "out of memory");
        for (size_t i = 0; i < (size_t) out * in; i++)
                q[i] = (int8_t) ((int) (rng() % 255) - 127);
        for (size_t i = 0; i < (size_t) out * (in / gs); i++)
                s[i] = in / gs > 1 && i % (in / gs) == 1 ? 0.0f : 1e-3f * (frand() + 1.5f);
        for (uint32_t o = 0; o < out; o++)
                b[o] = frand();
        for (size_t i = 0; i < (size_t) rows * in; i++)
                x[i] = frand();

        BkLinear l = {
                .kind = BK_LINEAR_Q8,
                .in = in,
                .out = out,
                .group_size = gs,
                .q8 = q,
                .q8_scales = s,
                .bias = {BK_DT_F32, bias ? b : NULL},
        };
        snprintf(what, sizeof(what), "q8 %u->%u g%u, %u rows%s", in, out, gs, rows,
                bias ? " +bias" : "");
        CHECK(cpu_linear_check(&l, in, out, what, NULL) == 0, "%s: refused", what);
        size_t per = cpu_linear_scratch_size(&l);
        float *scratch = calloc(per * cpu_pool_threads(pool), sizeof(float));
        CHECK(scratch, "out of memory");
        cpu_linear(&l, x, rows, y, scratch, NULL);

        double err = 0, ref_norm = 0;
        for (uint32_t r = 0; r < rows; r++)
                for (uint32_t o = 0; o < out; o++) {
                        double ref = bias ? b[o] : 0.0;
                        for (uint32_t g = 0; g < in / gs; g++) {
                                double d = 0;
                                for (uint32_t k = g * gs; k < (g + 1) * gs; k++)
                                        d += (double) q[(size_t) o * in + k] *
                                             x[(size_t) r * in + k];
                                ref += s[(size_t) o * (in / gs) + g] * d;
                        }
                        err = fmax(err, fabs(y[(size_t) r * out + o] - ref));
                        ref_norm = fmax(ref_norm, fabs(ref));
                }
        CHECK(err < 1e-5 * ref_norm, "%s: max error %g (max |y| %g)", what, err, ref_norm);

        for (uint32_t r = 0; r < rows; r++) {
                cpu_linear(&l, x + (size_t) r * in, 1, y1, scratch, NULL);
                CHECK(memcmp(y1, y + (size_t) r * out, out * sizeof(float)) == 0,
                        "%s: row %u differs alone", what, r);
        }
        cpu_linear(&l, x, rows, yp, scratch, pool);
        CHECK(memcmp(yp, y, (size_t) rows * out * sizeof(float)) == 0, "%s: differs on %u threads",
                what, cpu_pool_threads(pool));

        /* cpu_linear_row: input row k of W is q[n][k] * s[n][k / gs], one product. */
        for (uint32_t k = 0; k < in; k += in / 7 + 1) {
                cpu_linear_row(&l, k, row);
                for (uint32_t n = 0; n < out; n++) {
                        double w = (double) q[(size_t) n * in + k] *
                                   s[(size_t) n * (in / gs) + k / gs];
                        CHECK(row[n] == (float) w, "%s: W[%u][%u] = %g, want %g", what, k, n,
                                row[n], w);
                }
        }
        printf("%s: max error %.3g of max |y| %.3g; rows bit-identical alone and on %u threads\n",
                what, err, ref_norm, cpu_pool_threads(pool));
        free(q);
        free(s);
        free(b);
        free(x);
        free(y);
        free(y1);
        free(yp);
        free(row);
        free(scratch);
}

int main(void)
{
        test_awq(128, false);
        test_awq(64, true);
        test_awq(32, false);
        for (BkDtype dt = 0; dt < _BK_DT_MAX; dt++) {
                test_dense(dt, false);
                test_dense(dt, true);
        }

        CpuPool *pool;
        CHECK(cpu_pool_new(3, &pool, NULL) == 0, "pool");
        test_q8(128, 37, 128, 1, false, pool);
        test_q8(96, 201, 32, 5, true, pool);
        test_q8(192, 333, 64, 3, false, pool);
        test_q8(3584, 157, 128, 17, false, pool);
        test_q8(512, 1023, 128, 2, true, pool);
        cpu_pool_free(pool);

        /* Q8 layers the kernel cannot run are refused. */
        int8_t q1[1];
        float s1[1];
        const struct {
                uint32_t in, gs;
                bool tensors;
        } bad_q8[] = {{96, 64, true}, {128, 16, true}, {128, 0, true}, {128, 256, true},
                {128, 128, false}};
        for (size_t i = 0; i < ELEMENTSOF(bad_q8); i++) {
                BkLinear l = {.kind = BK_LINEAR_Q8,
                        .in = bad_q8[i].in,
                        .out = 8,
                        .group_size = bad_q8[i].gs,
                        .q8 = bad_q8[i].tensors ? q1 : NULL,
                        .q8_scales = s1};
                CHECK(cpu_linear_check(&l, bad_q8[i].in, 8, "bad q8", NULL) == -DS_ERR_FORMAT,
                        "q8 in %u group %u tensors %d accepted", bad_q8[i].in, bad_q8[i].gs,
                        bad_q8[i].tensors);
        }

        /* Shapes the kernel cannot run are refused. */
        BkLinear bad = {.kind = BK_LINEAR_AWQ,
                .in = 100,
                .out = OUT,
                .group_size = 128,
                .qweight = (uint32_t[1]){},
                .qzeros = (uint32_t[1]){},
                .scales = (uint16_t[1]){}};
        CHECK(cpu_linear_check(&bad, 100, OUT, "bad", NULL) == -DS_ERR_FORMAT,
                "in not a multiple of the group");
        CHECK(cpu_linear_check(&bad, 128, OUT, "bad", NULL) == -DS_ERR_FORMAT, "shape mismatch");
        return 0;
}
