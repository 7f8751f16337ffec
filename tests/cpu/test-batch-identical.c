/* SPDX-License-Identifier: MIT */
/* A sequence's logits and sampled ids do not depend on the batch it runs in: 8 sequences
 * of different lengths and sampling settings, each run alone (whole prompt, then one token
 * per step), then all together (staggered starts, prompts fed in chunks next to other
 * sequences' decode tokens, shuffled non-contiguous KV blocks), compared with memcmp. */
#include "cpu_fixture.h"

#define N_SEQS         8
#define N_DECODE       16
#define PROMPT_MAX     40
#define POS_MAX        (PROMPT_MAX + N_DECODE + 1)
#define BLOCKS_PER_SEQ ((POS_MAX + FIX_BLOCK_TOKENS - 1) / FIX_BLOCK_TOKENS)

typedef struct Trace {
        int32_t tokens[POS_MAX]; /* prompt, then the sampled ids fed back */
        uint32_t n_prompt;
        int32_t sampled[N_DECODE + 1];
        float *logits; /* (POS_MAX, vocab) of every position fed */
        BkSampling sampling;
        uint32_t chunk; /* prompt tokens per step in the batched run */
        uint32_t start; /* the batched step at which it joins */
        uint32_t blocks[BLOCKS_PER_SEQ];
} Trace;

static uint32_t rng_state = 12345;

static uint32_t rng(void)
{
        rng_state = rng_state * 1664525u + 1013904223u;
        return rng_state >> 8;
}

static void make_traces(Trace *t, uint32_t vocab)
{
        const BkSampling settings[N_SEQS] = {
                {.temperature = 0, .repetition_penalty = 1},
                {.temperature = 0.8f, .repetition_penalty = 1, .seed = 1},
                {.temperature = 1.0f, .top_k = 20, .repetition_penalty = 1, .seed = 2},
                {.temperature = 0.7f, .top_p = 0.9f, .repetition_penalty = 1.1f, .seed = 3},
                {.temperature = 0, .repetition_penalty = 1.3f, .presence_penalty = 0.5f},
                {.temperature = 1.2f,
                        .min_p = 0.05f,
                        .frequency_penalty = 0.2f,
                        .repetition_penalty = 1,
                        .seed = 4},
                {.temperature = 0.9f,
                        .top_k = 50,
                        .top_p = 0.95f,
                        .min_p = 0.01f,
                        .repetition_penalty = 1.05f,
                        .seed = 5},
                {.temperature = 1.0f, .repetition_penalty = 1, .seed = 1}, /* seed shared with 1 */
        };
        const uint32_t lengths[N_SEQS] = {1, 40, 7, 23, 16, 17, 3, 31};
        const uint32_t chunks[N_SEQS] = {1, 13, 40, 5, 16, 4, 2, 32};

        for (uint32_t i = 0; i < N_SEQS; i++) {
                t[i].n_prompt = lengths[i];
                for (uint32_t j = 0; j < lengths[i]; j++)
                        t[i].tokens[j] = (int32_t) (rng() % vocab);
                t[i].sampling = settings[i];
                t[i].chunk = chunks[i];
                t[i].start = (i * 3) % 5;
                t[i].logits = calloc((size_t) POS_MAX * vocab, sizeof(float));
                CHECK(t[i].logits, "out of memory");
        }
}

/* Shuffled block ids, BLOCKS_PER_SEQ for each sequence, none shared. */
static void deal_blocks(Trace *t)
{
        uint32_t ids[FIX_MAX_BLOCKS];

        for (uint32_t i = 0; i < FIX_MAX_BLOCKS; i++)
                ids[i] = i;
        for (uint32_t i = FIX_MAX_BLOCKS - 1; i > 0; i--) {
                uint32_t j = rng() % (i + 1), x = ids[i];
                ids[i] = ids[j];
                ids[j] = x;
        }
        for (uint32_t i = 0; i < N_SEQS; i++)
                for (uint32_t k = 0; k < BLOCKS_PER_SEQ; k++)
                        t[i].blocks[k] = ids[i * BLOCKS_PER_SEQ + k];
}

/* The part of sequence t's run that feeds chunk tokens at pos; ready to step. */
static BkSeq seq_part(Trace *t, uint32_t pos, uint32_t n, const uint32_t *blocks, uint32_t vocab)
{
        uint32_t end = pos + n;
        bool sample = end >= t->n_prompt;

        return (BkSeq){
                .tokens = t->tokens + pos,
                .n_tokens = n,
                .pos = pos,
                .blocks = blocks,
                .n_blocks = BLOCKS_PER_SEQ,
                .sample = sample,
                .sampling = t->sampling,
                .history = t->tokens,
                .n_history = end,
                .draw = sample ? end - t->n_prompt : 0,
                .logits = t->logits + (size_t) pos * vocab,
        };
}

/* Records the sampled id of the step that ended at end and feeds it back. */
static void take_sample(Trace *t, uint32_t end, int32_t id)
{
        CHECK(id >= 0, "no sample");
        t->sampled[end - t->n_prompt] = id;
        t->tokens[end] = id;
}

static void run_alone(Fixture *f, Trace *t)
{
        uint32_t identity[BLOCKS_PER_SEQ];
        DsError err = {0};
        int32_t id;

        for (uint32_t k = 0; k < BLOCKS_PER_SEQ; k++)
                identity[k] = k;
        fix_kv_reset(f);
        BkSeq s = seq_part(t, 0, t->n_prompt, identity, f->vocab);
        CHECK(backend_cpu_ops.step(f->b, &s, 1, &id, &err) == 0, "%s", err.msg);
        take_sample(t, t->n_prompt, id);
        for (uint32_t d = 1; d <= N_DECODE; d++) {
                uint32_t pos = t->n_prompt + d - 1;
                s = seq_part(t, pos, 1, identity, f->vocab);
                CHECK(backend_cpu_ops.step(f->b, &s, 1, &id, &err) == 0, "%s", err.msg);
                take_sample(t, pos + 1, id);
        }
}

static void run_batched(Fixture *f, Trace *t)
{
        uint32_t fed[N_SEQS] = {0}; /* positions fed so far */
        DsError err = {0};

        fix_kv_reset(f);
        for (uint32_t step = 0;; step++) {
                BkSeq seqs[N_SEQS];
                uint32_t who[N_SEQS], n = 0;
                int32_t ids[N_SEQS];

                /* Later sequences first, so a prefill chunk sits between decode tokens. */
                for (uint32_t k = 0; k < N_SEQS; k++) {
                        uint32_t i = (k * 5 + step) % N_SEQS;
                        Trace *s = &t[i];
                        if (step < s->start || fed[i] == s->n_prompt + N_DECODE)
                                continue;
                        uint32_t len =
                                fed[i] < s->n_prompt ? MIN(s->chunk, s->n_prompt - fed[i]) : 1;
                        seqs[n] = seq_part(s, fed[i], len, s->blocks, f->vocab);
                        who[n++] = i;
                }
                if (n == 0)
                        break;
                CHECK(backend_cpu_ops.step(f->b, seqs, n, ids, &err) == 0, "%s", err.msg);
                for (uint32_t j = 0; j < n; j++) {
                        Trace *s = &t[who[j]];
                        fed[who[j]] += seqs[j].n_tokens;
                        if (seqs[j].sample)
                                take_sample(s, fed[who[j]], ids[j]);
                        else
                                CHECK(ids[j] == -1, "unsampled sequence got an id");
                }
        }
}

static void check_fixture(const char *dir)
{
        Fixture f = fix_open(dir);
        Trace alone[N_SEQS] = {0}, batched[N_SEQS];

        make_traces(alone, f.vocab);
        deal_blocks(alone);
        for (uint32_t i = 0; i < N_SEQS; i++) {
                batched[i] = alone[i];
                batched[i].logits = calloc((size_t) POS_MAX * f.vocab, sizeof(float));
                CHECK(batched[i].logits, "out of memory");
        }

        for (uint32_t i = 0; i < N_SEQS; i++)
                run_alone(&f, &alone[i]);
        run_batched(&f, batched);

        for (uint32_t i = 0; i < N_SEQS; i++) {
                size_t n = (size_t) (alone[i].n_prompt + N_DECODE) * f.vocab;
                CHECK(memcmp(alone[i].sampled, batched[i].sampled, sizeof(alone[i].sampled)) == 0,
                        "%s: sequence %u: sampled ids differ in a batch", dir, i);
                CHECK(memcmp(alone[i].logits, batched[i].logits, n * sizeof(float)) == 0,
                        "%s: sequence %u: logits differ in a batch", dir, i);
                free(alone[i].logits);
                free(batched[i].logits);
        }
        printf("%s: %d sequences x %d decode steps bit-identical alone and batched\n", dir, N_SEQS,
                N_DECODE);
        fix_close(&f);
}

int main(void)
{
        check_fixture(test_shared("fixtures/tiny-qwen2-awq"));
        check_fixture(test_shared("fixtures/tiny-llama-awq"));
        return 0;
}
