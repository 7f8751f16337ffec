/* SPDX-License-Identifier: MIT */
/* tokenizer.json loading and encoding. The pipeline follows Hugging Face tokenizers:
 * added tokens are split off the raw text, the rest is normalized, split by the
 * pre-tokenizer's regexes, and each piece goes through BPE on its own. */
#include <assert.h>
#include <cjson/cJSON.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <utf8proc.h>

#include "tok_internal.h"

#define TOKENIZER_FILE_MAX (1u << 30)

static const char GPT2_PATTERN[] =
        "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

// --- byte-level alphabet

/* GPT-2's bytes_to_unicode(): printable bytes keep their code point, the other 68 take
 * U+0100.. in ascending byte order. */
static uint32_t byte_level_cp(uint8_t b)
{
        if ((b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || b >= 0xae)
                return b;
        uint32_t n = 0;
        for (unsigned c = 0; c < b; c++)
                if (!((c >= '!' && c <= '~') || (c >= 0xa1 && c <= 0xac) || c >= 0xae))
                        n++;
        return 256 + n;
}

static size_t utf8_put(uint32_t cp, char out[static 4])
{
        return (size_t) utf8proc_encode_char((utf8proc_int32_t) cp, (utf8proc_uint8_t *) out);
}

/* Maps a byte-level token string back to bytes. Returns false when some character is
 * outside the alphabet: the ByteLevel decoder then keeps the string as it is. */
static bool byte_level_unmap(
        const int16_t cp_to_byte[static 324], const char *s, size_t len, TokBuf *out)
{
        for (size_t i = 0; i < len;) {
                utf8proc_int32_t cp;
                utf8proc_ssize_t k = utf8proc_iterate(
                        (const utf8proc_uint8_t *) s + i, (utf8proc_ssize_t) (len - i), &cp);
                if (k <= 0 || cp < 0 || cp >= 324 || cp_to_byte[cp] < 0)
                        return false;
                char b = (char) cp_to_byte[cp];
                if (tokbuf_append(out, &b, 1) < 0)
                        return false;
                i += (size_t) k;
        }
        return true;
}

// --- JSON helpers

static const cJSON *jget(const cJSON *o, const char *key)
{
        return cJSON_IsObject(o) ? cJSON_GetObjectItemCaseSensitive(o, key) : NULL;
}

static const char *jstr(const cJSON *o, const char *key)
{
        const cJSON *v = jget(o, key);
        return cJSON_IsString(v) ? v->valuestring : NULL;
}

/* A missing or null boolean takes the default; anything else but a boolean is an error. */
static int jbool(const cJSON *o, const char *key, bool def, bool *ret)
{
        const cJSON *v = jget(o, key);
        if (!v || cJSON_IsNull(v)) {
                *ret = def;
                return 0;
        }
        if (!cJSON_IsBool(v))
                return -DS_ERR_FORMAT;
        *ret = cJSON_IsTrue(v);
        return 0;
}

static bool jint(const cJSON *v, int64_t lo, int64_t hi, int64_t *ret)
{
        if (!cJSON_IsNumber(v) || !(v->valuedouble >= (double) lo) ||
                !(v->valuedouble <= (double) hi) ||
                v->valuedouble != (double) (int64_t) v->valuedouble)
                return false;
        *ret = (int64_t) v->valuedouble;
        return true;
}

// --- model

static int parse_merge(const cJSON *m, const char **ret_a, const char **ret_b, char **ret_buf)
{
        if (cJSON_IsArray(m)) {
                if (cJSON_GetArraySize(m) != 2 || !cJSON_IsString(m->child) ||
                        !cJSON_IsString(m->child->next))
                        return -DS_ERR_FORMAT;
                *ret_a = m->child->valuestring;
                *ret_b = m->child->next->valuestring;
                *ret_buf = NULL;
                return 0;
        }
        if (!cJSON_IsString(m))
                return -DS_ERR_FORMAT;
        /* "a b": exactly one space, as Hugging Face requires. */
        const char *sp = strchr(m->valuestring, ' ');
        if (!sp || strchr(sp + 1, ' '))
                return -DS_ERR_FORMAT;
        char *buf = strdup(m->valuestring);
        if (!buf)
                return -ENOMEM;
        buf[sp - m->valuestring] = 0;
        *ret_a = buf;
        *ret_b = buf + (sp - m->valuestring) + 1;
        *ret_buf = buf;
        return 0;
}

static int parse_model(Tokenizer *t, const cJSON *model, const char *name, DsError *err)
{
        const char *type = jstr(model, "type");
        const cJSON *vocab = jget(model, "vocab"), *merges = jget(model, "merges");
        int64_t id;
        int r;

        if (!cJSON_IsObject(model))
                return ds_error(err, -DS_ERR_FORMAT, "%s: no \"model\" object", name);
        /* Hugging Face accepts an untyped model and infers it from its fields. */
        if (type ? strcmp(type, "BPE") != 0 : !merges)
                return ds_error(err, -DS_ERR_UNSUPPORTED, "%s: model type '%s' is not supported",
                        name, type ?: "(untyped)");
        if (!cJSON_IsObject(vocab) || !cJSON_IsArray(merges))
                return ds_error(
                        err, -DS_ERR_FORMAT, "%s: BPE model needs \"vocab\" and \"merges\"", name);

        const cJSON *dropout = jget(model, "dropout");
        if (dropout && !cJSON_IsNull(dropout) &&
                !(cJSON_IsNumber(dropout) && dropout->valuedouble == 0))
                return ds_error(err, -DS_ERR_UNSUPPORTED, "%s: BPE dropout is not supported", name);
        const char *cont = jstr(model, "continuing_subword_prefix");
        const char *suffix = jstr(model, "end_of_word_suffix");
        if ((cont && *cont) || (suffix && *suffix))
                return ds_error(err, -DS_ERR_UNSUPPORTED,
                        "%s: BPE continuing_subword_prefix/end_of_word_suffix are not supported",
                        name);
        if (jbool(model, "byte_fallback", false, &t->byte_fallback) < 0 ||
                jbool(model, "fuse_unk", false, &t->fuse_unk) < 0 ||
                jbool(model, "ignore_merges", false, &t->ignore_merges) < 0)
                return ds_error(err, -DS_ERR_FORMAT, "%s: a BPE flag is not a boolean", name);

        const cJSON *e;
        cJSON_ArrayForEach(e, vocab)
        {
                if (!e->string || !jint(e, 0, TOK_ID_MAX - 1, &id))
                        return ds_error(err, -DS_ERR_FORMAT,
                                "%s: vocab entry '%s' needs an id below %u", name, e->string ?: "",
                                TOK_ID_MAX);
                r = strmap_put(&t->vocab, e->string, strlen(e->string), (int32_t) id);
                if (r < 0)
                        return ds_error(err, r, "%s: out of memory", name);
                if (r > 0)
                        return ds_error(err, -DS_ERR_FORMAT, "%s: vocab token '%s' appears twice",
                                name, e->string);
                t->n_vocab = MAX(t->n_vocab, (uint32_t) id + 1);
        }

        size_t rank = 0;
        cJSON_ArrayForEach(e, merges)
        {
                _cleanup_free_ char *buf = NULL, *joined = NULL;
                const char *a, *b;

                if (parse_merge(e, &a, &b, &buf) < 0)
                        return ds_error(
                                err, -DS_ERR_FORMAT, "%s: merge %zu is malformed", name, rank);
                int32_t ia = strmap_get(&t->vocab, a, strlen(a));
                int32_t ib = strmap_get(&t->vocab, b, strlen(b));
                if (asprintf(&joined, "%s%s", a, b) < 0)
                        return ds_error(err, -ENOMEM, "%s: out of memory", name);
                int32_t ij = strmap_get(&t->vocab, joined, strlen(joined));
                if (ia < 0 || ib < 0 || ij < 0)
                        return ds_error(err, -DS_ERR_FORMAT,
                                "%s: merge %zu ('%s' '%s') uses a token not in the vocab", name,
                                rank, a, b);
                /* A repeated pair keeps its last rank, as Hugging Face's map does. */
                r = u64map_set(&t->merges, (uint64_t) ia << 32 | (uint32_t) ib,
                        (uint64_t) rank << 32 | (uint32_t) ij);
                if (r < 0)
                        return ds_error(err, r, "%s: out of memory", name);
                rank++;
        }

        const char *unk = jstr(model, "unk_token");
        t->unk = -1;
        if (unk) {
                t->unk = strmap_get(&t->vocab, unk, strlen(unk));
                if (t->unk < 0)
                        return ds_error(err, -DS_ERR_FORMAT,
                                "%s: unk_token '%s' is not in the vocab", name, unk);
        }
        for (unsigned b = 0; b < 256; b++) {
                char hex[8];
                snprintf(hex, sizeof(hex), "<0x%02X>", b);
                t->fallback[b] = strmap_get(&t->vocab, hex, strlen(hex));
        }
        return 0;
}

// --- added tokens

static int trie_add(AddedTrie *tr, const char *s, size_t len, int32_t index)
{
        size_t node = 0;
        int r;

        if (!tr->node_token) {
                tr->node_token = malloc(sizeof(int32_t));
                if (!tr->node_token)
                        return -ENOMEM;
                tr->node_token[0] = -1;
                tr->n_nodes = 1;
        }
        tr->first[(uint8_t) s[0] >> 3] |= (uint8_t) (1u << ((uint8_t) s[0] & 7));
        for (size_t i = 0; i < len; i++) {
                uint64_t key = (uint64_t) node << 8 | (uint8_t) s[i], child;
                if (u64map_get(&tr->edges, key, &child)) {
                        node = child;
                        continue;
                }
                int32_t *nt = realloc(tr->node_token, (tr->n_nodes + 1) * sizeof(*nt));
                if (!nt)
                        return -ENOMEM;
                tr->node_token = nt;
                nt[tr->n_nodes] = -1;
                r = u64map_set(&tr->edges, key, tr->n_nodes);
                if (r < 0)
                        return r;
                node = tr->n_nodes++;
        }
        /* The same content twice: the later entry wins, like a map insert. */
        tr->node_token[node] = index;
        return 0;
}

static int normalize(const Tokenizer *t, const char *s, size_t len, char **ret, size_t *ret_len);

static int parse_added(Tokenizer *t, const cJSON *added, const char *name, DsError *err)
{
        const cJSON *e;
        int64_t id;
        int r;

        if (!added || cJSON_IsNull(added))
                return 0;
        if (!cJSON_IsArray(added))
                return ds_error(err, -DS_ERR_FORMAT, "%s: \"added_tokens\" is not an array", name);
        size_t n = (size_t) cJSON_GetArraySize(added);
        t->added = calloc(n ? n : 1, sizeof(*t->added));
        if (!t->added)
                return ds_error(err, -ENOMEM, "%s: out of memory", name);

        cJSON_ArrayForEach(e, added)
        {
                AddedToken *a = &t->added[t->n_added];
                const char *content = jstr(e, "content");

                if (!content || !*content || !jint(jget(e, "id"), 0, TOK_ID_MAX - 1, &id))
                        return ds_error(err, -DS_ERR_FORMAT,
                                "%s: added token %zu needs a non-empty content and an id below %u",
                                name, t->n_added, TOK_ID_MAX);
                a->id = (int32_t) id;
                if (jbool(e, "lstrip", false, &a->lstrip) < 0 ||
                        jbool(e, "rstrip", false, &a->rstrip) < 0 ||
                        jbool(e, "single_word", false, &a->single_word) < 0 ||
                        jbool(e, "normalized", false, &a->normalized) < 0 ||
                        jbool(e, "special", false, &a->special) < 0)
                        return ds_error(err, -DS_ERR_FORMAT,
                                "%s: added token '%s' has a non-boolean flag", name, content);
                a->content = strdup(content);
                if (!a->content)
                        return ds_error(err, -ENOMEM, "%s: out of memory", name);
                a->len = strlen(content);
                t->n_added++;
                t->n_vocab = MAX(t->n_vocab, a->id + 1u);
                /* id_to_token looks at added tokens first, so a later duplicate only loses
                 * its text lookup, never its id. */
                r = strmap_put(&t->added_by_text, a->content, a->len, a->id);
                if (r < 0)
                        return ds_error(err, r, "%s: out of memory", name);
        }
        return 0;
}

/* Tries are built after the normalizer is known: a normalized token is matched in its
 * normalized form. */
static int build_tries(Tokenizer *t, const char *name, DsError *err)
{
        int r;

        for (size_t i = 0; i < t->n_added; i++) {
                AddedToken *a = &t->added[i];
                if (!a->normalized) {
                        r = trie_add(&t->trie_raw, a->content, a->len, (int32_t) i);
                } else {
                        _cleanup_free_ char *norm = NULL;
                        size_t n;
                        r = normalize(t, a->content, a->len, &norm, &n);
                        if (r >= 0 && n > 0)
                                r = trie_add(&t->trie_norm, norm, n, (int32_t) i);
                }
                if (r < 0)
                        return ds_error(
                                err, r, "%s: added token '%s' cannot be indexed", name, a->content);
        }
        return 0;
}

// --- normalizer

static int add_norm(Tokenizer *t, NormKind kind, const char *a, const char *b)
{
        NormStep *n = realloc(t->norm, (t->n_norm + 1) * sizeof(*n));
        if (!n)
                return -ENOMEM;
        t->norm = n;
        n[t->n_norm] = (NormStep){.kind = kind};
        if ((a && !(n[t->n_norm].a = strdup(a))) || (b && !(n[t->n_norm].b = strdup(b)))) {
                free(n[t->n_norm].a);
                return -ENOMEM;
        }
        t->n_norm++;
        return 0;
}

static int parse_normalizer(
        Tokenizer *t, const cJSON *n, const char *name, unsigned depth, DsError *err)
{
        const char *type = jstr(n, "type");
        int r = 0;

        if (!n || cJSON_IsNull(n))
                return 0;
        if (depth > 8 || !type)
                return ds_error(err, -DS_ERR_FORMAT, "%s: malformed normalizer", name);
        if (!strcmp(type, "Sequence")) {
                const cJSON *e, *list = jget(n, "normalizers");
                if (!cJSON_IsArray(list))
                        return ds_error(
                                err, -DS_ERR_FORMAT, "%s: normalizer Sequence needs a list", name);
                cJSON_ArrayForEach(e, list)
                {
                        r = parse_normalizer(t, e, name, depth + 1, err);
                        if (r < 0)
                                return r;
                }
                return 0;
        }
        if (!strcmp(type, "NFC"))
                r = add_norm(t, NORM_NFC, NULL, NULL);
        else if (!strcmp(type, "Prepend")) {
                const char *p = jstr(n, "prepend");
                if (!p)
                        return ds_error(
                                err, -DS_ERR_FORMAT, "%s: Prepend normalizer without text", name);
                r = add_norm(t, NORM_PREPEND, p, NULL);
        } else if (!strcmp(type, "Replace")) {
                const char *from = jstr(jget(n, "pattern"), "String"), *to = jstr(n, "content");
                if (!from || !*from || !to)
                        return ds_error(err, -DS_ERR_UNSUPPORTED,
                                "%s: Replace normalizer: only a non-empty String pattern is "
                                "supported",
                                name);
                r = add_norm(t, NORM_REPLACE, from, to);
        } else
                return ds_error(err, -DS_ERR_UNSUPPORTED, "%s: normalizer '%s' is not supported",
                        name, type);
        if (r < 0)
                return ds_error(err, r, "%s: out of memory", name);
        return 0;
}

int tok_replace_all(const char *s, size_t len, const char *from, const char *to, TokBuf *out)
{
        size_t fl = strlen(from), tl = strlen(to);
        int r;

        for (size_t i = 0; i < len;) {
                if (len - i >= fl && !memcmp(s + i, from, fl)) {
                        r = tokbuf_append(out, to, tl);
                        i += fl;
                } else
                        r = tokbuf_append(out, s + i++, 1);
                if (r < 0)
                        return r;
        }
        return 0;
}

/* Runs the normalizer over s; *ret is malloc'ed (NUL-terminated). */
static int normalize(const Tokenizer *t, const char *s, size_t len, char **ret, size_t *ret_len)
{
        _cleanup_(tokbuf_done) TokBuf cur = {};
        int r;

        r = tokbuf_append(&cur, s, len);
        if (r < 0)
                return r;
        for (size_t i = 0; i < t->n_norm; i++) {
                const NormStep *n = &t->norm[i];
                _cleanup_(tokbuf_done) TokBuf next = {};

                switch (n->kind) {
                case NORM_NFC: {
                        if (!cur.n)
                                continue;
                        utf8proc_uint8_t *dst = NULL;
                        utf8proc_ssize_t k = utf8proc_map((const utf8proc_uint8_t *) cur.p,
                                (utf8proc_ssize_t) cur.n, &dst, UTF8PROC_STABLE | UTF8PROC_COMPOSE);
                        if (k < 0)
                                return k == UTF8PROC_ERROR_NOMEM ? -ENOMEM : -EILSEQ;
                        r = tokbuf_append(&next, dst, (size_t) k);
                        free(dst);
                        break;
                }
                case NORM_PREPEND:
                        if (!cur.n)
                                continue;
                        r = tokbuf_append(&next, n->a, strlen(n->a));
                        if (r >= 0)
                                r = tokbuf_append(&next, cur.p, cur.n);
                        break;
                case NORM_REPLACE:
                        r = tok_replace_all(cur.p, cur.n, n->a, n->b, &next);
                        break;
                default:
                        assert(false);
                        r = -EINVAL;
                }
                if (r < 0)
                        return r;
                tokbuf_done(&cur);
                cur = next;
                next = (TokBuf){};
        }
        r = tokbuf_append(&cur, "", 1);
        if (r < 0)
                return r;
        *ret_len = cur.n - 1;
        *ret = TAKE_PTR(cur.p);
        return 0;
}

// --- pre-tokenizer

static int add_split(
        Tokenizer *t, const char *pattern, bool literal, const char *name, DsError *err)
{
        int errcode;
        PCRE2_SIZE erroff;

        pcre2_code *re = pcre2_compile((PCRE2_SPTR) pattern, PCRE2_ZERO_TERMINATED,
                PCRE2_UTF | PCRE2_UCP | PCRE2_NEVER_BACKSLASH_C | (literal ? PCRE2_LITERAL : 0),
                &errcode, &erroff, NULL);
        if (!re) {
                PCRE2_UCHAR msg[256];
                pcre2_get_error_message(errcode, msg, sizeof(msg));
                return ds_error(err, -DS_ERR_UNSUPPORTED,
                        "%s: Split pattern does not compile at offset %zu: %s", name,
                        (size_t) erroff, (const char *) msg);
        }
        /* Without JIT the interpreter gives the same matches, only slower. */
        (void) pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);
        pcre2_code **s = realloc(t->splits, (t->n_splits + 1) * sizeof(*s));
        if (!s) {
                pcre2_code_free(re);
                return ds_error(err, -ENOMEM, "%s: out of memory", name);
        }
        t->splits = s;
        s[t->n_splits++] = re;
        return 0;
}

static int parse_pre_tokenizer(
        Tokenizer *t, const cJSON *p, const char *name, unsigned depth, DsError *err)
{
        const char *type = jstr(p, "type");
        int r;

        if (!p || cJSON_IsNull(p))
                return 0;
        if (depth > 8 || !type)
                return ds_error(err, -DS_ERR_FORMAT, "%s: malformed pre_tokenizer", name);
        /* ByteLevel maps bytes to code points, so a Split after it would see another text. */
        if (t->byte_level && strcmp(type, "Sequence"))
                return ds_error(err, -DS_ERR_UNSUPPORTED,
                        "%s: pre-tokenizer '%s' after ByteLevel is not supported", name, type);
        if (!strcmp(type, "Sequence")) {
                const cJSON *e, *list = jget(p, "pretokenizers");
                if (!cJSON_IsArray(list))
                        return ds_error(err, -DS_ERR_FORMAT,
                                "%s: pre_tokenizer Sequence needs a list", name);
                cJSON_ArrayForEach(e, list)
                {
                        r = parse_pre_tokenizer(t, e, name, depth + 1, err);
                        if (r < 0)
                                return r;
                }
                return 0;
        }
        if (!strcmp(type, "Split")) {
                const cJSON *pat = jget(p, "pattern");
                const char *regex = jstr(pat, "Regex"), *literal = jstr(pat, "String");
                const char *behavior = jstr(p, "behavior");
                bool invert;

                if ((!regex && !literal) || jbool(p, "invert", false, &invert) < 0)
                        return ds_error(
                                err, -DS_ERR_FORMAT, "%s: malformed Split pre-tokenizer", name);
                if (!behavior || strcmp(behavior, "Isolated") || invert)
                        return ds_error(err, -DS_ERR_UNSUPPORTED,
                                "%s: Split pre-tokenizer: only behavior Isolated without invert is "
                                "supported",
                                name);
                return add_split(t, regex ?: literal, !regex, name, err);
        }
        if (!strcmp(type, "ByteLevel")) {
                bool prefix, use_regex;
                if (jbool(p, "add_prefix_space", true, &prefix) < 0 ||
                        jbool(p, "use_regex", true, &use_regex) < 0)
                        return ds_error(
                                err, -DS_ERR_FORMAT, "%s: malformed ByteLevel pre-tokenizer", name);
                /* Hugging Face prefixes every piece that reaches ByteLevel; only when it
                 * comes first is that the same as prefixing the text. */
                if (prefix && t->n_splits)
                        return ds_error(err, -DS_ERR_UNSUPPORTED,
                                "%s: ByteLevel add_prefix_space after a Split is not supported",
                                name);
                t->prefix_space = prefix;
                t->byte_level = true;
                return use_regex ? add_split(t, GPT2_PATTERN, false, name, err) : 0;
        }
        return ds_error(
                err, -DS_ERR_UNSUPPORTED, "%s: pre-tokenizer '%s' is not supported", name, type);
}

// --- decoder

typedef struct DecoderSpec {
        const char *replace_from, *replace_to;
        bool byte_fallback;
} DecoderSpec;

static int parse_decoder(
        Tokenizer *t, const cJSON *d, DecoderSpec *spec, const char *name, DsError *err)
{
        const char *type = jstr(d, "type");
        const cJSON *e;
        enum { S_REPLACE, S_BYTE_FALLBACK, S_FUSE, S_STRIP, S_END } stage = S_REPLACE;
        bool fused = false;

        if (!type)
                return ds_error(
                        err, -DS_ERR_UNSUPPORTED, "%s: a missing decoder is not supported", name);
        if (!strcmp(type, "ByteLevel")) {
                t->decoder = DECODER_BYTE_LEVEL;
                return 0;
        }
        if (strcmp(type, "Sequence") || !cJSON_IsArray(jget(d, "decoders")))
                return ds_error(
                        err, -DS_ERR_UNSUPPORTED, "%s: decoder '%s' is not supported", name, type);

        /* The SentencePiece chain, each step optional but in this order. */
        t->decoder = DECODER_SENTENCEPIECE;
        cJSON_ArrayForEach(e, jget(d, "decoders"))
        {
                const char *st = jstr(e, "type") ?: "(untyped)";
                if (!strcmp(st, "Replace") && stage <= S_REPLACE) {
                        spec->replace_from = jstr(jget(e, "pattern"), "String");
                        spec->replace_to = jstr(e, "content");
                        if (!spec->replace_from || !*spec->replace_from || !spec->replace_to)
                                return ds_error(err, -DS_ERR_UNSUPPORTED,
                                        "%s: Replace decoder: only a non-empty String pattern is "
                                        "supported",
                                        name);
                        stage = S_BYTE_FALLBACK;
                } else if (!strcmp(st, "ByteFallback") && stage <= S_BYTE_FALLBACK) {
                        spec->byte_fallback = true;
                        stage = S_FUSE;
                } else if (!strcmp(st, "Fuse") && stage <= S_FUSE) {
                        fused = true;
                        stage = S_STRIP;
                } else if (!strcmp(st, "Strip") && stage == S_STRIP && fused) {
                        const char *content = jstr(e, "content");
                        utf8proc_int32_t cp;
                        int64_t start, stop;
                        if (!content || !*content ||
                                utf8proc_iterate((const utf8proc_uint8_t *) content, -1, &cp) !=
                                        (utf8proc_ssize_t) strlen(content) ||
                                !jint(jget(e, "start"), 0, 64, &start) ||
                                !jint(jget(e, "stop"), 0, 0, &stop))
                                return ds_error(err, -DS_ERR_UNSUPPORTED,
                                        "%s: Strip decoder: only one character, start <= 64 and "
                                        "stop 0 are supported",
                                        name);
                        strcpy(t->strip_char, content);
                        t->strip_start = (uint32_t) start;
                        stage = S_END;
                } else
                        return ds_error(err, -DS_ERR_UNSUPPORTED,
                                "%s: decoder '%s' in this position of a Sequence is not supported",
                                name, st);
        }
        return 0;
}

/* Rust's u8::from_str_radix(&token[3..5], 16) behind ByteFallback's "<0xNN>" test. */
static int fallback_byte(const char *s, size_t len)
{
        if (len != 6 || memcmp(s, "<0x", 3) || s[5] != '>')
                return -1;
        const char *h = s + 3;
        if (h[0] == '+')
                h++;
        int v = 0;
        for (; h < s + 5; h++) {
                int d = *h >= '0' && *h <= '9'                     ? *h - '0'
                        : (*h | 0x20) >= 'a' && (*h | 0x20) <= 'f' ? (*h | 0x20) - 'a' + 10
                                                                   : -1;
                if (d < 0)
                        return -1;
                v = v * 16 + d;
        }
        return v;
}

static int build_pieces(Tokenizer *t, const DecoderSpec *spec, const char *name, DsError *err)
{
        _cleanup_free_ const char **text = NULL;
        _cleanup_free_ uint32_t *text_len = NULL;
        int16_t cp_to_byte[324];
        size_t n = t->n_vocab;
        int r;

        text = calloc(n ? n : 1, sizeof(*text));
        text_len = calloc(n ? n : 1, sizeof(*text_len));
        t->piece_off = calloc(n ? n : 1, sizeof(*t->piece_off));
        t->piece_len = calloc(n ? n : 1, sizeof(*t->piece_len));
        t->piece_byte = malloc((n ? n : 1) * sizeof(*t->piece_byte));
        t->piece_flags = calloc(n ? n : 1, sizeof(*t->piece_flags));
        if (!text || !text_len || !t->piece_off || !t->piece_len || !t->piece_byte ||
                !t->piece_flags)
                return ds_error(err, -ENOMEM, "%s: out of memory", name);

        for (size_t i = 0; i < t->vocab.n; i++) {
                const StrMapEntry *e = &t->vocab.entries[i];
                text[e->value] = t->vocab.arena.p + e->off;
                text_len[e->value] = e->len;
        }
        for (size_t i = 0; i < t->n_added; i++) {
                text[t->added[i].id] = t->added[i].content;
                text_len[t->added[i].id] = (uint32_t) t->added[i].len;
                t->piece_flags[t->added[i].id] |= t->added[i].special ? PIECE_SPECIAL : 0;
        }

        memset(cp_to_byte, 0xff, sizeof(cp_to_byte));
        for (unsigned b = 0; b < 256; b++)
                cp_to_byte[byte_level_cp((uint8_t) b)] = (int16_t) b;

        /* Decoding adds piece offsets to pieces.p: it must exist even if every piece is
         * empty. */
        r = tokbuf_reserve(&t->pieces, 0);
        if (r < 0)
                return ds_error(err, r, "%s: out of memory", name);
        for (size_t id = 0; id < n; id++) {
                size_t start = t->pieces.n;

                t->piece_byte[id] = -1;
                if (!text[id])
                        continue;
                t->piece_flags[id] |= PIECE_EXISTS;
                if (t->decoder == DECODER_BYTE_LEVEL) {
                        if (!byte_level_unmap(cp_to_byte, text[id], text_len[id], &t->pieces)) {
                                t->pieces.n = start;
                                r = tokbuf_append(&t->pieces, text[id], text_len[id]);
                        } else
                                r = 0;
                } else if (spec->replace_from)
                        r = tok_replace_all(text[id], text_len[id], spec->replace_from,
                                spec->replace_to, &t->pieces);
                else
                        r = tokbuf_append(&t->pieces, text[id], text_len[id]);
                if (r < 0)
                        return ds_error(err, -ENOMEM, "%s: out of memory", name);
                size_t len = t->pieces.n - start;
                if (len > TOK_PIECE_MAX || start > UINT32_MAX)
                        return ds_error(err, -DS_ERR_UNSUPPORTED,
                                "%s: token %zu decodes to %zu bytes, more than %u", name, id, len,
                                TOK_PIECE_MAX);
                t->piece_off[id] = (uint32_t) start;
                t->piece_len[id] = (uint16_t) len;
                if (spec->byte_fallback)
                        t->piece_byte[id] = (int16_t) fallback_byte(t->pieces.p + start, len);
        }
        return 0;
}

// --- loading

static int tokenizer_parse(Tokenizer *t, const cJSON *root, const char *name, DsError *err)
{
        DecoderSpec spec = {};
        int r;

        if (!cJSON_IsObject(root))
                return ds_error(err, -DS_ERR_FORMAT, "%s: not a JSON object", name);
        r = parse_model(t, jget(root, "model"), name, err);
        if (r < 0)
                return r;
        r = parse_added(t, jget(root, "added_tokens"), name, err);
        if (r < 0)
                return r;
        r = parse_normalizer(t, jget(root, "normalizer"), name, 0, err);
        if (r < 0)
                return r;
        r = parse_pre_tokenizer(t, jget(root, "pre_tokenizer"), name, 0, err);
        if (r < 0)
                return r;
        r = parse_decoder(t, jget(root, "decoder"), &spec, name, err);
        if (r < 0)
                return r;
        if (t->byte_level != (t->decoder == DECODER_BYTE_LEVEL))
                return ds_error(err, -DS_ERR_UNSUPPORTED,
                        "%s: the ByteLevel pre-tokenizer and decoder must come together", name);
        r = build_pieces(t, &spec, name, err);
        if (r < 0)
                return r;
        r = build_tries(t, name, err);
        if (r < 0)
                return r;

        /* Without tokenizer_config.json, SentencePiece-style files follow Llama: <s> first. */
        t->bos = t->eos = -1;
        if (!t->byte_level) {
                t->bos = tokenizer_token_id(t, "<s>");
                t->eos = tokenizer_token_id(t, "</s>");
                t->add_bos = t->bos >= 0;
                if (t->bos >= 0 && !(t->bos_text = strdup("<s>")))
                        return ds_error(err, -ENOMEM, "%s: out of memory", name);
        }
        return 0;
}

int tokenizer_load_from_memory(
        const char *json, size_t len, const char *name, Tokenizer **ret, DsError *err)
{
        _cleanup_(tokenizer_freep) Tokenizer *t = NULL;
        int r;

        if (!json || !name || !ret)
                return ds_error(err, -EINVAL, "tokenizer: invalid arguments");
        /* cJSON passes bytes through unchecked; the encoder relies on every string it
         * takes from the file (pieces, normalizer text) being UTF-8. */
        if (!utf8_valid(json, len))
                return ds_error(err, -DS_ERR_FORMAT, "%s: not valid UTF-8", name);
        const char *end = NULL;
        cJSON *root = cJSON_ParseWithLengthOpts(json, len, &end, false);
        if (!root)
                return ds_error(err, -DS_ERR_FORMAT, "%s: not valid JSON (near byte %td)", name,
                        end ? end - json : (ptrdiff_t) 0);

        t = calloc(1, sizeof(*t));
        if (!t) {
                cJSON_Delete(root);
                return ds_error(err, -ENOMEM, "%s: out of memory", name);
        }
        r = tokenizer_parse(t, root, name, err);
        cJSON_Delete(root);
        if (r < 0)
                return r;
        *ret = TAKE_PTR(t);
        return 0;
}

int tokenizer_read_file(const char *path, char **ret, size_t *ret_len, DsError *err)
{
        _cleanup_close_ int fd = -EBADF;
        _cleanup_free_ char *buf = NULL;
        struct stat st;
        size_t n = 0;

        fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
                return ds_error(err, -errno, "%s: cannot open: %s", path, strerror(errno));
        if (fstat(fd, &st) < 0)
                return ds_error(err, -errno, "%s: cannot stat: %s", path, strerror(errno));
        if (!S_ISREG(st.st_mode) || st.st_size > TOKENIZER_FILE_MAX)
                return ds_error(err, -EFBIG, "%s: not a regular file of at most %u bytes", path,
                        TOKENIZER_FILE_MAX);
        buf = malloc((size_t) st.st_size + 1);
        if (!buf)
                return ds_error(err, -ENOMEM, "%s: out of memory", path);
        while (n < (size_t) st.st_size) {
                ssize_t k = read(fd, buf + n, (size_t) st.st_size - n);
                if (k < 0 && errno == EINTR)
                        continue;
                if (k < 0)
                        return ds_error(err, -errno, "%s: read failed: %s", path, strerror(errno));
                if (k == 0)
                        break;
                n += (size_t) k;
        }
        buf[n] = 0;
        *ret = TAKE_PTR(buf);
        *ret_len = n;
        return 0;
}

int tokenizer_load(const char *path, Tokenizer **ret, DsError *err)
{
        _cleanup_free_ char *buf = NULL;
        size_t len;
        int r;

        if (!path || !ret)
                return ds_error(err, -EINVAL, "tokenizer: invalid arguments");
        r = tokenizer_read_file(path, &buf, &len, err);
        if (r < 0)
                return r;
        return tokenizer_load_from_memory(buf, len, path, ret, err);
}

static void trie_done(AddedTrie *tr)
{
        u64map_done(&tr->edges);
        free(tr->node_token);
}

Tokenizer *tokenizer_free(Tokenizer *t)
{
        if (!t)
                return NULL;
        strmap_done(&t->vocab);
        strmap_done(&t->added_by_text);
        u64map_done(&t->merges);
        for (size_t i = 0; i < t->n_norm; i++) {
                free(t->norm[i].a);
                free(t->norm[i].b);
        }
        free(t->norm);
        for (size_t i = 0; i < t->n_splits; i++)
                pcre2_code_free(t->splits[i]);
        free(t->splits);
        for (size_t i = 0; i < t->n_added; i++)
                free(t->added[i].content);
        free(t->added);
        trie_done(&t->trie_raw);
        trie_done(&t->trie_norm);
        free(t->piece_off);
        free(t->piece_len);
        free(t->piece_byte);
        free(t->piece_flags);
        tokbuf_done(&t->pieces);
        free(t->bos_text);
        free(t);
        return NULL;
}

// --- encoding: added tokens

/* Rust's char::is_whitespace (the White_Space property). */
static bool cp_is_space(int32_t c)
{
        return (c >= 0x09 && c <= 0x0d) || c == 0x20 || c == 0x85 || c == 0xa0 || c == 0x1680 ||
               (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f ||
               c == 0x205f || c == 0x3000;
}

/* Rust regex's Unicode \w, which single_word tests at both ends: Alphabetic, marks,
 * decimal digits, connector punctuation and joiners. Alphabetic is taken as letters, Nl,
 * and the enclosed Latin letters that Other_Alphabetic adds outside the marks. */
static bool cp_is_word(int32_t c)
{
        if (c == 0x200c || c == 0x200d || (c >= 0x24b6 && c <= 0x24e9) ||
                (c >= 0x1f130 && c <= 0x1f149) || (c >= 0x1f150 && c <= 0x1f169) ||
                (c >= 0x1f170 && c <= 0x1f189))
                return true;
        switch (utf8proc_category(c)) {
        case UTF8PROC_CATEGORY_LU:
        case UTF8PROC_CATEGORY_LL:
        case UTF8PROC_CATEGORY_LT:
        case UTF8PROC_CATEGORY_LM:
        case UTF8PROC_CATEGORY_LO:
        case UTF8PROC_CATEGORY_MN:
        case UTF8PROC_CATEGORY_MC:
        case UTF8PROC_CATEGORY_ME:
        case UTF8PROC_CATEGORY_ND:
        case UTF8PROC_CATEGORY_NL:
        case UTF8PROC_CATEGORY_PC:
                return true;
        default:
                return false;
        }
}

static size_t utf8_prev(const char *s, size_t pos)
{
        do
                pos--;
        while (pos > 0 && ((uint8_t) s[pos] & 0xc0) == 0x80);
        return pos;
}

static int32_t cp_at(const char *s, size_t pos, size_t len)
{
        utf8proc_int32_t cp = -1;
        utf8proc_iterate((const utf8proc_uint8_t *) s + pos, (utf8proc_ssize_t) (len - pos), &cp);
        return cp;
}

typedef struct Seg {
        size_t start, end;
        int32_t id; /* an added token, or -1 for text */
} Seg;

static int seg_push(TokBuf *segs, size_t start, size_t end, int32_t id)
{
        return tokbuf_append(segs, &(Seg){start, end, id}, sizeof(Seg));
}

/* Hugging Face's AddedVocabulary::find_matches: leftmost-longest matches, non-overlapping,
 * with single_word, lstrip and rstrip applied to each. */
static int added_split(
        const Tokenizer *t, const AddedTrie *tr, const char *s, size_t len, TokBuf *segs)
{
        size_t start_offset = 0, i = 0;
        int r;

        while (tr->n_nodes > 1 && i < len) {
                uint8_t c = (uint8_t) s[i];
                if (!(tr->first[c >> 3] & (1u << (c & 7)))) {
                        i++;
                        continue;
                }
                int32_t best = -1;
                size_t stop = 0, node = 0;
                for (size_t j = i; j < len; j++) {
                        uint64_t child;
                        if (!u64map_get(&tr->edges, (uint64_t) node << 8 | (uint8_t) s[j], &child))
                                break;
                        node = child;
                        if (tr->node_token[node] >= 0) {
                                best = tr->node_token[node];
                                stop = j + 1;
                        }
                }
                if (best < 0) {
                        i++;
                        continue;
                }

                const AddedToken *a = &t->added[best];
                size_t start = i;
                i = stop;
                if (a->single_word) {
                        bool start_space =
                                start == 0 || !cp_is_word(cp_at(s, utf8_prev(s, start), len));
                        bool stop_space = stop == len || !cp_is_word(cp_at(s, stop, len));
                        if (!start_space || !stop_space)
                                continue;
                }
                if (a->lstrip) {
                        size_t ns = start;
                        while (ns > 0 && cp_is_space(cp_at(s, utf8_prev(s, ns), len)))
                                ns = utf8_prev(s, ns);
                        start = MAX(ns, start_offset);
                }
                if (a->rstrip) {
                        while (stop < len) {
                                int32_t cp = cp_at(s, stop, len);
                                if (!cp_is_space(cp))
                                        break;
                                stop += (size_t) utf8proc_encode_char(cp, (utf8proc_uint8_t[4]){});
                        }
                        i = stop;
                }
                if (start_offset < start) {
                        r = seg_push(segs, start_offset, start, -1);
                        if (r < 0)
                                return r;
                }
                r = seg_push(segs, start, stop, a->id);
                if (r < 0)
                        return r;
                start_offset = stop;
        }
        if (start_offset < len)
                return seg_push(segs, start_offset, len, -1);
        return 0;
}

// --- encoding: BPE

typedef struct Merge {
        int32_t rank, pos, left, right, merged;
} Merge;

static bool merge_before(const Merge *a, const Merge *b)
{
        return a->rank != b->rank ? a->rank < b->rank : a->pos < b->pos;
}

static int heap_push(TokBuf *h, Merge m)
{
        int r = tokbuf_append(h, &m, sizeof(m));
        if (r < 0)
                return r;
        Merge *a = (Merge *) h->p;
        for (size_t i = h->n / sizeof(m) - 1; i > 0;) {
                size_t p = (i - 1) / 2;
                if (!merge_before(&a[i], &a[p]))
                        break;
                Merge tmp = a[i];
                a[i] = a[p];
                a[p] = tmp;
                i = p;
        }
        return 0;
}

static Merge heap_pop(TokBuf *h)
{
        Merge *a = (Merge *) h->p, top = a[0];
        size_t n = h->n / sizeof(top) - 1;

        a[0] = a[n];
        h->n -= sizeof(top);
        for (size_t i = 0;;) {
                size_t l = 2 * i + 1, m = i;
                if (l < n && merge_before(&a[l], &a[m]))
                        m = l;
                if (l + 1 < n && merge_before(&a[l + 1], &a[m]))
                        m = l + 1;
                if (m == i)
                        break;
                Merge tmp = a[i];
                a[i] = a[m];
                a[m] = tmp;
                i = m;
        }
        return top;
}

typedef struct Sym {
        int32_t id, prev, next;
} Sym;

static int try_pair(const Tokenizer *t, TokBuf *heap, const Sym *syms, int32_t pos)
{
        uint64_t v;
        int32_t next = syms[pos].next;

        if (next < 0 || !u64map_get(&t->merges,
                                (uint64_t) syms[pos].id << 32 | (uint32_t) syms[next].id, &v))
                return 0;
        return heap_push(heap, (Merge){.rank = (int32_t) (v >> 32),
                                       .pos = pos,
                                       .left = syms[pos].id,
                                       .right = syms[next].id,
                                       .merged = (int32_t) (uint32_t) v});
}

static int sym_add(TokBuf *syms, int32_t id)
{
        int32_t n = (int32_t) (syms->n / sizeof(Sym));
        return tokbuf_append(syms, &(Sym){id, n - 1, -1}, sizeof(Sym));
}

/* One pre-tokenized piece through BPE: one symbol per character (per byte when
 * byte-level), then the lowest-ranked adjacent pair is merged, leftmost first, until no
 * pair has a merge, as Hugging Face's Word::merge_all does. */
static int bpe_piece(const Tokenizer *t, const char *s, size_t len, TokBuf *out)
{
        _cleanup_(tokbuf_done) TokBuf syms = {}, heap = {}, mapped = {};
        int32_t unk = -1;
        int r;

        if (t->byte_level) {
                for (size_t i = 0; i < len; i++) {
                        char u[4];
                        r = tokbuf_append(&mapped, u, utf8_put(byte_level_cp((uint8_t) s[i]), u));
                        if (r < 0)
                                return r;
                }
        }
        if (t->ignore_merges) {
                int32_t id = t->byte_level ? strmap_get(&t->vocab, mapped.p, mapped.n)
                                           : strmap_get(&t->vocab, s, len);
                if (id >= 0)
                        return tokbuf_append(out, &id, sizeof(id));
        }

        const char *chars = t->byte_level ? mapped.p : s;
        size_t n_chars = t->byte_level ? mapped.n : len;
        for (size_t i = 0; i < n_chars;) {
                int k = utf8_classify((const uint8_t *) chars + i, n_chars - i);
                assert(k > 0);
                int32_t id = strmap_get(&t->vocab, chars + i, (size_t) k);
                if (id >= 0) {
                        if (unk >= 0) {
                                r = sym_add(&syms, unk);
                                if (r < 0)
                                        return r;
                                unk = -1;
                        }
                        r = sym_add(&syms, id);
                } else {
                        bool all = t->byte_fallback;
                        for (int j = 0; all && j < k; j++)
                                all = t->fallback[(uint8_t) chars[i + j]] >= 0;
                        r = 0;
                        if (all) {
                                /* Hugging Face adds these before a pending unk. */
                                for (int j = 0; r >= 0 && j < k; j++)
                                        r = sym_add(&syms, t->fallback[(uint8_t) chars[i + j]]);
                        } else if (t->unk >= 0) {
                                if (unk >= 0 && !t->fuse_unk)
                                        r = sym_add(&syms, unk);
                                unk = t->unk;
                        }
                }
                if (r < 0)
                        return r;
                i += (size_t) k;
        }
        if (unk >= 0) {
                r = sym_add(&syms, unk);
                if (r < 0)
                        return r;
        }

        Sym *sy = (Sym *) syms.p;
        int32_t n = (int32_t) (syms.n / sizeof(Sym));
        if (n > 0)
                sy[n - 1].next = -1;
        for (int32_t i = 0; i + 1 < n; i++) {
                sy[i].next = i + 1;
                r = try_pair(t, &heap, sy, i);
                if (r < 0)
                        return r;
        }
        while (heap.n) {
                Merge m = heap_pop(&heap);
                Sym *a = &sy[m.pos];
                /* Stale entries: the left symbol was merged away or its neighbour changed. */
                if (a->id != m.left || a->next < 0 || sy[a->next].id != m.right)
                        continue;
                int32_t b = a->next;
                a->id = m.merged;
                a->next = sy[b].next;
                if (a->next >= 0)
                        sy[a->next].prev = m.pos;
                sy[b].id = -1;
                if (a->prev >= 0) {
                        r = try_pair(t, &heap, sy, a->prev);
                        if (r < 0)
                                return r;
                }
                r = try_pair(t, &heap, sy, m.pos);
                if (r < 0)
                        return r;
        }
        for (int32_t i = 0; i < n; i = sy[i].next) {
                r = tokbuf_append(out, &sy[i].id, sizeof(int32_t));
                if (r < 0)
                        return r;
                if (sy[i].next < 0)
                        break;
        }
        return 0;
}

// --- encoding: pre-tokenizer

typedef struct Span {
        size_t off, len;
} Span;

static int split_pieces(const pcre2_code *re, pcre2_match_data *md, const char *s, const Span *in,
        size_t n_in, TokBuf *out, DsError *err)
{
        int r;

        for (size_t p = 0; p < n_in; p++) {
                const char *subj = s + in[p].off;
                size_t len = in[p].len, pos = 0, last = 0;

                while (pos < len) {
                        int rc = pcre2_match(
                                re, (PCRE2_SPTR) subj, len, pos, PCRE2_NO_UTF_CHECK, md, NULL);
                        if (rc == PCRE2_ERROR_NOMATCH)
                                break;
                        if (rc < 0) {
                                PCRE2_UCHAR msg[256];
                                pcre2_get_error_message(rc, msg, sizeof(msg));
                                return ds_error(err, -EOVERFLOW,
                                        "tokenizer: regex match failed: %s", (const char *) msg);
                        }
                        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
                        if (ov[1] <= ov[0]) {
                                /* An empty match splits nothing: step over one character. */
                                pos = ov[0] + 1;
                                while (pos < len && ((uint8_t) subj[pos] & 0xc0) == 0x80)
                                        pos++;
                                continue;
                        }
                        if (ov[0] > last) {
                                r = tokbuf_append(
                                        out, &(Span){in[p].off + last, ov[0] - last}, sizeof(Span));
                                if (r < 0)
                                        return ds_error(err, r, "tokenizer: out of memory");
                        }
                        r = tokbuf_append(
                                out, &(Span){in[p].off + ov[0], ov[1] - ov[0]}, sizeof(Span));
                        if (r < 0)
                                return ds_error(err, r, "tokenizer: out of memory");
                        last = pos = ov[1];
                }
                if (last < len) {
                        r = tokbuf_append(out, &(Span){in[p].off + last, len - last}, sizeof(Span));
                        if (r < 0)
                                return ds_error(err, r, "tokenizer: out of memory");
                }
        }
        return 0;
}

/* Normalized text (no added tokens in it) -> pieces -> BPE ids. */
static int encode_text(const Tokenizer *t, pcre2_match_data *md, const char *s, size_t len,
        TokBuf *out, DsError *err)
{
        _cleanup_(tokbuf_done) TokBuf a = {}, b = {}, prefixed = {};
        int r;

        if (!len)
                return 0;
        if (t->prefix_space && s[0] != ' ') {
                if (tokbuf_append(&prefixed, " ", 1) < 0 || tokbuf_append(&prefixed, s, len) < 0)
                        return ds_error(err, -ENOMEM, "tokenizer: out of memory");
                s = prefixed.p;
                len = prefixed.n;
        }
        r = tokbuf_append(&a, &(Span){0, len}, sizeof(Span));
        if (r < 0)
                return ds_error(err, r, "tokenizer: out of memory");
        for (size_t i = 0; i < t->n_splits; i++) {
                b.n = 0;
                r = split_pieces(
                        t->splits[i], md, s, (const Span *) a.p, a.n / sizeof(Span), &b, err);
                if (r < 0)
                        return r;
                TokBuf tmp = a;
                a = b;
                b = tmp;
        }
        for (size_t i = 0; i < a.n / sizeof(Span); i++) {
                const Span *sp = &((const Span *) a.p)[i];
                r = bpe_piece(t, s + sp->off, sp->len, out);
                if (r < 0)
                        return ds_error(err, r, "tokenizer: out of memory");
        }
        return 0;
}

static void match_data_freep(pcre2_match_data **md)
{
        pcre2_match_data_free(*md);
}

int tokenizer_encode(const Tokenizer *t, const char *text, size_t len, int32_t **ret_ids,
        size_t *ret_n, DsError *err)
{
        _cleanup_(tokbuf_done) TokBuf out = {}, segs = {};
        _cleanup_(match_data_freep) pcre2_match_data *md = NULL;
        int r;

        if (!t || (!text && len) || !ret_ids || !ret_n)
                return ds_error(err, -EINVAL, "tokenizer: invalid arguments");
        if (!utf8_valid(text, len))
                return ds_error(err, -EILSEQ, "tokenizer: text is not valid UTF-8");
        if (t->n_splits) {
                /* 64 pairs is plenty: Split only needs the whole match. */
                md = pcre2_match_data_create(64, NULL);
                if (!md)
                        return ds_error(err, -ENOMEM, "tokenizer: out of memory");
        }

        r = added_split(t, &t->trie_raw, text ?: "", len, &segs);
        if (r < 0)
                return ds_error(err, r, "tokenizer: out of memory");
        for (size_t i = 0; i < segs.n / sizeof(Seg); i++) {
                const Seg *sg = &((const Seg *) segs.p)[i];
                _cleanup_(tokbuf_done) TokBuf segs2 = {};
                _cleanup_free_ char *norm = NULL;
                size_t n_norm;

                if (sg->id >= 0) {
                        r = tokbuf_append(&out, &sg->id, sizeof(int32_t));
                        if (r < 0)
                                return ds_error(err, r, "tokenizer: out of memory");
                        continue;
                }
                r = normalize(t, text + sg->start, sg->end - sg->start, &norm, &n_norm);
                if (r < 0)
                        return ds_error(err, r, "tokenizer: normalization failed");
                r = added_split(t, &t->trie_norm, norm, n_norm, &segs2);
                if (r < 0)
                        return ds_error(err, r, "tokenizer: out of memory");
                for (size_t j = 0; j < segs2.n / sizeof(Seg); j++) {
                        const Seg *s2 = &((const Seg *) segs2.p)[j];
                        if (s2->id >= 0)
                                r = tokbuf_append(&out, &s2->id, sizeof(int32_t)) < 0
                                            ? ds_error(err, -ENOMEM, "tokenizer: out of memory")
                                            : 0;
                        else
                                r = encode_text(
                                        t, md, norm + s2->start, s2->end - s2->start, &out, err);
                        if (r < 0)
                                return r;
                }
        }
        *ret_n = out.n / sizeof(int32_t);
        if (!out.p && tokbuf_reserve(&out, 1) < 0)
                return ds_error(err, -ENOMEM, "tokenizer: out of memory");
        *ret_ids = (int32_t *) TAKE_PTR(out.p);
        return 0;
}

// --- lookups

uint32_t tokenizer_n_vocab(const Tokenizer *t)
{
        return t ? t->n_vocab : 0;
}

int32_t tokenizer_token_id(const Tokenizer *t, const char *token)
{
        if (!t || !token)
                return -1;
        int32_t id = strmap_get(&t->added_by_text, token, strlen(token));
        return id >= 0 ? id : strmap_get(&t->vocab, token, strlen(token));
}

int32_t tokenizer_bos(const Tokenizer *t)
{
        return t ? t->bos : -1;
}

int32_t tokenizer_eos(const Tokenizer *t)
{
        return t ? t->eos : -1;
}

bool tokenizer_add_bos(const Tokenizer *t)
{
        return t && t->add_bos && t->bos >= 0;
}

ChatFamily tokenizer_chat_family(const Tokenizer *t)
{
        return t ? t->chat : CHAT_NONE;
}

bool tokenizer_is_special(const Tokenizer *t, int32_t id)
{
        return t && id >= 0 && (uint32_t) id < t->n_vocab && (t->piece_flags[id] & PIECE_SPECIAL);
}
