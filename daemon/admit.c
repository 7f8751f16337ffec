/* SPDX-License-Identifier: MIT */
#include <stdlib.h>
#include <string.h>

#include "admit.h"

/* A private copy of a span of the data area, NUL-terminated for the text paths. Called
 * only after wire_c2d_validate() checked the span against data_size. */
static char *copy_span(const uint8_t *data, const struct ds_wire_ref *ref)
{
        char *p = malloc((size_t) ref->len + 1);

        if (!p)
                return NULL;
        memcpy(p, data + ref->off, ref->len);
        p[ref->len] = 0;
        return p;
}

static int refuse(uint32_t *ret_wire_code, uint32_t code, int r)
{
        *ret_wire_code = code;
        return r;
}

static int wire_code_of(int r)
{
        switch (r) {
        case -ENOMEM:
                return DS_WIRE_ERR_INTERNAL;
        case -DS_ERR_CONTEXT_FULL:
                return DS_WIRE_ERR_PROMPT_TOO_LONG;
        case -DS_ERR_UNSUPPORTED:
                return DS_WIRE_ERR_UNSUPPORTED;
        default:
                return DS_WIRE_ERR_BAD_REQUEST;
        }
}

static const char *role_name(uint32_t role)
{
        switch (role) {
        case DS_WIRE_ROLE_SYSTEM:
                return "system";
        case DS_WIRE_ROLE_USER:
                return "user";
        default:
                return "assistant";
        }
}

/* The chat messages of buf (validated by wire_chat_validate) rendered and tokenized. */
static int encode_chat(Engine *e, const char *buf, uint32_t len, uint32_t n_messages,
        int32_t **ret_ids, size_t *ret_n, DsError *err)
{
        _cleanup_free_ ChatMessage *msgs = NULL;
        _cleanup_free_ char *texts = NULL, *rendered = NULL;
        const uint8_t *text;
        uint32_t pos = 0, role, n, i = 0;
        size_t at = 0;
        int r;

        if (tokenizer_chat_family(e->tok) == CHAT_NONE)
                return ds_error(err, -DS_ERR_UNSUPPORTED,
                        "the model's tokenizer has no chat template dsd knows");
        msgs = calloc(n_messages, sizeof(*msgs));
        /* Each message's text with a NUL after it: at most len bytes plus the NULs. */
        texts = malloc((size_t) len + n_messages);
        if (!msgs || !texts)
                return ds_error(err, -ENOMEM, "out of memory");
        while ((r = wire_chat_next((const uint8_t *) buf, len, &pos, &role, &text, &n)) > 0) {
                if (memchr(text, 0, n))
                        return ds_error(err, -EINVAL, "chat message %u contains a NUL byte", i);
                memcpy(texts + at, text, n);
                texts[at + n] = 0;
                msgs[i].role = role_name(role);
                msgs[i].content = texts + at;
                at += (size_t) n + 1;
                i++;
        }
        if (r < 0)
                return ds_error(err, r, "malformed chat messages");
        r = chat_render(e->tok, msgs, n_messages, &rendered, err);
        if (r < 0)
                return r;
        return tokenizer_encode(e->tok, rendered, strlen(rendered), ret_ids, ret_n, err);
}

int admit_submit(Engine *e, const struct ds_wire_submit *rec, const uint8_t *data,
        uint32_t data_size, SchedRequest **ret, uint32_t *ret_wire_code, DsError *err)
{
        _cleanup_(sched_request_freep) SchedRequest *req = NULL;
        _cleanup_free_ char *prompt = NULL, *stops = NULL;
        const BkConfig *cfg = &e->model->bk.cfg;
        const struct ds_wire_sampling *ws = &rec->sampling;
        int32_t *ids = NULL;
        size_t n_ids = 0;
        int r;

        *ret_wire_code = 0;
        r = wire_c2d_validate((const union ds_wire_slot *) rec, data_size);
        if (r < 0)
                return ds_error(err, r, "malformed submission record");

        /* Copy first: in ring mode the client can rewrite the data area at any time. */
        prompt = copy_span(data, &rec->prompt);
        stops = copy_span(data, &rec->stop);
        if (!prompt || !stops)
                return refuse(ret_wire_code, DS_WIRE_ERR_INTERNAL,
                        ds_error(err, -ENOMEM, "out of memory"));
        if (rec->n_stop > 0) {
                r = wire_stops_validate((const uint8_t *) stops, rec->stop.len, rec->n_stop);
                if (r < 0)
                        return ds_error(err, r, "malformed stop strings");
        }
        if (rec->hdr.flags == DS_WIRE_SUBMIT_CHAT) {
                r = wire_chat_validate((const uint8_t *) prompt, rec->prompt.len, rec->n_messages);
                if (r < 0)
                        return ds_error(err, r, "malformed chat messages");
        }

        r = sched_request_new(&req);
        if (r < 0)
                return refuse(
                        ret_wire_code, DS_WIRE_ERR_INTERNAL, ds_error(err, r, "out of memory"));

        if (rec->n_stop > SCHED_STOPS_MAX)
                return refuse(ret_wire_code, DS_WIRE_ERR_BAD_REQUEST,
                        ds_error(err, -EINVAL, "%u stop strings, at most %u are allowed",
                                rec->n_stop, SCHED_STOPS_MAX));
        if (rec->n_stop > 0) {
                const uint8_t *s;
                uint32_t pos = 0, n;

                req->stops = calloc(rec->n_stop, sizeof(*req->stops));
                if (!req->stops)
                        return refuse(ret_wire_code, DS_WIRE_ERR_INTERNAL,
                                ds_error(err, -ENOMEM, "out of memory"));
                while ((r = wire_stops_next((const uint8_t *) stops, rec->stop.len, &pos, &s, &n)) >
                        0) {
                        if (memchr(s, 0, n))
                                return refuse(ret_wire_code, DS_WIRE_ERR_BAD_REQUEST,
                                        ds_error(err, -EINVAL, "stop string %u contains a NUL byte",
                                                req->n_stops));
                        req->stops[req->n_stops] = strndup((const char *) s, n);
                        if (!req->stops[req->n_stops])
                                return refuse(ret_wire_code, DS_WIRE_ERR_INTERNAL,
                                        ds_error(err, -ENOMEM, "out of memory"));
                        req->n_stops++;
                }
                if (r < 0)
                        return ds_error(err, r, "malformed stop strings");
        }

        switch (rec->hdr.flags) {
        case DS_WIRE_SUBMIT_TEXT:
                if (memchr(prompt, 0, rec->prompt.len))
                        return refuse(ret_wire_code, DS_WIRE_ERR_BAD_REQUEST,
                                ds_error(err, -EINVAL, "the prompt text contains a NUL byte"));
                r = engine_encode_prompt(e, prompt, false, &ids, &n_ids, err);
                break;
        case DS_WIRE_SUBMIT_IDS:
                n_ids = rec->prompt.len / sizeof(int32_t);
                ids = malloc(rec->prompt.len);
                if (!ids)
                        r = ds_error(err, -ENOMEM, "out of memory");
                else {
                        memcpy(ids, prompt, rec->prompt.len);
                        r = 0;
                }
                break;
        default:
                r = encode_chat(e, prompt, rec->prompt.len, rec->n_messages, &ids, &n_ids, err);
                break;
        }
        if (r < 0)
                return refuse(ret_wire_code, wire_code_of(r), r);
        req->prompt = ids;
        if (n_ids > UINT32_MAX)
                return refuse(ret_wire_code, DS_WIRE_ERR_PROMPT_TOO_LONG,
                        ds_error(err, -DS_ERR_CONTEXT_FULL, "prompt too long: %zu tokens", n_ids));
        req->n_prompt = (uint32_t) n_ids;

        /* 0 asks for everything the context allows; the scheduler stops there. */
        req->max_tokens = rec->max_tokens ? rec->max_tokens : cfg->max_positions;
        req->top_logprobs = rec->top_logprobs;
        req->sampling = (BkSampling){
                .temperature = ws->temperature,
                .top_k = ws->top_k,
                .top_p = ws->top_p,
                .min_p = ws->min_p,
                .repetition_penalty = ws->repetition_penalty,
                .presence_penalty = ws->presence_penalty,
                .frequency_penalty = ws->frequency_penalty,
                .seed = ws->seed,
        };
        r = sched_request_check(e, req, err);
        if (r < 0)
                return refuse(ret_wire_code, wire_code_of(r), r);
        *ret = TAKE_PTR(req);
        return 0;
}
