/* libadd_path: rewrite PATH, LD_PRELOAD and LD_LIBRARY_PATH from TF_* variables on load. */
#ifndef VGPU_ADD_PATH_H
#define VGPU_ADD_PATH_H

#define VGPU_EXPORT __attribute__((visibility("default")))

/* Merge rule for one variable.
 *   current    the variable's value now (NULL when unset); kept verbatim, in its order
 *   prepend    entries to put in front (NULL or "" for none)
 *   append     entries to put at the end (NULL or "" for none)
 *   separators characters that split entries (":" or, for LD_PRELOAD, ": ")
 * An entry is added only if it is not empty and not already present (in current or among the
 * entries added before it). New entries are joined with ':'.
 * Returns a malloc'd new value, or NULL when nothing is to be added (or memory ran out): then
 * the variable is left as it is. Free the result with vgpu_add_path_free. */
VGPU_EXPORT char *vgpu_add_path_merge(const char *current, const char *prepend, const char *append,
                                      const char *separators);

VGPU_EXPORT void vgpu_add_path_free(char *value);

/* Apply TF_<VAR> / TF_PREPEND_<VAR> to the process environment (what the constructor does). */
VGPU_EXPORT void vgpu_add_path_apply(void);

#endif
