/* SPDX-License-Identifier: MIT */
/* The wire ABI at run time: the sizes and offsets wire.h pins with static_assert, checked
 * again by a program (so a compiler that ignored an attribute would still be caught), and
 * the layout the daemon builds by default. */
#include <errno.h>
#include <stddef.h>
#include <string.h>

#include "test_util.h"
#include "wire.h"

#define EXPECT_OFF(type, field, off)                                                               \
        CHECK(offsetof(type, field) == (off), "%s.%s at %zu", #type, #field, offsetof(type, field))

int main(void)
{
        struct ds_wire_layout l;

        CHECK(sizeof(struct ds_wire_hello) == 48, "hello");
        CHECK(sizeof(struct ds_wire_welcome) == 408, "welcome");
        CHECK(sizeof(struct ds_wire_seg_header) == 64, "seg header");
        CHECK(sizeof(struct ds_wire_ring_ctl) == 256, "ring ctl");
        CHECK(sizeof(union ds_wire_slot) == DS_WIRE_SLOT_SIZE, "slot");
        CHECK(sizeof(struct ds_wire_submit) == 88, "submit");
        CHECK(sizeof(struct ds_wire_final) == 64, "final");
        CHECK(sizeof(struct ds_wire_error) == 216, "error");
        CHECK(sizeof(struct ds_wire_info) == 48, "info");
        EXPECT_OFF(struct ds_wire_welcome, layout, DS_WIRE_WELCOME_STABLE);
        EXPECT_OFF(struct ds_wire_welcome, info, 248);
        EXPECT_OFF(struct ds_wire_ring_ctl, tail, 64);
        EXPECT_OFF(struct ds_wire_ring_ctl, consumer_waiting, 128);
        EXPECT_OFF(struct ds_wire_ring_ctl, producer_waiting, 192);
        EXPECT_OFF(struct ds_wire_submit, sampling, 16);
        EXPECT_OFF(struct ds_wire_submit, prompt, 64);
        EXPECT_OFF(struct ds_wire_submit, n_messages, 84);
        EXPECT_OFF(struct ds_wire_token, text, 40);
        EXPECT_OFF(struct ds_wire_text, text, 24);
        EXPECT_OFF(struct ds_wire_logprobs, top, 24);
        EXPECT_OFF(struct ds_wire_final, publish_ns, 56);
        EXPECT_OFF(struct ds_wire_error, message, 24);

        /* The default layout is valid, cache-line aligned and page-rounded. */
        CHECK(wire_layout_init(DS_WIRE_DEFAULT_SUB_SLOTS, DS_WIRE_DEFAULT_CPL_SLOTS,
                      DS_WIRE_DEFAULT_DATA, &l) == 0,
                "default layout");
        CHECK(wire_layout_validate(&l) == 0, "default layout valid");
        CHECK(l.segment_size % 4096 == 0, "page-rounded");
        CHECK(l.sub_ctl == 64 && l.cpl_ctl == 320 && l.sub_slots == 576, "offsets %u %u %u",
                l.sub_ctl, l.cpl_ctl, l.sub_slots);
        CHECK(l.data == l.cpl_slots + DS_WIRE_DEFAULT_CPL_SLOTS * DS_WIRE_SLOT_SIZE, "data");

        /* Bad parameters are refused. */
        CHECK(wire_layout_init(3, 8, 4096, &l) == -EINVAL, "non power of two");
        CHECK(wire_layout_init(8, 2 * DS_WIRE_MAX_SLOTS, 4096, &l) == -EINVAL, "too many");
        CHECK(wire_layout_init(8, 8, 0, &l) == -EINVAL, "no data");
        CHECK(wire_layout_init(8, 8, DS_WIRE_MAX_DATA + 1, &l) == -EINVAL, "data too big");
        return 0;
}
