/* The node daemon's lease arbiter (vgpu_region.h, VGPU_LEASE_SOCKET): one thread, in C so that
 * a hand-over never waits for the daemon's interpreter, that owns every GPU's lease. Paced
 * processes used to share one writable lease per GPU, so any tenant could write its owner word
 * and make other pods wait or pace without exclusivity; here no word is shared between two
 * processes: each has a seat of its own (a sealed memfd only it and the daemon map), and who
 * holds the lease is known to this thread alone.
 *
 * Nothing a client does blocks the thread: sockets are non-blocking, a client whose message is
 * malformed or whose socket is full is dropped (its hold ends), connections are limited per
 * party (one user in one pid namespace: a Kubernetes pod) and in all. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "vgpu_region_api.h"

/* Older C libraries' headers lack memfd and the seals (Linux 3.17); the library must run on
 * glibc 2.17, so memfd_create is the system call itself. */
#ifndef MFD_CLOEXEC
#define MFD_CLOEXEC 0x0001U
#define MFD_ALLOW_SEALING 0x0002U
#endif
#ifndef F_ADD_SEALS
#define F_ADD_SEALS 1033
#define F_SEAL_SEAL 0x0001
#define F_SEAL_SHRINK 0x0002
#define F_SEAL_GROW 0x0004
#endif

#define MAX_GPUS 64
#define MAX_CLIENTS 1024
#define MAX_PER_PARTY 256
#define PENALTY_NS 4000000000ULL      /* a party that overran the hold: served last this long */
#define PENALTY_MAX_NS 32000000000ULL /* doubled while it keeps doing so */
#define HOUSEKEEPING_NS 1000000000ULL
#define MIN_WAIT_NS 20000ULL /* a deadline just passed is looked at again this soon */

struct party { /* a user in a pid namespace: one pod, as far as the kernel can tell */
    uint32_t uid;
    uint64_t namespace_inode;
    int clients;
    uint64_t last_grant; /* the arbiter's grant count when it last got the lease */
    uint64_t penalty_until_ns;
    uint64_t penalty_ns;
};

struct client {
    int fd; /* -1: a free slot */
    int gpu;   /* -1 until its HELLO */
    int party;
    uint64_t pod; /* what it says its pod is: only its own view of "other pods" depends on it */
    struct vgpu_lease_seat *seat;
    bool waiting;
    uint64_t request; /* the request it waits with, or holds the lease for */
    uint64_t ticket;  /* when it began to wait: first come, first served within a party */
};

struct gpu {
    char uuid[VGPU_REGION_UUID_SIZE];
    struct vgpu_device_lease *words; /* the daemon's own: read by its boost estimate */
    int holder;                      /* a client, or -1 */
    uint64_t held_since_ns;
};

struct vgpu_arbiter {
    int listener;
    int wake[2]; /* vgpu_arbiter_stop writes to wake[1] */
    pthread_t thread;
    bool started;
    _Atomic bool stopping;
    uint64_t instance;
    int gpu_count;
    struct gpu gpus[MAX_GPUS];
    struct client clients[MAX_CLIENTS];
    struct party parties[MAX_CLIENTS];
    struct pollfd polled[MAX_CLIENTS + 2];
    int polled_client[MAX_CLIENTS + 2]; /* the client of each polled descriptor past the two */
    uint64_t pods[MAX_CLIENTS];          /* scratch: the pods of a GPU's waiters */
    uint64_t tickets;
    _Atomic uint64_t connected, refused, grants, taken_back, overruns;
};

static uint64_t monotonic_ns(void) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (uint64_t)now.tv_sec * 1000000000ULL + (uint64_t)now.tv_nsec;
}

static int fail(char *error, size_t error_size, const char *what) {
    snprintf(error, error_size, "%s: %s", what, strerror(errno));
    return VGPU_REGION_ERROR;
}

struct vgpu_arbiter *vgpu_arbiter_new(int listener, uint64_t instance, char *error,
                                      size_t error_size) {
    struct vgpu_arbiter *arbiter = calloc(1, sizeof *arbiter);
    if (arbiter == NULL) {
        fail(error, error_size, "lease arbiter");
        return NULL;
    }
    arbiter->listener = fcntl(listener, F_DUPFD_CLOEXEC, 3);
    if (arbiter->listener < 0 || pipe2(arbiter->wake, O_CLOEXEC | O_NONBLOCK) != 0) {
        fail(error, error_size, "lease arbiter");
        if (arbiter->listener >= 0) {
            close(arbiter->listener);
        }
        free(arbiter);
        return NULL;
    }
    fcntl(arbiter->listener, F_SETFL, fcntl(arbiter->listener, F_GETFL) | O_NONBLOCK);
    arbiter->instance = instance;
    for (int index = 0; index < MAX_CLIENTS; index++) {
        arbiter->clients[index].fd = -1;
    }
    return arbiter;
}

int vgpu_arbiter_add_gpu(struct vgpu_arbiter *arbiter, const char *uuid, int lease_fd,
                         char *error, size_t error_size) {
    if (arbiter->started || arbiter->gpu_count == MAX_GPUS ||
        strlen(uuid) >= VGPU_REGION_UUID_SIZE) {
        snprintf(error, error_size, "lease arbiter: cannot add GPU %.60s", uuid);
        return VGPU_REGION_ERROR;
    }
    void *words = mmap(NULL, sizeof(struct vgpu_device_lease), PROT_READ | PROT_WRITE,
                       MAP_SHARED, lease_fd, 0);
    if (words == MAP_FAILED) {
        return fail(error, error_size, "mapping the daemon's lease");
    }
    struct gpu *gpu = &arbiter->gpus[arbiter->gpu_count++];
    snprintf(gpu->uuid, sizeof gpu->uuid, "%s", uuid);
    gpu->words = words;
    gpu->holder = -1;
    return 0;
}

/* The pid namespace of `pid` (its inode), 0 when it cannot be read (then the user alone is the
 * party). */
static uint64_t namespace_of(pid_t pid) {
    char path[64];
    char link[64];
    snprintf(path, sizeof path, "/proc/%d/ns/pid", (int)pid);
    ssize_t length = readlink(path, link, sizeof link - 1);
    if (length <= 0) {
        return 0;
    }
    link[length] = '\0';
    const char *open = strchr(link, '[');
    return open != NULL ? strtoull(open + 1, NULL, 10) : 0;
}

static int party_of(struct vgpu_arbiter *arbiter, uint32_t uid, uint64_t inode, uint64_t now) {
    int free_slot = -1;
    for (int index = 0; index < MAX_CLIENTS; index++) {
        struct party *party = &arbiter->parties[index];
        bool used = party->clients > 0 || party->penalty_until_ns > now;
        if (used && party->uid == uid && party->namespace_inode == inode) {
            return index;
        }
        if (!used && free_slot < 0) {
            free_slot = index;
        }
    }
    if (free_slot >= 0) {
        arbiter->parties[free_slot] = (struct party){.uid = uid, .namespace_inode = inode};
    }
    return free_slot;
}

static void accept_clients(struct vgpu_arbiter *arbiter, uint64_t now) {
    for (;;) {
        int fd = accept4(arbiter->listener, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            return; /* EAGAIN, or out of descriptors: the next poll tries again */
        }
        struct ucred peer;
        socklen_t length = sizeof peer;
        int slot = -1;
        for (int index = 0; index < MAX_CLIENTS && slot < 0; index++) {
            slot = arbiter->clients[index].fd < 0 ? index : -1;
        }
        int party = -1;
        if (slot >= 0 && getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &peer, &length) == 0) {
            party = party_of(arbiter, peer.uid, namespace_of(peer.pid), now);
        }
        if (party < 0 || arbiter->parties[party].clients >= MAX_PER_PARTY) {
            close(fd);
            atomic_fetch_add(&arbiter->refused, 1);
            continue;
        }
        arbiter->parties[party].clients++;
        arbiter->clients[slot] = (struct client){.fd = fd, .gpu = -1, .party = party};
        atomic_fetch_add(&arbiter->connected, 1);
    }
}

static void end_hold(struct vgpu_arbiter *arbiter, struct gpu *gpu, uint64_t now) {
    struct client *holder = &arbiter->clients[gpu->holder];
    atomic_store(&holder->seat->granted, 0);
    atomic_store(&gpu->words->activity_ns, now);
    atomic_store(&gpu->words->owner, 0);
    gpu->holder = -1;
}

static void drop(struct vgpu_arbiter *arbiter, int index, uint64_t now) {
    struct client *client = &arbiter->clients[index];
    if (client->gpu >= 0 && arbiter->gpus[client->gpu].holder == index) {
        end_hold(arbiter, &arbiter->gpus[client->gpu], now);
    }
    if (client->seat != NULL) {
        munmap(client->seat, sizeof *client->seat);
    }
    close(client->fd);
    arbiter->parties[client->party].clients--;
    *client = (struct client){.fd = -1, .gpu = -1};
    atomic_fetch_sub(&arbiter->connected, 1);
}

static bool send_message(int fd, uint32_t kind, uint64_t request, int attached) {
    struct vgpu_arbiter_message message = {
        .magic = VGPU_ARBITER_MAGIC, .kind = kind, .request = request};
    struct iovec part = {&message, sizeof message};
    union {
        char buffer[CMSG_SPACE(sizeof(int))];
        struct cmsghdr align;
    } control;
    struct msghdr header = {.msg_iov = &part, .msg_iovlen = 1};
    if (attached >= 0) {
        memset(&control, 0, sizeof control);
        header.msg_control = control.buffer;
        header.msg_controllen = sizeof control.buffer;
        struct cmsghdr *rights = CMSG_FIRSTHDR(&header);
        rights->cmsg_level = SOL_SOCKET;
        rights->cmsg_type = SCM_RIGHTS;
        rights->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(rights), &attached, sizeof(int));
    }
    return sendmsg(fd, &header, MSG_DONTWAIT | MSG_NOSIGNAL) == (ssize_t)sizeof message;
}

/* A seat for a client of `gpu`: a memfd sealed so that neither side can shrink it under the
 * other's mapping; handed over with WELCOME. */
static bool seat(struct vgpu_arbiter *arbiter, struct client *client) {
    int fd = (int)syscall(SYS_memfd_create, "vgpu-lease-seat", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0) {
        return false;
    }
    bool ready = ftruncate(fd, sizeof(struct vgpu_lease_seat)) == 0 &&
                 fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) == 0;
    void *mapped = ready ? mmap(NULL, sizeof(struct vgpu_lease_seat), PROT_READ | PROT_WRITE,
                                MAP_SHARED, fd, 0)
                         : MAP_FAILED;
    if (mapped != MAP_FAILED) {
        client->seat = mapped;
        client->seat->magic = VGPU_SEAT_MAGIC;
        ready = send_message(client->fd, VGPU_ARBITER_WELCOME, arbiter->instance, fd);
    }
    close(fd);
    return mapped != MAP_FAILED && ready;
}

static int gpu_named(struct vgpu_arbiter *arbiter, const char *uuid) {
    for (int index = 0; index < arbiter->gpu_count; index++) {
        if (strcasecmp(arbiter->gpus[index].uuid, uuid) == 0) {
            return index;
        }
    }
    return -1;
}

/* The GPU time a client says an epoch took: no more than the time since the lease was last
 * taken (it only feeds an upper bound of the daemon's boost estimate). */
static uint64_t bounded_busy(uint64_t said) {
    return said < VGPU_LEASE_HOLD_NS * 10 ? said : VGPU_LEASE_HOLD_NS * 10;
}

/* One message of client `index`; false when it breaks the protocol (the client is dropped). */
static bool handle(struct vgpu_arbiter *arbiter, int index,
                   const struct vgpu_arbiter_message *message, uint64_t now) {
    struct client *client = &arbiter->clients[index];
    if (message->magic != VGPU_ARBITER_MAGIC) {
        return false;
    }
    if (message->kind == VGPU_ARBITER_HELLO) {
        char uuid[VGPU_REGION_UUID_SIZE];
        memcpy(uuid, message->uuid, sizeof uuid);
        uuid[sizeof uuid - 1] = '\0';
        client->gpu = client->gpu < 0 ? gpu_named(arbiter, uuid) : -1;
        client->pod = message->value;
        return client->gpu >= 0 && seat(arbiter, client);
    }
    if (client->gpu < 0 || message->request == 0) {
        return false;
    }
    struct gpu *gpu = &arbiter->gpus[client->gpu];
    if (message->kind == VGPU_ARBITER_ACQUIRE) {
        if (gpu->holder == index) { /* it gave up waiting meanwhile: the lease is still its */
            client->request = message->request;
            atomic_store(&client->seat->granted, message->request);
            return send_message(client->fd, VGPU_ARBITER_GRANT, message->request, -1);
        }
        client->waiting = true;
        client->request = message->request;
        client->ticket = ++arbiter->tickets;
        return true;
    }
    if (message->kind == VGPU_ARBITER_RELEASE) {
        atomic_fetch_add(&gpu->words->busy_ns, bounded_busy(message->value));
        if (message->request == client->request) {
            client->waiting = false;
            if (gpu->holder == index) {
                end_hold(arbiter, gpu, now);
            }
        }
        return true;
    }
    return false;
}

static void receive(struct vgpu_arbiter *arbiter, int index, uint64_t now) {
    for (;;) {
        struct vgpu_arbiter_message message;
        ssize_t got = recv(arbiter->clients[index].fd, &message, sizeof message, MSG_DONTWAIT);
        if (got < 0 && (errno == EAGAIN || errno == EINTR)) {
            return;
        }
        if (got != (ssize_t)sizeof message || !handle(arbiter, index, &message, now)) {
            if (got != 0) { /* 0: it closed, as every process does at its end */
                atomic_fetch_add(&arbiter->refused, 1);
            }
            drop(arbiter, index, now);
            return;
        }
    }
}

/* Whether the holder's own words say it stopped launching or left the GPU idle. The clock is
 * read after its words: a time it wrote just now is then never in the future. */
static bool holder_done(const struct gpu *gpu, const struct vgpu_lease_seat *seat) {
    uint64_t activity = atomic_load(&seat->activity_ns);
    uint64_t drains = atomic_load(&seat->drains_ns);
    uint64_t now = monotonic_ns();
    if (activity > now) {
        return true; /* no clock of this node writes the future */
    }
    uint64_t since = activity > gpu->held_since_ns ? activity : gpu->held_since_ns;
    bool drained = drains != 0 && drains >= activity && now > drains &&
                   now - drains > VGPU_LEASE_DRAINED_NS && now - drains < VGPU_LEASE_HOLD_NS;
    return now - since > VGPU_LEASE_STALE_NS || drained;
}

static void penalize(struct party *party, uint64_t now) {
    bool again = now < party->penalty_until_ns + party->penalty_ns;
    party->penalty_ns = !again ? PENALTY_NS
                        : party->penalty_ns * 2 > PENALTY_MAX_NS ? PENALTY_MAX_NS
                                                                 : party->penalty_ns * 2;
    party->penalty_until_ns = now + party->penalty_ns;
}

/* The next waiter of `gpu`: parties in turn (the one served longest ago first), a party that
 * overran the hold only when no other waits, first come first served within a party. */
static int next_waiter(struct vgpu_arbiter *arbiter, int gpu, uint64_t now) {
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
        if (penalized != best_penalized ? !penalized
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

/* What each client of `gpu` may know of the others: who waits, and whether another pod holds.
 * The number waiting. */
static uint64_t tell_clients(struct vgpu_arbiter *arbiter, int gpu_index) {
    const struct gpu *gpu = &arbiter->gpus[gpu_index];
    uint64_t waiting = 0;
    for (int index = 0; index < MAX_CLIENTS; index++) {
        const struct client *client = &arbiter->clients[index];
        if (client->fd >= 0 && client->gpu == gpu_index && client->waiting) {
            arbiter->pods[waiting++] = client->pod;
        }
    }
    qsort(arbiter->pods, waiting, sizeof arbiter->pods[0], by_pod);
    const struct client *holder = gpu->holder >= 0 ? &arbiter->clients[gpu->holder] : NULL;
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
    }
    return waiting;
}

/* Take the lease back from a holder that is done or overran while others wait, grant it to the
 * next waiter; the time by which this GPU must be looked at again. */
static uint64_t settle(struct vgpu_arbiter *arbiter, int gpu_index, uint64_t now) {
    struct gpu *gpu = &arbiter->gpus[gpu_index];
    int next = next_waiter(arbiter, gpu_index, now);
    if (gpu->holder >= 0 && next >= 0) {
        struct client *holder = &arbiter->clients[gpu->holder];
        /* A party served last for a while gives way to any other that waits, at once. */
        bool yields = arbiter->parties[holder->party].penalty_until_ns > now &&
                      arbiter->parties[arbiter->clients[next].party].penalty_until_ns <= now;
        bool done = holder_done(gpu, holder->seat);
        bool overran = now - gpu->held_since_ns > VGPU_LEASE_HOLD_NS;
        if (done || overran || yields) {
            if (overran && !done) {
                penalize(&arbiter->parties[holder->party], now);
                atomic_fetch_add(&arbiter->overruns, 1);
            }
            atomic_fetch_add(&holder->seat->taken_back, 1);
            atomic_fetch_add(&gpu->words->takeovers, 1);
            atomic_fetch_add(&arbiter->taken_back, 1);
            end_hold(arbiter, gpu, now);
        }
    }
    while (gpu->holder < 0 && next >= 0) {
        struct client *client = &arbiter->clients[next];
        client->waiting = false;
        gpu->holder = next;
        gpu->held_since_ns = now;
        arbiter->parties[client->party].last_grant = atomic_fetch_add(&arbiter->grants, 1) + 1;
        atomic_store(&client->seat->granted, client->request);
        atomic_store(&gpu->words->owner, (uint64_t)next + 1);
        atomic_store(&gpu->words->activity_ns, now);
        atomic_fetch_add(&gpu->words->epochs, 1);
        if (!send_message(client->fd, VGPU_ARBITER_GRANT, client->request, -1)) {
            drop(arbiter, next, now); /* gone, or not reading its socket */
            next = next_waiter(arbiter, gpu_index, now);
        }
    }
    uint64_t waiting = tell_clients(arbiter, gpu_index);
    atomic_store(&gpu->words->waiters, waiting);
    if (waiting > 0) {
        atomic_store(&gpu->words->waiting_ns, now);
    }
    if (gpu->holder < 0 || waiting == 0) {
        return now + HOUSEKEEPING_NS;
    }
    /* Look again when the holder may be stale, idle or overrunning. */
    const struct vgpu_lease_seat *seat = arbiter->clients[gpu->holder].seat;
    uint64_t activity = atomic_load(&seat->activity_ns);
    uint64_t drains = atomic_load(&seat->drains_ns);
    uint64_t since = activity > gpu->held_since_ns && activity <= now ? activity
                                                                        : gpu->held_since_ns;
    uint64_t at = gpu->held_since_ns + VGPU_LEASE_HOLD_NS;
    at = since + VGPU_LEASE_STALE_NS < at ? since + VGPU_LEASE_STALE_NS : at;
    uint64_t idle = drains + VGPU_LEASE_DRAINED_NS + 1;
    if (drains != 0 && drains >= activity && idle > now && idle < at) {
        at = idle;
    }
    return at > now + MIN_WAIT_NS ? at : now + MIN_WAIT_NS;
}

static void *serve(void *argument) {
    struct vgpu_arbiter *arbiter = argument;
    uint64_t next_ns = monotonic_ns();
    while (!atomic_load(&arbiter->stopping)) {
        uint64_t now = monotonic_ns();
        uint64_t wait = next_ns > now ? next_ns - now : 0;
        struct timespec timeout = {(time_t)(wait / 1000000000ULL), (long)(wait % 1000000000ULL)};
        arbiter->polled[0] = (struct pollfd){.fd = arbiter->wake[0], .events = POLLIN};
        arbiter->polled[1] = (struct pollfd){.fd = arbiter->listener, .events = POLLIN};
        nfds_t count = 2;
        for (int index = 0; index < MAX_CLIENTS; index++) {
            if (arbiter->clients[index].fd >= 0) {
                arbiter->polled_client[count] = index;
                arbiter->polled[count++] =
                    (struct pollfd){.fd = arbiter->clients[index].fd, .events = POLLIN};
            }
        }
        if (ppoll(arbiter->polled, count, &timeout, NULL) < 0 && errno != EINTR) {
            struct timespec pause = {0, 1000000}; /* ENOMEM: never spin */
            nanosleep(&pause, NULL);
        }
        now = monotonic_ns();
        for (nfds_t slot = 2; slot < count; slot++) {
            int index = arbiter->polled_client[slot];
            /* The descriptor is still this client's: drops happen only here, after its turn. */
            if (arbiter->polled[slot].revents != 0 &&
                arbiter->clients[index].fd == arbiter->polled[slot].fd) {
                receive(arbiter, index, now);
            }
        }
        if ((arbiter->polled[1].revents & POLLIN) != 0) {
            accept_clients(arbiter, now);
        }
        next_ns = now + HOUSEKEEPING_NS;
        for (int gpu = 0; gpu < arbiter->gpu_count; gpu++) {
            uint64_t at = settle(arbiter, gpu, now);
            next_ns = at < next_ns ? at : next_ns;
        }
    }
    return NULL;
}

int vgpu_arbiter_start(struct vgpu_arbiter *arbiter, char *error, size_t error_size) {
    /* The thread takes no signal: they stay the daemon's main thread's. */
    sigset_t all;
    sigset_t previous;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &previous);
    int result = pthread_create(&arbiter->thread, NULL, serve, arbiter);
    pthread_sigmask(SIG_SETMASK, &previous, NULL);
    if (result != 0) {
        errno = result;
        return fail(error, error_size, "starting the lease arbiter");
    }
    arbiter->started = true;
    return 0;
}

void vgpu_arbiter_stop(struct vgpu_arbiter *arbiter) {
    if (arbiter == NULL) {
        return;
    }
    atomic_store(&arbiter->stopping, true);
    if (arbiter->started) {
        ssize_t wrote = write(arbiter->wake[1], "x", 1);
        (void)wrote; /* a full pipe already wakes it */
        pthread_join(arbiter->thread, NULL);
    }
    uint64_t now = monotonic_ns();
    for (int index = 0; index < MAX_CLIENTS; index++) {
        if (arbiter->clients[index].fd >= 0) {
            drop(arbiter, index, now);
        }
    }
    for (int gpu = 0; gpu < arbiter->gpu_count; gpu++) {
        munmap(arbiter->gpus[gpu].words, sizeof(struct vgpu_device_lease));
    }
    close(arbiter->listener);
    close(arbiter->wake[0]);
    close(arbiter->wake[1]);
    free(arbiter);
}

void vgpu_arbiter_read_stats(struct vgpu_arbiter *arbiter, struct vgpu_arbiter_stats *stats) {
    stats->clients = atomic_load(&arbiter->connected);
    stats->refused = atomic_load(&arbiter->refused);
    stats->grants = atomic_load(&arbiter->grants);
    stats->taken_back = atomic_load(&arbiter->taken_back);
    stats->overruns = atomic_load(&arbiter->overruns);
}
