/* SPDX-License-Identifier: MIT */
#include <assert.h>
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_pool.h"

/* Everything below the mutex is read and written only with it held. */
struct CpuPool {
        pthread_mutex_t lock;
        pthread_cond_t work; /* generation moved on or stop was set */
        pthread_cond_t done; /* pending reached zero */
        uint64_t generation; /* counts the jobs posted */
        CpuPoolFn fn;        /* the job of this generation */
        void *arg;
        uint32_t parts;
        uint32_t pending; /* workers that have not finished this generation's part */
        bool stop;
        uint32_t threads;  /* the caller and the workers */
        uint32_t started;  /* workers running, the first ones of worker[] */
        pthread_t *worker; /* (threads); worker[i - 1] runs part i */
};

typedef struct {
        CpuPool *pool;
        uint32_t id; /* the part it runs, 1 .. threads - 1 */
} WorkerArg;

static void *worker_main(void *data)
{
        CpuPool *p = ((WorkerArg *) data)->pool;
        uint32_t id = ((WorkerArg *) data)->id;
        uint64_t seen = 0;

        free(data);
        pthread_mutex_lock(&p->lock);
        for (;;) {
                /* Pairs with the broadcasts in cpu_pool_run() and cpu_pool_free(). */
                while (!p->stop && p->generation == seen)
                        pthread_cond_wait(&p->work, &p->lock);
                if (p->stop)
                        break;
                seen = p->generation;
                if (id >= p->parts)
                        continue;

                CpuPoolFn fn = p->fn;
                void *arg = p->arg;
                uint32_t parts = p->parts;
                pthread_mutex_unlock(&p->lock);
                fn(arg, id, parts);
                pthread_mutex_lock(&p->lock);
                /* Pairs with the wait on done in cpu_pool_run(): the part's writes happen
                 * before the caller, which takes the lock after us, reads them. */
                if (--p->pending == 0)
                        pthread_cond_signal(&p->done);
        }
        pthread_mutex_unlock(&p->lock);
        return NULL;
}

void cpu_pool_free(CpuPool *p)
{
        if (!p)
                return;
        pthread_mutex_lock(&p->lock);
        p->stop = true;
        /* Pairs with the wait on work in worker_main(). */
        pthread_cond_broadcast(&p->work);
        pthread_mutex_unlock(&p->lock);
        for (uint32_t i = 0; i < p->started; i++)
                pthread_join(p->worker[i], NULL);
        pthread_cond_destroy(&p->done);
        pthread_cond_destroy(&p->work);
        pthread_mutex_destroy(&p->lock);
        free(p->worker);
        free(p);
}

int cpu_pool_new(uint32_t threads, CpuPool **ret, DsError *err)
{
        CpuPool *p;
        int r;

        threads = threads ? threads : 1;
        if (threads > CPU_POOL_MAX_THREADS)
                return ds_error(
                        err, -EINVAL, "%u threads, at most %u", threads, CPU_POOL_MAX_THREADS);
        p = calloc(1, sizeof(*p));
        if (!p)
                return ds_error(err, -ENOMEM, "out of memory for the thread pool");
        p->threads = threads;
        p->worker = calloc(threads, sizeof(*p->worker));
        if (!p->worker) {
                free(p);
                return ds_error(err, -ENOMEM, "out of memory for the thread pool");
        }
        pthread_mutex_init(&p->lock, NULL);
        pthread_cond_init(&p->work, NULL);
        pthread_cond_init(&p->done, NULL);

        for (uint32_t i = 1; i < threads; i++) {
                WorkerArg *a = malloc(sizeof(*a));
                if (!a) {
                        cpu_pool_free(p);
                        return ds_error(err, -ENOMEM, "out of memory for the thread pool");
                }
                *a = (WorkerArg){.pool = p, .id = i};
                r = pthread_create(&p->worker[i - 1], NULL, worker_main, a);
                if (r != 0) {
                        free(a);
                        cpu_pool_free(p);
                        return ds_error(err, -r, "starting worker thread %u: %s", i, strerror(r));
                }
                p->started = i;
        }
        *ret = p;
        return 0;
}

uint32_t cpu_pool_threads(const CpuPool *p)
{
        return p ? p->threads : 1;
}

void cpu_pool_run(CpuPool *p, CpuPoolFn fn, void *arg, uint32_t parts)
{
        if (!p || parts <= 1) {
                for (uint32_t i = 0; i < parts; i++)
                        fn(arg, i, parts);
                return;
        }
        assert(parts <= p->threads);

        pthread_mutex_lock(&p->lock);
        p->fn = fn;
        p->arg = arg;
        p->parts = parts;
        p->pending = parts - 1;
        p->generation++;
        /* Pairs with the wait on work in worker_main(): the job's inputs, written before
         * this call, happen before any worker runs a part. */
        pthread_cond_broadcast(&p->work);
        pthread_mutex_unlock(&p->lock);

        fn(arg, 0, parts);

        pthread_mutex_lock(&p->lock);
        /* Pairs with the signal on done in worker_main(). */
        while (p->pending > 0)
                pthread_cond_wait(&p->done, &p->lock);
        pthread_mutex_unlock(&p->lock);
}
