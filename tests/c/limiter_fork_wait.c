/* A fork while another thread waits in the limiter's first call for its pod's region
 * (TF_REGION_WAIT): a thread calls cuInit, the main thread forks meanwhile, and the child calls
 * cuInit in turn. Neither may hang: each finishes once the region comes (or the wait ends).
 * Prints one JSON object: the parent thread's and the child's results. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cuda_api.h"

static CUresult thread_result = CUDA_ERROR_UNKNOWN;

static void *first_call(void *unused) {
    (void)unused;
    thread_result = cuInit(0);
    return NULL;
}

int main(void) {
    pthread_t thread;
    if (pthread_create(&thread, NULL, first_call, NULL) != 0) {
        return 2;
    }
    struct timespec pause = {0, 200 * 1000 * 1000}; /* the thread is waiting by then */
    nanosleep(&pause, NULL);
    pid_t child = fork();
    if (child == 0) {
        _exit(cuInit(0) == CUDA_SUCCESS ? 0 : 1);
    }
    int status = -1;
    waitpid(child, &status, 0);
    pthread_join(thread, NULL);
    printf("{\"thread\":%d,\"child\":%d}\n", (int)thread_result,
           WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    return 0;
}
