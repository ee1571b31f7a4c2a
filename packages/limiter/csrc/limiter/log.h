/* The limiter's log: one line per message, to stderr or TF_LOG_PATH, filtered by TF_LOG_LEVEL. */
#ifndef VGPU_LOG_H
#define VGPU_LOG_H

enum { VGPU_LOG_ERROR = 0, VGPU_LOG_WARN = 1, VGPU_LOG_INFO = 2, VGPU_LOG_DEBUG = 3 };

void vgpu_log_configure(int level, const char *path);
void vgpu_log(int level, const char *format, ...) __attribute__((format(printf, 2, 3)));

#endif
