/* SPDX-License-Identifier: MIT */
/* Decoding, whole and incremental. Both run the same state machine, so a stream's output
 * is tokenizer_decode()'s output cut at character boundaries.
 *
 * ByteLevel: the pieces' bytes are concatenated and read as UTF-8 the way Rust's
 * from_utf8_lossy does (one U+FFFD per maximal invalid subpart), so only an unfinished
 * character is ever held back.
 *
 * SentencePiece: a run of <0xNN> tokens becomes its bytes when the whole run is valid
 * UTF-8 and one U+FFFD per token otherwise (ByteFallback), so a run is held until a
 * non-byte token ends it; then Strip removes leading characters of the fused text. */
#include <assert.h>
#include <string.h>

#include "tok_internal.h"

static_assert(3 * (TOK_PIECE_MAX + 3) <= TOK_STREAM_OUT_MAX, "a ByteLevel push fits");
static_assert(
        3 * (TOK_STREAM_RUN_MAX - 1) + TOK_PIECE_MAX <= TOK_STREAM_OUT_MAX, "an SP push fits");

void decode_state_init(const Tokenizer *t, DecodeState *d, bool stream)
{
        *d = (DecodeState){
                .strip_left = t->strip_start,
                .skip_special_for_strip = stream,
                .run_max = stream ? TOK_STREAM_RUN_MAX : SIZE_MAX,
        };
}

/* Moves the decidable prefix of pending to out; at the end, an unfinished tail too. */
static int lossy_drain(TokBuf *pending, TokBuf *out, bool final)
{
        const uint8_t *p = (const uint8_t *) pending->p;
        size_t i = 0;
        int r = 0;

        while (i < pending->n && r >= 0) {
                int k = utf8_classify(p + i, pending->n - i);
                if (k > 0) {
                        r = tokbuf_append(out, p + i, (size_t) k);
                        i += (size_t) k;
                } else if (k < 0) {
                        r = tokbuf_append(out, UTF8_REPLACEMENT, 3);
                        i += (size_t) -k;
                } else if (final) {
                        r = tokbuf_append(out, UTF8_REPLACEMENT, 3);
                        i = pending->n;
                } else
                        break;
        }
        if (i) {
                memmove(pending->p, pending->p + i, pending->n - i);
                pending->n -= i;
        }
        return r;
}

static int emit_text(
        const Tokenizer *t, DecodeState *d, const char *s, size_t len, bool special, TokBuf *out)
{
        if (d->strip_left && !(special && d->skip_special_for_strip)) {
                size_t sl = strlen(t->strip_char);
                while (d->strip_left && len >= sl && !memcmp(s, t->strip_char, sl)) {
                        s += sl;
                        len -= sl;
                        d->strip_left--;
                }
                if (len)
                        d->strip_left = 0;
        }
        return tokbuf_append(out, s, len);
}

static int finish_run(const Tokenizer *t, DecodeState *d, TokBuf *out)
{
        int r = 0;

        if (!d->pending.n)
                return 0;
        if (utf8_valid(d->pending.p, d->pending.n))
                r = emit_text(t, d, d->pending.p, d->pending.n, false, out);
        else
                for (size_t i = 0; i < d->pending.n && r >= 0; i++)
                        r = emit_text(t, d, UTF8_REPLACEMENT, 3, false, out);
        d->pending.n = 0;
        return r;
}

int decode_push(const Tokenizer *t, DecodeState *d, int32_t id, TokBuf *out)
{
        int r;

        /* Hugging Face drops ids it has no token for. */
        if (id < 0 || (uint32_t) id >= t->n_vocab || !(t->piece_flags[id] & PIECE_EXISTS))
                return 0;
        const char *piece = t->pieces.p + t->piece_off[id];
        size_t len = t->piece_len[id];

        if (t->decoder == DECODER_BYTE_LEVEL) {
                r = tokbuf_append(&d->pending, piece, len);
                if (r < 0)
                        return r;
                return lossy_drain(&d->pending, out, false);
        }

        if (t->piece_byte[id] >= 0) {
                char b = (char) t->piece_byte[id];
                r = tokbuf_append(&d->pending, &b, 1);
                if (r < 0)
                        return r;
                /* Streams bound what one push returns: a run this long is decided now. */
                return d->pending.n >= d->run_max ? finish_run(t, d, out) : 0;
        }
        r = finish_run(t, d, out);
        if (r < 0)
                return r;
        return emit_text(t, d, piece, len, t->piece_flags[id] & PIECE_SPECIAL, out);
}

int decode_flush(const Tokenizer *t, DecodeState *d, TokBuf *out)
{
        if (t->decoder == DECODER_BYTE_LEVEL)
                return lossy_drain(&d->pending, out, true);
        return finish_run(t, d, out);
}

int tokenizer_decode(const Tokenizer *t, const int32_t *ids, size_t n, char **ret_text,
        size_t *ret_len, DsError *err)
{
        _cleanup_(tokbuf_done) TokBuf out = {};
        DecodeState d;
        int r = 0;

        if (!t || (!ids && n) || !ret_text)
                return ds_error(err, -EINVAL, "tokenizer: invalid arguments");
        decode_state_init(t, &d, false);
        for (size_t i = 0; i < n && r >= 0; i++)
                r = decode_push(t, &d, ids[i], &out);
        if (r >= 0)
                r = decode_flush(t, &d, &out);
        if (r >= 0)
                r = tokbuf_append(&out, "", 1);
        tokbuf_done(&d.pending);
        if (r < 0)
                return ds_error(err, r, "tokenizer: out of memory while decoding");
        if (ret_len)
                *ret_len = out.n - 1;
        *ret_text = TAKE_PTR(out.p);
        return 0;
}

struct TokStream {
        const Tokenizer *t;
        DecodeState d;
        TokBuf out; /* scratch for one push, reused */
};

int tok_stream_new(const Tokenizer *t, TokStream **ret)
{
        if (!t || !ret)
                return -EINVAL;
        TokStream *s = calloc(1, sizeof(*s));
        if (!s)
                return -ENOMEM;
        s->t = t;
        decode_state_init(t, &s->d, true);
        *ret = s;
        return 0;
}

TokStream *tok_stream_free(TokStream *s)
{
        if (!s)
                return NULL;
        tokbuf_done(&s->d.pending);
        tokbuf_done(&s->out);
        free(s);
        return NULL;
}

int tok_stream_prime(TokStream *s, const int32_t *ids, size_t n)
{
        int r;

        if (!s || (!ids && n))
                return -EINVAL;
        for (size_t i = 0; i < n; i++) {
                s->out.n = 0;
                r = decode_push(s->t, &s->d, ids[i], &s->out);
                if (r < 0)
                        return r;
        }
        s->out.n = 0;
        return 0;
}

static int stream_take(TokStream *s, char out[static TOK_STREAM_OUT_MAX])
{
        assert(s->out.n <= TOK_STREAM_OUT_MAX);
        if (s->out.n)
                memcpy(out, s->out.p, s->out.n);
        return (int) s->out.n;
}

int tok_stream_push(TokStream *s, int32_t id, char out[static TOK_STREAM_OUT_MAX])
{
        int r;

        if (!s || !out)
                return -EINVAL;
        s->out.n = 0;
        r = decode_push(s->t, &s->d, id, &s->out);
        if (r < 0)
                return r;
        return stream_take(s, out);
}

int tok_stream_flush(TokStream *s, char out[static TOK_STREAM_OUT_MAX])
{
        int r;

        if (!s || !out)
                return -EINVAL;
        s->out.n = 0;
        r = decode_flush(s->t, &s->d, &s->out);
        if (r < 0)
                return r;
        return stream_take(s, out);
}
