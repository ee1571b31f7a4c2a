/* The lock of one device's pacing state (struct paced_device): a futex word, taken and let go
 * inline. Every paced launch takes it once. glibc's pthread_mutex_lock and _unlock are calls
 * into libc whose code and type dispatch a real driver's launch leaves out of the CPU's caches,
 * so each launch paid for them again; this lock's fast paths are one atomic instruction each in
 * the launch's own code, on the cache line of the state it guards. Like a default pthread
 * mutex it neither spins nor is fair, and a holder that waits (for its work, the lease) makes
 * the pod's other launching threads sleep in the kernel, not spin. */
#ifndef VGPU_LIMITER_COMPUTE_LOCK_H
#define VGPU_LIMITER_COMPUTE_LOCK_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

/* 0: free; 1: held; 2: held, and a thread may sleep on it (letting go wakes one). */
struct vgpu_lock {
    _Atomic uint32_t word;
};

#define VGPU_LOCK_INITIALIZER {0}

/* The slow paths (compute_lock.c): sleep until the lock is free and take it; wake a sleeper. */
void vgpu_lock_wait(struct vgpu_lock *lock);
void vgpu_lock_wake(struct vgpu_lock *lock);

static inline void vgpu_lock_take(struct vgpu_lock *lock) {
    uint32_t free = 0;
    if (!atomic_compare_exchange_strong_explicit(&lock->word, &free, 1, memory_order_acquire,
                                                 memory_order_relaxed)) {
        vgpu_lock_wait(lock);
    }
}

/* Whether the lock was free, and is now this thread's. */
static inline bool vgpu_lock_try(struct vgpu_lock *lock) {
    uint32_t free = 0;
    return atomic_compare_exchange_strong_explicit(&lock->word, &free, 1, memory_order_acquire,
                                                   memory_order_relaxed);
}

static inline void vgpu_lock_give(struct vgpu_lock *lock) {
    if (atomic_exchange_explicit(&lock->word, 0, memory_order_release) == 2) {
        vgpu_lock_wake(lock);
    }
}

#endif
