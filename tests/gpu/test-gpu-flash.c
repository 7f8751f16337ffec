/* SPDX-License-Identifier: MIT */
/* The tensor-core prefill attention (cuda_flash.cu) against a float64 reference on random
 * queries and a random paged FP16 cache with a scattered block table: chunks of 1, 7, 129
 * and 300 rows starting at position 0 and mid-sequence (mid-block too), GQA groups of 1,
 * 5 and 7, head_dim 128 and 64, blocks of 16 and 24 positions. The output is poisoned
 * (NaN) before each run. Tolerance: relative error 4e-3 over the whole output and 1.5e-2
 * for each (row, head) vector; the kernel rounds q and the softmax weights to FP16 (about
 * 5e-4 each), while a row that saw one position too many or too few is off by about
 * 1 / (its position + 1). Each chunk also runs cut into tasks differently (an odd first
 * task): a row's output must not change by a bit. */
#include "gpu_util.h"

#define TOL     4e-3
#define ROW_TOL 1.5e-2

static float f16(uint16_t h)
{
        return f16_to_f32(h);
}

/* out (n, n_heads * hd) in double from the float32 q and the FP16 cache, widened into k
 * and v. */
static void reference(
        const CudaFlashTest *t, const float *q, const float *k, const float *v, double *out)
{
        uint32_t hd = t->head_dim, g = t->n_heads / t->n_kv_heads, kvd = t->n_kv_heads * hd;
        uint32_t ctx = t->pos + t->n;
        double *s = (double *) rnd_alloc((size_t) ctx * sizeof(double));
        double scale = 1.0 / sqrt((double) hd);

        for (uint32_t i = 0; i < t->n; i++)
                for (uint32_t h = 0; h < t->n_heads; h++) {
                        const float *qr = q + ((size_t) i * t->n_heads + h) * hd;
                        size_t kv_off = (size_t) (h / g) * hd;
                        uint32_t last = t->pos + i;
                        double m = -INFINITY, l = 0;
                        for (uint32_t p = 0; p <= last; p++) {
                                size_t slot =
                                        (size_t) t->blocks[p / t->block_tokens] * t->block_tokens +
                                        p % t->block_tokens;
                                const float *kr = k + slot * kvd + kv_off;
                                double d = 0;
                                for (uint32_t e = 0; e < hd; e++)
                                        d += (double) qr[e] * kr[e];
                                s[p] = d * scale;
                                m = fmax(m, s[p]);
                        }
                        double *o = out + ((size_t) i * t->n_heads + h) * hd;
                        for (uint32_t e = 0; e < hd; e++)
                                o[e] = 0;
                        for (uint32_t p = 0; p <= last; p++) {
                                size_t slot =
                                        (size_t) t->blocks[p / t->block_tokens] * t->block_tokens +
                                        p % t->block_tokens;
                                const float *vr = v + slot * kvd + kv_off;
                                double w = exp(s[p] - m);
                                l += w;
                                for (uint32_t e = 0; e < hd; e++)
                                        o[e] += w * vr[e];
                        }
                        for (uint32_t e = 0; e < hd; e++)
                                o[e] /= l;
                }
        free(s);
}

static double check(uint32_t hd, uint32_t n_kv, uint32_t g, uint32_t bt, uint32_t pos, uint32_t n,
        float q_scale)
{
        DsError err = {0};
        uint32_t ctx = pos + n, n_blocks = (ctx + bt - 1) / bt, cache_blocks = n_blocks + 5;
        cache_blocks += cache_blocks % 7 == 0; /* coprime with the stride below */
        uint32_t n_heads = n_kv * g, q_dim = n_heads * hd;
        size_t cache = (size_t) cache_blocks * bt * n_kv * hd, out_n = (size_t) n * q_dim;
        uint32_t *blocks = (uint32_t *) rnd_alloc(n_blocks * 4);

        /* a scattered table over a cache with blocks nobody uses (random too) */
        for (uint32_t i = 0; i < n_blocks; i++)
                blocks[i] = (i * 7 + 3) % cache_blocks;
        for (uint32_t i = 0; i < n_blocks; i++)
                for (uint32_t j = 0; j < i; j++)
                        CHECK(blocks[i] != blocks[j], "test block table repeats itself");
        uint16_t *k = rnd_f16(cache, -1.0f, 1.0f), *v = rnd_f16(cache, -1.0f, 1.0f);
        float *q = rnd_f32(out_n, -q_scale, q_scale);
        float *kf = (float *) rnd_alloc(cache * 4), *vf = (float *) rnd_alloc(cache * 4);
        for (size_t i = 0; i < cache; i++) {
                kf[i] = f16(k[i]);
                vf[i] = f16(v[i]);
        }
        uint16_t *got = (uint16_t *) rnd_alloc(out_n * 2),
                 *got2 = (uint16_t *) rnd_alloc(out_n * 2);
        double *want = (double *) rnd_alloc(out_n * sizeof(double));
        CudaFlashTest t = {.n_heads = n_heads,
                .n_kv_heads = n_kv,
                .head_dim = hd,
                .block_tokens = bt,
                .cache_blocks = cache_blocks,
                .blocks = blocks,
                .n_blocks = n_blocks,
                .pos = pos,
                .n = n,
                .first = 64};

        for (size_t i = 0; i < out_n; i++)
                got[i] = got2[i] = 0x7e00; /* NaN */
        CHECK(cuda_test_flash(&t, q, k, v, got, &err) == 0, "%s", err.msg);
        t.first = 1 + (n * 13 + pos) % 63;
        CHECK(cuda_test_flash(&t, q, k, v, got2, &err) == 0, "%s", err.msg);
        CHECK(memcmp(got, got2, out_n * 2) == 0,
                "hd %u g %u pos %u n %u: the output depends on how the rows are cut into tasks", hd,
                g, pos, n);
        reference(&t, q, kf, vf, want);

        double d = 0, r = 0, worst_row = 0;
        for (size_t i = 0; i < out_n; i += hd) {
                double dr = 0, rr = 0;
                for (uint32_t e = 0; e < hd; e++) {
                        double x = f16(got[i + e]), y = want[i + e];
                        CHECK(isfinite(x), "hd %u g %u pos %u n %u: row %zu not written", hd, g,
                                pos, n, i / q_dim);
                        dr += (x - y) * (x - y);
                        rr += y * y;
                }
                d += dr;
                r += rr;
                worst_row = fmax(worst_row, sqrt(dr / rr));
        }
        double e = sqrt(d / r);
        CHECK(e < TOL && worst_row < ROW_TOL,
                "hd %u group %u bt %u pos %u n %u: relative error %.3g, worst (row, head) %.3g", hd,
                g, bt, pos, n, e, worst_row);
        free(blocks);
        free(k);
        free(v);
        free(kf);
        free(vf);
        free(q);
        free(got);
        free(got2);
        free(want);
        return e;
}

int main(void)
{
        static const uint32_t groups[] = {1, 5, 7}, lens[] = {1, 7, 129, 300},
                              starts[] = {0, 45, 301};
        double worst = 0;

        gpu_require();
        for (size_t gi = 0; gi < ELEMENTSOF(groups); gi++)
                for (size_t li = 0; li < ELEMENTSOF(lens); li++)
                        for (size_t si = 0; si < ELEMENTSOF(starts); si++) {
                                uint32_t bt = gi == 1 ? 24 : 16;
                                worst = fmax(worst,
                                        check(128, 2, groups[gi], bt, starts[si], lens[li], 2.0f));
                        }
        /* peaked softmax (large scores), head_dim 64 */
        worst = fmax(worst, check(128, 1, 7, 16, 45, 129, 12.0f));
        worst = fmax(worst, check(64, 2, 5, 16, 45, 300, 2.0f));
        worst = fmax(worst, check(64, 3, 1, 24, 0, 7, 2.0f));
        printf("flash: worst relative error %.3g (tolerance %g, per row %g)\n", worst, TOL,
                ROW_TOL);
        return 0;
}
