/* The program's errno through hooked calls that succeed, under libcuda_limiter.so on the
 * simulated GPU: the library's own work (the node's files it looks for, the processes it checks
 * for life) must leave it as the program set it. With argv[1] "leave" the program allocates and
 * exits holding its memory, so that the next one finds a dead process in the pod. Prints
 * "N passed, M failed". */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cuda_api.h"

static int passed;
static int failed;

#define KEEPS_ERRNO(call)                                                                    \
    do {                                                                                     \
        errno = 1234;                                                                        \
        CUresult result_ = (call);                                                           \
        if (result_ == CUDA_SUCCESS && errno == 1234) {                                      \
            passed++;                                                                        \
        } else {                                                                             \
            failed++;                                                                        \
            fprintf(stderr, "line %d: %s: result %d, errno %d\n", __LINE__, #call,          \
                    (int)result_, errno);                                                    \
        }                                                                                    \
    } while (0)

int main(int argc, char **argv) {
    CUcontext context = NULL;
    CUdeviceptr pointer = 0;
    size_t free_bytes = 0, total = 0;
    KEEPS_ERRNO(cuInit(0));
    KEEPS_ERRNO(cuCtxCreate_v2(&context, 0, 0));
    KEEPS_ERRNO(cuMemAlloc_v2(&pointer, 1 << 20));
    if (argc > 1 && strcmp(argv[1], "leave") == 0) {
        return 0; /* gone holding its memory */
    }
    sleep(2); /* past the interval at which the pod's dead processes are looked for */
    KEEPS_ERRNO(cuMemGetInfo_v2(&free_bytes, &total));
    KEEPS_ERRNO(cuMemAlloc_v2(&pointer, 1 << 20));
    KEEPS_ERRNO(cuMemFree_v2(pointer));
    KEEPS_ERRNO(cuCtxDestroy_v2(context));
    printf("%d passed, %d failed\n", passed, failed);
    return failed == 0 ? 0 : 1;
}
