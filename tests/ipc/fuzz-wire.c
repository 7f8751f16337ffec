/* SPDX-License-Identifier: MIT */
/* Fuzzes the decoders the daemon runs on client bytes, and the client on daemon bytes.
 * The first input byte picks one:
 *   0: a stream of socket frames [u32 len][record + data], as the daemon reads them;
 *   1: a hello;  2: a welcome;  3: one d2c record;
 *   4: a ring record plus a data area, as the daemon reads a submission from a segment.
 * Accepted submissions go on to the stop and chat decoders over the bytes they point at,
 * as the daemon would, so every offset that passes validation is also dereferenced. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "wire.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void submission(const union ds_wire_slot *s, const uint8_t *area, uint32_t area_size)
{
        const struct ds_wire_submit *sub = &s->submit;
        uint32_t pos = 0, n, role;
        const uint8_t *p;
        volatile uint32_t sum = 0;

        if (wire_c2d_validate(s, area_size) < 0 || s->hdr.type != DS_WIRE_SUBMIT)
                return;
        /* The daemon copies the spans out first; so do we, sized exactly. */
        if (wire_stops_validate(area + sub->stop.off, sub->stop.len, sub->n_stop) == 0)
                while (wire_stops_next(area + sub->stop.off, sub->stop.len, &pos, &p, &n) > 0)
                        sum += p[n - 1];
        if (sub->hdr.flags == DS_WIRE_SUBMIT_CHAT &&
                wire_chat_validate(area + sub->prompt.off, sub->prompt.len, sub->n_messages) == 0)
                for (pos = 0; wire_chat_next(area + sub->prompt.off, sub->prompt.len, &pos, &role,
                                      &p, &n) > 0;)
                        sum += role + (n ? p[n - 1] : 0);
        (void) sum;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
        union ds_wire_slot s;

        if (size < 1)
                return 0;
        uint8_t kind = data[0];
        data++;
        size--;

        switch (kind % 5) {
        case 0:
                while (size >= DS_WIRE_FRAME_HDR) {
                        uint32_t len;
                        memcpy(&len, data, sizeof(len));
                        if (wire_frame_len_validate(len, true) < 0 ||
                                size - DS_WIRE_FRAME_HDR < len)
                                break;
                        memcpy(&s, data + DS_WIRE_FRAME_HDR, sizeof(s));
                        submission(&s, data + DS_WIRE_FRAME_HDR + DS_WIRE_SLOT_SIZE,
                                len - DS_WIRE_SLOT_SIZE);
                        data += DS_WIRE_FRAME_HDR + len;
                        size -= DS_WIRE_FRAME_HDR + len;
                }
                break;
        case 1: {
                struct ds_wire_hello h = {};
                memcpy(&h, data, size < sizeof(h) ? size : sizeof(h));
                (void) wire_hello_validate(&h);
                break;
        }
        case 2: {
                struct ds_wire_welcome w = {};
                memcpy(&w, data, size < sizeof(w) ? size : sizeof(w));
                if (wire_welcome_validate(&w) == 0 && w.status == 0 &&
                        w.mode == DS_WIRE_MODE_RING) {
                        struct ds_wire_layout l;
                        (void) wire_layout_init(
                                w.layout.sub_n, w.layout.cpl_n, w.layout.data_size, &l);
                }
                break;
        }
        case 3:
                memset(&s, 0, sizeof(s));
                memcpy(&s, data, size < sizeof(s) ? size : sizeof(s));
                (void) wire_d2c_validate(&s);
                break;
        default:
                if (size < sizeof(s))
                        break;
                memcpy(&s, data, sizeof(s));
                submission(&s, data + sizeof(s), (uint32_t) (size - sizeof(s)));
                break;
        }
        return 0;
}
