/* SPDX-License-Identifier: MIT */
/* Validation of wire records: pure functions of bytes the caller already copied out of
 * shared memory or off the socket. They read each field once, check it against its
 * documented range with overflow-safe arithmetic, and never repair anything. */
#include <errno.h>
#include <math.h>
#include <string.h>

#include "wire.h"

#define ELEMENTS(x) (sizeof(x) / sizeof((x)[0]))

static bool is_pow2(uint32_t n)
{
        return n != 0 && (n & (n - 1)) == 0;
}

/* NUL-padded text fields must hold a terminator so readers can use them as C strings. */
static bool has_nul(const char *s, size_t size)
{
        return memchr(s, 0, size) != NULL;
}

int wire_hello_validate(const struct ds_wire_hello *h)
{
        if (h->magic != DS_WIRE_MAGIC)
                return -EPROTO;
        if (h->version != DS_WIRE_VERSION)
                return -EPROTONOSUPPORT;
        if (h->mode != DS_WIRE_MODE_RING && h->mode != DS_WIRE_MODE_SOCKET)
                return -EBADMSG;
        if (h->flags != 0 || !has_nul(h->name, sizeof(h->name)))
                return -EBADMSG;
        return 0;
}

int wire_welcome_check_version(const struct ds_wire_welcome *w)
{
        if (w->magic != DS_WIRE_MAGIC)
                return -EPROTO;
        if (w->version != DS_WIRE_VERSION)
                return -EPROTONOSUPPORT;
        return 0;
}

int wire_layout_init(uint32_t sub_n, uint32_t cpl_n, uint32_t data_size, struct ds_wire_layout *ret)
{
        struct ds_wire_layout l = {};
        uint64_t off;

        if (!is_pow2(sub_n) || !is_pow2(cpl_n) || sub_n > DS_WIRE_MAX_SLOTS ||
                cpl_n > DS_WIRE_MAX_SLOTS || data_size == 0 || data_size > DS_WIRE_MAX_DATA)
                return -EINVAL;

        /* Every part starts on a cache line; the sums stay far below 2^32 given the
         * limits above (2 * 65536 * 256 + 256 MiB + a few lines). */
        off = sizeof(struct ds_wire_seg_header);
        l.sub_ctl = (uint32_t) off;
        off += sizeof(struct ds_wire_ring_ctl);
        l.cpl_ctl = (uint32_t) off;
        off += sizeof(struct ds_wire_ring_ctl);
        l.sub_slots = (uint32_t) off;
        l.sub_n = sub_n;
        off += (uint64_t) sub_n * DS_WIRE_SLOT_SIZE;
        l.cpl_slots = (uint32_t) off;
        l.cpl_n = cpl_n;
        off += (uint64_t) cpl_n * DS_WIRE_SLOT_SIZE;
        l.data = (uint32_t) off;
        l.data_size = data_size;
        off += data_size;
        l.segment_size = (off + 4095) & ~(uint64_t) 4095;
        if (l.segment_size > DS_WIRE_MAX_SEGMENT)
                return -EINVAL;

        *ret = l;
        return 0;
}

typedef struct Span {
        uint64_t off, len;
} Span;

int wire_layout_validate(const struct ds_wire_layout *l)
{
        uint64_t size = l->segment_size;
        Span parts[] = {
                {0, sizeof(struct ds_wire_seg_header)},
                {l->sub_ctl, sizeof(struct ds_wire_ring_ctl)},
                {l->cpl_ctl, sizeof(struct ds_wire_ring_ctl)},
                {l->sub_slots, (uint64_t) l->sub_n * DS_WIRE_SLOT_SIZE},
                {l->cpl_slots, (uint64_t) l->cpl_n * DS_WIRE_SLOT_SIZE},
                {l->data, l->data_size},
        };

        if (size == 0 || size > DS_WIRE_MAX_SEGMENT || size % 4096 != 0)
                return -EBADMSG;
        if (!is_pow2(l->sub_n) || !is_pow2(l->cpl_n) || l->sub_n > DS_WIRE_MAX_SLOTS ||
                l->cpl_n > DS_WIRE_MAX_SLOTS)
                return -EBADMSG;
        if (l->data_size == 0 || l->data_size > DS_WIRE_MAX_DATA)
                return -EBADMSG;
        for (size_t i = 0; i < ELEMENTS(parts); i++) {
                if (parts[i].off % DS_WIRE_CACHELINE != 0 ||
                        !wire_span_ok(parts[i].off, parts[i].len, size))
                        return -EBADMSG;
                /* Pairwise disjoint: one ends before the other starts. */
                for (size_t j = 0; j < i; j++)
                        if (parts[i].off < parts[j].off + parts[j].len &&
                                parts[j].off < parts[i].off + parts[i].len)
                                return -EBADMSG;
        }
        return 0;
}

int wire_welcome_validate(const struct ds_wire_welcome *w)
{
        const struct ds_wire_server_info *info = &w->info;
        int r;

        r = wire_welcome_check_version(w);
        if (r < 0)
                return r;
        if (w->status >= _DS_WIRE_ERR_MAX || !has_nul(w->message, sizeof(w->message)))
                return -EBADMSG;
        if (w->status != DS_WIRE_OK)
                return 0; /* nothing else is meaningful in a refusal */
        if (w->mode == DS_WIRE_MODE_RING) {
                if (w->n_fds != DS_WIRE_RING_FDS)
                        return -EBADMSG;
                r = wire_layout_validate(&w->layout);
                if (r < 0)
                        return r;
        } else if (w->mode == DS_WIRE_MODE_SOCKET) {
                if (w->n_fds != 0)
                        return -EBADMSG;
        } else
                return -EBADMSG;
        if (!has_nul(info->model, sizeof(info->model)) || info->context_length == 0 ||
                info->vocab_size == 0 || info->vocab_size > INT32_MAX)
                return -EBADMSG;
        return 0;
}

static bool in_range(float v, float lo, float hi)
{
        /* NaN fails both comparisons, so it is out of every range. */
        return v >= lo && v <= hi;
}

int wire_sampling_validate(const struct ds_wire_sampling *s)
{
        if (!in_range(s->temperature, 0.0f, DS_WIRE_MAX_TEMPERATURE) ||
                !in_range(s->top_p, 0.0f, 1.0f) || !in_range(s->min_p, 0.0f, 1.0f) ||
                !in_range(s->repetition_penalty, 0.0f, DS_WIRE_MAX_REP_PENALTY) ||
                s->repetition_penalty == 0.0f ||
                !in_range(s->presence_penalty, -DS_WIRE_MAX_PENALTY, DS_WIRE_MAX_PENALTY) ||
                !in_range(s->frequency_penalty, -DS_WIRE_MAX_PENALTY, DS_WIRE_MAX_PENALTY))
                return -ERANGE;
        if (s->_pad0 != 0)
                return -EBADMSG;
        return 0;
}

static int submit_validate(const struct ds_wire_submit *s, uint32_t data_size)
{
        uint16_t kind = s->hdr.flags;
        int r;

        if ((kind & ~DS_WIRE_SUBMIT_KINDS) != 0 || !is_pow2(kind))
                return -EBADMSG; /* unknown bits, or not exactly one kind */
        if (s->top_logprobs > DS_WIRE_MAX_TOP_LOGPROBS || s->n_stop > DS_WIRE_MAX_STOP)
                return -EBADMSG;
        if (!wire_span_ok(s->prompt.off, s->prompt.len, data_size) ||
                !wire_span_ok(s->stop.off, s->stop.len, data_size))
                return -EBADMSG;
        if (s->prompt.len == 0)
                return -EBADMSG;
        /* Each stop string takes 4 + 1..MAX_STOP_LEN bytes. */
        if ((s->n_stop == 0) != (s->stop.len == 0) ||
                s->stop.len > s->n_stop * (4 + DS_WIRE_MAX_STOP_LEN) ||
                s->stop.len < s->n_stop * 5u)
                return -EBADMSG;

        switch (kind) {
        case DS_WIRE_SUBMIT_TEXT:
                if (s->n_messages != 0)
                        return -EBADMSG;
                break;
        case DS_WIRE_SUBMIT_IDS:
                if (s->n_messages != 0 || s->prompt.len % sizeof(int32_t) != 0)
                        return -EBADMSG;
                break;
        default: /* DS_WIRE_SUBMIT_CHAT: each message takes at least its 8-byte header */
                if (s->n_messages == 0 || s->n_messages > DS_WIRE_MAX_MESSAGES ||
                        s->prompt.len / 8 < s->n_messages)
                        return -EBADMSG;
                break;
        }

        r = wire_sampling_validate(&s->sampling);
        if (r < 0)
                return r;
        return 0;
}

int wire_c2d_validate(const union ds_wire_slot *s, uint32_t data_size)
{
        if (s->hdr.request_id == 0 || s->hdr.n_follow != 0)
                return -EBADMSG;

        switch (s->hdr.type) {
        case DS_WIRE_SUBMIT:
                return submit_validate(&s->submit, data_size);
        case DS_WIRE_CANCEL:
        case DS_WIRE_INFO_REQ:
                return s->hdr.flags == 0 ? 0 : -EBADMSG;
        default:
                return -EPROTO;
        }
}

/* Records of one token event: its TEXT records, then LOGPROBS if present. */
static uint32_t text_records(uint32_t text_len, uint32_t inline_len)
{
        uint32_t rest = text_len - inline_len;
        return (rest + DS_WIRE_TEXT_INLINE - 1) / DS_WIRE_TEXT_INLINE;
}

int wire_d2c_validate(const union ds_wire_slot *s)
{
        const struct ds_wire_hdr *h = &s->hdr;

        if (h->type != DS_WIRE_TOKEN && h->n_follow != 0)
                return -EBADMSG;
        /* Only an ERROR may be about the connection rather than a request. */
        if (h->request_id == 0 && h->type != DS_WIRE_ERROR)
                return -EBADMSG;

        switch (h->type) {
        case DS_WIRE_TOKEN: {
                const struct ds_wire_token *t = &s->token;
                uint32_t n_text;

                if (t->text_len > DS_WIRE_MAX_PIECE || t->inline_len > DS_WIRE_TOKEN_INLINE ||
                        t->inline_len > t->text_len || t->token_id < DS_WIRE_TOKEN_NONE ||
                        h->flags != 0)
                        return -EBADMSG;
                /* Text that fits inline is inline. */
                if (t->inline_len < t->text_len && t->inline_len != DS_WIRE_TOKEN_INLINE)
                        return -EBADMSG;
                n_text = text_records(t->text_len, t->inline_len);
                if (h->n_follow != n_text &&
                        (h->n_follow != n_text + 1 || t->token_id == DS_WIRE_TOKEN_NONE))
                        return -EBADMSG;
                return 0;
        }
        case DS_WIRE_TEXT:
                return h->flags == 0 && s->text.len >= 1 && s->text.len <= DS_WIRE_TEXT_INLINE
                               ? 0
                               : -EBADMSG;
        case DS_WIRE_LOGPROBS:
                return h->flags == 0 && s->logprobs.n >= 1 &&
                                       s->logprobs.n <= DS_WIRE_MAX_TOP_LOGPROBS
                               ? 0
                               : -EBADMSG;
        case DS_WIRE_FINAL:
                return h->flags == 0 && s->final.finish >= DS_WIRE_FINISH_LENGTH &&
                                       s->final.finish < _DS_WIRE_FINISH_MAX
                               ? 0
                               : -EBADMSG;
        case DS_WIRE_ERROR:
                return h->flags == 0 && s->error.code > DS_WIRE_OK &&
                                       s->error.code < _DS_WIRE_ERR_MAX &&
                                       s->error.len <= DS_WIRE_MESSAGE
                               ? 0
                               : -EBADMSG;
        case DS_WIRE_INFO:
                return h->flags == 0 && s->info.kv_blocks_free <= s->info.kv_blocks_total
                               ? 0
                               : -EBADMSG;
        default:
                return -EPROTO;
        }
}

static uint32_t get_u32(const uint8_t *p)
{
        uint32_t v;
        memcpy(&v, p, sizeof(v));
        return v;
}

int wire_stops_next(
        const uint8_t *buf, uint32_t len, uint32_t *pos, const uint8_t **ret, uint32_t *ret_len)
{
        uint32_t p = *pos, n;

        if (p == len)
                return 0;
        if (!wire_span_ok(p, 4, len))
                return -EBADMSG;
        n = get_u32(buf + p);
        if (n == 0 || n > DS_WIRE_MAX_STOP_LEN || !wire_span_ok((uint64_t) p + 4, n, len))
                return -EBADMSG;
        *ret = buf + p + 4;
        *ret_len = n;
        *pos = p + 4 + n;
        return 1;
}

int wire_stops_validate(const uint8_t *buf, uint32_t len, uint32_t n_stop)
{
        uint32_t pos = 0, count = 0, n;
        const uint8_t *s;
        int r;

        while ((r = wire_stops_next(buf, len, &pos, &s, &n)) > 0)
                if (++count > n_stop)
                        return -EBADMSG;
        if (r < 0)
                return r;
        return count == n_stop ? 0 : -EBADMSG;
}

int wire_chat_next(const uint8_t *buf, uint32_t len, uint32_t *pos, uint32_t *ret_role,
        const uint8_t **ret, uint32_t *ret_len)
{
        uint32_t p = *pos, role, n;

        if (p == len)
                return 0;
        if (!wire_span_ok(p, 8, len))
                return -EBADMSG;
        role = get_u32(buf + p);
        n = get_u32(buf + p + 4);
        if (role < DS_WIRE_ROLE_SYSTEM || role >= _DS_WIRE_ROLE_MAX ||
                !wire_span_ok((uint64_t) p + 8, n, len))
                return -EBADMSG;
        *ret_role = role;
        *ret = buf + p + 8;
        *ret_len = n;
        *pos = p + 8 + n;
        return 1;
}

int wire_chat_validate(const uint8_t *buf, uint32_t len, uint32_t n_messages)
{
        uint32_t pos = 0, count = 0, role, n;
        const uint8_t *s;
        int r;

        while ((r = wire_chat_next(buf, len, &pos, &role, &s, &n)) > 0)
                if (++count > n_messages)
                        return -EBADMSG;
        if (r < 0)
                return r;
        return count == n_messages ? 0 : -EBADMSG;
}

int wire_frame_len_validate(uint32_t len, bool c2d)
{
        if (c2d)
                return len >= DS_WIRE_SLOT_SIZE && len <= DS_WIRE_MAX_FRAME ? 0 : -EBADMSG;
        return len == DS_WIRE_SLOT_SIZE ? 0 : -EBADMSG;
}
