/* The lease arbiter's policy (arbiter_policy.c) on a clock of the test's own: who is served next,
 * when a holder loses the lease, what each client is told. Built with its source under ASan/UBSan
 * (nox -s sanitize) and plainly by the test suite. Prints "N passed, M failed" and exits non-zero
 * on failure. */
#include "arbiter_internal.h"
#include "unit_check.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t now_ns = 1000000000000ULL;

#define MS 1000000ULL

static uint64_t test_clock(void) {
    return now_ns;
}

static struct vgpu_arbiter *arbiter;
static struct vgpu_lease_seat seats[8];

/* One GPU; clients 0..count-1 in parties `parties[i]` of pods `pods[i]`, none waiting. */
static void set_up(int count, const int *parties, const uint64_t *pods) {
    free(arbiter);
    arbiter = calloc(1, sizeof *arbiter);
    memset(seats, 0, sizeof seats);
    arbiter->clock = test_clock;
    arbiter->gpu_count = 1;
    arbiter->gpus[0].holder = -1;
    for (int index = 0; index < MAX_CLIENTS; index++) {
        arbiter->clients[index].fd = -1;
    }
    for (int index = 0; index < count; index++) {
        arbiter->clients[index] = (struct client){
            .fd = 100 + index, .gpu = 0, .party = parties[index], .pod = pods[index],
            .seat = &seats[index]};
        arbiter->parties[parties[index]].clients++;
    }
}

static void wait_for_it(int client, uint64_t ticket) {
    arbiter->clients[client].waiting = true;
    arbiter->clients[client].request = ticket;
    arbiter->clients[client].ticket = ticket;
}

static void hold(int client) {
    arbiter->gpus[0].holder = client;
    arbiter->gpus[0].held_since_ns = now_ns;
    arbiter->clients[client].waiting = false;
}

static void turns(void) {
    static const int parties[] = {0, 0, 1};
    static const uint64_t pods[] = {7, 7, 8};
    set_up(3, parties, pods);
    CHECK(vgpu_arbiter_next_waiter(arbiter, 0, now_ns) == -1);
    wait_for_it(1, 1);
    wait_for_it(0, 2);
    wait_for_it(2, 3);
    /* Within a party, first come first served; parties never served tie. */
    CHECK(vgpu_arbiter_next_waiter(arbiter, 0, now_ns) == 1);
    /* The party served longest ago goes first, whoever came first. */
    arbiter->parties[0].last_grant = 5;
    arbiter->parties[1].last_grant = 4;
    CHECK(vgpu_arbiter_next_waiter(arbiter, 0, now_ns) == 2);
    /* A party served last for a while is served only when no other waits. */
    vgpu_arbiter_penalize(&arbiter->parties[1], now_ns);
    CHECK(vgpu_arbiter_next_waiter(arbiter, 0, now_ns) == 1);
    arbiter->clients[0].waiting = arbiter->clients[1].waiting = false;
    CHECK(vgpu_arbiter_next_waiter(arbiter, 0, now_ns) == 2);
    /* Clients of another GPU, or gone, are not served. */
    arbiter->clients[2].gpu = 1;
    CHECK(vgpu_arbiter_next_waiter(arbiter, 0, now_ns) == -1);
}

static void judging(void) {
    static const int parties[] = {0, 1};
    static const uint64_t pods[] = {7, 8};
    set_up(2, parties, pods);
    hold(0);
    wait_for_it(1, 1);
    seats[0].activity_ns = now_ns;
    CHECK(vgpu_arbiter_judge(arbiter, 0, 1) == VGPU_ARBITER_KEEP);
    /* No launch for the stale time: done. A fresh grant counts from the grant, not from the
     * holder's old activity. */
    now_ns += VGPU_LEASE_STALE_NS + 1;
    CHECK(vgpu_arbiter_judge(arbiter, 0, 1) == VGPU_ARBITER_DONE);
    hold(0);
    seats[0].activity_ns = now_ns - 50 * MS;
    CHECK(vgpu_arbiter_judge(arbiter, 0, 1) == VGPU_ARBITER_KEEP);
    /* Activity in the future is no clock of this node's: done. */
    seats[0].activity_ns = now_ns + 1;
    CHECK(vgpu_arbiter_judge(arbiter, 0, 1) == VGPU_ARBITER_DONE);
    /* Drained by its own word, and launched nothing since: done past 0.5 ms, not before. */
    seats[0].activity_ns = now_ns;
    seats[0].drains_ns = now_ns + MS;
    now_ns += MS + VGPU_LEASE_DRAINED_NS / 2;
    seats[0].activity_ns = now_ns - 1; /* still launching: not stale */
    CHECK(vgpu_arbiter_judge(arbiter, 0, 1) == VGPU_ARBITER_KEEP);
    seats[0].drains_ns = now_ns - VGPU_LEASE_DRAINED_NS - 1;
    seats[0].activity_ns = seats[0].drains_ns;
    CHECK(vgpu_arbiter_judge(arbiter, 0, 1) == VGPU_ARBITER_DONE);
    /* Active by its own word past the hold: overran. */
    hold(0);
    seats[0].drains_ns = 0;
    for (int step = 0; step < 11; step++) {
        now_ns += 10 * MS;
        seats[0].activity_ns = now_ns;
    }
    CHECK(vgpu_arbiter_judge(arbiter, 0, 1) == VGPU_ARBITER_OVERRAN);
    /* A penalized holder yields at once to a party that is not. */
    hold(0);
    seats[0].activity_ns = now_ns;
    vgpu_arbiter_penalize(&arbiter->parties[0], now_ns);
    CHECK(vgpu_arbiter_judge(arbiter, 0, 1) == VGPU_ARBITER_YIELDS);
    vgpu_arbiter_penalize(&arbiter->parties[1], now_ns);
    CHECK(vgpu_arbiter_judge(arbiter, 0, 1) == VGPU_ARBITER_KEEP);
}

static void penalties(void) {
    struct party party = {0};
    vgpu_arbiter_penalize(&party, now_ns);
    CHECK(party.penalty_ns == PENALTY_NS && party.penalty_until_ns == now_ns + PENALTY_NS);
    /* Again soon after: doubled, up to the most. */
    for (int time = 0; time < 8; time++) {
        now_ns = party.penalty_until_ns + 1;
        vgpu_arbiter_penalize(&party, now_ns);
    }
    CHECK(party.penalty_ns == PENALTY_MAX_NS);
    /* Long after: the first length again. */
    now_ns = party.penalty_until_ns + PENALTY_MAX_NS + 1;
    vgpu_arbiter_penalize(&party, now_ns);
    CHECK(party.penalty_ns == PENALTY_NS);
}

static void telling(void) {
    static const int parties[] = {0, 0, 1, 2};
    static const uint64_t pods[] = {7, 7, 8, 9};
    set_up(4, parties, pods);
    CHECK(vgpu_arbiter_tell(arbiter, 0) == 0);
    CHECK(seats[0].waiters == 0 && seats[0].other_pod_holds == 0);
    hold(2);
    wait_for_it(0, 1);
    wait_for_it(1, 2);
    wait_for_it(3, 3);
    CHECK(vgpu_arbiter_tell(arbiter, 0) == 3);
    /* Client 0 sees the two others waiting, one of them of another pod; pod 8 holds. */
    CHECK(seats[0].waiters == 2 && seats[0].other_pod_waiters == 1);
    CHECK(seats[0].other_pod_holds == 1);
    /* The holder sees three waiting, all of other pods, and no other pod holding. */
    CHECK(seats[2].waiters == 3 && seats[2].other_pod_waiters == 3);
    CHECK(seats[2].other_pod_holds == 0);
    CHECK(seats[3].waiters == 2 && seats[3].other_pod_waiters == 2);
}

static void urgency(void) {
    static const int parties[] = {0, 1, 2};
    static const uint64_t pods[] = {7, 8, 9};
    set_up(3, parties, pods);
    hold(0);
    arbiter->clients[0].request = 41;
    wait_for_it(1, 1);
    wait_for_it(2, 2);
    arbiter->parties[1].last_grant = 1; /* served more lately than party 2 */
    CHECK(vgpu_arbiter_next_waiter(arbiter, 0, now_ns) == 2);
    CHECK(vgpu_arbiter_tell(arbiter, 0) == 2);
    CHECK(seats[0].yield_request == 0); /* nobody urgent: the holder keeps its epoch */
    /* Party 1 waits urgently: served first, and the holder is asked to end its epoch. */
    CHECK(vgpu_arbiter_honour_urgent(&arbiter->parties[1], now_ns));
    arbiter->clients[1].urgent = true;
    CHECK(vgpu_arbiter_next_waiter(arbiter, 0, now_ns) == 1);
    vgpu_arbiter_tell(arbiter, 0);
    CHECK(seats[0].yield_request == 41);
    CHECK(seats[1].yield_request == 0 && seats[2].yield_request == 0);
    /* A party's urgency is honoured at most twice in 2 × VGPU_ARBITER_URGENT_EVERY_NS: a second
     * request soon after the first (a burst that lost the lease at a hiccup) is, a third is not,
     * until the first is that old. */
    CHECK(vgpu_arbiter_honour_urgent(&arbiter->parties[1], now_ns + MS));
    CHECK(!vgpu_arbiter_honour_urgent(&arbiter->parties[1], now_ns + 2 * MS));
    CHECK(!vgpu_arbiter_honour_urgent(&arbiter->parties[1],
                                      now_ns + 2 * VGPU_ARBITER_URGENT_EVERY_NS - 1));
    CHECK(vgpu_arbiter_honour_urgent(&arbiter->parties[1],
                                     now_ns + 2 * VGPU_ARBITER_URGENT_EVERY_NS));
    /* Then the one at now_ns + MS holds the next back until it is that old. */
    CHECK(!vgpu_arbiter_honour_urgent(&arbiter->parties[1],
                                      now_ns + 2 * VGPU_ARBITER_URGENT_EVERY_NS + MS / 2));
    CHECK(vgpu_arbiter_honour_urgent(&arbiter->parties[1],
                                     now_ns + 2 * VGPU_ARBITER_URGENT_EVERY_NS + MS));
    /* An urgent waiter of the holder's own pod asks nothing of it. */
    arbiter->clients[1].pod = 7;
    vgpu_arbiter_tell(arbiter, 0);
    CHECK(seats[0].yield_request == 0);
    /* A party served last for overrunning stays last, urgent or not. */
    arbiter->clients[1].pod = 8;
    vgpu_arbiter_penalize(&arbiter->parties[1], now_ns);
    CHECK(vgpu_arbiter_next_waiter(arbiter, 0, now_ns) == 2);
}

/* Two GPUs, two jobs of a rank on each: pod 7 (clients 0 on GPU 0, 1 on GPU 1) and pod 8
 * (clients 2 on GPU 0, 3 on GPU 1), each its own party. */
static void two_jobs(void) {
    static const int parties[] = {0, 0, 1, 1};
    static const uint64_t pods[] = {7, 7, 8, 8};
    set_up(4, parties, pods);
    arbiter->gpu_count = 2;
    arbiter->gpus[1].holder = -1;
    arbiter->clients[1].gpu = arbiter->clients[3].gpu = 1;
}

static void gangs(void) {
    /* A rank whose pod holds the other GPU gets no turn before the rotation's: a tenant holding
     * one GPU could otherwise keep another's lease by taking turns with itself on it. */
    two_jobs();
    hold(0); /* pod 7 holds GPU 0 */
    arbiter->parties[0].last_grant = 9;
    arbiter->parties[1].last_grant = 1;
    wait_for_it(1, 1); /* pod 7's rank on GPU 1 */
    wait_for_it(3, 2); /* pod 8's rank on GPU 1 */
    CHECK(vgpu_arbiter_next_waiter(arbiter, 1, now_ns) == 3);
    /* Crossed: pod 7 holds GPU 0 and waits for GPU 1, which pod 8 holds while waiting for GPU 0.
     * Once CROSSED_NS old, the younger hold (GPU 1's) goes to its partner (pod 7's rank). */
    two_jobs();
    hold(0);
    now_ns += MS;
    arbiter->gpus[1].holder = 3;
    arbiter->gpus[1].held_since_ns = now_ns;
    wait_for_it(1, 1);
    wait_for_it(2, 2);
    CHECK(vgpu_arbiter_crossed(arbiter, 0, now_ns) == -1);
    CHECK(vgpu_arbiter_crossed(arbiter, 1, now_ns) == -1);
    CHECK(vgpu_arbiter_deadline(arbiter, 1, now_ns) == now_ns + CROSSED_NS + 1);
    now_ns += CROSSED_NS + 1;
    CHECK(vgpu_arbiter_crossed(arbiter, 0, now_ns) == -1); /* the older hold stays */
    CHECK(vgpu_arbiter_crossed(arbiter, 1, now_ns) == 1);
    /* Not crossed: pod 7 waits for GPU 1, held by pod 8, which waits for nothing of pod 7's. */
    two_jobs();
    hold(0);
    arbiter->gpus[1].holder = 3;
    arbiter->gpus[1].held_since_ns = now_ns;
    wait_for_it(1, 1);
    now_ns += CROSSED_NS + 1;
    CHECK(vgpu_arbiter_crossed(arbiter, 0, now_ns) == -1);
    CHECK(vgpu_arbiter_crossed(arbiter, 1, now_ns) == -1);
    /* Nor is one pod holding one GPU and waiting for another that nobody holds. */
    two_jobs();
    hold(0);
    wait_for_it(1, 1);
    wait_for_it(2, 2);
    now_ns += CROSSED_NS + 1;
    CHECK(vgpu_arbiter_crossed(arbiter, 0, now_ns) == -1);
    /* A party served last for overrunning is not honoured as urgent. */
    struct party party = {0};
    vgpu_arbiter_penalize(&party, now_ns);
    CHECK(!vgpu_arbiter_honour_urgent(&party, now_ns + MS));
}

static void deadlines(void) {
    static const int parties[] = {0, 1};
    static const uint64_t pods[] = {7, 8};
    set_up(2, parties, pods);
    hold(0);
    seats[0].activity_ns = now_ns;
    /* A fresh hold is looked at again when it could be crossed (gangs). */
    CHECK(vgpu_arbiter_deadline(arbiter, 0, now_ns) == now_ns + CROSSED_NS + 1);
    /* Then stale first, unless it said when its work drains sooner. */
    arbiter->gpus[0].held_since_ns = now_ns - CROSSED_NS - 1;
    CHECK(vgpu_arbiter_deadline(arbiter, 0, now_ns) == now_ns + VGPU_LEASE_STALE_NS);
    seats[0].drains_ns = now_ns + MS;
    CHECK(vgpu_arbiter_deadline(arbiter, 0, now_ns) == now_ns + MS + VGPU_LEASE_DRAINED_NS + 1);
    /* Never sooner than a moment from now: no spinning on a deadline just passed. */
    seats[0].drains_ns = 0;
    arbiter->gpus[0].held_since_ns = seats[0].activity_ns = now_ns - VGPU_LEASE_STALE_NS;
    CHECK(vgpu_arbiter_deadline(arbiter, 0, now_ns) == now_ns + MIN_WAIT_NS);
}

int main(void) {
    turns();
    judging();
    penalties();
    telling();
    urgency();
    gangs();
    deadlines();
    free(arbiter);
    return unit_report();
}
