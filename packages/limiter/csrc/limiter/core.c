/* Setup of the limiter on the first CUDA or NVML call, and the mapping of devices to the pod
 * region. Loading the library does nothing: bash, python or any non-CUDA process that has it
 * preloaded is unaffected. */
#define _GNU_SOURCE
#include "core.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "compute_epochs.h"
#include "ledger.h"
#include "log.h"
#include "region.h"
#include "vgpu_proc.h"

struct vgpu_state vgpu_state;

static pthread_once_t ready_once = PTHREAD_ONCE_INIT;
static CUresult ready_result = CUDA_ERROR_NOT_INITIALIZED;
static pthread_mutex_t map_lock = PTHREAD_MUTEX_INITIALIZER;
static CUresult map_result = CUDA_SUCCESS;

static void forget_in_child(void) {
    /* A forked child is another process: its own slot, none of the parent's allocations, its
     * own pacing. It has one thread, so no lock that a thread of its parent held at the fork
     * can ever be let go there: each is made afresh. */
    vgpu_region_forget_in_child();
    vgpu_ledger_clear();
    vgpu_paced_forget_in_child();
    vgpu_pools_forget_in_child();
    vgpu_contexts_forget_in_child();
    vgpu_limits_forget_in_child();
    pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
    map_lock = fresh; /* a thread mapping the devices: the child maps them again if not done */
}

/* Without SHM_PATH or POD_NAME: a region private to this process tree. Children started from
 * here find it through SHM_PATH. */
static bool private_folder(char *folder, size_t size, char *error, size_t error_size) {
    int pid = (int)getpid();
    int length = snprintf(folder, size, "%s/vgpu-%d", vgpu_state.config.tmp_folder, (int)getuid());
    if (length < 0 || (size_t)length >= size) {
        snprintf(error, error_size, "TMPDIR: path too long for a private region");
        return false;
    }
    /* The user's folder, never one planted by someone else (a symlink, another owner). Where
     * one is (any user can make names in TMPDIR), a folder of an unguessable name is made
     * instead: refused, every CUDA program of this user failed to start. */
    if (!vgpu_region_private_folder(folder, error, error_size)) {
        length = snprintf(folder, size, "%s/vgpu-%d-XXXXXX", vgpu_state.config.tmp_folder,
                          (int)getuid());
        if (length < 0 || (size_t)length >= size || mkdtemp(folder) == NULL) {
            return false; /* the first problem is the one to say */
        }
        vgpu_log(VGPU_LOG_WARN, "%s; using %s", error, folder);
    }
    size_t used = strlen(folder);
    length = snprintf(folder + used, size - used, "/private-%d-%llu", pid,
                      (unsigned long long)vgpu_process_start_time(pid));
    if (length < 0 || (size_t)length >= size - used) {
        snprintf(error, error_size, "TMPDIR: path too long for a private region");
        return false;
    }
    setenv("SHM_PATH", folder, 1);
    return true;
}

static void setup(void) {
    char error[VGPU_CONFIG_ERROR_SIZE];
    struct timespec started;
    clock_gettime(CLOCK_MONOTONIC, &started);
    vgpu_state.started_ns =
        (uint64_t)started.tv_sec * 1000000000ULL + (uint64_t)started.tv_nsec;
    struct vgpu_config *config = &vgpu_state.config;
    for (int i = 0; i < VGPU_MAX_ORDINALS; i++) {
        vgpu_state.entries[i] = -1;
    }
    if (!vgpu_config_load(config, error, sizeof error)) {
        vgpu_log(VGPU_LOG_ERROR, "%s", error);
        ready_result = CUDA_ERROR_NOT_INITIALIZED;
        return;
    }
    vgpu_log_configure(config->log_level, config->log_path);
    for (unsigned i = 0; i < config->warning_count; i++) {
        vgpu_log(VGPU_LOG_WARN, "%s", config->warnings[i]);
    }
    vgpu_state.context_overhead = config->context_overhead;
    char folder[VGPU_CONFIG_PATH_SIZE];
    snprintf(folder, sizeof folder, "%s", config->pod_folder);
    if (folder[0] == '\0' && !private_folder(folder, sizeof folder, error, sizeof error)) {
        vgpu_log(VGPU_LOG_ERROR, "%s", error);
        ready_result = CUDA_ERROR_NOT_INITIALIZED;
        return;
    }
    /* A region the daemon must have made is never made here: it would hold no limit. It may
     * come a moment after the container starts (TF_REGION_WAIT). */
    if (config->region_required && config->region_wait_s > 0 &&
        !vgpu_region_await(folder, config->region_wait_s, error, sizeof error)) {
        vgpu_log(VGPU_LOG_ERROR, "%s", error);
        ready_result = CUDA_ERROR_NOT_INITIALIZED;
        return;
    }
    vgpu_state.region = vgpu_region_open(folder, config->pod_namespace, config->pod_name,
                                         !config->region_required, error, sizeof error);
    if (vgpu_state.region == NULL) {
        vgpu_log(VGPU_LOG_ERROR, "%s%s", error,
                 config->region_required
                     ? " (TF_REGION_REQUIRED: the node daemon makes the pod's region before its "
                       "containers start, and none is made here; is tf-hypervisor running?)"
                     : "");
        ready_result = CUDA_ERROR_NOT_INITIALIZED;
        return;
    }
    pthread_atfork(NULL, NULL, forget_in_child);
    ready_result = CUDA_SUCCESS;
}

CUresult vgpu_ready(void) {
    pthread_once(&ready_once, setup);
    return ready_result;
}

CUresult vgpu_cuda_ready(void) {
    if (__atomic_load_n(&vgpu_state.cuda_ready, __ATOMIC_ACQUIRE)) {
        return CUDA_SUCCESS; /* one load where three once-controls and flags were read */
    }
    CUresult result = vgpu_ready();
    result = result != CUDA_SUCCESS ? result
             : vgpu_load_cuda()     ? CUDA_SUCCESS
                                    : CUDA_ERROR_NOT_INITIALIZED;
    if (result == CUDA_SUCCESS) {
        __atomic_store_n(&vgpu_state.cuda_ready, true, __ATOMIC_RELEASE);
    }
    return result;
}

static void format_uuid(const CUuuid *uuid, char *text, size_t size) {
    const unsigned char *b = (const unsigned char *)uuid->bytes;
    snprintf(text, size,
             "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0],
             b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13],
             b[14], b[15]);
}

/* Seed one device's entry; false (after a logged error) on an index/UUID conflict. In a
 * confined pod a GPU without an entry gets none: *entry_out is VGPU_ENTRY_OUTSIDE. */
static bool seed(int ordinal, const char *uuid, bool confined, int *entry_out) {
    struct vgpu_device_limits limits;
    char error[VGPU_CONFIG_ERROR_SIZE];
    if (!vgpu_config_device_limits(&vgpu_state.config, ordinal, uuid, &limits, error,
                                   sizeof error)) {
        vgpu_log(VGPU_LOG_ERROR, "%s", error);
        return false;
    }
    int entry = vgpu_region_device(vgpu_state.region, uuid, !confined);
    if (entry < 0 && confined) {
        char device[32] = "";
        if (ordinal >= 0) {
            snprintf(device, sizeof device, "device %d ", ordinal);
        }
        /* A limit the environment gives such a GPU is dropped with this line, not silently. */
        vgpu_log(VGPU_LOG_WARN, "%s(%s) is not one of the GPUs of pod %s/%s: no context on it",
                 device, uuid, vgpu_state.region->pod_namespace, vgpu_state.region->pod_name);
        *entry_out = VGPU_ENTRY_OUTSIDE;
        return true;
    }
    if (entry < 0) {
        vgpu_log(VGPU_LOG_ERROR,
                 entry == VGPU_REGION_FULL
                     ? "the pod region has no room for %s"
                     : "cannot add %s to the pod region: its writers' lock cannot be taken",
                 uuid);
        return limits.memory_limit == 0 && limits.compute_limit == 0;
    }
    struct vgpu_region_limits wanted = {
        .memory_limit = limits.memory_limit,
        .compute_limit = limits.compute_limit,
        .compute_soft_limit = limits.compute_soft_limit,
        .device_flags = limits.oversubscribe ? VGPU_DEVICE_OVERSUBSCRIBE : 0,
    };
    vgpu_region_seed_limits(vgpu_state.region, entry, &wanted);
    uint64_t memory;
    uint32_t compute;
    vgpu_region_limits(vgpu_state.region, entry, &memory, &compute);
    /* The region is the pod's truth; an environment that says otherwise is told so. */
    if (limits.memory_limit != 0 && memory != limits.memory_limit) {
        vgpu_log(VGPU_LOG_WARN,
                 "%s: memory limit %llu bytes for %s differs from the pod region's %llu bytes; "
                 "the region's applies",
                 limits.memory_source, (unsigned long long)limits.memory_limit, uuid,
                 (unsigned long long)memory);
    }
    if (limits.compute_limit != 0 && compute != limits.compute_limit) {
        vgpu_log(VGPU_LOG_WARN,
                 "%s: compute limit %u.%02u%% for %s differs from the pod region's %u.%02u%%; "
                 "the region's applies",
                 limits.compute_source, limits.compute_limit / 100, limits.compute_limit % 100,
                 uuid, compute / 100, compute % 100);
    }
    vgpu_log(VGPU_LOG_DEBUG, "device %d is %s: memory limit %llu bytes", ordinal, uuid,
             (unsigned long long)memory);
    *entry_out = entry;
    return true;
}

VGPU_COLD CUresult vgpu_map_devices(void) {
    CUresult result = vgpu_cuda_ready();
    if (result != CUDA_SUCCESS) {
        return result;
    }
    pthread_mutex_lock(&map_lock);
    if (!vgpu_state.mapped) {
        int count = 0;
        char uuids[VGPU_MAX_ORDINALS][VGPU_CONFIG_UUID_SIZE];
        bool confined = vgpu_pod_confined();
        map_result = VGPU_REAL(cuDeviceGetCount, &count);
        for (int ordinal = 0; map_result == CUDA_SUCCESS && ordinal < count &&
                              ordinal < VGPU_MAX_ORDINALS;
             ordinal++) {
            CUuuid uuid;
            char *text = uuids[ordinal];
            map_result = VGPU_REAL(cuDeviceGetUuid_v2, &uuid, ordinal);
            if (map_result != CUDA_SUCCESS) {
                break;
            }
            format_uuid(&uuid, text, VGPU_CONFIG_UUID_SIZE);
            if (!seed(ordinal, text, confined, &vgpu_state.entries[ordinal])) {
                map_result = CUDA_ERROR_INVALID_VALUE; /* fail closed on a contradiction */
            }
        }
        /* UUID limits of GPUs this process does not see still belong to the pod. */
        for (unsigned i = 0; map_result == CUDA_SUCCESS && i < vgpu_state.config.count; i++) {
            const struct vgpu_device_setting *setting = &vgpu_state.config.settings[i];
            int entry;
            if (setting->kind == VGPU_KEY_UUID &&
                vgpu_region_device(vgpu_state.region, setting->uuid, false) < 0 &&
                !seed(-1, setting->uuid, confined, &entry)) {
                map_result = CUDA_ERROR_INVALID_VALUE;
            }
        }
        if (map_result == CUDA_SUCCESS) {
            unsigned before = vgpu_state.config.warning_count;
            vgpu_config_check_devices(&vgpu_state.config,
                                      count < VGPU_MAX_ORDINALS ? count : VGPU_MAX_ORDINALS,
                                      uuids);
            for (unsigned i = before; i < vgpu_state.config.warning_count; i++) {
                vgpu_log(VGPU_LOG_WARN, "%s", vgpu_state.config.warnings[i]);
            }
        }
        vgpu_state.ordinal_count = count;
        __atomic_store_n(&vgpu_state.mapped, map_result == CUDA_SUCCESS, __ATOMIC_RELEASE);
    }
    result = map_result;
    pthread_mutex_unlock(&map_lock);
    return result;
}

int vgpu_entry_of(int ordinal) {
    if (VGPU_RARELY(!__atomic_load_n(&vgpu_state.mapped, __ATOMIC_ACQUIRE)) &&
        vgpu_map_devices() != CUDA_SUCCESS) {
        return -1;
    }
    return ordinal >= 0 && ordinal < vgpu_state.ordinal_count ? vgpu_state.entries[ordinal] : -1;
}

int vgpu_entry_at(const CUmemLocation *location) {
    return location != NULL && location->type == CU_MEM_LOCATION_TYPE_DEVICE
               ? vgpu_entry_of(location->id)
               : -1;
}

int vgpu_current_entry(void) {
    CUdevice device;
    if (VGPU_REAL(cuCtxGetDevice, &device) != CUDA_SUCCESS) {
        return -1;
    }
    return vgpu_entry_of(device);
}

uint64_t vgpu_memory_limit(int entry) {
    uint64_t memory;
    uint32_t compute;
    vgpu_region_limits(vgpu_state.region, entry, &memory, &compute);
    return memory;
}

uint64_t vgpu_memory_used(int entry) {
    vgpu_region_sweep(vgpu_state.region); /* what the view shows excludes dead processes */
    return atomic_load(&vgpu_state.region->devices[entry].memory_used);
}

/* `bytes` as a person reads a size: "512 MiB", "1.5 GiB". */
static void show_size(uint64_t bytes, char *out, size_t size) {
    static const char *const units[] = {"bytes", "KiB", "MiB", "GiB", "TiB"};
    unsigned unit = 0;
    double value = (double)bytes;
    while (value >= 1024.0 && unit + 1 < sizeof units / sizeof units[0]) {
        value /= 1024.0;
        unit++;
    }
    snprintf(out, size, value == (double)(uint64_t)value ? "%.0f %s" : "%.2f %s", value,
             units[unit]);
}

/* A refused allocation says so on the program's stderr (a plain out-of-memory error says
 * nothing of a limit), at most once every REFUSAL_EVERY_NS per process. */
#define REFUSAL_EVERY_NS 10000000000ULL
static void say_refused(int entry, uint64_t bytes) {
    static _Atomic uint64_t next_ns;
    struct timespec clock;
    clock_gettime(CLOCK_MONOTONIC, &clock);
    uint64_t now = (uint64_t)clock.tv_sec * 1000000000ULL + (uint64_t)clock.tv_nsec;
    uint64_t due = atomic_load(&next_ns);
    if (now < due || !atomic_compare_exchange_strong(&next_ns, &due, now + REFUSAL_EVERY_NS)) {
        return;
    }
    const struct vgpu_region *region = vgpu_state.region;
    uint64_t limit;
    uint32_t compute;
    vgpu_region_limits(region, entry, &limit, &compute);
    char asked[32], used[32], limited[32], context[32];
    show_size(bytes, asked, sizeof asked);
    show_size(atomic_load(&region->devices[entry].memory_used), used, sizeof used);
    show_size(limit, limited, sizeof limited);
    show_size(vgpu_state.context_overhead, context, sizeof context);
    vgpu_log(VGPU_LOG_WARN,
             "%.48s: %s refused: pod %.64s/%.64s holds %s of its %s limit (each CUDA context "
             "counts at least %s); raise the pod's memory limit or use less (TF_LOG_LEVEL=error "
             "silences this)",
             region->devices[entry].uuid, asked, region->pod_namespace, region->pod_name, used,
             limited, context);
}

bool vgpu_charge(int entry, uint64_t bytes) {
    if (entry < 0 || bytes == 0 || vgpu_region_reserve(vgpu_state.region, entry, bytes, true)) {
        return true;
    }
    say_refused(entry, bytes);
    return false;
}

bool vgpu_try_charge(int entry, uint64_t bytes) {
    return entry < 0 || bytes == 0 || vgpu_region_reserve(vgpu_state.region, entry, bytes, false);
}

void vgpu_uncharge(int entry, uint64_t bytes) {
    if (entry >= 0 && bytes != 0) {
        vgpu_region_release(vgpu_state.region, entry, bytes);
    }
}
