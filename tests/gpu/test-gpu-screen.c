/* SPDX-License-Identifier: MIT */
/* The screened lm_head (kernels/cuda/cuda_screen.cu) picks the id the FP16 lm_head picks: on
 * random dense FP16 lm_heads (groups of 32, 64 and 128; outputs not a multiple of 16; a
 * sampled vocabulary shorter than the outputs), every row's FP16 logit is at most the upper
 * bound of its 8-bit logit, and the screened id equals the argmax, lowest id on a tie, of
 * the FP16 logits that one row gets without the screen, for many inputs; also where the
 * largest logit is tied by a copy of its row before it, where a row differs from the largest
 * by one FP16 step of one weight, where rows' scales differ by a thousandfold, and where
 * every row is the same (every row rescored, more than a block lists); and where the 8-bit
 * copy's errors are near their bound and reverse two rows' order. */
#include <errno.h>

#include "gpu_util.h"

/* The largest of y[0..vocab), the lowest id on a tie. */
static int32_t argmax(const float *y, uint32_t vocab)
{
        int32_t best = 0;
        for (uint32_t i = 1; i < vocab; i++)
                if (y[i] > y[best])
                        best = (int32_t) i;
        return best;
}

/* Rows whose upper bound reached the largest FP16 logit, what the screen had to rescore at
 * least, of the rows screened, over the random inputs (counting). */
static uint64_t doubtful, screened;
static bool counting;

static int32_t screen(const BkLinear *l, const float *x, uint32_t vocab, float *y)
{
        DsError err = {0};
        int32_t id = -1;
        float *hi = (float *) rnd_alloc((size_t) l->out * 4);
        for (uint32_t i = 0; i < l->out; i++)
                y[i] = hi[i] = NAN;
        CHECK(cuda_test_screen(l, x, vocab, &id, y, hi, &err) == 0, "%s", err.msg);
        float top = y[argmax(y, vocab)];
        for (uint32_t i = 0; i < l->out; i++) {
                CHECK(isfinite(y[i]), "%u->%u: FP16 logit %u is %g", l->in, l->out, i, y[i]);
                CHECK(hi[i] >= y[i], "%u->%u: row %u: FP16 logit %.9g above its upper bound %.9g",
                        l->in, l->out, i, y[i], hi[i]);
                doubtful += counting && i < vocab && hi[i] >= top;
        }
        screened += counting ? vocab : 0;
        free(hi);
        return id;
}

static void check(const BkLinear *l, const float *x, uint32_t vocab, const char *what)
{
        float *y = (float *) rnd_alloc((size_t) l->out * 4);
        int32_t id = screen(l, x, vocab, y), want = argmax(y, vocab);
        CHECK(id == want, "%s, %u->%u vocab %u: screened id %d (logit %.9g), FP16 argmax %d (%.9g)",
                what, l->in, l->out, vocab, id, id >= 0 && (uint32_t) id < l->out ? y[id] : NAN,
                want, y[want]);
        free(y);
}

/* Row dst of l's FP16 weights = row src, plus (delta) one FP16 step at weight k. */
static void copy_row(BkLinear *l, uint32_t src, uint32_t dst, uint32_t k, int delta)
{
        uint16_t *w = (uint16_t *) l->w.data;
        memcpy(w + (size_t) dst * l->in, w + (size_t) src * l->in, (size_t) l->in * 2);
        w[(size_t) dst * l->in + k] = (uint16_t) (w[(size_t) dst * l->in + k] + delta);
}

int main(void)
{
        static const struct {
                uint32_t in, out, vocab;
        } shapes[] = {
                {2048, 6407, 6400},                    /* groups of 128 */
                {3584, 20000, 19997}, {96, 1000, 990}, /* groups of 32 */
                {192, 3000, 3000},                     /* groups of 64 */
        };
        uint32_t draws = 0;

        gpu_require();
        for (size_t s = 0; s < ELEMENTSOF(shapes); s++) {
                uint32_t K = shapes[s].in, N = shapes[s].out, V = shapes[s].vocab;
                BkLinear l = rnd_linear(false, K, N, 0, false, BK_DT_F16);
                float *y = (float *) rnd_alloc((size_t) N * 4);

                counting = true;
                for (uint32_t d = 0; d < 12; d++, draws++) {
                        float *x = rnd_f32(K, -2.0f, 2.0f);
                        check(&l, x, V, "random");
                        free(x);
                }
                counting = false;

                /* ties and near ties with the largest logit */
                float *x = rnd_f32(K, -2.0f, 2.0f);
                int32_t top = screen(&l, x, V, y);
                uint32_t low = (uint32_t) top / 2, high = MIN(V - 1, (uint32_t) top + 7);
                copy_row(&l, (uint32_t) top, low, 0, 0);
                check(&l, x, V, "a copy of the largest row before it");
                copy_row(&l, (uint32_t) top, high, K / 2, 1);
                check(&l, x, V, "a row one FP16 step from the largest");
                copy_row(&l, (uint32_t) top, low, K - 1, -1);
                check(&l, x, V, "the copy one FP16 step lower");
                free(x);

                /* rows scaled a thousandfold apart: the bound is a row's own */
                uint16_t *w = (uint16_t *) l.w.data;
                for (uint32_t n = 0; n < N; n += 3)
                        for (uint32_t k = 0; k < K; k++)
                                w[(size_t) n * K + k] =
                                        f32_to_f16(f16_to_f32(w[(size_t) n * K + k]) * 1e-3f);
                for (uint32_t d = 0; d < 4; d++, draws++) {
                        x = rnd_f32(K, -8.0f, 8.0f);
                        check(&l, x, V, "rows of scales a thousandfold apart");
                        free(x);
                }

                /* every row the same: each is rescored, past what a block lists */
                for (uint32_t n = 1; n < N; n++)
                        copy_row(&l, 0, n, 0, 0);
                x = rnd_f32(K, -2.0f, 2.0f);
                check(&l, x, V, "every row the same");
                CHECK(screen(&l, x, V, y) == 0, "every row the same: not id 0");
                free(x);
                free(y);
                printf("%u->%u vocab %u: screened ids == FP16 argmax\n", K, N, V);
        }

        /* The 8-bit copy's errors near their bound: x = 1, groups of 128 whose first weight,
         * 127 s, sets the scale s = 2^-10, and whose others round down by 0.49 s in row A
         * (3.49 s) and up by 0.49 s in row B (3.51 s and 2.51 s in alternate groups). B's
         * 8-bit logit is 0.5 s a weight above A's, its FP16 one 0.48 s below: A, at the
         * higher id, must win. The other rows are small. A's FP16 logit is 0.49 s a weight
         * (127/128 of X) above its 8-bit one, which screen() checks against the bound. */
        {
                uint32_t K = 2048, N = 4000, A = 3000, B = 1000;
                BkLinear l = rnd_linear(false, K, N, 0, false, BK_DT_F16);
                uint16_t *w = (uint16_t *) l.w.data;
                float s = 1.0f / 1024.0f, *xo = (float *) rnd_alloc((size_t) K * 4);
                float *y = (float *) rnd_alloc((size_t) N * 4);
                for (size_t i = 0; i < (size_t) K * N; i++)
                        w[i] = f32_to_f16(f16_to_f32(w[i]) * 1e-3f);
                for (uint32_t k = 0; k < K; k++) {
                        bool first = k % 128 == 0, even = k / 128 % 2 == 0;
                        w[(size_t) A * K + k] = f32_to_f16((first ? 127.0f : 3.49f) * s);
                        w[(size_t) B * K + k] = f32_to_f16((first         ? 127.0f
                                                                   : even ? 3.51f
                                                                          : 2.51f) *
                                                           s);
                        xo[k] = 1.0f;
                }
                CHECK(screen(&l, xo, N, y) == (int32_t) A && argmax(y, N) == (int32_t) A,
                        "the 8-bit copy's order reversed: row %u's FP16 logit %.6g, row %u's %.6g",
                        A, y[A], B, y[B]);
                free(xo);
                free(y);
                printf("rows whose 8-bit logits err by 0.49 s a weight, in opposite directions: "
                       "the FP16 order kept\n");
        }

        /* a shape the screen does not take says so */
        DsError err = {0};
        int32_t id;
        BkLinear odd = rnd_linear(false, 100, 64, 0, false, BK_DT_F16);
        float *x = rnd_f32(100, -1.0f, 1.0f), y[64];
        CHECK(cuda_test_screen(&odd, x, 64, &id, y, NULL, &err) == -ENOTSUP &&
                        strstr(err.msg, "in 100"),
                "in 100: %s", err.msg);
        free(x);
        printf("%u random inputs and the crafted ties: screened ids == FP16 argmax; %llu of "
               "%llu rows' upper bounds reached the largest logit\n",
                draws, (unsigned long long) doubtful, (unsigned long long) screened);
        return 0;
}
