#define _GNU_SOURCE
#include "log.h"

#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <unistd.h>

static int log_level = VGPU_LOG_WARN;
static int log_fd = STDERR_FILENO;

void vgpu_log_configure(int level, const char *path) {
    log_level = level;
    if (path != NULL && path[0] != '\0') {
        int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
        if (fd >= 0) {
            log_fd = fd;
        } else {
            vgpu_log(VGPU_LOG_WARN, "TF_LOG_PATH=%s: cannot open, logging to stderr", path);
        }
    }
}

void vgpu_log(int level, const char *format, ...) {
    static const char *const names[] = {"error", "warning", "info", "debug"};
    if (level > log_level) {
        return;
    }
    char line[1024];
    int length = snprintf(line, sizeof line, "vgpu-limiter[%d]: %s: ", (int)getpid(), names[level]);
    va_list arguments;
    va_start(arguments, format);
    int more = vsnprintf(line + length, sizeof line - (size_t)length - 1, format, arguments);
    va_end(arguments);
    length += more < 0 ? 0 : more;
    if (length > (int)sizeof line - 2) {
        length = (int)sizeof line - 2;
    }
    line[length++] = '\n';
    /* One write: lines from several processes sharing a log do not interleave. */
    ssize_t written = write(log_fd, line, (size_t)length);
    (void)written;
}
