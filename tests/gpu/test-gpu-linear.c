/* SPDX-License-Identifier: MIT */
/* The CUDA linear paths against cpu_linear on random weights and inputs: the INT4 GEMV
 * (1..16 rows, in passes of 8; at 1 and 2 rows over long K slices with x in shared
 * memory), the dequantize + cuBLAS path (more rows), and the dense
 * FP16 paths (on tensor cores at 2-16 rows of a wide linear), on shapes that are not multiples of
 * the kernels' tiles; a dense MLP's gate|up with silu(gate) * up, which the GEMV of paired tiles
 * ends in; and a GQA layer's q|k|v with the rope, which the GEMV ends in up to 4 rows; o and down
 * of one row ending in the residual add and the next norm, and the GEMV after them (in CTAs of 4
 * warps, and of 8 where a warp walks 10 chunks of a unit or more); the 8-bit lm_head's GEMV and its
 * FP16 copy for cuBLAS. Up to 4 rows, with groups of whole chunks, the INT4 GEMV is the integer one
 * (x quantized to 16 bits a chunk of 64). Tolerance: relative error 3e-3 (the GPU rounds x, and on
 * the cuBLAS path the weights, to FP16). */
#include "gpu_util.h"

#define TOL 3e-3

static double check(const BkLinear *l, uint32_t rows)
{
        DsError err = {0};
        float *x = rnd_f32((size_t) rows * l->in, -2.0f, 2.0f);
        float *want = (float *) rnd_alloc((size_t) rows * l->out * 4);
        float *got = (float *) rnd_alloc((size_t) rows * l->out * 4);
        float *scratch = (float *) rnd_alloc(cpu_linear_scratch_size(l) * 4);

        /* Poison: a result the kernel did not write shows as NaN. */
        for (size_t i = 0; i < (size_t) rows * l->out; i++)
                got[i] = NAN;
        cpu_linear(l, x, rows, want, scratch, NULL);
        CHECK(cuda_test_linear(l, x, rows, got, &err) == 0, "%s", err.msg);
        double e = rel_err(got, want, (size_t) rows * l->out);
        CHECK(e < TOL, "%s %u->%u rows %u: relative error %.3g",
                l->kind == BK_LINEAR_AWQ  ? "awq"
                : l->kind == BK_LINEAR_Q8 ? "q8"
                                          : "dense",
                l->in, l->out, rows, e);
        free(x);
        free(want);
        free(got);
        free(scratch);
        return e;
}

/* A row's bits do not depend on the other rows within a batch-size class: the first r rows
 * of 16 come out the same alone as with the others, r from 2 to 15 (one tile of B up to 8
 * rows, two above: one class of the tensor-core GEMVs). */
static void check_rows_alone(const BkLinear *l)
{
        DsError err = {0};
        float *x = rnd_f32((size_t) 16 * l->in, -2.0f, 2.0f);
        float *all = (float *) rnd_alloc((size_t) 16 * l->out * 4);
        float *some = (float *) rnd_alloc((size_t) 16 * l->out * 4);

        CHECK(cuda_test_linear(l, x, 16, all, &err) == 0, "%s", err.msg);
        for (uint32_t r = 2; r < 16; r += r < 8 ? 3 : 1) {
                CHECK(cuda_test_linear(l, x, r, some, &err) == 0, "%s", err.msg);
                CHECK(memcmp(some, all, (size_t) r * l->out * 4) == 0,
                        "%u->%u: the first %u of 16 rows alone give other bits", l->in, l->out, r);
        }
        free(x);
        free(all);
        free(some);
}

/* An 8-bit linear as the loader makes the lm_head: bytes in -127..127, a scale a group. */
static BkLinear rnd_q8(uint32_t in, uint32_t out, uint32_t gs)
{
        int8_t *q = (int8_t *) rnd_alloc((size_t) in * out);
        float *sc = rnd_f32((size_t) out * (in / gs), 0.5e-3f, 2e-3f);

        for (size_t i = 0; i < (size_t) in * out; i++)
                q[i] = (int8_t) ((int) (rnd_u32() % 255) - 127);
        return (BkLinear){.kind = BK_LINEAR_Q8,
                .in = in,
                .out = out,
                .group_size = gs,
                .q8 = q,
                .q8_scales = sc};
}

/* A dense MLP's gate|up then silu(gate) * up: with paired tiles in one K slice, up to 16
 * rows, the INT4 GEMV ends in it (must_fuse says it has to); else the partials go through
 * the swiglu kernel, in the paired order where the tiles are paired (must_pair). by16: one
 * row quantized by 16 k for down, as the GEMV writes it when down ends in the residual
 * add (its layout and records checked by the hook, its values here). */
static double check_gate_up(uint32_t in, uint32_t inter, uint32_t gs, uint32_t rows, bool must_pair,
        bool must_fuse, bool by16)
{
        DsError err = {0};
        BkLinear gate = rnd_linear(true, in, inter, gs, false, BK_DT_F16);
        BkLinear up = rnd_linear(true, in, inter, gs, false, BK_DT_F16);
        float *x = rnd_f32((size_t) rows * in, -2.0f, 2.0f);
        float *g = (float *) rnd_alloc((size_t) rows * inter * 4);
        float *u = (float *) rnd_alloc((size_t) rows * inter * 4);
        float *got = (float *) rnd_alloc((size_t) rows * inter * 4);
        float *scratch = (float *) rnd_alloc(cpu_linear_scratch_size(&gate) * 4);
        bool paired = false, fused = false;

        for (size_t i = 0; i < (size_t) rows * inter; i++)
                got[i] = NAN;
        cpu_linear(&gate, x, rows, g, scratch, NULL);
        cpu_linear(&up, x, rows, u, scratch, NULL);
        for (size_t i = 0; i < (size_t) rows * inter; i++)
                g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
        CHECK(cuda_test_gate_up(&gate, &up, x, rows, by16, got, &paired, &fused, &err) == 0, "%s",
                err.msg);
        CHECK(paired || !must_pair, "gate_up %u->2x%u: tiles not paired", in, inter);
        CHECK(fused || !must_fuse, "gate_up %u->2x%u rows %u: not fused", in, inter, rows);
        double e = rel_err(got, g, (size_t) rows * inter);
        CHECK(e < TOL, "gate_up %u->2x%u g%u rows %u (%s%s): relative error %.3g", in, inter, gs,
                rows,
                fused    ? "fused"
                : paired ? "paired"
                         : "unpaired",
                by16 ? ", by 16 k" : "", e);
        free(x);
        free(g);
        free(u);
        free(got);
        free(scratch);
        return e;
}

/* A GQA layer's q|k|v (heads of hd, H query and KV key/value heads) with bias, then the
 * rope, against cpu_linear and the rotation written out here: up to 4 rows (x quantized)
 * the GEMV ends in it, and gives the same bits as the GEMV's partials through the rope
 * kernel; above, the rope kernel reads the partials in the paired order. */
static double check_qkv_rope(uint32_t in, uint32_t H, uint32_t KV, uint32_t hd, uint32_t rows)
{
        DsError err = {0};
        uint32_t N = (H + 2 * KV) * hd, qd = H * hd, kvd = KV * hd;
        BkLinear l = rnd_linear(true, in, N, 128, true, BK_DT_F16);
        float *x = rnd_f32((size_t) rows * in, -2.0f, 2.0f);
        float *y = (float *) rnd_alloc((size_t) rows * N * 4);
        float *want = (float *) rnd_alloc((size_t) rows * N * 4);
        float *got[2], inv_freq[64];
        float *scratch = (float *) rnd_alloc(cpu_linear_scratch_size(&l) * 4);
        uint32_t pos[16];
        bool paired = false, fused[2] = {false, false};

        for (uint32_t i = 0; i < hd / 2; i++)
                inv_freq[i] = powf(10000.0f, -2.0f * (float) i / (float) hd);
        for (uint32_t r = 0; r < rows; r++)
                pos[r] = rnd_u32() % 4096;
        /* want: q, then k, then v, each (rows, heads * hd) */
        cpu_linear(&l, x, rows, y, scratch, NULL);
        for (uint32_t r = 0; r < rows; r++)
                for (uint32_t h = 0; h < H + 2 * KV; h++)
                        for (uint32_t i = 0; i < hd / 2; i++) {
                                const float *yr = y + (size_t) r * N + h * hd;
                                float a = yr[i], b = yr[i + hd / 2], c = 1.0f, sn = 0.0f;
                                if (h < H + KV) {
                                        c = cosf((float) pos[r] * inv_freq[i]);
                                        sn = sinf((float) pos[r] * inv_freq[i]);
                                }
                                float *o = want + (size_t) r * qd + h * hd;
                                if (h >= H + KV)
                                        o = want + (size_t) rows * (qd + kvd) + (size_t) r * kvd +
                                            (h - H - KV) * hd;
                                else if (h >= H)
                                        o = want + (size_t) rows * qd + (size_t) r * kvd +
                                            (h - H) * hd;
                                o[i] = a * c - b * sn;
                                o[i + hd / 2] = b * c + a * sn;
                        }
        for (int f = 0; f < 2; f++) {
                got[f] = (float *) rnd_alloc((size_t) rows * N * 4);
                for (size_t i = 0; i < (size_t) rows * N; i++)
                        got[f][i] = NAN;
                CHECK(cuda_test_qkv_rope(&l, H, KV, hd, inv_freq, x, pos, rows, f == 1, got[f],
                              got[f] + (size_t) rows * qd, got[f] + (size_t) rows * (qd + kvd),
                              &paired, &fused[f], &err) == 0,
                        "%s", err.msg);
                CHECK(paired, "qkv %u->%u: tiles not paired for the rope", in, N);
        }
        CHECK(!fused[0], "qkv rows %u: fused where it was not allowed", rows);
        CHECK(fused[1] == (rows <= 4), "qkv %u->%u rows %u: fused %d", in, N, rows, fused[1]);
        CHECK(memcmp(got[0], got[1], (size_t) rows * N * 4) == 0,
                "qkv %u->%u rows %u: the fused rope's bits differ from the rope kernel's", in, N,
                rows);
        double e = rel_err(got[1], want, (size_t) rows * N);
        CHECK(e < TOL, "qkv rope %u->%u hd %u rows %u: relative error %.3g", in, N, hd, rows, e);
        free(x);
        free(y);
        free(want);
        free(got[0]);
        free(got[1]);
        free(scratch);
        return e;
}

/* o or down of one row ending in the residual add and the next norm (cu_gemv_res), then
 * the integer GEMV that finishes the norm, against the CPU: h + x · W (+ bias), then
 * (w * h / rms(h)) · W' + bias' for a next linear of C columns. splits K slices (one cluster
 * a chunk of columns) of CTAs of 2 kw warps. by16: x quantized by 16 k, as gate|up hands
 * hb to down. must_wide: the next linear's GEMV has to run in its wide resident CTAs. */
static double check_res(uint32_t K, uint32_t N, uint32_t splits, uint32_t kw, bool bias, uint32_t C,
        bool by16, bool must_wide)
{
        DsError err = {0};
        const float eps = 1e-6f;
        BkLinear l = rnd_linear(true, K, N, 128, bias, BK_DT_F16);
        BkLinear c = rnd_linear(true, N, C, 128, true, BK_DT_F16);
        float *x = rnd_f32(K, -2.0f, 2.0f), *h = rnd_f32(N, -4.0f, 4.0f);
        float *w = rnd_f32(N, 0.5f, 1.5f);
        float *want_h = (float *) rnd_alloc(N * 4), *xn = (float *) rnd_alloc(N * 4);
        float *want = (float *) rnd_alloc(C * 4), *y = (float *) rnd_alloc(C * 4);
        size_t sc = cpu_linear_scratch_size(&l);
        if (cpu_linear_scratch_size(&c) > sc)
                sc = cpu_linear_scratch_size(&c);
        float *scratch = (float *) rnd_alloc(sc * 4);

        /* the linear's own sum first, then the residual, as the CPU backend adds */
        cpu_linear(&l, x, 1, want_h, scratch, NULL);
        for (uint32_t i = 0; i < N; i++)
                want_h[i] += h[i];
        cpu_norm_linear(want_h, w, N, eps, &c, xn, scratch, want);
        for (uint32_t i = 0; i < C; i++)
                y[i] = NAN;
        bool wide = false;
        CHECK(cuda_test_res(&l, splits, kw, &c, x, by16, h, w, eps, y, &wide, &err) == 0, "%s",
                err.msg);
        CHECK(wide || !must_wide, "res %u->%u, then %u->%u: not in the wide CTAs", K, N, N, C);
        double eh = rel_err(h, want_h, N), e = rel_err(y, want, C);
        CHECK(eh < TOL && e < TOL,
                "res %u->%u in %u slices of 2 x %u warps%s: residual error %.3g, next linear %.3g",
                K, N, splits, kw, by16 ? ", x by 16 k" : "", eh, e);
        free(x);
        free(h);
        free(w);
        free(want_h);
        free(xn);
        free(want);
        free(y);
        free(scratch);
        return fmax(e, eh);
}

int main(void)
{
        static const struct {
                bool awq;
                uint32_t in, out, gs;
                BkDtype dt;
        } shapes[] = {
                {true, 256, 72, 32, BK_DT_F16},
                {true, 384, 200, 128, BK_DT_F16},
                {true, 3584, 520, 128, BK_DT_F16},
                {true, 1216, 96, 64, BK_DT_F16},
                /* slices of 32 chunks: x through shared memory at 1 and 2 rows */
                {true, 16384, 200, 128, BK_DT_F16},
                {true, 16384, 72, 32, BK_DT_F16},
                {false, 172, 64, 0, BK_DT_F32},
                {false, 64, 174, 0, BK_DT_F32},
                {false, 512, 1000, 0, BK_DT_F16},
                {false, 30, 9, 0, BK_DT_F16},
                /* a tile of 16 outputs an SM or more (the H200's 132): 2-16 rows on tensor
                 * cores (cu_gemv_h16), K in 4 parts and in 1, outputs not a multiple of 16;
                 * then a K that is not a multiple of 32, which keeps the CUDA-core GEMV */
                {false, 2048, 4000, 0, BK_DT_F16},
                {false, 96, 2200, 0, BK_DT_F16},
                {false, 1000, 2200, 0, BK_DT_F16},
        };
        static const uint32_t rows[] = {1, 2, 3, 4, 5, 8, 13, 16, 37};
        double worst = 0;

        gpu_require();
        for (size_t s = 0; s < ELEMENTSOF(shapes); s++) {
                BkLinear l = rnd_linear(shapes[s].awq, shapes[s].in, shapes[s].out, shapes[s].gs,
                        s % 2 == 0, shapes[s].dt);
                for (size_t r = 0; r < ELEMENTSOF(rows); r++)
                        worst = fmax(worst, check(&l, rows[r]));
        }
        /* the tensor-core FP16 GEMV's two shapes above, K in 4 parts and in 1 */
        for (uint32_t k = 0; k < 2; k++) {
                BkLinear l = rnd_linear(false, k ? 96 : 2048, k ? 2200 : 4000, 0, false, BK_DT_F16);
                check_rows_alone(&l);
        }
        /* the 8-bit lm_head: 1-8 rows in one tile of B, 9-16 in two, 37 through cuBLAS on
         * the FP16 copy; outputs not a multiple of the 16 of a tile, groups of 32, 64, 128
         * (one to four blocks of 32 k a group, against the kernel's rounds of four) */
        {
                static const uint32_t q8[][3] = {{64, 37, 64}, {96, 100, 32}, {3584, 1000, 128},
                        {2048, 333, 128}, {160, 48, 32}, {192, 24, 64}};
                for (size_t s = 0; s < ELEMENTSOF(q8); s++) {
                        BkLinear l = rnd_q8(q8[s][0], q8[s][1], q8[s][2]);
                        for (size_t r = 0; r < ELEMENTSOF(rows); r++)
                                worst = fmax(worst, check(&l, rows[r]));
                }
        }
        /* one slice of 128 chunks (a 70B Llama's K; 36864 outputs, 1.7 waves of CTAs) at 2
         * and 4 rows: the quantized rows' copy (34.8 and 69.6 KB) does not fit beside the
         * integer GEMV's static arrays, so its x comes from L2; at 2 rows it used to be
         * copied, and the launch asked more shared memory than it may */
        {
                BkLinear l = rnd_linear(true, 8192, 36864, 128, false, BK_DT_F16);
                worst = fmax(worst, check(&l, 2));
                worst = fmax(worst, check(&l, 4));
        }
        /* gate|up: the 7B shape (one slice: the GEMV ends in the swiglu, x in shared memory
         * at 1 and 2 rows, where its 1184 CTAs' units are more than one wave, so resident
         * CTAs take them in turn; passes of 16 at 13); 6 chunks, one slice, group 32 (the GEMV up
         * to 16 rows, the partials at 37); 19 chunks in several slices (paired partials);
         * halves of 200 columns, not whole tiles (unpaired) */
        for (uint32_t r = 1; r <= 13; r += r < 2 ? 1 : 11)
                worst = fmax(worst, check_gate_up(3584, 18944, 128, r, true, true, false));
        for (size_t r = 0; r < ELEMENTSOF(rows); r++) {
                worst = fmax(
                        worst, check_gate_up(384, 96, 32, rows[r], true, rows[r] <= 16, false));
                worst = fmax(worst, check_gate_up(1216, 528, 64, rows[r], true, false, false));
                worst = fmax(worst, check_gate_up(384, 200, 32, rows[r], false, false, false));
        }
        /* one row's hb by 16 k, which only the integer GEMV makes: its resident CTAs (7B)
         * and a grid of one wave */
        worst = fmax(worst, check_gate_up(3584, 18944, 128, 1, true, true, true));
        worst = fmax(worst, check_gate_up(384, 256, 64, 1, true, true, true));
        /* q|k|v with the rope: 7B's shape (4 slices, the cluster of 4), head_dims 64 and 32,
         * and a K of 20 chunks (slices of 5 and 4 chunks) */
        for (uint32_t r = 1; r <= 5; r++) {
                worst = fmax(worst, check_qkv_rope(3584, 28, 4, 128, r));
                worst = fmax(worst, check_qkv_rope(512, 8, 2, 64, r));
                worst = fmax(worst, check_qkv_rope(1280, 4, 2, 32, r));
        }
        worst = fmax(worst, check_qkv_rope(3584, 28, 4, 128, 16));
        /* o and down ending in the residual add and the norm: both CTA widths, 1 to 4 slices
         * (clusters), a bias, slices of x in shared memory (16384 in 4 and 2 slices) and not
         * (in 1: too long for it); the GEMV after them with its slice of the quantized rows
         * in shared memory where its 40000 columns leave it one slice of 64 chunks */
        worst = fmax(worst, check_res(512, 512, 1, 5, false, 200, false, false));
        worst = fmax(worst, check_res(512, 512, 2, 3, true, 200, false, false));
        worst = fmax(worst, check_res(1152, 768, 3, 5, false, 200, false, false));
        worst = fmax(worst, check_res(1152, 768, 4, 3, true, 200, false, false));
        worst = fmax(worst, check_res(16384, 256, 4, 5, false, 200, false, false));
        worst = fmax(worst, check_res(16384, 256, 2, 3, false, 200, false, false));
        worst = fmax(worst, check_res(16384, 256, 1, 5, true, 200, false, false));
        worst = fmax(worst, check_res(512, 4096, 1, 5, false, 40000, false, false));
        /* the GEMV after them over 80 chunks of K in one slice of 1250 units, more than a
         * wave: resident CTAs of 8 warps (32B's gate|up; QX_WIDE_KW in cuda_gemv.cu) */
        worst = fmax(worst, check_res(512, 5120, 1, 5, false, 40000, false, true));
        /* down taking hb by 16 k: both widths, slices from L2 (8 and 6 chunks) and in shared
         * memory (64, and 74 at 7B's down) */
        worst = fmax(worst, check_res(512, 512, 2, 3, true, 200, true, false));
        worst = fmax(worst, check_res(1152, 768, 3, 5, false, 200, true, false));
        worst = fmax(worst, check_res(16384, 256, 4, 5, false, 200, true, false));
        worst = fmax(worst, check_res(18944, 3584, 4, 5, false, 4608, true, false));
        printf("linear: worst relative error %.3g (tolerance %g)\n", worst, TOL);
        return 0;
}
