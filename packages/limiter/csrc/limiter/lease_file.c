#define _GNU_SOURCE
#include "lease_file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "vgpu_files.h"
#include "vgpu_region.h"

#define SHARED_FOLDER_MODE 03770 /* setgid: leases get the folder's group; sticky: kept */
#define PRIVATE_FOLDER_MODE 0700
#define LEASE_MODE 0660

int vgpu_lease_folder(const char *path, enum vgpu_lease_folder_kind kind, uid_t *owner, char *why,
                      size_t why_size) {
    bool made = false;
    if (kind != VGPU_FOLDER_NODE) {
        vgpu_make_parents(path, 0755); /* a failure shows in the open below */
        made = mkdir(path, 0700) == 0; /* opened to its group only once it is checked ours */
    }
    int folder = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    struct stat info;
    if (folder < 0) {
        snprintf(why, why_size, "%s: %s", path,
                 errno == ELOOP || errno == ENOTDIR ? "not a directory (a symlink?)" : strerror(errno));
        return -1;
    }
    if (vgpu_stat_at(folder, "", &info) != 0) {
        snprintf(why, why_size, "%s: %s", path, strerror(errno));
        close(folder);
        return -1;
    }
    mode_t wanted = kind == VGPU_FOLDER_PRIVATE ? PRIVATE_FOLDER_MODE : SHARED_FOLDER_MODE;
    if (made && info.st_uid == geteuid() && fchmod(folder, wanted) == 0) {
        info.st_mode = (info.st_mode & ~(mode_t)07777) | wanted;
    }
    const char *wrong = NULL;
    if (info.st_mode & S_IWOTH) {
        wrong = "world-writable (made by an older version? remove it)";
    } else if (kind == VGPU_FOLDER_PRIVATE &&
               (info.st_uid != geteuid() || (info.st_mode & 077) != 0)) {
        wrong = "not this user's alone";
    } else if (kind == VGPU_FOLDER_NODE && (info.st_mode & S_IWGRP)) {
        wrong = "writable by others than its owner";
    }
    if (wrong != NULL) {
        snprintf(why, why_size, "%s: %s", path, wrong);
        close(folder);
        return -1;
    }
    *owner = info.st_uid;
    return folder;
}

/* Open an existing file of the folder without following a symlink or blocking on a FIFO, and
 * check what was opened: a regular file with one link (a hard link could be any file of the
 * file system), the same inode as the name named, not world-writable. */
static int open_existing(int folder, const char *name, int flags, struct stat *info,
                         const char **wrong) {
    struct stat named;
    if (vgpu_stat_at(folder, name, &named) != 0) {
        *wrong = errno == ENOENT ? "missing" : strerror(errno);
        return -1;
    }
    if (!S_ISREG(named.st_mode)) {
        *wrong = S_ISLNK(named.st_mode) ? "a symlink" : "not a regular file";
        return -1;
    }
    int fd = openat(folder, name, flags | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        *wrong = strerror(errno);
        return -1;
    }
    if (vgpu_stat_at(fd, "", info) != 0 || info->st_ino != named.st_ino ||
        info->st_dev != named.st_dev || !S_ISREG(info->st_mode)) {
        *wrong = "replaced while opened";
    } else if (info->st_nlink != 1) {
        *wrong = "a file with other links";
    } else if (info->st_mode & S_IWOTH) {
        *wrong = "world-writable (made by an older version? remove it)";
    } else {
        return fd;
    }
    close(fd);
    return -1;
}

struct vgpu_device_lease *vgpu_lease_map(int folder, const char *name, char *why,
                                         size_t why_size) {
    const size_t size = sizeof(struct vgpu_device_lease);
    const char *wrong = NULL;
    struct stat info;
    struct stat self;
    int fd = openat(folder, name, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, LEASE_MODE);
    bool made = fd >= 0;
    if (made) {
        fchmod(fd, LEASE_MODE); /* whatever the umask: the folder's group shares it */
    } else if (errno == EEXIST) {
        fd = open_existing(folder, name, O_RDWR, &info, &wrong);
        /* Another sharer's lease: of a user of the folder's group, or root's. */
        if (fd >= 0 && vgpu_stat_at(folder, "", &self) == 0 && info.st_uid != geteuid() &&
            info.st_uid != 0 && info.st_gid != self.st_gid) {
            wrong = "owned by a user outside the folder's group";
            close(fd);
            fd = -1;
        }
    } else {
        wrong = strerror(errno);
    }
    int error = fd < 0 ? 0 : posix_fallocate(fd, 0, (off_t)size);
    if (fd >= 0 && error != 0) {
        wrong = error == ENOSPC ? "no space left to allocate it" : strerror(error);
    } else if (fd >= 0 && lseek(fd, 0, SEEK_END) != (off_t)size) {
        wrong = "not the size of a lease";
    }
    struct vgpu_device_lease *lease = MAP_FAILED;
    if (wrong == NULL) {
        lease = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        wrong = lease == MAP_FAILED ? strerror(errno) : NULL;
    }
    if (fd >= 0) {
        close(fd);
    }
    if (wrong != NULL) {
        if (made) {
            unlinkat(folder, name, 0); /* nothing half made is left behind */
        }
        snprintf(why, why_size, "%s: %s", name, wrong);
        return NULL;
    }
    /* A new file is all zeros, a free lease: only the magic is written, once. Any other header
     * is a scribble of a sharer (or an older version's, whose words mean the same): stamped
     * again, since refusing it would send every pod of the GPU to a lease of its own for good. */
    uint64_t blank = 0;
    if (lease->magic == 0) {
        lease->version = VGPU_LEASE_VERSION;
        atomic_compare_exchange_strong((_Atomic uint64_t *)&lease->magic, &blank, VGPU_LEASE_MAGIC);
    }
    if (lease->magic != VGPU_LEASE_MAGIC || lease->version != VGPU_LEASE_VERSION) {
        lease->version = VGPU_LEASE_VERSION;
        lease->magic = VGPU_LEASE_MAGIC;
    }
    return lease;
}

const struct vgpu_device_node *vgpu_lease_map_node(int folder, uid_t folder_owner,
                                                   const char *name, char *why, size_t why_size) {
    const char *wrong = NULL;
    struct stat info;
    int fd = open_existing(folder, name, O_RDONLY, &info, &wrong);
    if (fd >= 0) {
        if (info.st_uid != 0 && info.st_uid != folder_owner) {
            wrong = "not the daemon's (owned by neither root nor the folder's owner)";
        } else if (info.st_mode & (S_IWGRP | S_IWOTH)) {
            wrong = "writable by others than its owner";
        } else if (info.st_size < (off_t)sizeof(struct vgpu_device_node)) {
            wrong = "shorter than a node file";
        }
    }
    const struct vgpu_device_node *node = MAP_FAILED;
    if (fd >= 0 && wrong == NULL) {
        /* Read-only, and only its owner may shrink it: no SIGBUS from a tenant. */
        node = mmap(NULL, sizeof *node, PROT_READ, MAP_SHARED, fd, 0);
        wrong = node == MAP_FAILED ? strerror(errno) : NULL;
    }
    if (fd >= 0) {
        close(fd);
    }
    if (wrong != NULL) {
        snprintf(why, why_size, "%s: %s", name, wrong);
        return NULL;
    }
    return node;
}
