/* What the lease arbiter may know of the process at the other end of a connection. */
#ifndef VGPU_ARBITER_PEER_H
#define VGPU_ARBITER_PEER_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

/* Whether process `pid` (in the daemon's pid namespace) holds the character device `device`
 * (st_rdev) open for reading or writing. */
bool vgpu_peer_holds_device(pid_t pid, uint64_t device);

#endif
