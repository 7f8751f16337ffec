/* SPDX-License-Identifier: MIT */
/* Continuous batching on the engine thread. A request is a Seq in exactly one of three
 * places:
 *   - its client's queue (QUEUED: never admitted, holds no KV blocks);
 *   - the running list (RUNNING: admitted, in admission order, oldest first; prefilling
 *     while n_computed < n_tokens - 1, decoding after);
 *   - the preempted list (PREEMPTED: admitted, its blocks taken back; it is recomputed
 *     from its prompt and the tokens generated so far before anything new is admitted).
 *
 * Each Seq keeps every id it has seen in tokens[]: the prompt, then each generated token
 * once it is accepted. A step feeds tokens[n_computed .. n_computed + chunk) and samples
 * when that reaches n_tokens, with draw = n_generated. So the batch a sequence lands in,
 * how its prompt is chunked, and whether it was preempted change nothing it computes: the
 * CPU backend is bit-identical per sequence under all of these.
 *
 * Blocks: a sequence holds ceil(positions fed / block_tokens) blocks. When one it needs
 * is not free, the most recently admitted running sequence is preempted (the list's
 * tail); the oldest one always fits alone, since the context limit counts the pool.
 *
 * Steps overlap the host's work (BackendOps submit and collect): a step is submitted and
 * left in flight; the next sched_step() collects it and hands out its tokens. When the
 * step after it is plain decoding of the same sequences, it is submitted before that
 * collect, its tokens chained on the backend from the ids the step in flight samples
 * (sched_chain), so the device goes from one step to the next while the host streams the
 * tokens. That chained step is the batch the scheduler would have built after the
 * collect, except for a sequence that the collected token ends (EOS, a stop string): it
 * computes one position more, which is dropped. Sequences with penalties or logprobs are
 * never chained, since their inputs need the collected token. A backend that computes the
 * step inside submit (the CPU) is not chained: there it would only hold back the tokens of
 * the step before. */
#include <assert.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "holdback.h"
#include "scheduler.h"

#define SCHED_DEFAULT_MAX_SEQS    32u
#define SCHED_DEFAULT_STEP_TOKENS 512u
#define SCHED_DEFAULT_MAX_QUEUED  256u

typedef enum SeqState {
        SEQ_QUEUED,
        SEQ_RUNNING,
        SEQ_PREEMPTED,
} SeqState;

typedef struct Client Client;
typedef struct Seq Seq;

struct Seq {
        SchedRequest *req;
        Client *client;
        SeqState state;
        Seq *prev, *next; /* in the client's queue, the running or the preempted list */
        int32_t *tokens;  /* (n_prompt + max_new) prompt, then accepted generated ids */
        uint32_t n_tokens;
        uint32_t n_computed; /* positions whose K/V the cache holds */
        uint32_t n_generated;
        uint32_t max_new; /* max_tokens within the context limit */
        uint32_t *blocks; /* (cap_blocks) KV block table */
        uint32_t n_blocks, cap_blocks;
        uint32_t chunk; /* tokens fed in the step being built */
        uint32_t preemptions;
        uint64_t admit_order; /* larger is more recent; preemption takes the largest */
        uint64_t fly_step;    /* the last step that fed it (Sched.submitted), at index fly_i */
        uint32_t fly_i;
        uint64_t start_usec; /* first admission; 0 before */
        uint64_t first_token_usec;
        TokStream *ts;
        Holdback hold; /* reserved SCHED_TEXT_MAX: appends never allocate */
        float *row;    /* (vocab_size) sampled row's logits, when logprobs are asked */
};

/* A step as built and submitted: its sequences (NULL where one was dropped while the step
 * was in flight) and what it fed them. */
typedef struct Flight {
        Seq **batch; /* (max_seqs) */
        BkSeq *bk;   /* (max_seqs) */
        uint32_t n;
} Flight;

typedef struct SeqList {
        Seq *head, *tail;
        uint32_t n;
} SeqList;

struct Client {
        uint32_t key;
        bool paused;
        SeqList queue;   /* QUEUED requests, oldest first */
        uint32_t n_seqs; /* its requests in any state; the record goes when 0 and unpaused */
};

struct Sched {
        Engine *e;
        SchedLimits lim;
        SchedEmit emit;
        void (*flush)(void *userdata);
        void *userdata;
        uint32_t capacity; /* context limit: positions one sequence may reach */
        uint32_t vocab_size, vocab_sample;

        SeqList running;
        SeqList preempted;
        uint32_t n_queued;

        Client **clients; /* (n_clients, cap_clients) in round-robin order */
        uint32_t n_clients, cap_clients;
        uint32_t rr; /* index of the client admitted from next */

        uint64_t admit_counter;
        SchedStats st;

        /* Steps, sized at creation: building and running a batch allocates nothing.
         * fl[cur] is in flight when flying; the next step is built into the other. */
        Flight fl[2];
        uint32_t cur;
        bool flying;
        bool chaining;      /* BackendOps.overlaps, or sched_set_chaining() */
        uint64_t submitted; /* steps submitted */
        int32_t *ids;       /* (max_seqs) */
        char piece[TOK_STREAM_OUT_MAX];
        SchedEvent ev; /* the event being built */
};

/* --------------------------------------------------------------------------------------
 * Limits and requests */

int sched_limits_check(SchedLimits *l, DsError *err)
{
        if (!l->max_seqs)
                l->max_seqs = SCHED_DEFAULT_MAX_SEQS;
        if (!l->step_tokens)
                l->step_tokens = MAX(SCHED_DEFAULT_STEP_TOKENS, l->max_seqs);
        if (!l->max_queued)
                l->max_queued = SCHED_DEFAULT_MAX_QUEUED;
        /* Bounds that keep sched_max_events() and the scratch arrays reasonable. */
        if (l->max_seqs > 4096)
                return ds_error(
                        err, -EINVAL, "max_seqs is %u, at most 4096 are supported", l->max_seqs);
        if (l->max_queued > 65536)
                return ds_error(err, -EINVAL, "max_queued is %u, at most 65536 are supported",
                        l->max_queued);
        if (l->step_tokens < l->max_seqs)
                return ds_error(err, -EINVAL,
                        "step_tokens is %u, less than max_seqs (%u): every running sequence "
                        "decodes one token per step",
                        l->step_tokens, l->max_seqs);
        return 0;
}

int sched_request_new(SchedRequest **ret)
{
        SchedRequest *r = calloc(1, sizeof(*r));

        if (!r)
                return -ENOMEM;
        r->sampling.top_p = 1.0f;
        r->sampling.repetition_penalty = 1.0f;
        *ret = r;
        return 0;
}

SchedRequest *sched_request_free(SchedRequest *r)
{
        if (!r)
                return NULL;
        free(r->prompt);
        if (r->stops)
                for (uint32_t i = 0; i < r->n_stops; i++)
                        free(r->stops[i]);
        free(r->stops);
        free(r);
        return NULL;
}

static uint32_t sched_capacity(const Engine *e)
{
        uint64_t pool = (uint64_t) e->kv.n_total * e->block_tokens;

        return (uint32_t) MIN((uint64_t) e->model->bk.cfg.max_positions, pool);
}

int sched_request_check(const Engine *e, const SchedRequest *r, DsError *err)
{
        const BkConfig *cfg = &e->model->bk.cfg;
        const BkSampling *sp = &r->sampling;
        uint32_t capacity = sched_capacity(e);

        if (!r->prompt || r->n_prompt == 0)
                return ds_error(err, -EINVAL, "the prompt is empty");
        /* Prompt plus one generated token: the last one is sampled, never fed. */
        if ((uint64_t) r->n_prompt + 1 > capacity)
                return ds_error(err, -DS_ERR_CONTEXT_FULL,
                        "prompt too long: %u tokens, and with one generated token that passes "
                        "the context limit of %u tokens",
                        r->n_prompt, capacity);
        for (uint32_t i = 0; i < r->n_prompt; i++)
                if (r->prompt[i] < 0 || (uint32_t) r->prompt[i] >= cfg->vocab_sample)
                        return ds_error(err, -EINVAL,
                                "prompt token %u is id %d, outside the vocabulary of %u", i,
                                r->prompt[i], cfg->vocab_sample);
        if (r->n_stops > SCHED_STOPS_MAX || (r->n_stops && !r->stops))
                return ds_error(err, -EINVAL, "%u stop strings, at most %u are allowed", r->n_stops,
                        SCHED_STOPS_MAX);
        for (uint32_t i = 0; i < r->n_stops; i++) {
                size_t n = r->stops[i] ? strnlen(r->stops[i], SCHED_STOP_LEN_MAX + 1) : 0;
                if (n == 0 || n > SCHED_STOP_LEN_MAX)
                        return ds_error(err, -EINVAL,
                                "stop string %u is empty or longer than %u bytes", i,
                                SCHED_STOP_LEN_MAX);
        }
        if (r->top_logprobs > SCHED_TOP_LOGPROBS_MAX)
                return ds_error(err, -EINVAL, "top_logprobs is %u, at most %u", r->top_logprobs,
                        SCHED_TOP_LOGPROBS_MAX);
        if (!isfinite(sp->temperature) || sp->temperature < 0)
                return ds_error(err, -EINVAL, "temperature %g is not a finite number >= 0",
                        (double) sp->temperature);
        if (!(sp->top_p >= 0 && sp->top_p <= 1) || !(sp->min_p >= 0 && sp->min_p <= 1))
                return ds_error(err, -EINVAL, "top_p %g and min_p %g must lie in [0, 1]",
                        (double) sp->top_p, (double) sp->min_p);
        if (!isfinite(sp->repetition_penalty) || sp->repetition_penalty < 0 ||
                !isfinite(sp->presence_penalty) || !isfinite(sp->frequency_penalty))
                return ds_error(
                        err, -EINVAL, "penalties must be finite, and the repetition penalty >= 0");
        return 0;
}

/* --------------------------------------------------------------------------------------
 * Lists and clients */

static void list_append(SeqList *l, Seq *q)
{
        q->prev = l->tail;
        q->next = NULL;
        if (l->tail)
                l->tail->next = q;
        else
                l->head = q;
        l->tail = q;
        l->n++;
}

static void list_prepend(SeqList *l, Seq *q)
{
        q->prev = NULL;
        q->next = l->head;
        if (l->head)
                l->head->prev = q;
        else
                l->tail = q;
        l->head = q;
        l->n++;
}

static void list_remove(SeqList *l, Seq *q)
{
        if (q->prev)
                q->prev->next = q->next;
        else
                l->head = q->next;
        if (q->next)
                q->next->prev = q->prev;
        else
                l->tail = q->prev;
        q->prev = q->next = NULL;
        l->n--;
}

static SeqList *seq_list(Sched *s, Seq *q)
{
        switch (q->state) {
        case SEQ_QUEUED:
                return &q->client->queue;
        case SEQ_RUNNING:
                return &s->running;
        case SEQ_PREEMPTED:
                return &s->preempted;
        }
        assert(!"unknown sequence state");
        return NULL;
}

static Client *client_find(Sched *s, uint32_t key, uint32_t *ret_index)
{
        for (uint32_t i = 0; i < s->n_clients; i++)
                if (s->clients[i]->key == key) {
                        if (ret_index)
                                *ret_index = i;
                        return s->clients[i];
                }
        return NULL;
}

static int client_get(Sched *s, uint32_t key, Client **ret)
{
        Client *c = client_find(s, key, NULL);

        if (!c) {
                if (s->n_clients == s->cap_clients) {
                        uint32_t cap = MAX(16u, s->cap_clients * 2);
                        Client **a = realloc(s->clients, cap * sizeof(*a));
                        if (!a)
                                return -ENOMEM;
                        s->clients = a;
                        s->cap_clients = cap;
                }
                c = calloc(1, sizeof(*c));
                if (!c)
                        return -ENOMEM;
                c->key = key;
                /* A new client joins the end of the round. */
                s->clients[s->n_clients++] = c;
        }
        *ret = c;
        return 0;
}

/* Drops a client's record once nothing refers to it. */
static void client_gc(Sched *s, Client *c)
{
        uint32_t i;

        if (c->n_seqs || c->paused || !client_find(s, c->key, &i))
                return;
        memmove(s->clients + i, s->clients + i + 1, (s->n_clients - i - 1) * sizeof(Client *));
        s->n_clients--;
        if (s->rr > i)
                s->rr--;
        if (s->rr >= s->n_clients)
                s->rr = 0;
        free(c);
}

/* --------------------------------------------------------------------------------------
 * Events */

static uint64_t usec_since(uint64_t from, uint64_t to)
{
        return to > from ? to - from : 0;
}

static SchedEvent *event_begin(Sched *s, SchedEventType type, const Seq *q)
{
        SchedEvent *ev = &s->ev;

        /* Only the header and the fields this type uses are written; text_len bounds text. */
        ev->type = type;
        ev->client = q->req->client;
        ev->request_id = q->req->id;
        ev->userdata = q->req->userdata;
        ev->publish_ns = 0;
        ev->token = -1;
        ev->text_len = 0;
        ev->sampled = (SchedLogprob){};
        ev->n_top = 0;
        ev->finish = FINISH_LENGTH;
        ev->usage = (SchedUsage){};
        ev->error = 0;
        return ev;
}

static void event_text(void *userdata, const char *text, size_t len)
{
        SchedEvent *ev = userdata;

        /* Holdback content is bounded by SCHED_TEXT_MAX (see Seq.hold), so this fits. */
        assert(ev->text_len + len <= sizeof(ev->text));
        memcpy(ev->text + ev->text_len, text, len);
        ev->text_len += (uint32_t) len;
}

/* --------------------------------------------------------------------------------------
 * Sequences */

static void seq_release_blocks(Sched *s, Seq *q)
{
        kv_pool_release(&s->e->kv, q->blocks, q->n_blocks);
        q->n_blocks = 0;
        q->n_computed = 0;
}

static void seq_free(Seq *q)
{
        if (!q)
                return;
        sched_request_free(q->req);
        free(q->tokens);
        free(q->blocks);
        tok_stream_free(q->ts);
        holdback_done(&q->hold);
        free(q->row);
        free(q);
}

/* Takes q out of the scheduler for good: blocks back to the pool (a step in flight may
 * still write them, but the device runs it before any later step that reuses them), out
 * of the steps that fed it, record freed. */
static void seq_drop(Sched *s, Seq *q)
{
        Client *c = q->client;

        for (uint32_t f = 0; f < ELEMENTSOF(s->fl); f++)
                for (uint32_t i = 0; i < s->fl[f].n; i++)
                        if (s->fl[f].batch[i] == q)
                                s->fl[f].batch[i] = NULL;
        list_remove(seq_list(s, q), q);
        if (q->state == SEQ_QUEUED)
                s->n_queued--;
        seq_release_blocks(s, q);
        c->n_seqs--;
        seq_free(q);
        client_gc(s, c);
}

static void seq_usage(const Seq *q, SchedUsage *u)
{
        uint64_t now = now_usec(), enq = q->req->enqueue_usec;

        u->prompt_tokens = q->req->n_prompt;
        u->generated_tokens = q->n_generated;
        u->preemptions = q->preemptions;
        u->queue_usec = usec_since(enq, q->start_usec ? q->start_usec : now);
        u->ttft_usec = q->first_token_usec ? usec_since(enq, q->first_token_usec) : 0;
        u->total_usec = usec_since(enq, now);
}

/* Emits the FINAL of q (with any text already in s->ev when continuing one) and drops
 * it. */
static void seq_finish(Sched *s, Seq *q, FinishReason reason)
{
        SchedEvent *ev = &s->ev;

        ev->finish = reason;
        seq_usage(q, &ev->usage);
        s->emit(s->userdata, ev);
        s->st.finished++;
        if (reason == FINISH_CANCELLED)
                s->st.cancelled++;
        seq_drop(s, q);
}

static void seq_fail(Sched *s, Seq *q, int code, const char *msg)
{
        SchedEvent *ev = event_begin(s, SCHED_EV_ERROR, q);

        ev->error = code;
        event_text(ev, msg, MIN(strlen(msg), sizeof(ev->text)));
        s->emit(s->userdata, ev);
        s->st.failed++;
        seq_drop(s, q);
}

/* Log-softmax of the sampled row over the sampleable ids: the sampled id's value and the
 * n best, best first, lowest id first among equals. */
static void seq_logprobs(Sched *s, const Seq *q, int32_t id, SchedEvent *ev)
{
        const float *row = q->row;
        uint32_t n = q->req->top_logprobs;
        float max = row[0];
        double sum = 0;

        for (uint32_t i = 1; i < s->vocab_sample; i++)
                max = MAX(max, row[i]);
        for (uint32_t i = 0; i < s->vocab_sample; i++)
                sum += exp((double) row[i] - max);
        float lse = max + (float) log(sum);

        ev->sampled = (SchedLogprob){.id = id, .logprob = row[id] - lse};
        ev->n_top = 0;
        for (uint32_t i = 0; i < s->vocab_sample; i++) {
                /* Insertion into a sorted list of at most 20: strict > keeps lower ids first. */
                if (ev->n_top == n && !(row[i] > ev->top[n - 1].logprob))
                        continue;
                uint32_t at = ev->n_top < n ? ev->n_top : n - 1;
                while (at > 0 && row[i] > ev->top[at - 1].logprob) {
                        ev->top[at] = ev->top[at - 1];
                        at--;
                }
                ev->top[at] = (SchedLogprob){.id = (int32_t) i, .logprob = row[i]};
                if (ev->n_top < n)
                        ev->n_top++;
        }
        for (uint32_t i = 0; i < ev->n_top; i++)
                ev->top[i].logprob -= lse;
}

/* The end of the output: flushes the detokenizer and releases everything held back, as
 * the FINAL's text. A stop string found there still wins. */
static void seq_end(Sched *s, Seq *q, FinishReason reason)
{
        const SchedRequest *r = q->req;
        SchedEvent *ev = event_begin(s, SCHED_EV_FINAL, q);
        int n = tok_stream_flush(q->ts, s->piece);

        if (n > 0)
                /* Within the reserve: held back (< SCHED_STOP_LEN_MAX) plus one piece. */
                (void) holdback_append(&q->hold, s->piece, (size_t) n);
        if (holdback_release(
                    &q->hold, (const char *const *) r->stops, r->n_stops, true, event_text, ev))
                reason = FINISH_STOP;
        seq_finish(s, q, reason);
}

/* Handles the id sampled for q: EOS, or accept it, emit its TOKEN and check the limits. */
static void seq_sampled(Sched *s, Seq *q, int32_t id, uint64_t now)
{
        const SchedRequest *r = q->req;

        if (!q->first_token_usec)
                q->first_token_usec = now;
        if (engine_is_eos(s->e, id)) {
                seq_end(s, q, FINISH_EOS);
                return;
        }

        q->tokens[q->n_tokens++] = id;
        q->n_generated++;
        s->st.generated_tokens++;

        SchedEvent *ev = event_begin(s, SCHED_EV_TOKEN, q);
        ev->token = id;
        if (r->top_logprobs)
                seq_logprobs(s, q, id, ev);
        int n = tok_stream_push(q->ts, id, s->piece);
        if (n < 0) {
                seq_fail(s, q, n, "cannot decode a generated token");
                return;
        }
        (void) holdback_append(&q->hold, s->piece, (size_t) n);
        bool stopped = holdback_release(
                &q->hold, (const char *const *) r->stops, r->n_stops, false, event_text, ev);
        s->emit(s->userdata, ev);

        if (stopped) {
                event_begin(s, SCHED_EV_FINAL, q);
                seq_finish(s, q, FINISH_STOP);
                return;
        }
        if (q->n_generated == q->max_new)
                seq_end(s, q, FINISH_LENGTH);
}

/* Puts q back to be recomputed: its blocks go to the pool, its output state stays. */
static void seq_preempt(Sched *s, Seq *q)
{
        assert(q->state == SEQ_RUNNING);
        list_remove(&s->running, q);
        seq_release_blocks(s, q);
        q->state = SEQ_PREEMPTED;
        q->preemptions++;
        s->st.preemptions++;
        /* In front: sequences preempted later were admitted earlier. */
        list_prepend(&s->preempted, q);
}

static uint32_t blocks_for(const Sched *s, uint32_t positions)
{
        return (positions + s->e->block_tokens - 1) / s->e->block_tokens;
}

/* Gives q the blocks for positions up to n_computed + chunk. */
static void seq_grow(Sched *s, Seq *q)
{
        uint32_t need = blocks_for(s, q->n_computed + q->chunk);
        int r;

        assert(need <= q->cap_blocks);
        if (need > q->n_blocks) {
                r = kv_pool_alloc(&s->e->kv, need - q->n_blocks, q->blocks + q->n_blocks);
                assert(r == 0);
                (void) r;
                q->n_blocks = need;
        }
}

/* Positions beyond n_computed that q could cover with its blocks and the free ones. */
static uint32_t seq_fit(const Sched *s, const Seq *q, uint32_t reserve)
{
        uint32_t free_blocks = s->e->kv.n_free > reserve ? s->e->kv.n_free - reserve : 0;
        uint64_t covered = (uint64_t) (q->n_blocks + free_blocks) * s->e->block_tokens;

        return covered > q->n_computed ? (uint32_t) MIN(covered - q->n_computed, UINT32_MAX) : 0;
}

/* --------------------------------------------------------------------------------------
 * The scheduler */

int sched_new(Engine *e, const SchedLimits *lim, SchedEmit emit, void *userdata, Sched **ret,
        DsError *err)
{
        Sched *s;

        assert(e && lim && emit && ret);
        if (e->kv.n_free != e->kv.n_total)
                return ds_error(err, -EBUSY, "the KV pool is in use (%u of %u blocks free)",
                        e->kv.n_free, e->kv.n_total);
        s = calloc(1, sizeof(*s));
        if (!s)
                return ds_error(err, -ENOMEM, "out of memory");
        s->e = e;
        s->lim = *lim;
        s->emit = emit;
        s->userdata = userdata;
        s->capacity = sched_capacity(e);
        s->vocab_size = e->model->bk.cfg.vocab_size;
        s->vocab_sample = e->model->bk.cfg.vocab_sample;
        s->chaining = e->ops->overlaps;
        bool ok = true;
        for (uint32_t f = 0; f < ELEMENTSOF(s->fl); f++) {
                s->fl[f].batch = calloc(lim->max_seqs, sizeof(*s->fl[f].batch));
                s->fl[f].bk = calloc(lim->max_seqs, sizeof(*s->fl[f].bk));
                ok = ok && s->fl[f].batch && s->fl[f].bk;
        }
        s->ids = calloc(lim->max_seqs, sizeof(*s->ids));
        if (!ok || !s->ids) {
                sched_free(s);
                return ds_error(err, -ENOMEM, "out of memory");
        }
        *ret = s;
        return 0;
}

static void list_free(Sched *s, SeqList *l)
{
        while (l->head)
                seq_drop(s, l->head);
}

Sched *sched_free(Sched *s)
{
        if (!s)
                return NULL;
        if (s->flying) {
                /* what it computed goes with the sequences */
                DsError err;
                (void) s->e->ops->collect(s->e->be, s->ids, s->fl[s->cur].n, &err);
        }
        list_free(s, &s->running);
        list_free(s, &s->preempted);
        /* What is left is queued (holding no blocks) or a paused client's record. */
        for (uint32_t i = 0; i < s->n_clients; i++) {
                Client *c = s->clients[i];
                for (Seq *q = c->queue.head, *next; q; q = next) {
                        next = q->next;
                        seq_free(q);
                }
                free(c);
        }
        free(s->clients);
        for (uint32_t f = 0; f < ELEMENTSOF(s->fl); f++) {
                free(s->fl[f].batch);
                free(s->fl[f].bk);
        }
        free(s->ids);
        free(s);
        return NULL;
}

void sched_set_flush(Sched *s, void (*flush)(void *userdata))
{
        s->flush = flush;
}

void sched_set_chaining(Sched *s, bool on)
{
        s->chaining = on || s->e->ops->overlaps;
}

uint32_t sched_max_events(const Sched *s)
{
        /* Every live request (queued or admitted) emits at most a TOKEN and a FINAL per
         * step, or a cancelled FINAL, or one ERROR. */
        return 2 * (s->lim.max_seqs + s->lim.max_queued);
}

static int seq_new(Sched *s, SchedRequest *r, Seq **ret)
{
        Seq *q = calloc(1, sizeof(*q));
        int ret_r;

        if (!q)
                return -ENOMEM;
        q->req = r;
        q->max_new = (uint32_t) MIN((uint64_t) r->max_tokens, (uint64_t) s->capacity - r->n_prompt);
        q->cap_blocks = blocks_for(s, r->n_prompt + q->max_new);
        q->tokens = malloc(((size_t) r->n_prompt + q->max_new) * sizeof(*q->tokens));
        q->blocks = malloc(MAX(q->cap_blocks, 1u) * sizeof(*q->blocks));
        if (r->top_logprobs)
                q->row = malloc(s->vocab_size * sizeof(*q->row));
        if (!q->tokens || !q->blocks || (r->top_logprobs && !q->row))
                goto fail;
        ret_r = holdback_reserve(&q->hold, SCHED_TEXT_MAX);
        if (ret_r < 0)
                goto fail;
        ret_r = tok_stream_new(s->e->tok, &q->ts);
        if (ret_r < 0)
                goto fail;
        ret_r = tok_stream_prime(q->ts, r->prompt, r->n_prompt);
        if (ret_r < 0)
                goto fail;
        memcpy(q->tokens, r->prompt, r->n_prompt * sizeof(*q->tokens));
        q->n_tokens = r->n_prompt;
        *ret = q;
        return 0;
fail:
        q->req = NULL; /* the caller still owns r */
        seq_free(q);
        return -ENOMEM;
}

int sched_add(Sched *s, SchedRequest *r)
{
        Client *c = NULL;
        Seq *q = NULL;
        int ret;

        assert(r);
        ret = client_get(s, r->client, &c);
        if (ret >= 0)
                ret = seq_new(s, r, &q);
        if (ret < 0) {
                /* A Seq on the stack only to address the event; nothing else uses it. */
                Seq tmp = {.req = r};
                SchedEvent *ev = event_begin(s, SCHED_EV_ERROR, &tmp);
                static const char msg[] = "out of memory for the request";
                ev->error = ret;
                event_text(ev, msg, sizeof(msg) - 1);
                s->emit(s->userdata, ev);
                s->st.failed++;
                sched_request_free(r);
                if (c)
                        client_gc(s, c);
                return ret;
        }
        q->client = c;
        q->state = SEQ_QUEUED;
        c->n_seqs++;
        list_append(&c->queue, q);
        s->n_queued++;

        if (q->max_new == 0) {
                /* Nothing to generate: the answer is known without computing anything. */
                q->start_usec = now_usec();
                event_begin(s, SCHED_EV_FINAL, q);
                seq_finish(s, q, FINISH_LENGTH);
        }
        return 0;
}

static Seq *seq_find(Sched *s, uint64_t id)
{
        for (Seq *q = s->running.head; q; q = q->next)
                if (q->req->id == id)
                        return q;
        for (Seq *q = s->preempted.head; q; q = q->next)
                if (q->req->id == id)
                        return q;
        for (uint32_t i = 0; i < s->n_clients; i++)
                for (Seq *q = s->clients[i]->queue.head; q; q = q->next)
                        if (q->req->id == id)
                                return q;
        return NULL;
}

static void seq_cancel(Sched *s, Seq *q)
{
        event_begin(s, SCHED_EV_FINAL, q);
        seq_finish(s, q, FINISH_CANCELLED);
}

void sched_cancel(Sched *s, uint64_t request_id)
{
        Seq *q = seq_find(s, request_id);

        if (q)
                seq_cancel(s, q);
}

static void list_cancel_client(Sched *s, SeqList *l, uint32_t client)
{
        for (Seq *q = l->head, *next; q; q = next) {
                next = q->next;
                if (q->req->client == client)
                        seq_cancel(s, q);
        }
}

void sched_cancel_client(Sched *s, uint32_t client)
{
        Client *c = client_find(s, client, NULL);

        if (!c)
                return;
        /* Keep the record alive through the drops: a paused client's pause outlives its
         * requests, and an unpaused one goes with its last request. */
        bool paused = c->paused;
        c->paused = true;
        list_cancel_client(s, &s->running, client);
        list_cancel_client(s, &s->preempted, client);
        while (c->queue.head)
                seq_cancel(s, c->queue.head);
        c->paused = paused;
        client_gc(s, c);
}

void sched_cancel_all(Sched *s)
{
        while (s->running.head)
                seq_cancel(s, s->running.head);
        while (s->preempted.head)
                seq_cancel(s, s->preempted.head);
        for (uint32_t i = s->n_clients; i-- > 0;) {
                Client *c = s->clients[i];
                bool paused = c->paused;
                c->paused = true;
                while (c->queue.head)
                        seq_cancel(s, c->queue.head);
                c->paused = paused;
                client_gc(s, c);
        }
}

int sched_pause_client(Sched *s, uint32_t client)
{
        Client *c;
        int r;

        r = client_get(s, client, &c);
        if (r < 0)
                return r;
        c->paused = true;
        return 0;
}

void sched_resume_client(Sched *s, uint32_t client)
{
        Client *c = client_find(s, client, NULL);

        if (!c)
                return;
        c->paused = false;
        client_gc(s, c);
}

bool sched_idle(const Sched *s)
{
        return s->running.n == 0 && s->preempted.n == 0 && s->n_queued == 0;
}

bool sched_has_work(const Sched *s)
{
        if (s->flying)
                return true;
        for (const Seq *q = s->running.head; q; q = q->next)
                if (!q->client->paused)
                        return true;
        for (const Seq *q = s->preempted.head; q; q = q->next)
                if (!q->client->paused)
                        return true;
        for (uint32_t i = 0; i < s->n_clients; i++)
                if (!s->clients[i]->paused && s->clients[i]->queue.head)
                        return true;
        return false;
}

void sched_stats(const Sched *s, SchedStats *ret)
{
        *ret = s->st;
        ret->running = s->running.n;
        ret->preempted = s->preempted.n;
        ret->queued = s->n_queued;
        ret->paused_clients = 0;
        for (uint32_t i = 0; i < s->n_clients; i++)
                ret->paused_clients += s->clients[i]->paused;
        ret->kv_blocks_total = s->e->kv.n_total;
        ret->kv_blocks_free = s->e->kv.n_free;
}

/* The next sequence to admit: the first unpaused preempted one, else the head of the next
 * unpaused client's queue in round-robin order. Preempted ones go first because they
 * were admitted before anything still queued. */
static Seq *sched_next_admission(Sched *s, uint32_t *ret_client_index)
{
        for (Seq *q = s->preempted.head; q; q = q->next)
                if (!q->client->paused)
                        return q;
        if (s->running.n + s->preempted.n >= s->lim.max_seqs)
                return NULL;
        for (uint32_t k = 0; k < s->n_clients; k++) {
                uint32_t i = (s->rr + k) % s->n_clients;
                Client *c = s->clients[i];
                if (!c->paused && c->queue.head) {
                        *ret_client_index = i;
                        return c->queue.head;
                }
        }
        return NULL;
}

/* Adds the running sequences to the batch, oldest first; preempts from the newest end
 * when blocks run out. Returns the batch size. */
static uint32_t sched_batch_running(Sched *s, Flight *f, uint32_t *budget)
{
        uint32_t n = 0;

        for (Seq *q = s->running.head; q;) {
                if (q->client->paused || *budget == 0) {
                        q = q->next;
                        continue;
                }
                uint32_t want = MIN(q->n_tokens - q->n_computed, *budget);
                uint32_t fit = seq_fit(s, q, 0);
                if (fit == 0) {
                        /* Not one more position fits: make room from the newest end. The
                         * tail is q itself or after it, so nothing batched is touched. */
                        Seq *victim = s->running.tail;
                        seq_preempt(s, victim);
                        if (victim == q)
                                break;
                        continue; /* retry q */
                }
                q->chunk = MIN(want, fit);
                seq_grow(s, q);
                *budget -= q->chunk;
                f->batch[n++] = q;
                q = q->next;
        }
        return n;
}

/* Admits preempted and queued sequences while the budget, the sequence limit and the
 * blocks allow. Admission never preempts: it keeps one block free per running sequence,
 * so the sequences already running can grow next step without evicting the newcomer. */
static uint32_t sched_batch_admit(Sched *s, Flight *f, uint32_t n, uint32_t *budget)
{
        uint64_t now = now_usec();

        while (*budget > 0 && n < s->lim.max_seqs) {
                uint32_t ci = 0;
                Seq *q = sched_next_admission(s, &ci);
                if (!q)
                        break;
                uint32_t fit = seq_fit(s, q, s->running.n);
                if (fit == 0)
                        break;
                if (q->state == SEQ_QUEUED) {
                        list_remove(&q->client->queue, q);
                        s->n_queued--;
                        s->rr = (ci + 1) % s->n_clients;
                } else
                        list_remove(&s->preempted, q);
                q->state = SEQ_RUNNING;
                q->admit_order = ++s->admit_counter;
                if (!q->start_usec)
                        q->start_usec = now;
                list_append(&s->running, q);
                q->chunk = MIN(MIN(q->n_tokens - q->n_computed, *budget), fit);
                seq_grow(s, q);
                *budget -= q->chunk;
                f->batch[n++] = q;
        }
        return n;
}

/* The running sequences as the step after cur, fed the ids cur samples, into next: true
 * when that is the batch sched_step() would build once cur is collected (every unpaused
 * running sequence decodes in cur, nothing is to be admitted, the blocks are free), less
 * the sequences whose token from cur is their last. */
static bool sched_chain(Sched *s, const Flight *cur, Flight *next)
{
        uint32_t n = 0, need = 0;

        if (sched_next_admission(s, &(uint32_t){0}))
                return false;
        for (Seq *q = s->running.head; q; q = q->next) {
                if (q->client->paused)
                        continue;
                if (q->fly_step != s->submitted || cur->batch[q->fly_i] != q ||
                        !cur->bk[q->fly_i].sample)
                        return false;
                const SchedRequest *r = q->req;
                const BkSampling *sp = &r->sampling;
                if (r->top_logprobs || sp->presence_penalty != 0 || sp->frequency_penalty != 0 ||
                        (sp->repetition_penalty != 0 && sp->repetition_penalty != 1))
                        return false;
                if (q->n_generated + 1 >= q->max_new)
                        continue;
                uint32_t pos = q->n_computed + cur->bk[q->fly_i].n_tokens;
                uint32_t blocks = blocks_for(s, pos + 1);
                need += blocks > q->n_blocks ? blocks - q->n_blocks : 0;
                next->batch[n++] = q;
        }
        if (n == 0 || need > s->e->kv.n_free)
                return false;
        for (uint32_t i = 0; i < n; i++) {
                Seq *q = next->batch[i];
                uint32_t pos = q->n_computed + cur->bk[q->fly_i].n_tokens;
                /* the blocks for cur's positions and the chained one */
                q->chunk = pos + 1 - q->n_computed;
                seq_grow(s, q);
                q->chunk = 0;
                next->bk[i] = (BkSeq){
                        .n_tokens = 1,
                        .pos = pos,
                        .blocks = q->blocks,
                        .n_blocks = q->n_blocks,
                        .sample = true,
                        .sampling = q->req->sampling,
                        .draw = q->n_generated + 1,
                        .chained = true,
                        .prev = q->fly_i,
                };
        }
        next->n = n;
        return true;
}

/* Makes f, submitted, the step in flight. */
static void sched_fly(Sched *s, Flight *f)
{
        s->submitted++;
        s->st.steps++;
        for (uint32_t i = 0; i < f->n; i++)
                if (f->batch[i]) {
                        f->batch[i]->fly_step = s->submitted;
                        f->batch[i]->fly_i = i;
                }
        s->cur = (uint32_t) (f - s->fl);
        s->flying = true;
}

/* Collects the step in flight and hands out what it sampled; returns the number of
 * sequences still fed by it (not dropped meanwhile). */
static int sched_collect(Sched *s, DsError *err)
{
        Flight *f = &s->fl[s->cur];
        int r = s->e->ops->collect(s->e->be, s->ids, f->n, err), live = 0;

        s->flying = false;
        for (uint32_t i = 0; i < f->n && r < 0; i++)
                if (f->batch[i])
                        seq_fail(s, f->batch[i], r, err ? err->msg : "the backend step failed");
        uint64_t now = now_usec();
        for (uint32_t i = 0; i < f->n && r == 0; i++) {
                Seq *q = f->batch[i];
                if (!q)
                        continue;
                live++;
                q->n_computed += f->bk[i].n_tokens;
                if (f->bk[i].sample)
                        seq_sampled(s, q, s->ids[i], now);
        }
        f->n = 0;
        return r < 0 ? r : live;
}

int sched_step(Sched *s, DsError *err)
{
        uint32_t budget = s->lim.step_tokens, n;
        Flight *next = &s->fl[s->cur ^ 1];
        int r, collected = 0;

        if (s->flying) {
                Flight *cur = &s->fl[s->cur];
                /* A chained step that cannot be submitted is built again after the collect. */
                bool chained = s->chaining && sched_chain(s, cur, next) &&
                               s->e->ops->submit(s->e->be, next->bk, next->n, err) == 0;
                if (!chained)
                        next->n = 0;
                r = sched_collect(s, err);
                if (chained) {
                        s->st.chained_steps++;
                        sched_fly(s, next);
                        return (int) next->n;
                }
                if (r < 0)
                        return r;
                collected = r;
                /* Its events go out now: the backend may run the next step inside submit,
                 * which can take a prefill's milliseconds. */
                if (s->flush)
                        s->flush(s->userdata);
        }

        n = sched_batch_running(s, next, &budget);
        n = sched_batch_admit(s, next, n, &budget);
        if (n == 0)
                return collected;

        for (uint32_t i = 0; i < n; i++) {
                Seq *q = next->batch[i];
                bool sample = q->n_computed + q->chunk == q->n_tokens;
                next->bk[i] = (BkSeq){
                        .tokens = q->tokens + q->n_computed,
                        .n_tokens = q->chunk,
                        .pos = q->n_computed,
                        .blocks = q->blocks,
                        .n_blocks = q->n_blocks,
                        .sample = sample,
                        .sampling = q->req->sampling,
                        .history = q->tokens,
                        .n_history = q->n_tokens,
                        .draw = q->n_generated,
                        .sample_logits = sample ? q->row : NULL,
                };
                q->chunk = 0;
                /* Prefill, recomputation included; a decode feeds the one sampled token. */
                if (!(sample && next->bk[i].n_tokens == 1 && q->n_generated > 0))
                        s->st.prompt_tokens += next->bk[i].n_tokens;
        }
        next->n = n;

        r = s->e->ops->submit(s->e->be, next->bk, n, err);
        if (r == 0)
                sched_fly(s, next);
        else {
                s->st.steps++;
                for (uint32_t i = 0; i < n; i++)
                        seq_fail(s, next->batch[i], r, err ? err->msg : "the backend step failed");
                next->n = 0;
                return r;
        }
        return (int) n;
}
