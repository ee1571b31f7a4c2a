#define _GNU_SOURCE
#include "vgpu_proc.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

uint64_t vgpu_process_start_time(int32_t pid) {
    char path[64];
    char buffer[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        return 0;
    }
    ssize_t length = read(fd, buffer, sizeof buffer - 1);
    close(fd);
    if (length <= 0) {
        return 0;
    }
    buffer[length] = '\0';
    /* The command name may hold spaces and parentheses: fields restart after the last ')'. */
    char *cursor = strrchr(buffer, ')');
    for (int field = 2; cursor != NULL && field < 22; field++) {
        cursor = strchr(cursor + 1, ' ');
    }
    return cursor == NULL ? 0 : strtoull(cursor + 1, NULL, 10);
}

bool vgpu_process_alive(int32_t pid, uint64_t start_time) {
    if (pid <= 0 || (kill(pid, 0) != 0 && errno == ESRCH)) {
        return false;
    }
    uint64_t now_start = vgpu_process_start_time(pid);
    return now_start == 0 || start_time == 0 || now_start == start_time;
}

uint64_t vgpu_pid_namespace(void) {
    /* The link reads "pid:[<inode>]" (readlink rather than stat: no newer glibc symbol). */
    char target[64];
    ssize_t length = readlink("/proc/self/ns/pid", target, sizeof target - 1);
    if (length <= 0) {
        return 0;
    }
    target[length] = '\0';
    const char *open_bracket = strchr(target, '[');
    return open_bracket == NULL ? 0 : strtoull(open_bracket + 1, NULL, 10);
}
