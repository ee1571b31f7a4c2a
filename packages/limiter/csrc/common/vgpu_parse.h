/* Parsing of user-facing values shared by the limiter and the simulated GPU. */
#ifndef VGPU_PARSE_H
#define VGPU_PARSE_H

#include <stdbool.h>
#include <stdint.h>

/* A byte size, the one grammar of sizes in vgpu (the Python parser follows it): ASCII white
 * space around; decimal digits with an optional fraction (digits on both sides of the '.');
 * optional ASCII white space; an optional unit, any case: Ki/KiB, Mi/MiB, Gi/GiB, Ti/TiB and
 * the one-letter k, m, g, t (as HAMi-core's "4g") are binary; KB, MB, GB, TB decimal; "B" or
 * none: bytes. The value must be a whole number of bytes, exactly: no rounding, so "1.5KiB" is
 * 1536 and "0.1KiB" (102.4 bytes) or "4.0000001GiB" are refused, as is anything above
 * 2^64 - 1. Returns false for anything else; 0 is a size (callers that need a limit refuse
 * it). */
bool vgpu_parse_size(const char *text, uint64_t *bytes);

/* A pod namespace, pod or container name as the node daemon accepts it (and as
 * vgpu_limiter.region.check_name): 1-253 ASCII letters, digits, '.', '_' and '-', not starting
 * with '.' or '-'. So every pod a worker runs in is one the daemon can list, and a name is one
 * plain folder name ("..", ".devices" and "-rf" are not). */
#define VGPU_NAME_MAX 253
bool vgpu_valid_name(const char *text);

/* A plain unsigned decimal integer, nothing around it. */
bool vgpu_parse_u64(const char *text, uint64_t *value);

#endif
