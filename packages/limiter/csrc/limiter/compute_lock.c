/* The slow paths of the pacing state's lock (compute_lock.h): the three-state futex mutex. A
 * thread that finds the lock held marks it 2 (someone may sleep) and sleeps while it stays 2;
 * the holder that lets go of a 2 wakes one sleeper, which marks it 2 again as it takes it, so a
 * later sleeper is never forgotten. */
#define _GNU_SOURCE
#include "compute_lock.h"

#include <errno.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

/* The program's errno is left as it was: a pthread mutex never changed it, and syscall() does
 * (EAGAIN, EINTR). */
void vgpu_lock_wait(struct vgpu_lock *lock) {
    int saved = errno;
    uint32_t seen = atomic_exchange_explicit(&lock->word, 2, memory_order_acquire);
    while (seen != 0) {
        /* Returns at once when the word is no longer 2 (let go meanwhile), on a wake, or on a
         * signal: each is followed by another try. */
        syscall(SYS_futex, &lock->word, FUTEX_WAIT_PRIVATE, 2, NULL, NULL, 0);
        seen = atomic_exchange_explicit(&lock->word, 2, memory_order_acquire);
    }
    errno = saved;
}

void vgpu_lock_wake(struct vgpu_lock *lock) {
    int saved = errno;
    syscall(SYS_futex, &lock->word, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
    errno = saved;
}
