/*
 * The subset of cuda.h and cuda_runtime_api.h that the stand-in libraries and the test programs
 * use: real type layouts, real enum values, real exported names (no `#define cuMemAlloc
 * cuMemAlloc_v2` games: every name here is the exported symbol itself).
 *
 * How the stand-ins (driver_*.c = libcuda.so.1, runtime.c = libcudart.so.13) behave:
 *
 * - Device memory is host memory: a device address can be read and written directly. Plain,
 *   async, managed, pitched and graph allocations come from one arena (STANDIN_MEM_BYTES,
 *   default 1 GiB), first fit, 256-byte aligned; the latest freed address that fits is handed
 *   straight back (free(A); alloc(same size) == A). cuMemCreate counts against the same budget.
 *   Freed arena memory stays readable and writable (as in a real driver's sub-allocator), so a
 *   stale write lands silently. The v1 cuMemAlloc (resolver at version < 3020) returns 32-bit
 *   addresses from a separate low arena; cuMemFree_v2 frees those too.
 * - VMM is real: cuMemCreate is a memfd, cuMemMap maps it MAP_SHARED (two mappings alias),
 *   reserved or mapped-without-access space faults on touch (PROT_NONE), cuMemSetAccess sets
 *   PROT_READ[/WRITE]. Granularity STANDIN_GRANULARITY (default 64 KiB).
 * - Copies and sets validate their ranges like a driver (CUDA_ERROR_INVALID_VALUE, no fault):
 *   the device side must be in the arena, pinned/registered host memory, or an accessible VMM
 *   mapping. Stand-in kernels are host code and are not checked.
 * - Streams are deferred: work on a created stream (memset, memcpy, launch, cuMemFreeAsync,
 *   event record, wait) runs, in order, only when something waits for it: cuStreamSynchronize
 *   or cuStreamQuery (both return success after running it; queries never say NOT_READY),
 *   cuEventSynchronize/cuEventQuery (up to that event), cuStreamWaitEvent (when the waiting
 *   stream gets there), cuCtxSynchronize / cudaDeviceSynchronize (everything), any synchronous
 *   copy or set, cuMemFree_v2, cuMemFreeHost (everything first), cuStreamDestroy (that stream).
 *   Work on the legacy stream (0 / CU_STREAM_LEGACY) first runs every blocking stream (not
 *   CU_STREAM_NON_BLOCKING ones), then runs at once; the per-thread stream
 *   (CU_STREAM_PER_THREAD, or 0 in a _ptsz/_ptds export) runs at once. STANDIN_SYNC=1 runs all
 *   stream work at once. cuMemAllocAsync hands out the address at once; the cuMemFreeAsync'd
 *   address is reusable only after the stream ran the free. cuEventElapsedTime says
 *   CUDA_ERROR_NOT_READY for events whose stream has not run yet.
 * - Kernels: standin_register_kernel() gives a CUfunction (also the `func` of cudaLaunchKernel);
 *   launches copy the parameter values at enqueue and call the host function when the stream
 *   runs, on whichever thread drains the stream. cuModuleLoadData accepts any image;
 *   cuModuleGetFunction finds registered kernels by name in any module. An image with
 *   isolate's `isolate_verify_many` kernel gets it, run on the host, and its isolate_ring
 *   global (cuModuleGetGlobal_v2), so CI runs isolate's asynchronous release as a GPU does.
 * - Device faults: only standin_touch() makes one (an access to memory that is not accessible,
 *   such as unmapped VMM space); the context then keeps CUDA_ERROR_ILLEGAL_ADDRESS as its sticky
 *   error, returned by synchronisations, launches, device allocations and frees, copies and sets.
 *   STANDIN_VA_BYTES limits the address space cuMemAddressReserve may hold (default: none).
 * - Contexts: thread-local. Driver memory/stream calls on a thread without a current context
 *   return CUDA_ERROR_INVALID_CONTEXT (201); the runtime makes the current device's primary
 *   context current on a thread's first runtime call. STANDIN_DEVICES (default 1; 0 makes cuInit
 *   return CUDA_ERROR_NO_DEVICE). cudaMalloc/cudaMallocAsync/cudaMallocHost/cudaHostAlloc of
 *   0 bytes succeed with NULL without calling the driver; cudaFree(NULL), cudaFreeHost(NULL)
 *   too.
 * - cuGetProcAddress[_v2] resolves base names only (never "cuMemAlloc_v2"), from a static
 *   table, newest ABI not newer than the asked version; versions above 13000 are
 *   CUDA_ERROR_INVALID_VALUE. cudaGetDriverEntryPoint* return cudaSuccess with NULL and the
 *   status for unknown names (CUDA 12+ behaviour).
 */
#ifndef ISOLATE_CUDA_STANDIN_H
#define ISOLATE_CUDA_STANDIN_H

#include <stddef.h>
#include <stdint.h>

/* The toolkit this header stands in for; the stand-in driver reports 13000 too. */
#define CUDA_VERSION 13000
#define CUDART_VERSION 13000

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- driver types */

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef unsigned int CUdeviceptr_v1; /* the 32-bit device pointer of the CUDA < 3.2 ABI */
typedef int CUdevice;
typedef uint64_t cuuint64_t;
typedef struct CUctx_st *CUcontext;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;
typedef struct CUmemPoolHandle_st *CUmemoryPool;
typedef struct CUgraph_st *CUgraph;
typedef struct CUgraphNode_st *CUgraphNode;
typedef unsigned long long CUmemGenericAllocationHandle;

enum {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_NOT_INITIALIZED = 3,
    CUDA_ERROR_DEINITIALIZED = 4,
    CUDA_ERROR_NO_DEVICE = 100,
    CUDA_ERROR_INVALID_DEVICE = 101,
    CUDA_ERROR_INVALID_IMAGE = 200,
    CUDA_ERROR_INVALID_CONTEXT = 201,
    CUDA_ERROR_INVALID_HANDLE = 400,
    CUDA_ERROR_NOT_FOUND = 500,
    CUDA_ERROR_NOT_READY = 600,
    CUDA_ERROR_ILLEGAL_ADDRESS = 700,
    CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED = 712,
    CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED = 713,
    CUDA_ERROR_LAUNCH_FAILED = 719,
    CUDA_ERROR_NOT_PERMITTED = 800,
    CUDA_ERROR_NOT_SUPPORTED = 801,
    CUDA_ERROR_UNKNOWN = 999,
};

/* Special stream handles. */
#define CU_STREAM_LEGACY ((CUstream)0x1)
#define CU_STREAM_PER_THREAD ((CUstream)0x2)
enum { CU_STREAM_DEFAULT = 0, CU_STREAM_NON_BLOCKING = 1 };
enum { CU_EVENT_DEFAULT = 0, CU_EVENT_BLOCKING_SYNC = 1, CU_EVENT_DISABLE_TIMING = 2,
       CU_EVENT_INTERPROCESS = 4 };

enum { CU_MEM_ATTACH_GLOBAL = 1, CU_MEM_ATTACH_HOST = 2, CU_MEM_ATTACH_SINGLE = 4 };
enum { CU_MEMHOSTALLOC_PORTABLE = 1, CU_MEMHOSTALLOC_DEVICEMAP = 2,
       CU_MEMHOSTALLOC_WRITECOMBINED = 4 };
enum { CU_MEMHOSTREGISTER_PORTABLE = 1, CU_MEMHOSTREGISTER_DEVICEMAP = 2,
       CU_MEMHOSTREGISTER_IOMEMORY = 4, CU_MEMHOSTREGISTER_READ_ONLY = 8 };

/* cuGetProcAddress */
typedef enum CUdriverProcAddressQueryResult_enum {
    CU_GET_PROC_ADDRESS_SUCCESS = 0,
    CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND = 1,
    CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT = 2,
} CUdriverProcAddressQueryResult;
enum {
    CU_GET_PROC_ADDRESS_DEFAULT = 0,
    CU_GET_PROC_ADDRESS_LEGACY_STREAM = 1 << 0,
    CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM = 1 << 1,
};

/* Virtual memory management. */
typedef enum CUmemAllocationType_enum {
    CU_MEM_ALLOCATION_TYPE_INVALID = 0,
    CU_MEM_ALLOCATION_TYPE_PINNED = 1,
} CUmemAllocationType;
typedef enum CUmemAllocationHandleType_enum {
    CU_MEM_HANDLE_TYPE_NONE = 0,
    CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR = 1,
    CU_MEM_HANDLE_TYPE_WIN32 = 2,
    CU_MEM_HANDLE_TYPE_WIN32_KMT = 4,
    CU_MEM_HANDLE_TYPE_FABRIC = 8,
} CUmemAllocationHandleType;
typedef enum CUmemLocationType_enum {
    CU_MEM_LOCATION_TYPE_INVALID = 0,
    CU_MEM_LOCATION_TYPE_DEVICE = 1,
    CU_MEM_LOCATION_TYPE_HOST = 2,
    CU_MEM_LOCATION_TYPE_HOST_NUMA = 3,
    CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT = 4,
} CUmemLocationType;
typedef enum CUmemAccess_flags_enum {
    CU_MEM_ACCESS_FLAGS_PROT_NONE = 0,
    CU_MEM_ACCESS_FLAGS_PROT_READ = 1,
    CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 3,
} CUmemAccess_flags;
typedef enum CUmemAllocationGranularity_flags_enum {
    CU_MEM_ALLOC_GRANULARITY_MINIMUM = 0,
    CU_MEM_ALLOC_GRANULARITY_RECOMMENDED = 1,
} CUmemAllocationGranularity_flags;

typedef struct CUmemLocation_st {
    CUmemLocationType type;
    int id;
} CUmemLocation;

typedef struct CUmemAllocationProp_st {
    CUmemAllocationType type;
    CUmemAllocationHandleType requestedHandleTypes;
    CUmemLocation location;
    void *win32HandleMetaData;
    struct {
        unsigned char compressionType;
        unsigned char gpuDirectRDMACapable;
        unsigned short usage;
        unsigned char reserved[4];
    } allocFlags;
} CUmemAllocationProp;

typedef struct CUmemAccessDesc_st {
    CUmemLocation location;
    CUmemAccess_flags flags;
} CUmemAccessDesc;

typedef struct CUmemPoolProps_st {
    CUmemAllocationType allocType;
    CUmemAllocationHandleType handleTypes;
    CUmemLocation location;
    void *win32SecurityAttributes;
    size_t maxSize;
    unsigned short usage;
    unsigned char reserved[54];
} CUmemPoolProps;

typedef enum CUmemPool_attribute_enum {
    CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES = 1,
    CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC = 2,
    CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES = 3,
    CU_MEMPOOL_ATTR_RELEASE_THRESHOLD = 4,
    CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT = 5,
    CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH = 6,
    CU_MEMPOOL_ATTR_USED_MEM_CURRENT = 7,
    CU_MEMPOOL_ATTR_USED_MEM_HIGH = 8,
} CUmemPool_attribute;

typedef struct CUDA_MEM_ALLOC_NODE_PARAMS_v1_st {
    CUmemPoolProps poolProps;
    const CUmemAccessDesc *accessDescs;
    size_t accessDescCount;
    size_t bytesize;
    CUdeviceptr dptr;
} CUDA_MEM_ALLOC_NODE_PARAMS;

/* Launches. `CUlaunchAttributeValue` is a 64-byte union in cuda.h; only its size matters here. */
typedef struct CUlaunchAttribute_st {
    int id; /* CUlaunchAttributeID */
    char pad[4];
    char value[64];
} CUlaunchAttribute;

typedef struct CUlaunchConfig_st {
    unsigned int gridDimX;
    unsigned int gridDimY;
    unsigned int gridDimZ;
    unsigned int blockDimX;
    unsigned int blockDimY;
    unsigned int blockDimZ;
    unsigned int sharedMemBytes;
    CUstream hStream;
    CUlaunchAttribute *attrs;
    unsigned int numAttrs;
} CUlaunchConfig;

#define CU_LAUNCH_PARAM_END ((void *)0x00)
#define CU_LAUNCH_PARAM_BUFFER_POINTER ((void *)0x01)
#define CU_LAUNCH_PARAM_BUFFER_SIZE ((void *)0x02)

_Static_assert(sizeof(CUmemAllocationProp) == 32, "CUmemAllocationProp layout");
_Static_assert(sizeof(CUmemAccessDesc) == 12, "CUmemAccessDesc layout");
_Static_assert(sizeof(CUmemPoolProps) == 88, "CUmemPoolProps layout");
_Static_assert(sizeof(CUDA_MEM_ALLOC_NODE_PARAMS) == 120, "CUDA_MEM_ALLOC_NODE_PARAMS layout");
_Static_assert(offsetof(CUDA_MEM_ALLOC_NODE_PARAMS, dptr) == 112, "dptr offset");
_Static_assert(offsetof(CUlaunchConfig, hStream) == 32, "CUlaunchConfig layout");
_Static_assert(sizeof(CUlaunchConfig) == 56, "CUlaunchConfig size");
_Static_assert(sizeof(CUlaunchAttribute) == 72, "CUlaunchAttribute size");

/* ---------------------------------------------------------------- driver exports */

CUresult cuInit(unsigned int Flags);
CUresult cuDriverGetVersion(int *driverVersion);
CUresult cuDeviceGet(CUdevice *device, int ordinal);
CUresult cuDeviceGetCount(int *count);
CUresult cuDeviceGetName(char *name, int len, CUdevice dev);
CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev);
typedef struct CUuuid_st {
    char bytes[16];
} CUuuid;
CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice dev);
CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev);
CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev);
CUresult cuDevicePrimaryCtxRelease(CUdevice dev); /* the pre-11.0 export, same ABI */
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev);
/* Frees every live device allocation (their contents lost) and resets the primary context. */
CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev);
CUresult cuDevicePrimaryCtxReset(CUdevice dev); /* the pre-11.0 export, same ABI and effect */
CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev);
CUresult cuCtxDestroy_v2(CUcontext ctx);
CUresult cuCtxGetCurrent(CUcontext *pctx);
CUresult cuCtxSetCurrent(CUcontext ctx);
CUresult cuCtxGetDevice(CUdevice *device);
CUresult cuCtxSynchronize(void);
CUresult cuCtxSynchronize_v2(CUcontext ctx); /* CUDA 13: that context, or the current for NULL */
CUresult cuMemGetInfo_v2(size_t *free, size_t *total);
CUresult cuGetErrorName(CUresult error, const char **pStr);
CUresult cuGetErrorString(CUresult error, const char **pStr);

CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize);
CUresult cuMemAlloc(CUdeviceptr_v1 *dptr, unsigned int bytesize); /* the CUDA < 3.2 ABI */
CUresult cuMemFree_v2(CUdeviceptr dptr);
CUresult cuMemFree(CUdeviceptr_v1 dptr); /* the CUDA < 3.2 ABI */
CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream);
CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream);
CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream);
CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream);
CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                 CUstream hStream);
CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                      CUstream hStream);
CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool_out, CUdevice dev);
CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *poolProps);
CUresult cuMemPoolDestroy(CUmemoryPool pool);
CUresult cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value);
CUresult cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value);
CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t minBytesToKeep);
CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags);
CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes,
                            size_t Height, unsigned int ElementSizeBytes);
CUresult cuMemAllocHost_v2(void **pp, size_t bytesize);
CUresult cuMemHostAlloc(void **pp, size_t bytesize, unsigned int Flags);
CUresult cuMemFreeHost(void *p);
CUresult cuMemHostRegister(void *p, size_t bytesize, unsigned int Flags); /* pre-6.5, same ABI */
CUresult cuMemHostRegister_v2(void *p, size_t bytesize, unsigned int Flags);
CUresult cuMemHostUnregister(void *p);
CUresult cuMemGetAddressRange_v2(CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr);

/* CUDA IPC: 64 opaque bytes naming device memory of another process. */
typedef struct CUipcMemHandle_st {
    char reserved[64];
} CUipcMemHandle;
#define CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS 0x1
CUresult cuIpcGetMemHandle(CUipcMemHandle *pHandle, CUdeviceptr dptr);
CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int Flags);
CUresult cuIpcCloseMemHandle(CUdeviceptr dptr);

CUresult cuMemGetAllocationGranularity(size_t *granularity, const CUmemAllocationProp *prop,
                                       CUmemAllocationGranularity_flags option);
CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
                             unsigned long long flags);
CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size);
CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                     const CUmemAllocationProp *prop, unsigned long long flags);
CUresult cuMemRelease(CUmemGenericAllocationHandle handle);
CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr);
CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                  CUmemGenericAllocationHandle handle, unsigned long long flags);
CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count);
CUresult cuMemUnmap(CUdeviceptr ptr, size_t size);

CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount);
CUresult cuMemcpyHtoD_v2(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount);
CUresult cuMemcpyDtoH_v2(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount);
CUresult cuMemcpyDtoD_v2(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount);
CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount, CUstream hStream);
CUresult cuMemcpyAsync_ptsz(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount,
                            CUstream hStream);
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount,
                              CUstream hStream);
CUresult cuMemcpyHtoDAsync_v2_ptsz(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount,
                                   CUstream hStream);
CUresult cuMemcpyDtoHAsync_v2(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount,
                              CUstream hStream);
CUresult cuMemcpyDtoHAsync_v2_ptsz(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount,
                                   CUstream hStream);
CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount,
                              CUstream hStream);
CUresult cuMemcpyDtoDAsync_v2_ptsz(CUdeviceptr dstDevice, CUdeviceptr srcDevice,
                                   size_t ByteCount, CUstream hStream);
CUresult cuMemsetD8_v2(CUdeviceptr dstDevice, unsigned char uc, size_t N);
CUresult cuMemsetD32_v2(CUdeviceptr dstDevice, unsigned int ui, size_t N);
CUresult cuMemsetD8Async(CUdeviceptr dstDevice, unsigned char uc, size_t N, CUstream hStream);
CUresult cuMemsetD8Async_ptsz(CUdeviceptr dstDevice, unsigned char uc, size_t N,
                              CUstream hStream);
CUresult cuMemsetD32Async(CUdeviceptr dstDevice, unsigned int ui, size_t N, CUstream hStream);
CUresult cuMemsetD32Async_ptsz(CUdeviceptr dstDevice, unsigned int ui, size_t N,
                               CUstream hStream);
/* The per-thread-default-stream exports of the synchronous copies and sets (what the resolver
 * hands out with CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM). */
CUresult cuMemcpy_ptds(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount);
CUresult cuMemcpyHtoD_v2_ptds(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount);
CUresult cuMemcpyDtoH_v2_ptds(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount);
CUresult cuMemcpyDtoD_v2_ptds(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount);
CUresult cuMemsetD8_v2_ptds(CUdeviceptr dstDevice, unsigned char uc, size_t N);
CUresult cuMemsetD32_v2_ptds(CUdeviceptr dstDevice, unsigned int ui, size_t N);

CUresult cuStreamCreate(CUstream *phStream, unsigned int Flags);
CUresult cuStreamCreateWithPriority(CUstream *phStream, unsigned int flags, int priority);
CUresult cuStreamDestroy(CUstream hStream); /* pre-4.0 export, same ABI */
CUresult cuStreamDestroy_v2(CUstream hStream);
CUresult cuStreamGetFlags(CUstream hStream, unsigned int *flags);
CUresult cuStreamSynchronize(CUstream hStream);
CUresult cuStreamSynchronize_ptsz(CUstream hStream);
CUresult cuStreamQuery(CUstream hStream);
/* Capture is not emulated: standin_set_capturing (or a capture's begin and end, which make no
 * graph) marks a created stream, cuStreamIsCapturing reports it (0 none, 1 active). */
CUresult cuStreamIsCapturing(CUstream hStream, int *status);
CUresult cuStreamBeginCapture_v2(CUstream hStream, int mode);
CUresult cuStreamBeginCapture(CUstream hStream); /* CUDA 10.0's, no mode */
CUresult cuStreamEndCapture(CUstream hStream, void **graph);
int standin_set_capturing(CUstream hStream, int on);
/* From now on nothing on the device finishes: synchronising calls wait for good, queries say
 * CUDA_ERROR_NOT_READY (a hung kernel, for the exit check's time limit). */
void standin_device_stuck(void);
CUresult cuStreamQuery_ptsz(CUstream hStream);
CUresult cuStreamWaitEvent(CUstream hStream, CUevent hEvent, unsigned int Flags);
CUresult cuStreamWaitEvent_ptsz(CUstream hStream, CUevent hEvent, unsigned int Flags);
CUresult cuEventCreate(CUevent *phEvent, unsigned int Flags);
CUresult cuEventRecord(CUevent hEvent, CUstream hStream);
CUresult cuEventRecord_ptsz(CUevent hEvent, CUstream hStream);
CUresult cuEventSynchronize(CUevent hEvent);
CUresult cuEventQuery(CUevent hEvent);
CUresult cuEventDestroy(CUevent hEvent); /* pre-4.0 export, same ABI */
CUresult cuEventDestroy_v2(CUevent hEvent);
CUresult cuEventElapsedTime(float *pMilliseconds, CUevent hStart, CUevent hEnd);
CUresult cuEventElapsedTime_v2(float *pMilliseconds, CUevent hStart, CUevent hEnd); /* 12.8+ */

CUresult cuModuleLoadData(CUmodule *module, const void *image);
CUresult cuModuleUnload(CUmodule hmod);
CUresult cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, const char *name);
/* Only isolate's verification module has a global (isolate_ring); see driver_launch.c. */
CUresult cuModuleGetGlobal_v2(CUdeviceptr *dptr, size_t *bytes, CUmodule hmod, const char *name);
CUresult cuFuncGetParamInfo(CUfunction func, size_t paramIndex, size_t *paramOffset,
                            size_t *paramSize);
CUresult cuFuncGetName(const char **name, CUfunction hfunc);
CUresult cuFuncLoad(CUfunction function);
CUresult cuOccupancyMaxActiveBlocksPerMultiprocessor(int *numBlocks, CUfunction func, int blockSize,
                                                     size_t dynamicSMemSize);
/* CUDA 12.4 / 12.3: the same for a CUkernel (a library's kernel, context-independent). */
typedef struct CUfunc_st *CUkernel;
CUresult cuKernelGetParamInfo(CUkernel kernel, size_t paramIndex, size_t *paramOffset,
                              size_t *paramSize);
CUresult cuKernelGetName(const char **name, CUkernel hfunc);
CUresult cuFuncGetParamCount(CUfunction func, size_t *paramCount);
CUresult cuKernelGetParamCount(CUkernel kernel, size_t *paramCount);
CUresult cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                        unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY,
                        unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream,
                        void **kernelParams, void **extra);
CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                             unsigned int gridDimZ, unsigned int blockDimX,
                             unsigned int blockDimY, unsigned int blockDimZ,
                             unsigned int sharedMemBytes, CUstream hStream, void **kernelParams,
                             void **extra);
CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **kernelParams,
                          void **extra);
CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *config, CUfunction f, void **kernelParams,
                               void **extra);
CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                   unsigned int gridDimZ, unsigned int blockDimX,
                                   unsigned int blockDimY, unsigned int blockDimZ,
                                   unsigned int sharedMemBytes, CUstream hStream,
                                   void **kernelParams);
CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned int gridDimX,
                                        unsigned int gridDimY, unsigned int gridDimZ,
                                        unsigned int blockDimX, unsigned int blockDimY,
                                        unsigned int blockDimZ, unsigned int sharedMemBytes,
                                        CUstream hStream, void **kernelParams);

CUresult cuGraphCreate(CUgraph *phGraph, unsigned int flags);
CUresult cuGraphAddMemAllocNode(CUgraphNode *phGraphNode, CUgraph hGraph,
                                const CUgraphNode *dependencies, size_t numDependencies,
                                CUDA_MEM_ALLOC_NODE_PARAMS *nodeParams);
CUresult cuGraphAddMemFreeNode(CUgraphNode *phGraphNode, CUgraph hGraph,
                               const CUgraphNode *dependencies, size_t numDependencies,
                               CUdeviceptr dptr);
CUresult cuGraphDestroy(CUgraph hGraph);
CUresult cuDeviceGraphMemTrim(CUdevice device);

CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags);
CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion,
                             cuuint64_t flags, CUdriverProcAddressQueryResult *symbolStatus);

/* Stand-in only: a host function that plays a kernel. `fn` gets the launch's parameter
 * pointers (one per parameter, as cuLaunchKernel's kernelParams, pointing at copies taken when
 * the launch was enqueued); `offsets`/`sizes` describe the parameter buffer as
 * cuFuncGetParamInfo reports it (NULL offsets: packed at natural alignment; NULL sizes: 8
 * bytes each). Works before cuInit. Exported by the stand-in driver and, forwarding to it, by
 * the stand-in runtime (so a `// link: cudart` program can call it); the resolver also hands
 * it out under its own name. The returned CUfunction is what cudaLaunchKernel takes as `func`. */
typedef void (*standin_kernel_fn)(void **params);
CUfunction standin_register_kernel(const char *name, standin_kernel_fn fn, unsigned nparams,
                                   const size_t *offsets, const size_t *sizes);
/* As standin_register_kernel, as another kind of handle: `kind` 1, a library's kernel (a
 * CUkernel, as the CUDA 12+ runtime launches its kernels through cuLaunchKernel): the
 * cuFuncGet* queries fail on it (CUDA_ERROR_INVALID_HANDLE) and the cuKernelGet* ones answer;
 * `kind` 2, a function whose parameter layout no query gives (a driver before 12.4): both
 * param-info queries fail, cuFuncGetName answers. Kind 0 is standin_register_kernel's. */
CUfunction standin_register_kernel_as(int kind, const char *name, standin_kernel_fn fn,
                                      unsigned nparams, const size_t *offsets,
                                      const size_t *sizes);
/* How often cuFuncGetParamInfo has been called in this process (every call, failed ones too). */
unsigned long standin_param_info_calls(void);
/* Failed kernel queries (cuFunc/cuKernel GetParamInfo, GetParamCount, GetName) in this process:
 * each one a line in a real driver's error log (CUDA_LOG_FILE). */
unsigned long standin_kernel_query_errors(void);
/* cuCtxGetDevice calls made with no context current in this process (each a line in a real
 * driver's error log). */
unsigned long standin_ctx_device_errors(void);

/* How many kernels have run (not merely been enqueued) in this process. */
unsigned long standin_kernels_run(void);
/* What a kernel's access to [p, p+n) does on a GPU: 1 when all of it is accessible; else 0,
 * and the context the kernel was launched in (outside a kernel: the calling thread's current
 * context) faults with the sticky error CUDA_ERROR_ILLEGAL_ADDRESS (see the top comment of
 * driver_internal.h for the calls that return it from then on). Never raises SIGSEGV. */
int standin_touch(CUdeviceptr p, size_t n);
/* The driver's teardown as the CUDA runtime's exit handler does it (the stand-in runtime
 * registers it with atexit at its first call, as libcudart does): every later call that needs
 * the driver answers CUDA_ERROR_DEINITIALIZED. On the H100, a check made from the library's
 * destructor (which runs after the runtime's handler) got no answer from the device any more:
 * an exit check must run from an atexit handler registered after the runtime's. */
void standin_shutdown(void);
/* The address reservations (cuMemAddressReserve) held now; their total size in *bytes. */
unsigned long standin_reserved(size_t *bytes);
/* Another process's memory on the same device: taken and given back directly (no CUDA call a
 * preloaded library could see). 0 when the device has no room. */
uintptr_t standin_tenant_alloc(size_t bytes);
void standin_tenant_free(uintptr_t p);

/* Function pointer types for the cuGetProcAddress paths. */
typedef CUresult (*PFN_cuGetProcAddress_v2)(const char *, void **, int, cuuint64_t,
                                            CUdriverProcAddressQueryResult *);
typedef CUresult (*PFN_cuGetProcAddress_v1)(const char *, void **, int, cuuint64_t);

/* ---------------------------------------------------------------- runtime types */

typedef int cudaError_t;
typedef struct CUstream_st *cudaStream_t;
typedef struct CUevent_st *cudaEvent_t;
typedef struct CUmemPoolHandle_st *cudaMemPool_t;
typedef struct CUfunc_st *cudaFunction_t;

enum {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInitializationError = 3,
    cudaErrorCudartUnloading = 4,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorInvalidPitchValue = 12,
    cudaErrorInvalidDevicePointer = 17, /* deprecated since 10.1: invalid pointers give 1 */
    cudaErrorInvalidMemcpyDirection = 21,
    cudaErrorInsufficientDriver = 35,
    cudaErrorInvalidDeviceFunction = 98,
    cudaErrorNoDevice = 100,
    cudaErrorInvalidDevice = 101,
    cudaErrorInvalidKernelImage = 200,
    cudaErrorDeviceUninitialized = 201, /* CUDA_ERROR_INVALID_CONTEXT */
    cudaErrorInvalidResourceHandle = 400,
    cudaErrorSymbolNotFound = 500,
    cudaErrorNotReady = 600,
    cudaErrorIllegalAddress = 700,
    cudaErrorHostMemoryAlreadyRegistered = 712,
    cudaErrorHostMemoryNotRegistered = 713,
    cudaErrorLaunchFailure = 719,
    cudaErrorNotPermitted = 800,
    cudaErrorNotSupported = 801,
    cudaErrorUnknown = 999,
};

enum cudaMemcpyKind {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
    cudaMemcpyDefault = 4,
};

enum cudaMemPoolAttr {
    cudaMemPoolReuseFollowEventDependencies = 1,
    cudaMemPoolReuseAllowOpportunistic = 2,
    cudaMemPoolReuseAllowInternalDependencies = 3,
    cudaMemPoolAttrReleaseThreshold = 4,
    cudaMemPoolAttrReservedMemCurrent = 5,
    cudaMemPoolAttrReservedMemHigh = 6,
    cudaMemPoolAttrUsedMemCurrent = 7,
    cudaMemPoolAttrUsedMemHigh = 8,
};

enum cudaDriverEntryPointQueryResult {
    cudaDriverEntryPointSuccess = 0,
    cudaDriverEntryPointSymbolNotFound = 1,
    cudaDriverEntryPointVersionNotSufficent = 2,
};
enum { cudaEnableDefault = 0, cudaEnableLegacyStream = 1, cudaEnablePerThreadDefaultStream = 2 };
enum { cudaStreamDefault = 0, cudaStreamNonBlocking = 1 };
#define cudaStreamLegacy ((cudaStream_t)0x1)
#define cudaStreamPerThread ((cudaStream_t)0x2)
enum { cudaEventDefault = 0, cudaEventBlockingSync = 1, cudaEventDisableTiming = 2,
       cudaEventInterprocess = 4 };
enum { cudaMemAttachGlobal = 1, cudaMemAttachHost = 2, cudaMemAttachSingle = 4 };
enum { cudaHostAllocDefault = 0, cudaHostAllocPortable = 1, cudaHostAllocMapped = 2,
       cudaHostAllocWriteCombined = 4 };
enum { cudaHostRegisterDefault = 0, cudaHostRegisterPortable = 1, cudaHostRegisterMapped = 2,
       cudaHostRegisterIoMemory = 4, cudaHostRegisterReadOnly = 8 };

typedef struct dim3 {
    unsigned int x, y, z;
} dim3;

struct cudaPitchedPtr {
    void *ptr;
    size_t pitch;
    size_t xsize;
    size_t ysize;
};

struct cudaExtent {
    size_t width;
    size_t height;
    size_t depth;
};

_Static_assert(sizeof(struct cudaPitchedPtr) == 32, "cudaPitchedPtr layout");
_Static_assert(sizeof(struct cudaExtent) == 24, "cudaExtent layout");

/* ---------------------------------------------------------------- runtime exports */

cudaError_t cudaMalloc(void **devPtr, size_t size);
cudaError_t cudaFree(void *devPtr);
cudaError_t cudaMallocAsync(void **devPtr, size_t size, cudaStream_t hStream);
cudaError_t cudaMallocAsync_ptsz(void **devPtr, size_t size, cudaStream_t hStream);
cudaError_t cudaFreeAsync(void *devPtr, cudaStream_t hStream);
cudaError_t cudaFreeAsync_ptsz(void *devPtr, cudaStream_t hStream);
cudaError_t cudaMallocFromPoolAsync(void **ptr, size_t size, cudaMemPool_t memPool,
                                    cudaStream_t stream);
cudaError_t cudaMallocFromPoolAsync_ptsz(void **ptr, size_t size, cudaMemPool_t memPool,
                                         cudaStream_t stream);
cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t *memPool, int device);
cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t memPool, enum cudaMemPoolAttr attr,
                                    void *value);
cudaError_t cudaMemPoolGetAttribute(cudaMemPool_t memPool, enum cudaMemPoolAttr attr,
                                    void *value);
cudaError_t cudaMemPoolTrimTo(cudaMemPool_t memPool, size_t minBytesToKeep);
cudaError_t cudaMallocManaged(void **devPtr, size_t size, unsigned int flags);
cudaError_t cudaMallocPitch(void **devPtr, size_t *pitch, size_t width, size_t height);
cudaError_t cudaMalloc3D(struct cudaPitchedPtr *pitchedDevPtr, struct cudaExtent extent);
cudaError_t cudaMallocHost(void **ptr, size_t size);
cudaError_t cudaHostAlloc(void **pHost, size_t size, unsigned int flags);
cudaError_t cudaFreeHost(void *ptr);
cudaError_t cudaHostRegister(void *ptr, size_t size, unsigned int flags);
cudaError_t cudaHostUnregister(void *ptr);
typedef CUipcMemHandle cudaIpcMemHandle_t;
#define cudaIpcMemLazyEnablePeerAccess 0x01
cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t *handle, void *devPtr);
cudaError_t cudaIpcOpenMemHandle(void **devPtr, cudaIpcMemHandle_t handle, unsigned int flags);
cudaError_t cudaIpcCloseMemHandle(void *devPtr);
cudaError_t cudaMemset(void *devPtr, int value, size_t count);
cudaError_t cudaMemsetAsync(void *devPtr, int value, size_t count, cudaStream_t stream);
cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind,
                            cudaStream_t stream);
cudaError_t cudaMemsetAsync_ptsz(void *devPtr, int value, size_t count, cudaStream_t stream);
cudaError_t cudaMemcpyAsync_ptsz(void *dst, const void *src, size_t count,
                                 enum cudaMemcpyKind kind, cudaStream_t stream);
cudaError_t cudaDeviceSynchronize(void);
cudaError_t cudaDeviceReset(void);
cudaError_t cudaStreamCreate(cudaStream_t *pStream);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *pStream, unsigned int flags);
cudaError_t cudaStreamCreateWithPriority(cudaStream_t *pStream, unsigned int flags, int priority);
cudaError_t cudaStreamSynchronize(cudaStream_t stream);
cudaError_t cudaStreamQuery(cudaStream_t stream);
cudaError_t cudaStreamDestroy(cudaStream_t stream);
cudaError_t cudaEventCreate(cudaEvent_t *event);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags);
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream);
cudaError_t cudaEventSynchronize(cudaEvent_t event);
cudaError_t cudaEventQuery(cudaEvent_t event);
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end);
cudaError_t cudaEventDestroy(cudaEvent_t event);
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags);
cudaError_t cudaGetLastError(void);
cudaError_t cudaPeekAtLastError(void);
const char *cudaGetErrorName(cudaError_t error);
const char *cudaGetErrorString(cudaError_t error);
cudaError_t cudaGetDevice(int *device);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaGetDeviceCount(int *count);
cudaError_t cudaMemGetInfo(size_t *free, size_t *total);
cudaError_t cudaRuntimeGetVersion(int *runtimeVersion);
cudaError_t cudaDriverGetVersion(int *driverVersion);
cudaError_t cudaGetFuncBySymbol(cudaFunction_t *functionPtr, const void *symbolPtr);
cudaError_t cudaLaunchKernel(const void *func, dim3 gridDim, dim3 blockDim, void **args,
                             size_t sharedMem, cudaStream_t stream);
cudaError_t cudaLaunchKernel_ptsz(const void *func, dim3 gridDim, dim3 blockDim, void **args,
                                  size_t sharedMem, cudaStream_t stream);
cudaError_t cudaLaunchCooperativeKernel(const void *func, dim3 gridDim, dim3 blockDim,
                                        void **args, size_t sharedMem, cudaStream_t stream);
cudaError_t cudaGetDriverEntryPoint(const char *symbol, void **funcPtr, unsigned long long flags,
                                    enum cudaDriverEntryPointQueryResult *driverStatus);
cudaError_t cudaGetDriverEntryPoint_ptsz(const char *symbol, void **funcPtr,
                                         unsigned long long flags,
                                         enum cudaDriverEntryPointQueryResult *driverStatus);
cudaError_t cudaGetDriverEntryPointByVersion(const char *symbol, void **funcPtr,
                                             unsigned int cudaVersion, unsigned long long flags,
                                             enum cudaDriverEntryPointQueryResult *driverStatus);
cudaError_t cudaGetDriverEntryPointByVersion_ptsz(
    const char *symbol, void **funcPtr, unsigned int cudaVersion, unsigned long long flags,
    enum cudaDriverEntryPointQueryResult *driverStatus);

#ifdef __cplusplus
}
#endif

#endif
