/* SPDX-License-Identifier: MIT */
/* A fixed pool of worker threads for the CPU backend: threads - 1 workers started once,
 * plus the calling thread. A job is split into parts that the caller numbers; which
 * thread runs a part never changes what the part computes. */
#pragma once

#include <stdint.h>

#include "error.h"

/* The most threads a pool takes. */
#define CPU_POOL_MAX_THREADS 256

typedef struct CpuPool CpuPool;

/* Runs part `part` of `parts` of a job. */
typedef void (*CpuPoolFn)(void *arg, uint32_t part, uint32_t parts);

/* Starts threads - 1 workers (threads 0 means one, no workers). */
int cpu_pool_new(uint32_t threads, CpuPool **ret, DsError *err);

/* Stops and joins the workers. NULL is a no-op. */
void cpu_pool_free(CpuPool *p);

/* Threads the pool runs a job on, the caller's included; 1 for NULL. */
uint32_t cpu_pool_threads(const CpuPool *p);

/* Runs fn(arg, i, parts) for every i < parts, part 0 on the calling thread and part i on
 * worker i, and returns when all are done. parts is at most cpu_pool_threads(p); with
 * a NULL pool or one part, everything runs on the caller. Allocates nothing. */
void cpu_pool_run(CpuPool *p, CpuPoolFn fn, void *arg, uint32_t parts);
