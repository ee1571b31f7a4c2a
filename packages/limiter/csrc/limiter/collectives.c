/* Which kernels are a collective's (collectives.h). */
#include "collectives.h"

#include <stdlib.h>
#include <string.h>

static bool starts_with(const char *name, size_t length, const char *prefix) {
    size_t size = strlen(prefix);
    return length >= size && strncmp(name, prefix, size) == 0;
}

bool vgpu_collective_kernel_name(const char *name) {
    if (name == NULL) {
        return false;
    }
    size_t length = strlen(name);
    /* A global C++ function's mangled name is _Z, its identifier's length, the identifier and
     * its parameters (_Z39ncclDevKernel_AllReduce_Sum_f32_RING_LL24ncclDevKernelArgs...). */
    if (name[0] == '_' && name[1] == 'Z') {
        const char *digits = name + 2;
        char *end = NULL;
        unsigned long stated = *digits >= '1' && *digits <= '9' ? strtoul(digits, &end, 10) : 0;
        if (stated == 0 || stated > strlen(end)) {
            return false;
        }
        name = end;
        length = stated;
    }
    return starts_with(name, length, "ncclDevKernel_") || starts_with(name, length, "ncclKernel_");
}
