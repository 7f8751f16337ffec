/* SPDX-License-Identifier: MIT */
/* A libdsclient client with one behaviour per subcommand, driven by the serve tests:
 *   info SOCK                       prints ds_server_info's counters as JSON
 *   connect SOCK                    connects; prints the code and the daemon's message
 *   stream SOCK TEXT MAXTOK DELAYMS greedy request; "started" on stderr at the first
 *                                   token; the text on stdout; DELAYMS between reads;
 *                                   at the end "final FINISH" or "error CODE MESSAGE"
 *                                   on stderr
 *   noread SOCK N MAXTOK            submits N requests, prints "submitted", reads nothing
 *                                   until a line arrives on stdin, then everything;
 *                                   prints the errors as JSON
 *   flood SOCK N MAXTOK             submits N requests at once; prints the outcome counts
 *                                   and the first message of each error as JSON
 *   long SOCK NWORDS                submits a prompt of NWORDS words; prints the error
 *   block SOCK                      "ready" on stdout, then ds_next() without a timeout;
 *                                   prints its result and CLOCK_MONOTONIC ns on return
 *   hostile SOCK SEED               scribbles over its own segment while submitting;
 *                                   exits 0 once the daemon has disconnected it
 * Exit status 0 unless something unexpected happened. */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "dsclient-debug.h"
#include "dsclient.h"

static uint64_t mono_ns(void)
{
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (uint64_t) ts.tv_sec * 1000000000u + (uint64_t) ts.tv_nsec;
}

static ds_client *connect_or_die(const char *sock)
{
        ds_client *c;
        int r = ds_connect(sock, 0, &c);
        if (r < 0) {
                fprintf(stderr, "ds_connect: %s: %s\n", ds_strerror(r), ds_connect_message());
                exit(1);
        }
        return c;
}

static int submit_text(ds_client *c, const char *text, uint32_t max_tokens, uint64_t *id)
{
        ds_request req;
        ds_request_init(&req);
        req.kind = DS_PROMPT_TEXT;
        req.text = text;
        req.text_len = strlen(text);
        req.sampling.temperature = 0;
        req.max_tokens = max_tokens;
        return ds_submit(c, &req, id);
}

static ds_event ev; /* large: kept off the stack */

static int cmd_info(const char *sock)
{
        ds_client *c = connect_or_die(sock);
        ds_info in;
        int r = ds_server_info(c, &in);
        if (r < 0) {
                fprintf(stderr, "ds_server_info: %s\n", ds_strerror(r));
                return 1;
        }
        printf("{\"model\": \"%s\", \"context\": %u, \"active\": %u, \"queued\": %u, "
               "\"clients\": %u, \"kv_total\": %llu, \"kv_free\": %llu, \"mode\": %u, "
               "\"max_queue\": %u}\n",
                in.model, in.context_length, in.active, in.queued, in.clients,
                (unsigned long long) in.kv_blocks_total, (unsigned long long) in.kv_blocks_free,
                in.mode, in.max_queue);
        ds_close(c);
        return 0;
}

static int cmd_connect(const char *sock)
{
        ds_client *c;
        int r = ds_connect(sock, 0, &c);
        printf("%d %s\n", r, r < 0 ? ds_connect_message() : "");
        ds_close(r < 0 ? NULL : c);
        return 0;
}

static int cmd_stream(const char *sock, const char *text, uint32_t max_tokens, int delay_ms)
{
        ds_client *c = connect_or_die(sock);
        uint64_t id;
        bool started = false;
        int r = submit_text(c, text, max_tokens, &id);
        if (r < 0)
                return 1;
        while ((r = ds_next(c, -1, &ev)) > 0) {
                if (ev.type == DS_EVENT_TOKEN) {
                        fwrite(ev.text, 1, ev.text_len, stdout);
                        if (!started) {
                                fprintf(stderr, "started\n");
                                started = true;
                        }
                } else
                        break;
                if (delay_ms)
                        usleep((useconds_t) delay_ms * 1000);
        }
        if (r > 0 && ev.type == DS_EVENT_FINAL)
                fprintf(stderr, "final %u\n", ev.finish);
        else if (r > 0 && ev.type == DS_EVENT_ERROR)
                fprintf(stderr, "error %d %s\n", ev.error, ev.message);
        else
                fprintf(stderr, "failed %d\n", r);
        ds_close(c);
        return r > 0 && ev.type == DS_EVENT_FINAL ? 0 : 1;
}

static int cmd_noread(const char *sock, int n, uint32_t max_tokens)
{
        ds_client *c = connect_or_die(sock);
        int tokens = 0, finals = 0, slow = 0, other = 0, done = 0, r;
        char msg[DS_MAX_MESSAGE + 1] = "";
        uint64_t id;

        for (int i = 0; i < n; i++)
                if (submit_text(c, "Once upon a time", max_tokens, &id) < 0)
                        return 1;
        printf("submitted\n");
        (void) !fgets(msg, sizeof(msg), stdin);
        msg[0] = 0;
        while (done < n && (r = ds_next(c, 10000, &ev)) > 0) {
                if (ev.type == DS_EVENT_TOKEN)
                        tokens++;
                else {
                        done++;
                        if (ev.type == DS_EVENT_FINAL)
                                finals++;
                        else if (ev.error == -DS_ERR_CLIENT_TOO_SLOW) {
                                slow++;
                                snprintf(msg, sizeof(msg), "%s", ev.message);
                        } else
                                other++;
                }
        }
        printf("{\"tokens\": %d, \"finals\": %d, \"too_slow\": %d, \"other\": %d, "
               "\"message\": \"%s\"}\n",
                tokens, finals, slow, other, msg);
        ds_close(c);
        return 0;
}

static int cmd_flood(const char *sock, int n, uint32_t max_tokens)
{
        ds_client *c = connect_or_die(sock);
        int finals = 0, busy = 0, other = 0, done = 0, r;
        char busy_msg[DS_MAX_MESSAGE + 1] = "";
        uint64_t id;

        for (int i = 0; i < n; i++)
                if (submit_text(c, "Once upon a time", max_tokens, &id) < 0)
                        return 1;
        while (done < n && (r = ds_next(c, 30000, &ev)) > 0) {
                if (ev.type == DS_EVENT_FINAL)
                        finals++, done++;
                else if (ev.type == DS_EVENT_ERROR) {
                        done++;
                        if (ev.error == -DS_ERR_BUSY) {
                                busy++;
                                snprintf(busy_msg, sizeof(busy_msg), "%s", ev.message);
                        } else
                                other++;
                }
        }
        printf("{\"finals\": %d, \"busy\": %d, \"other\": %d, \"busy_message\": \"%s\"}\n", finals,
                busy, other, busy_msg);
        ds_close(c);
        return done == n ? 0 : 1;
}

static int cmd_long(const char *sock, int n_words)
{
        ds_client *c = connect_or_die(sock);
        size_t len = (size_t) n_words * 4 + 1;
        char *text = malloc(len);
        uint64_t id;
        int r;

        for (int i = 0; i < n_words; i++)
                memcpy(text + 4 * i, "cat ", 4);
        text[len - 1] = 0;
        r = submit_text(c, text, 16, &id);
        free(text);
        if (r < 0)
                return 1;
        while ((r = ds_next(c, 30000, &ev)) > 0 && ev.type == DS_EVENT_TOKEN)
                ;
        if (r <= 0)
                return 1;
        printf("%d %s\n", ev.type == DS_EVENT_ERROR ? ev.error : 0, ev.message);
        ds_close(c);
        return 0;
}

static int cmd_block(const char *sock)
{
        ds_client *c = connect_or_die(sock);
        int r;

        printf("ready\n");
        fflush(stdout);
        r = ds_next(c, -1, &ev);
        printf("%d %llu\n", r, (unsigned long long) mono_ns());
        ds_close(c);
        return 0;
}

/* xorshift64: reproducible garbage from the seed. */
static uint64_t rnd(uint64_t *s)
{
        *s ^= *s << 13;
        *s ^= *s >> 7;
        *s ^= *s << 17;
        return *s;
}

static int cmd_hostile(const char *sock, uint64_t seed)
{
        ds_client *c = connect_or_die(sock);
        uint64_t id, one = 1, s = seed | 1;
        uint8_t *seg;
        size_t size;
        int doorbell, r;

        r = ds_debug_segment(c, (void **) &seg, &size, &doorbell);
        if (r < 0) {
                fprintf(stderr, "ds_debug_segment: %s\n", ds_strerror(r));
                return 1;
        }
        for (int round = 0; round < 100000; round++) {
                /* A valid submission first, so the daemon is reading the ring. */
                (void) submit_text(c, "Once upon a time", 8, &id);
                for (int k = 0; k < 16; k++) {
                        uint64_t v = rnd(&s);
                        size_t at = (size_t) (rnd(&s) % (size / 4)) * 4;
                        uint32_t word;
                        switch (v % 4) {
                        case 0:
                                word = UINT32_MAX - (uint32_t) (v >> 40);
                                break; /* near 2^32 */
                        case 1:
                                word = (uint32_t) (v >> 32);
                                break;
                        case 2:
                                word = (uint32_t) (v >> 50);
                                break; /* small */
                        default:
                                word = 0x80000000u + (uint32_t) (v >> 48);
                                break;
                        }
                        /* Aim at the header and the ring control blocks half of the time. */
                        if (v & 1)
                                at = (size_t) (rnd(&s) % 1024) & ~(size_t) 3;
                        memcpy(seg + at, &word, sizeof(word));
                }
                (void) !write(doorbell, &one, sizeof(one));
                r = ds_next(c, 0, &ev);
                if (r < 0)
                        break;
                usleep(200);
        }
        printf("%d\n", r);
        ds_close(c);
        return r < 0 ? 0 : 1;
}

int main(int argc, char **argv)
{
        if (argc < 3) {
                fprintf(stderr, "usage: serve-tool COMMAND SOCK ...\n");
                return 2;
        }
        setvbuf(stdout, NULL, _IOLBF, 0);
        const char *cmd = argv[1], *sock = argv[2];
        if (!strcmp(cmd, "info"))
                return cmd_info(sock);
        if (!strcmp(cmd, "connect"))
                return cmd_connect(sock);
        if (!strcmp(cmd, "stream") && argc == 6)
                return cmd_stream(sock, argv[3], (uint32_t) atoi(argv[4]), atoi(argv[5]));
        if (!strcmp(cmd, "noread") && argc == 5)
                return cmd_noread(sock, atoi(argv[3]), (uint32_t) atoi(argv[4]));
        if (!strcmp(cmd, "flood") && argc == 5)
                return cmd_flood(sock, atoi(argv[3]), (uint32_t) atoi(argv[4]));
        if (!strcmp(cmd, "long") && argc == 4)
                return cmd_long(sock, atoi(argv[3]));
        if (!strcmp(cmd, "block"))
                return cmd_block(sock);
        if (!strcmp(cmd, "hostile") && argc == 4)
                return cmd_hostile(sock, strtoull(argv[3], NULL, 0));
        fprintf(stderr, "serve-tool: bad command or arguments\n");
        return 2;
}
