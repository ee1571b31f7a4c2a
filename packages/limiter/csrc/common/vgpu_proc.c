#define _GNU_SOURCE
#include "vgpu_proc.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* State (field 3) and start time (field 22) of /proc/<pid>/stat; false if unreadable. */
static bool read_stat(int32_t pid, char *state, uint64_t *start_time) {
    char path[64];
    char buffer[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        return false;
    }
    ssize_t length = read(fd, buffer, sizeof buffer - 1);
    close(fd);
    if (length <= 0) {
        return false;
    }
    buffer[length] = '\0';
    /* The command name may hold spaces and parentheses: fields restart after the last ')'. */
    char *cursor = strrchr(buffer, ')');
    if (cursor == NULL || cursor[1] != ' ' || cursor[2] == '\0') {
        return false;
    }
    *state = cursor[2];
    for (int field = 2; cursor != NULL && field < 22; field++) {
        cursor = strchr(cursor + 1, ' ');
    }
    *start_time = cursor == NULL ? 0 : strtoull(cursor + 1, NULL, 10);
    return true;
}

/* These run inside the program's own calls (a view, an allocation sweeping the region): the
 * program's errno is left as it was, whatever the process looked at was (ENOENT, ESRCH). */
uint64_t vgpu_process_start_time(int32_t pid) {
    int saved = errno;
    char state;
    uint64_t start_time;
    bool known = read_stat(pid, &state, &start_time);
    errno = saved;
    return known ? start_time : 0;
}

static bool process_alive(int32_t pid, uint64_t start_time) {
    if (pid <= 0 || (kill(pid, 0) != 0 && errno == ESRCH)) {
        return false;
    }
    char state = '?';
    uint64_t now_start = 0;
    if (read_stat(pid, &state, &now_start) && (state == 'Z' || state == 'X')) {
        return false; /* a zombie: gone but for its exit status, which no GPU work needs */
    }
    return now_start == 0 || start_time == 0 || now_start == start_time;
}

bool vgpu_process_alive(int32_t pid, uint64_t start_time) {
    int saved = errno;
    bool alive = process_alive(pid, start_time);
    errno = saved;
    return alive;
}

uint64_t vgpu_pid_namespace(void) {
    /* The link reads "pid:[<inode>]" (readlink rather than stat: no newer glibc symbol). */
    char target[64];
    int saved = errno;
    ssize_t length = readlink("/proc/self/ns/pid", target, sizeof target - 1);
    errno = saved;
    if (length <= 0) {
        return 0;
    }
    target[length] = '\0';
    const char *open_bracket = strchr(target, '[');
    return open_bracket == NULL ? 0 : strtoull(open_bracket + 1, NULL, 10);
}
