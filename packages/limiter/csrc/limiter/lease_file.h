/* Opening the lease folder and its files safely (docs/security.md, device leases): no symlink followed,
 * the type, links, owner and mode checked on the opened file before it is used, space allocated
 * before it is mapped. Each call that fails writes why into `why` (one line). */
#ifndef VGPU_LIMITER_LEASE_FILE_H
#define VGPU_LIMITER_LEASE_FILE_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

struct vgpu_device_lease;
struct vgpu_device_node;

enum vgpu_lease_folder_kind {
    VGPU_FOLDER_LEASES,  /* {base}/.devices: made 03770 when missing */
    VGPU_FOLDER_PRIVATE, /* this user's fallback: made 0700, must be this user's alone */
    VGPU_FOLDER_NODE,    /* {base}/.node, the daemon's: never made here, writable by its owner alone */
};

/* The folder at `path` as a directory fd, and its owner. Refused: a symlink, a world-writable
 * folder, and what `kind` forbids. */
int vgpu_lease_folder(const char *path, enum vgpu_lease_folder_kind kind, uid_t *owner, char *why,
                      size_t why_size);

/* The lease file `name` of the folder, mapped read-write; made (0660, space allocated) when
 * missing. NULL when it is not a lease the rules allow. */
struct vgpu_device_lease *vgpu_lease_map(int folder, const char *name, char *why, size_t why_size);

/* The daemon's node file `name` of the node folder, mapped read-only, when it exists and belongs
 * to root or the folder's owner, who alone may write it. */
const struct vgpu_device_node *vgpu_lease_map_node(int folder, uid_t folder_owner,
                                                   const char *name, char *why, size_t why_size);

#endif
