/* Region files on disk: created complete and with their space allocated, opened without
 * trusting anything a tenant may have planted (a symbolic link, a FIFO, a hard link to another
 * pod's file, a file others can write). docs/security.md gives the rule these checks enforce. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "region.h"
#include "vgpu_files.h"

#define REGION_FILE "shm"

static bool fail(char *error, size_t error_size, const char *format, ...) {
    va_list arguments;
    va_start(arguments, format);
    vsnprintf(error, error_size, format, arguments);
    va_end(arguments);
    return false;
}

/* A folder opened as itself (never through a symbolic link in its last component) and checked
 * to be a directory that others cannot write; -1 with `error`. */
static int open_folder(const char *folder, struct stat *info, char *error, size_t error_size) {
    int fd = open(folder, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
        int saved = errno;
        fail(error, error_size, "%.300s: cannot open the pod folder: %s", folder,
             saved == ELOOP || saved == ENOTDIR ? "not a directory (a symbolic link?)"
                                                : strerror(saved));
        errno = saved;
        return -1;
    }
    if (vgpu_stat_at(fd, "", info) != 0 || !S_ISDIR(info->st_mode)) {
        fail(error, error_size, "%.300s: not a directory", folder);
        close(fd);
        return -1;
    }
    if (info->st_mode & S_IWOTH) {
        fail(error, error_size, "%.300s: the pod folder is writable by every user", folder);
        close(fd);
        return -1;
    }
    return fd;
}

/* Only root can have put a name in a folder that root owns and nobody else may write (root's
 * group aside): the daemon's pod folders, and the device plugin's allocation folders, where the
 * daemon links its pod's region once per container it bound to the pod. Another hard link is
 * refused anywhere else: there a tenant could have linked another pod's file in. */
static bool root_only(const struct stat *folder) {
    return folder->st_uid == 0 && !(folder->st_mode & S_IWOTH) &&
           (!(folder->st_mode & S_IWGRP) || folder->st_gid == 0);
}

bool vgpu_region_check(const struct vgpu_region *header, uint64_t file_size, char *problem,
                       size_t problem_size) {
    if (file_size < offsetof(struct vgpu_region, devices)) {
        return fail(problem, problem_size, "too small for a pod region (%llu bytes)",
                    (unsigned long long)file_size);
    }
    if (header->magic != VGPU_REGION_MAGIC) {
        return fail(problem, problem_size, "not a pod region (bad magic)");
    }
    if (header->version != VGPU_REGION_VERSION) {
        return fail(problem, problem_size,
                    "region version %u, this vgpu-limiter reads version %u", header->version,
                    (unsigned)VGPU_REGION_VERSION);
    }
    if (header->header_size != offsetof(struct vgpu_region, devices) ||
        header->total_size != sizeof(struct vgpu_region)) {
        return fail(problem, problem_size,
                    "unexpected layout (header %u, total %llu bytes; expected %zu and %zu)",
                    header->header_size, (unsigned long long)header->total_size,
                    offsetof(struct vgpu_region, devices), sizeof(struct vgpu_region));
    }
    if (file_size < sizeof(struct vgpu_region)) {
        return fail(problem, problem_size, "truncated (%llu of %zu bytes)",
                    (unsigned long long)file_size, sizeof(struct vgpu_region));
    }
    uint32_t count = atomic_load(&((struct vgpu_region *)header)->device_count);
    if (count > VGPU_REGION_MAX_DEVICES) {
        return fail(problem, problem_size, "corrupt device table (device_count %u)", count);
    }
    return true;
}

/* The separator between a folder and a file's name in messages: none after a folder that ends
 * in one ("/" itself: "/shm", not "//shm"). */
static const char *separator_after(const char *folder) {
    size_t length = strlen(folder);
    return length > 0 && folder[length - 1] == '/' ? "" : "/";
}

int vgpu_region_open_file(const char *folder, const char *name, bool writable, char *error,
                          size_t error_size) {
    const char *separator = separator_after(folder);
    struct stat folder_info;
    int folder_fd = open_folder(folder, &folder_info, error, error_size);
    if (folder_fd < 0) {
        if (errno == ENOENT) {
            fail(error, error_size, "%.300s%s%.100s: no such pod region", folder, separator,
                 name);
        }
        return VGPU_REGION_ERROR;
    }
    /* O_NONBLOCK: a FIFO planted as the region must not hang us before the type check. */
    int fd = openat(folder_fd, name,
                    (writable ? O_RDWR : O_RDONLY) | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    int saved = errno;
    close(folder_fd);
    if (fd < 0) {
        fail(error, error_size, "%.300s%s%.100s: %s", folder, separator, name,
             saved == ENOENT  ? "no such pod region"
             : saved == ELOOP ? "a symbolic link, not a pod region"
                              : strerror(saved));
        return VGPU_REGION_ERROR;
    }
    struct stat info;
    const char *problem = vgpu_stat_at(fd, "", &info) != 0        ? strerror(errno)
                          : !S_ISREG(info.st_mode)   ? "not a regular file"
                          : info.st_mode & S_IWOTH   ? "writable by every user"
                          : info.st_nlink != 1 && !root_only(&folder_info) ? "has other hard links"
                          : geteuid() != 0 && info.st_uid != 0 && info.st_uid != geteuid()
                              ? "owned by another user"
                              : NULL;
    char reason[256];
    struct vgpu_region header;
    if (problem == NULL) {
        memset(&header, 0, offsetof(struct vgpu_region, devices));
        ssize_t length = pread(fd, &header, offsetof(struct vgpu_region, devices), 0);
        if (length < 0 || !vgpu_region_check(&header, (uint64_t)info.st_size, reason,
                                             sizeof reason)) {
            problem = length < 0 ? strerror(errno) : reason;
        }
    }
    if (problem != NULL) {
        fail(error, error_size, "%.300s%s%.100s: %s", folder, separator, name, problem);
        close(fd);
        return VGPU_REGION_ERROR;
    }
    return fd;
}

/* A new file in the folder, invisible until linked (O_TMPFILE), or else one with a unique name
 * that the caller unlinks; -1 when neither can be made. */
static int new_file(int folder_fd, char *name, size_t name_size) {
    name[0] = '\0';
    int fd = openat(folder_fd, ".", O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
    if (fd >= 0 || (errno != EOPNOTSUPP && errno != EISDIR && errno != EINVAL)) {
        return fd;
    }
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    for (unsigned attempt = 0; attempt < 100; attempt++) {
        snprintf(name, name_size, REGION_FILE ".%d.%ld.%u", (int)getpid(), now.tv_nsec, attempt);
        fd = openat(folder_fd, name, O_CREAT | O_EXCL | O_RDWR | O_NOFOLLOW | O_CLOEXEC, 0600);
        if (fd >= 0 || errno != EEXIST) {
            return fd;
        }
    }
    return -1;
}

/* Link the finished file in; an existing region (a concurrent creator's) is kept. */
static int link_file(int folder_fd, int fd, const char *name) {
    if (name[0] != '\0') {
        return linkat(folder_fd, name, folder_fd, REGION_FILE, 0);
    }
    char self[64];
    snprintf(self, sizeof self, "/proc/self/fd/%d", fd);
    return linkat(AT_FDCWD, self, folder_fd, REGION_FILE, AT_SYMLINK_FOLLOW);
}

/* Owner and group (VGPU_OWNER_KEEP, which is -1, leaves one as it is), then the mode: set
 * after creation, so that the umask cannot take the group's access away. */
static bool give(int fd, int64_t owner, int64_t group, mode_t mode) {
    return fchown(fd, (uid_t)owner, (gid_t)group) == 0 && fchmod(fd, mode) == 0;
}

/* Fill a new file with the region: its space allocated for real first, so that no process
 * mapping it later meets a hole a full disk cannot back (SIGBUS). */
static bool write_region(int fd, const char *pod_namespace, const char *pod_name,
                         const struct vgpu_region_limits *devices, unsigned device_count,
                         int64_t owner, int64_t group) {
    int failure = posix_fallocate(fd, 0, sizeof(struct vgpu_region));
    if (failure != 0) {
        errno = failure;
        return false;
    }
    struct vgpu_region *image = calloc(1, sizeof *image);
    if (image == NULL) {
        return false;
    }
    vgpu_region_format(image, pod_namespace, pod_name, devices, device_count);
    ssize_t written = pwrite(fd, image, sizeof *image, 0);
    free(image);
    if (written != (ssize_t)sizeof *image) {
        errno = written < 0 ? errno : EIO;
        return false;
    }
    return give(fd, owner, group, VGPU_REGION_FILE_MODE);
}

int vgpu_region_create(const char *folder, const char *pod_namespace, const char *pod_name,
                       const struct vgpu_region_limits *devices, unsigned device_count,
                       int64_t owner, int64_t group, char *error, size_t error_size) {
    if (device_count > VGPU_REGION_MAX_DEVICES) {
        fail(error, error_size, "%u GPUs given; a region holds at most %d", device_count,
             VGPU_REGION_MAX_DEVICES);
        return VGPU_REGION_ERROR;
    }
    if (!vgpu_make_parents(folder, VGPU_REGION_PARENT_MODE)) {
        fail(error, error_size, "%.300s: cannot create the pod folder: %s", folder,
             strerror(errno));
        return VGPU_REGION_ERROR;
    }
    bool made = mkdir(folder, VGPU_REGION_FOLDER_MODE) == 0;
    if (!made && errno != EEXIST) {
        fail(error, error_size, "%.300s: cannot create the pod folder: %s", folder,
             strerror(errno));
        return VGPU_REGION_ERROR;
    }
    struct stat folder_info;
    int folder_fd = open_folder(folder, &folder_info, error, error_size);
    if (folder_fd < 0) {
        return VGPU_REGION_ERROR;
    }
    /* Made for someone else (the daemon's pod for a tenant): the folder stays the creator's,
     * or the tenant could unlink the region and make one with limits of its own choosing. */
    bool managed = owner != VGPU_OWNER_KEEP || group != VGPU_OWNER_KEEP;
    if (made && !give(folder_fd, VGPU_OWNER_KEEP, managed ? group : VGPU_OWNER_KEEP,
                      managed ? VGPU_REGION_MANAGED_FOLDER_MODE : VGPU_REGION_FOLDER_MODE)) {
        fail(error, error_size, "%.300s: cannot give the pod folder its owner: %s", folder,
             strerror(errno));
        close(folder_fd);
        return VGPU_REGION_ERROR;
    }
    char name[64];
    int fd = new_file(folder_fd, name, sizeof name);
    bool ok = fd >= 0 &&
              write_region(fd, pod_namespace, pod_name, devices, device_count, owner, group);
    bool exists = false;
    if (ok && link_file(folder_fd, fd, name) != 0) {
        exists = errno == EEXIST;
        ok = exists;
    }
    int saved = errno;
    if (name[0] != '\0') {
        unlinkat(folder_fd, name, 0);
    }
    if (fd >= 0) {
        close(fd);
    }
    close(folder_fd);
    if (!ok) {
        fail(error, error_size, "%.300s/" REGION_FILE ": cannot create the pod region: %s",
             folder, strerror(saved));
        return VGPU_REGION_ERROR;
    }
    return exists ? 0 : 1;
}

bool vgpu_region_await(const char *folder, unsigned wait_s, char *error, size_t error_size) {
    char path[4096];
    snprintf(path, sizeof path, "%.4000s/" REGION_FILE, folder);
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    int64_t deadline = (int64_t)now.tv_sec * 1000 + now.tv_nsec / 1000000 + (int64_t)wait_s * 1000;
    long pause_ms = 5;
    /* access, not stat (glibc floor); the open that follows checks what is found. */
    while (access(path, F_OK) != 0) {
        if (errno != ENOENT) {
            return true; /* the open says what is wrong */
        }
        clock_gettime(CLOCK_MONOTONIC, &now);
        int64_t left = deadline - ((int64_t)now.tv_sec * 1000 + now.tv_nsec / 1000000);
        if (left <= 0) {
            return fail(error, error_size,
                        "%.300s: no pod region after %u s: the node daemon has not bound this "
                        "container's GPUs to its pod (TF_REGION_WAIT=%u; is tf-hypervisor "
                        "running, and can it reach the kubelet's PodResources socket?)",
                        path, wait_s, wait_s);
        }
        long step = pause_ms < left ? pause_ms : (long)left;
        struct timespec pause = {step / 1000, (step % 1000) * 1000000L};
        nanosleep(&pause, NULL); /* woken early by a signal: the loop checks again */
        pause_ms = pause_ms < 200 ? pause_ms * 2 : 200;
    }
    return true;
}

bool vgpu_region_private_folder(const char *path, char *error, size_t error_size) {
    if (mkdir(path, VGPU_PRIVATE_FOLDER_MODE) != 0 && errno != EEXIST) {
        return fail(error, error_size, "%.300s: cannot create the private folder: %s", path,
                    strerror(errno));
    }
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
        return fail(error, error_size, "%.300s: not a directory (a symbolic link?)", path);
    }
    struct stat info;
    bool ok = vgpu_stat_at(fd, "", &info) == 0 && S_ISDIR(info.st_mode);
    close(fd);
    if (!ok || info.st_uid != geteuid() || (info.st_mode & 0077) != 0) {
        return fail(error, error_size,
                    "%.300s: the private folder must be this user's, mode 0700", path);
    }
    return true;
}
