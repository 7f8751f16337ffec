/* SPDX-License-Identifier: MIT */
/* cu_add_norm (residual add of a linear's slices plus bias, then RMSNorm) against a float64
 * reference, for steps of more rows than the cluster kernel takes (prefill): the residual
 * must match the float32 sum x + (slices + bias) bit for bit, the FP16 normed rows within
 * 2e-3 relative error, and the same rows run in passes through the cluster kernel must give
 * the same bits (a row's result does not depend on the step's size). Hidden sizes that are
 * not multiples of the kernels' chunks, more than one slice, a scattered out_row subset
 * without the residual write. Outputs are poisoned. At decode sizes the add_norm also
 * quantizes its FP16 rows for the integer GEMV: each chunk of 64 against the format of
 * CuQx (kernels/cuda/cuda_kernels.cuh) computed here from those rows, bit for bit. */
#include "gpu_util.h"

#define TOL 2e-3

static double check(uint32_t rows, uint32_t hidden, uint32_t splits, bool bias, bool subset)
{
        DsError err = {0};
        uint32_t x_rows = subset ? rows + 37 : rows;
        size_t xn = (size_t) x_rows * hidden, on = (size_t) rows * hidden;
        float *x = rnd_f32(xn, -2.0f, 2.0f), *part = rnd_f32(splits * xn, -1.0f, 1.0f);
        float *b = bias ? rnd_f32(hidden, -0.5f, 0.5f) : NULL, *w = rnd_f32(hidden, 0.5f, 1.5f);
        float *x_out = (float *) rnd_alloc(xn * 4), *want_x = (float *) rnd_alloc(xn * 4);
        uint16_t *xn_out = (uint16_t *) rnd_alloc(on * 2);
        uint32_t *out_row = NULL;
        bool same = false;

        if (subset) {
                out_row = (uint32_t *) rnd_alloc(rows * 4);
                for (uint32_t j = 0; j < rows; j++)
                        out_row[j] = x_rows - 1 - 2 * j % x_rows;
        }
        for (size_t i = 0; i < on; i++)
                xn_out[i] = 0x7e00;
        for (size_t i = 0; i < xn; i++)
                x_out[i] = NAN;
        CudaNormTest t = {.rows = rows,
                .x_rows = x_rows,
                .hidden = hidden,
                .splits = splits,
                .x = x,
                .part = part,
                .bias = b,
                .w = w,
                .out_row = out_row,
                .write_res = !subset,
                .eps = 1e-6f};
        CHECK(cuda_test_add_norm(&t, x_out, xn_out, &same, &err) == 0, "%s", err.msg);
        CHECK(same, "%u rows of %u: passes of the cluster kernel give other bits", rows, hidden);

        /* the residual as the kernels add it: the slices in order, the bias, then x */
        for (uint32_t r = 0; r < x_rows; r++)
                for (uint32_t i = 0; i < hidden; i++) {
                        size_t at = (size_t) r * hidden + i;
                        float y = 0.0f;
                        for (uint32_t s = 0; s < splits; s++)
                                y += part[s * xn + at];
                        want_x[at] = x[at] + (b ? y + b[i] : y);
                }
        double d = 0, n2 = 0;
        for (uint32_t j = 0; j < rows; j++) {
                uint32_t r = subset ? out_row[j] : j;
                const float *v = want_x + (size_t) r * hidden;
                double ss = 0;
                for (uint32_t i = 0; i < hidden; i++)
                        ss += (double) v[i] * v[i];
                double inv = 1.0 / sqrt(ss / hidden + 1e-6);
                for (uint32_t i = 0; i < hidden; i++) {
                        double want = w[i] * v[i] * inv,
                               got = f16_to_f32(xn_out[(size_t) j * hidden + i]);
                        CHECK(isfinite(got), "%u rows of %u: row %u not written", rows, hidden, j);
                        d += (got - want) * (got - want);
                        n2 += want * want;
                }
        }
        if (subset)
                CHECK(memcmp(x_out, x, xn * 4) == 0, "%u rows of %u: x written", rows, hidden);
        else
                CHECK(memcmp(x_out, want_x, xn * 4) == 0, "%u rows of %u: residual differs", rows,
                        hidden);
        double e = sqrt(d / n2);
        CHECK(e < TOL, "%u rows of %u, %u slices: relative error %.3g", rows, hidden, splits, e);
        free(x);
        free(part);
        free(b);
        free(w);
        free(x_out);
        free(want_x);
        free(xn_out);
        free(out_row);
        return e;
}

/* Chunk c of FP16 row v quantized as CuQx says, against the kernel's item and record. */
static void check_chunk(
        const uint16_t *v, const uint32_t *item, const float *rec, uint32_t row, uint32_t c)
{
        static const uint32_t order[4] = {0, 2, 1, 3};
        float x[64], m = 0.0f;
        int X[64], sum = 0;

        for (uint32_t k = 0; k < 64; k++) {
                x[k] = f16_to_f32(v[k]);
                m = fmaxf(m, fabsf(x[k]));
        }
        float inv = m > 0.0f ? 32639.0f / m : 0.0f;
        for (uint32_t k = 0; k < 64; k++) {
                X[k] = (int) rintf(x[k] * inv);
                sum += X[k];
        }
        CHECK(memcmp(&rec[0], &(float){m / 32639.0f}, 4) == 0, "row %u chunk %u: scale %g, want %g",
                row, c, rec[0], m / 32639.0f);
        CHECK(memcmp(&rec[1], &sum, 4) == 0, "row %u chunk %u: sum of X differs", row, c);
        for (uint32_t p = 0; p < 2; p++)
                for (uint32_t t = 0; t < 4; t++)
                        for (uint32_t j = 0; j < 4; j++)
                                for (uint32_t b = 0; b < 4; b++) {
                                        int q = X[16 * j + 4 * t + order[b]];
                                        /* X = 256 xh + xl, xh = floor((X + 128) / 256) */
                                        int xh = (int) floorf((float) (q + 128) / 256.0f);
                                        int want = p == 0 ? xh : q - 256 * xh;
                                        int got = (int8_t) (item[16 * p + 4 * t + j] >> (8 * b));
                                        CHECK(got == want,
                                                "row %u chunk %u: part %u of k %u is %d, want %d",
                                                row, c, p, 16 * j + 4 * t + order[b], got, want);
                                }
}

static void check_quantized(uint32_t rows, uint32_t hidden)
{
        DsError err = {0};
        size_t n = (size_t) rows * hidden, chunks = hidden / 64;
        float *x = rnd_f32(n, -2.0f, 2.0f), *part = rnd_f32(n, -1.0f, 1.0f);
        float *w = rnd_f32(hidden, 0.5f, 1.5f), *x_out = (float *) rnd_alloc(n * 4);
        uint16_t *xn_out = (uint16_t *) rnd_alloc(n * 2);
        uint32_t *items = (uint32_t *) rnd_alloc(rows * chunks * 128);
        float *recs = (float *) rnd_alloc(rows * chunks * 8);
        bool same = false;

        /* a chunk of zeros (scale 0) and one with a large value among small ones */
        for (uint32_t i = 0; i < 64; i++) {
                x[64 + i] = 0.0f;
                part[64 + i] = 0.0f;
                x[128 + i] = 0.01f * (float) i;
        }
        x[130] = 50.0f;
        memset(items, 0xa5, rows * chunks * 128);
        for (size_t i = 0; i < rows * chunks * 2; i++)
                recs[i] = NAN;
        CudaNormTest t = {.rows = rows,
                .x_rows = rows,
                .hidden = hidden,
                .splits = 1,
                .x = x,
                .part = part,
                .w = w,
                .write_res = true,
                .eps = 1e-6f,
                .qx_items = items,
                .qx_recs = recs};
        CHECK(cuda_test_add_norm(&t, x_out, xn_out, &same, &err) == 0, "%s", err.msg);
        CHECK(same, "%u rows of %u: passes of the cluster kernel give other bits", rows, hidden);
        for (uint32_t r = 0; r < rows; r++)
                for (uint32_t c = 0; c < chunks; c++) {
                        size_t at = r * chunks + c;
                        check_chunk(xn_out + (size_t) r * hidden + 64 * c, items + 32 * at,
                                recs + 2 * at, r, c);
                }
        free(x);
        free(part);
        free(w);
        free(x_out);
        free(xn_out);
        free(items);
        free(recs);
}

int main(void)
{
        double worst = 0;

        gpu_require();
        worst = fmax(worst, check(300, 3584, 1, true, false));
        worst = fmax(worst, check(129, 520, 2, false, false));
        worst = fmax(worst, check(2048, 96, 1, true, false));
        worst = fmax(worst, check(200, 8192, 1, false, false));
        worst = fmax(worst, check(250, 1000, 1, true, true));
        /* clusters of 16 (add_norm_ctas): each ends in a pass of 8 rows */
        worst = fmax(worst, check(200, 2048, 2, true, false));
        worst = fmax(worst, check(40, 1024, 1, false, true));
        check_quantized(1, 3584);
        check_quantized(4, 512);
        check_quantized(3, 8192);
        check_quantized(2, 2048);
        printf("add_norm: worst relative error %.3g (tolerance %g), passes bit-identical, "
               "quantized rows as specified\n",
                worst, TOL);
        return 0;
}
