#define _GNU_SOURCE
#include "vgpu_files.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/syscall.h>
#include <unistd.h>

int vgpu_stat_at(int at, const char *name, struct stat *info) {
    return (int)syscall(SYS_newfstatat, at, name, info,
                        name[0] == '\0' ? AT_EMPTY_PATH : AT_SYMLINK_NOFOLLOW);
}

bool vgpu_make_parents(const char *path, mode_t mode) {
    char parent[4096];
    if (snprintf(parent, sizeof parent, "%s", path) >= (int)sizeof parent) {
        errno = ENAMETOOLONG;
        return false;
    }
    for (char *cursor = parent + 1; *cursor != '\0'; cursor++) {
        if (*cursor == '/') {
            *cursor = '\0';
            if (mkdir(parent, mode) != 0 && errno != EEXIST) {
                return false;
            }
            *cursor = '/';
        }
    }
    return true;
}
