/* SPDX-License-Identifier: MIT */
/* cpu_rope_init against transformers 5.17's rope init functions (default, llama3, yarn):
 * rope-reference.json holds their float32 inv_freq bits and attention factors, written by
 * rope-reference.py. Each frequency must agree to 2 ulp (powf and PyTorch's pow may differ
 * in the last bit); the count of bit-exact ones is printed. */
#include <math.h>
#include <string.h>

#include "cpu_fixture.h"
#include "cpu_rope.h"
#include "half.h"

static const struct {
        const char *name;
        BkRope rope;
        uint32_t head_dim;
} cases[] = {
        {"default", {.type = BK_ROPE_DEFAULT, .theta = 10000}, 128},
        {"llama3",
                {.type = BK_ROPE_LLAMA3,
                        .theta = 500000,
                        .factor = 8,
                        .low_freq_factor = 1,
                        .high_freq_factor = 4,
                        .original_max_pos = 8192},
                128},
        {"yarn",
                {.type = BK_ROPE_YARN,
                        .theta = 1e6f,
                        .factor = 4,
                        .original_max_pos = 32768,
                        .beta_fast = 32,
                        .beta_slow = 1,
                        .attention_factor = (float) (0.1 * 1.3862943611198906 + 1)},
                128},
        {"yarn64",
                {.type = BK_ROPE_YARN,
                        .theta = 10000,
                        .factor = 40,
                        .original_max_pos = 4096,
                        .beta_fast = 32,
                        .beta_slow = 1,
                        .attention_factor = (float) (0.1 * 3.6888794541139363 + 1)},
                64},
};

int main(void)
{
        char path[4096];
        size_t len;

        snprintf(path, sizeof(path), "%s/tests/cpu/rope-reference.json", getenv("DSD_SOURCE"));
        char *text = fix_read_file(path, &len);
        cJSON *root = cJSON_Parse(text);
        CHECK(root, "%s: not JSON", path);

        for (size_t c = 0; c < ELEMENTSOF(cases); c++) {
                const cJSON *ref = cJSON_GetObjectItemCaseSensitive(root, cases[c].name);
                const cJSON *bits = cJSON_GetObjectItemCaseSensitive(ref, "inv_freq_bits");
                uint32_t half_dim = cases[c].head_dim / 2, exact = 0;
                float inv_freq[64], factor;
                DsError err = {0};

                CHECK(cJSON_GetArraySize(bits) == (int) half_dim, "%s: size", cases[c].name);
                CHECK(cpu_rope_init(&cases[c].rope, cases[c].head_dim, inv_freq, &factor, &err) ==
                                0,
                        "%s: %s", cases[c].name, err.msg);
                for (uint32_t i = 0; i < half_dim; i++) {
                        uint32_t want = (uint32_t) cJSON_GetArrayItem(bits, (int) i)->valuedouble;
                        uint32_t got = f32_to_bits(inv_freq[i]);
                        uint32_t ulp = got > want ? got - want : want - got;
                        CHECK(ulp <= 2, "%s: inv_freq[%u] = %a, transformers %a", cases[c].name, i,
                                inv_freq[i], f32_from_bits(want));
                        exact += ulp == 0;
                }
                double want_factor =
                        cJSON_GetObjectItemCaseSensitive(ref, "attention_factor")->valuedouble;
                CHECK(fabs(factor - want_factor) < 1e-6, "%s: attention factor %g, transformers %g",
                        cases[c].name, factor, want_factor);
                printf("%s: %u of %u inv_freq bit-exact, the rest within 2 ulp\n", cases[c].name,
                        exact, half_dim);
        }
        cJSON_Delete(root);
        free(text);
        return 0;
}
