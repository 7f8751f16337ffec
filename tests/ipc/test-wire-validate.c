/* SPDX-License-Identifier: MIT */
/* Validation rejects every malformed field of a client's records (offsets near 2^32,
 * length overflow, bad enums and flags, NaN and out-of-range sampling), of packed stop
 * and chat lists, of handshakes and layouts, and accepts the well-formed ones. */
#include <errno.h>
#include <math.h>
#include <string.h>

#include "test_util.h"
#include "wire.h"

#define DATA 4096u

static union ds_wire_slot good_submit(void)
{
        union ds_wire_slot s;

        memset(&s, 0, sizeof(s));
        s.hdr.type = DS_WIRE_SUBMIT;
        s.hdr.flags = DS_WIRE_SUBMIT_TEXT;
        s.hdr.request_id = 1;
        s.submit.sampling = (struct ds_wire_sampling){
                .temperature = 0.7f, .top_p = 0.9f, .repetition_penalty = 1.0f};
        s.submit.max_tokens = 16;
        s.submit.prompt = (struct ds_wire_ref){0, 100};
        s.submit.stop = (struct ds_wire_ref){100, 10};
        s.submit.n_stop = 2;
        return s;
}

#define REJECT(mutation, code)                                                                     \
        do {                                                                                       \
                union ds_wire_slot s = good_submit();                                              \
                mutation;                                                                          \
                int r_ = wire_c2d_validate(&s, DATA);                                              \
                CHECK(r_ == (code), "%s: got %d", #mutation, r_);                                  \
        } while (0)

static void test_submit_rejects(void)
{
        REJECT(s.hdr.request_id = 0, -EBADMSG);
        REJECT(s.hdr.n_follow = 1, -EBADMSG);
        REJECT(s.hdr.type = 0, -EPROTO);
        REJECT(s.hdr.type = DS_WIRE_TOKEN, -EPROTO);
        REJECT(s.hdr.type = 0xffff, -EPROTO);
        REJECT(s.hdr.flags = 0, -EBADMSG);
        REJECT(s.hdr.flags = DS_WIRE_SUBMIT_TEXT | DS_WIRE_SUBMIT_IDS, -EBADMSG);
        REJECT(s.hdr.flags = 1u << 3, -EBADMSG);
        REJECT(s.hdr.flags = DS_WIRE_SUBMIT_TEXT | 0x8000, -EBADMSG);
        /* Offsets and lengths near 2^32: off + len would wrap. */
        REJECT(s.submit.prompt.off = UINT32_MAX, -EBADMSG);
        REJECT(s.submit.prompt.off = UINT32_MAX - 50, -EBADMSG);
        REJECT(s.submit.prompt.len = UINT32_MAX, -EBADMSG);
        REJECT((s.submit.prompt = (struct ds_wire_ref){0x80000000u, 0x80000000u}), -EBADMSG);
        REJECT((s.submit.prompt = (struct ds_wire_ref){DATA - 99, 100}), -EBADMSG);
        REJECT((s.submit.prompt = (struct ds_wire_ref){DATA, 1}), -EBADMSG);
        REJECT(s.submit.prompt.len = 0, -EBADMSG);
        REJECT(s.submit.stop.off = UINT32_MAX - 5, -EBADMSG);
        REJECT(s.submit.stop.len = UINT32_MAX, -EBADMSG);
        /* Counts against lengths. */
        REJECT(s.submit.n_stop = 0, -EBADMSG);
        REJECT(s.submit.n_stop = DS_WIRE_MAX_STOP + 1, -EBADMSG);
        REJECT(s.submit.n_stop = 3, -EBADMSG); /* 10 bytes cannot hold 3 entries */
        REJECT((s.submit.stop = (struct ds_wire_ref){100, 0}), -EBADMSG);
        REJECT(s.submit.top_logprobs = DS_WIRE_MAX_TOP_LOGPROBS + 1, -EBADMSG);
        REJECT(s.submit.top_logprobs = UINT32_MAX, -EBADMSG);
        REJECT(s.submit.n_messages = 1, -EBADMSG); /* TEXT has no messages */
        REJECT((s.hdr.flags = DS_WIRE_SUBMIT_IDS, s.submit.prompt.len = 6), -EBADMSG);
        REJECT((s.hdr.flags = DS_WIRE_SUBMIT_CHAT, s.submit.n_messages = 0), -EBADMSG);
        REJECT((s.hdr.flags = DS_WIRE_SUBMIT_CHAT, s.submit.n_messages = 13), -EBADMSG);
        REJECT((s.hdr.flags = DS_WIRE_SUBMIT_CHAT, s.submit.n_messages = DS_WIRE_MAX_MESSAGES + 1,
                       s.submit.prompt.len = 4000),
                -EBADMSG);
        /* Sampling: NaN, infinities, out of range, padding. */
        REJECT(s.submit.sampling.temperature = NAN, -ERANGE);
        REJECT(s.submit.sampling.temperature = -NAN, -ERANGE);
        REJECT(s.submit.sampling.temperature = INFINITY, -ERANGE);
        REJECT(s.submit.sampling.temperature = -0.5f, -ERANGE);
        REJECT(s.submit.sampling.temperature = 100.5f, -ERANGE);
        REJECT(s.submit.sampling.top_p = 1.5f, -ERANGE);
        REJECT(s.submit.sampling.top_p = NAN, -ERANGE);
        REJECT(s.submit.sampling.min_p = -0.1f, -ERANGE);
        REJECT(s.submit.sampling.repetition_penalty = 0.0f, -ERANGE);
        REJECT(s.submit.sampling.repetition_penalty = NAN, -ERANGE);
        REJECT(s.submit.sampling.presence_penalty = -INFINITY, -ERANGE);
        REJECT(s.submit.sampling.frequency_penalty = 101.0f, -ERANGE);
        REJECT(s.submit.sampling._pad0 = 1, -EBADMSG);
}

static void test_submit(void)
{
        union ds_wire_slot s = good_submit();

        CHECK(wire_c2d_validate(&s, DATA) == 0, "good submit");
        /* The span may end exactly at the end of the data area. */
        s.submit.prompt = (struct ds_wire_ref){DATA - 100, 100};
        CHECK(wire_c2d_validate(&s, DATA) == 0, "span at the end");

        test_submit_rejects();

        /* CANCEL and INFO_REQ. */
        memset(&s, 0, sizeof(s));
        s.hdr.type = DS_WIRE_CANCEL;
        s.hdr.request_id = 5;
        CHECK(wire_c2d_validate(&s, DATA) == 0, "cancel");
        s.hdr.flags = 1;
        CHECK(wire_c2d_validate(&s, DATA) == -EBADMSG, "cancel flags");
        s.hdr.flags = 0;
        s.hdr.type = DS_WIRE_INFO_REQ;
        CHECK(wire_c2d_validate(&s, DATA) == 0, "info req");
        s.hdr.request_id = 0;
        CHECK(wire_c2d_validate(&s, DATA) == -EBADMSG, "info req id 0");
}

static uint32_t put(uint8_t *p, uint32_t pos, uint32_t v)
{
        memcpy(p + pos, &v, 4);
        return pos + 4;
}

static void test_lists(void)
{
        uint8_t b[600];
        uint32_t pos = 0, n, role;
        const uint8_t *s;

        /* Two stops: "ab" and "xyz". */
        pos = put(b, pos, 2);
        memcpy(b + pos, "ab", 2);
        pos += 2;
        pos = put(b, pos, 3);
        memcpy(b + pos, "xyz", 3);
        pos += 3;
        CHECK(wire_stops_validate(b, pos, 2) == 0, "two stops");
        CHECK(wire_stops_validate(b, pos, 1) == -EBADMSG, "count too small");
        CHECK(wire_stops_validate(b, pos, 3) == -EBADMSG, "count too large");
        CHECK(wire_stops_validate(b, pos - 1, 2) == -EBADMSG, "truncated");
        CHECK(wire_stops_validate(b, pos + 1, 2) == -EBADMSG, "trailing byte");
        uint32_t it = 0;
        CHECK(wire_stops_next(b, pos, &it, &s, &n) == 1 && n == 2 && !memcmp(s, "ab", 2), "1st");
        CHECK(wire_stops_next(b, pos, &it, &s, &n) == 1 && n == 3 && !memcmp(s, "xyz", 3), "2nd");
        CHECK(wire_stops_next(b, pos, &it, &s, &n) == 0, "end");
        put(b, 0, UINT32_MAX);
        CHECK(wire_stops_validate(b, pos, 2) == -EBADMSG, "length near 2^32");
        put(b, 0, UINT32_MAX - 3);
        CHECK(wire_stops_validate(b, pos, 2) == -EBADMSG, "length wrapping pos + 4");
        put(b, 0, 0);
        CHECK(wire_stops_validate(b, pos, 2) == -EBADMSG, "empty stop");
        memset(b, 0, sizeof(b));
        put(b, 0, DS_WIRE_MAX_STOP_LEN + 1);
        CHECK(wire_stops_validate(b, 4 + DS_WIRE_MAX_STOP_LEN + 1, 1) == -EBADMSG, "long stop");

        /* Chat: system "hi", user "" (empty content is allowed). */
        pos = 0;
        pos = put(b, pos, DS_WIRE_ROLE_SYSTEM);
        pos = put(b, pos, 2);
        memcpy(b + pos, "hi", 2);
        pos += 2;
        pos = put(b, pos, DS_WIRE_ROLE_USER);
        pos = put(b, pos, 0);
        CHECK(wire_chat_validate(b, pos, 2) == 0, "chat");
        it = 0;
        CHECK(wire_chat_next(b, pos, &it, &role, &s, &n) == 1 && role == DS_WIRE_ROLE_SYSTEM &&
                        n == 2,
                "1st message");
        CHECK(wire_chat_next(b, pos, &it, &role, &s, &n) == 1 && role == DS_WIRE_ROLE_USER &&
                        n == 0,
                "2nd message");
        CHECK(wire_chat_next(b, pos, &it, &role, &s, &n) == 0, "end");
        CHECK(wire_chat_validate(b, pos, 3) == -EBADMSG, "count");
        CHECK(wire_chat_validate(b, pos - 1, 2) == -EBADMSG, "truncated header");
        put(b, 0, 0);
        CHECK(wire_chat_validate(b, pos, 2) == -EBADMSG, "role 0");
        put(b, 0, _DS_WIRE_ROLE_MAX);
        CHECK(wire_chat_validate(b, pos, 2) == -EBADMSG, "role too big");
        put(b, 0, DS_WIRE_ROLE_SYSTEM);
        put(b, 4, UINT32_MAX - 7);
        CHECK(wire_chat_validate(b, pos, 2) == -EBADMSG, "content length wraps");
}

static void test_d2c(void)
{
        union ds_wire_slot s;

        memset(&s, 0, sizeof(s));
        s.hdr.type = DS_WIRE_TOKEN;
        s.hdr.request_id = 3;
        s.token.text_len = s.token.inline_len = 5;
        CHECK(wire_d2c_validate(&s) == 0, "token");
        s.hdr.n_follow = 1; /* a LOGPROBS */
        CHECK(wire_d2c_validate(&s) == 0, "token + logprobs");
        s.hdr.n_follow = 2;
        CHECK(wire_d2c_validate(&s) == -EBADMSG, "follow count");
        s.hdr.n_follow = 0;
        s.token.inline_len = 6;
        CHECK(wire_d2c_validate(&s) == -EBADMSG, "inline > total");
        s.token.text_len = 1000;
        s.token.inline_len = 10;
        CHECK(wire_d2c_validate(&s) == -EBADMSG, "short inline with more to come");
        s.token.inline_len = DS_WIRE_TOKEN_INLINE;
        s.hdr.n_follow = 4; /* 784 bytes in 232-byte TEXT records */
        CHECK(wire_d2c_validate(&s) == 0, "long piece");
        s.token.text_len = DS_WIRE_MAX_PIECE + 1;
        CHECK(wire_d2c_validate(&s) == -EBADMSG, "piece too long");
        s.token.text_len = 5;
        s.token.inline_len = 5;
        s.hdr.n_follow = 0;
        s.token.token_id = DS_WIRE_TOKEN_NONE;
        CHECK(wire_d2c_validate(&s) == 0, "text-only token");
        s.hdr.n_follow = 1;
        CHECK(wire_d2c_validate(&s) == -EBADMSG, "text-only token with logprobs");
        s.hdr.n_follow = 0;
        s.token.token_id = -2;
        CHECK(wire_d2c_validate(&s) == -EBADMSG, "negative id");

        memset(&s, 0, sizeof(s));
        s.hdr.type = DS_WIRE_FINAL;
        s.hdr.request_id = 3;
        s.final.finish = DS_WIRE_FINISH_STOP;
        CHECK(wire_d2c_validate(&s) == 0, "final");
        s.final.finish = 0;
        CHECK(wire_d2c_validate(&s) == -EBADMSG, "finish 0");
        s.final.finish = _DS_WIRE_FINISH_MAX;
        CHECK(wire_d2c_validate(&s) == -EBADMSG, "finish too big");

        memset(&s, 0, sizeof(s));
        s.hdr.type = DS_WIRE_ERROR;
        s.error.code = DS_WIRE_ERR_BUSY;
        s.error.len = DS_WIRE_MESSAGE;
        CHECK(wire_d2c_validate(&s) == 0, "connection error");
        s.error.len = DS_WIRE_MESSAGE + 1;
        CHECK(wire_d2c_validate(&s) == -EBADMSG, "message too long");
        s.error.len = 0;
        s.error.code = 0;
        CHECK(wire_d2c_validate(&s) == -EBADMSG, "code 0");
        s.error.code = _DS_WIRE_ERR_MAX;
        CHECK(wire_d2c_validate(&s) == -EBADMSG, "code too big");

        memset(&s, 0, sizeof(s));
        s.hdr.type = DS_WIRE_LOGPROBS;
        s.hdr.request_id = 1;
        s.logprobs.n = DS_WIRE_MAX_TOP_LOGPROBS + 1;
        CHECK(wire_d2c_validate(&s) == -EBADMSG, "too many logprobs");
        s.hdr.type = DS_WIRE_SUBMIT;
        CHECK(wire_d2c_validate(&s) == -EPROTO, "wrong direction");
}

static void test_handshake(void)
{
        struct ds_wire_hello h = {
                .magic = DS_WIRE_MAGIC, .version = DS_WIRE_VERSION, .mode = DS_WIRE_MODE_RING};
        struct ds_wire_welcome w = {
                .magic = DS_WIRE_MAGIC,
                .version = DS_WIRE_VERSION,
                .mode = DS_WIRE_MODE_RING,
                .n_fds = DS_WIRE_RING_FDS,
                .info = {.model = "m", .context_length = 512, .vocab_size = 32000},
        };
        struct ds_wire_layout *l = &w.layout;

        CHECK(wire_hello_validate(&h) == 0, "hello");
        h.version = DS_WIRE_VERSION + 1;
        CHECK(wire_hello_validate(&h) == -EPROTONOSUPPORT, "hello version");
        h.version = DS_WIRE_VERSION;
        h.magic ^= 1;
        CHECK(wire_hello_validate(&h) == -EPROTO, "hello magic");
        h.magic ^= 1;
        h.mode = 3;
        CHECK(wire_hello_validate(&h) == -EBADMSG, "hello mode");
        h.mode = DS_WIRE_MODE_SOCKET;
        memset(h.name, 'x', sizeof(h.name));
        CHECK(wire_hello_validate(&h) == -EBADMSG, "unterminated name");

        CHECK(wire_layout_init(64, 256, 65536, l) == 0, "layout");
        CHECK(wire_welcome_validate(&w) == 0, "welcome");
        w.n_fds = 2;
        CHECK(wire_welcome_validate(&w) == -EBADMSG, "fd count");
        w.n_fds = DS_WIRE_RING_FDS;
        l->data = UINT32_MAX - 63;
        CHECK(wire_welcome_validate(&w) == -EBADMSG, "data near 2^32");
        CHECK(wire_layout_init(64, 256, 65536, l) == 0, "layout");
        l->cpl_slots = l->sub_slots + 64;
        CHECK(wire_layout_validate(l) == -EBADMSG, "overlap");
        CHECK(wire_layout_init(64, 256, 65536, l) == 0, "layout");
        l->sub_n = 48;
        CHECK(wire_layout_validate(l) == -EBADMSG, "not a power of two");
        CHECK(wire_layout_init(64, 256, 65536, l) == 0, "layout");
        l->sub_ctl += 4;
        CHECK(wire_layout_validate(l) == -EBADMSG, "misaligned");
        CHECK(wire_layout_init(64, 256, 65536, l) == 0, "layout");
        l->segment_size = 1ull << 40;
        CHECK(wire_layout_validate(l) == -EBADMSG, "segment too big");
        CHECK(wire_layout_init(64, 256, 65536, l) == 0, "layout");
        w.info.vocab_size = 0;
        CHECK(wire_welcome_validate(&w) == -EBADMSG, "vocab 0");
        w.info.vocab_size = 32000;
        memset(w.info.model, 'x', sizeof(w.info.model));
        CHECK(wire_welcome_validate(&w) == -EBADMSG, "unterminated model");
        w.status = DS_WIRE_ERR_VERSION;
        w.version = DS_WIRE_VERSION + 7;
        CHECK(wire_welcome_check_version(&w) == -EPROTONOSUPPORT, "version");

        CHECK(wire_frame_len_validate(DS_WIRE_SLOT_SIZE, false) == 0, "d2c frame");
        CHECK(wire_frame_len_validate(DS_WIRE_SLOT_SIZE + 1, false) == -EBADMSG, "d2c long");
        CHECK(wire_frame_len_validate(DS_WIRE_MAX_FRAME, true) == 0, "c2d max");
        CHECK(wire_frame_len_validate(DS_WIRE_MAX_FRAME + 1, true) == -EBADMSG, "c2d too long");
        CHECK(wire_frame_len_validate(UINT32_MAX, true) == -EBADMSG, "c2d 2^32-1");
        CHECK(wire_frame_len_validate(DS_WIRE_SLOT_SIZE - 1, true) == -EBADMSG, "c2d short");
}

int main(void)
{
        test_submit();
        test_lists();
        test_d2c();
        test_handshake();
        return 0;
}
