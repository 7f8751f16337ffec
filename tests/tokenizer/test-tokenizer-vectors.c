/* SPDX-License-Identifier: MIT */
/* Hugging Face ground truth: every case of a vectors.json encodes to exactly its ids,
 * the ids decode to exactly its text, and streaming the ids gives the same bytes in
 * chunks that are each whole UTF-8, also after priming with a prefix.
 * Usage: test-tokenizer-vectors TOKENIZER.json VECTORS-RELATIVE-TO-SHARED */
#include <cjson/cJSON.h>
#include <string.h>
#include <time.h>

#include "test_util.h"
#include "tok_internal.h"

static char *read_all(const char *path, size_t *ret_len)
{
        char *buf;
        DsError err = {};
        CHECK(tokenizer_read_file(path, &buf, ret_len, &err) == 0, "%s", err.msg);
        return buf;
}

/* Streams ids[skip..] after priming with ids[..skip]; checks each chunk is whole UTF-8. */
static char *stream_decode(
        const Tokenizer *t, const int32_t *ids, size_t n, size_t skip, size_t *ret_len)
{
        _cleanup_(tok_stream_freep) TokStream *s = NULL;
        char chunk[TOK_STREAM_OUT_MAX];
        TokBuf out = {};

        CHECK(tok_stream_new(t, &s) == 0, "tok_stream_new");
        CHECK(tok_stream_prime(s, ids, skip) == 0, "prime");
        for (size_t i = skip; i <= n; i++) {
                int k = i < n ? tok_stream_push(s, ids[i], chunk) : tok_stream_flush(s, chunk);
                CHECK(k >= 0 && k <= TOK_STREAM_OUT_MAX, "push returned %d", k);
                CHECK(utf8_valid(chunk, (size_t) k), "chunk %zu is not whole UTF-8", i);
                CHECK(tokbuf_append(&out, chunk, (size_t) k) == 0, "oom");
        }
        CHECK(tokbuf_append(&out, "", 1) == 0, "oom");
        *ret_len = out.n - 1;
        return out.p;
}

int main(int argc, char **argv)
{
        _cleanup_(tokenizer_freep) Tokenizer *t = NULL;
        DsError err = {};
        size_t len, n_enc = 0, n_dec = 0, n_stream = 0, n_cases = 0;
        struct timespec t0, t1;

        CHECK(argc == 3, "usage: %s TOKENIZER.json VECTORS", argv[0]);
        clock_gettime(CLOCK_MONOTONIC, &t0);
        CHECK(tokenizer_load(argv[1], &t, &err) == 0, "%s", err.msg);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        printf("loaded %s in %.3f s, %u ids\n", argv[1],
                (double) (t1.tv_sec - t0.tv_sec) + (double) (t1.tv_nsec - t0.tv_nsec) / 1e9,
                tokenizer_n_vocab(t));

        _cleanup_free_ char *json = read_all(test_shared(argv[2]), &len);
        cJSON *root = cJSON_ParseWithLength(json, len);
        CHECK(root, "%s does not parse", argv[2]);
        const cJSON *c;
        cJSON_ArrayForEach(c, cJSON_GetObjectItem(root, "cases"))
        {
                const char *text = cJSON_GetObjectItem(c, "text")->valuestring;
                const char *decoded = cJSON_GetObjectItem(c, "decoded")->valuestring;
                const cJSON *jids = cJSON_GetObjectItem(c, "ids"), *e;
                size_t n_want = (size_t) cJSON_GetArraySize(jids), n = 0, k = 0;
                _cleanup_free_ int32_t *want = calloc(n_want + 1, sizeof(int32_t));
                _cleanup_free_ int32_t *ids = NULL;
                _cleanup_free_ char *dec = NULL, *str = NULL, *half = NULL, *primed = NULL;
                size_t dec_len, str_len, half_len, primed_len;

                n_cases++;
                cJSON_ArrayForEach(e, jids) want[k++] = (int32_t) e->valuedouble;
                CHECK(tokenizer_encode(t, text, strlen(text), &ids, &n, &err) == 0, "%s", err.msg);
                if (n != n_want || memcmp(ids, want, n * sizeof(int32_t))) {
                        fprintf(stderr, "case %zu: encoding differs for \"%s\"\n  got ", n_cases,
                                text);
                        for (size_t i = 0; i < n; i++)
                                fprintf(stderr, "%d ", ids[i]);
                        fprintf(stderr, "\n want ");
                        for (size_t i = 0; i < n_want; i++)
                                fprintf(stderr, "%d ", want[i]);
                        fprintf(stderr, "\n");
                } else
                        n_enc++;

                CHECK(tokenizer_decode(t, want, n_want, &dec, &dec_len, &err) == 0, "%s", err.msg);
                if (dec_len != strlen(decoded) || memcmp(dec, decoded, dec_len)) {
                        fprintf(stderr, "case %zu: decoding differs: got \"%s\" want \"%s\"\n",
                                n_cases, dec, decoded);
                } else
                        n_dec++;

                str = stream_decode(t, want, n_want, 0, &str_len);
                /* Priming with the first half: the rest must stream out as the remainder. */
                CHECK(tokenizer_decode(t, want, n_want / 2, &half, &half_len, &err) == 0, "%s",
                        err.msg);
                primed = stream_decode(t, want, n_want, n_want / 2, &primed_len);
                bool prefix_clean = half_len <= dec_len && !memcmp(dec, half, half_len);
                if (str_len != dec_len || memcmp(str, dec, dec_len) ||
                        (prefix_clean && (half_len + primed_len != dec_len ||
                                                 memcmp(primed, dec + half_len, primed_len)))) {
                        fprintf(stderr, "case %zu: stream decoding differs\n", n_cases);
                } else
                        n_stream++;
        }
        cJSON_Delete(root);
        printf("%s: %zu cases: encode %zu/%zu, decode %zu/%zu, stream %zu/%zu\n", argv[2], n_cases,
                n_enc, n_cases, n_dec, n_cases, n_stream, n_cases);
        return n_cases > 0 && n_enc == n_cases && n_dec == n_cases && n_stream == n_cases ? 0 : 1;
}
