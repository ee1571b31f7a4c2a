/* Asking the node daemon's lease arbiter for a GPU's lease (vgpu_region.h, VGPU_LEASE_SOCKET).
 * The socket is reached through the checked node folder (root's or its owner's, writable by its
 * owner alone) and its peer must be that owner, so no tenant can pose as the arbiter; the seat
 * must carry the shrink seal, so no one can truncate it under this process's mapping. */
#define _GNU_SOURCE
#include "lease_seat.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "lease.h"
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

#define BACKLOG_TRIES 20      /* a listener's queue momentarily full: tried again each ms */
#define ANSWER_TIMEOUT_NS 1000000000ULL /* the daemon answers at once; a stuck one costs this */

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
    int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
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
        return fd; /* non-blocking: every wait is a poll under a deadline */
    }
    close(fd);
    return -1;
}

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

static bool send_message(int socket_fd, uint32_t kind, uint64_t request, uint64_t value,
                         const char *uuid) {
    struct vgpu_arbiter_message message = {.magic = VGPU_ARBITER_MAGIC,
                                           .kind = kind,
                                           .request = request,
                                           .value = value};
    if (uuid != NULL) {
        snprintf(message.uuid, sizeof message.uuid, "%s", uuid);
    }
    ssize_t sent;
    do { /* a datagram this small goes at once or not at all */
        sent = send(socket_fd, &message, sizeof message, MSG_NOSIGNAL);
    } while (sent < 0 && errno == EINTR);
    return sent == (ssize_t)sizeof message;
}

/* The next message from the arbiter before `deadline` (with the descriptor that came with it in
 * `*attached`, else -1): 1, 0 when none came in time, -1 when the connection is broken. */
static int next_message(int socket_fd, struct vgpu_arbiter_message *message, int *attached,
                        uint64_t deadline) {
    union {
        char buffer[CMSG_SPACE(sizeof(int))];
        struct cmsghdr align;
    } control;
    for (;;) {
        struct iovec part = {message, sizeof *message};
        struct msghdr header = {.msg_iov = &part,
                                .msg_iovlen = 1,
                                .msg_control = control.buffer,
                                .msg_controllen = sizeof control.buffer};
        ssize_t got = recvmsg(socket_fd, &header, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
        if (got < 0 && errno == EINTR) {
            continue;
        }
        if (got < 0 && errno == EAGAIN) {
            if (!readable_by(socket_fd, deadline)) {
                return errno == EAGAIN ? 0 : -1;
            }
            continue;
        }
        int fd = -1;
        struct cmsghdr *rights = got > 0 ? CMSG_FIRSTHDR(&header) : NULL;
        if (rights != NULL && rights->cmsg_level == SOL_SOCKET &&
            rights->cmsg_type == SCM_RIGHTS && rights->cmsg_len == CMSG_LEN(sizeof(int))) {
            memcpy(&fd, CMSG_DATA(rights), sizeof fd);
        }
        if (attached != NULL) {
            *attached = fd;
        } else if (fd >= 0) {
            close(fd);
        }
        if (got != (ssize_t)sizeof *message || message->magic != VGPU_ARBITER_MAGIC) {
            return -1; /* closed, or not the arbiter of this version */
        }
        return 1;
    }
}

static struct vgpu_lease_seat *map_seat(int fd, char *why, size_t why_size) {
    struct stat info;
    int seals = fd < 0 ? -1 : fcntl(fd, F_GET_SEALS);
    if (fd < 0 || vgpu_stat_at(fd, "", &info) != 0 || !S_ISREG(info.st_mode) ||
        info.st_size < (off_t)sizeof(struct vgpu_lease_seat)) {
        say(why, why_size, "%s", "the daemon's seat is not the size of a seat");
        return NULL;
    }
    if (seals < 0 || (seals & F_SEAL_SHRINK) == 0) {
        say(why, why_size, "%s", "the daemon's seat is not sealed against shrinking");
        return NULL;
    }
    struct vgpu_lease_seat *seat = mmap(NULL, sizeof *seat, PROT_READ | PROT_WRITE, MAP_SHARED,
                                        fd, 0);
    if (seat == MAP_FAILED) {
        say(why, why_size, "mapping the daemon's seat: %s", strerror(errno));
        return NULL;
    }
    if (seat->magic != VGPU_SEAT_MAGIC) {
        munmap(seat, sizeof *seat);
        say(why, why_size, "%s", "the daemon's seat is not one of this version");
        return NULL;
    }
    return seat;
}

/* HELLO, then the WELCOME with the seat; the seat or NULL with `why`. */
static struct vgpu_lease_seat *take_seat(int socket_fd, const char *uuid, uint64_t pod,
                                         uint64_t *instance, char *why, size_t why_size) {
    if (!send_message(socket_fd, VGPU_ARBITER_HELLO, 0, pod, uuid)) {
        say(why, why_size, VGPU_LEASE_SOCKET ": %s", strerror(errno));
        return NULL;
    }
    struct vgpu_arbiter_message welcome;
    int fd = -1;
    int got = next_message(socket_fd, &welcome, &fd, vgpu_monotonic_ns() + ANSWER_TIMEOUT_NS);
    struct vgpu_lease_seat *seat = NULL;
    if (got == 0) {
        say(why, why_size, VGPU_LEASE_SOCKET ": %s", "no answer in time");
    } else if (got > 0 && welcome.kind == VGPU_ARBITER_STRANGER) {
        snprintf(why, why_size,
                 "the daemon serves the lease of %.60s only to processes that hold its device "
                 "file open, and found none held by this one (it reads /proc/PID/fd: a daemon "
                 "without the host's /proc or CAP_SYS_PTRACE cannot)",
                 uuid);
    } else if (got < 0 || welcome.kind != VGPU_ARBITER_WELCOME || welcome.request == 0) {
        snprintf(why, why_size, "the daemon arbitrates no lease for %.60s", uuid);
    } else {
        seat = map_seat(fd, why, why_size);
        *instance = welcome.request;
    }
    if (fd >= 0) {
        close(fd);
    }
    return seat;
}

int vgpu_seat_connect(const char *node_folder, const char *uuid, uint64_t pod,
                      struct vgpu_lease_seat **seat, uint64_t *instance, bool *absent, char *why,
                      size_t why_size) {
    *absent = false;
    uid_t owner;
    char reason[512];
    int folder = vgpu_lease_folder(node_folder, VGPU_FOLDER_NODE, &owner, reason, sizeof reason);
    if (folder < 0) {
        *absent = errno == ENOENT || errno == EACCES;
        snprintf(why, why_size, "%s", reason);
        return -1;
    }
    int socket_fd = connect_daemon(folder, owner, absent, reason, sizeof reason);
    close(folder);
    *seat = socket_fd >= 0 ? take_seat(socket_fd, uuid, pod, instance, reason, sizeof reason)
                           : NULL;
    if (*seat == NULL) {
        if (socket_fd >= 0) {
            close(socket_fd);
        }
        snprintf(why, why_size, "%.4000s/%s", node_folder, reason);
        return -1;
    }
    return socket_fd;
}

int vgpu_seat_acquire(int socket_fd, uint64_t request, bool urgent, uint64_t deadline_ns) {
    uint64_t value = urgent ? VGPU_ARBITER_URGENT : 0;
    if (!send_message(socket_fd, VGPU_ARBITER_ACQUIRE, request, value, NULL)) {
        return -1;
    }
    for (;;) {
        struct vgpu_arbiter_message answer;
        int got = next_message(socket_fd, &answer, NULL, deadline_ns);
        if (got <= 0) {
            if (got == 0 && !vgpu_seat_release(socket_fd, request, 0)) {
                return -1;
            }
            return got;
        }
        if (answer.kind == VGPU_ARBITER_GRANT && answer.request == request) {
            return 1;
        }
        /* A grant of a request given up earlier (withdrawn since): not this one. */
    }
}

bool vgpu_seat_release(int socket_fd, uint64_t request, uint64_t busy_ns) {
    return send_message(socket_fd, VGPU_ARBITER_RELEASE, request, busy_ns, NULL);
}
