/*
 * The stand-in driver (see driver_internal.h): cuGetProcAddress and its table of every export.
 */
#define _GNU_SOURCE
#include "driver_internal.h"

#include <string.h>

/* ================================================================ cuGetProcAddress */

struct proc {
    const char *name; /* base name, as callers ask for it */
    int version;      /* the CUDA version that introduced this ABI */
    void *fn;
    void *ptsz; /* the per-thread-default-stream export, if there is one */
};

#define F(f) ((void *)(f))

/* Every entry of one name is listed oldest ABI first. */
static const struct proc g_procs[] = {
    {"cuInit", 2000, F(cuInit), NULL},
    {"cuDriverGetVersion", 2020, F(cuDriverGetVersion), NULL},
    {"cuDeviceGet", 2000, F(cuDeviceGet), NULL},
    {"cuDeviceGetCount", 2000, F(cuDeviceGetCount), NULL},
    {"cuDeviceGetName", 2000, F(cuDeviceGetName), NULL},
    {"cuDeviceTotalMem", 3020, F(cuDeviceTotalMem_v2), NULL},
    {"cuDeviceGetUuid", 9020, F(cuDeviceGetUuid), NULL},
    {"cuDeviceGetUuid", 11040, F(cuDeviceGetUuid_v2), NULL},
    {"cuDevicePrimaryCtxRetain", 7000, F(cuDevicePrimaryCtxRetain), NULL},
    {"cuDevicePrimaryCtxRelease", 7000, F(cuDevicePrimaryCtxRelease), NULL},
    {"cuDevicePrimaryCtxRelease", 11000, F(cuDevicePrimaryCtxRelease_v2), NULL},
    {"cuCtxCreate", 3020, F(cuCtxCreate_v2), NULL},
    {"cuCtxDestroy", 4000, F(cuCtxDestroy_v2), NULL},
    {"cuDevicePrimaryCtxReset", 7000, F(cuDevicePrimaryCtxReset), NULL},
    {"cuDevicePrimaryCtxReset", 11000, F(cuDevicePrimaryCtxReset_v2), NULL},
    {"cuCtxGetCurrent", 4000, F(cuCtxGetCurrent), NULL},
    {"cuCtxSetCurrent", 4000, F(cuCtxSetCurrent), NULL},
    {"cuCtxGetDevice", 2000, F(cuCtxGetDevice), NULL},
    {"cuCtxSynchronize", 2000, F(cuCtxSynchronize), NULL},
    {"cuCtxSynchronize", 13000, F(cuCtxSynchronize_v2), NULL},
    {"cuMemGetInfo", 3020, F(cuMemGetInfo_v2), NULL},
    {"cuGetErrorName", 6000, F(cuGetErrorName), NULL},
    {"cuGetErrorString", 6000, F(cuGetErrorString), NULL},
    {"cuGetProcAddress", 11030, F(cuGetProcAddress), NULL},
    {"cuGetProcAddress", 12000, F(cuGetProcAddress_v2), NULL},
    {"cuFuncLoad", 12040, F(cuFuncLoad), NULL},
    {"cuOccupancyMaxActiveBlocksPerMultiprocessor", 6050,
     F(cuOccupancyMaxActiveBlocksPerMultiprocessor), NULL},

    {"cuMemAlloc", 2000, F(cuMemAlloc), NULL},
    {"cuMemAlloc", 3020, F(cuMemAlloc_v2), NULL},
    {"cuMemFree", 2000, F(cuMemFree), NULL},
    {"cuMemFree", 3020, F(cuMemFree_v2), NULL},
    {"cuMemAllocAsync", 11020, F(cuMemAllocAsync), F(cuMemAllocAsync_ptsz)},
    {"cuMemFreeAsync", 11020, F(cuMemFreeAsync), F(cuMemFreeAsync_ptsz)},
    {"cuMemAllocFromPoolAsync", 11020, F(cuMemAllocFromPoolAsync),
     F(cuMemAllocFromPoolAsync_ptsz)},
    {"cuDeviceGetDefaultMemPool", 11020, F(cuDeviceGetDefaultMemPool), NULL},
    {"cuMemPoolCreate", 11020, F(cuMemPoolCreate), NULL},
    {"cuMemPoolDestroy", 11020, F(cuMemPoolDestroy), NULL},
    {"cuMemPoolSetAttribute", 11020, F(cuMemPoolSetAttribute), NULL},
    {"cuMemPoolGetAttribute", 11020, F(cuMemPoolGetAttribute), NULL},
    {"cuMemPoolTrimTo", 11020, F(cuMemPoolTrimTo), NULL},
    {"cuMemAllocManaged", 6000, F(cuMemAllocManaged), NULL},
    {"cuMemAllocPitch", 3020, F(cuMemAllocPitch_v2), NULL},
    {"cuMemAllocHost", 3020, F(cuMemAllocHost_v2), NULL},
    {"cuMemHostAlloc", 2020, F(cuMemHostAlloc), NULL},
    {"cuMemFreeHost", 2000, F(cuMemFreeHost), NULL},
    {"cuMemHostRegister", 4000, F(cuMemHostRegister), NULL},
    {"cuMemHostRegister", 6050, F(cuMemHostRegister_v2), NULL},
    {"cuMemHostUnregister", 4000, F(cuMemHostUnregister), NULL},
    {"cuIpcGetMemHandle", 4010, F(cuIpcGetMemHandle), NULL},
    {"cuIpcOpenMemHandle", 11000, F(cuIpcOpenMemHandle_v2), NULL},
    {"cuIpcCloseMemHandle", 4010, F(cuIpcCloseMemHandle), NULL},
    {"cuMemGetAddressRange", 3020, F(cuMemGetAddressRange_v2), NULL},

    {"cuMemGetAllocationGranularity", 10020, F(cuMemGetAllocationGranularity), NULL},
    {"cuMemAddressReserve", 10020, F(cuMemAddressReserve), NULL},
    {"cuMemAddressFree", 10020, F(cuMemAddressFree), NULL},
    {"cuMemCreate", 10020, F(cuMemCreate), NULL},
    {"cuMemRelease", 10020, F(cuMemRelease), NULL},
    {"cuMemRetainAllocationHandle", 10020, F(cuMemRetainAllocationHandle), NULL},
    {"cuMemMap", 10020, F(cuMemMap), NULL},
    {"cuMemSetAccess", 10020, F(cuMemSetAccess), NULL},
    {"cuMemUnmap", 10020, F(cuMemUnmap), NULL},

    {"cuMemcpy", 4000, F(cuMemcpy), F(cuMemcpy_ptds)},
    {"cuMemcpyHtoD", 3020, F(cuMemcpyHtoD_v2), F(cuMemcpyHtoD_v2_ptds)},
    {"cuMemcpyDtoH", 3020, F(cuMemcpyDtoH_v2), F(cuMemcpyDtoH_v2_ptds)},
    {"cuMemcpyDtoD", 3020, F(cuMemcpyDtoD_v2), F(cuMemcpyDtoD_v2_ptds)},
    {"cuMemcpyAsync", 4000, F(cuMemcpyAsync), F(cuMemcpyAsync_ptsz)},
    {"cuMemcpyHtoDAsync", 3020, F(cuMemcpyHtoDAsync_v2), F(cuMemcpyHtoDAsync_v2_ptsz)},
    {"cuMemcpyDtoHAsync", 3020, F(cuMemcpyDtoHAsync_v2), F(cuMemcpyDtoHAsync_v2_ptsz)},
    {"cuMemcpyDtoDAsync", 3020, F(cuMemcpyDtoDAsync_v2), F(cuMemcpyDtoDAsync_v2_ptsz)},
    {"cuMemsetD8", 3020, F(cuMemsetD8_v2), F(cuMemsetD8_v2_ptds)},
    {"cuMemsetD32", 3020, F(cuMemsetD32_v2), F(cuMemsetD32_v2_ptds)},
    {"cuMemsetD8Async", 3020, F(cuMemsetD8Async), F(cuMemsetD8Async_ptsz)},
    {"cuMemsetD32Async", 3020, F(cuMemsetD32Async), F(cuMemsetD32Async_ptsz)},

    {"cuStreamCreate", 2000, F(cuStreamCreate), NULL},
    {"cuStreamCreateWithPriority", 5050, F(cuStreamCreateWithPriority), NULL},
    {"cuStreamDestroy", 2000, F(cuStreamDestroy), NULL},
    {"cuStreamDestroy", 4000, F(cuStreamDestroy_v2), NULL},
    {"cuStreamGetFlags", 5050, F(cuStreamGetFlags), F(cuStreamGetFlags)},
    {"cuStreamSynchronize", 2000, F(cuStreamSynchronize), F(cuStreamSynchronize_ptsz)},
    {"cuStreamQuery", 2000, F(cuStreamQuery), F(cuStreamQuery_ptsz)},
    {"cuStreamIsCapturing", 10000, F(cuStreamIsCapturing), NULL},
    {"cuStreamBeginCapture", 10000, F(cuStreamBeginCapture), NULL},
    {"cuStreamBeginCapture", 10010, F(cuStreamBeginCapture_v2), NULL},
    {"cuStreamEndCapture", 10000, F(cuStreamEndCapture), NULL},
    {"cuStreamWaitEvent", 3020, F(cuStreamWaitEvent), F(cuStreamWaitEvent_ptsz)},
    {"cuEventCreate", 2000, F(cuEventCreate), NULL},
    {"cuEventRecord", 2000, F(cuEventRecord), F(cuEventRecord_ptsz)},
    {"cuEventSynchronize", 2000, F(cuEventSynchronize), NULL},
    {"cuEventQuery", 2000, F(cuEventQuery), NULL},
    {"cuEventDestroy", 2000, F(cuEventDestroy), NULL},
    {"cuEventDestroy", 4000, F(cuEventDestroy_v2), NULL},
    {"cuEventElapsedTime", 2000, F(cuEventElapsedTime), NULL},
    {"cuEventElapsedTime", 12080, F(cuEventElapsedTime_v2), NULL},

    {"cuModuleLoadData", 2000, F(cuModuleLoadData), NULL},
    {"cuModuleUnload", 2000, F(cuModuleUnload), NULL},
    {"cuModuleGetFunction", 2000, F(cuModuleGetFunction), NULL},
    {"cuModuleGetGlobal", 3020, F(cuModuleGetGlobal_v2), NULL},
    {"cuFuncGetParamInfo", 12040, F(cuFuncGetParamInfo), NULL},
    {"cuFuncGetName", 12030, F(cuFuncGetName), NULL},
    {"cuKernelGetParamInfo", 12040, F(cuKernelGetParamInfo), NULL},
    {"cuKernelGetName", 12030, F(cuKernelGetName), NULL},
    {"cuFuncGetParamCount", 12090, F(cuFuncGetParamCount), NULL},
    {"cuKernelGetParamCount", 12090, F(cuKernelGetParamCount), NULL},
    {"cuLaunchKernel", 4000, F(cuLaunchKernel), F(cuLaunchKernel_ptsz)},
    {"cuLaunchKernelEx", 11060, F(cuLaunchKernelEx), F(cuLaunchKernelEx_ptsz)},
    {"cuLaunchCooperativeKernel", 9000, F(cuLaunchCooperativeKernel),
     F(cuLaunchCooperativeKernel_ptsz)},

    {"cuGraphCreate", 10000, F(cuGraphCreate), NULL},
    {"cuGraphAddMemAllocNode", 11040, F(cuGraphAddMemAllocNode), NULL},
    {"cuGraphAddMemFreeNode", 11040, F(cuGraphAddMemFreeNode), NULL},
    {"cuGraphDestroy", 10000, F(cuGraphDestroy), NULL},
    {"cuDeviceGraphMemTrim", 11040, F(cuDeviceGraphMemTrim), NULL},

    /* stand-in only, so that a runtime can reach them without a dlsym */
    {"standin_register_kernel", 0, F(standin_register_kernel), NULL},
    {"standin_register_kernel_as", 0, F(standin_register_kernel_as), NULL},
    {"standin_reregister_kernel", 0, F(standin_reregister_kernel), NULL},
    {"standin_param_info_calls", 0, F(standin_param_info_calls), NULL},
    {"standin_kernels_run", 0, F(standin_kernels_run), NULL},
    {"standin_touch", 0, F(standin_touch), NULL},
    {"standin_reserved", 0, F(standin_reserved), NULL},
};

static CUresult proc_lookup(const char *symbol, void **pfn, int version, cuuint64_t flags,
                            CUdriverProcAddressQueryResult *status) {
    if (status)
        *status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    if (!symbol || !pfn)
        return CUDA_ERROR_INVALID_VALUE;
    *pfn = NULL;
    if (flags & ~(cuuint64_t)(CU_GET_PROC_ADDRESS_LEGACY_STREAM |
                              CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM))
        return CUDA_ERROR_INVALID_VALUE;
    if (version > DRIVER_VERSION)
        return CUDA_ERROR_INVALID_VALUE; /* newer than this driver, as the real one says */
    const struct proc *best = NULL;
    int named = 0;
    for (size_t i = 0; i < sizeof g_procs / sizeof g_procs[0]; i++) {
        if (strcmp(g_procs[i].name, symbol) != 0)
            continue;
        named = 1;
        if (g_procs[i].version <= version && (!best || g_procs[i].version > best->version))
            best = &g_procs[i];
    }
    if (!best) {
        if (status && named)
            *status = CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT;
        return CUDA_ERROR_NOT_FOUND;
    }
    int per_thread = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
    *pfn = per_thread && best->ptsz ? best->ptsz : best->fn;
    if (status)
        *status = CU_GET_PROC_ADDRESS_SUCCESS;
    return CUDA_SUCCESS;
}

CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                             CUdriverProcAddressQueryResult *symbolStatus) {
    return proc_lookup(symbol, pfn, cudaVersion, flags, symbolStatus);
}

CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags) {
    return proc_lookup(symbol, pfn, cudaVersion, flags, NULL);
}
