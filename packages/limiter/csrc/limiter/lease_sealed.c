/* Asking the node daemon for a GPU's sealed lease (vgpu_region.h, VGPU_LEASE_SOCKET). The socket
 * is reached through the checked node folder (root's or its owner's, writable by its owner alone)
 * and its peer must be that owner, so no tenant can hand this process a lease of its making; the
 * lease must carry the shrink seal, so no tenant can truncate it under this process's mapping. */
#define _GNU_SOURCE
#include "lease_sealed.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "lease_file.h"
#include "vgpu_files.h"
#include "vgpu_region.h"

/* Older C libraries' headers lack the seals (Linux 3.17). */
#ifndef F_GET_SEALS
#define F_GET_SEALS 1034
#endif
#ifndef F_SEAL_SHRINK
#define F_SEAL_SHRINK 0x0002
#endif

#define MAX_LEASES 64         /* GPUs in one answer; more are refused as a malformed answer */
#define TEXT_SIZE 8192        /* room for MAX_LEASES lines */
#define BACKLOG_TRIES 20      /* a listener's queue momentarily full: tried again each ms */
#define ANSWER_TIMEOUT_S 1    /* the daemon answers at once; a stuck one costs this, once */

static bool say(char *why, size_t why_size, const char *format, const char *detail) {
    snprintf(why, why_size, format, detail);
    return false;
}

/* Connected to the daemon's socket in the checked `folder`, never blocking for long; -1 with
 * `why` (and `absent` when there is no daemon to ask). */
static int connect_daemon(int folder, uid_t owner, bool *absent, char *why, size_t why_size) {
    struct stat info;
    if (vgpu_stat_at(folder, VGPU_LEASE_SOCKET, &info) != 0) {
        *absent = errno == ENOENT;
        say(why, why_size, VGPU_LEASE_SOCKET ": %s", strerror(errno));
        return -1;
    }
    if (!S_ISSOCK(info.st_mode) || (info.st_uid != 0 && info.st_uid != owner)) {
        say(why, why_size, VGPU_LEASE_SOCKET ": %s", "not the daemon's socket");
        return -1;
    }
    struct sockaddr_un address = {.sun_family = AF_UNIX};
    /* Through the folder already checked: no path of any length, no folder swapped meanwhile. */
    snprintf(address.sun_path, sizeof address.sun_path, "/proc/self/fd/%d/" VGPU_LEASE_SOCKET,
             folder);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
        say(why, why_size, "socket: %s", strerror(errno));
        return -1;
    }
    int result = -1;
    for (int attempt = 0; attempt < BACKLOG_TRIES; attempt++) {
        result = connect(fd, (struct sockaddr *)&address, sizeof address);
        if (result == 0 || errno != EAGAIN) {
            break;
        }
        struct timespec pause = {0, 1000000};
        nanosleep(&pause, NULL);
    }
    struct ucred peer;
    socklen_t length = sizeof peer;
    if (result != 0) {
        *absent = errno == ECONNREFUSED || errno == ENOENT;
        say(why, why_size, VGPU_LEASE_SOCKET ": %s", strerror(errno));
    } else if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &peer, &length) != 0 ||
               (peer.uid != 0 && peer.uid != owner)) {
        say(why, why_size, VGPU_LEASE_SOCKET ": %s", "answered by a process not the daemon's");
    } else {
        return fd; /* non-blocking: receive() waits with poll, under one deadline */
    }
    close(fd);
    return -1;
}

/* The daemon's whole answer: its text (NUL-ended) and the descriptors that came with it. */
struct answer {
    char text[TEXT_SIZE];
    int fds[MAX_LEASES];
    int count;
};

/* Wait until the socket has something to read or `deadline` (CLOCK_MONOTONIC, ns) passes; a
 * signal does not end the wait early. */
static bool readable_by(int socket_fd, uint64_t deadline) {
    for (;;) {
        struct timespec now;
        clock_gettime(CLOCK_MONOTONIC, &now);
        uint64_t at = (uint64_t)now.tv_sec * 1000000000ULL + (uint64_t)now.tv_nsec;
        if (at >= deadline) {
            errno = EAGAIN;
            return false;
        }
        struct pollfd wanted = {.fd = socket_fd, .events = POLLIN};
        int ready = poll(&wanted, 1, (int)((deadline - at) / 1000000ULL) + 1);
        if (ready > 0) {
            return true;
        }
        if (ready < 0 && errno != EINTR) {
            return false;
        }
    }
}

static bool receive(int socket_fd, struct answer *answer, char *why, size_t why_size) {
    /* One deadline for the whole answer: a peer that trickles bytes cannot hold this thread. */
    struct timespec start;
    clock_gettime(CLOCK_MONOTONIC, &start);
    uint64_t deadline = (uint64_t)start.tv_sec * 1000000000ULL + (uint64_t)start.tv_nsec +
                        ANSWER_TIMEOUT_S * 1000000000ULL;
    union {
        char buffer[CMSG_SPACE(sizeof(int) * MAX_LEASES)];
        struct cmsghdr align;
    } control;
    struct iovec part = {answer->text, TEXT_SIZE - 1};
    struct msghdr message = {.msg_iov = &part,
                             .msg_iovlen = 1,
                             .msg_control = control.buffer,
                             .msg_controllen = sizeof control.buffer};
    ssize_t got = -1;
    do {
        got = readable_by(socket_fd, deadline) ? recvmsg(socket_fd, &message, MSG_CMSG_CLOEXEC)
                                               : -1;
    } while (got < 0 && errno == EINTR);
    answer->count = 0;
    for (struct cmsghdr *header = CMSG_FIRSTHDR(&message); got > 0 && header != NULL;
         header = CMSG_NXTHDR(&message, header)) {
        if (header->cmsg_level == SOL_SOCKET && header->cmsg_type == SCM_RIGHTS) {
            int count = (int)((header->cmsg_len - CMSG_LEN(0)) / sizeof(int));
            for (int index = 0; index < count && answer->count < MAX_LEASES; index++) {
                memcpy(&answer->fds[answer->count++], CMSG_DATA(header) + index * sizeof(int),
                       sizeof(int));
            }
        }
    }
    size_t length = got > 0 ? (size_t)got : 0;
    /* A stream: the rest of the text may come in later reads, until the daemon closes. */
    while (got > 0 && length < TEXT_SIZE - 1) {
        got = readable_by(socket_fd, deadline)
                  ? read(socket_fd, answer->text + length, TEXT_SIZE - 1 - length)
                  : -1;
        if (got < 0 && errno == EINTR) {
            got = 1; /* interrupted before anything was read: wait again */
            continue;
        }
        length += got > 0 ? (size_t)got : 0;
    }
    answer->text[length] = '\0';
    if (got < 0) {
        return say(why, why_size, VGPU_LEASE_SOCKET ": %s",
                   errno == EAGAIN ? "no answer in time" : strerror(errno));
    }
    if ((message.msg_flags & MSG_CTRUNC) != 0 ||
        strncmp(answer->text, VGPU_LEASE_GREETING, strlen(VGPU_LEASE_GREETING)) != 0) {
        return say(why, why_size, VGPU_LEASE_SOCKET ": %s", "not an answer of this version");
    }
    return true;
}

/* The descriptor and instance of `uuid` in the answer (its line's place), or -1. */
static int find(const struct answer *answer, const char *uuid, uint64_t *instance) {
    const char *line = answer->text + strlen(VGPU_LEASE_GREETING);
    size_t uuid_length = strlen(uuid);
    for (int index = 0; index < answer->count && *line != '\0'; index++) {
        const char *end = strchr(line, '\n');
        if (end == NULL) {
            return -1;
        }
        if (strncasecmp(line, uuid, uuid_length) == 0 && line[uuid_length] == ' ') {
            *instance = strtoull(line + uuid_length + 1, NULL, 10);
            return *instance != 0 ? index : -1;
        }
        line = end + 1;
    }
    return -1;
}

static struct vgpu_device_lease *map_sealed(int fd, char *why, size_t why_size) {
    struct stat info;
    int seals = fcntl(fd, F_GET_SEALS);
    if (vgpu_stat_at(fd, "", &info) != 0 || !S_ISREG(info.st_mode) ||
        info.st_size < (off_t)sizeof(struct vgpu_device_lease)) {
        say(why, why_size, "%s", "the daemon's lease is not the size of a lease");
        return NULL;
    }
    if (seals < 0 || (seals & F_SEAL_SHRINK) == 0) {
        say(why, why_size, "%s", "the daemon's lease is not sealed against shrinking");
        return NULL;
    }
    void *lease = mmap(NULL, sizeof(struct vgpu_device_lease), PROT_READ | PROT_WRITE,
                       MAP_SHARED, fd, 0);
    if (lease == MAP_FAILED) {
        say(why, why_size, "mapping the daemon's lease: %s", strerror(errno));
        return NULL;
    }
    return lease;
}

struct vgpu_device_lease *vgpu_lease_sealed(const char *node_folder, const char *uuid,
                                            uint64_t *instance, bool *absent, char *why,
                                            size_t why_size) {
    *absent = false;
    uid_t owner;
    char reason[512];
    int folder = vgpu_lease_folder(node_folder, VGPU_FOLDER_NODE, &owner, reason, sizeof reason);
    if (folder < 0) {
        *absent = errno == ENOENT || errno == EACCES;
        snprintf(why, why_size, "%s", reason);
        return NULL;
    }
    int socket_fd = connect_daemon(folder, owner, absent, reason, sizeof reason);
    close(folder);
    struct answer *answer = socket_fd < 0 ? NULL : calloc(1, sizeof *answer);
    struct vgpu_device_lease *lease = NULL;
    if (answer != NULL && receive(socket_fd, answer, reason, sizeof reason)) {
        int index = find(answer, uuid, instance);
        if (index < 0) {
            snprintf(reason, sizeof reason, "the daemon hands out no lease for %s", uuid);
        } else {
            lease = map_sealed(answer->fds[index], reason, sizeof reason);
        }
    } else if (socket_fd >= 0 && answer == NULL) {
        snprintf(reason, sizeof reason, "%s", strerror(ENOMEM));
    }
    for (int index = 0; answer != NULL && index < answer->count; index++) {
        close(answer->fds[index]);
    }
    free(answer);
    if (socket_fd >= 0) {
        close(socket_fd);
    }
    if (lease == NULL) {
        snprintf(why, why_size, "%.4000s/%s", node_folder, reason);
    }
    return lease;
}
