/* CUDA IPC: memory one process allocated, opened by another.
 *
 * A handle names (magic, pid, address, size) of a live allocation. Opening it in another
 * process gives a fresh block of that size there (host memory cannot be shared across
 * processes here: the stand-in proves the calls, not the sharing); opening it in the process
 * that made it fails as on a real driver; the opened block is closed with cuIpcCloseMemHandle
 * and cannot be freed with cuMemFree. */

#include "driver_internal.h"

#include <string.h>
#include <unistd.h>

#define IPC_MAGIC 0x49504353u /* "IPCS" */

struct ipc_handle {
    unsigned magic;
    int pid;
    uint64_t addr;
    uint64_t size;
};

CUresult cuIpcGetMemHandle(CUipcMemHandle *pHandle, CUdeviceptr dptr) {
    NEED_LIVE_CTX();
    if (!pHandle)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_lock);
    struct block *b = live_block_at((uintptr_t)dptr, NULL);
    size_t size = b && b->kind != K_IPC ? b->req : 0;
    pthread_mutex_unlock(&g_lock);
    if (!size)
        return CUDA_ERROR_INVALID_VALUE;
    struct ipc_handle h = {IPC_MAGIC, (int)getpid(), dptr, size};
    memset(pHandle, 0, sizeof *pHandle);
    memcpy(pHandle->reserved, &h, sizeof h);
    return CUDA_SUCCESS;
}

CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int Flags) {
    NEED_LIVE_CTX();
    struct ipc_handle h;
    memcpy(&h, handle.reserved, sizeof h);
    if (!pdptr || h.magic != IPC_MAGIC || h.size == 0 || Flags > CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)
        return CUDA_ERROR_INVALID_VALUE;
    if (h.pid == (int)getpid())
        return CUDA_ERROR_INVALID_CONTEXT; /* a process cannot open its own memory */
    uintptr_t p = 0;
    pthread_mutex_lock(&g_lock);
    CUresult r = alloc_locked(&p, (size_t)h.size, K_IPC, &g_main);
    pthread_mutex_unlock(&g_lock);
    if (r == CUDA_SUCCESS)
        *pdptr = p;
    return r;
}

CUresult cuIpcCloseMemHandle(CUdeviceptr dptr) {
    NEED_CTX();
    CUresult r = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_lock);
    struct arena *a = NULL;
    struct block *b = live_block_at((uintptr_t)dptr, &a);
    if (b && b->kind == K_IPC) {
        arena_release(a, b);
        r = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&g_lock);
    return r;
}
