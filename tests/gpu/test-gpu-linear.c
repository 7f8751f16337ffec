/* SPDX-License-Identifier: MIT */
/* The CUDA linear paths against cpu_linear on random weights and inputs: the INT4 GEMV
 * (1..16 rows, in passes of 8; at 1 and 2 rows over long K slices with x in shared
 * memory), the dequantize + cuBLAS path (more rows), and the dense
 * FP16 paths, on shapes that are not multiples of the kernels' tiles; and a dense MLP's
 * gate|up with silu(gate) * up, which the GEMV of paired tiles ends in. Up to 4 rows, with
 * groups of whole chunks, the INT4 GEMV is the integer one (x quantized to 16 bits a chunk
 * of 64). Tolerance: relative error 3e-3 (the GPU rounds x, and on the cuBLAS path the
 * weights, to FP16). */
#include "cpu_linear.h"
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
                l->kind == BK_LINEAR_AWQ ? "awq" : "dense", l->in, l->out, rows, e);
        free(x);
        free(want);
        free(got);
        free(scratch);
        return e;
}

/* A dense MLP's gate|up then silu(gate) * up: with paired tiles in one K slice, up to 16
 * rows, the INT4 GEMV ends in it (must_fuse says it has to); else the partials go through
 * the swiglu kernel, in the paired order where the tiles are paired (must_pair). */
static double check_gate_up(
        uint32_t in, uint32_t inter, uint32_t gs, uint32_t rows, bool must_pair, bool must_fuse)
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
        CHECK(cuda_test_gate_up(&gate, &up, x, rows, got, &paired, &fused, &err) == 0, "%s",
                err.msg);
        CHECK(paired || !must_pair, "gate_up %u->2x%u: tiles not paired", in, inter);
        CHECK(fused || !must_fuse, "gate_up %u->2x%u rows %u: not fused", in, inter, rows);
        double e = rel_err(got, g, (size_t) rows * inter);
        CHECK(e < TOL, "gate_up %u->2x%u g%u rows %u (%s): relative error %.3g", in, inter, gs,
                rows,
                fused    ? "fused"
                : paired ? "paired"
                         : "unpaired",
                e);
        free(x);
        free(g);
        free(u);
        free(got);
        free(scratch);
        return e;
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
        /* gate|up: the 7B shape (one slice: the GEMV ends in the swiglu, x in shared memory
         * at 1 and 2 rows, passes of 16 at 13); 6 chunks, one slice, group 32 (the GEMV up
         * to 16 rows, the partials at 37); 19 chunks in several slices (paired partials);
         * halves of 200 columns, not whole tiles (unpaired) */
        for (uint32_t r = 1; r <= 13; r += r < 2 ? 1 : 11)
                worst = fmax(worst, check_gate_up(3584, 18944, 128, r, true, true));
        for (size_t r = 0; r < ELEMENTSOF(rows); r++) {
                worst = fmax(worst, check_gate_up(384, 96, 32, rows[r], true, rows[r] <= 16));
                worst = fmax(worst, check_gate_up(1216, 528, 64, rows[r], true, false));
                worst = fmax(worst, check_gate_up(384, 200, 32, rows[r], false, false));
        }
        printf("linear: worst relative error %.3g (tolerance %g)\n", worst, TOL);
        return 0;
}
