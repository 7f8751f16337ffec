/* SPDX-License-Identifier: MIT */
/* awq_quantize_rtn against an independent reading of the AutoAWQ GEMM layout
 * (shared/docs/formats.md): word c, nibble at bits 4i..4i+3 holds column 8c + ORDER[i];
 * and against the PyTorch-quantized fixture shared/fixtures/tiny-qwen2-awq. */
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "awq_pack.h"
#include "half.h"
#include "safetensors.h"
#include "test_util.h"

static const unsigned ORDER[8] = {0, 2, 4, 6, 1, 3, 5, 7};

/* Unpacks [rows][cols/8] words into [rows][cols] nibbles, written from the ORDER table
 * rather than from the header's REV table so that a wrong table would disagree. */
static void unpack(const uint32_t *packed, uint32_t rows, uint32_t cols, uint8_t *ret)
{
        for (uint32_t r = 0; r < rows; r++)
                for (uint32_t c = 0; c < cols / 8; c++) {
                        uint32_t word = packed[(uint64_t) r * (cols / 8) + c];
                        for (unsigned i = 0; i < 8; i++)
                                ret[(uint64_t) r * cols + 8 * c + ORDER[i]] =
                                        (word >> (4 * i)) & 0xF;
                }
}

static uint64_t rng_state;

static double uniform(void)
{
        /* splitmix64 */
        uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        z ^= z >> 31;
        return (double) (z >> 11) / 9007199254740992.0;
}

static void check_shape(uint32_t in, uint32_t out, uint32_t gs, float spread, float offset)
{
        uint32_t n_groups = in / gs;
        float *w = malloc(sizeof(float) * in * out);
        uint32_t *qw = malloc(sizeof(uint32_t) * in * (out / 8));
        uint32_t *qz = malloc(sizeof(uint32_t) * n_groups * (out / 8));
        uint16_t *sc = malloc(sizeof(uint16_t) * n_groups * out);
        uint8_t *q = malloc((size_t) in * out);
        uint8_t *z = malloc((size_t) n_groups * out);
        CHECK(w && qw && qz && sc && q && z, "out of memory");

        for (uint64_t i = 0; i < (uint64_t) in * out; i++)
                w[i] = (float) ((uniform() - 0.5) * spread + offset);
        /* One constant group (range below the 1e-5 floor) exercises that floor. */
        for (uint32_t i = 0; i < gs; i++)
                w[i] = 0.0f;

        CHECK(awq_quantize_rtn(w, in, out, gs, qw, qz, sc) == 0, "quantize %ux%u gs %u", in, out,
                gs);
        unpack(qw, in, out, q);
        unpack(qz, n_groups, out, z);

        for (uint32_t n = 0; n < out; n++)
                for (uint32_t g = 0; g < n_groups; g++) {
                        float mn = INFINITY, mx = -INFINITY;
                        for (uint32_t i = 0; i < gs; i++) {
                                float v = w[(uint64_t) n * in + g * gs + i];
                                mn = fminf(mn, v);
                                mx = fmaxf(mx, v);
                        }
                        float s = f16_to_f32(sc[(uint64_t) g * out + n]);
                        float want_s = fmaxf(mx - mn, 1e-5f) / 15.0f;
                        /* Half an fp16 ulp, or of the subnormal step 2^-24 for the 1e-5 floor. */
                        CHECK(s > 0 && fabsf(s - want_s) <= want_s / 2048 + 3e-8f,
                                "scale %g, want %g", s, want_s);
                        unsigned zv = z[(uint64_t) g * out + n];
                        CHECK(zv <= 15, "zero out of range");
                        CHECK(zv == (unsigned) fmaxf(0.0f, fminf(15.0f, -nearbyintf(mn / s))),
                                "zero %u for min %g scale %g", zv, mn, s);
                        /* Min-max quantization with a zero point is exact to half a step
                         * only when the group's range holds 0, so that the zero is not
                         * clamped; otherwise the result saturates, as in AutoAWQ. */
                        bool straddles = mn <= 0 && mx >= 0;

                        for (uint32_t i = 0; i < gs; i++) {
                                uint32_t k = g * gs + i;
                                float v = w[(uint64_t) n * in + k];
                                unsigned qv = q[(uint64_t) k * out + n];
                                float deq = ((float) qv - (float) z[(uint64_t) g * out + n]) * s;
                                /* fp16 rounding of s can move the grid by up to 15 * s * 2^-11. */
                                float tol = s / 2 + 16 * s / 2048 + 1e-7f;

                                CHECK(qv <= 15, "q out of range");
                                CHECK(qv == (unsigned) fmaxf(0.0f,
                                                    fminf(15.0f, nearbyintf(v / s) + (float) zv)),
                                        "q %u for w %g scale %g zero %u", qv, v, s, zv);
                                CHECK(!straddles || fabsf(deq - v) <= tol,
                                        "w[%u][%u] = %g dequantized to %g (scale %g, gs %u)", n, k,
                                        v, deq, s, gs);
                                CHECK(awq_weight(qw, qz, sc, out, gs, k, n) == deq,
                                        "awq_weight disagrees at [%u][%u]", k, n);
                                CHECK(awq_nibble(qw, out, k, n) == qv,
                                        "awq_nibble disagrees at [%u][%u]", k, n);
                        }
                }

        free(w);
        free(qw);
        free(qz);
        free(sc);
        free(q);
        free(z);
}

/* A hand-built case: column j of one row holds value j, so the packed word is fixed. */
static void check_known_word(void)
{
        float w[8 * 32];
        uint32_t qw[32], qz[1];
        uint16_t sc[8];

        /* Every output spans 0..15 (scale 1, zero 0) and holds its own index at input 1. */
        for (uint32_t n = 0; n < 8; n++)
                for (uint32_t k = 0; k < 32; k++)
                        w[n * 32 + k] = k == 0 ? 0.0f : k == 1 ? (float) n : 15.0f;
        CHECK(awq_quantize_rtn(w, 32, 8, 32, qw, qz, sc) == 0, "quantize known");
        for (uint32_t n = 0; n < 8; n++)
                CHECK(f16_to_f32(sc[n]) == 1.0f, "scale of column %u is %g", n, f16_to_f32(sc[n]));
        CHECK(qz[0] == 0, "zeros 0x%08x", qz[0]);
        /* Row 1: column j holds j; nibble i holds column ORDER[i]. */
        CHECK(qw[1] == 0x75316420u, "row 1 packed as 0x%08x", qw[1]);
        CHECK(qw[2] == 0xFFFFFFFFu, "row 2 packed as 0x%08x", qw[2]);
}

static void check_errors(void)
{
        float w[16 * 24] = {0};
        uint32_t qw[64], qz[64];
        uint16_t sc[128];

        CHECK(awq_quantize_rtn(w, 24, 16, 16, qw, qz, sc) == -EINVAL, "in %% gs != 0 accepted");
        CHECK(awq_quantize_rtn(w, 16, 12, 16, qw, qz, sc) == -EINVAL, "out %% 8 != 0 accepted");
        CHECK(awq_quantize_rtn(w, 16, 16, 0, qw, qz, sc) == -EINVAL, "gs 0 accepted");
        CHECK(awq_quantize_rtn(w, 0, 16, 16, qw, qz, sc) == -EINVAL, "in 0 accepted");
        CHECK(awq_quantize_rtn(w, 16, 0, 16, qw, qz, sc) == -EINVAL, "out 0 accepted");
        CHECK(awq_quantize_rtn(NULL, 16, 16, 16, qw, qz, sc) == -EINVAL, "NULL w accepted");
}

static const StTensor *find(const StTensor *t, size_t n, const char *name)
{
        for (size_t i = 0; i < n; i++)
                if (!strcmp(t[i].name, name))
                        return &t[i];
        return NULL;
}

/* The fixture's layers were quantized by mkfix.py in PyTorch. Dequantizing one and
 * quantizing the result again must give back the same q, zero and scale in every group
 * whose q spans 0..15 (then min and max, hence scale and zero, are recovered exactly);
 * in the other groups the range legitimately shrinks. */
static void check_fixture_requantizes(void)
{
        const char *path = test_shared("fixtures/tiny-qwen2-awq/model.safetensors");
        StFile *f = NULL;
        DsError err = {0};
        size_t n, n_linears = 0, spanning = 0, groups = 0;

        CHECK(st_file_open(path, &f, &err) == 0, "%s", err.msg);
        const StTensor *t = st_file_tensors(f, &n);

        for (size_t i = 0; i < n; i++) {
                size_t len = strlen(t[i].name);
                char name[256];
                if (len < 8 || strcmp(t[i].name + len - 8, ".qweight"))
                        continue;
                snprintf(name, sizeof(name), "%.*s.qzeros", (int) (len - 8), t[i].name);
                const StTensor *tz = find(t, n, name);
                snprintf(name, sizeof(name), "%.*s.scales", (int) (len - 8), t[i].name);
                const StTensor *ts = find(t, n, name);
                CHECK(tz && ts, "%s: no qzeros or scales", t[i].name);

                uint32_t in = (uint32_t) t[i].shape[0], out = (uint32_t) t[i].shape[1] * 8;
                uint32_t ng = (uint32_t) tz->shape[0], gs = in / ng;
                uint32_t *qw = malloc(t[i].n_bytes), *qz = malloc(tz->n_bytes),
                         *qw2 = malloc(t[i].n_bytes);
                uint32_t *qz2 = malloc(tz->n_bytes);
                uint16_t *sc = malloc(ts->n_bytes), *sc2 = malloc(ts->n_bytes);
                uint8_t *q = malloc((size_t) in * out), *z = malloc((size_t) ng * out);
                uint8_t *q2 = malloc((size_t) in * out), *z2 = malloc((size_t) ng * out);
                float *w = malloc(sizeof(float) * in * out);
                CHECK(qw && qz && qw2 && qz2 && sc && sc2 && q && z && q2 && z2 && w,
                        "out of memory");
                memcpy(qw, t[i].data, t[i].n_bytes);
                memcpy(qz, tz->data, tz->n_bytes);
                memcpy(sc, ts->data, ts->n_bytes);

                unpack(qw, in, out, q);
                unpack(qz, ng, out, z);
                for (uint32_t k = 0; k < in; k++)
                        for (uint32_t o = 0; o < out; o++)
                                w[(uint64_t) o * in + k] =
                                        ((float) q[(uint64_t) k * out + o] -
                                                (float) z[(uint64_t) (k / gs) * out + o]) *
                                        f16_to_f32(sc[(uint64_t) (k / gs) * out + o]);
                CHECK(awq_quantize_rtn(w, in, out, gs, qw2, qz2, sc2) == 0, "%s: quantize",
                        t[i].name);
                unpack(qw2, in, out, q2);
                unpack(qz2, ng, out, z2);

                for (uint32_t g = 0; g < ng; g++)
                        for (uint32_t o = 0; o < out; o++) {
                                unsigned lo = 15, hi = 0;
                                for (uint32_t k = g * gs; k < (g + 1) * gs; k++) {
                                        lo = MIN(lo, q[(uint64_t) k * out + o]);
                                        hi = MAX(hi, q[(uint64_t) k * out + o]);
                                }
                                groups++;
                                if (lo != 0 || hi != 15)
                                        continue;
                                spanning++;
                                CHECK(sc2[(uint64_t) g * out + o] == sc[(uint64_t) g * out + o] &&
                                                z2[(uint64_t) g * out + o] ==
                                                        z[(uint64_t) g * out + o],
                                        "%s group %u column %u: scale or zero differs", t[i].name,
                                        g, o);
                                for (uint32_t k = g * gs; k < (g + 1) * gs; k++)
                                        CHECK(q2[(uint64_t) k * out + o] ==
                                                        q[(uint64_t) k * out + o],
                                                "%s [%u][%u]: q %u, the fixture has %u", t[i].name,
                                                k, o, q2[(uint64_t) k * out + o],
                                                q[(uint64_t) k * out + o]);
                        }
                n_linears++;
                free(qw);
                free(qz);
                free(qw2);
                free(qz2);
                free(sc);
                free(sc2);
                free(q);
                free(z);
                free(q2);
                free(z2);
                free(w);
        }
        st_file_free(f);
        CHECK(n_linears == 14, "%zu quantized linears in %s", n_linears, path);
        /* Most groups span the full range; a check over a handful would prove little. */
        CHECK(spanning * 10 > groups * 9, "only %zu of %zu groups span 0..15", spanning, groups);
}

int main(void)
{
        rng_state = 42;
        check_known_word();
        check_errors();
        check_shape(128, 64, 32, 0.1f, 0.0f);
        check_shape(256, 48, 64, 2.0f, 0.5f);
        check_shape(384, 40, 128, 0.04f, 0.0f);
        /* All-positive and all-negative groups push the zero point to its clamps. */
        check_shape(256, 16, 128, 0.01f, 1.0f);
        check_shape(256, 16, 128, 0.01f, -1.0f);
        check_fixture_requantizes();
        return 0;
}
