/* SPDX-License-Identifier: MIT */
/* The CUDA linear paths against cpu_linear on random weights and inputs: the INT4 GEMV
 * (1..16 rows, in passes of 8; at 1 and 2 rows over long K slices with x in shared
 * memory), the dequantize + cuBLAS path (more rows), and the dense
 * FP16 paths, on shapes that are not multiples of the kernels' tiles. Tolerance: relative
 * error 3e-3 (the GPU rounds x, and on the cuBLAS path the weights, to FP16). */
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
        static const uint32_t rows[] = {1, 2, 5, 8, 13, 16, 37};
        double worst = 0;

        gpu_require();
        for (size_t s = 0; s < ELEMENTSOF(shapes); s++) {
                BkLinear l = rnd_linear(shapes[s].awq, shapes[s].in, shapes[s].out, shapes[s].gs,
                        s % 2 == 0, shapes[s].dt);
                for (size_t r = 0; r < ELEMENTSOF(rows); r++)
                        worst = fmax(worst, check(&l, rows[r]));
        }
        printf("linear: worst relative error %.3g (tolerance %g)\n", worst, TOL);
        return 0;
}
