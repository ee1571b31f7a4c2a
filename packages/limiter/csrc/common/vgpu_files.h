/* File-system calls the libraries share, within glibc 2.17's symbols. */
#ifndef VGPU_FILES_H
#define VGPU_FILES_H

#include <stdbool.h>
#include <sys/stat.h>
#include <sys/types.h>

/* fstatat through the system call: glibc's stat family is newer than 2.17 when built on a new
 * glibc (the kernel's struct stat is glibc's on x86-64 and aarch64). An empty `name` stats `at`
 * itself; a symbolic link is never followed. 0, or -1 with errno. */
int vgpu_stat_at(int at, const char *name, struct stat *info);

/* mkdir -p of every folder above `path`'s last component with `mode`, tolerant of concurrent
 * creators; false with errno. */
bool vgpu_make_parents(const char *path, mode_t mode);

#endif
