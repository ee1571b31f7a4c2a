/* Identity of processes, robust against PID reuse: a pid plus its start time. */
#ifndef VGPU_PROC_H
#define VGPU_PROC_H

#include <stdbool.h>
#include <stdint.h>

/* Field 22 of /proc/<pid>/stat: start time in clock ticks after boot; 0 if unreadable. */
uint64_t vgpu_process_start_time(int32_t pid);

/* Whether `pid` (in the caller's pid namespace) is the process that started at `start_time`:
 * false when it is gone (a zombie too: kill(pid, 0) still succeeds on one), or when the pid
 * now belongs to a process started at another time. */
bool vgpu_process_alive(int32_t pid, uint64_t start_time);

/* Inode of the caller's pid namespace (/proc/self/ns/pid); 0 if unknown. */
uint64_t vgpu_pid_namespace(void);

#endif
