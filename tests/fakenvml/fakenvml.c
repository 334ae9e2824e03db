/*
 * fakenvml: a test stand-in for libnvidia-ml.so.1.
 *
 * The real pynvml binding (PyPI nvidia-ml-py) loads this library with
 * CDLL("libnvidia-ml.so.1") when LD_LIBRARY_PATH points at its directory.
 * Device and process state comes from a plain-text file named by the
 * environment variable TRAINGUARD_FAKE_NVML_STATE. Every nvmlInit* call and
 * every query stat()s the file and re-parses it when it changed (see
 * load_state), so a test can rewrite it (temp file + rename) while the
 * process under test keeps NVML initialised, and a call costs about what a
 * driver's does when it did not change.
 *
 * The file format and the list of implemented symbols are documented in
 * README.md next to this file. Only the entry points that pynvml resolves
 * for the queries trainguard makes are implemented; everything else is
 * absent, which pynvml reports as NVMLError_FunctionNotFound, exactly as
 * with a real driver that is too old for a call.
 *
 * Every exported function takes one global mutex for its whole duration:
 * the exporter's HTTP server may query from several threads at once.
 */
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#define STATE_ENV "TRAINGUARD_FAKE_NVML_STATE"
#define LOG_ENV "TRAINGUARD_FAKE_NVML_LOG"

#define MAX_GPUS 128
#define FAKE_NVLINKS 18        /* NVML_NVLINK_MAX_LINKS of an H100 (the header says 36 now) */
#define FAKE_NVLINK_COUNTERS 4 /* DL_REPLAY, DL_RECOVERY, DL_CRC_FLIT, DL_CRC_DATA */
#define MAX_PROCS 1000000 /* total over all GPUs; a guard against runaway files */
#define MAX_FAILS 256
#define MAX_XIDS 4096     /* `xid` lines in one state file */
#define MAX_EVENT_SETS 64 /* event sets alive at once */
#define EVENT_POLL_MS 50  /* how often a waiting nvmlEventSetWait_v2 looks again */
#define STR_MAX 128 /* driver/NVML version, GPU name, UUID (after unescaping) */
#define SYM_MAX 96

#define NA_ULL 0xFFFFFFFFFFFFFFFFULL /* NVML_VALUE_NOT_AVAILABLE, 64-bit */
#define NA_UINT 0xFFFFFFFFU          /* NVML_VALUE_NOT_AVAILABLE, 32-bit */

typedef enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NO_PERMISSION = 4,
    NVML_ERROR_ALREADY_INITIALIZED = 5,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_INSUFFICIENT_POWER = 8,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_TIMEOUT = 10,
    NVML_ERROR_IRQ_ISSUE = 11,
    NVML_ERROR_LIBRARY_NOT_FOUND = 12,
    NVML_ERROR_FUNCTION_NOT_FOUND = 13,
    NVML_ERROR_CORRUPTED_INFOROM = 14,
    NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_RESET_REQUIRED = 16,
    NVML_ERROR_OPERATING_SYSTEM = 17,
    NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18,
    NVML_ERROR_IN_USE = 19,
    NVML_ERROR_MEMORY = 20,
    NVML_ERROR_NO_DATA = 21,
    NVML_ERROR_VGPU_ECC_NOT_SUPPORTED = 22,
    NVML_ERROR_INSUFFICIENT_RESOURCES = 23,
    NVML_ERROR_FREQ_NOT_SUPPORTED = 24,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
    NVML_ERROR_DEPRECATED = 26,
    NVML_ERROR_NOT_READY = 27,
    NVML_ERROR_GPU_NOT_FOUND = 28,
    NVML_ERROR_INVALID_STATE = 29,
    NVML_ERROR_RESET_TYPE_NOT_SUPPORTED = 30,
    NVML_ERROR_UNKNOWN = 999
} nvmlReturn_t;

/* Names accepted in the state file (`init`, `error=`, `fail`) and the
 * strings nvmlErrorString returns (the real library's wording). */
static const struct {
    nvmlReturn_t code;
    const char *name;
    const char *text;
} ERRORS[] = {
    {NVML_SUCCESS, "success", "Success"},
    {NVML_ERROR_UNINITIALIZED, "uninitialized", "Uninitialized"},
    {NVML_ERROR_INVALID_ARGUMENT, "invalid_argument", "Invalid Argument"},
    {NVML_ERROR_NOT_SUPPORTED, "not_supported", "Not Supported"},
    {NVML_ERROR_NO_PERMISSION, "no_permission", "Insufficient Permissions"},
    {NVML_ERROR_ALREADY_INITIALIZED, "already_initialized", "Already Initialized"},
    {NVML_ERROR_NOT_FOUND, "not_found", "Not Found"},
    {NVML_ERROR_INSUFFICIENT_SIZE, "insufficient_size", "Insufficient Size"},
    {NVML_ERROR_INSUFFICIENT_POWER, "insufficient_power", "Insufficient External Power"},
    {NVML_ERROR_DRIVER_NOT_LOADED, "driver_not_loaded", "Driver Not Loaded"},
    {NVML_ERROR_TIMEOUT, "timeout", "Timeout"},
    {NVML_ERROR_IRQ_ISSUE, "irq_issue", "Interrupt Request Issue"},
    {NVML_ERROR_LIBRARY_NOT_FOUND, "library_not_found", "NVML Shared Library Not Found"},
    {NVML_ERROR_FUNCTION_NOT_FOUND, "function_not_found", "Function Not Found"},
    {NVML_ERROR_CORRUPTED_INFOROM, "corrupted_inforom", "Corrupted infoROM"},
    {NVML_ERROR_GPU_IS_LOST, "gpu_is_lost", "GPU is lost"},
    {NVML_ERROR_RESET_REQUIRED, "reset_required", "GPU requires restart"},
    {NVML_ERROR_OPERATING_SYSTEM, "operating_system",
     "The operating system has blocked the request."},
    {NVML_ERROR_LIB_RM_VERSION_MISMATCH, "lib_rm_version_mismatch",
     "RM has detected an NVML/RM version mismatch."},
    {NVML_ERROR_IN_USE, "in_use", "In use by another client"},
    {NVML_ERROR_MEMORY, "memory", "Insufficient Memory"},
    {NVML_ERROR_NO_DATA, "no_data", "No data"},
    {NVML_ERROR_VGPU_ECC_NOT_SUPPORTED, "vgpu_ecc_not_supported",
     "ECC is not supported in vGPU mode"},
    {NVML_ERROR_INSUFFICIENT_RESOURCES, "insufficient_resources", "Insufficient resources"},
    {NVML_ERROR_FREQ_NOT_SUPPORTED, "freq_not_supported", "Frequency not supported"},
    {NVML_ERROR_ARGUMENT_VERSION_MISMATCH, "argument_version_mismatch",
     "Argument version mismatch"},
    {NVML_ERROR_DEPRECATED, "deprecated", "Deprecated"},
    {NVML_ERROR_NOT_READY, "not_ready", "Not ready"},
    {NVML_ERROR_GPU_NOT_FOUND, "gpu_not_found", "GPU not found"},
    {NVML_ERROR_INVALID_STATE, "invalid_state", "Invalid state"},
    {NVML_ERROR_RESET_TYPE_NOT_SUPPORTED, "reset_type_not_supported",
     "Reset type not supported"},
    {NVML_ERROR_UNKNOWN, "unknown", "Unknown Error"},
};

/* ---- public structs (layouts as in nvml.h / pynvml) ---- */

typedef struct {
    unsigned long long total, free, used;
} nvmlMemory_t;

typedef struct {
    unsigned int version;
    unsigned long long total, reserved, free, used;
} nvmlMemory_v2_t;
#define nvmlMemory_v2 ((unsigned int)(sizeof(nvmlMemory_v2_t) | (2u << 24)))

typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
} nvmlProcessInfo_v1_t;

typedef struct { /* nvmlProcessInfo_v2_t == nvmlProcessInfo_t (v3 API) */
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlProcessInfo_v2_t;

typedef struct {
    unsigned int gpu, memory;
} nvmlUtilization_t;

#define nvmlEventTypeSingleBitEccError 0x1ULL
#define nvmlEventTypeDoubleBitEccError 0x2ULL
#define nvmlEventTypePState 0x4ULL
#define nvmlEventTypeXidCriticalError 0x8ULL
#define nvmlEventTypeClock 0x10ULL
/* what a data-centre GPU on Linux supports (the default of `events=`) */
#define DEFAULT_EVENTS                                                                             \
    (nvmlEventTypeSingleBitEccError | nvmlEventTypeDoubleBitEccError | nvmlEventTypePState |       \
     nvmlEventTypeXidCriticalError | nvmlEventTypeClock)

typedef struct {
    unsigned int version;
    unsigned int sensorType;
    int temperature;
} nvmlTemperature_v1_t;
#define nvmlTemperature_v1 ((unsigned int)(sizeof(nvmlTemperature_v1_t) | (1u << 24)))

/* Opaque handles: pointers into a static array, valid for the life of the
 * process whatever the state file says later. */
struct fake_device {
    unsigned int index;
};
typedef struct fake_device *nvmlDevice_t;
static struct fake_device g_handles[MAX_GPUS];

/* nvmlEventData_t as nvmlEventSetWait_v2 fills it (pynvml's c_nvmlEventData_t). */
typedef struct {
    nvmlDevice_t device;
    unsigned long long eventType;
    unsigned long long eventData;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlEventData_t;

/* Event sets: a static pool, so a set is a stable pointer whatever the state
 * file says; each remembers the event types registered per device. */
struct fake_event_set {
    int in_use;
    unsigned long long types[MAX_GPUS];
};
typedef struct fake_event_set *nvmlEventSet_t;
static struct fake_event_set g_sets[MAX_EVENT_SETS];

/* ---- state ---- */

enum proc_kind { KIND_COMPUTE = 0, KIND_GRAPHICS = 1, KIND_MPS = 2 };

struct gpu {
    int present;
    char uuid[STR_MAX];
    char name[STR_MAX];
    unsigned long long total, used, reserved;
    nvmlReturn_t error; /* NVML_SUCCESS or what every query on it returns */
    unsigned int temp, util_gpu, util_mem;
    unsigned long long events; /* nvmlDeviceGetSupportedEventTypes */
    /* health: see README.md (keys `reasons`, `pcie_*`, `power*`, `ecc_*`, `remap_*`, `temp_*`) */
    unsigned long long reasons; /* nvmlClocksEventReason* bits; NA_ULL until set: derived */
    unsigned int pcie_gen, pcie_max_gen, pcie_gpu_max_gen, pcie_width, pcie_max_width;
    unsigned int power_mw, power_limit_mw;
    unsigned long long ecc[2][2]; /* [errorType: corrected, uncorrected][counter: volatile, aggregate] */
    unsigned int remap_corr, remap_unc, remap_pending, remap_failure;
    unsigned int temp_slowdown, temp_shutdown;
    /* page retirement (before Ampere; `retirement=1`, then no row remapping) and NVLink */
    unsigned int retirement, retired[2], retired_pending;
    unsigned int nvlinks, nvlink_down;                        /* links 0..nvlinks-1; down: mask */
    unsigned long long nvlink_err[FAKE_NVLINKS][FAKE_NVLINK_COUNTERS]; /* replay, recovery, crc */
};

/* `xid GPU CODE id=N`: one critical-Xid event on GPU, delivered once per process. */
struct xid {
    unsigned int gpu;
    unsigned long long code;
    unsigned int id;
};

struct proc {
    unsigned int gpu;
    enum proc_kind kind;
    unsigned int pid;
    unsigned long long used;
    unsigned int gi, ci;
};

struct fail {
    char symbol[SYM_MAX];
    int gpu; /* -1: every device, and system-level calls */
    nvmlReturn_t error;
};

/* `hang SYMBOL MS`: the call sleeps MS milliseconds holding the library's lock,
 * like a driver stuck on a GPU in a bad state (every other call waits too). */
struct hang {
    char symbol[SYM_MAX];
    unsigned int ms;
};

struct state {
    char driver[STR_MAX];
    char nvml[STR_MAX]; /* empty: derived from driver */
    int cuda;
    nvmlReturn_t init_result;
    unsigned int ngpus;
    struct gpu gpus[MAX_GPUS];
    size_t nprocs, cap_procs;
    struct proc *procs;
    size_t nfails;
    struct fail fails[MAX_FAILS];
    size_t nhangs;
    struct hang hangs[MAX_FAILS];
    size_t nxids;
    struct xid xids[MAX_XIDS];
};

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static unsigned int g_refcount; /* nvmlInit ref count */
static struct state g_state;    /* reused buffer; only valid under g_lock */
/* ids of the `xid` events already delivered: the state file is re-parsed when
 * the file changed, so this is what makes each event arrive once */
static unsigned int *g_consumed;
static size_t g_nconsumed, g_cap_consumed;

/* What g_state was parsed from, so that a call re-parses only when the file
 * changed. Only a successful parse is cached: a missing or malformed file is
 * looked at (and warned about) again at every call, as before. */
#define RACY_NS 200000000LL /* see state_unchanged() */
static struct {
    int valid;
    char path[PATH_MAX];
    dev_t dev;
    ino_t ino;
    off_t size;
    long long mtime_ns, ctime_ns;
    long long parsed_ns; /* CLOCK_REALTIME when the parse began */
} g_cache;

static void warn(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("fakenvml: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

static int error_by_name(const char *name, nvmlReturn_t *out) {
    size_t i;
    char *end;
    long v;
    for (i = 0; i < sizeof(ERRORS) / sizeof(ERRORS[0]); i++) {
        if (strcmp(ERRORS[i].name, name) == 0) {
            *out = ERRORS[i].code;
            return 0;
        }
    }
    errno = 0;
    v = strtol(name, &end, 10); /* a bare numeric code is accepted too */
    if (*name && !*end && !errno && v >= 0 && v <= INT_MAX) {
        *out = (nvmlReturn_t)v;
        return 0;
    }
    return -1;
}

static int parse_ull(const char *s, unsigned long long *out, int allow_na) {
    char *end;
    if (allow_na && strcmp(s, "NA") == 0) {
        *out = NA_ULL;
        return 0;
    }
    if (!*s || *s == '-' || *s == '+')
        return -1;
    errno = 0;
    *out = strtoull(s, &end, 0);
    return (*end || errno) ? -1 : 0;
}

static int parse_uint(const char *s, unsigned int *out, int allow_na) {
    unsigned long long v;
    if (allow_na && strcmp(s, "NA") == 0) {
        *out = NA_UINT;
        return 0;
    }
    if (parse_ull(s, &v, 0) || v > 0xFFFFFFFFULL)
        return -1;
    *out = (unsigned int)v;
    return 0;
}

static int hexval(char c) {
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* Strings in the file: '_' is a space, %XX is the byte XX. */
static int unescape(const char *s, char *out, size_t cap) {
    size_t n = 0;
    while (*s) {
        char c = *s++;
        if (c == '_') {
            c = ' ';
        } else if (c == '%') {
            int hi = hexval(s[0]), lo = hi < 0 ? -1 : hexval(s[1]);
            if (hi < 0 || lo < 0 || (hi == 0 && lo == 0))
                return -1;
            c = (char)(hi * 16 + lo);
            s += 2;
        }
        if (n + 1 >= cap)
            return -1;
        out[n++] = c;
    }
    out[n] = '\0';
    return 0;
}

/* Split `key=value`; returns the value or NULL. */
static char *split_kv(char *tok) {
    char *eq = strchr(tok, '=');
    if (!eq)
        return NULL;
    *eq = '\0';
    return eq + 1;
}

static void reset_state(struct state *st) {
    struct proc *procs = st->procs;
    size_t cap = st->cap_procs;
    memset(st, 0, sizeof(*st));
    st->procs = procs;
    st->cap_procs = cap;
    strcpy(st->driver, "550.54.15");
    st->cuda = 12040;
    st->init_result = NVML_SUCCESS;
}

#define PARSE_FAIL(...)                                                                            \
    do {                                                                                           \
        warn("%s:%u: " __VA_ARGS__);                                                               \
        goto bad;                                                                                  \
    } while (0)

static int parse_flag(const char *s, unsigned int *out) {
    if (strcmp(s, "0") && strcmp(s, "1"))
        return -1;
    *out = (unsigned int)(s[0] - '0');
    return 0;
}

/* `retirement`, `retired_sbe`, `retired_dbe`, `retired_pending`, `nvlinks`, `nvlink_down`,
 * `nvlinkL_{replay,recovery,crc_flit,crc_data}`; nonzero for an unknown key or a bad value. */
static int parse_retirement_nvlink(struct gpu *g, const char *key, const char *val) {
    static const char *const counters[FAKE_NVLINK_COUNTERS] = {"replay", "recovery", "crc_flit",
                                                               "crc_data"};
    unsigned int link, c;
    int used = 0;
    char rest[16];
    if (!strcmp(key, "retirement"))
        return parse_flag(val, &g->retirement);
    if (!strcmp(key, "retired_sbe"))
        return parse_uint(val, &g->retired[0], 0) || g->retired[0] > 4096;
    if (!strcmp(key, "retired_dbe"))
        return parse_uint(val, &g->retired[1], 0) || g->retired[1] > 4096;
    if (!strcmp(key, "retired_pending"))
        return parse_flag(val, &g->retired_pending);
    if (!strcmp(key, "nvlinks"))
        return parse_uint(val, &g->nvlinks, 0) || g->nvlinks > FAKE_NVLINKS;
    if (!strcmp(key, "nvlink_down"))
        return parse_uint(val, &g->nvlink_down, 0);
    if (sscanf(key, "nvlink%u_%15s%n", &link, rest, &used) == 2 && key[used] == '\0' &&
        link < FAKE_NVLINKS)
        for (c = 0; c < FAKE_NVLINK_COUNTERS; c++)
            if (!strcmp(rest, counters[c]))
                return parse_ull(val, &g->nvlink_err[link][c], 0);
    return 1;
}

/* The health keys of a `gpu` line; returns nonzero for an unknown key or a bad value. */
static int parse_health(struct gpu *g, const char *key, const char *val) {
    if (!strcmp(key, "reasons"))
        return parse_ull(val, &g->reasons, 0) || g->reasons == NA_ULL;
    if (!strcmp(key, "pcie_gen"))
        return parse_uint(val, &g->pcie_gen, 0);
    if (!strcmp(key, "pcie_max_gen"))
        return parse_uint(val, &g->pcie_max_gen, 0);
    if (!strcmp(key, "pcie_gpu_max_gen"))
        return parse_uint(val, &g->pcie_gpu_max_gen, 0) || g->pcie_gpu_max_gen == NA_UINT;
    if (!strcmp(key, "pcie_width"))
        return parse_uint(val, &g->pcie_width, 0);
    if (!strcmp(key, "pcie_max_width"))
        return parse_uint(val, &g->pcie_max_width, 0);
    if (!strcmp(key, "power"))
        return parse_uint(val, &g->power_mw, 0);
    if (!strcmp(key, "power_limit"))
        return parse_uint(val, &g->power_limit_mw, 0);
    if (!strcmp(key, "ecc_corrected"))
        return parse_ull(val, &g->ecc[0][0], 0);
    if (!strcmp(key, "ecc_uncorrected"))
        return parse_ull(val, &g->ecc[1][0], 0);
    if (!strcmp(key, "ecc_corrected_aggregate"))
        return parse_ull(val, &g->ecc[0][1], 0) || g->ecc[0][1] == NA_ULL;
    if (!strcmp(key, "ecc_uncorrected_aggregate"))
        return parse_ull(val, &g->ecc[1][1], 0) || g->ecc[1][1] == NA_ULL;
    if (!strcmp(key, "remap_corrected"))
        return parse_uint(val, &g->remap_corr, 0);
    if (!strcmp(key, "remap_uncorrected"))
        return parse_uint(val, &g->remap_unc, 0);
    if (!strcmp(key, "remap_pending"))
        return parse_flag(val, &g->remap_pending);
    if (!strcmp(key, "remap_failure"))
        return parse_flag(val, &g->remap_failure);
    if (!strcmp(key, "temp_slowdown"))
        return parse_uint(val, &g->temp_slowdown, 0);
    if (!strcmp(key, "temp_shutdown"))
        return parse_uint(val, &g->temp_shutdown, 0);
    return parse_retirement_nvlink(g, key, val);
}

static int parse_gpu(struct state *st, char **tok, int ntok, const char *path, unsigned lineno) {
    unsigned int idx;
    int i;
    struct gpu *g;
    if (ntok < 2 || parse_uint(tok[1], &idx, 0) || idx >= MAX_GPUS)
        PARSE_FAIL("gpu needs an index below %d", path, lineno, MAX_GPUS);
    g = &st->gpus[idx];
    if (g->present)
        PARSE_FAIL("gpu %u listed twice", path, lineno, idx);
    g->present = 1;
    snprintf(g->uuid, sizeof(g->uuid), "GPU-%08x-0000-0000-0000-000000000000", idx);
    strcpy(g->name, "NVIDIA Fake GPU");
    g->total = 80ULL << 30;
    g->temp = 40;
    g->events = DEFAULT_EVENTS;
    /* an H100 SXM at rest: Gen5 x16 in a Gen5 slot, 700 W limit */
    g->reasons = NA_ULL;
    g->pcie_gen = g->pcie_max_gen = 5;
    g->pcie_gpu_max_gen = NA_UINT;
    g->pcie_width = g->pcie_max_width = 16;
    g->power_mw = 70000;
    g->power_limit_mw = 700000;
    g->ecc[0][1] = g->ecc[1][1] = NA_ULL;
    g->temp_slowdown = 87;
    g->temp_shutdown = 92;
    for (i = 2; i < ntok; i++) {
        char *val = split_kv(tok[i]);
        const char *key = tok[i];
        int bad = 0;
        if (!val)
            bad = 1;
        else if (!strcmp(key, "uuid"))
            bad = unescape(val, g->uuid, sizeof(g->uuid));
        else if (!strcmp(key, "name"))
            bad = unescape(val, g->name, sizeof(g->name));
        else if (!strcmp(key, "total"))
            bad = parse_ull(val, &g->total, 0);
        else if (!strcmp(key, "used"))
            bad = parse_ull(val, &g->used, 0);
        else if (!strcmp(key, "reserved"))
            bad = parse_ull(val, &g->reserved, 0);
        else if (!strcmp(key, "lost")) {
            if (!strcmp(val, "1"))
                g->error = NVML_ERROR_GPU_IS_LOST;
            else if (strcmp(val, "0"))
                bad = 1;
        } else if (!strcmp(key, "error"))
            bad = error_by_name(val, &g->error);
        else if (!strcmp(key, "temp"))
            bad = parse_uint(val, &g->temp, 0);
        else if (!strcmp(key, "util"))
            bad = parse_uint(val, &g->util_gpu, 0);
        else if (!strcmp(key, "memutil"))
            bad = parse_uint(val, &g->util_mem, 0);
        else if (!strcmp(key, "events"))
            bad = parse_ull(val, &g->events, 0);
        else
            bad = parse_health(g, key, val);
        if (bad)
            PARSE_FAIL("bad gpu attribute '%s%s%s'", path, lineno, key, val ? "=" : "",
                       val ? val : "");
    }
    if (g->used > g->total || g->reserved > g->used)
        PARSE_FAIL("gpu %u needs reserved <= used <= total", path, lineno, idx);
    /* what is not given follows from what is: an idle GPU reports the GpuIdle reason, the
     * GPU's own max generation is at least what the slot allows, aggregate ECC counts
     * (lifetime) include the volatile ones (since the driver loaded) */
    if (g->reasons == NA_ULL)
        g->reasons = g->util_gpu == 0 ? 0x1ULL : 0;
    if (g->pcie_gpu_max_gen == NA_UINT)
        g->pcie_gpu_max_gen = g->pcie_max_gen;
    for (i = 0; i < 2; i++)
        if (g->ecc[i][1] == NA_ULL)
            g->ecc[i][1] = g->ecc[i][0];
    if (g->pcie_gen < 1 || g->pcie_gen > g->pcie_max_gen || g->pcie_max_gen > g->pcie_gpu_max_gen)
        PARSE_FAIL("gpu %u needs 1 <= pcie_gen <= pcie_max_gen <= pcie_gpu_max_gen", path, lineno,
                   idx);
    if (g->pcie_width < 1 || g->pcie_width > g->pcie_max_width)
        PARSE_FAIL("gpu %u needs 1 <= pcie_width <= pcie_max_width", path, lineno, idx);
    if (g->ecc[0][1] < g->ecc[0][0] || g->ecc[1][1] < g->ecc[1][0])
        PARSE_FAIL("gpu %u needs aggregate ECC counts >= volatile ones", path, lineno, idx);
    return 0;
bad:
    return -1;
}

static int parse_proc(struct state *st, char **tok, int ntok, const char *path, unsigned lineno) {
    struct proc p;
    int i, have_pid = 0, have_used = 0;
    memset(&p, 0, sizeof(p));
    p.gi = p.ci = NA_UINT; /* what a GPU without MIG reports */
    if (ntok < 3 || parse_uint(tok[1], &p.gpu, 0) || p.gpu >= MAX_GPUS)
        PARSE_FAIL("proc needs a gpu index", path, lineno);
    if (!strcmp(tok[2], "compute"))
        p.kind = KIND_COMPUTE;
    else if (!strcmp(tok[2], "graphics"))
        p.kind = KIND_GRAPHICS;
    else if (!strcmp(tok[2], "mps"))
        p.kind = KIND_MPS;
    else
        PARSE_FAIL("proc kind must be compute, graphics or mps", path, lineno);
    for (i = 3; i < ntok; i++) {
        char *val = split_kv(tok[i]);
        const char *key = tok[i];
        int bad = 0;
        if (!val)
            bad = 1;
        else if (!strcmp(key, "pid")) {
            bad = parse_uint(val, &p.pid, 0);
            have_pid = 1;
        } else if (!strcmp(key, "used")) {
            bad = parse_ull(val, &p.used, 1);
            have_used = 1;
        } else if (!strcmp(key, "gi"))
            bad = parse_uint(val, &p.gi, 1);
        else if (!strcmp(key, "ci"))
            bad = parse_uint(val, &p.ci, 1);
        else
            bad = 1;
        if (bad)
            PARSE_FAIL("bad proc attribute '%s%s%s'", path, lineno, key, val ? "=" : "",
                       val ? val : "");
    }
    if (!have_pid || !have_used)
        PARSE_FAIL("proc needs pid= and used=", path, lineno);
    if (st->nprocs >= MAX_PROCS)
        PARSE_FAIL("more than %d processes", path, lineno, MAX_PROCS);
    if (st->nprocs == st->cap_procs) {
        size_t cap = st->cap_procs ? st->cap_procs * 2 : 1024;
        struct proc *np = realloc(st->procs, cap * sizeof(*np));
        if (!np)
            PARSE_FAIL("out of memory", path, lineno);
        st->procs = np;
        st->cap_procs = cap;
    }
    st->procs[st->nprocs++] = p;
    return 0;
bad:
    return -1;
}

static int parse_fail(struct state *st, char **tok, int ntok, const char *path, unsigned lineno) {
    struct fail *f;
    unsigned int gpu;
    if (ntok < 3 || ntok > 4)
        PARSE_FAIL("fail SYMBOL ERROR [gpu=N]", path, lineno);
    if (st->nfails >= MAX_FAILS)
        PARSE_FAIL("more than %d fail lines", path, lineno, MAX_FAILS);
    f = &st->fails[st->nfails];
    if (strlen(tok[1]) >= sizeof(f->symbol))
        PARSE_FAIL("symbol name too long", path, lineno);
    strcpy(f->symbol, tok[1]);
    if (error_by_name(tok[2], &f->error))
        PARSE_FAIL("unknown error name '%s'", path, lineno, tok[2]);
    f->gpu = -1;
    if (ntok == 4) {
        char *val = split_kv(tok[3]);
        if (!val || strcmp(tok[3], "gpu") || parse_uint(val, &gpu, 0) || gpu >= MAX_GPUS)
            PARSE_FAIL("fail: expected gpu=N", path, lineno);
        f->gpu = (int)gpu;
    }
    st->nfails++;
    return 0;
bad:
    return -1;
}

static int parse_xid(struct state *st, char **tok, int ntok, const char *path, unsigned lineno) {
    struct xid *x;
    char *val;
    size_t i;
    if (ntok != 4)
        PARSE_FAIL("xid GPU CODE id=N", path, lineno);
    if (st->nxids >= MAX_XIDS)
        PARSE_FAIL("more than %d xid lines", path, lineno, MAX_XIDS);
    x = &st->xids[st->nxids];
    if (parse_uint(tok[1], &x->gpu, 0) || x->gpu >= MAX_GPUS)
        PARSE_FAIL("xid needs a gpu index", path, lineno);
    if (parse_ull(tok[2], &x->code, 0))
        PARSE_FAIL("xid needs a code", path, lineno);
    val = split_kv(tok[3]);
    if (!val || strcmp(tok[3], "id") || parse_uint(val, &x->id, 0))
        PARSE_FAIL("xid: expected id=N", path, lineno);
    for (i = 0; i < st->nxids; i++)
        if (st->xids[i].id == x->id)
            PARSE_FAIL("xid id=%u listed twice", path, lineno, x->id);
    st->nxids++;
    return 0;
bad:
    return -1;
}

static int parse_hang(struct state *st, char **tok, int ntok, const char *path, unsigned lineno) {
    struct hang *h;
    if (ntok != 3)
        PARSE_FAIL("hang SYMBOL MILLISECONDS", path, lineno);
    if (st->nhangs >= MAX_FAILS)
        PARSE_FAIL("more than %d hang lines", path, lineno, MAX_FAILS);
    h = &st->hangs[st->nhangs];
    if (strlen(tok[1]) >= sizeof(h->symbol))
        PARSE_FAIL("symbol name too long", path, lineno);
    strcpy(h->symbol, tok[1]);
    if (parse_uint(tok[2], &h->ms, 0))
        PARSE_FAIL("hang: expected milliseconds", path, lineno);
    st->nhangs++;
    return 0;
bad:
    return -1;
}

static long long ts_ns(const struct timespec *ts) {
    return (long long)ts->tv_sec * 1000000000LL + ts->tv_nsec;
}

/* Is the file at path the one g_state was parsed from? Its identity and
 * timestamps, as stat() reports them, are those recorded at the parse; and the
 * parse began more than RACY_NS after the file's last change. File timestamps
 * come from a coarse clock (a jiffy, up to 10 ms): a file written in the same
 * tick as the parsed one, the same size, on a reused inode would look the same.
 * Any change after the parse is stamped no earlier than (parse start - one
 * tick); if the parsed file's ctime is older than (parse start - RACY_NS), a
 * later change cannot carry the same ctime. Until then every call re-parses. */
static int state_unchanged(const char *path) {
    struct stat sb;
    if (g_cache.valid != 1 || strcmp(path, g_cache.path) || stat(path, &sb))
        return 0;
    return sb.st_dev == g_cache.dev && sb.st_ino == g_cache.ino && sb.st_size == g_cache.size &&
           ts_ns(&sb.st_mtim) == g_cache.mtime_ns && ts_ns(&sb.st_ctim) == g_cache.ctime_ns &&
           g_cache.ctime_ns + RACY_NS < g_cache.parsed_ns;
}

/* Read the state file into g_state, unless it is the one already there.
 * Returns NVML_SUCCESS, NVML_ERROR_DRIVER_NOT_LOADED (no env/file) or
 * NVML_ERROR_UNKNOWN (bad file). */
static nvmlReturn_t load_state(void) {
    struct state *st = &g_state;
    const char *path = getenv(STATE_ENV);
    FILE *fp;
    struct stat sb;
    struct timespec now;
    char *line = NULL;
    size_t linecap = 0;
    unsigned lineno = 0;
    unsigned int i;
    nvmlReturn_t rc = NVML_SUCCESS;

    if (path && *path && state_unchanged(path))
        return NVML_SUCCESS;
    g_cache.valid = 0;
    clock_gettime(CLOCK_REALTIME, &now);
    reset_state(st);
    if (!path || !*path)
        return NVML_ERROR_DRIVER_NOT_LOADED;
    fp = fopen(path, "r");
    if (!fp)
        return NVML_ERROR_DRIVER_NOT_LOADED;
    /* The key is that of the file opened, whatever the path names by now. */
    if (fstat(fileno(fp), &sb) == 0 && strlen(path) < sizeof(g_cache.path)) {
        strcpy(g_cache.path, path);
        g_cache.dev = sb.st_dev;
        g_cache.ino = sb.st_ino;
        g_cache.size = sb.st_size;
        g_cache.mtime_ns = ts_ns(&sb.st_mtim);
        g_cache.ctime_ns = ts_ns(&sb.st_ctim);
        g_cache.parsed_ns = ts_ns(&now);
        g_cache.valid = 2; /* 2: key recorded; becomes 1 (valid) if the parse succeeds */
    }
    while (getline(&line, &linecap, fp) >= 0) {
        char *tok[64], *save = NULL, *t, *hash;
        int ntok = 0;
        lineno++;
        for (hash = line; (hash = strchr(hash, '#')) != NULL; hash++) {
            if (hash == line || hash[-1] == ' ' || hash[-1] == '\t') {
                *hash = '\0';
                break;
            }
        }
        for (t = strtok_r(line, " \t\r\n", &save); t; t = strtok_r(NULL, " \t\r\n", &save)) {
            if (ntok == 64) {
                warn("%s:%u: too many fields", path, lineno);
                rc = NVML_ERROR_UNKNOWN;
                goto out;
            }
            tok[ntok++] = t;
        }
        if (ntok == 0)
            continue;
        if (!strcmp(tok[0], "driver") && ntok == 2) {
            if (unescape(tok[1], st->driver, sizeof(st->driver)))
                rc = NVML_ERROR_UNKNOWN;
        } else if (!strcmp(tok[0], "nvml") && ntok == 2) {
            if (unescape(tok[1], st->nvml, sizeof(st->nvml)))
                rc = NVML_ERROR_UNKNOWN;
        } else if (!strcmp(tok[0], "cuda") && ntok == 2) {
            unsigned int v;
            if (parse_uint(tok[1], &v, 0) || v > INT_MAX)
                rc = NVML_ERROR_UNKNOWN;
            else
                st->cuda = (int)v;
        } else if (!strcmp(tok[0], "init") && ntok == 2) {
            if (!strcmp(tok[1], "ok"))
                st->init_result = NVML_SUCCESS;
            else if (error_by_name(tok[1], &st->init_result))
                rc = NVML_ERROR_UNKNOWN;
        } else if (!strcmp(tok[0], "gpu")) {
            if (parse_gpu(st, tok, ntok, path, lineno))
                rc = NVML_ERROR_UNKNOWN;
        } else if (!strcmp(tok[0], "proc")) {
            if (parse_proc(st, tok, ntok, path, lineno))
                rc = NVML_ERROR_UNKNOWN;
        } else if (!strcmp(tok[0], "fail")) {
            if (parse_fail(st, tok, ntok, path, lineno))
                rc = NVML_ERROR_UNKNOWN;
        } else if (!strcmp(tok[0], "hang")) {
            if (parse_hang(st, tok, ntok, path, lineno))
                rc = NVML_ERROR_UNKNOWN;
        } else if (!strcmp(tok[0], "xid")) {
            if (parse_xid(st, tok, ntok, path, lineno))
                rc = NVML_ERROR_UNKNOWN;
        } else {
            warn("%s:%u: unknown line '%s' (or wrong number of fields)", path, lineno, tok[0]);
            rc = NVML_ERROR_UNKNOWN;
        }
        if (rc != NVML_SUCCESS) {
            warn("%s:%u: state file rejected", path, lineno);
            goto out;
        }
    }
    if (ferror(fp)) {
        rc = NVML_ERROR_DRIVER_NOT_LOADED;
        goto out;
    }
    /* GPU indices must be 0..n-1 without gaps, and processes must name one. */
    for (i = 0; i < MAX_GPUS && st->gpus[i].present; i++)
        ;
    st->ngpus = i;
    for (; i < MAX_GPUS; i++) {
        if (st->gpus[i].present) {
            warn("%s: gpu indices must be 0..n-1 without gaps (gpu %u after a gap)", path, i);
            rc = NVML_ERROR_UNKNOWN;
            goto out;
        }
    }
    for (i = 0; i < st->nprocs; i++) {
        if (st->procs[i].gpu >= st->ngpus) {
            warn("%s: proc pid=%u names gpu %u, which is not listed", path, st->procs[i].pid,
                 st->procs[i].gpu);
            rc = NVML_ERROR_UNKNOWN;
            goto out;
        }
    }
    for (i = 0; i < st->nxids; i++) {
        if (st->xids[i].gpu >= st->ngpus) {
            warn("%s: xid id=%u names gpu %u, which is not listed", path, st->xids[i].id,
                 st->xids[i].gpu);
            rc = NVML_ERROR_UNKNOWN;
            goto out;
        }
    }
out:
    free(line);
    fclose(fp);
    g_cache.valid = (rc == NVML_SUCCESS && g_cache.valid == 2);
    return rc;
}

/* ---- call plumbing ---- */

static void log_call(const char *symbol, nvmlReturn_t rc) {
    const char *path = getenv(LOG_ENV);
    FILE *fp;
    if (!path || !*path)
        return;
    fp = fopen(path, "a");
    if (!fp)
        return;
    fprintf(fp, "%s %d\n", symbol, (int)rc);
    fclose(fp);
}

static nvmlReturn_t injected(const char *symbol, int gpu) {
    size_t i;
    for (i = 0; gpu < 0 && i < g_state.nhangs; i++) {
        if (!strcmp(g_state.hangs[i].symbol, symbol)) {
            struct timespec ts = {g_state.hangs[i].ms / 1000, (g_state.hangs[i].ms % 1000) * 1000000L};
            while (nanosleep(&ts, &ts) && errno == EINTR)
                ;
        }
    }
    for (i = 0; i < g_state.nfails; i++) {
        const struct fail *f = &g_state.fails[i];
        if ((f->gpu < 0 || f->gpu == gpu) && !strcmp(f->symbol, symbol))
            return f->error;
    }
    return NVML_SUCCESS;
}

/* Start of a query that needs NVML initialised: lock, check, re-read. */
static nvmlReturn_t begin_query(const char *symbol) {
    nvmlReturn_t rc;
    pthread_mutex_lock(&g_lock);
    if (g_refcount == 0)
        return NVML_ERROR_UNINITIALIZED;
    /* The "driver" went away under an initialised process: not something
     * a real driver does, so report it as the generic failure. */
    rc = load_state();
    if (rc != NVML_SUCCESS)
        return NVML_ERROR_UNKNOWN;
    return injected(symbol, -1);
}

/* begin_query plus the per-device checks. */
static nvmlReturn_t begin_device(const char *symbol, nvmlDevice_t dev, struct gpu **out) {
    nvmlReturn_t rc = begin_query(symbol);
    uintptr_t p = (uintptr_t)dev, base = (uintptr_t)g_handles;
    unsigned int idx;
    if (rc != NVML_SUCCESS)
        return rc;
    if (p < base || p >= base + sizeof(g_handles) || (p - base) % sizeof(g_handles[0]))
        return NVML_ERROR_INVALID_ARGUMENT;
    idx = dev->index;
    if (idx >= g_state.ngpus) /* the GPU left the state file after its handle was taken */
        return NVML_ERROR_INVALID_ARGUMENT;
    if (g_state.gpus[idx].error != NVML_SUCCESS)
        return g_state.gpus[idx].error;
    rc = injected(symbol, (int)idx);
    if (rc != NVML_SUCCESS)
        return rc;
    *out = &g_state.gpus[idx];
    return NVML_SUCCESS;
}

static nvmlReturn_t finish(const char *symbol, nvmlReturn_t rc) {
    log_call(symbol, rc);
    pthread_mutex_unlock(&g_lock);
    return rc;
}

static nvmlReturn_t copy_string(const char *s, char *buf, unsigned int length) {
    size_t n = strlen(s);
    if (!buf)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (length < n + 1)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(buf, s, n + 1);
    return NVML_SUCCESS;
}

/* ---- init / shutdown / errors ---- */

nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    nvmlReturn_t rc;
    (void)flags;
    pthread_mutex_lock(&g_lock);
    rc = load_state();
    if (rc == NVML_SUCCESS)
        rc = g_state.init_result;
    if (rc == NVML_SUCCESS)
        rc = injected("nvmlInitWithFlags", -1);
    if (rc == NVML_SUCCESS)
        g_refcount++;
    return finish("nvmlInitWithFlags", rc);
}

nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
nvmlReturn_t nvmlInit(void) { return nvmlInitWithFlags(0); }

nvmlReturn_t nvmlShutdown(void) {
    nvmlReturn_t rc = NVML_SUCCESS;
    pthread_mutex_lock(&g_lock);
    if (g_refcount == 0)
        rc = NVML_ERROR_UNINITIALIZED;
    else
        g_refcount--;
    return finish("nvmlShutdown", rc);
}

const char *nvmlErrorString(nvmlReturn_t result) {
    size_t i;
    for (i = 0; i < sizeof(ERRORS) / sizeof(ERRORS[0]); i++)
        if (ERRORS[i].code == result)
            return ERRORS[i].text;
    return "Unknown Error";
}

/* ---- system queries ---- */

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    const char *sym = "nvmlSystemGetDriverVersion";
    nvmlReturn_t rc = begin_query(sym);
    if (rc == NVML_SUCCESS)
        rc = copy_string(g_state.driver, version, length);
    return finish(sym, rc);
}

nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length) {
    const char *sym = "nvmlSystemGetNVMLVersion";
    nvmlReturn_t rc = begin_query(sym);
    if (rc == NVML_SUCCESS) {
        char buf[STR_MAX + 16];
        if (g_state.nvml[0])
            snprintf(buf, sizeof(buf), "%s", g_state.nvml);
        else /* the real library reports "<cuda major>.<driver version>" */
            snprintf(buf, sizeof(buf), "%d.%s", g_state.cuda / 1000, g_state.driver);
        rc = copy_string(buf, version, length);
    }
    return finish(sym, rc);
}

static nvmlReturn_t cuda_version(const char *sym, int *out) {
    nvmlReturn_t rc = begin_query(sym);
    if (rc == NVML_SUCCESS && !out)
        rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc == NVML_SUCCESS)
        *out = g_state.cuda;
    return finish(sym, rc);
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *v) {
    return cuda_version("nvmlSystemGetCudaDriverVersion", v);
}
nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *v) {
    return cuda_version("nvmlSystemGetCudaDriverVersion_v2", v);
}

/* ---- device enumeration ---- */

static nvmlReturn_t device_count(const char *sym, unsigned int *count) {
    nvmlReturn_t rc = begin_query(sym);
    if (rc == NVML_SUCCESS && !count)
        rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc == NVML_SUCCESS)
        *count = g_state.ngpus;
    return finish(sym, rc);
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    return device_count("nvmlDeviceGetCount_v2", count);
}
nvmlReturn_t nvmlDeviceGetCount(unsigned int *count) {
    return device_count("nvmlDeviceGetCount", count);
}

/* A lost GPU cannot be opened: real nvidia-smi prints "Unable to determine
 * the device handle for GPU ...: GPU is lost". */
static nvmlReturn_t handle_for(const char *sym, unsigned int idx, nvmlDevice_t *device) {
    nvmlReturn_t rc = NVML_SUCCESS;
    if (!device || idx >= g_state.ngpus)
        rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc == NVML_SUCCESS)
        rc = g_state.gpus[idx].error;
    if (rc == NVML_SUCCESS)
        rc = injected(sym, (int)idx);
    if (rc == NVML_SUCCESS) {
        g_handles[idx].index = idx;
        *device = &g_handles[idx];
    }
    return rc;
}

static nvmlReturn_t handle_by_index(const char *sym, unsigned int idx, nvmlDevice_t *device) {
    nvmlReturn_t rc = begin_query(sym);
    if (rc == NVML_SUCCESS)
        rc = handle_for(sym, idx, device);
    return finish(sym, rc);
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    return handle_by_index("nvmlDeviceGetHandleByIndex_v2", index, device);
}
nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device) {
    return handle_by_index("nvmlDeviceGetHandleByIndex", index, device);
}

nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device) {
    const char *sym = "nvmlDeviceGetHandleByUUID";
    nvmlReturn_t rc = begin_query(sym);
    unsigned int i;
    if (rc == NVML_SUCCESS && (!uuid || !device))
        rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc == NVML_SUCCESS) {
        rc = NVML_ERROR_NOT_FOUND;
        for (i = 0; i < g_state.ngpus; i++) {
            if (!strcmp(g_state.gpus[i].uuid, uuid)) {
                rc = handle_for(sym, i, device);
                break;
            }
        }
    }
    return finish(sym, rc);
}

/* ---- per-device queries ---- */

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    const char *sym = "nvmlDeviceGetName";
    struct gpu *g = NULL;
    nvmlReturn_t rc = begin_device(sym, device, &g);
    if (rc == NVML_SUCCESS)
        rc = copy_string(g->name, name, length);
    return finish(sym, rc);
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    const char *sym = "nvmlDeviceGetUUID";
    struct gpu *g = NULL;
    nvmlReturn_t rc = begin_device(sym, device, &g);
    if (rc == NVML_SUCCESS)
        rc = copy_string(g->uuid, uuid, length);
    return finish(sym, rc);
}

nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index) {
    const char *sym = "nvmlDeviceGetIndex";
    struct gpu *g = NULL;
    nvmlReturn_t rc = begin_device(sym, device, &g);
    if (rc == NVML_SUCCESS && !index)
        rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc == NVML_SUCCESS)
        *index = (unsigned int)(g - g_state.gpus);
    return finish(sym, rc);
}

/* v1 "used" includes what the driver reserves (as nvidia-smi shows it);
 * v2 splits it: v2.used = used - reserved, v2.reserved = reserved. */
nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    const char *sym = "nvmlDeviceGetMemoryInfo";
    struct gpu *g = NULL;
    nvmlReturn_t rc = begin_device(sym, device, &g);
    if (rc == NVML_SUCCESS && !memory)
        rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc == NVML_SUCCESS) {
        memory->total = g->total;
        memory->used = g->used;
        memory->free = g->total - g->used;
    }
    return finish(sym, rc);
}

nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory) {
    const char *sym = "nvmlDeviceGetMemoryInfo_v2";
    struct gpu *g = NULL;
    nvmlReturn_t rc = begin_device(sym, device, &g);
    if (rc == NVML_SUCCESS && !memory)
        rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc == NVML_SUCCESS && memory->version != nvmlMemory_v2)
        rc = NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    if (rc == NVML_SUCCESS) {
        memory->total = g->total;
        memory->reserved = g->reserved;
        memory->used = g->used - g->reserved;
        memory->free = g->total - g->used;
    }
    return finish(sym, rc);
}

/* The NVML_ERROR_INSUFFICIENT_SIZE protocol shared by the process lists:
 * count the matching processes; if *infoCount is too small (including the
 * usual first call with 0 and NULL) say how many are needed; otherwise fill. */
static nvmlReturn_t running_processes(const char *sym, nvmlDevice_t device, enum proc_kind kind,
                                      unsigned int *infoCount, void *infos, int v1) {
    struct gpu *g = NULL;
    nvmlReturn_t rc = begin_device(sym, device, &g);
    unsigned int idx, n = 0, out = 0;
    size_t i;
    if (rc == NVML_SUCCESS && !infoCount)
        rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc != NVML_SUCCESS)
        return finish(sym, rc);
    idx = (unsigned int)(g - g_state.gpus);
    for (i = 0; i < g_state.nprocs; i++)
        if (g_state.procs[i].gpu == idx && g_state.procs[i].kind == kind)
            n++;
    if (*infoCount < n) {
        *infoCount = n;
        return finish(sym, NVML_ERROR_INSUFFICIENT_SIZE);
    }
    if (n > 0 && !infos)
        return finish(sym, NVML_ERROR_INVALID_ARGUMENT);
    for (i = 0; i < g_state.nprocs; i++) {
        const struct proc *p = &g_state.procs[i];
        if (p->gpu != idx || p->kind != kind)
            continue;
        if (v1) {
            nvmlProcessInfo_v1_t *o = (nvmlProcessInfo_v1_t *)infos + out;
            o->pid = p->pid;
            o->usedGpuMemory = p->used;
        } else {
            nvmlProcessInfo_v2_t *o = (nvmlProcessInfo_v2_t *)infos + out;
            o->pid = p->pid;
            o->usedGpuMemory = p->used;
            o->gpuInstanceId = p->gi;
            o->computeInstanceId = p->ci;
        }
        out++;
    }
    *infoCount = n;
    return finish(sym, NVML_SUCCESS);
}

#define PROCESS_ENTRY(fn, kind, type, v1)                                                          \
    nvmlReturn_t fn(nvmlDevice_t device, unsigned int *infoCount, type *infos) {                   \
        return running_processes(#fn, device, kind, infoCount, infos, v1);                         \
    }

PROCESS_ENTRY(nvmlDeviceGetComputeRunningProcesses, KIND_COMPUTE, nvmlProcessInfo_v1_t, 1)
PROCESS_ENTRY(nvmlDeviceGetComputeRunningProcesses_v2, KIND_COMPUTE, nvmlProcessInfo_v2_t, 0)
PROCESS_ENTRY(nvmlDeviceGetComputeRunningProcesses_v3, KIND_COMPUTE, nvmlProcessInfo_v2_t, 0)
PROCESS_ENTRY(nvmlDeviceGetGraphicsRunningProcesses, KIND_GRAPHICS, nvmlProcessInfo_v1_t, 1)
PROCESS_ENTRY(nvmlDeviceGetGraphicsRunningProcesses_v2, KIND_GRAPHICS, nvmlProcessInfo_v2_t, 0)
PROCESS_ENTRY(nvmlDeviceGetGraphicsRunningProcesses_v3, KIND_GRAPHICS, nvmlProcessInfo_v2_t, 0)
PROCESS_ENTRY(nvmlDeviceGetMPSComputeRunningProcesses, KIND_MPS, nvmlProcessInfo_v1_t, 1)
PROCESS_ENTRY(nvmlDeviceGetMPSComputeRunningProcesses_v2, KIND_MPS, nvmlProcessInfo_v2_t, 0)
PROCESS_ENTRY(nvmlDeviceGetMPSComputeRunningProcesses_v3, KIND_MPS, nvmlProcessInfo_v2_t, 0)

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *util) {
    const char *sym = "nvmlDeviceGetUtilizationRates";
    struct gpu *g = NULL;
    nvmlReturn_t rc = begin_device(sym, device, &g);
    if (rc == NVML_SUCCESS && !util)
        rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc == NVML_SUCCESS) {
        util->gpu = g->util_gpu;
        util->memory = g->util_mem;
    }
    return finish(sym, rc);
}

nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, unsigned int sensorType,
                                      unsigned int *temp) {
    const char *sym = "nvmlDeviceGetTemperature";
    struct gpu *g = NULL;
    nvmlReturn_t rc = begin_device(sym, device, &g);
    if (rc == NVML_SUCCESS && (!temp || sensorType != 0 /* NVML_TEMPERATURE_GPU */))
        rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc == NVML_SUCCESS)
        *temp = g->temp;
    return finish(sym, rc);
}

nvmlReturn_t nvmlDeviceGetTemperatureV(nvmlDevice_t device, nvmlTemperature_v1_t *temperature) {
    const char *sym = "nvmlDeviceGetTemperatureV";
    struct gpu *g = NULL;
    nvmlReturn_t rc = begin_device(sym, device, &g);
    if (rc == NVML_SUCCESS && !temperature)
        rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc == NVML_SUCCESS && temperature->version != nvmlTemperature_v1)
        rc = NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    if (rc == NVML_SUCCESS && temperature->sensorType != 0)
        rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc == NVML_SUCCESS)
        temperature->temperature = (int)g->temp;
    return finish(sym, rc);
}

/* ---- health: clock event reasons, PCIe link, power, ECC, row remapping ---- */

/* One unsigned value of the device through an out pointer (NULL: INVALID_ARGUMENT). */
#define UINT_GETTER(fn, type, field)                                                               \
    nvmlReturn_t fn(nvmlDevice_t device, type *out) {                                              \
        struct gpu *g = NULL;                                                                      \
        nvmlReturn_t rc = begin_device(#fn, device, &g);                                           \
        if (rc == NVML_SUCCESS && !out)                                                            \
            rc = NVML_ERROR_INVALID_ARGUMENT;                                                      \
        if (rc == NVML_SUCCESS)                                                                    \
            *out = g->field;                                                                       \
        return finish(#fn, rc);                                                                    \
    }

/* the same bit mask under both names (nvmlClocksEventReason* == nvmlClocksThrottleReason*) */
UINT_GETTER(nvmlDeviceGetCurrentClocksEventReasons, unsigned long long, reasons)
UINT_GETTER(nvmlDeviceGetCurrentClocksThrottleReasons, unsigned long long, reasons)
/* current link, what device and system allow together, what the GPU alone supports */
UINT_GETTER(nvmlDeviceGetCurrPcieLinkGeneration, unsigned int, pcie_gen)
UINT_GETTER(nvmlDeviceGetMaxPcieLinkGeneration, unsigned int, pcie_max_gen)
UINT_GETTER(nvmlDeviceGetGpuMaxPcieLinkGeneration, unsigned int, pcie_gpu_max_gen)
UINT_GETTER(nvmlDeviceGetCurrPcieLinkWidth, unsigned int, pcie_width)
UINT_GETTER(nvmlDeviceGetMaxPcieLinkWidth, unsigned int, pcie_max_width)
/* milliwatts */
UINT_GETTER(nvmlDeviceGetPowerUsage, unsigned int, power_mw)
UINT_GETTER(nvmlDeviceGetEnforcedPowerLimit, unsigned int, power_limit_mw)

/* errorType: NVML_MEMORY_ERROR_TYPE_CORRECTED 0 / _UNCORRECTED 1; counterType:
 * NVML_VOLATILE_ECC 0 (since the driver loaded) / NVML_AGGREGATE_ECC 1 (lifetime). */
nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t device, unsigned int errorType,
                                         unsigned int counterType, unsigned long long *eccCounts) {
    const char *sym = "nvmlDeviceGetTotalEccErrors";
    struct gpu *g = NULL;
    nvmlReturn_t rc = begin_device(sym, device, &g);
    if (rc == NVML_SUCCESS && (!eccCounts || errorType > 1 || counterType > 1))
        rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc == NVML_SUCCESS)
        *eccCounts = g->ecc[errorType][counterType];
    return finish(sym, rc);
}

static nvmlReturn_t retirement_device(const char *sym, nvmlDevice_t device, struct gpu **g,
                                      unsigned int want);

nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t device, unsigned int *corrRows,
                                       unsigned int *uncRows, unsigned int *isPending,
                                       unsigned int *failureOccurred) {
    const char *sym = "nvmlDeviceGetRemappedRows";
    struct gpu *g = NULL;
    nvmlReturn_t rc = retirement_device(sym, device, &g, 0);
    if (rc == NVML_SUCCESS && (!corrRows || !uncRows || !isPending || !failureOccurred))
        rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc == NVML_SUCCESS) {
        *corrRows = g->remap_corr;
        *uncRows = g->remap_unc;
        *isPending = g->remap_pending;
        *failureOccurred = g->remap_failure;
    }
    return finish(sym, rc);
}

/* Ampere and later remap rows instead of retiring pages: each of the two answers
 * NOT_SUPPORTED where the other is the GPU's way (`retirement=1`: a GPU before Ampere). */
static nvmlReturn_t retirement_device(const char *sym, nvmlDevice_t device, struct gpu **g,
                                      unsigned int want) {
    nvmlReturn_t rc = begin_device(sym, device, g);
    if (rc == NVML_SUCCESS && (*g)->retirement != want)
        rc = NVML_ERROR_NOT_SUPPORTED;
    return rc;
}

/* cause: NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS 0 / _DOUBLE_BIT_ECC_ERROR 1.
 * *pageCount in: the buffer's size; out: the pages of that cause. Too small (0 asks the count):
 * INSUFFICIENT_SIZE with the count, as NVML does; no pages and 0: SUCCESS. */
nvmlReturn_t nvmlDeviceGetRetiredPages(nvmlDevice_t device, unsigned int cause,
                                       unsigned int *pageCount, unsigned long long *addresses) {
    const char *sym = "nvmlDeviceGetRetiredPages";
    struct gpu *g = NULL;
    unsigned int i, n;
    nvmlReturn_t rc = retirement_device(sym, device, &g, 1);
    if (rc == NVML_SUCCESS && (!pageCount || cause > 1))
        rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc == NVML_SUCCESS) {
        n = g->retired[cause];
        if (*pageCount < n) {
            *pageCount = n;
            rc = NVML_ERROR_INSUFFICIENT_SIZE;
        } else if (n && !addresses) {
            rc = NVML_ERROR_INVALID_ARGUMENT;
        } else {
            for (i = 0; i < n; i++) /* page addresses: distinct per cause, otherwise made up */
                addresses[i] = 0x100000ULL * (cause + 1) + 0x1000ULL * i;
            *pageCount = n;
        }
    }
    return finish(sym, rc);
}

/* isPending: NVML_FEATURE_ENABLED 1 when a retired page waits for a reboot/reset to take effect */
nvmlReturn_t nvmlDeviceGetRetiredPagesPendingStatus(nvmlDevice_t device, unsigned int *isPending) {
    const char *sym = "nvmlDeviceGetRetiredPagesPendingStatus";
    struct gpu *g = NULL;
    nvmlReturn_t rc = retirement_device(sym, device, &g, 1);
    if (rc == NVML_SUCCESS && !isPending)
        rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc == NVML_SUCCESS)
        *isPending = g->retired_pending;
    return finish(sym, rc);
}

/* A link of the GPU: INVALID_ARGUMENT at or past NVML_NVLINK_MAX_LINKS, NOT_SUPPORTED on a GPU
 * without NVLink (`nvlinks=0`, the default: a PCIe card) or past the links it has. */
static nvmlReturn_t nvlink_device(const char *sym, nvmlDevice_t device, unsigned int link,
                                  struct gpu **g) {
    nvmlReturn_t rc = begin_device(sym, device, g);
    if (rc == NVML_SUCCESS && link >= 36)
        rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc == NVML_SUCCESS && link >= (*g)->nvlinks)
        rc = NVML_ERROR_NOT_SUPPORTED;
    return rc;
}

/* isActive: NVML_FEATURE_ENABLED 1 unless the link's bit is in `nvlink_down` */
nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t device, unsigned int link,
                                      unsigned int *isActive) {
    const char *sym = "nvmlDeviceGetNvLinkState";
    struct gpu *g = NULL;
    nvmlReturn_t rc = nvlink_device(sym, device, link, &g);
    if (rc == NVML_SUCCESS && !isActive)
        rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc == NVML_SUCCESS)
        *isActive = (g->nvlink_down >> link & 1U) ? 0 : 1;
    return finish(sym, rc);
}

/* counter: NVML_NVLINK_ERROR_DL_REPLAY 0, _DL_RECOVERY 1, _DL_CRC_FLIT 2, _DL_CRC_DATA 3;
 * _DL_ECC_DATA 4 is NOT_SUPPORTED here (as before Ampere), anything past it INVALID_ARGUMENT. */
nvmlReturn_t nvmlDeviceGetNvLinkErrorCounter(nvmlDevice_t device, unsigned int link,
                                             unsigned int counter,
                                             unsigned long long *counterValue) {
    const char *sym = "nvmlDeviceGetNvLinkErrorCounter";
    struct gpu *g = NULL;
    nvmlReturn_t rc = nvlink_device(sym, device, link, &g);
    if (rc == NVML_SUCCESS && (!counterValue || counter > 4))
        rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc == NVML_SUCCESS && counter >= FAKE_NVLINK_COUNTERS)
        rc = NVML_ERROR_NOT_SUPPORTED;
    if (rc == NVML_SUCCESS)
        *counterValue = g->nvlink_err[link][counter];
    return finish(sym, rc);
}

/* NVML_TEMPERATURE_THRESHOLD_SHUTDOWN 0, _SLOWDOWN 1; the other known thresholds (up to
 * _COUNT 8) are NOT_SUPPORTED here, as on many boards; beyond that INVALID_ARGUMENT. */
nvmlReturn_t nvmlDeviceGetTemperatureThreshold(nvmlDevice_t device, unsigned int thresholdType,
                                               unsigned int *temp) {
    const char *sym = "nvmlDeviceGetTemperatureThreshold";
    struct gpu *g = NULL;
    nvmlReturn_t rc = begin_device(sym, device, &g);
    if (rc == NVML_SUCCESS && (!temp || thresholdType >= 8))
        rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc == NVML_SUCCESS && thresholdType > 1)
        rc = NVML_ERROR_NOT_SUPPORTED;
    if (rc == NVML_SUCCESS)
        *temp = thresholdType == 0 ? g->temp_shutdown : g->temp_slowdown;
    return finish(sym, rc);
}

/* ---- field values (nvmlDeviceGetFieldValues): many values of a device in one call ---- */

/* nvmlValueType_t */
#define VT_UINT 1
#define VT_ULL 3

/* nvmlValue_t and nvmlFieldValue_t as nvml.h lays them out (pynvml's c_nvmlFieldValue_t) */
typedef union {
    double dVal;
    unsigned int uiVal;
    unsigned long ulVal;
    unsigned long long ullVal;
    long long sllVal;
    int siVal;
    unsigned short usVal;
} nvmlValue_t;

typedef struct {
    unsigned int fieldId;
    unsigned int scopeId;
    long long timestamp;   /* CLOCK_REALTIME, microseconds */
    long long latencyUsec; /* 0: read now, not cached by the driver */
    int valueType;         /* nvmlValueType_t */
    nvmlReturn_t nvmlReturn;
    nvmlValue_t value;
} nvmlFieldValue_t;

/* NVML_FI_DEV_* ids answered here (nvml.h); every other id answers NOT_SUPPORTED in its own
 * nvmlReturn, as a driver does for a field the GPU lacks. */
#define FI_ECC_SBE_VOL_TOTAL 3
#define FI_ECC_DBE_VOL_TOTAL 4
#define FI_ECC_SBE_AGG_TOTAL 5
#define FI_ECC_DBE_AGG_TOTAL 6
#define FI_RETIRED_SBE 29
#define FI_RETIRED_DBE 30
#define FI_RETIRED_PENDING 31
#define FI_REMAPPED_COR 142
#define FI_REMAPPED_UNC 143
#define FI_REMAPPED_PENDING 144
#define FI_REMAPPED_FAILURE 145
#define FI_POWER_AVERAGE 185 /* scopeId: NVML_POWER_SCOPE_GPU 0 (MODULE 1, MEMORY 2: no) */
#define FI_POWER_INSTANT 186

/* One field of GPU idx. The value comes from the same state as the single-value call that
 * reads it (its `twin`), and a `fail TWIN ...` line fails the field too (the GPU lacks it
 * either way); `fail nvmlDeviceGetFieldValues:ID ...` fails the field alone (a driver that
 * does not know the id, where the older call still answers). */
static void field_value(const struct gpu *g, unsigned int idx, nvmlFieldValue_t *v) {
    char own[SYM_MAX];
    const char *twin = NULL;
    nvmlReturn_t rc = NVML_SUCCESS;
    unsigned long long value = 0;
    int type = VT_UINT;
    unsigned int id = v->fieldId;
    switch (id) {
    case FI_ECC_SBE_VOL_TOTAL:
    case FI_ECC_DBE_VOL_TOTAL:
    case FI_ECC_SBE_AGG_TOTAL:
    case FI_ECC_DBE_AGG_TOTAL: /* single bit == corrected, double bit == uncorrected */
        twin = "nvmlDeviceGetTotalEccErrors";
        value = g->ecc[(id - FI_ECC_SBE_VOL_TOTAL) % 2][(id - FI_ECC_SBE_VOL_TOTAL) / 2];
        type = VT_ULL;
        break;
    case FI_RETIRED_SBE:
    case FI_RETIRED_DBE:
        twin = "nvmlDeviceGetRetiredPages";
        if (!g->retirement)
            rc = NVML_ERROR_NOT_SUPPORTED;
        value = g->retired[id - FI_RETIRED_SBE];
        type = VT_ULL;
        break;
    case FI_RETIRED_PENDING:
        twin = "nvmlDeviceGetRetiredPagesPendingStatus";
        if (!g->retirement)
            rc = NVML_ERROR_NOT_SUPPORTED;
        value = g->retired_pending;
        break;
    case FI_REMAPPED_COR:
    case FI_REMAPPED_UNC:
    case FI_REMAPPED_PENDING:
    case FI_REMAPPED_FAILURE:
        twin = "nvmlDeviceGetRemappedRows";
        if (g->retirement)
            rc = NVML_ERROR_NOT_SUPPORTED;
        value = id == FI_REMAPPED_COR       ? g->remap_corr
                : id == FI_REMAPPED_UNC     ? g->remap_unc
                : id == FI_REMAPPED_PENDING ? g->remap_pending
                                            : g->remap_failure;
        break;
    case FI_POWER_AVERAGE:
    case FI_POWER_INSTANT: /* the fake draws a steady power: the average is the instant */
        twin = "nvmlDeviceGetPowerUsage";
        if (v->scopeId > 2)
            rc = NVML_ERROR_INVALID_ARGUMENT;
        else if (v->scopeId != 0)
            rc = NVML_ERROR_NOT_SUPPORTED;
        value = g->power_mw;
        break;
    default:
        rc = NVML_ERROR_NOT_SUPPORTED;
    }
    if (rc == NVML_SUCCESS && twin)
        rc = injected(twin, (int)idx);
    snprintf(own, sizeof(own), "nvmlDeviceGetFieldValues:%u", id);
    if (rc == NVML_SUCCESS)
        rc = injected(own, (int)idx);
    v->nvmlReturn = rc;
    v->valueType = type;
    v->latencyUsec = 0;
    if (rc != NVML_SUCCESS)
        return;
    if (type == VT_ULL)
        v->value.ullVal = value;
    else
        v->value.uiVal = (unsigned int)value;
}

/* NVML's semantics: SUCCESS once the values were attempted, each with its own nvmlReturn (a
 * field the GPU or driver lacks is NOT_SUPPORTED there, not in the call's result); the
 * call itself fails only for what fails every query on the device (lost GPU, bad handle). */
nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t device, int valuesCount,
                                      nvmlFieldValue_t *values) {
    const char *sym = "nvmlDeviceGetFieldValues";
    struct gpu *g = NULL;
    struct timespec now;
    long long us;
    int i;
    nvmlReturn_t rc = begin_device(sym, device, &g);
    if (rc == NVML_SUCCESS && (!values || valuesCount <= 0))
        rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc == NVML_SUCCESS) {
        clock_gettime(CLOCK_REALTIME, &now);
        us = (long long)now.tv_sec * 1000000LL + now.tv_nsec / 1000;
        for (i = 0; i < valuesCount; i++) {
            values[i].timestamp = us;
            field_value(g, device->index, &values[i]);
        }
    }
    return finish(sym, rc);
}

/* ---- events (critical Xid errors) ---- */

static struct fake_event_set *valid_set(nvmlEventSet_t set) {
    uintptr_t p = (uintptr_t)set, base = (uintptr_t)g_sets;
    if (p < base || p >= base + sizeof(g_sets) || (p - base) % sizeof(g_sets[0]))
        return NULL;
    return set->in_use ? set : NULL;
}

nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set) {
    const char *sym = "nvmlEventSetCreate";
    nvmlReturn_t rc = begin_query(sym);
    size_t i;
    if (rc == NVML_SUCCESS && !set)
        rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc == NVML_SUCCESS) {
        rc = NVML_ERROR_MEMORY;
        for (i = 0; i < MAX_EVENT_SETS; i++) {
            if (!g_sets[i].in_use) {
                memset(&g_sets[i], 0, sizeof(g_sets[i]));
                g_sets[i].in_use = 1;
                *set = &g_sets[i];
                rc = NVML_SUCCESS;
                break;
            }
        }
    }
    return finish(sym, rc);
}

nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set) {
    const char *sym = "nvmlEventSetFree";
    nvmlReturn_t rc = begin_query(sym);
    struct fake_event_set *s = valid_set(set);
    if (rc == NVML_SUCCESS && !s)
        rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc == NVML_SUCCESS)
        s->in_use = 0;
    return finish(sym, rc);
}

nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t device, unsigned long long *types) {
    const char *sym = "nvmlDeviceGetSupportedEventTypes";
    struct gpu *g = NULL;
    nvmlReturn_t rc = begin_device(sym, device, &g);
    if (rc == NVML_SUCCESS && !types)
        rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc == NVML_SUCCESS)
        *types = g->events;
    return finish(sym, rc);
}

/* Types the device does not support make the whole call NOT_SUPPORTED, as in
 * the real library. */
nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long types,
                                      nvmlEventSet_t set) {
    const char *sym = "nvmlDeviceRegisterEvents";
    struct gpu *g = NULL;
    nvmlReturn_t rc = begin_device(sym, device, &g);
    struct fake_event_set *s = valid_set(set);
    if (rc == NVML_SUCCESS && !s)
        rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc == NVML_SUCCESS && (types & ~g->events))
        rc = NVML_ERROR_NOT_SUPPORTED;
    if (rc == NVML_SUCCESS)
        s->types[g - g_state.gpus] |= types;
    return finish(sym, rc);
}

static int consumed(unsigned int id) {
    size_t i;
    for (i = 0; i < g_nconsumed; i++)
        if (g_consumed[i] == id)
            return 1;
    return 0;
}

/* The first `xid` event of the state file, not delivered yet, on a device the
 * set watches for Xids: fill *data, mark it delivered, return 1. */
static int next_xid(const struct fake_event_set *s, nvmlEventData_t *data) {
    size_t i;
    for (i = 0; i < g_state.nxids; i++) {
        const struct xid *x = &g_state.xids[i];
        if (!(s->types[x->gpu] & nvmlEventTypeXidCriticalError) || consumed(x->id))
            continue;
        if (g_nconsumed == g_cap_consumed) {
            size_t cap = g_cap_consumed ? g_cap_consumed * 2 : 256;
            unsigned int *p = realloc(g_consumed, cap * sizeof(*p));
            if (!p)
                return 0;
            g_consumed = p;
            g_cap_consumed = cap;
        }
        g_consumed[g_nconsumed++] = x->id;
        g_handles[x->gpu].index = x->gpu;
        data->device = &g_handles[x->gpu];
        data->eventType = nvmlEventTypeXidCriticalError;
        data->eventData = x->code;
        data->gpuInstanceId = NA_UINT;
        data->computeInstanceId = NA_UINT;
        return 1;
    }
    return 0;
}

static long elapsed_ms(const struct timespec *start) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (long)(now.tv_sec - start->tv_sec) * 1000 + (now.tv_nsec - start->tv_nsec) / 1000000;
}

/* Returns a pending event at once; otherwise looks again every EVENT_POLL_MS
 * (re-reading the state file, without holding the lock in between) until
 * timeoutms have passed, then NVML_ERROR_TIMEOUT. A lost GPU does not fail
 * the wait: its Xid (79, say) is still delivered, as the real driver does. */
nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data,
                                 unsigned int timeoutms) {
    const char *sym = "nvmlEventSetWait_v2";
    struct timespec start;
    clock_gettime(CLOCK_MONOTONIC, &start);
    for (;;) {
        nvmlReturn_t rc = begin_query(sym);
        struct fake_event_set *s = valid_set(set);
        long left;
        struct timespec ts;
        if (rc == NVML_SUCCESS && (!s || !data))
            rc = NVML_ERROR_INVALID_ARGUMENT;
        if (rc != NVML_SUCCESS)
            return finish(sym, rc);
        if (next_xid(s, data))
            return finish(sym, NVML_SUCCESS);
        left = (long)timeoutms - elapsed_ms(&start);
        if (left <= 0)
            return finish(sym, NVML_ERROR_TIMEOUT);
        pthread_mutex_unlock(&g_lock);
        if (left > EVENT_POLL_MS)
            left = EVENT_POLL_MS;
        ts.tv_sec = left / 1000;
        ts.tv_nsec = (left % 1000) * 1000000L;
        while (nanosleep(&ts, &ts) && errno == EINTR)
            ;
    }
}
