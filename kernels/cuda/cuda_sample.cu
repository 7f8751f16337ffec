/* SPDX-License-Identifier: MIT */
/* Sampling on the device: a cluster of blocks per logits row (one block in large steps)
 * makes bk_sample's decision (kernels/sample.c) from the row in place, so only ids cross
 * to the host. Each block of a row's cluster takes its own run of ids through every pass;
 * the passes' histograms and sums meet through distributed shared memory, and every block
 * follows the same decisions from them.
 *
 * Nothing is sorted. The candidate order is (logit descending, id ascending) and every
 * filter that cuts it (top-k's k-th candidate, top-p's last) is found by a weighted
 * select: the first candidate in that order at which the running count or weight exceeds
 * a target. A select is a histogram pass over buckets of the scaled logit
 * (logit - max) / temperature, which spreads a real row's candidates, then three radix
 * passes over the float's bits inside the chosen bucket, then, only when several
 * candidates share the chosen logit, an id-ordered scan for the tie. The draw is an
 * id-ordered inverse CDF. Weights and their sums are integers (sample_math.h), so every
 * histogram and scan is exact whatever order the atomics land in: a non-monotonic prefix
 * sum cannot happen, and the fallback to the likeliest id is a clamp that never fires. */
#include <math.h>

#include "cuda_kernels.cuh"
#include "philox.h"
#include "sample_math.h"
#include "cuda_ptx.cuh"

#include <cooperative_groups.h>

namespace cg = cooperative_groups;

#define THREADS 1024u
#define WARPS   (THREADS / 32)
#define BINS    2048u /* buckets of the scaled logit; also the widest radix digit */
#define NONE    0xffffffffu
#define FULL    0xffffffffu
/* The most blocks a row's cluster has, and the most blocks a step's clusters have
 * together: a step of up to 16 rows gives a row 8, up to 32 rows 4, up to 64 rows 2. */
#define SAMPLE_CLUSTER        8
#define SAMPLE_CLUSTER_BLOCKS 128

typedef unsigned long long u64;

typedef struct Smem {
        /* a bin's count is hist_hi 2^32 + hist_lo: 32-bit atomics, since a 64-bit add to
         * shared memory compiles to a compare-and-swap loop (ATOMS.CAST.SPIN.64) */
        uint32_t hist_lo[BINS], hist_hi[BINS];
        uint32_t minid[BINS / 2]; /* the last radix digit has 10 bits */
        u64 wsum[WARPS];
        float bv[WARPS];
        int32_t bi[WARPS];
        uint32_t sel_bin, pick;
        u64 sel_rem;
        u64 block_sum; /* the block's weight in ordered_pick, for the cluster's others */
        float rank_v;  /* the block's largest logit and its id, for the cluster's others */
        int32_t rank_id;
} Smem;

/* The filters found so far; a candidate is kept when it passes all that are on. */
typedef struct Filter {
        float max, temp;
        float live; /* the least logit whose scaled logit reaches SM_X_MIN */
        bool k_on, p_on, min_on;
        float kv, pv;      /* the last kept candidate of top-k, top-p: logit ... */
        uint32_t kid, pid; /* ... and id */
        double min_w;
} Filter;

/* Float bits to an unsigned key in the floats' order (after -0 is made +0). */
__device__ __forceinline__ uint32_t ord_of(float v)
{
        uint32_t u = __float_as_uint(v == 0.0f ? 0.0f : v);
        return u ^ (u >> 31 ? FULL : 0x80000000u);
}

__device__ __forceinline__ float val_of(uint32_t o)
{
        return __uint_as_float(o ^ (o >> 31 ? 0x80000000u : FULL));
}

/* The candidate's weight if every filter on keeps it, else 0. Most of a row lies below
 * f.live and costs one comparison. */
__device__ __forceinline__ u64 kept(const Filter &f, uint32_t i, float v)
{
        if (!(v >= f.live))
                return 0;
        u64 w = sm_weight(v, f.max, f.temp);
        if (w == 0)
                return 0;
        if (f.k_on && !(v > f.kv || (v == f.kv && i <= f.kid)))
                return 0;
        if (f.p_on && !(v > f.pv || (v == f.pv && i <= f.pid)))
                return 0;
        if (f.min_on && !((double) w >= f.min_w))
                return 0;
        return w;
}

/* Bucket of a candidate at or above f.live, ascending as the logit descends: the scaled
 * logit lies in [SM_X_MIN, 0], cut into BINS equal parts. Monotonic, as every step
 * rounds. */
__device__ __forceinline__ uint32_t bucket_of(const Filter &f, float v)
{
        float x = sm_scaled(v, f.max, f.temp);
        uint32_t b = (uint32_t) SM_MUL(-x, (float) BINS / -SM_X_MIN);
        return min(b, BINS - 1);
}

/* The least key in [lo, hi] whose logit passes pred, a predicate that holds from some key
 * on up to hi (hi passes). Every thread computes it alike. */
template <class Pred>
__device__ uint32_t least_key(uint32_t lo, uint32_t hi, Pred pred)
{
        while (lo < hi) {
                uint32_t mid = lo + (hi - lo) / 2;
                if (pred(val_of(mid)))
                        hi = mid;
                else
                        lo = mid + 1;
        }
        return lo;
}

/* The block's count of bin += add over the warp, one atomic (two where the high word
 * moves) per distinct bin; minid[bin] gets the least id when minid is given. Every lane
 * calls it; bin NONE adds nothing. add < 2^35. */
__device__ __forceinline__ void hist_add(Smem &sm, uint32_t *minid, uint32_t bin, u64 add,
        uint32_t id)
{
        uint32_t peers = __match_any_sync(FULL, bin);
        if (bin == NONE)
                return;
        uint32_t lo = __reduce_add_sync(peers, (uint32_t) (add & 0xffffff));
        uint32_t hi = __reduce_add_sync(peers, (uint32_t) (add >> 24));
        uint32_t mn = minid ? __reduce_min_sync(peers, id) : 0;
        if (threadIdx.x % 32 == (uint32_t) (__ffs(peers) - 1)) {
                u64 a = ((u64) hi << 24) + lo;
                uint32_t l = (uint32_t) a, h = (uint32_t) (a >> 32);
                uint32_t old = atomicAdd(&sm.hist_lo[bin], l);
                /* the low word wrapped: a carry into the high one */
                h += old + l < old;
                if (h)
                        atomicAdd(&sm.hist_hi[bin], h);
                if (minid)
                        atomicMin(&minid[bin], mn);
        }
}

/* visit(i, v) for every id i of [blo, bhi) and its logit v, 32 consecutive ids a warp at a
 * time, every lane of the warp together (i >= bhi: a lane past the end, v = 0), with
 * PASS_LOADS loads of each warp in flight. That was no faster than one at a time: the
 * passes wait on the histogram updates, not on the loads (docs/PERF.md, forty-second
 * session, runs 5-6). */
#define PASS_LOADS 4

template <class Visit>
__device__ __forceinline__ void row_pass(const float *row, uint32_t blo, uint32_t bhi, Visit visit)
{
        uint32_t lane = threadIdx.x % 32, warp = threadIdx.x / 32;
        for (uint32_t base = blo + warp * 32; base < bhi; base += PASS_LOADS * THREADS) {
                float v[PASS_LOADS];
#pragma unroll
                for (uint32_t u = 0; u < PASS_LOADS; u++) {
                        uint32_t i = base + u * THREADS + lane;
                        v[u] = i < bhi ? row[i] : 0.0f;
                }
#pragma unroll
                for (uint32_t u = 0; u < PASS_LOADS; u++)
                        if (base + u * THREADS < bhi)
                                visit(base + u * THREADS + lane, v[u]);
        }
}

/* Exclusive prefix of v over the block in thread order; *total gets the sum. */
__device__ u64 block_scan(Smem &sm, u64 v, u64 *total)
{
        uint32_t lane = threadIdx.x % 32, warp = threadIdx.x / 32;
        u64 incl = v;
        for (uint32_t o = 1; o < 32; o <<= 1) {
                u64 y = __shfl_up_sync(FULL, incl, o);
                if (lane >= o)
                        incl += y;
        }
        if (lane == 31)
                sm.wsum[warp] = incl;
        __syncthreads();
        u64 pre = 0, all = 0;
        for (uint32_t w = 0; w < WARPS; w++) {
                pre += w < warp ? sm.wsum[w] : 0;
                all += sm.wsum[w];
        }
        __syncthreads();
        *total = all;
        return pre + incl - v;
}

/* The cluster's count of bin j: the sum of its blocks' counts of j. */
__device__ __forceinline__ u64 cluster_bin(Smem &sm, cg::cluster_group &cl, uint32_t j)
{
        u64 c = 0;
        for (uint32_t k = 0; k < cl.num_blocks(); k++)
                c += (u64) cl.map_shared_rank(sm.hist_hi, k)[j] << 32 |
                     cl.map_shared_rank(sm.hist_lo, k)[j];
        return c;
}

/* Over the cluster's bins [0, nb) (every block's counts made) in ascending (or, reverse,
 * descending) bin order: the first bin at which the running sum exceeds g, and g less
 * the sum before it. With top_p > 0, g is top-p's need less one, from the total. False
 * when the total does not exceed g. Every block of the cluster calls it and gets the same
 * answer; on return every block may fill its hist again. */
__device__ bool scan_bins(Smem &sm, cg::cluster_group &cl, uint32_t nb, bool reverse, u64 g,
        float top_p, uint32_t *ret_bin, u64 *ret_rem)
{
        uint32_t per = nb / THREADS, j0 = threadIdx.x * per;
        u64 local = 0, total;
        cl.sync();
        for (uint32_t j = j0; j < j0 + per; j++)
                local += cluster_bin(sm, cl, reverse ? nb - 1 - j : j);
        u64 c = block_scan(sm, local, &total);
        if (top_p > 0.0f)
                g = sm_top_p_need(top_p, total) - 1;
        bool found = total > g;
        if (found && c <= g && g < c + local)
                for (uint32_t j = j0; j < j0 + per; j++) {
                        uint32_t bin = reverse ? nb - 1 - j : j;
                        u64 h = cluster_bin(sm, cl, bin);
                        if (g < c + h) {
                                sm.sel_bin = bin;
                                sm.sel_rem = g - c;
                                break;
                        }
                        c += h;
                }
        /* every block is done reading the others' hist, and sel_* is written */
        cl.sync();
        *ret_bin = sm.sel_bin;
        *ret_rem = sm.sel_rem;
        __syncthreads();
        return found;
}

/* In ascending id order over the whole row, the first id at which the running sum of
 * weight(i, v) exceeds target(total), or NONE; every block of the cluster gets it. The
 * block sums its ids [blo, bhi), each warp a contiguous segment; the warp whose segment
 * holds the target walks it 256 ids at a time, eight consecutive ids a lane. */
template <class Weight, class Target>
__device__ uint32_t ordered_pick(Smem &sm, cg::cluster_group &cl, const float *row, uint32_t blo,
        uint32_t bhi, Weight weight, Target target_of)
{
        uint32_t lane = threadIdx.x % 32, warp = threadIdx.x / 32;
        uint32_t seg = (bhi - blo + WARPS * 256 - 1) / (WARPS * 256) * 256;
        uint32_t lo = min(bhi, blo + warp * seg), hi = min(bhi, lo + seg);

        u64 s = 0;
#pragma unroll 4
        for (uint32_t i = lo + lane; i < hi; i += 32)
                s += weight(i, row[i]);
        for (int o = 16; o > 0; o >>= 1)
                s += __shfl_xor_sync(FULL, s, o);
        if (lane == 0)
                sm.wsum[warp] = s;
        if (threadIdx.x == 0)
                sm.pick = NONE;
        __syncthreads();
        u64 pre = 0, total = 0;
        for (uint32_t w = 0; w < WARPS; w++) {
                pre += w < warp ? sm.wsum[w] : 0;
                total += sm.wsum[w];
        }
        if (threadIdx.x == 0)
                sm.block_sum = total;
        /* the blocks' runs are in id order: the blocks before this one come first */
        cl.sync();
        total = 0;
        for (uint32_t k = 0; k < cl.num_blocks(); k++) {
                u64 b = *cl.map_shared_rank(&sm.block_sum, k);
                pre += k < cl.block_rank() ? b : 0;
                total += b;
        }
        u64 target = target_of(total);
        if (target < total && pre <= target && target < pre + sm.wsum[warp]) {
                u64 carry = pre;
                for (uint32_t base = lo; base < hi; base += 256) {
                        u64 w[8], ls = 0;
                        uint32_t first = base + 8 * lane;
#pragma unroll
                        for (uint32_t j = 0; j < 8; j++) {
                                w[j] = first + j < hi ? weight(first + j, row[first + j]) : 0;
                                ls += w[j];
                        }
                        u64 incl = ls;
                        for (uint32_t o = 1; o < 32; o <<= 1) {
                                u64 y = __shfl_up_sync(FULL, incl, o);
                                if (lane >= o)
                                        incl += y;
                        }
                        u64 chunk = __shfl_sync(FULL, incl, 31);
                        if (carry + chunk > target) {
                                u64 cum = carry + incl - ls;
                                if (cum <= target && target < carry + incl)
#pragma unroll
                                        for (uint32_t j = 0; j < 8; j++) {
                                                cum += w[j];
                                                if (cum > target) {
                                                        for (uint32_t k = 0;
                                                                k < cl.num_blocks(); k++)
                                                                *cl.map_shared_rank(&sm.pick,
                                                                        k) = first + j;
                                                        break;
                                                }
                                        }
                                break;
                        }
                        carry += chunk;
                }
        }
        /* the pick is in every block; block_sum and pick are written again only after the
         * next call's first barrier, which every block reaches after reading them here */
        cl.sync();
        uint32_t pick = sm.pick;
        __syncthreads();
        return pick;
}

/* The kept candidate (*ret_v, *ret_id) of the whole row at which, best first, the running
 * count (count) or weight first exceeds g (top_p > 0: top-p's need less one). False when
 * all kept candidates together do not exceed g. The block takes ids [blo, bhi); every
 * block of the cluster calls it and gets the same answer. */
__device__ bool weighted_select(Smem &sm, cg::cluster_group &cl, const float *row, uint32_t blo,
        uint32_t bhi, const Filter &f, bool count, u64 g, float top_p, float *ret_v,
        uint32_t *ret_id)
{
        uint32_t bucket, bin, prefix = 0;
        u64 rem;

        /* buckets of the scaled logit */
        for (uint32_t j = threadIdx.x; j < BINS; j += THREADS)
                sm.hist_lo[j] = sm.hist_hi[j] = 0;
        __syncthreads();
        row_pass(row, blo, bhi, [&](uint32_t i, float v) {
                uint32_t b = NONE;
                u64 w = 0;
                if (i < bhi) {
                        w = kept(f, i, v);
                        if (w)
                                b = bucket_of(f, v);
                }
                if (__any_sync(FULL, b != NONE))
                        hist_add(sm, NULL, b, count ? 1 : w, i);
        });
        if (!scan_bins(sm, cl, BINS, false, g, top_p, &bucket, &rem))
                return false;
        /* the bucket's keys: the logits from its least up to the next bucket's least */
        uint32_t top = ord_of(f.max), live = ord_of(f.live);
        uint32_t key_lo = least_key(live, top, [&](float v) { return bucket_of(f, v) <= bucket; });
        uint32_t key_hi = bucket == 0 ? top
                                      : least_key(live, top, [&](float v) {
                                                return bucket_of(f, v) <= bucket - 1;
                                        }) - 1;

        /* radix digits of the logit's bits within the bucket: 11, 11, 10 */
        for (uint32_t level = 0; level < 3; level++) {
                uint32_t width = level < 2 ? 11 : 10, shift = level == 0 ? 21 : level == 1 ? 10 : 0;
                uint32_t nb = 1u << width;
                uint32_t *minid = level == 2 ? sm.minid : NULL;
                for (uint32_t j = threadIdx.x; j < nb; j += THREADS) {
                        sm.hist_lo[j] = sm.hist_hi[j] = 0;
                        if (minid)
                                minid[j] = NONE;
                }
                __syncthreads();
                row_pass(row, blo, bhi, [&](uint32_t i, float v) {
                        uint32_t b = NONE;
                        u64 w = 0;
                        uint32_t o = ord_of(v);
                        if (i < bhi && o >= key_lo && o <= key_hi &&
                                (level == 0 || o >> (shift + width) == prefix)) {
                                w = kept(f, i, v);
                                if (w)
                                        b = (o >> shift) & (nb - 1);
                        }
                        if (__any_sync(FULL, b != NONE))
                                hist_add(sm, minid, b, count ? 1 : w, i);
                });
                scan_bins(sm, cl, nb, true, rem, 0.0f, &bin, &rem);
                prefix = prefix << width | bin;
        }

        /* the candidates of logit v weigh alike: the tie is the rem / weight-th by id. The
         * blocks' minid are written again only in the next select's last level, three
         * cluster barriers on. */
        float v = val_of(prefix);
        u64 t = rem / (count ? 1 : sm_weight(v, f.max, f.temp));
        uint32_t id = NONE;
        for (uint32_t k = 0; k < cl.num_blocks(); k++)
                id = min(id, cl.map_shared_rank(sm.minid, k)[bin]);
        if (t > 0)
                id = ordered_pick(
                        sm, cl, row, blo, bhi,
                        [&](uint32_t i, float x) -> u64 { return x == v && kept(f, i, x) ? 1 : 0; },
                        [&](u64) { return t; });
        *ret_v = v;
        *ret_id = id;
        return true;
}

/* Largest logit of ids [lo, hi) and its lowest id, as bk_sample's argmax. A thread visits
 * its ids in ascending order and keeps the first of its largest; where the row allows, 16
 * bytes a load, ARGMAX_LOADS loads in flight (one float at a time, the one block of a
 * batch-1 step read 152064 logits in 16.7 us, 0.7% of the 7B step; docs/PERF.md, ninth
 * session). lo is a multiple of 4. */
#define ARGMAX_LOADS 4

__device__ __forceinline__ void argmax_take(float v, uint32_t i, float &best, int32_t &id)
{
        if (v > best || id == 0x7fffffff) {
                best = v;
                id = (int32_t) i;
        }
}

__device__ void block_argmax(Smem &sm, const float *row, uint32_t lo, uint32_t hi, float *ret_v,
        int32_t *ret_id)
{
        float best = -INFINITY;
        int32_t id = 0x7fffffff;

        if ((uintptr_t) row % 16 == 0) {
                const float4 *r4 = (const float4 *) row;
                uint32_t b1 = hi / 4;
                for (uint32_t b = lo / 4 + threadIdx.x; b < b1; b += ARGMAX_LOADS * THREADS) {
                        float4 v[ARGMAX_LOADS];
#pragma unroll
                        for (uint32_t j = 0; j < ARGMAX_LOADS; j++)
                                if (b + j * THREADS < b1)
                                        v[j] = r4[b + j * THREADS];
#pragma unroll
                        for (uint32_t j = 0; j < ARGMAX_LOADS; j++) {
                                if (b + j * THREADS >= b1)
                                        break;
                                uint32_t i = 4 * (b + j * THREADS);
                                argmax_take(v[j].x, i, best, id);
                                argmax_take(v[j].y, i + 1, best, id);
                                argmax_take(v[j].z, i + 2, best, id);
                                argmax_take(v[j].w, i + 3, best, id);
                        }
                }
                /* a last partial piece: after the thread's others, in ascending order */
                if (4 * b1 + threadIdx.x < hi)
                        argmax_take(row[4 * b1 + threadIdx.x], 4 * b1 + threadIdx.x, best, id);
        } else {
                for (uint32_t i = lo + threadIdx.x; i < hi; i += THREADS)
                        argmax_take(row[i], i, best, id);
        }
        for (int o = 16; o > 0; o >>= 1) {
                float ov = __shfl_xor_sync(FULL, best, o);
                int32_t oi = __shfl_xor_sync(FULL, id, o);
                if (ov > best || (ov == best && oi < id)) {
                        best = ov;
                        id = oi;
                }
        }
        if (threadIdx.x % 32 == 0) {
                sm.bv[threadIdx.x / 32] = best;
                sm.bi[threadIdx.x / 32] = id;
        }
        __syncthreads();
        best = sm.bv[0];
        id = sm.bi[0];
        for (uint32_t w = 1; w < WARPS; w++)
                if (sm.bv[w] > best || (sm.bv[w] == best && sm.bi[w] < id)) {
                        best = sm.bv[w];
                        id = sm.bi[w];
                }
        __syncthreads();
        *ret_v = best;
        *ret_id = id;
}

/* A row is one cluster: its blocks take equal runs of ids (multiples of 4), penalize their
 * own and find their largest logit, and every block takes the others' through distributed
 * shared memory. A row sampled with a temperature then goes through the selects and the
 * draw, each block over its own run. One block read a 152064-logit row's 608 KB in about
 * 10 us of the 7B step's critical path, bound by what one SM has in flight; eight take 6.3
 * us (7B batch 1 0.6% faster, 32B 0.2%: docs/PERF.md, twenty-fifth session). One block
 * alone through the selects of a row of nearly flat logits took about 1.1 ms (forty-first
 * session, run 5). */
__global__ void __launch_bounds__(THREADS) k_sample(float *logits, uint32_t ld, uint32_t vocab,
        const CuSampleParams *params, const uint2 *pen, float *pen_saved, int32_t *ids)
{
        pdl_wait();
        __shared__ Smem sm;
        cg::cluster_group cl = cg::this_cluster();
        uint32_t nb = cl.num_blocks(), rank = cl.block_rank(), r = blockIdx.x / nb;
        uint32_t q = (vocab + 3) / 4;
        uint32_t lo = min(vocab, 4 * (uint32_t) ((uint64_t) q * rank / nb));
        uint32_t hi = min(vocab, 4 * (uint32_t) ((uint64_t) q * (rank + 1) / nb));
        float *row = logits + (size_t) r * ld;
        const CuSampleParams p = params[r];

        /* penalties, in place: the ids are distinct; the raw logits come back below */
        for (uint32_t j = threadIdx.x; j < p.pen_n; j += THREADS) {
                uint2 e = pen[p.pen_off + j];
                if (e.x < lo || e.x >= hi)
                        continue;
                float v = row[e.x];
                pen_saved[p.pen_off + j] = v;
                row[e.x] = sm_penalize(v, e.y, p.repetition, p.presence, p.frequency);
        }
        __syncthreads();

        /* greedy, and rows no weight can be computed for */
        float max;
        int32_t best;
        block_argmax(sm, row, lo, hi, &max, &best);
        if (threadIdx.x == 0) {
                sm.rank_v = max;
                sm.rank_id = best;
        }
        /* every block's penalties in the row and its largest in its shared memory */
        cl.sync();
        /* as the warps' results meet, from the first block's on in every block, so that
         * all agree (a run may be empty: small vocabularies); rank_v and rank_id are not
         * written again */
        max = *cl.map_shared_rank(&sm.rank_v, 0);
        int32_t id = *cl.map_shared_rank(&sm.rank_id, 0);
        for (uint32_t k = 1; k < nb; k++) {
                float v = *cl.map_shared_rank(&sm.rank_v, k);
                int32_t i = *cl.map_shared_rank(&sm.rank_id, k);
                if (v > max || (v == max && i < id)) {
                        max = v;
                        id = i;
                }
        }

        if (p.temperature > 0.0f && isfinite(max)) {
                Filter f = {};
                f.max = max;
                f.temp = p.temperature;
                f.live = val_of(least_key(ord_of(-INFINITY), ord_of(max), [&](float v) {
                        return sm_scaled(v, max, p.temperature) >= SM_X_MIN;
                }));
                if (p.top_k > 0 && p.top_k < vocab)
                        f.k_on = weighted_select(sm, cl, row, lo, hi, f, true, p.top_k - 1, 0.0f,
                                &f.kv, &f.kid);
                if (p.top_p > 0.0f && p.top_p < 1.0f)
                        f.p_on = weighted_select(sm, cl, row, lo, hi, f, false, 0, p.top_p, &f.pv,
                                &f.pid);
                f.min_on = p.min_p > 0.0f;
                f.min_w = sm_min_p_floor(p.min_p);
                uint64_t random = philox_draw(p.seed, p.draw);
                uint32_t pick = ordered_pick(
                        sm, cl, row, lo, hi, [&](uint32_t i, float v) { return kept(f, i, v); },
                        [&](u64 total) { return (u64) sm_target(random, total); });
                if (pick < vocab)
                        id = (int32_t) pick;
        }

        /* every block is done with the others' shared memory and the penalized row */
        cl.sync();
        for (uint32_t j = threadIdx.x; j < p.pen_n; j += THREADS) {
                uint32_t i = pen[p.pen_off + j].x;
                if (i >= lo && i < hi)
                        row[i] = pen_saved[p.pen_off + j];
        }
        if (rank == 0 && threadIdx.x == 0) {
                ids[r] = id;
                /* the host's copy without a copy in the stream after the step: a copy's
                 * round trip cost the 7B decode step 11 µs (docs/PERF.md) */
                if (p.out)
                        *p.out = id;
        }
}

void cu_sample(cudaStream_t st, float *logits, uint32_t rows, uint32_t ld, uint32_t vocab,
        const CuSampleParams *params, const uint2 *pen, float *pen_saved, int32_t *ids)
{
        /* a cluster a row, as wide as the rows leave SMs idle */
        uint32_t nb = SAMPLE_CLUSTER;
        while (nb > 1 && rows * nb > SAMPLE_CLUSTER_BLOCKS)
                nb /= 2;
        cudaLaunchAttribute at;
        at.id = cudaLaunchAttributeClusterDimension;
        at.val.clusterDim.x = nb;
        at.val.clusterDim.y = 1;
        at.val.clusterDim.z = 1;
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = dim3(rows * nb);
        cfg.blockDim = dim3(THREADS);
        cfg.stream = st;
        cfg.attrs = &at;
        cfg.numAttrs = 1;
        /* a failed launch is the step's error, as for the <<<>>> launches */
        cudaLaunchKernelEx(&cfg, k_sample, logits, ld, vocab, params, pen, pen_saved, ids);
}
