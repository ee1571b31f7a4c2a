/* Parsing of user-facing values shared by the limiter and the simulated GPU. */
#ifndef VGPU_PARSE_H
#define VGPU_PARSE_H

#include <stdbool.h>
#include <stdint.h>

/* A byte size: digits with an optional fraction and unit, case-insensitive, spaces allowed
 * between number and unit. Binary units: Ki/KiB, Mi/MiB, Gi/GiB, Ti/TiB and the one-letter
 * k, m, g, t (as HAMi-core's "4g"); decimal units: KB, MB, GB, TB; "B" or none: bytes.
 * Returns false for anything else, a negative or empty number, or an overflow. */
bool vgpu_parse_size(const char *text, uint64_t *bytes);

/* A plain unsigned decimal integer, nothing around it. */
bool vgpu_parse_u64(const char *text, uint64_t *value);

#endif
