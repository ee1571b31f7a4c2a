/* Collectives under a compute limit (compute_gang.h).
 *
 * The ranks of a data-parallel job (one process per GPU, say) meet in collectives: NCCL's kernel
 * on one GPU spins until every rank's kernel of the same collective runs. Paced each on its own,
 * one rank pauses for its bucket while another's collective spins, that spin is GPU time its
 * rank is charged, so that rank pauses in turn while the first one's collective spins: a DDP job
 * at 50 % on two H100s ran at 1-2 % of its unlimited speed. So a process that launches
 * collectives pauses only right before one, and every rank pauses for the same collective until
 * the same time: the first rank to reach it decides, from the buckets of all the pod's GPUs that
 * run collectives, and writes the decision in the pod's gate (the region's gang_gate word); the
 * others read it there. No rank then pauses with its part of a collective in flight. */
#define _GNU_SOURCE
#include "compute_gang.h"

#include <stdatomic.h>

#include "collectives.h"
#include "compute_bucket.h"
#include "core.h"
#include "log.h"
#include "region.h"

/* The name tells (collectives.c). */
static bool named_collective(CUfunction function) {
    const char *name = NULL;
    if (VGPU_REAL(cuFuncGetName, &name, function) != CUDA_SUCCESS &&
        VGPU_REAL(cuKernelGetName, &name, (CUkernel)(void *)function) != CUDA_SUCCESS) {
        return false; /* a driver before 12.3, or a handle without a name */
    }
    bool collective = vgpu_collective_kernel_name(name);
    if (collective) {
        vgpu_log(VGPU_LOG_DEBUG, "collective kernel %s: the pod's ranks pause together", name);
    }
    return collective;
}

bool vgpu_gang_is_collective(struct paced_device *state, CUfunction function) {
    if (function == NULL) {
        return false;
    }
    uint64_t hash = ((uint64_t)(uintptr_t)function >> 4) * 0x9e3779b97f4a7c15ULL;
    unsigned first = (unsigned)(hash >> 32) % KERNEL_NAMES;
    for (unsigned probe = 0; probe < 8; probe++) {
        struct kernel_name *slot = &state->kernels[(first + probe) % KERNEL_NAMES];
        if (slot->function == function) {
            return slot->collective;
        }
        if (slot->function == NULL) {
            slot->function = function;
            slot->collective = named_collective(function);
            return slot->collective;
        }
    }
    /* Crowded: the first slot is taken over (a name is asked again at worst). */
    struct kernel_name *slot = &state->kernels[first];
    slot->function = function;
    slot->collective = named_collective(function);
    return slot->collective;
}

uint64_t vgpu_gang_until(uint64_t seq, uint64_t now, uint64_t (*decide)(void *, uint64_t *now),
                         void *context) {
    _Atomic uint64_t *gate = &vgpu_state.region->gang_gate;
    uint64_t word = atomic_load(gate);
    uint64_t until = 0;
    switch (vgpu_gang_read(word, seq, now, &until)) {
    case VGPU_GANG_FOLLOW:
        return until;
    case VGPU_GANG_LATE:
        return 0;
    case VGPU_GANG_DECIDE:
        break;
    }
    uint64_t wait = decide(context, &now);
    until = now + wait;
    if (!atomic_compare_exchange_strong(gate, &word, vgpu_gang_pack(seq, until))) {
        /* Another rank decided meanwhile: its decision holds for all. */
        uint64_t theirs = 0;
        if (vgpu_gang_read(word, seq, now, &theirs) == VGPU_GANG_FOLLOW) {
            return theirs;
        }
    }
    return until;
}
