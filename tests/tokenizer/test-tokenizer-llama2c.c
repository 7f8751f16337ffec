/* SPDX-License-Identifier: MIT */
/* The llama2.c tokenizer.bin converter: the converted tokenizer.json, loaded back, must
 * encode like run.c's encode() (reproduced below from upstream) and decode back to the
 * text; a stream primed with BOS drops the first piece's leading space, as run.c does.
 * Texts holding U+2581 itself are left out on purpose: SentencePiece (and so the
 * converted file) reads it as a space, run.c as three fallback bytes. */
#include <string.h>

#include "test_util.h"
#include "tok_internal.h"

#define VOCAB_SIZE 512

typedef struct RefTokenizer {
        char *vocab[VOCAB_SIZE];
        float scores[VOCAB_SIZE];
} RefTokenizer;

static void ref_load(RefTokenizer *t, const char *path)
{
        FILE *f = fopen(path, "rb");
        int max_len, len;

        CHECK(f, "cannot open %s", path);
        CHECK(fread(&max_len, 4, 1, f) == 1, "header");
        for (int i = 0; i < VOCAB_SIZE; i++) {
                CHECK(fread(&t->scores[i], 4, 1, f) == 1 && fread(&len, 4, 1, f) == 1, "token %d",
                        i);
                t->vocab[i] = calloc((size_t) len + 1, 1);
                CHECK(t->vocab[i] && fread(t->vocab[i], 1, (size_t) len, f) == (size_t) len,
                        "token %d", i);
        }
        fclose(f);
}

static int ref_lookup(const RefTokenizer *t, const char *s)
{
        for (int i = 0; i < VOCAB_SIZE; i++)
                if (!strcmp(t->vocab[i], s))
                        return i;
        return -1;
}

/* run.c's encode() without BOS/EOS: dummy prefix for non-empty text, one token per UTF-8
 * character (bytes + 3 as fallback), then merge the best-scoring adjacent pair. */
static size_t ref_encode(const RefTokenizer *t, const char *text, int *tokens)
{
        char buf[512];
        size_t str_len = 0, n = 0;

        if (text[0] != '\0')
                tokens[n++] = ref_lookup(t, " ");
        for (const char *c = text; *c != '\0'; c++) {
                if ((*c & 0xC0) != 0x80)
                        str_len = 0;
                buf[str_len++] = *c;
                buf[str_len] = '\0';
                if ((*(c + 1) & 0xC0) == 0x80 && str_len < 4)
                        continue;
                int id = ref_lookup(t, buf);
                if (id != -1)
                        tokens[n++] = id;
                else
                        for (size_t i = 0; i < str_len; i++)
                                tokens[n++] = (unsigned char) buf[i] + 3;
                str_len = 0;
        }
        for (;;) {
                float best_score = -1e10f;
                int best_id = -1, best_idx = -1;
                for (size_t i = 0; i + 1 < n; i++) {
                        snprintf(buf, sizeof(buf), "%s%s", t->vocab[tokens[i]],
                                t->vocab[tokens[i + 1]]);
                        int id = ref_lookup(t, buf);
                        if (id != -1 && t->scores[id] > best_score) {
                                best_score = t->scores[id];
                                best_id = id;
                                best_idx = (int) i;
                        }
                }
                if (best_idx == -1)
                        break;
                tokens[best_idx] = best_id;
                for (size_t i = (size_t) best_idx + 1; i + 1 < n; i++)
                        tokens[i] = tokens[i + 1];
                n--;
        }
        return n;
}

static const char *const texts[] = {
        "",
        " ",
        "  ",
        "a",
        "Once upon a time",
        "Once upon a time, there was a little girl named Lily.",
        "She loved to play outside in the park with her friends.",
        "One day, she saw a big, red ball. \"Can I play?\" she asked.",
        "The cat sat on the mat. The dog ran after the cat!",
        "Tom and Sue were happy. They laughed and laughed.",
        "\"Mom, look!\" said Ben. 'It's a bird,' she replied.",
        "Hello\nworld",
        "line one\n\nline two\n",
        "\n",
        "\t tab and  double  spaces ",
        "trailing space ",
        " leading space",
        "12345 67 8 90",
        "3.14159, 2.71828; 1/2 = 0.5",
        "The year was 2023 and it was 10:45 pm.",
        "!!! ??? ... --- ***",
        "(parentheses) [brackets] {braces} <angles>",
        "a-b_c+d=e*f&g^h%i$j#k@l",
        "don't won't can't isn't",
        "ALL CAPS SENTENCE HERE",
        "MiXeD CaSe WoRdS",
        "caf\xc3\xa9",
        "na\xc3\xafve r\xc3\xa9sum\xc3\xa9",
        "\xc3\xa9\xc3\xa8\xc3\xaa",
        "\xe6\x97\xa5\xe6\x9c\xac",
        "\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e\xe3\x81\xae\xe6\x96\x87",
        "\xf0\x9f\x98\x80",
        "smile \xf0\x9f\x98\x80 and \xf0\x9f\x8e\x89 party",
        "\xd0\x9f\xd1\x80\xd0\xb8\xd0\xb2\xd0\xb5\xd1\x82 \xd0\xbc\xd0\xb8\xd1\x80",
        "\xce\xb1\xce\xb2\xce\xb3 \xce\xb4",
        "\xe2\x84\xa2 trade mark",
        "x\xe2\x80\x8ay",
        "~[]~",
        "the the the the the",
        "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
        "ababababab",
        "Lily and Ben went to the park. They played on the swings and the slide.",
        "The sun was shining and the birds were singing.",
        "He said, \"I am sorry.\" She said, \"It is okay.\"",
        "Once upon a time, in a big forest, there lived a little bunny.",
        "What is your name?",
        "Yes! No? Maybe...",
        "end.",
        "mixed \xe6\x97\xa5 text \xc3\xa9 and \xf0\x9f\x98\x80 emoji 42",
        "tabs\tand\rcarriage returns\r\n",
};

/* A tokenizer.bin of 4 pieces, the last of last bytes (ids 0-2 become <unk>, <s>, </s>),
 * and its size in *ret_len. */
static char *long_piece_bin(int32_t last, size_t *ret_len)
{
        int32_t lens[4] = {1, 1, 1, last};
        float score = -1.0f;
        char *b = malloc(4 + 4 * 8 + 3 + (size_t) last);
        size_t off = 4;

        CHECK(b, "oom");
        memcpy(b, &last, 4);
        for (int i = 0; i < 4; i++) {
                memcpy(b + off, &score, 4);
                memcpy(b + off + 4, &lens[i], 4);
                off += 8;
                memset(b + off, 'a' + i, (size_t) lens[i]);
                off += (size_t) lens[i];
        }
        *ret_len = off;
        return b;
}

int main(void)
{
        _cleanup_(tokenizer_freep) Tokenizer *t = NULL;
        _cleanup_free_ char *json = NULL;
        static RefTokenizer ref;
        DsError err = {};
        size_t n_ok = 0;
        const char *bin = test_shared("models/stories260K/tok512.bin");

        CHECK(tokenizer_json_from_llama2c(bin, VOCAB_SIZE, &json, &err) == 0, "%s", err.msg);
        CHECK(tokenizer_load_from_memory(json, strlen(json), "converted tok512", &t, &err) == 0,
                "%s", err.msg);
        CHECK(tokenizer_n_vocab(t) == VOCAB_SIZE, "n_vocab %u", tokenizer_n_vocab(t));
        CHECK(tokenizer_bos(t) == 1 && tokenizer_eos(t) == 2 && tokenizer_add_bos(t), "bos/eos");
        CHECK(tokenizer_token_id(t, "<0x0A>") == 13, "byte tokens keep their ids");
        CHECK(tokenizer_is_special(t, 1) && !tokenizer_is_special(t, 13), "special flags");
        ref_load(&ref, bin);

        for (size_t i = 0; i < ELEMENTSOF(texts); i++) {
                _cleanup_free_ int32_t *ids = NULL;
                _cleanup_free_ char *dec = NULL;
                int want[1024];
                size_t n, n_want = ref_encode(&ref, texts[i], want), dec_len;
                bool same;

                CHECK(tokenizer_encode(t, texts[i], strlen(texts[i]), &ids, &n, &err) == 0, "%s",
                        err.msg);
                same = n == n_want;
                for (size_t k = 0; same && k < n; k++)
                        same = ids[k] == want[k];
                if (!same) {
                        fprintf(stderr, "text %zu \"%s\":\n  got ", i, texts[i]);
                        for (size_t k = 0; k < n; k++)
                                fprintf(stderr, "%d ", ids[k]);
                        fprintf(stderr, "\n want ");
                        for (size_t k = 0; k < n_want; k++)
                                fprintf(stderr, "%d ", want[k]);
                        fprintf(stderr, "\n");
                        continue;
                }
                CHECK(tokenizer_decode(t, ids, n, &dec, &dec_len, &err) == 0, "%s", err.msg);
                if (dec_len != strlen(texts[i]) || memcmp(dec, texts[i], dec_len)) {
                        fprintf(stderr, "text %zu: decodes to \"%s\"\n", i, dec);
                        continue;
                }
                n_ok++;
        }
        printf("llama2c tok512: %zu/%zu texts encode like run.c and round-trip\n", n_ok,
                ELEMENTSOF(texts));

        /* Generation after BOS: run.c prints the first piece without its leading space,
         * while decode(skip_special_tokens=False) keeps "<s>" and the space. */
        {
                _cleanup_(tok_stream_freep) TokStream *s = NULL;
                _cleanup_free_ int32_t *ids = NULL;
                _cleanup_free_ char *dec = NULL;
                char out[TOK_STREAM_OUT_MAX], all[256] = "";
                int32_t bos = 1;
                size_t n, pos = 0;

                CHECK(tokenizer_encode(t, "Once upon", 9, &ids, &n, &err) == 0, "%s", err.msg);
                CHECK(tok_stream_new(t, &s) == 0 && tok_stream_prime(s, &bos, 1) == 0, "stream");
                for (size_t i = 0; i <= n; i++) {
                        int k = i < n ? tok_stream_push(s, ids[i], out) : tok_stream_flush(s, out);
                        CHECK(k >= 0 && pos + (size_t) k < sizeof(all), "push");
                        memcpy(all + pos, out, (size_t) k);
                        pos += (size_t) k;
                }
                CHECK(!strcmp(all, "Once upon"), "stream after BOS gave \"%s\"", all);
                int32_t with_bos[16] = {1};
                memcpy(with_bos + 1, ids, n * sizeof(int32_t));
                CHECK(tokenizer_decode(t, with_bos, n + 1, &dec, NULL, &err) == 0, "%s", err.msg);
                CHECK(!strcmp(dec, "<s> Once upon"), "decode with BOS gave \"%s\"", dec);
        }

        /* A piece longer than the loader takes is refused by its id, not written into a
         * tokenizer.json that the daemon then refuses (found by fuzz-tokenizer-llama2c). */
        for (int32_t last = 320; last <= 321; last++) {
                _cleanup_free_ char *j = NULL;
                _cleanup_(tokenizer_freep) Tokenizer *tl = NULL;
                size_t len;
                char *b = long_piece_bin(last, &len);
                int r = tokenizer_json_from_llama2c_memory(b, len, "long", 4, &j, &err);
                free(b);
                if (last == 320) {
                        CHECK(r == 0, "a piece of 320 bytes: %s", err.msg);
                        CHECK(tokenizer_load_from_memory(j, strlen(j), "long", &tl, &err) == 0,
                                "%s", err.msg);
                } else
                        CHECK(r == -DS_ERR_FORMAT &&
                                        !strcmp(err.msg,
                                                "long: token 3 is 321 bytes, more than 320"),
                                "a piece of 321 bytes: %s", err.msg);
        }

        for (int i = 0; i < VOCAB_SIZE; i++)
                free(ref.vocab[i]);
        return n_ok == ELEMENTSOF(texts) ? 0 : 1;
}
