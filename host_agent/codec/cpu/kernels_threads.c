/*
 * The two-thread helper every kernel that splits its work in halves runs (kernels.h, run_pair). It has no
 * Python twin: the torch code runs on one thread, and no result depends on how many threads ran. A file of
 * its own, so that the kernels that use it (sketch, sort, scan, bloom, peel) call down into it and never
 * into each other's files for it.
 */
#include "kernels.h"

#include <pthread.h>

struct pair_call {
    void (*fn)(void *);
    void *arg;
};

static void *pair_main(void *p)
{
    struct pair_call *c = p;
    c->fn(c->arg);
    return NULL;
}

void run_pair(void (*fn)(void *), void *arg_a, void *arg_b, int threads)
{
    pthread_t thread;
    struct pair_call call = {fn, arg_a};
    if (threads > 1 && pthread_create(&thread, NULL, pair_main, &call) == 0) {
        fn(arg_b);
        pthread_join(thread, NULL);
        return;
    }
    fn(arg_a);
    fn(arg_b);
}
