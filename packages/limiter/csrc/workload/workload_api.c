/* Fills the workload's table of driver entry points by one of the three paths programs take:
 *   linked       addresses the dynamic linker resolved against libcuda.so.1 (or an interposer)
 *   dlopen       dlopen("libcuda.so.1") + dlsym of each ABI name, as loaders and ctypes do
 *   procaddress  dlsym of cuGetProcAddress_v2 only, then every entry by base name and version,
 *                as the CUDA runtime does */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include "workload.h"

#define DRIVER_SONAME "libcuda.so.1"

enum need { ALWAYS, GRAPH };

const char *cuda_result_name(CUresult result) {
    switch (result) {
#define RESULT_NAME(name, value) \
    case name: \
        return #name;
        VGPU_CU_RESULTS(RESULT_NAME)
#undef RESULT_NAME
    }
    return NULL;
}

static bool fail(struct load_error *error, CUresult result, const char *call, const char *detail) {
    error->result = result;
    snprintf(error->call, sizeof error->call, "%s", call);
    snprintf(error->detail, sizeof error->detail, "%s", detail != NULL ? detail : "");
    return false;
}

static bool load_linked(struct cuda_api *api, bool graph) {
    /* Taking the addresses here makes the linker bind them at start-up, like a program's
     * calls through the PLT: an interposer (LD_PRELOAD) is what they resolve to. */
#define LINKED(base, symbol, need) \
    if ((need) == ALWAYS || graph) { \
        api->base = &symbol; \
    }
    WORKLOAD_CALLS(LINKED)
#undef LINKED
    return true;
}

static void *open_driver(struct load_error *error) {
    void *handle = dlopen(DRIVER_SONAME, RTLD_NOW | RTLD_LOCAL);
    if (handle == NULL) {
        const char *reason = dlerror();
        fail(error, CUDA_ERROR_SHARED_OBJECT_INIT_FAILED, "dlopen(" DRIVER_SONAME ")", reason);
    }
    return handle;
}

static bool load_dlopen(struct cuda_api *api, bool graph, struct load_error *error) {
    void *handle = open_driver(error);
    if (handle == NULL) {
        return false;
    }
    void *address = NULL;
#define DLSYM(base, symbol, need) \
    if ((need) == ALWAYS || graph) { \
        address = dlsym(handle, #symbol); \
        if (address == NULL) { \
            return fail(error, CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND, "dlsym(" #symbol ")", \
                        dlerror()); \
        } \
        api->base = (__typeof__(api->base))address; \
    }
    WORKLOAD_CALLS(DLSYM)
#undef DLSYM
    return true;
}

static const char *query_result_name(CUdriverProcAddressQueryResult status) {
    switch (status) {
    case CU_GET_PROC_ADDRESS_SUCCESS:
        return "CU_GET_PROC_ADDRESS_SUCCESS";
    case CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND:
        return "CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND";
    case CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT:
        return "CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT";
    }
    return "unknown symbol status";
}

static bool load_procaddress(struct cuda_api *api, bool graph, int cuda_version,
                             struct load_error *error) {
    void *handle = open_driver(error);
    if (handle == NULL) {
        return false;
    }
    __typeof__(&cuGetProcAddress_v2) get_proc_address =
        (__typeof__(&cuGetProcAddress_v2))dlsym(handle, "cuGetProcAddress_v2");
    if (get_proc_address == NULL) {
        return fail(error, CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND, "dlsym(cuGetProcAddress_v2)",
                    dlerror());
    }
    void *address = NULL;
    CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SUCCESS;
    CUresult result = CUDA_SUCCESS;
    char detail[160];
#define PROCADDRESS(base, symbol, need) \
    if ((need) == ALWAYS || graph) { \
        address = NULL; \
        status = CU_GET_PROC_ADDRESS_SUCCESS; \
        result = get_proc_address(#base, &address, cuda_version, CU_GET_PROC_ADDRESS_DEFAULT, \
                                  &status); \
        if (result != CUDA_SUCCESS || status != CU_GET_PROC_ADDRESS_SUCCESS || address == NULL) { \
            snprintf(detail, sizeof detail, "cudaVersion %d: %s%s", cuda_version, \
                     query_result_name(status), address == NULL ? ", no address" : ""); \
            /* A driver that says success without an address is wrong too: report it. */ \
            return fail(error, result != CUDA_SUCCESS ? result : CUDA_ERROR_NOT_FOUND, \
                        "cuGetProcAddress_v2(" #base ")", detail); \
        } \
        api->base = (__typeof__(api->base))address; \
    }
    WORKLOAD_CALLS(PROCADDRESS)
#undef PROCADDRESS
    return true;
}

bool api_load(struct cuda_api *api, const struct options *options, bool graph,
              struct load_error *error) {
    memset(api, 0, sizeof *api);
    switch (options->path) {
    case PATH_LINKED:
        return load_linked(api, graph);
    case PATH_DLOPEN:
        return load_dlopen(api, graph, error);
    case PATH_PROCADDRESS:
        return load_procaddress(api, graph, options->cuda_version, error);
    }
    return fail(error, CUDA_ERROR_INVALID_VALUE, "api_load", "unknown path");
}
