/* The lease arbiter's policy (arbiter_internal.h): no sockets, no seats made, no clock of its
 * own, so that the C tests run it as they like. */
#include <stdlib.h>

#include "arbiter_internal.h"
#include "vgpu_urgency.h"

/* Whether the holder's own words say it stopped launching or left the GPU idle. The clock is
 * read after its words: a time it wrote just now is then never in the future. */
static bool holder_done(const struct vgpu_arbiter *arbiter, const struct gpu *gpu,
                        const struct vgpu_lease_seat *seat) {
    uint64_t activity = atomic_load(&seat->activity_ns);
    uint64_t drains = atomic_load(&seat->drains_ns);
    uint64_t now = arbiter->clock();
    if (activity > now) {
        return true; /* no clock of this node writes the future */
    }
    uint64_t since = activity > gpu->held_since_ns ? activity : gpu->held_since_ns;
    bool drained = drains != 0 && drains >= activity && now > drains &&
                   now - drains > VGPU_LEASE_DRAINED_NS && now - drains < VGPU_LEASE_HOLD_NS;
    return now - since > VGPU_LEASE_STALE_NS || drained;
}

void vgpu_arbiter_penalize(struct party *party, uint64_t now) {
    bool again = now < party->penalty_until_ns + party->penalty_ns;
    party->penalty_ns = !again ? PENALTY_NS
                        : party->penalty_ns * 2 > PENALTY_MAX_NS ? PENALTY_MAX_NS
                                                                 : party->penalty_ns * 2;
    party->penalty_until_ns = now + party->penalty_ns;
}

bool vgpu_arbiter_honour_urgent(struct party *party, uint64_t now) {
    if (party->penalty_until_ns > now) {
        return false; /* served last for overrunning: no one ends an epoch for it */
    }
    return vgpu_urgency_honoured(party->urgent_ns, now);
}

/* Whether a client of `pod` waits for the lease of `gpu`; the first one's index, else -1. */
static int waiter_of(const struct vgpu_arbiter *arbiter, int gpu, uint64_t pod) {
    for (int index = 0; index < MAX_CLIENTS; index++) {
        const struct client *client = &arbiter->clients[index];
        if (client->fd >= 0 && client->waiting && client->gpu == gpu && client->pod == pod) {
            return index;
        }
    }
    return -1;
}

int vgpu_arbiter_crossed(const struct vgpu_arbiter *arbiter, int gpu_index, uint64_t now) {
    const struct gpu *gpu = &arbiter->gpus[gpu_index];
    if (gpu->holder < 0 || now - gpu->held_since_ns <= CROSSED_NS) {
        return -1;
    }
    uint64_t pod = arbiter->clients[gpu->holder].pod;
    for (int other = 0; other < arbiter->gpu_count; other++) {
        const struct gpu *held = &arbiter->gpus[other];
        if (other == gpu_index || held->holder < 0 || waiter_of(arbiter, other, pod) < 0) {
            continue; /* this pod does not wait for that GPU, or nobody holds it */
        }
        uint64_t theirs = arbiter->clients[held->holder].pod;
        int partner = theirs != pod ? waiter_of(arbiter, gpu_index, theirs) : -1;
        /* Of the two holds, the younger one goes (the same one whichever GPU is looked at). */
        bool younger = gpu->held_since_ns != held->held_since_ns
                           ? gpu->held_since_ns > held->held_since_ns
                           : gpu_index > other;
        if (partner >= 0 && younger) {
            return partner;
        }
    }
    return -1;
}

int vgpu_arbiter_next_waiter(const struct vgpu_arbiter *arbiter, int gpu, uint64_t now) {
    int best = -1;
    for (int index = 0; index < MAX_CLIENTS; index++) {
        const struct client *client = &arbiter->clients[index];
        if (client->fd < 0 || client->gpu != gpu || !client->waiting) {
            continue;
        }
        if (best < 0) {
            best = index;
            continue;
        }
        const struct party *mine = &arbiter->parties[client->party];
        const struct party *theirs = &arbiter->parties[arbiter->clients[best].party];
        bool penalized = mine->penalty_until_ns > now;
        bool best_penalized = theirs->penalty_until_ns > now;
        bool urgent = client->urgent;
        bool best_urgent = arbiter->clients[best].urgent;
        if (penalized != best_penalized ? !penalized
            : urgent != best_urgent       ? urgent
            : mine->last_grant != theirs->last_grant
                ? mine->last_grant < theirs->last_grant
                : client->ticket < arbiter->clients[best].ticket) {
            best = index;
        }
    }
    return best;
}

static int by_pod(const void *left, const void *right) {
    uint64_t a = *(const uint64_t *)left;
    uint64_t b = *(const uint64_t *)right;
    return a < b ? -1 : a > b;
}

/* How many of the `count` sorted pods are `pod`. */
static uint64_t count_of(const uint64_t *pods, uint64_t count, uint64_t pod) {
    uint64_t low = 0;
    uint64_t high = count;
    while (low < high) { /* the first not below `pod` */
        uint64_t middle = low + (high - low) / 2;
        low = pods[middle] < pod ? middle + 1 : low;
        high = pods[middle] < pod ? high : middle;
    }
    uint64_t end = low;
    while (end < count && pods[end] == pod) {
        end++;
    }
    return end - low;
}

uint64_t vgpu_arbiter_tell(struct vgpu_arbiter *arbiter, int gpu_index) {
    const struct gpu *gpu = &arbiter->gpus[gpu_index];
    uint64_t waiting = 0;
    const struct client *holder = gpu->holder >= 0 ? &arbiter->clients[gpu->holder] : NULL;
    bool urgent = false; /* a waiter of another party than the holder's waits urgently */
    for (int index = 0; index < MAX_CLIENTS; index++) {
        const struct client *client = &arbiter->clients[index];
        if (client->fd >= 0 && client->gpu == gpu_index && client->waiting) {
            arbiter->pods[waiting++] = client->pod;
            /* Its pod as it says it: honouring is limited per party (urgent_ns), so a tenant
             * that lies about its pod asks no more yields than one that does not. */
            urgent = urgent || (client->urgent && holder != NULL && client->pod != holder->pod);
        }
    }
    qsort(arbiter->pods, waiting, sizeof arbiter->pods[0], by_pod);
    for (int index = 0; index < MAX_CLIENTS; index++) {
        struct client *client = &arbiter->clients[index];
        if (client->fd < 0 || client->gpu != gpu_index || client->seat == NULL) {
            continue;
        }
        uint64_t own = count_of(arbiter->pods, waiting, client->pod);
        atomic_store(&client->seat->waiters, waiting - client->waiting);
        atomic_store(&client->seat->other_pod_waiters, waiting - own);
        atomic_store(&client->seat->other_pod_holds,
                     holder != NULL && holder != client && holder->pod != client->pod);
        atomic_store(&client->seat->yield_request,
                     client == holder && urgent ? client->request : 0);
    }
    return waiting;
}

enum vgpu_arbiter_verdict vgpu_arbiter_judge(const struct vgpu_arbiter *arbiter, int gpu_index,
                                             int next) {
    const struct gpu *gpu = &arbiter->gpus[gpu_index];
    const struct client *holder = &arbiter->clients[gpu->holder];
    if (holder_done(arbiter, gpu, holder->seat)) {
        return VGPU_ARBITER_DONE;
    }
    uint64_t now = arbiter->clock();
    if (now - gpu->held_since_ns > VGPU_LEASE_HOLD_NS) {
        return VGPU_ARBITER_OVERRAN;
    }
    /* A party served last for a while gives way to any other that waits, at once. */
    bool last = arbiter->parties[holder->party].penalty_until_ns > now;
    return last && arbiter->parties[arbiter->clients[next].party].penalty_until_ns <= now
               ? VGPU_ARBITER_YIELDS
               : VGPU_ARBITER_KEEP;
}

uint64_t vgpu_arbiter_deadline(const struct vgpu_arbiter *arbiter, int gpu_index, uint64_t now) {
    const struct gpu *gpu = &arbiter->gpus[gpu_index];
    const struct vgpu_lease_seat *seat = arbiter->clients[gpu->holder].seat;
    uint64_t activity = atomic_load(&seat->activity_ns);
    uint64_t drains = atomic_load(&seat->drains_ns);
    uint64_t since = activity > gpu->held_since_ns && activity <= now ? activity
                                                                        : gpu->held_since_ns;
    uint64_t at = gpu->held_since_ns + VGPU_LEASE_HOLD_NS;
    at = since + VGPU_LEASE_STALE_NS < at ? since + VGPU_LEASE_STALE_NS : at;
    uint64_t crossed = gpu->held_since_ns + CROSSED_NS + 1; /* when a crossed hold is broken */
    at = crossed > now && crossed < at ? crossed : at;
    uint64_t idle = drains + VGPU_LEASE_DRAINED_NS + 1;
    if (drains != 0 && drains >= activity && idle > now && idle < at) {
        at = idle;
    }
    return at > now + MIN_WAIT_NS ? at : now + MIN_WAIT_NS;
}
