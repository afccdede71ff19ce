/*
 * libcudart.so.13 — a stand-in CUDA runtime that reaches the driver the way the real one does:
 * no link-time dependency on libcuda; on first use it dlopens libcuda.so.1, dlsyms
 * "cuGetProcAddress_v2", asks that for "cuGetProcAddress" (version 13000), and from then on
 * resolves every driver function it calls through the pointer it got back. Nothing is ever
 * looked up by symbol after that first dlsym.
 *
 * State is per thread where the real runtime's is: the current device (cudaSetDevice), the
 * last error (cudaGetLastError / cudaPeekAtLastError), and the context, which is the current
 * device's primary context, retained and made current on a thread's first runtime call.
 */
#define _GNU_SOURCE
#include "cuda_standin.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define RUNTIME_VERSION 13000

/* ================================================================ the driver table */

/* field, base name asked of cuGetProcAddress, the export whose type the field has */
#define DRIVER_FUNCS(X)                                                                        \
    X(init, "cuInit", cuInit)                                                                  \
    X(driverGetVersion, "cuDriverGetVersion", cuDriverGetVersion)                              \
    X(deviceGetCount, "cuDeviceGetCount", cuDeviceGetCount)                                    \
    X(primaryCtxRetain, "cuDevicePrimaryCtxRetain", cuDevicePrimaryCtxRetain)                  \
    X(primaryCtxReset, "cuDevicePrimaryCtxReset", cuDevicePrimaryCtxReset)                     \
    X(ctxGetCurrent, "cuCtxGetCurrent", cuCtxGetCurrent)                                       \
    X(ctxSetCurrent, "cuCtxSetCurrent", cuCtxSetCurrent)                                       \
    X(ctxGetDevice, "cuCtxGetDevice", cuCtxGetDevice)                                          \
    X(ctxSynchronize, "cuCtxSynchronize", cuCtxSynchronize_v2)                                 \
    X(memGetInfo, "cuMemGetInfo", cuMemGetInfo_v2)                                             \
    X(memAlloc, "cuMemAlloc", cuMemAlloc_v2)                                                   \
    X(memFree, "cuMemFree", cuMemFree_v2)                                                      \
    X(memAllocManaged, "cuMemAllocManaged", cuMemAllocManaged)                                 \
    X(memAllocPitch, "cuMemAllocPitch", cuMemAllocPitch_v2)                                    \
    X(memAllocHost, "cuMemAllocHost", cuMemAllocHost_v2)                                       \
    X(memHostAlloc, "cuMemHostAlloc", cuMemHostAlloc)                                          \
    X(memFreeHost, "cuMemFreeHost", cuMemFreeHost)                                             \
    X(memHostRegister, "cuMemHostRegister", cuMemHostRegister_v2)                              \
    X(memHostUnregister, "cuMemHostUnregister", cuMemHostUnregister)                           \
    X(ipcGetMemHandle, "cuIpcGetMemHandle", cuIpcGetMemHandle)                                 \
    X(ipcOpenMemHandle, "cuIpcOpenMemHandle", cuIpcOpenMemHandle_v2)                           \
    X(ipcCloseMemHandle, "cuIpcCloseMemHandle", cuIpcCloseMemHandle)                           \
    X(deviceGetDefaultMemPool, "cuDeviceGetDefaultMemPool", cuDeviceGetDefaultMemPool)         \
    X(memPoolSetAttribute, "cuMemPoolSetAttribute", cuMemPoolSetAttribute)                     \
    X(memPoolGetAttribute, "cuMemPoolGetAttribute", cuMemPoolGetAttribute)                     \
    X(memPoolTrimTo, "cuMemPoolTrimTo", cuMemPoolTrimTo)                                       \
    X(memcpy, "cuMemcpy", cuMemcpy)                                                            \
    X(memcpyHtoD, "cuMemcpyHtoD", cuMemcpyHtoD_v2)                                             \
    X(memcpyDtoH, "cuMemcpyDtoH", cuMemcpyDtoH_v2)                                             \
    X(memcpyDtoD, "cuMemcpyDtoD", cuMemcpyDtoD_v2)                                             \
    X(memsetD8, "cuMemsetD8", cuMemsetD8_v2)                                                   \
    X(streamCreate, "cuStreamCreate", cuStreamCreate)                                          \
    X(streamCreateWithPriority, "cuStreamCreateWithPriority", cuStreamCreateWithPriority)      \
    X(streamDestroy, "cuStreamDestroy", cuStreamDestroy_v2)                                    \
    X(eventCreate, "cuEventCreate", cuEventCreate)                                             \
    X(eventSynchronize, "cuEventSynchronize", cuEventSynchronize)                              \
    X(eventQuery, "cuEventQuery", cuEventQuery)                                                \
    X(eventDestroy, "cuEventDestroy", cuEventDestroy_v2)                                       \
    X(eventElapsedTime, "cuEventElapsedTime", cuEventElapsedTime_v2)                           \
    X(registerKernel, "standin_register_kernel", standin_register_kernel)                      \
    X(registerKernelAs, "standin_register_kernel_as", standin_register_kernel_as)              \
    X(paramInfoCalls, "standin_param_info_calls", standin_param_info_calls)                    \
    X(kernelsRun, "standin_kernels_run", standin_kernels_run)                                  \
    X(touch, "standin_touch", standin_touch)                                                   \
    X(reserved, "standin_reserved", standin_reserved)

/* Functions that take a stream: resolved twice, legacy (S[0]) and per-thread (S[1]). */
#define STREAM_FUNCS(X)                                                                        \
    X(memAllocAsync, "cuMemAllocAsync", cuMemAllocAsync)                                       \
    X(memFreeAsync, "cuMemFreeAsync", cuMemFreeAsync)                                          \
    X(memAllocFromPoolAsync, "cuMemAllocFromPoolAsync", cuMemAllocFromPoolAsync)               \
    X(memcpyAsync, "cuMemcpyAsync", cuMemcpyAsync)                                             \
    X(memcpyHtoDAsync, "cuMemcpyHtoDAsync", cuMemcpyHtoDAsync_v2)                              \
    X(memcpyDtoHAsync, "cuMemcpyDtoHAsync", cuMemcpyDtoHAsync_v2)                              \
    X(memcpyDtoDAsync, "cuMemcpyDtoDAsync", cuMemcpyDtoDAsync_v2)                              \
    X(memsetD8Async, "cuMemsetD8Async", cuMemsetD8Async)                                       \
    X(streamSynchronize, "cuStreamSynchronize", cuStreamSynchronize)                           \
    X(streamQuery, "cuStreamQuery", cuStreamQuery)                                             \
    X(streamWaitEvent, "cuStreamWaitEvent", cuStreamWaitEvent)                                 \
    X(eventRecord, "cuEventRecord", cuEventRecord)                                             \
    X(launchKernel, "cuLaunchKernel", cuLaunchKernel)                                          \
    X(launchCooperativeKernel, "cuLaunchCooperativeKernel", cuLaunchCooperativeKernel)

#define FIELD(field, name, export) __typeof__(&export) field;
static struct {
    DRIVER_FUNCS(FIELD)
} D;
static struct {
    STREAM_FUNCS(FIELD)
} S[2];
#undef FIELD

static pthread_once_t g_once = PTHREAD_ONCE_INIT;      /* the table */
static pthread_once_t g_init_once = PTHREAD_ONCE_INIT; /* cuInit */
static PFN_cuGetProcAddress_v2 g_gpa; /* the resolver the driver handed back for itself */
static int g_resolved;                /* every table entry found */
static cudaError_t g_load_err;        /* why the runtime cannot run, or cudaSuccess */

static __thread cudaError_t t_last;
static __thread int t_device;
static __thread int t_bound;

static cudaError_t map(CUresult r) {
    switch (r) {
    case CUDA_SUCCESS: return cudaSuccess;
    case CUDA_ERROR_INVALID_VALUE: return cudaErrorInvalidValue;
    case CUDA_ERROR_OUT_OF_MEMORY: return cudaErrorMemoryAllocation;
    case CUDA_ERROR_NOT_INITIALIZED: return cudaErrorInitializationError;
    case CUDA_ERROR_DEINITIALIZED: return cudaErrorCudartUnloading;
    case CUDA_ERROR_NO_DEVICE: return cudaErrorNoDevice;
    case CUDA_ERROR_INVALID_DEVICE: return cudaErrorInvalidDevice;
    case CUDA_ERROR_INVALID_IMAGE: return cudaErrorInvalidKernelImage;
    case CUDA_ERROR_INVALID_CONTEXT: return cudaErrorDeviceUninitialized;
    case CUDA_ERROR_INVALID_HANDLE: return cudaErrorInvalidResourceHandle;
    case CUDA_ERROR_NOT_FOUND: return cudaErrorSymbolNotFound;
    case CUDA_ERROR_NOT_READY: return cudaErrorNotReady;
    case CUDA_ERROR_ILLEGAL_ADDRESS: return cudaErrorIllegalAddress;
    case CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED: return cudaErrorHostMemoryAlreadyRegistered;
    case CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED: return cudaErrorHostMemoryNotRegistered;
    case CUDA_ERROR_LAUNCH_FAILED: return cudaErrorLaunchFailure;
    case CUDA_ERROR_NOT_PERMITTED: return cudaErrorNotPermitted;
    case CUDA_ERROR_NOT_SUPPORTED: return cudaErrorNotSupported;
    default: return cudaErrorUnknown;
    }
}

/* The version each function is asked for at, as libcudart.so.13 (13.0.96) asks (read from its
 * calls of cuGetProcAddress): the primary context's calls at 7000, so that the driver hands back
 * their first exports (`cuDevicePrimaryCtxReset`, not `_v2`); the rest at the runtime's version
 * (`cuCtxSynchronize` then gives CUDA 13's `cuCtxSynchronize_v2(ctx)`). */
static int version_of(const char *name) {
    static const char *const at7000[] = {"cuDevicePrimaryCtxRetain", "cuDevicePrimaryCtxRelease",
                                         "cuDevicePrimaryCtxReset"};
    for (size_t i = 0; i < sizeof at7000 / sizeof at7000[0]; i++)
        if (strcmp(name, at7000[i]) == 0)
            return 7000;
    return RUNTIME_VERSION;
}

static void *resolve(const char *name, cuuint64_t flags) {
    void *p = NULL;
    CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    if (g_gpa(name, &p, version_of(name), flags, &st) != CUDA_SUCCESS)
        return NULL;
    return p;
}

static void (*g_shutdown)(void);

/* The runtime's exit handler (libcudart registers one at its first call): the driver is torn
 * down, so that a library destructor that runs later gets no answer from it. */
static void runtime_exit(void) {
    if (g_shutdown)
        g_shutdown();
}

static void load(void) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        g_load_err = cudaErrorInsufficientDriver;
        return;
    }
    g_shutdown = (void (*)(void))dlsym(h, "standin_shutdown");
    atexit(runtime_exit);
    PFN_cuGetProcAddress_v2 first = (PFN_cuGetProcAddress_v2)dlsym(h, "cuGetProcAddress_v2");
    if (!first) {
        g_load_err = cudaErrorInsufficientDriver;
        return;
    }
    void *self = NULL;
    CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    if (first("cuGetProcAddress", &self, RUNTIME_VERSION, CU_GET_PROC_ADDRESS_DEFAULT, &st) !=
            CUDA_SUCCESS ||
        !self) {
        g_load_err = cudaErrorInsufficientDriver;
        return;
    }
    g_gpa = (PFN_cuGetProcAddress_v2)self;
    int missing = 0;
    void *p;
#define RESOLVE(field, name, export)                                                           \
    p = resolve(name, CU_GET_PROC_ADDRESS_DEFAULT);                                            \
    missing |= !p;                                                                             \
    D.field = (__typeof__(D.field))p;
    DRIVER_FUNCS(RESOLVE)
#undef RESOLVE
#define RESOLVE(field, name, export)                                                           \
    p = resolve(name, CU_GET_PROC_ADDRESS_LEGACY_STREAM);                                      \
    missing |= !p;                                                                             \
    S[0].field = (__typeof__(S[0].field))p;                                                    \
    p = resolve(name, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM);                          \
    missing |= !p;                                                                             \
    S[1].field = (__typeof__(S[1].field))p;
    STREAM_FUNCS(RESOLVE)
#undef RESOLVE
    if (missing) {
        g_load_err = cudaErrorInsufficientDriver;
        return;
    }
    g_resolved = 1;
}

static void init(void) {
    pthread_once(&g_once, load);
    if (g_load_err != cudaSuccess)
        return;
    CUresult r = D.init(0);
    g_load_err = r == CUDA_SUCCESS ? cudaSuccess : map(r);
}

/* The table filled and cuInit done (once per process). */
static cudaError_t loaded(void) {
    pthread_once(&g_init_once, init);
    return g_load_err;
}

/* Sets the thread's last error (cudaErrorNotReady is a status, never an error). */
static cudaError_t fail(cudaError_t e) {
    if (e != cudaSuccess && e != cudaErrorNotReady)
        t_last = e;
    return e;
}

static cudaError_t ret(CUresult r) { return fail(map(r)); }

static cudaError_t bind_device(int dev) {
    CUcontext c = NULL;
    CUresult r = D.primaryCtxRetain(&c, dev);
    if (r == CUDA_SUCCESS)
        r = D.ctxSetCurrent(c);
    if (r != CUDA_SUCCESS)
        return map(r);
    t_device = dev;
    t_bound = 1;
    return cudaSuccess;
}

/* Loads the driver; on a thread's first call, makes a context current (the one the thread
 * already has, else the current device's primary context). */
static cudaError_t enter(void) {
    cudaError_t e = loaded();
    if (e != cudaSuccess)
        return e;
    if (t_bound)
        return cudaSuccess;
    CUcontext c = NULL;
    CUresult r = D.ctxGetCurrent(&c);
    if (r != CUDA_SUCCESS)
        return map(r);
    if (c) {
        t_bound = 1;
        return cudaSuccess;
    }
    return bind_device(t_device);
}

#define ENTER()                                                                                \
    do {                                                                                       \
        cudaError_t e_ = enter();                                                              \
        if (e_ != cudaSuccess)                                                                 \
            return fail(e_);                                                                   \
    } while (0)

#define LOADED()                                                                               \
    do {                                                                                       \
        cudaError_t e_ = loaded();                                                             \
        if (e_ != cudaSuccess)                                                                 \
            return fail(e_);                                                                   \
    } while (0)

#define DP(p) ((CUdeviceptr)(uintptr_t)(p))
#define VP(d) ((void *)(uintptr_t)(d))

/* ================================================================ device, errors, versions */

cudaError_t cudaGetDeviceCount(int *count) {
    if (!count)
        return fail(cudaErrorInvalidValue);
    cudaError_t e = loaded();
    if (e != cudaSuccess) {
        *count = 0;
        return fail(e);
    }
    return ret(D.deviceGetCount(count));
}

cudaError_t cudaSetDevice(int device) {
    LOADED();
    int n = 0;
    CUresult r = D.deviceGetCount(&n);
    if (r != CUDA_SUCCESS)
        return ret(r);
    if (device < 0 || device >= n)
        return fail(cudaErrorInvalidDevice);
    return fail(bind_device(device));
}

cudaError_t cudaGetDevice(int *device) {
    if (!device)
        return fail(cudaErrorInvalidValue);
    ENTER();
    CUdevice d = 0;
    CUresult r = D.ctxGetDevice(&d);
    if (r == CUDA_SUCCESS)
        *device = d;
    return ret(r);
}

cudaError_t cudaMemGetInfo(size_t *free_, size_t *total) {
    ENTER();
    return ret(D.memGetInfo(free_, total));
}

cudaError_t cudaDeviceSynchronize(void) {
    ENTER();
    return ret(D.ctxSynchronize(NULL));
}

/* The current device's primary context reset (its memory gone); the thread binds it again on
 * its next call. */
cudaError_t cudaDeviceReset(void) {
    ENTER();
    CUresult r = D.primaryCtxReset(t_device);
    t_bound = 0;
    return ret(r);
}

cudaError_t cudaRuntimeGetVersion(int *runtimeVersion) {
    if (!runtimeVersion)
        return fail(cudaErrorInvalidValue);
    *runtimeVersion = RUNTIME_VERSION;
    return cudaSuccess;
}

/* 0 when there is no driver at all, as the real runtime reports it. */
cudaError_t cudaDriverGetVersion(int *driverVersion) {
    if (!driverVersion)
        return fail(cudaErrorInvalidValue);
    pthread_once(&g_once, load);
    if (!g_resolved) {
        *driverVersion = 0;
        return cudaSuccess;
    }
    return ret(D.driverGetVersion(driverVersion));
}

cudaError_t cudaGetLastError(void) {
    cudaError_t e = t_last;
    t_last = cudaSuccess;
    return e;
}

cudaError_t cudaPeekAtLastError(void) { return t_last; }

static const struct {
    cudaError_t code;
    const char *name;
    const char *text;
} g_errors[] = {
    {cudaSuccess, "cudaSuccess", "no error"},
    {cudaErrorInvalidValue, "cudaErrorInvalidValue", "invalid argument"},
    {cudaErrorMemoryAllocation, "cudaErrorMemoryAllocation", "out of memory"},
    {cudaErrorInitializationError, "cudaErrorInitializationError", "initialization error"},
    {cudaErrorCudartUnloading, "cudaErrorCudartUnloading", "driver shutting down"},
    {cudaErrorInvalidConfiguration, "cudaErrorInvalidConfiguration",
     "invalid configuration argument"},
    {cudaErrorInvalidPitchValue, "cudaErrorInvalidPitchValue", "invalid pitch argument"},
    {cudaErrorInvalidDevicePointer, "cudaErrorInvalidDevicePointer", "invalid device pointer"},
    {cudaErrorInvalidMemcpyDirection, "cudaErrorInvalidMemcpyDirection",
     "invalid copy direction for memcpy"},
    {cudaErrorInsufficientDriver, "cudaErrorInsufficientDriver",
     "CUDA driver version is insufficient for CUDA runtime version"},
    {cudaErrorInvalidDeviceFunction, "cudaErrorInvalidDeviceFunction",
     "invalid device function"},
    {cudaErrorNoDevice, "cudaErrorNoDevice", "no CUDA-capable device is detected"},
    {cudaErrorInvalidDevice, "cudaErrorInvalidDevice", "invalid device ordinal"},
    {cudaErrorInvalidKernelImage, "cudaErrorInvalidKernelImage", "device kernel image is invalid"},
    {cudaErrorDeviceUninitialized, "cudaErrorDeviceUninitialized", "invalid device context"},
    {cudaErrorInvalidResourceHandle, "cudaErrorInvalidResourceHandle", "invalid resource handle"},
    {cudaErrorSymbolNotFound, "cudaErrorSymbolNotFound", "named symbol not found"},
    {cudaErrorNotReady, "cudaErrorNotReady", "device not ready"},
    {cudaErrorIllegalAddress, "cudaErrorIllegalAddress",
     "an illegal memory access was encountered"},
    {cudaErrorHostMemoryAlreadyRegistered, "cudaErrorHostMemoryAlreadyRegistered",
     "part or all of the requested memory range is already mapped"},
    {cudaErrorHostMemoryNotRegistered, "cudaErrorHostMemoryNotRegistered",
     "pointer does not correspond to a registered memory region"},
    {cudaErrorLaunchFailure, "cudaErrorLaunchFailure", "unspecified launch failure"},
    {cudaErrorNotPermitted, "cudaErrorNotPermitted", "operation not permitted"},
    {cudaErrorNotSupported, "cudaErrorNotSupported", "operation not supported"},
    {cudaErrorUnknown, "cudaErrorUnknown", "unknown error"},
};

static const char *error_lookup(cudaError_t e, int text) {
    for (size_t i = 0; i < sizeof g_errors / sizeof g_errors[0]; i++)
        if (g_errors[i].code == e)
            return text ? g_errors[i].text : g_errors[i].name;
    return "unrecognized error code";
}

const char *cudaGetErrorName(cudaError_t error) { return error_lookup(error, 0); }
const char *cudaGetErrorString(cudaError_t error) { return error_lookup(error, 1); }

/* ================================================================ device memory */

/* A zero-byte request succeeds with a null pointer and never reaches the driver. */
cudaError_t cudaMalloc(void **devPtr, size_t size) {
    if (!devPtr)
        return fail(cudaErrorInvalidValue);
    ENTER();
    if (size == 0) {
        *devPtr = NULL;
        return cudaSuccess;
    }
    CUdeviceptr d = 0;
    CUresult r = D.memAlloc(&d, size);
    if (r == CUDA_SUCCESS)
        *devPtr = VP(d);
    return ret(r);
}

cudaError_t cudaFree(void *devPtr) {
    ENTER();
    if (!devPtr)
        return cudaSuccess;
    return ret(D.memFree(DP(devPtr)));
}

static cudaError_t malloc_async(void **devPtr, size_t size, cudaMemPool_t pool, int use_pool,
                                cudaStream_t stream, int pt) {
    if (!devPtr)
        return fail(cudaErrorInvalidValue);
    ENTER();
    if (size == 0) {
        *devPtr = NULL;
        return cudaSuccess;
    }
    CUdeviceptr d = 0;
    CUresult r = use_pool ? S[pt].memAllocFromPoolAsync(&d, size, pool, stream)
                          : S[pt].memAllocAsync(&d, size, stream);
    if (r == CUDA_SUCCESS)
        *devPtr = VP(d);
    return ret(r);
}

cudaError_t cudaMallocAsync(void **devPtr, size_t size, cudaStream_t hStream) {
    return malloc_async(devPtr, size, NULL, 0, hStream, 0);
}
cudaError_t cudaMallocAsync_ptsz(void **devPtr, size_t size, cudaStream_t hStream) {
    return malloc_async(devPtr, size, NULL, 0, hStream, 1);
}
cudaError_t cudaMallocFromPoolAsync(void **ptr, size_t size, cudaMemPool_t memPool,
                                    cudaStream_t stream) {
    return malloc_async(ptr, size, memPool, 1, stream, 0);
}
cudaError_t cudaMallocFromPoolAsync_ptsz(void **ptr, size_t size, cudaMemPool_t memPool,
                                         cudaStream_t stream) {
    return malloc_async(ptr, size, memPool, 1, stream, 1);
}

cudaError_t cudaFreeAsync(void *devPtr, cudaStream_t hStream) {
    ENTER();
    return ret(S[0].memFreeAsync(DP(devPtr), hStream));
}
cudaError_t cudaFreeAsync_ptsz(void *devPtr, cudaStream_t hStream) {
    ENTER();
    return ret(S[1].memFreeAsync(DP(devPtr), hStream));
}

cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t *memPool, int device) {
    LOADED();
    return ret(D.deviceGetDefaultMemPool(memPool, device));
}

cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t memPool, enum cudaMemPoolAttr attr,
                                    void *value) {
    LOADED();
    return ret(D.memPoolSetAttribute(memPool, (CUmemPool_attribute)attr, value));
}

cudaError_t cudaMemPoolGetAttribute(cudaMemPool_t memPool, enum cudaMemPoolAttr attr,
                                    void *value) {
    LOADED();
    return ret(D.memPoolGetAttribute(memPool, (CUmemPool_attribute)attr, value));
}

cudaError_t cudaMemPoolTrimTo(cudaMemPool_t memPool, size_t minBytesToKeep) {
    LOADED();
    return ret(D.memPoolTrimTo(memPool, minBytesToKeep));
}

cudaError_t cudaMallocManaged(void **devPtr, size_t size, unsigned int flags) {
    if (!devPtr)
        return fail(cudaErrorInvalidValue);
    ENTER();
    CUdeviceptr d = 0;
    CUresult r = D.memAllocManaged(&d, size, flags);
    if (r == CUDA_SUCCESS)
        *devPtr = VP(d);
    return ret(r);
}

/* Pitched memory comes from cuMemAllocPitch_v2 (element size 4), pitch = width rounded up
 * to 512 bytes. */
cudaError_t cudaMallocPitch(void **devPtr, size_t *pitch, size_t width, size_t height) {
    if (!devPtr || !pitch)
        return fail(cudaErrorInvalidValue);
    ENTER();
    CUdeviceptr d = 0;
    CUresult r = D.memAllocPitch(&d, pitch, width, height, 4);
    if (r == CUDA_SUCCESS)
        *devPtr = VP(d);
    return ret(r);
}

cudaError_t cudaMalloc3D(struct cudaPitchedPtr *pitchedDevPtr, struct cudaExtent extent) {
    if (!pitchedDevPtr)
        return fail(cudaErrorInvalidValue);
    ENTER();
    if (extent.depth && extent.height > SIZE_MAX / extent.depth)
        return fail(cudaErrorInvalidValue);
    CUdeviceptr d = 0;
    size_t pitch = 0;
    CUresult r = D.memAllocPitch(&d, &pitch, extent.width, extent.height * extent.depth, 4);
    if (r == CUDA_SUCCESS) {
        pitchedDevPtr->ptr = VP(d);
        pitchedDevPtr->pitch = pitch;
        pitchedDevPtr->xsize = extent.width;
        pitchedDevPtr->ysize = extent.height;
    }
    return ret(r);
}

/* ================================================================ host memory */

cudaError_t cudaMallocHost(void **ptr, size_t size) {
    if (!ptr)
        return fail(cudaErrorInvalidValue);
    ENTER();
    if (size == 0) {
        *ptr = NULL;
        return cudaSuccess;
    }
    return ret(D.memAllocHost(ptr, size));
}

cudaError_t cudaHostAlloc(void **pHost, size_t size, unsigned int flags) {
    if (!pHost)
        return fail(cudaErrorInvalidValue);
    ENTER();
    if (size == 0) {
        *pHost = NULL;
        return cudaSuccess;
    }
    return ret(D.memHostAlloc(pHost, size, flags));
}

cudaError_t cudaFreeHost(void *ptr) {
    ENTER();
    if (!ptr)
        return cudaSuccess;
    return ret(D.memFreeHost(ptr));
}

cudaError_t cudaHostRegister(void *ptr, size_t size, unsigned int flags) {
    ENTER();
    return ret(D.memHostRegister(ptr, size, flags));
}

cudaError_t cudaHostUnregister(void *ptr) {
    ENTER();
    return ret(D.memHostUnregister(ptr));
}

/* ================================================================ IPC */

cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t *handle, void *devPtr) {
    ENTER();
    return ret(D.ipcGetMemHandle(handle, DP(devPtr)));
}

cudaError_t cudaIpcOpenMemHandle(void **devPtr, cudaIpcMemHandle_t handle, unsigned int flags) {
    if (!devPtr)
        return fail(cudaErrorInvalidValue);
    ENTER();
    CUdeviceptr p = 0;
    cudaError_t r = ret(D.ipcOpenMemHandle(&p, handle, flags));
    if (r == cudaSuccess)
        *devPtr = (void *)(uintptr_t)p;
    return r;
}

cudaError_t cudaIpcCloseMemHandle(void *devPtr) {
    ENTER();
    return ret(D.ipcCloseMemHandle(DP(devPtr)));
}

/* ================================================================ copies and sets */

cudaError_t cudaMemset(void *devPtr, int value, size_t count) {
    ENTER();
    return ret(D.memsetD8(DP(devPtr), (unsigned char)value, count));
}

static cudaError_t memset_async(void *devPtr, int value, size_t count, cudaStream_t stream,
                                int pt) {
    ENTER();
    return ret(S[pt].memsetD8Async(DP(devPtr), (unsigned char)value, count, stream));
}

cudaError_t cudaMemsetAsync(void *devPtr, int value, size_t count, cudaStream_t stream) {
    return memset_async(devPtr, value, count, stream, 0);
}
cudaError_t cudaMemsetAsync_ptsz(void *devPtr, int value, size_t count, cudaStream_t stream) {
    return memset_async(devPtr, value, count, stream, 1);
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind) {
    ENTER();
    switch (kind) {
    case cudaMemcpyHostToHost:
    case cudaMemcpyDefault: return ret(D.memcpy(DP(dst), DP(src), count));
    case cudaMemcpyHostToDevice: return ret(D.memcpyHtoD(DP(dst), src, count));
    case cudaMemcpyDeviceToHost: return ret(D.memcpyDtoH(dst, DP(src), count));
    case cudaMemcpyDeviceToDevice: return ret(D.memcpyDtoD(DP(dst), DP(src), count));
    }
    return fail(cudaErrorInvalidMemcpyDirection);
}

static cudaError_t memcpy_async(void *dst, const void *src, size_t count,
                                enum cudaMemcpyKind kind, cudaStream_t stream, int pt) {
    ENTER();
    switch (kind) {
    case cudaMemcpyHostToHost:
    case cudaMemcpyDefault: return ret(S[pt].memcpyAsync(DP(dst), DP(src), count, stream));
    case cudaMemcpyHostToDevice: return ret(S[pt].memcpyHtoDAsync(DP(dst), src, count, stream));
    case cudaMemcpyDeviceToHost: return ret(S[pt].memcpyDtoHAsync(dst, DP(src), count, stream));
    case cudaMemcpyDeviceToDevice:
        return ret(S[pt].memcpyDtoDAsync(DP(dst), DP(src), count, stream));
    }
    return fail(cudaErrorInvalidMemcpyDirection);
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind,
                            cudaStream_t stream) {
    return memcpy_async(dst, src, count, kind, stream, 0);
}
cudaError_t cudaMemcpyAsync_ptsz(void *dst, const void *src, size_t count,
                                 enum cudaMemcpyKind kind, cudaStream_t stream) {
    return memcpy_async(dst, src, count, kind, stream, 1);
}

/* ================================================================ streams and events */

cudaError_t cudaStreamCreate(cudaStream_t *pStream) {
    ENTER();
    return ret(D.streamCreate(pStream, CU_STREAM_DEFAULT));
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *pStream, unsigned int flags) {
    ENTER();
    return ret(D.streamCreate(pStream, flags));
}

cudaError_t cudaStreamCreateWithPriority(cudaStream_t *pStream, unsigned int flags, int priority) {
    ENTER();
    return ret(D.streamCreateWithPriority(pStream, flags, priority));
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
    ENTER();
    return ret(S[0].streamSynchronize(stream));
}

cudaError_t cudaStreamQuery(cudaStream_t stream) {
    ENTER();
    return ret(S[0].streamQuery(stream));
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
    ENTER();
    return ret(D.streamDestroy(stream));
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags) {
    ENTER();
    return ret(S[0].streamWaitEvent(stream, event, flags));
}

cudaError_t cudaEventCreate(cudaEvent_t *event) {
    ENTER();
    return ret(D.eventCreate(event, CU_EVENT_DEFAULT));
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags) {
    ENTER();
    return ret(D.eventCreate(event, flags));
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
    ENTER();
    return ret(S[0].eventRecord(event, stream));
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
    ENTER();
    return ret(D.eventSynchronize(event));
}

cudaError_t cudaEventQuery(cudaEvent_t event) {
    ENTER();
    return ret(D.eventQuery(event));
}

cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end) {
    ENTER();
    return ret(D.eventElapsedTime(ms, start, end));
}

cudaError_t cudaEventDestroy(cudaEvent_t event) {
    ENTER();
    return ret(D.eventDestroy(event));
}

/* ================================================================ kernels */

/* A kernel "symbol" of the stand-in is the CUfunction itself. */
cudaError_t cudaGetFuncBySymbol(cudaFunction_t *functionPtr, const void *symbolPtr) {
    if (!functionPtr || !symbolPtr)
        return fail(cudaErrorInvalidDeviceFunction);
    *functionPtr = (cudaFunction_t)symbolPtr;
    return cudaSuccess;
}

static cudaError_t launch(const void *func, dim3 g, dim3 b, void **args, size_t sharedMem,
                          cudaStream_t stream, int pt, int coop) {
    ENTER();
    if (!func)
        return fail(cudaErrorInvalidDeviceFunction);
    CUresult r;
    if (coop)
        r = S[pt].launchCooperativeKernel((CUfunction)func, g.x, g.y, g.z, b.x, b.y, b.z,
                                          (unsigned)sharedMem, stream, args);
    else
        r = S[pt].launchKernel((CUfunction)func, g.x, g.y, g.z, b.x, b.y, b.z,
                               (unsigned)sharedMem, stream, args, NULL);
    if (r == CUDA_ERROR_INVALID_HANDLE)
        return fail(cudaErrorInvalidDeviceFunction);
    if (r == CUDA_ERROR_INVALID_VALUE)
        return fail(cudaErrorInvalidConfiguration);
    return ret(r);
}

cudaError_t cudaLaunchKernel(const void *func, dim3 gridDim, dim3 blockDim, void **args,
                             size_t sharedMem, cudaStream_t stream) {
    return launch(func, gridDim, blockDim, args, sharedMem, stream, 0, 0);
}
cudaError_t cudaLaunchKernel_ptsz(const void *func, dim3 gridDim, dim3 blockDim, void **args,
                                  size_t sharedMem, cudaStream_t stream) {
    return launch(func, gridDim, blockDim, args, sharedMem, stream, 1, 0);
}
cudaError_t cudaLaunchCooperativeKernel(const void *func, dim3 gridDim, dim3 blockDim,
                                        void **args, size_t sharedMem, cudaStream_t stream) {
    return launch(func, gridDim, blockDim, args, sharedMem, stream, 0, 1);
}

/* Forwarders to the stand-in driver's own exports (reached through the resolver too); they
 * fill the table but never call cuInit. */
CUfunction standin_register_kernel(const char *name, standin_kernel_fn fn, unsigned nparams,
                                   const size_t *offsets, const size_t *sizes) {
    pthread_once(&g_once, load);
    return g_resolved ? D.registerKernel(name, fn, nparams, offsets, sizes) : NULL;
}

CUfunction standin_register_kernel_as(int kind, const char *name, standin_kernel_fn fn,
                                      unsigned nparams, const size_t *offsets,
                                      const size_t *sizes) {
    pthread_once(&g_once, load);
    return g_resolved ? D.registerKernelAs(kind, name, fn, nparams, offsets, sizes) : NULL;
}

unsigned long standin_param_info_calls(void) {
    pthread_once(&g_once, load);
    return g_resolved ? D.paramInfoCalls() : 0;
}

unsigned long standin_kernels_run(void) {
    pthread_once(&g_once, load);
    return g_resolved ? D.kernelsRun() : 0;
}

int standin_touch(CUdeviceptr p, size_t n) {
    pthread_once(&g_once, load);
    return g_resolved ? D.touch(p, n) : 0;
}

unsigned long standin_reserved(size_t *bytes) {
    pthread_once(&g_once, load);
    if (!g_resolved) {
        if (bytes)
            *bytes = 0;
        return 0;
    }
    return D.reserved(bytes);
}

/* ================================================================ driver entry points */

/* Resolved through the runtime's own cuGetProcAddress pointer, as the real runtime does. A
 * symbol the driver does not have is cudaSuccess with a null pointer and the status saying
 * why (CUDA 12+ behaviour). */
static cudaError_t entry_point(const char *symbol, void **funcPtr, int version,
                               unsigned long long flags,
                               enum cudaDriverEntryPointQueryResult *status, int pt) {
    if (status)
        *status = cudaDriverEntryPointSymbolNotFound;
    if (!symbol || !funcPtr)
        return fail(cudaErrorInvalidValue);
    LOADED();
    cuuint64_t f;
    switch (flags) {
    case cudaEnableDefault:
        f = pt ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM : CU_GET_PROC_ADDRESS_DEFAULT;
        break;
    case cudaEnableLegacyStream: f = CU_GET_PROC_ADDRESS_LEGACY_STREAM; break;
    case cudaEnablePerThreadDefaultStream: f = CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM; break;
    default: return fail(cudaErrorInvalidValue);
    }
    CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    *funcPtr = NULL;
    CUresult r = g_gpa(symbol, funcPtr, version, f, &st);
    if (status)
        *status = (enum cudaDriverEntryPointQueryResult)st;
    if (r == CUDA_SUCCESS || r == CUDA_ERROR_NOT_FOUND)
        return cudaSuccess;
    return ret(r);
}

cudaError_t cudaGetDriverEntryPoint(const char *symbol, void **funcPtr, unsigned long long flags,
                                    enum cudaDriverEntryPointQueryResult *driverStatus) {
    return entry_point(symbol, funcPtr, RUNTIME_VERSION, flags, driverStatus, 0);
}

cudaError_t cudaGetDriverEntryPoint_ptsz(const char *symbol, void **funcPtr,
                                         unsigned long long flags,
                                         enum cudaDriverEntryPointQueryResult *driverStatus) {
    return entry_point(symbol, funcPtr, RUNTIME_VERSION, flags, driverStatus, 1);
}

cudaError_t cudaGetDriverEntryPointByVersion(const char *symbol, void **funcPtr,
                                             unsigned int cudaVersion, unsigned long long flags,
                                             enum cudaDriverEntryPointQueryResult *driverStatus) {
    return entry_point(symbol, funcPtr, (int)cudaVersion, flags, driverStatus, 0);
}

cudaError_t cudaGetDriverEntryPointByVersion_ptsz(
    const char *symbol, void **funcPtr, unsigned int cudaVersion, unsigned long long flags,
    enum cudaDriverEntryPointQueryResult *driverStatus) {
    return entry_point(symbol, funcPtr, (int)cudaVersion, flags, driverStatus, 1);
}
