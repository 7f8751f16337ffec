/* SPDX-License-Identifier: MIT */
/* The HTTP parser on arbitrary bytes: fed whole and then in pieces cut where the input
 * says, it must reach the same end (state and status) and never read out of bounds. */
#include <stdint.h>
#include <string.h>

#include "http_parser.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int run(const uint8_t *data, size_t size, size_t step, int *ret_status)
{
        HttpLimits l;
        HttpParser *p;
        size_t off = 0, used;
        int n_done = 0;

        http_limits_init(&l);
        l.max_head_bytes = 1024;
        l.max_target_bytes = 256;
        l.max_headers = 8;
        l.max_body_bytes = 4096;
        if (http_parser_new(&l, &p) < 0)
                return -1;
        *ret_status = 0;
        while (off < size) {
                size_t n = step ? (size - off < step ? size - off : step) : size - off;
                HttpParseState st = http_parser_feed(p, data + off, n, &used);
                off += used;
                if (st == HTTP_PARSE_ERROR) {
                        *ret_status = http_parser_status(p);
                        break;
                }
                if (st == HTTP_PARSE_DONE) {
                        const HttpRequest *r = http_parser_request(p);
                        /* Touch everything the request points at. */
                        volatile size_t sum = strlen(r->target) + strlen(r->path);
                        for (uint32_t i = 0; i < r->n_headers; i++)
                                sum += strlen(r->headers[i].name) + strlen(r->headers[i].value);
                        for (uint64_t i = 0; i < r->body_len; i++)
                                sum += r->body[i];
                        (void) sum;
                        n_done++;
                        http_parser_reset(p);
                }
        }
        http_parser_free(p);
        return n_done;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
        int s1, s2;
        int d1 = run(data, size, 0, &s1);
        int d2 = run(data, size, size ? (size_t) data[0] % 7 + 1 : 1, &s2);
        if (d1 != d2 || s1 != s2)
                __builtin_trap();
        return 0;
}
