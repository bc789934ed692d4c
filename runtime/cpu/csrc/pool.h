// A pool of helper threads for short parallel calls from one caller thread (`pool_run`).
// Helpers spin ~POOL_SPIN_NS after each job before sleeping on a futex, so calls that come
// every few hundred microseconds (a decode step's matmuls) wake no one; and there is no barrier:
// the caller claims work alongside the helpers (through claim.h) and waits only for helpers that
// joined the job, so a helper the OS has descheduled on a busy core costs nothing. (OpenMP with
// OMP_WAIT_POLICY=PASSIVE sleeps at once and waits at a barrier for every thread: ~8 ms a call
// when the other core is busy, measured.) The pool is static: each library has its own. Link
// with -pthread.
#pragma once
#include <pthread.h>
#include <time.h>
#include <unistd.h>
#include <sys/syscall.h>
#include <linux/futex.h>
#define POOL_MAX 64
#ifndef POOL_SPIN_NS
#define POOL_SPIN_NS 200000L  /* a library may define its own before this */
#endif
typedef void (*pool_fn)(void*);
static struct { pool_fn fn; void* ctx; int gen, open, active, sleepers, started; } P;
static pthread_mutex_t pool_lock = PTHREAD_MUTEX_INITIALIZER;
static long pool_now_ns(void) {
    struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1000000000L + t.tv_nsec;
}
static void* pool_helper(void* unused) {
    (void)unused;
    int seen = __atomic_load_n(&P.gen, __ATOMIC_SEQ_CST);
    for (;;) {
        long until = pool_now_ns() + POOL_SPIN_NS;
        int g;
        for (int i = 0; (g = __atomic_load_n(&P.gen, __ATOMIC_SEQ_CST)) == seen; ++i) {
            if ((i & 63) || pool_now_ns() < until) { __builtin_ia32_pause(); continue; }
            __atomic_add_fetch(&P.sleepers, 1, __ATOMIC_SEQ_CST);
            syscall(SYS_futex, &P.gen, FUTEX_WAIT_PRIVATE, seen, NULL, NULL, 0);
            __atomic_sub_fetch(&P.sleepers, 1, __ATOMIC_SEQ_CST);
        }
        seen = g;
        __atomic_add_fetch(&P.active, 1, __ATOMIC_SEQ_CST);
        if (__atomic_load_n(&P.open, __ATOMIC_SEQ_CST)) P.fn(P.ctx);  // claims what is left
        __atomic_sub_fetch(&P.active, 1, __ATOMIC_SEQ_CST);
    }
    return NULL;
}
// fn(ctx) on the caller and up to threads - 1 helpers; returns when every thread that joined
// is done. fn must share its work by claiming. A second caller at the same time runs alone.
static void pool_run(pool_fn fn, void* ctx, int threads) {
    if (threads < 2 || pthread_mutex_trylock(&pool_lock)) { fn(ctx); return; }
    for (; P.started < threads - 1 && P.started < POOL_MAX; ++P.started) {
        pthread_t t;
        if (pthread_create(&t, NULL, pool_helper, NULL)) break;
        pthread_detach(t);
    }
    P.fn = fn; P.ctx = ctx;
    __atomic_store_n(&P.open, 1, __ATOMIC_SEQ_CST);
    __atomic_add_fetch(&P.gen, 1, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&P.sleepers, __ATOMIC_SEQ_CST))
        syscall(SYS_futex, &P.gen, FUTEX_WAKE_PRIVATE, POOL_MAX, NULL, NULL, 0);
    fn(ctx);
    __atomic_store_n(&P.open, 0, __ATOMIC_SEQ_CST);
    while (__atomic_load_n(&P.active, __ATOMIC_SEQ_CST)) __builtin_ia32_pause();
    pthread_mutex_unlock(&pool_lock);
}
