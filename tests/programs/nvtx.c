// link: cudart
/* NVTX's injection, as NVTX v3's header-only loader does it (nvtxDetail/nvtxInit.h, nvtxImpl.h):
 * dlopen(getenv("NVTX_INJECTION64_PATH"), RTLD_LAZY), dlsym "InitializeInjectionNvtx2", call it
 * with our nvtxGetExportTable, whose NVTX_ETID_CALLBACKS table's GetModuleFunctionTable hands
 * out the CORE and CORE2 tables of function-pointer slots (index 0 and the last one null). Then
 * the program calls NVTX the way nvtxRangePushA & co. do: through the slots, around stand-in
 * allocations. Slots the tool left empty are NVTX's no-ops (here: not called; the program says
 * which slots were filled). The types are NVTX's, written out (nvtxTypes.h).
 *
 *   outer (push A)           cudaMalloc a 1 MiB
 *     inner (push Ex)        cudaMalloc b 2 MiB, cudaFree b
 *   mark "after inner"       cudaFree a
 *   wide (push W)            nothing
 *   async (start A, ended by another thread)   cudaMalloc c 4 MiB, cudaFree c
 *   dom: registered (domain push Ex, registered string)   cudaMalloc d 1 MiB, cudaFree d
 *   a pop with nothing open returns a negative level
 */
#include "common.h"
#include <pthread.h>
#include <wchar.h>

typedef void (*NvtxFunctionPointer)(void);
typedef NvtxFunctionPointer **NvtxFunctionTable;
typedef const void *(*NvtxGetExportTableFunc_t)(uint32_t exportTableId);
typedef int (*NvtxInitializeInjectionNvtxFunc_t)(NvtxGetExportTableFunc_t exportTable);

typedef struct NvtxExportTableCallbacks {
    size_t struct_size;
    int (*GetModuleFunctionTable)(int module, NvtxFunctionTable *out_table, unsigned int *out_size);
} NvtxExportTableCallbacks;

typedef union {
    const char *ascii;
    const wchar_t *unicode;
    const void *registered;
} nvtxMessageValue_t;

typedef struct nvtxEventAttributes_v2 {
    uint16_t version;
    uint16_t size;
    uint32_t category;
    int32_t colorType;
    uint32_t color;
    int32_t payloadType;
    int32_t reserved0;
    union {
        uint64_t ullValue;
        int64_t llValue;
        double dValue;
    } payload;
    int32_t messageType;
    nvtxMessageValue_t message;
} nvtxEventAttributes_t;

typedef void (*markA_t)(const char *);
typedef void (*markEx_t)(const nvtxEventAttributes_t *);
typedef uint64_t (*rangeStartA_t)(const char *);
typedef void (*rangeEnd_t)(uint64_t);
typedef int (*rangePushA_t)(const char *);
typedef int (*rangePushW_t)(const wchar_t *);
typedef int (*rangePushEx_t)(const nvtxEventAttributes_t *);
typedef int (*rangePop_t)(void);
typedef void *(*domainCreateA_t)(const char *);
typedef const void *(*domainRegisterStringA_t)(void *, const char *);
typedef int (*domainRangePushEx_t)(void *, const nvtxEventAttributes_t *);
typedef int (*domainRangePop_t)(void *);

enum { CORE_SIZE = 16, CORE2_SIZE = 16 };

/* The implementation slots, as nvtxGlobals_t holds them (NULL: NVTX's no-op). */
static NvtxFunctionPointer core[CORE_SIZE];
static NvtxFunctionPointer core2[CORE2_SIZE];
static NvtxFunctionPointer *table_core[CORE_SIZE + 1];
static NvtxFunctionPointer *table_core2[CORE2_SIZE + 1];

static int get_module_function_table(int module, NvtxFunctionTable *out_table, unsigned int *out_size) {
    NvtxFunctionPointer **t;
    unsigned int bytes;
    switch (module) {
    case 1: /* NVTX_CB_MODULE_CORE */
        t = table_core;
        bytes = sizeof table_core;
        break;
    case 5: /* NVTX_CB_MODULE_CORE2 */
        t = table_core2;
        bytes = sizeof table_core2;
        break;
    default:
        return 0;
    }
    if (out_size)
        *out_size = bytes / (unsigned int)sizeof(NvtxFunctionPointer *) - 1;
    if (out_table)
        *out_table = t;
    return 1;
}

static const NvtxExportTableCallbacks callbacks = {sizeof(NvtxExportTableCallbacks), get_module_function_table};

static const void *get_export_table(uint32_t id) { return id == 1 /* NVTX_ETID_CALLBACKS */ ? &callbacks : NULL; }

static int load_injection(void) {
    for (int i = 1; i < CORE_SIZE; i++)
        table_core[i] = &core[i];
    for (int i = 1; i < CORE2_SIZE; i++)
        table_core2[i] = &core2[i];
    const char *path = getenv("NVTX_INJECTION64_PATH");
    if (!path) {
        say("nvtx: no injection library");
        return 0;
    }
    void *h = dlopen(path, RTLD_LAZY);
    if (!h) {
        say("nvtx: dlopen failed");
        return 0;
    }
    NvtxInitializeInjectionNvtxFunc_t init = (NvtxInitializeInjectionNvtxFunc_t)dlsym(h, "InitializeInjectionNvtx2");
    if (!init) {
        say("nvtx: no InitializeInjectionNvtx2");
        dlclose(h);
        return 0;
    }
    int r = init(get_export_table);
    say("nvtx: InitializeInjectionNvtx2 returned %d", r);
    char filled[64] = "", filled2[64] = "";
    for (int i = 1; i < CORE_SIZE; i++)
        if (core[i])
            snprintf(filled + strlen(filled), sizeof filled - strlen(filled), " %d", i);
    for (int i = 1; i < CORE2_SIZE; i++)
        if (core2[i])
            snprintf(filled2 + strlen(filled2), sizeof filled2 - strlen(filled2), " %d", i);
    say("nvtx: core slots filled:%s", filled);
    say("nvtx: core2 slots filled:%s", filled2);
    if (r == 0)
        dlclose(h);
    return r;
}

static uint64_t async_id;

static void *end_async(void *arg) {
    (void)arg;
    ((rangeEnd_t)core[7])(async_id);
    return NULL;
}

static void *dev(size_t size, const char *label) {
    void *p = NULL;
    int rc = cudaMalloc(&p, size);
    ev("cudaMalloc", rc, "size=%zu ptr=%s", size, AP(rc, U64(p), label));
    return p;
}

static void release(void *p, const char *label) {
    int rc = cudaFree(p);
    ev("cudaFree", rc, "ptr=@%s", label);
}

int main(void) {
    setup();
    if (!load_injection()) {
        say("done");
        return 0;
    }
    rangePushA_t pushA = (rangePushA_t)core[9];
    rangePushEx_t pushEx = (rangePushEx_t)core[8];
    rangePushW_t pushW = (rangePushW_t)core[10];
    rangePop_t pop = (rangePop_t)core[11];
    markA_t markA = (markA_t)core[2];
    markEx_t markEx = (markEx_t)core[1];
    rangeStartA_t startA = (rangeStartA_t)core[5];

    say("push outer -> %d", pushA("outer"));
    void *a = dev(1 << 20, "a");
    nvtxEventAttributes_t attr = {0};
    attr.version = 3;
    attr.size = sizeof attr;
    attr.messageType = 1; /* NVTX_MESSAGE_TYPE_ASCII */
    attr.message.ascii = "inner";
    say("push inner -> %d", pushEx(&attr));
    void *b = dev(2 << 20, "b");
    release(b, "b");
    say("pop inner -> %d", pop());
    markA("after inner");
    release(a, "a");
    say("pop outer -> %d", pop());
    say("push wide -> %d", pushW(L"wide \u00e9"));
    say("pop wide -> %d", pop());
    say("pop nothing open -> %s", pop() < 0 ? "negative" : "not negative");

    async_id = startA("async");
    say("start async -> id %s", async_id ? "nonzero" : "zero");
    void *c = dev(4 << 20, "c");
    release(c, "c");
    pthread_t t;
    pthread_create(&t, NULL, end_async, NULL);
    pthread_join(t, NULL);

    void *dom = ((domainCreateA_t)core2[12])("dom");
    const void *reg = ((domainRegisterStringA_t)core2[10])(dom, "registered");
    const void *reg2 = ((domainRegisterStringA_t)core2[10])(dom, "registered");
    say("registered twice -> same handle %d", reg == reg2);
    nvtxEventAttributes_t dattr = {0};
    dattr.version = 3;
    dattr.size = sizeof dattr;
    dattr.messageType = 3; /* NVTX_MESSAGE_TYPE_REGISTERED */
    dattr.message.registered = reg;
    say("domain push -> %d", ((domainRangePushEx_t)core2[4])(dom, &dattr));
    void *d = dev(1 << 20, "d");
    release(d, "d");
    attr.message.ascii = "marked";
    markEx(&attr);
    say("domain pop -> %d", ((domainRangePop_t)core2[5])(dom));
    say("done");
    return 0;
}
