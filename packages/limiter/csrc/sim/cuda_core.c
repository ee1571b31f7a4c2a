/* Simulated driver: what every other part of it builds on — the process's driver lock, handle
 * checks, and each thread's stack of current contexts. Calls nothing else in the driver but
 * cuda_device.c's initialization check, so the files above it depend on it and not on each
 * other. */
#define _GNU_SOURCE
#include <string.h>

#include "cuda_sim.h"

#define STACK_DEPTH 32

pthread_mutex_t sim_driver_lock = PTHREAD_MUTEX_INITIALIZER;

static __thread struct CUctx_st *context_stack[STACK_DEPTH];
static __thread int stack_depth;

bool sim_valid(const void *object, uint32_t magic) {
    return object != NULL && *(const uint32_t *)object == magic;
}

struct CUctx_st *sim_context_top(void) {
    return stack_depth > 0 ? context_stack[stack_depth - 1] : NULL;
}

CUresult sim_current_context(struct CUctx_st **context) {
    struct CUctx_st *top = sim_context_top();
    if (!sim_valid(top, SIM_CONTEXT)) {
        return CUDA_ERROR_INVALID_CONTEXT;
    }
    *context = top;
    return CUDA_SUCCESS;
}

CUresult sim_current_device(int *device, struct CUctx_st **context) {
    struct CUctx_st *current;
    CUresult result = sim_initialized();
    if (result != CUDA_SUCCESS || (result = sim_current_context(&current)) != CUDA_SUCCESS) {
        return result;
    }
    *device = current->device;
    if (context != NULL) {
        *context = current;
    }
    return CUDA_SUCCESS;
}

bool sim_context_push(struct CUctx_st *context) {
    if (stack_depth == STACK_DEPTH) {
        return false;
    }
    context_stack[stack_depth++] = context;
    return true;
}

struct CUctx_st *sim_context_pop(void) {
    return stack_depth > 0 ? context_stack[--stack_depth] : NULL;
}

void sim_context_replace_top(struct CUctx_st *context) {
    if (context == NULL) {
        sim_context_pop();
        return;
    }
    if (stack_depth == 0) {
        stack_depth = 1;
    }
    context_stack[stack_depth - 1] = context;
}

void sim_context_forget(struct CUctx_st *context) {
    for (int i = 0; i < stack_depth; i++) {
        if (context_stack[i] == context) {
            memmove(&context_stack[i], &context_stack[i + 1],
                    (size_t)(stack_depth - i - 1) * sizeof context_stack[0]);
            stack_depth--;
            i--;
        }
    }
}
