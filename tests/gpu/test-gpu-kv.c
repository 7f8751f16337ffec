/* SPDX-License-Identifier: MIT */
/* The KV cache of the CUDA backend sized from the device's free memory, as dsd --config
 * sizes it (EngineOptions.kv_fraction): on the embedded synthetic model, a fraction
 * of 0.1 and of 0.5 gives a cache of that share of the memory that was free once the
 * weights were resident; the warm-up (graphs and cuBLAS beside the cache) and generation
 * still run; and the text is the one a default-sized cache gives. Runs alone (is_parallel
 * false): the other gpu tests' allocations would move the free memory it measures. */
#include "engine.h"
#include "gen_text.h"
#include "gpu_util.h"

static void generate(Engine *e, Collect *out)
{
        GenParams gp = {.max_tokens = 24, .sampling = {.temperature = 0, .top_p = 1}};
        GenResult res;
        DsError err = {};

        CHECK(engine_generate(e, "Once upon a time", &gp, collect, out, &res, &err) == 0, "%s",
                err.msg);
        CHECK(res.generated_tokens == 24 || res.finish == FINISH_EOS, "%u tokens, finish %s",
                res.generated_tokens, finish_reason_name(res.finish));
}

int main(void)
{
        static const double fractions[] = {0.1, 0.5};
        static Collect base, text;
        DsError err = {};

        gpu_require();
        {
                _cleanup_(engine_freep) Engine *e = NULL;
                EngineOptions eo = {.backend = "cuda", .device = "0"};
                CHECK(engine_open(test_build("models/tiny"), &eo, &e, &err) == 0, "%s", err.msg);
                generate(e, &base);
        }
        for (size_t k = 0; k < ELEMENTSOF(fractions); k++) {
                _cleanup_(engine_freep) Engine *e = NULL;
                EngineOptions eo = {.backend = "cuda", .device = "0", .kv_fraction = fractions[k]};
                uint64_t used, total;

                CHECK(engine_open(test_build("models/tiny"), &eo, &e, &err) == 0, "%s", err.msg);
                engine_memory(e, &used, &total);
                CHECK(total > used, "engine_memory: %llu of %llu bytes used",
                        (unsigned long long) used, (unsigned long long) total);
                /* what was free when the cache was sized: what is free now, and the cache */
                double block =
                        (double) e->block_tokens * (double) e->ops->kv_bytes_per_token(e->be);
                double kv = (double) e->kv.n_total * block;
                double then = (double) (total - used) + kv, want = fractions[k] * then;
                CHECK(fabs(kv - want) <= 0.01 * then,
                        "fraction %.2f: a KV cache of %.3f GB, not %.3f GB of %.3f GB free",
                        fractions[k], kv / 1e9, want / 1e9, then / 1e9);

                uint32_t prompt = 0, seqs = 0;
                CHECK(engine_warm_up(e, 32, 512, &prompt, &seqs, &err) == 0, "warm-up: %s",
                        err.msg);
                text.len = 0;
                generate(e, &text);
                CHECK(text.len == base.len && memcmp(text.buf, base.buf, base.len) == 0,
                        "fraction %.2f: the text differs from the default cache's", fractions[k]);
                printf("fraction %.2f: KV cache %.3f GB of %.3f GB free (%u blocks), warm-up of "
                       "%u-token prompts and %u sequences, the same %zu bytes of text\n",
                        fractions[k], kv / 1e9, then / 1e9, e->kv.n_total, prompt, seqs, text.len);
        }
        return 0;
}
