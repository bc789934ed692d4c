// A block of work items claimed through a shared counter: threads (the pool's in C, or Python's
// `over_blocks`) share a call's items through *next, each claiming `block` items at a time, so a
// thread the OS deschedules on a busy machine holds up at most its current block.
#pragma once
#include <stdint.h>
static inline int64_t claim(int64_t *next, int64_t block, int64_t n, int64_t *end) {
    int64_t r0 = __atomic_fetch_add(next, block, __ATOMIC_RELAXED);
    *end = r0 + block < n ? r0 + block : n;
    return r0;
}
