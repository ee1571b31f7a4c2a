/* What the lease arbiter (arbiter.c) may know of the process at the other end of a connection:
 * whether it holds a GPU's device open, read from /proc/PID/fd and /proc/PID/fdinfo. */
#define _GNU_SOURCE
#include "arbiter_peer.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <unistd.h>

/* The most descriptors of a process looked through for a GPU's device: a driver opens its
 * devices at its start, among its first descriptors; the bound keeps a process of many open
 * files from holding up the thread that hands the leases over. */
#define DESCRIPTORS_LOOKED_AT 1024

/* statx(2) by its system call (the library must run on glibc 2.17, which has no wrapper), with
 * the fields of the kernel's struct statx that are read here; its layout is the kernel's ABI. */
#ifndef SYS_statx
#if defined(__x86_64__)
#define SYS_statx 332
#elif defined(__aarch64__)
#define SYS_statx 291
#endif
#endif
#define STATX_WANTED 0x00000101U /* STATX_TYPE | STATX_INO */
#define STATX_WITH_MNT_ID 0x00001000U
#define STATX_WITHOUT_SYNC 0x4000 /* AT_STATX_DONT_SYNC */
struct file_statx {
    uint32_t mask, blksize;
    uint64_t attributes;
    uint32_t nlink, uid, gid;
    uint16_t mode, spare0;
    uint64_t ino, size, blocks, attributes_mask;
    struct {
        int64_t sec;
        uint32_t nsec;
        int32_t reserved;
    } atime, btime, ctime, mtime;
    uint32_t rdev_major, rdev_minor, dev_major, dev_minor;
    uint64_t mnt_id;
    uint64_t spare[13];
};
_Static_assert(sizeof(struct file_statx) == 256, "the kernel's struct statx is 256 bytes");

/* What is known of the file open at descriptor `name` of /proc/PID/fd (`folder`): its type, its
 * device number, its inode and its mount (0 where unknown). Taken from what the kernel has
 * cached (AT_STATX_DONT_SYNC, the type and inode alone): a descriptor on NFS or a FUSE file
 * system costs no request to its server, which could take long, or never answer, and hold up
 * every hand-over of the node's leases; a plain stat asked it for every such descriptor. */
struct open_file {
    bool character;
    uint64_t device, inode, mount;
};

static bool open_file_of(int folder, const char *name, struct open_file *file) {
#ifdef SYS_statx
    struct file_statx cached;
    memset(&cached, 0, sizeof cached);
    if (syscall(SYS_statx, folder, name, STATX_WITHOUT_SYNC, STATX_WANTED | STATX_WITH_MNT_ID,
                &cached) == 0) {
        *file = (struct open_file){
            .character = S_ISCHR(cached.mode),
            .device = (uint64_t)makedev(cached.rdev_major, cached.rdev_minor),
            .inode = (cached.mask & 0x100U) != 0 ? cached.ino : 0,
            .mount = (cached.mask & STATX_WITH_MNT_ID) != 0 ? cached.mnt_id : 0};
        return true;
    }
    if (errno != ENOSYS) {
        return false;
    }
#endif
    /* Before Linux 4.11. The system call itself, as vgpu_stat_at does: fstatat is a symbol of
     * glibc 2.33 where it is built on a newer one, and the library must run on 2.17. */
    struct stat info;
    if (syscall(SYS_newfstatat, folder, name, &info, 0) != 0) {
        return false;
    }
    *file = (struct open_file){.character = S_ISCHR(info.st_mode),
                               .device = (uint64_t)info.st_rdev,
                               .inode = (uint64_t)info.st_ino};
    return true;
}

/* A number after `label` in /proc/PID/fdinfo's `text`; false where the field is missing. */
static bool fdinfo_field(const char *text, const char *label, int base, uint64_t *value) {
    const char *at = strstr(text, label);
    if (at == NULL) {
        return false;
    }
    *value = strtoull(at + strlen(label), NULL, base);
    return true;
}

/* Whether descriptor `name` of `pid`, found to be `file`, is open for reading or writing: an
 * O_PATH descriptor opens nothing, and any tenant can hold one of a device node of its own
 * making (mknod is a default capability of a container's root, and an image may carry one):
 * the device cgroup and nodev mounts refuse it a real open, not an O_PATH one. fdinfo is read
 * apart from the stat, so the descriptor could be swapped between the two (a thread of the
 * tenant's flipping it with dup2): its inode and mount, where the kernel shows them, must be the
 * ones stat saw (a real open of that very device node is what the tenant cannot make). */
static bool opened_for_use(pid_t pid, const char *name, const struct open_file *file) {
    char path[96];
    char text[512];
    snprintf(path, sizeof path, "/proc/%d/fdinfo/%.32s", (int)pid, name);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        return false;
    }
    ssize_t length = read(fd, text, sizeof text - 1);
    close(fd);
    if (length <= 0) {
        return false;
    }
    text[length] = '\0';
    uint64_t flags;
    uint64_t inode;
    uint64_t mount;
    if (!fdinfo_field(text, "flags:", 8, &flags) || (flags & O_PATH) != 0) {
        return false;
    }
    if (fdinfo_field(text, "\nino:", 10, &inode) && file->inode != 0 && inode != file->inode) {
        return false;
    }
    return !fdinfo_field(text, "\nmnt_id:", 10, &mount) || file->mount == 0 ||
           mount == file->mount;
}

/* Whether process `pid` holds the character device `device` open: every process with a context
 * on a GPU does (the driver works through /dev/nvidiaN), and a container is given only its own
 * GPUs' devices. Before, any local process could say HELLO for any GPU of the node and take
 * turns of its lease, idle, from the pods that GPU was given to. */
bool vgpu_peer_holds_device(pid_t pid, uint64_t device) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/fd", (int)pid);
    int folder = pid > 0 ? open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC) : -1;
    DIR *entries = folder >= 0 ? fdopendir(folder) : NULL;
    if (entries == NULL) {
        if (folder >= 0) {
            close(folder);
        }
        return false; /* gone, or not in this pid namespace (SO_PEERCRED said 0) */
    }
    bool found = false;
    struct dirent *entry;
    for (int looked = 0; !found && looked < DESCRIPTORS_LOOKED_AT &&
                         (entry = readdir(entries)) != NULL;
         looked++) {
        struct open_file file;
        found = entry->d_name[0] != '.' && open_file_of(folder, entry->d_name, &file) &&
                file.character && file.device == device &&
                opened_for_use(pid, entry->d_name, &file);
    }
    closedir(entries);
    return found;
}
