/* Hook of cuCtxSetLimit. A larger malloc heap, printf FIFO or per-thread stack makes the driver
 * reserve device memory for the context at once. The pod is charged the increase over the value
 * the context had before its first change (which its overhead already covers): the heap and the
 * FIFO byte for byte, the stack once for every thread the device can hold resident (SMs × max
 * threads per SM, the most the driver can reserve). It is charged before the call, given back
 * when the value shrinks, and with everything else of the context when the context goes. */
#define _GNU_SOURCE
#include <pthread.h>

#include "core.h"
#include "ledger.h"
#include "log.h"
#include "vgpu_cuda_sizes.h"

/* One change at a time, so that two threads changing a limit agree on what is charged. */
static pthread_mutex_t limit_lock = PTHREAD_MUTEX_INITIALIZER;

/* A thread of the parent that held the lock at the fork left it held for good in the child. The
 * records it guards are the ledger's, which the child clears. */
void vgpu_limits_forget_in_child(void) {
    pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
    limit_lock = fresh;
}

/* Contexts are aligned heap objects and no device address shares a host address, so
 * context + 1 + limit is the key of no other record. */
static uint64_t limit_key(CUcontext context, CUlimit limit) {
    return (uint64_t)(uintptr_t)context + 1 + (uint64_t)limit;
}

/* Device memory one unit of the limit reserves (0: a limit that reserves none we charge). */
static CUresult bytes_per_unit(CUlimit limit, uint64_t *unit) {
    *unit = 0;
    if (limit == CU_LIMIT_MALLOC_HEAP_SIZE || limit == CU_LIMIT_PRINTF_FIFO_SIZE) {
        *unit = 1;
    } else if (limit == CU_LIMIT_STACK_SIZE) {
        CUdevice device;
        int sms = 0, threads = 0;
        CUresult result = VGPU_REAL(cuCtxGetDevice, &device);
        if (result == CUDA_SUCCESS) {
            result = VGPU_REAL(cuDeviceGetAttribute, &sms,
                               CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, device);
        }
        if (result == CUDA_SUCCESS) {
            result = VGPU_REAL(cuDeviceGetAttribute, &threads,
                               CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR, device);
        }
        if (result != CUDA_SUCCESS) {
            return result;
        }
        *unit = (uint64_t)(sms > 0 ? sms : 0) * (uint64_t)(threads > 0 ? threads : 0);
    }
    return CUDA_SUCCESS;
}

static uint64_t reservation(uint64_t baseline, size_t value, uint64_t unit) {
    if (value <= baseline) {
        return 0;
    }
    unsigned __int128 bytes = (unsigned __int128)(value - baseline) * unit;
    return bytes > UINT64_MAX - VGPU_PAGE_SIZE ? UINT64_MAX
                                              : vgpu_round_up((uint64_t)bytes, VGPU_PAGE_SIZE);
}

/* Under limit_lock: charge the change from `record`'s charge to what `value` reserves, make the
 * call, and keep the record of what stays charged. */
static CUresult change_limit(struct vgpu_record *record, CUlimit limit, size_t value,
                             uint64_t unit) {
    uint64_t after = reservation(record->link, value, unit);
    if (after > record->bytes && !vgpu_charge(record->entry, after - record->bytes)) {
        vgpu_log(VGPU_LOG_INFO, "a context limit of %zu reserving %llu bytes does not fit the "
                 "pod's limit", value, (unsigned long long)after);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    CUresult result = VGPU_REAL(cuCtxSetLimit, limit, value);
    if (result != CUDA_SUCCESS) {
        if (after > record->bytes) {
            vgpu_uncharge(record->entry, after - record->bytes);
        }
        return result;
    }
    if (after < record->bytes) {
        vgpu_uncharge(record->entry, record->bytes - after);
    }
    record->bytes = after;
    if (!vgpu_ledger_put(record)) {
        vgpu_log(VGPU_LOG_WARN, "out of memory recording a context limit; it stays charged");
    }
    return CUDA_SUCCESS;
}

CUresult cuCtxSetLimit(CUlimit limit, size_t value) {
    CUresult result = vgpu_cuda_ready();
    if (result != CUDA_SUCCESS) {
        return result;
    }
    CUcontext context = NULL;
    uint64_t unit = 0;
    int entry = vgpu_current_entry();
    if (entry < 0 || VGPU_REAL(cuCtxGetCurrent, &context) != CUDA_SUCCESS || context == NULL) {
        return VGPU_REAL(cuCtxSetLimit, limit, value); /* unlimited, or the driver's error */
    }
    if ((result = bytes_per_unit(limit, &unit)) != CUDA_SUCCESS) {
        return result;
    }
    if (unit == 0) {
        return VGPU_REAL(cuCtxSetLimit, limit, value);
    }
    pthread_mutex_lock(&limit_lock);
    struct vgpu_record record;
    if (!vgpu_ledger_get(limit_key(context, limit), &record)) {
        size_t current = 0;
        result = VGPU_REAL(cuCtxGetLimit, &current, limit);
        record = (struct vgpu_record){.key = limit_key(context, limit),
                                      .kind = VGPU_RECORD_LIMIT,
                                      .entry = entry,
                                      .context = context,
                                      .link = current};
    }
    if (result == CUDA_SUCCESS) {
        result = change_limit(&record, limit, value, unit);
    }
    pthread_mutex_unlock(&limit_lock);
    return result;
}
