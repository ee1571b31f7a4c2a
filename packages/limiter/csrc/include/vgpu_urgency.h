/* How often another pod's urgency may end a holder's epoch: the one rule of the lease arbiter
 * (per party) and of lease files (per holder). */
#ifndef VGPU_URGENCY_H
#define VGPU_URGENCY_H

#include <stdbool.h>
#include <stdint.h>

#include "vgpu_region.h"

/* Whether an urgent request at `now` is honoured, given the times of the last two honoured
 * (`honoured[0]` the older, 0: none), noting it when it is: at most two in any
 * 2 × VGPU_ARBITER_URGENT_EVERY_NS. On average once per 20 ms, as one at a time allowed, but a
 * second request soon after the first is honoured too: a light pod whose burst lost the lease at
 * a host hiccup between two of its launches (a Python program's 1 ms now and then) asks again at
 * once, and refused, it waited out the other pod's 32-ms epoch (on an H100, a 40-ms round against
 * 11, about one in 120). A time before the older one (another clock's) does not hold it back. */
static inline bool vgpu_urgency_honoured(uint64_t honoured[2], uint64_t now) {
    if (honoured[0] != 0 && now >= honoured[0] &&
        now - honoured[0] < 2 * VGPU_ARBITER_URGENT_EVERY_NS) {
        return false;
    }
    honoured[0] = honoured[1];
    honoured[1] = now;
    return true;
}

#endif
