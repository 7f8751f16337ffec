/* SPDX-License-Identifier: MIT */
/* llama2.c tokenizer.bin -> Llama-2-style tokenizer.json. The merges are derived as
 * Hugging Face's SentencePieceExtractor does: for every piece, each split into two pieces
 * that are both in the vocabulary is a merge; merges are ordered by the merged piece's
 * score, highest first, then by the merged piece's id and the halves' ids. With scores
 * that rank merges strictly (as SentencePiece BPE training produces), BPE by these ranks
 * picks the same pair as run.c's "highest score, leftmost" loop at every step. */
#include <cjson/cJSON.h>
#include <math.h>
#include <string.h>

#include "tok_internal.h"

typedef struct L2Merge {
        float score;
        int32_t merged, left, right;
} L2Merge;

static int l2merge_cmp(const void *a, const void *b)
{
        const L2Merge *x = a, *y = b;
        if (x->score != y->score)
                return x->score > y->score ? -1 : 1;
        if (x->merged != y->merged)
                return x->merged < y->merged ? -1 : 1;
        if (x->left != y->left)
                return x->left < y->left ? -1 : 1;
        return (x->right > y->right) - (x->right < y->right);
}

static void cjson_deletep(cJSON **j)
{
        cJSON_Delete(*j);
}

static cJSON *added_token(int32_t id, const char *content)
{
        cJSON *o = cJSON_CreateObject();
        if (!o)
                return NULL;
        if (!cJSON_AddNumberToObject(o, "id", id) ||
                !cJSON_AddStringToObject(o, "content", content) ||
                !cJSON_AddFalseToObject(o, "single_word") || !cJSON_AddFalseToObject(o, "lstrip") ||
                !cJSON_AddFalseToObject(o, "rstrip") || !cJSON_AddFalseToObject(o, "normalized") ||
                !cJSON_AddTrueToObject(o, "special")) {
                cJSON_Delete(o);
                return NULL;
        }
        return o;
}

/* The fixed parts of the file: Llama-2's normalizer and decoder. */
static const char LLAMA2_SKELETON[] =
        "{\"version\":\"1.0\",\"truncation\":null,\"padding\":null,\"added_tokens\":[],"
        "\"normalizer\":{\"type\":\"Sequence\",\"normalizers\":["
        "{\"type\":\"Prepend\",\"prepend\":\"\xe2\x96\x81\"},"
        "{\"type\":\"Replace\",\"pattern\":{\"String\":\" \"},\"content\":\"\xe2\x96\x81\"}]},"
        "\"pre_tokenizer\":null,\"post_processor\":null,"
        "\"decoder\":{\"type\":\"Sequence\",\"decoders\":["
        "{\"type\":\"Replace\",\"pattern\":{\"String\":\"\xe2\x96\x81\"},\"content\":\" \"},"
        "{\"type\":\"ByteFallback\"},{\"type\":\"Fuse\"},"
        "{\"type\":\"Strip\",\"content\":\" \",\"start\":1,\"stop\":0}]},"
        "\"model\":{\"type\":\"BPE\",\"dropout\":null,\"unk_token\":\"<unk>\","
        "\"continuing_subword_prefix\":null,\"end_of_word_suffix\":null,\"fuse_unk\":true,"
        "\"byte_fallback\":true,\"ignore_merges\":false}}";

int tokenizer_json_from_llama2c(
        const char *path, uint32_t vocab_size, char **ret_json, DsError *err)
{
        _cleanup_free_ char *buf = NULL;
        size_t len;
        int r;

        if (!path || !ret_json)
                return ds_error(err, -EINVAL, "llama2c tokenizer: invalid arguments");
        r = tokenizer_read_file(path, &buf, &len, err);
        if (r < 0)
                return r;
        return tokenizer_json_from_llama2c_memory(buf, len, path, vocab_size, ret_json, err);
}

int tokenizer_json_from_llama2c_memory(const char *buf, size_t len, const char *path,
        uint32_t vocab_size, char **ret_json, DsError *err)
{
        _cleanup_(strmap_done) StrMap vocab = {};
        _cleanup_(tokbuf_done) TokBuf merges = {};
        _cleanup_(cjson_deletep) cJSON *root = NULL;
        _cleanup_free_ float *scores = NULL;
        size_t off = 4;
        int r;

        if (!buf || !path || !ret_json)
                return ds_error(err, -EINVAL, "llama2c tokenizer: invalid arguments");
        if (vocab_size < 3 || vocab_size > TOK_ID_MAX)
                return ds_error(err, -DS_ERR_FORMAT, "%s: vocab size %u is not in 3..%u", path,
                        vocab_size, TOK_ID_MAX);
        scores = malloc(vocab_size * sizeof(*scores));
        if (!scores)
                return ds_error(err, -ENOMEM, "%s: out of memory", path);
        if (len < 4)
                return ds_error(err, -DS_ERR_FORMAT, "%s: truncated header", path);

        /* Pieces as SentencePiece writes them, keyed in one map (offsets into its arena). */
        for (uint32_t id = 0; id < vocab_size; id++) {
                int32_t n;
                _cleanup_(tokbuf_done) TokBuf piece = {};

                if (len - off < 8)
                        return ds_error(err, -DS_ERR_FORMAT, "%s: token %u is truncated", path, id);
                memcpy(&scores[id], buf + off, 4);
                memcpy(&n, buf + off + 4, 4);
                off += 8;
                if (n < 0 || (size_t) n > len - off || isnan(scores[id]))
                        return ds_error(err, -DS_ERR_FORMAT,
                                "%s: token %u has a bad length or score", path, id);
                /* a piece decodes to its own bytes: one the loader would refuse is refused
                 * here, by its id, rather than in the tokenizer.json written (the fuzzer
                 * found pieces of up to 4096 bytes passing) */
                if ((uint32_t) n > TOK_PIECE_MAX)
                        return ds_error(err, -DS_ERR_FORMAT,
                                "%s: token %u is %d bytes, more than %u", path, id, n,
                                TOK_PIECE_MAX);
                static const char *const specials[] = {"<unk>", "<s>", "</s>"};
                if (id < ELEMENTSOF(specials))
                        r = tokbuf_append(&piece, specials[id], strlen(specials[id]));
                else
                        r = tok_replace_all(buf + off, (size_t) n, " ", "\xe2\x96\x81", &piece);
                if (r < 0)
                        return ds_error(err, r, "%s: out of memory", path);
                off += (size_t) n;
                if (!piece.n || memchr(piece.p, 0, piece.n) || !utf8_valid(piece.p, piece.n))
                        return ds_error(err, -DS_ERR_FORMAT,
                                "%s: token %u is empty, holds NUL or is not UTF-8", path, id);
                r = strmap_put(&vocab, piece.p, piece.n, (int32_t) id);
                if (r < 0)
                        return ds_error(err, r, "%s: out of memory", path);
                if (r > 0)
                        return ds_error(err, -DS_ERR_FORMAT,
                                "%s: token %u repeats an earlier piece", path, id);
        }

        for (uint32_t id = 0; id < vocab_size; id++) {
                const char *p = vocab.arena.p + vocab.entries[id].off;
                size_t n = vocab.entries[id].len;
                for (size_t k = 1; k < n; k++) {
                        if (((uint8_t) p[k] & 0xc0) == 0x80)
                                continue; /* split at character boundaries only */
                        int32_t l = strmap_get(&vocab, p, k), rr = strmap_get(&vocab, p + k, n - k);
                        if (l < 0 || rr < 0)
                                continue;
                        r = tokbuf_append(&merges, &(L2Merge){scores[id], (int32_t) id, l, rr},
                                sizeof(L2Merge));
                        if (r < 0)
                                return ds_error(err, r, "%s: out of memory", path);
                }
        }
        size_t n_merges = merges.n / sizeof(L2Merge);
        if (n_merges)
                qsort(merges.p, n_merges, sizeof(L2Merge), l2merge_cmp);

        root = cJSON_Parse(LLAMA2_SKELETON);
        if (!root)
                return ds_error(err, -ENOMEM, "%s: out of memory", path);
        cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
        cJSON *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens");
        cJSON *jv = cJSON_AddObjectToObject(model, "vocab");
        cJSON *jm = cJSON_AddArrayToObject(model, "merges");
        if (!jv || !jm)
                return ds_error(err, -ENOMEM, "%s: out of memory", path);
        for (uint32_t id = 0; id < vocab_size; id++) {
                const StrMapEntry *e = &vocab.entries[id];
                _cleanup_free_ char *s = strndup(vocab.arena.p + e->off, e->len);
                if (!s || !cJSON_AddNumberToObject(jv, s, id) ||
                        (id < 3 && !cJSON_AddItemToArray(added, added_token((int32_t) id, s))))
                        return ds_error(err, -ENOMEM, "%s: out of memory", path);
        }
        for (size_t i = 0; i < n_merges; i++) {
                const L2Merge *m = &((const L2Merge *) merges.p)[i];
                const StrMapEntry *a = &vocab.entries[m->left], *b = &vocab.entries[m->right];
                _cleanup_free_ char *sa = strndup(vocab.arena.p + a->off, a->len);
                _cleanup_free_ char *sb = strndup(vocab.arena.p + b->off, b->len);
                cJSON *pair = sa && sb ? cJSON_CreateArray() : NULL;
                if (!pair || !cJSON_AddItemToArray(jm, pair) ||
                        !cJSON_AddItemToArray(pair, cJSON_CreateString(sa)) ||
                        !cJSON_AddItemToArray(pair, cJSON_CreateString(sb)))
                        return ds_error(err, -ENOMEM, "%s: out of memory", path);
        }

        char *json = cJSON_PrintUnformatted(root);
        if (!json)
                return ds_error(err, -ENOMEM, "%s: out of memory", path);
        *ret_json = json;
        return 0;
}
