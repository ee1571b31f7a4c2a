/* The pacing state's lock (compute_lock.h, compute_lock.c): mutual exclusion among threads that
 * hold it briefly and threads that sleep while holding it (as a launch waiting for its work
 * does), so that waiters go to sleep on the futex and must each be woken, with the program's
 * errno left as it was. Built with its source under ASan/UBSan (nox -s sanitize) and plainly by
 * the test suite. Prints "N passed, M failed" and exits non-zero on failure. */
#define _GNU_SOURCE
#include "compute_lock.h"
#include "unit_check.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <time.h>

#define THREADS 8
#define ROUNDS 20000

static struct vgpu_lock lock = VGPU_LOCK_INITIALIZER;
/* Guarded by the lock, written without atomics; volatile so that the compiler keeps every
 * read and write where the source has them, inside the lock. */
static volatile long counter;
static volatile int inside; /* threads inside the lock at once: never more than one */
static int most_inside; /* the most ever seen */

static void sleep_us(long microseconds) {
    struct timespec delay = {0, microseconds * 1000};
    nanosleep(&delay, NULL);
}

static void *worker(void *argument) {
    long id = (long)argument;
    for (int round = 0; round < ROUNDS; round++) {
        vgpu_lock_take(&lock);
        inside++;
        most_inside = inside > most_inside ? inside : most_inside;
        long seen = counter;
        if (round % 2000 == (int)id) {
            sleep_us(200); /* a holder that waits: the others sleep on the word meanwhile */
        } else if (round % 64 == 0) {
            sched_yield(); /* a holder descheduled between its read and its write */
        }
        for (volatile int spin = 0; spin < 20; spin++) {
        }
        counter = seen + 1;
        inside--;
        vgpu_lock_give(&lock);
    }
    return NULL;
}

static void exclusion(void) {
    pthread_t threads[THREADS];
    for (long i = 0; i < THREADS; i++) {
        CHECK(pthread_create(&threads[i], NULL, worker, (void *)i) == 0);
    }
    for (int i = 0; i < THREADS; i++) {
        CHECK(pthread_join(threads[i], NULL) == 0);
    }
    CHECK(counter == (long)THREADS * ROUNDS);
    CHECK(most_inside == 1);
    CHECK(atomic_load(&lock.word) == 0); /* let go for good, nobody marked as waiting */
}

static void *try_from_another_thread(void *argument) {
    (void)argument;
    bool taken = vgpu_lock_try(&lock);
    if (taken) {
        vgpu_lock_give(&lock);
    }
    return (void *)(long)taken;
}

static void trying(void) {
    CHECK(vgpu_lock_try(&lock));
    pthread_t other;
    void *taken = (void *)1L;
    CHECK(pthread_create(&other, NULL, try_from_another_thread, NULL) == 0);
    CHECK(pthread_join(other, &taken) == 0);
    CHECK(taken == NULL); /* held here: another thread's try fails at once */
    vgpu_lock_give(&lock);
    CHECK(pthread_create(&other, NULL, try_from_another_thread, NULL) == 0);
    CHECK(pthread_join(other, &taken) == 0);
    CHECK(taken != NULL); /* free: taken and let go */
    CHECK(atomic_load(&lock.word) == 0);
}

/* A holder that sleeps while another thread waits: the waiter marks the word 2 and sleeps on
 * it, and letting go wakes it. */
static void *wait_for_it(void *argument) {
    (void)argument;
    errno = ENOTRECOVERABLE;
    vgpu_lock_take(&lock); /* sleeps on the futex: the program's errno stays */
    counter++;
    bool kept = errno == ENOTRECOVERABLE;
    vgpu_lock_give(&lock);
    return (void *)(long)kept;
}

static void ignore(int signal_number) {
    (void)signal_number;
}

static void waking(void) {
    struct sigaction action = {.sa_handler = ignore}; /* no SA_RESTART */
    sigemptyset(&action.sa_mask);
    CHECK(sigaction(SIGUSR1, &action, NULL) == 0);
    counter = 0;
    vgpu_lock_take(&lock);
    pthread_t waiter;
    CHECK(pthread_create(&waiter, NULL, wait_for_it, NULL) == 0);
    /* Up to 30 s for the waiter to start and find the lock held, on a loaded machine. */
    for (int i = 0; i < 300000 && atomic_load(&lock.word) != 2; i++) {
        sleep_us(100);
    }
    CHECK(atomic_load(&lock.word) == 2); /* the waiter said it may sleep */
    /* A signal while it sleeps (a handler without SA_RESTART): the wait returns EINTR, and the
     * waiter goes back to sleep with the program's errno as it was. */
    sleep_us(20000);
    CHECK(pthread_kill(waiter, SIGUSR1) == 0);
    sleep_us(20000);
    CHECK(counter == 0);
    errno = ENOTRECOVERABLE;
    vgpu_lock_give(&lock); /* wakes the waiter: errno stays here too */
    CHECK(errno == ENOTRECOVERABLE);
    void *kept = NULL;
    CHECK(pthread_join(waiter, &kept) == 0);
    CHECK(kept != NULL);
    CHECK(counter == 1);
    CHECK(atomic_load(&lock.word) == 0);
}

int main(void) {
    exclusion();
    trying();
    waking();
    return unit_report();
}
