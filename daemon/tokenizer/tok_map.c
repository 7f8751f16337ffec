/* SPDX-License-Identifier: MIT */
/* Growable buffer and the two hash tables the tokenizer needs: open addressing with
 * linear probing, kept at most half full. Vocabularies reach 150k entries, so these stay
 * flat arrays rather than one allocation per node. */
#include <stdlib.h>
#include <string.h>

#include "tok_internal.h"

int tokbuf_reserve(TokBuf *b, size_t extra)
{
        /* Even an empty reservation allocates once, so that p + offset is never
         * arithmetic on NULL (an arena holding only empty strings). */
        if (b->p && extra <= b->cap - b->n)
                return 0;
        if (extra > SIZE_MAX / 2 - b->n)
                return -ENOMEM;
        size_t cap = MAX(b->cap * 2, b->n + extra);
        cap = MAX(cap, (size_t) 64);
        char *p = realloc(b->p, cap);
        if (!p)
                return -ENOMEM;
        b->p = p;
        b->cap = cap;
        return 0;
}

int tokbuf_append(TokBuf *b, const void *data, size_t len)
{
        int r = tokbuf_reserve(b, len);
        if (r < 0)
                return r;
        if (len)
                memcpy(b->p + b->n, data, len);
        b->n += len;
        return 0;
}

void tokbuf_done(TokBuf *b)
{
        free(b->p);
        *b = (TokBuf){};
}

/* FNV-1a: short keys, and good enough spread for probing with a power-of-two table. */
static uint32_t str_hash(const char *s, size_t len)
{
        uint32_t h = 2166136261u;
        for (size_t i = 0; i < len; i++) {
                h ^= (uint8_t) s[i];
                h *= 16777619u;
        }
        return h;
}

static uint64_t u64_hash(uint64_t z)
{
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        return z ^ (z >> 31);
}

static int strmap_grow(StrMap *m)
{
        size_t n_slots = m->n_slots ? m->n_slots * 2 : 64;
        uint32_t *slots = calloc(n_slots, sizeof(*slots));
        if (!slots)
                return -ENOMEM;
        for (size_t i = 0; i < m->n; i++) {
                size_t s = m->entries[i].hash & (n_slots - 1);
                while (slots[s])
                        s = (s + 1) & (n_slots - 1);
                slots[s] = (uint32_t) i + 1;
        }
        free(m->slots);
        m->slots = slots;
        m->n_slots = n_slots;
        return 0;
}

int32_t strmap_get(const StrMap *m, const char *key, size_t len)
{
        if (!m->n_slots)
                return -1;
        uint32_t h = str_hash(key, len);
        for (size_t s = h & (m->n_slots - 1);; s = (s + 1) & (m->n_slots - 1)) {
                uint32_t i = m->slots[s];
                if (!i)
                        return -1;
                const StrMapEntry *e = &m->entries[i - 1];
                if (e->hash == h && e->len == len && !memcmp(m->arena.p + e->off, key, len))
                        return e->value;
        }
}

int strmap_put(StrMap *m, const char *key, size_t len, int32_t value)
{
        int r;

        if (len > UINT32_MAX || m->arena.n > UINT32_MAX - len || m->n >= UINT32_MAX - 1)
                return -E2BIG;
        if (strmap_get(m, key, len) >= 0)
                return 1;
        if ((m->n + 1) * 2 > m->n_slots) {
                r = strmap_grow(m);
                if (r < 0)
                        return r;
        }
        if (m->n == m->cap) {
                size_t cap = MAX(m->cap * 2, (size_t) 64);
                StrMapEntry *e = realloc(m->entries, cap * sizeof(*e));
                if (!e)
                        return -ENOMEM;
                m->entries = e;
                m->cap = cap;
        }
        uint32_t off = (uint32_t) m->arena.n;
        r = tokbuf_append(&m->arena, key, len);
        if (r < 0)
                return r;

        uint32_t h = str_hash(key, len);
        m->entries[m->n] =
                (StrMapEntry){.off = off, .len = (uint32_t) len, .value = value, .hash = h};
        size_t s = h & (m->n_slots - 1);
        while (m->slots[s])
                s = (s + 1) & (m->n_slots - 1);
        m->slots[s] = (uint32_t) ++m->n;
        return 0;
}

void strmap_done(StrMap *m)
{
        tokbuf_done(&m->arena);
        free(m->entries);
        free(m->slots);
        *m = (StrMap){};
}

static int u64map_grow(U64Map *m)
{
        size_t n_slots = m->n_slots ? m->n_slots * 2 : 64;
        uint64_t *keys = malloc(n_slots * sizeof(*keys));
        uint64_t *vals = malloc(n_slots * sizeof(*vals));
        uint8_t *used = calloc(n_slots, 1);
        if (!keys || !vals || !used) {
                free(keys);
                free(vals);
                free(used);
                return -ENOMEM;
        }
        for (size_t i = 0; i < m->n_slots; i++) {
                if (!m->used[i])
                        continue;
                size_t s = u64_hash(m->keys[i]) & (n_slots - 1);
                while (used[s])
                        s = (s + 1) & (n_slots - 1);
                used[s] = 1;
                keys[s] = m->keys[i];
                vals[s] = m->vals[i];
        }
        free(m->keys);
        free(m->vals);
        free(m->used);
        m->keys = keys;
        m->vals = vals;
        m->used = used;
        m->n_slots = n_slots;
        return 0;
}

bool u64map_get(const U64Map *m, uint64_t key, uint64_t *ret_val)
{
        if (!m->n_slots)
                return false;
        for (size_t s = u64_hash(key) & (m->n_slots - 1);; s = (s + 1) & (m->n_slots - 1)) {
                if (!m->used[s])
                        return false;
                if (m->keys[s] == key) {
                        *ret_val = m->vals[s];
                        return true;
                }
        }
}

int u64map_set(U64Map *m, uint64_t key, uint64_t val)
{
        int r;

        if ((m->n + 1) * 2 > m->n_slots) {
                r = u64map_grow(m);
                if (r < 0)
                        return r;
        }
        size_t s = u64_hash(key) & (m->n_slots - 1);
        while (m->used[s] && m->keys[s] != key)
                s = (s + 1) & (m->n_slots - 1);
        if (!m->used[s]) {
                m->used[s] = 1;
                m->keys[s] = key;
                m->n++;
        }
        m->vals[s] = val;
        return 0;
}

void u64map_done(U64Map *m)
{
        free(m->keys);
        free(m->vals);
        free(m->used);
        *m = (U64Map){};
}
