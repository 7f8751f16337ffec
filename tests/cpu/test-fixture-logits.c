/* SPDX-License-Identifier: MIT */
/* The CPU backend against transformers: one forward pass over golden.json's 48 input ids
 * matches golden_logits.f32 to ‖out−ref‖/‖ref‖ < 1e-4 for each tiny fixture, and feeding
 * the same prompt in chunks of other sizes gives the same last-position logits. */
#include "cpu_fixture.h"

static const char *const fixtures[] = {
        "fixtures/tiny-qwen2-awq",
        "fixtures/tiny-llama-awq",
        "fixtures/tiny-llama-awq-sharded",
};

/* Feeds ids in chunks of chunk tokens; returns the last position's logits in last. */
static void run_chunked(Fixture *f, const Golden *g, uint32_t chunk, float *last, float *tmp)
{
        fix_kv_reset(f);
        for (uint32_t pos = 0; pos < g->n_input; pos += chunk) {
                uint32_t n = MIN(chunk, g->n_input - pos);
                fix_step(f, g->input_ids + pos, n, pos, tmp, false);
                if (pos + n == g->n_input)
                        memcpy(last, tmp + (size_t) (n - 1) * f->vocab, f->vocab * sizeof(float));
        }
}

static void check_fixture(const char *dir)
{
        Fixture f = fix_open(dir);
        Golden g = fix_golden(dir, f.vocab);
        size_t n = (size_t) g.n_input * f.vocab;
        float *out = calloc(n, sizeof(float));
        float *last = calloc(f.vocab, sizeof(float));
        float *tmp = calloc(n, sizeof(float));
        CHECK(out && last && tmp, "out of memory");

        /* One pass over all 48 tokens. */
        fix_kv_reset(&f);
        fix_step(&f, g.input_ids, g.n_input, 0, out, false);
        double e = fix_rel_err(out, g.logits, n);
        printf("%s: rel err %.3g over %u positions\n", dir, e, g.n_input);
        CHECK(e < 1e-4, "%s: rel err %g", dir, e);

        /* The same prompt in chunks: 5 + 43, 7 at a time, one at a time. */
        const float *ref_last = out + (size_t) (g.n_input - 1) * f.vocab;
        const uint32_t chunks[] = {5, 7, 1};
        for (size_t i = 0; i < ELEMENTSOF(chunks); i++) {
                if (chunks[i] == 5) {
                        fix_kv_reset(&f);
                        fix_step(&f, g.input_ids, 5, 0, NULL, false);
                        fix_step(&f, g.input_ids + 5, g.n_input - 5, 5, tmp, false);
                        memcpy(last, tmp + (size_t) (g.n_input - 6) * f.vocab,
                                f.vocab * sizeof(float));
                } else
                        run_chunked(&f, &g, chunks[i], last, tmp);
                double c = fix_rel_err(last, ref_last, f.vocab);
                printf("%s: chunks of %u: last-position rel diff %.3g\n", dir, chunks[i], c);
                CHECK(c < 1e-5, "%s: chunks of %u differ by %g", dir, chunks[i], c);
        }

        free(out);
        free(last);
        free(tmp);
        fix_golden_free(&g);
        fix_close(&f);
}

int main(void)
{
        for (size_t i = 0; i < ELEMENTSOF(fixtures); i++)
                check_fixture(test_shared(fixtures[i]));
        return 0;
}
