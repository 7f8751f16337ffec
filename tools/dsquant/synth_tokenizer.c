/* SPDX-License-Identifier: MIT */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "out_files.h"
#include "synth_tokenizer.h"

/* Qwen2's pre-tokenizer pattern, copied from shared/tokenizers/qwen/tokenizer.json. */
/* clang-format off */
static const char QWEN2_SPLIT[] =
        "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
        "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

static const char CHATML_TEMPLATE[] =
        "{% for message in messages %}"
        "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
        "{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

/* Merges are built from these, in this order, each with a leading space: ranks, and so
 * the tokenizer, never change between runs or machines. */
static const char *const WORDS[] = {
        "the", "and", "to", "of", "a", "in", "is", "was", "he", "she", "it", "that", "for",
        "on", "with", "as", "his", "her", "they", "at", "be", "this", "have", "from", "or",
        "one", "had", "by", "but", "not", "what", "all", "were", "we", "when", "your", "can",
        "said", "there", "an", "each", "which", "do", "how", "their", "if", "will", "up",
        "other", "about", "out", "many", "then", "them", "so", "some", "would", "make",
        "like", "him", "into", "time", "has", "look", "two", "more", "go", "see", "no", "way",
        "could", "people", "my", "than", "first", "water", "been", "who", "its", "now", "find",
        "long", "down", "day", "did", "get", "come", "made", "may", "once", "upon", "little",
        "girl", "boy", "happy", "play", "friend", "big", "saw", "went", "very", "you", "are",
        "model", "hello", "world", "story", "name", "because", "there", "where", "help",
        "thing", "good", "new", "just", "know", "take", "year", "think", "back", "after",
        "work", "well", "also", "only", "over", "even", "want", "give", "most", "tree", "sun",
        "dog", "cat", "mom", "dad", "ball", "park", "home", "house", "wanted", "looked",
        "played", "asked", "smiled", "together", "always", "loved", "every", "something",
        "answer", "question", "number", "system", "user", "assistant",
};
/* clang-format on */

/* GPT-2's bytes_to_unicode(): printable Latin-1 bytes stand for themselves, the other 68
 * map to U+0100 upwards in ascending order. Ids follow the same order as Qwen's vocab:
 * the printable bytes first, then the rest. */
static bool byte_is_printable(unsigned b)
{
        return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
}

static unsigned byte_code_point(unsigned b)
{
        unsigned n = 0;

        if (byte_is_printable(b))
                return b;
        for (unsigned i = 0; i < b; i++)
                n += !byte_is_printable(i);
        return 256 + n;
}

static void utf8_put(char out[static 3], unsigned cp)
{
        if (cp < 0x80) {
                out[0] = (char) cp;
                out[1] = 0;
        } else {
                out[0] = (char) (0xC0 | (cp >> 6));
                out[1] = (char) (0x80 | (cp & 0x3F));
                out[2] = 0;
        }
}

typedef struct Vocab {
        char **tokens; /* id -> byte-level string */
        uint32_t n, cap;
        uint32_t (*merges)[2]; /* rank -> the ids of the pair */
        uint32_t n_merges;
} Vocab;

static void vocab_done(Vocab *v)
{
        for (uint32_t i = 0; i < v->n; i++)
                free(v->tokens[i]);
        free(v->tokens);
        free(v->merges);
}

static int vocab_find(const Vocab *v, const char *s)
{
        for (uint32_t i = 0; i < v->n; i++)
                if (!strcmp(v->tokens[i], s))
                        return (int) i;
        return -1;
}

/* Appends s; with a merge (left, right) that produces it when left is not UINT32_MAX. */
static int vocab_add(Vocab *v, const char *s, uint32_t left, uint32_t right)
{
        if (v->n == v->cap) {
                uint32_t cap = v->cap ? v->cap * 2 : 512;
                char **t = reallocarray(v->tokens, cap, sizeof(*t));
                if (!t)
                        return -ENOMEM;
                v->tokens = t;
                uint32_t(*m)[2] = reallocarray(v->merges, cap, sizeof(*m));
                if (!m)
                        return -ENOMEM;
                v->merges = m;
                v->cap = cap;
        }
        v->tokens[v->n] = strdup(s);
        if (!v->tokens[v->n])
                return -ENOMEM;
        v->n++;
        if (left != UINT32_MAX) {
                v->merges[v->n_merges][0] = left;
                v->merges[v->n_merges][1] = right;
                v->n_merges++;
        }
        return 0;
}

/* Adds the merges that spell " word" from left to right while fewer than max_merges
 * exist: each joins the longest prefix spelled so far with the next byte symbol. */
static int add_word_merges(Vocab *v, const char *word, uint32_t max_merges)
{
        char sym[3], joined[160];
        int prefix;

        utf8_put(sym, byte_code_point(' '));
        prefix = vocab_find(v, sym);
        for (const char *c = word; *c && v->n_merges < max_merges; c++) {
                utf8_put(sym, byte_code_point((unsigned char) *c));
                snprintf(joined, sizeof(joined), "%s%s", v->tokens[prefix], sym);

                int id = vocab_find(v, joined);
                if (id < 0) {
                        int r = vocab_add(
                                v, joined, (uint32_t) prefix, (uint32_t) vocab_find(v, sym));
                        if (r < 0)
                                return r;
                        id = (int) v->n - 1;
                }
                prefix = id;
        }
        return 0;
}

static cJSON *add_byte_level(cJSON *parent, const char *key)
{
        cJSON *j = key ? cJSON_AddObjectToObject(parent, key) : cJSON_CreateObject();

        if (!key && j && !cJSON_AddItemToArray(parent, j)) {
                cJSON_Delete(j);
                return NULL;
        }
        if (!j || !cJSON_AddStringToObject(j, "type", "ByteLevel") ||
                !cJSON_AddFalseToObject(j, "add_prefix_space") ||
                !cJSON_AddFalseToObject(j, "trim_offsets") ||
                !cJSON_AddFalseToObject(j, "use_regex"))
                return NULL;
        return j;
}

static bool add_special(cJSON *added, int32_t id, const char *content)
{
        cJSON *t = cJSON_CreateObject();

        if (!t || !cJSON_AddItemToArray(added, t)) {
                cJSON_Delete(t);
                return false;
        }
        return cJSON_AddNumberToObject(t, "id", id) &&
               cJSON_AddStringToObject(t, "content", content) &&
               cJSON_AddFalseToObject(t, "single_word") && cJSON_AddFalseToObject(t, "lstrip") &&
               cJSON_AddFalseToObject(t, "rstrip") && cJSON_AddFalseToObject(t, "normalized") &&
               cJSON_AddTrueToObject(t, "special");
}

static bool add_pair(cJSON *merges, const char *a, const char *b)
{
        cJSON *pair = cJSON_CreateArray();

        if (!pair || !cJSON_AddItemToArray(merges, pair)) {
                cJSON_Delete(pair);
                return false;
        }
        cJSON *ja = cJSON_CreateString(a), *jb = cJSON_CreateString(b);
        bool ok = ja && jb && cJSON_AddItemToArray(pair, ja) && cJSON_AddItemToArray(pair, jb);
        if (!ok) {
                cJSON_Delete(ja);
                cJSON_Delete(jb);
        }
        return ok;
}

static const char *const SPECIALS[] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};

static int build_vocab(uint32_t max_vocab, Vocab *v)
{
        char sym[3];
        int r;

        /* Ids 0..255: every byte, in the byte-level order. */
        for (int pass = 0; pass < 2; pass++)
                for (unsigned b = 0; b < 256; b++)
                        if (byte_is_printable(b) == (pass == 0)) {
                                utf8_put(sym, byte_code_point(b));
                                if ((r = vocab_add(v, sym, UINT32_MAX, 0)) < 0)
                                        return r;
                        }
        for (size_t i = 0; i < ELEMENTSOF(WORDS); i++)
                if ((r = add_word_merges(v, WORDS[i], max_vocab - SYNTH_TOKENIZER_MIN_VOCAB)) < 0)
                        return r;
        return 0;
}

/* Everything is attached to root as soon as it is created, so one cJSON_Delete frees a
 * half-built document. */
static int build_tokenizer_json(const Vocab *v, cJSON **ret, SynthTokens *ret_tokens)
{
        _cleanup_(cJSON_Deletep) cJSON *root = cJSON_CreateObject();
        SynthTokens tok = {.n_vocab = v->n + 3,
                .endoftext = (int32_t) v->n,
                .im_start = (int32_t) v->n + 1,
                .im_end = (int32_t) v->n + 2};
        bool ok = root && cJSON_AddStringToObject(root, "version", "1.0") &&
                  cJSON_AddNullToObject(root, "truncation") &&
                  cJSON_AddNullToObject(root, "padding");

        cJSON *added = ok ? cJSON_AddArrayToObject(root, "added_tokens") : NULL;
        ok = added;
        for (int i = 0; ok && i < 3; i++)
                ok = add_special(added, (int32_t) v->n + i, SPECIALS[i]);
        ok = ok && cJSON_AddNullToObject(root, "normalizer");

        cJSON *pre = ok ? cJSON_AddObjectToObject(root, "pre_tokenizer") : NULL;
        cJSON *seq = pre && cJSON_AddStringToObject(pre, "type", "Sequence")
                             ? cJSON_AddArrayToObject(pre, "pretokenizers")
                             : NULL;
        cJSON *split = seq ? cJSON_CreateObject() : NULL;
        if (split && !cJSON_AddItemToArray(seq, split)) {
                cJSON_Delete(split);
                split = NULL;
        }
        cJSON *pattern = split && cJSON_AddStringToObject(split, "type", "Split")
                                 ? cJSON_AddObjectToObject(split, "pattern")
                                 : NULL;
        ok = pattern && cJSON_AddStringToObject(pattern, "Regex", QWEN2_SPLIT) &&
             cJSON_AddStringToObject(split, "behavior", "Isolated") &&
             cJSON_AddFalseToObject(split, "invert") && add_byte_level(seq, NULL) &&
             add_byte_level(root, "post_processor") && add_byte_level(root, "decoder");

        cJSON *model = ok ? cJSON_AddObjectToObject(root, "model") : NULL;
        ok = model && cJSON_AddStringToObject(model, "type", "BPE") &&
             cJSON_AddNullToObject(model, "dropout") && cJSON_AddNullToObject(model, "unk_token") &&
             cJSON_AddStringToObject(model, "continuing_subword_prefix", "") &&
             cJSON_AddStringToObject(model, "end_of_word_suffix", "") &&
             cJSON_AddFalseToObject(model, "fuse_unk") &&
             cJSON_AddFalseToObject(model, "byte_fallback") &&
             cJSON_AddFalseToObject(model, "ignore_merges");

        cJSON *vocab = ok ? cJSON_AddObjectToObject(model, "vocab") : NULL;
        ok = vocab;
        for (uint32_t i = 0; ok && i < v->n; i++)
                ok = cJSON_AddNumberToObject(vocab, v->tokens[i], i);
        cJSON *merges = ok ? cJSON_AddArrayToObject(model, "merges") : NULL;
        ok = merges;
        for (uint32_t i = 0; ok && i < v->n_merges; i++)
                ok = add_pair(merges, v->tokens[v->merges[i][0]], v->tokens[v->merges[i][1]]);
        if (!ok)
                return -ENOMEM;

        *ret = TAKE_PTR(root);
        *ret_tokens = tok;
        return 0;
}

static int build_tokenizer_config(const SynthTokens *tok, cJSON **ret)
{
        _cleanup_(cJSON_Deletep) cJSON *j = cJSON_CreateObject();
        cJSON *dec = j ? cJSON_AddObjectToObject(j, "added_tokens_decoder") : NULL;
        char id[16];
        bool ok = dec;

        for (int i = 0; ok && i < 3; i++) {
                snprintf(id, sizeof(id), "%d", tok->endoftext + i);
                cJSON *t = cJSON_AddObjectToObject(dec, id);
                ok = t && cJSON_AddStringToObject(t, "content", SPECIALS[i]) &&
                     cJSON_AddFalseToObject(t, "lstrip") &&
                     cJSON_AddFalseToObject(t, "normalized") &&
                     cJSON_AddFalseToObject(t, "rstrip") &&
                     cJSON_AddFalseToObject(t, "single_word") &&
                     cJSON_AddTrueToObject(t, "special");
        }
        ok = ok && cJSON_AddFalseToObject(j, "add_bos_token") &&
             cJSON_AddFalseToObject(j, "add_prefix_space") &&
             cJSON_AddStringToObject(j, "bos_token", "<|endoftext|>") &&
             cJSON_AddStringToObject(j, "eos_token", "<|endoftext|>") &&
             cJSON_AddStringToObject(j, "pad_token", "<|endoftext|>") &&
             cJSON_AddStringToObject(j, "chat_template", CHATML_TEMPLATE) &&
             cJSON_AddNumberToObject(j, "model_max_length", 32768) &&
             cJSON_AddStringToObject(j, "tokenizer_class", "Qwen2Tokenizer") &&
             cJSON_AddTrueToObject(j, "_dsd_synthetic") &&
             cJSON_AddStringToObject(j, "_dsd_note",
                     "synthetic tokenizer made by dsquant synth: 256 byte symbols plus merges of "
                     "a few common English words; the model's weights are random");
        if (!ok)
                return -ENOMEM;
        *ret = TAKE_PTR(j);
        return 0;
}

int synth_tokenizer_write(const char *outdir, uint32_t max_vocab, SynthTokens *ret, DsError *err)
{
        _cleanup_(cJSON_Deletep) cJSON *tj = NULL;
        _cleanup_(cJSON_Deletep) cJSON *tc = NULL;
        _cleanup_(vocab_done) Vocab v = {0};
        SynthTokens tok;
        int r;

        if (max_vocab < SYNTH_TOKENIZER_MIN_VOCAB)
                return ds_error(err, -EINVAL,
                        "a vocabulary of %u is smaller than the %u ids the "
                        "synthetic tokenizer needs",
                        max_vocab, SYNTH_TOKENIZER_MIN_VOCAB);

        r = build_vocab(max_vocab, &v);
        if (r >= 0)
                r = build_tokenizer_json(&v, &tj, &tok);
        if (r >= 0)
                r = build_tokenizer_config(&tok, &tc);
        if (r < 0)
                return ds_error(err, r, "building the tokenizer: %s", strerror(-r));

        r = out_write_json(outdir, "tokenizer.json", tj, err);
        if (r >= 0)
                r = out_write_json(outdir, "tokenizer_config.json", tc, err);
        if (r < 0)
                return r;
        *ret = tok;
        return 0;
}
