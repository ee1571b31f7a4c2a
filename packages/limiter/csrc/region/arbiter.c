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

#include "arbiter_internal.h"
#include "arbiter_peer.h"
#include "vgpu_proc.h"

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
    arbiter->clock = monotonic_ns;
    for (int index = 0; index < MAX_CLIENTS; index++) {
        arbiter->clients[index].fd = -1;
    }
    return arbiter;
}

int vgpu_arbiter_add_gpu(struct vgpu_arbiter *arbiter, const char *uuid, int lease_fd,
                         uint64_t device, char *error, size_t error_size) {
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
    gpu->device = device;
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

static bool told_lately(const struct party *party, uint64_t now) {
    for (size_t i = 0; i < sizeof party->newcomer_ns / sizeof party->newcomer_ns[0]; i++) {
        if (party->newcomer_ns[i] != 0 && now - party->newcomer_ns[i] < NEWCOMER_WINDOW_NS) {
            return true;
        }
    }
    return false;
}

static int party_of(struct vgpu_arbiter *arbiter, uint32_t uid, uint64_t inode, uint64_t now) {
    int free_slot = -1;
    int paused_slot = -1; /* kept only for a refusal's pause: taken when none is free */
    for (int index = 0; index < MAX_CLIENTS; index++) {
        struct party *party = &arbiter->parties[index];
        bool held = party->clients > 0 || party->penalty_until_ns > now;
        /* Also kept while it told the others of a pod that woke lately: a process that
         * connected anew each time would otherwise get a fresh slot, and its bound with it. */
        bool used = held || party->stranger_until_ns > now || told_lately(party, now);
        if (used && party->uid == uid && party->namespace_inode == inode) {
            return index;
        }
        if (!used && free_slot < 0) {
            free_slot = index;
        }
        if (used && !held && paused_slot < 0) {
            paused_slot = index;
        }
    }
    /* A user that makes pid namespaces of its own, each saying one HELLO for a GPU it does not
     * hold, would otherwise fill the table with paused parties of no connection, and every
     * process that connected next was refused. */
    free_slot = free_slot >= 0 ? free_slot : paused_slot;
    if (free_slot >= 0) {
        arbiter->parties[free_slot] = (struct party){.uid = uid, .namespace_inode = inode};
    }
    return free_slot;
}

/* The connections of a user's parties, all of them. */
static int clients_of_user(const struct vgpu_arbiter *arbiter, uint32_t uid) {
    int clients = 0;
    for (int index = 0; index < MAX_CLIENTS; index++) {
        const struct party *party = &arbiter->parties[index];
        clients += party->uid == uid ? party->clients : 0;
    }
    return clients;
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
        if (slot >= 0 && getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &peer, &length) == 0 &&
            clients_of_user(arbiter, peer.uid) < MAX_PER_USER) {
            party = party_of(arbiter, peer.uid, namespace_of(peer.pid), now);
        }
        if (party < 0 || arbiter->parties[party].clients >= MAX_PER_PARTY) {
            close(fd);
            atomic_fetch_add(&arbiter->refused, 1);
            continue;
        }
        arbiter->parties[party].clients++;
        arbiter->clients[slot] =
            (struct client){.fd = fd, .gpu = -1, .party = party, .pid = peer.pid,
                            .started = vgpu_process_start_time(peer.pid), .connected_ns = now};
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

/* A party refused a GPU's lease is refused again without a look for this long: a look reads up
 * to DESCRIPTORS_LOOKED_AT descriptors of the process (milliseconds for a process of many), and
 * a tenant saying HELLO in a loop would otherwise keep the thread that hands every lease over
 * busy reading them. A process refused asks again every second (lease.c). */
#define STRANGER_PAUSE_NS 1000000000ULL

/* Whether `client` may be served the lease of GPU `gpu`, whose device it must hold open. */
static bool served(struct vgpu_arbiter *arbiter, struct client *client, int gpu, uint64_t now) {
    struct party *party = &arbiter->parties[client->party];
    if (party->stranger_until_ns > now) {
        return false;
    }
    /* The pid is the one that connected up to HELLO_WITHIN_NS before, and it may have passed the
     * socket on and exited: its descriptors are read only while that same process holds the
     * pid, before the look and after it, not those of a process the pid was given to since. */
    if (client->started != 0 && vgpu_process_alive(client->pid, client->started) &&
        vgpu_peer_holds_device(client->pid, arbiter->gpus[gpu].device) &&
        vgpu_process_alive(client->pid, client->started)) {
        return true;
    }
    party->stranger_until_ns = now + STRANGER_PAUSE_NS;
    return false;
}

/* Client `index` asks for its GPU's lease: where no process of its pod asked for or held it in
 * the last VGPU_NEWCOMER_IDLE_NS (a pod that woke), the processes of the other pods on the GPU
 * are told when (their seats' newcomer_ns). A bursting pod there then runs at its hard limit
 * until the daemon's next pass counts the newcomer in: before, it kept the burst rate of a pass
 * that had not counted it, and a 70 % pod that woke beside a pod at 30 (burst 100) got about
 * 25 % until that pass, up to a second. The daemon makes a pass soon after (it reads the count
 * of newcomers). Told at most four times in NEWCOMER_WINDOW_NS per party: the pod is the
 * process's word, and a burst is only ever what the others leave. */
static void note_newcomer(struct vgpu_arbiter *arbiter, int index, uint64_t now) {
    const struct client *asking = &arbiter->clients[index];
    struct party *party = &arbiter->parties[asking->party];
    const struct gpu *gpu = &arbiter->gpus[asking->gpu];
    uint64_t *oldest = &party->newcomer_ns[0];
    for (size_t i = 1; i < sizeof party->newcomer_ns / sizeof *oldest; i++) {
        oldest = party->newcomer_ns[i] < *oldest ? &party->newcomer_ns[i] : oldest;
    }
    /* And at most eight times in that long on one GPU, whatever the parties (a user may make
     * pid namespaces of its own, each a party). */
    struct gpu *told = &arbiter->gpus[asking->gpu];
    uint64_t *gpu_oldest = &told->newcomer_ns[0];
    for (size_t i = 1; i < sizeof told->newcomer_ns / sizeof *gpu_oldest; i++) {
        gpu_oldest = told->newcomer_ns[i] < *gpu_oldest ? &told->newcomer_ns[i] : gpu_oldest;
    }
    if ((*oldest != 0 && now - *oldest < NEWCOMER_WINDOW_NS) ||
        (*gpu_oldest != 0 && now - *gpu_oldest < NEWCOMER_WINDOW_NS)) {
        return;
    }
    for (int other = 0; other < MAX_CLIENTS; other++) {
        const struct client *client = &arbiter->clients[other];
        if (client->gpu == asking->gpu && client->party == asking->party &&
            client->pod == asking->pod &&
            (gpu->holder == other ||
             (client->asked_ns != 0 && now - client->asked_ns < VGPU_NEWCOMER_IDLE_NS))) {
            return;
        }
    }
    *oldest = now;
    *gpu_oldest = now;
    for (int other = 0; other < MAX_CLIENTS; other++) {
        const struct client *client = &arbiter->clients[other];
        if (client->gpu == asking->gpu && client->pod != asking->pod && client->seat != NULL) {
            atomic_store(&client->seat->newcomer_ns, now);
        }
    }
    atomic_fetch_add(&arbiter->newcomers, 1); /* the daemon makes a pass soon */
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
        if (client->gpu >= 0) {
            /* A second HELLO is dropped with its GPU still named, so that drop() ends its hold:
             * it used to forget the GPU first, and the lease stayed with a freed slot whose seat
             * the next judgement read (the daemon died of SIGSEGV). */
            return false;
        }
        int gpu = gpu_named(arbiter, uuid);
        if (gpu >= 0 && arbiter->gpus[gpu].device != 0 && !served(arbiter, client, gpu, now)) {
            atomic_fetch_add(&arbiter->strangers, 1);
            send_message(client->fd, VGPU_ARBITER_STRANGER, 0, -1); /* said, then dropped */
            return false;
        }
        client->gpu = gpu;
        client->pod = message->value;
        return client->gpu >= 0 && seat(arbiter, client);
    }
    if (client->gpu < 0 || message->request == 0) {
        return false;
    }
    struct gpu *gpu = &arbiter->gpus[client->gpu];
    if (message->kind == VGPU_ARBITER_ACQUIRE) {
        if (gpu->holder == index) { /* it gave up waiting meanwhile: the lease is still its */
            client->asked_ns = now;
            client->request = message->request;
            atomic_store(&client->seat->granted, message->request);
            return send_message(client->fd, VGPU_ARBITER_GRANT, message->request, -1);
        }
        note_newcomer(arbiter, index, now);
        client->asked_ns = now;
        client->waiting = true;
        client->urgent = message->value == VGPU_ARBITER_URGENT &&
                         vgpu_arbiter_honour_urgent(&arbiter->parties[client->party], now);
        client->request = message->request;
        client->ticket = ++arbiter->tickets;
        return true;
    }
    if (message->kind == VGPU_ARBITER_RELEASE) {
        client->asked_ns = now; /* held till now, or waited: no newcomer at its next request */
        atomic_fetch_add(&gpu->words->busy_ns, bounded_busy(message->value));
        if (message->request == client->request) {
            client->waiting = false;
            client->urgent = false;
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

/* Take the lease back from a holder that is done or overran while others wait, grant it to the
 * next waiter; the time by which this GPU must be looked at again. */
static uint64_t settle(struct vgpu_arbiter *arbiter, int gpu_index, uint64_t now) {
    struct gpu *gpu = &arbiter->gpus[gpu_index];
    int next = vgpu_arbiter_next_waiter(arbiter, gpu_index, now);
    int partner = vgpu_arbiter_crossed(arbiter, gpu_index, now);
    enum vgpu_arbiter_verdict verdict = partner >= 0 ? VGPU_ARBITER_CROSSED
                                        : gpu->holder >= 0 && next >= 0
                                            ? vgpu_arbiter_judge(arbiter, gpu_index, next)
                                            : VGPU_ARBITER_KEEP;
    next = partner >= 0 ? partner : next;
    if (verdict != VGPU_ARBITER_KEEP) {
        struct client *holder = &arbiter->clients[gpu->holder];
        if (verdict == VGPU_ARBITER_OVERRAN) {
            vgpu_arbiter_penalize(&arbiter->parties[holder->party], now);
            atomic_fetch_add(&arbiter->overruns, 1);
        }
        atomic_fetch_add(&holder->seat->taken_back, 1);
        atomic_fetch_add(&gpu->words->takeovers, 1);
        atomic_fetch_add(&arbiter->taken_back, 1);
        end_hold(arbiter, gpu, now);
    }
    bool granting = gpu->holder < 0 && next >= 0;
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
            next = vgpu_arbiter_next_waiter(arbiter, gpu_index, now);
        }
    }
    if (granting) {
        /* An honoured urgency ends one epoch: the hand-over it asked for happened, whoever was
         * served (a waiter passed over asks again with its next request). */
        for (int index = 0; index < MAX_CLIENTS; index++) {
            if (arbiter->clients[index].gpu == gpu_index) {
                arbiter->clients[index].urgent = false;
            }
        }
    }
    uint64_t waiting = vgpu_arbiter_tell(arbiter, gpu_index);
    atomic_store(&gpu->words->waiters, waiting);
    if (waiting > 0) {
        atomic_store(&gpu->words->waiting_ns, now);
    }
    return gpu->holder < 0 || waiting == 0 ? now + HOUSEKEEPING_NS
                                           : vgpu_arbiter_deadline(arbiter, gpu_index, now);
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
        for (int index = 0; index < MAX_CLIENTS; index++) {
            struct client *client = &arbiter->clients[index];
            if (client->fd >= 0 && client->gpu < 0) { /* no HELLO yet */
                uint64_t due = client->connected_ns + HELLO_WITHIN_NS;
                if (now >= due) {
                    drop(arbiter, index, now);
                } else {
                    next_ns = due < next_ns ? due : next_ns;
                }
            }
        }
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
    stats->strangers = atomic_load(&arbiter->strangers);
    stats->grants = atomic_load(&arbiter->grants);
    stats->taken_back = atomic_load(&arbiter->taken_back);
    stats->overruns = atomic_load(&arbiter->overruns);
    stats->newcomers = atomic_load(&arbiter->newcomers);
}
