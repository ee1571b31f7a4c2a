/* The functions of libvgpu_region.so: the region protocol (vgpu_region.h) for processes that
 * are not the limiter, above all the node daemon, which reaches them through cffi. The build
 * preprocesses this header with VGPU_REGION_CDEF into region_cdef.h, which holds the layout,
 * these prototypes and the integer constants: Python restates none of them.
 *
 * Every function that touches a mapped region survives the file being truncated under it (by a
 * tenant, who may write its own pod's file): the fault is caught and VGPU_REGION_FAULT returned,
 * where a plain access would end the process with SIGBUS. Writers hold the writers' flock on
 * the region file, as the limiter does for the same changes. */
#ifndef VGPU_REGION_API_H
#define VGPU_REGION_API_H

#include "vgpu_region.h"

#ifdef VGPU_REGION_CDEF
#define VGPU_REGION_API
#else
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#ifdef VGPU_REGION_LIBRARY
#include "vgpu_export.h"
#define VGPU_REGION_API VGPU_EXPORT
#else
#define VGPU_REGION_API
#endif
#endif

/* Results of the functions below besides an entry or a count (>= 0). */
#define VGPU_REGION_ERROR (-1)  /* a one-line reason is in `error` */
#define VGPU_REGION_EXISTS (-2) /* the GPU already has an entry */
#define VGPU_REGION_FULL (-3)   /* all device entries are in use */
#define VGPU_REGION_STALE (-4)  /* the slot no longer holds that process */
#define VGPU_REGION_FAULT (-5)  /* the file shrank under the mapping: nothing more was done */

/* Owners and modes of what the region code creates (docs/security.md gives the rule). */
#define VGPU_REGION_FILE_MODE 0660   /* the pod's processes (owner and group) and root */
#define VGPU_REGION_FOLDER_MODE 0770 /* a pod folder its own processes made: theirs */
/* A pod folder made for another user or group (the daemon's pods): its creator's, so that the
 * pod's tenant can neither remove nor replace the region the daemon made for it. */
#define VGPU_REGION_MANAGED_FOLDER_MODE 0755
#define VGPU_REGION_PARENT_MODE 0755 /* base and namespace folders: only their owner writes */
#define VGPU_PRIVATE_FOLDER_MODE 0700 /* $TMPDIR/vgpu-<uid>, private regions of one user */
#define VGPU_OWNER_KEEP (-1)          /* an owner argument that leaves the creator's */

/* One GPU's entry and limits: for vgpu_region_create and adding an entry (uuid) and for
 * storing limits (uuid ignored). All of them are written together under the seqlock. */
struct vgpu_region_limits {
    char uuid[VGPU_REGION_UUID_SIZE];
    uint64_t memory_limit;
    uint32_t compute_limit;
    uint32_t compute_soft_limit; /* burst, hundredths of a percent; 0 = no burst */
    uint32_t device_flags;       /* VGPU_DEVICE_* */
};

/* One device entry as read at one moment, its limits consistent (seqlock). */
struct vgpu_region_device_view {
    char uuid[VGPU_REGION_UUID_SIZE];
    uint64_t memory_limit;
    uint64_t memory_used;
    uint32_t compute_limit;
    uint32_t generation;
    uint32_t compute_soft_limit;
    uint32_t device_flags;
    uint64_t host_memory_used;
    uint64_t gpu_ns;
    uint64_t throttled_ns;
    uint64_t burst_ns;
    uint64_t refusals;           /* allocations refused at memory_limit */
    uint64_t refused_bytes_last; /* the size of the last one */
};

/* Create {folder}/shm complete with `devices` (written to a private file whose space is
 * allocated for real, then linked into place: nobody sees it half written, a full disk is an
 * error and leaves no temporary file, and a concurrent creator's file is kept). Missing folders
 * are made; the pod folder and the file get `owner`/`group` unless VGPU_OWNER_KEEP. 1 when
 * created, 0 when a region was there already, VGPU_REGION_ERROR with `error`. */
VGPU_REGION_API int vgpu_region_create(const char *folder, const char *pod_namespace,
                                       const char *pod_name,
                                       const struct vgpu_region_limits *devices,
                                       unsigned device_count, int64_t owner, int64_t group,
                                       char *error, size_t error_size);

/* A descriptor of {folder}/{name} (a region is named shm) for mapping, or VGPU_REGION_ERROR with `error`. Opened without
 * following a symbolic link or blocking on a FIFO, relative to the folder opened the same way;
 * refused unless folder and file are a directory and a regular file that not every user can
 * write, the file has no other hard link (another pod's file linked in) unless the folder is
 * one only root can write (the daemon's links), a caller other than root owns it or root
 * does, and its header is this layout's. */
VGPU_REGION_API int vgpu_region_open_file(const char *folder, const char *name, bool writable,
                                          char *error, size_t error_size);

/* Whether a header read from a file of `file_size` bytes is a region of this layout; false
 * with a one-line reason in `problem`. */
VGPU_REGION_API bool vgpu_region_check(const struct vgpu_region *header, uint64_t file_size,
                                       char *problem, size_t problem_size);

/* Make `path` (a user's folder for private regions) unless it exists; refused unless it is a
 * real directory of this user with mode VGPU_PRIVATE_FOLDER_MODE. */
VGPU_REGION_API bool vgpu_region_private_folder(const char *path, char *error, size_t error_size);

/* The operations on a mapped region, each guarded against truncation (see above). */
VGPU_REGION_API int vgpu_region_safe_add_device(struct vgpu_region *region,
                                                const struct vgpu_region_limits *device);
VGPU_REGION_API int vgpu_region_safe_store_limits(struct vgpu_region *region, unsigned entry,
                                                  const struct vgpu_region_limits *limits);
/* Put `uuid` back as the GPU of entry `entry`, and the entries in use back up to it: a tenant
 * that renamed the entry its running processes read (or hid it past the count) took it out of
 * what the daemon holds limits on. */
VGPU_REGION_API int vgpu_region_safe_restore_entry(struct vgpu_region *region, unsigned entry,
                                                   const char *uuid);
VGPU_REGION_API int vgpu_region_safe_read_device(const struct vgpu_region *region, unsigned entry,
                                                 struct vgpu_region_device_view *view);
VGPU_REGION_API int vgpu_region_safe_set_host_pid(struct vgpu_region *region, unsigned slot,
                                                  int32_t pid, uint64_t pid_namespace,
                                                  uint64_t start_time, int32_t host_pid);
VGPU_REGION_API int vgpu_region_safe_settle_generations(struct vgpu_region *region);
/* Set, then clear bits of the region's flags (VGPU_REGION_*); the flags after. */
VGPU_REGION_API int64_t vgpu_region_safe_change_flags(struct vgpu_region *region, uint32_t set,
                                                      uint32_t clear);
/* Freeze the pod until `until_ns` (CLOCK_MONOTONIC; called again to renew): its processes'
 * next launches wait. freeze_epoch is bumped when the pod was not frozen. 0, or a fault. */
VGPU_REGION_API int vgpu_region_safe_freeze(struct vgpu_region *region, uint64_t until_ns);
/* The pod's scheduling class and weight (0: from the class), read by the daemon's scheduler. */
VGPU_REGION_API int vgpu_region_safe_set_policy(struct vgpu_region *region, uint32_t qos,
                                                uint32_t weight);
/* The scheduler's effective compute limit of a device entry (hundredths of a percent; 0: none),
 * stamped with `now_ns` (CLOCK_MONOTONIC): the limiter ignores a stamp older than
 * VGPU_EFFECTIVE_STALE_NS. */
VGPU_REGION_API int vgpu_region_safe_set_effective(struct vgpu_region *region, unsigned entry,
                                                   uint32_t effective, uint64_t now_ns);
/* The scheduler's burst rate of a device entry (VGPU_SCHED_BURST: hundredths; 0: none),
 * stamped with `now_ns` (CLOCK_MONOTONIC). */
VGPU_REGION_API int vgpu_region_safe_set_burst(struct vgpu_region *region, unsigned entry,
                                               uint32_t burst, uint64_t now_ns);
/* Mark a device entry as one the pod's freeze holds (nonzero), or clear the mark; with no entry
 * marked, a freeze holds every GPU of the pod. */
VGPU_REGION_API int vgpu_region_safe_freeze_device(struct vgpu_region *region, unsigned entry,
                                                   uint64_t frozen);
/* Resume a frozen pod and wake its waiting launches at once (device marks cleared). */
VGPU_REGION_API int vgpu_region_safe_resume(struct vgpu_region *region);
VGPU_REGION_API int vgpu_region_safe_reclaim_process(struct vgpu_region *region, unsigned slot,
                                                     int32_t pid, uint64_t pid_namespace,
                                                     uint64_t start_time);

/* Whether `pid` of the caller's pid namespace is the live process that started at
 * `start_time` (0: not known); a zombie is dead. */
VGPU_REGION_API bool vgpu_region_process_alive(int32_t pid, uint64_t start_time);

/* The node daemon's lease arbiter (vgpu_region.h, VGPU_LEASE_SOCKET): a thread of its own that
 * serves the lease protocol on `listener` (a listening SOCK_SEQPACKET socket, taken over: the
 * arbiter closes it), so that a hand-over never waits for the daemon's interpreter. `instance`
 * is what the node files name (not 0). NULL with `error` when it cannot be made. */
struct vgpu_arbiter;
VGPU_REGION_API struct vgpu_arbiter *vgpu_arbiter_new(int listener, uint64_t instance,
                                                      char *error, size_t error_size);
/* Arbitrate the lease of GPU `uuid`, keeping in `lease_fd` (a memfd of the daemon's own, the
 * size of a vgpu_device_lease) the words the daemon reads: activity, epochs, waiters, busy time.
 * `device`: the device number (st_rdev) of the GPU's character device (/dev/nvidiaN); a process
 * is served that GPU's lease only while it holds that device open, as every process with a
 * context on the GPU does. 0: anyone connected is (a simulated GPU has no device file).
 * Before vgpu_arbiter_start only; 0, or VGPU_REGION_ERROR with `error`. */
VGPU_REGION_API int vgpu_arbiter_add_gpu(struct vgpu_arbiter *arbiter, const char *uuid,
                                         int lease_fd, uint64_t device, char *error,
                                         size_t error_size);
VGPU_REGION_API int vgpu_arbiter_start(struct vgpu_arbiter *arbiter, char *error,
                                       size_t error_size);
/* Stop serving (every client then sees its connection end) and free everything. */
VGPU_REGION_API void vgpu_arbiter_stop(struct vgpu_arbiter *arbiter);

struct vgpu_arbiter_stats {
    uint64_t clients;    /* connected now */
    uint64_t refused;    /* connections refused (over a limit) or dropped (a broken message) */
    uint64_t strangers;  /* HELLOs for a GPU whose device the process does not hold open */
    uint64_t grants;
    uint64_t taken_back; /* grants taken back from a stale, idle or overrunning holder */
    uint64_t overruns;   /* of them, holders that kept the lease past VGPU_LEASE_HOLD_NS */
    uint64_t newcomers;  /* pods that began to ask after a second or more without (told) */
};
VGPU_REGION_API void vgpu_arbiter_read_stats(struct vgpu_arbiter *arbiter,
                                             struct vgpu_arbiter_stats *stats);

#endif
