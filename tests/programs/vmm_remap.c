// link: cudart
/* Address-space calls on ranges that isolate mode holds back (an unmapped range stays mapped,
 * poisoned, in quarantine): map into the same range again without freeing the reservation
 * (PyTorch's expandable segments growing back), and free the reservation, reserve the same
 * address again and map there (XLA's platform allocator, seen under JAX); and free a mapping the
 * way NCCL's ncclCuMemFree does (retain the handle at the address, release it, unmap, release
 * it again, free the reservation: two accepted releases of one handle, not a double free; seen
 * on the H200 as 194 false double frees). Every call must return what it returns without
 * isolate mode, and the memory must work. */
#include "common.h"

static PFN_create create;
static PFN_map map;
static PFN_setAccess setAccess;
static size_t gran;

/* Creates a handle of `size`, maps it at `at`, makes it read-write, fills it with `byte` and
 * reads it back; prints each result. */
static CUmemGenericAllocationHandle map_fill(const char *what, CUdeviceptr at, size_t size,
                                             unsigned char byte) {
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    CUmemGenericAllocationHandle h = 0;
    int rc = create(&h, size, &prop, 0);
    say("%s: cuMemCreate %d", what, rc);
    rc = map(at, size, 0, h, 0);
    say("%s: cuMemMap %d", what, rc);
    CUmemAccessDesc acc;
    acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    acc.location.id = 0;
    acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    rc = setAccess(at, size, &acc, 1);
    say("%s: cuMemSetAccess %d", what, rc);
    rc = cudaMemset((void *)(uintptr_t)at, byte, size);
    unsigned char back[64];
    int rc2 = cudaMemcpy(back, (void *)(uintptr_t)(at + size - sizeof back), sizeof back,
                         cudaMemcpyDeviceToHost);
    int ok = 1;
    for (size_t i = 0; i < sizeof back; i++)
        ok &= back[i] == byte;
    say("%s: memset %d copy %d holds 0x%02x %d", what, rc, rc2, byte, ok);
    return h;
}

int main(void) {
    setup();
    int rc = cudaFree(NULL);
    say("cudaFree(NULL) %d", rc);
    PFN_granularity granularity =
        (PFN_granularity)rt_entry("cuMemGetAllocationGranularity", cudaEnableDefault);
    PFN_reserve reserve = (PFN_reserve)rt_entry("cuMemAddressReserve", cudaEnableDefault);
    PFN_addressFree addressFree = (PFN_addressFree)rt_entry("cuMemAddressFree", cudaEnableDefault);
    PFN_memRelease memRelease = (PFN_memRelease)rt_entry("cuMemRelease", cudaEnableDefault);
    PFN_unmap unmap = (PFN_unmap)rt_entry("cuMemUnmap", cudaEnableDefault);
    create = (PFN_create)rt_entry("cuMemCreate", cudaEnableDefault);
    map = (PFN_map)rt_entry("cuMemMap", cudaEnableDefault);
    setAccess = (PFN_setAccess)rt_entry("cuMemSetAccess", cudaEnableDefault);
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    rc = granularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
    say("granularity %d", rc);

    /* 1. Unmap, then map into the same range again (the reservation kept). */
    CUdeviceptr r = 0;
    rc = reserve(&r, 4 * gran, 0, 0, 0);
    say("reserve %d", rc);
    CUmemGenericAllocationHandle h1 = map_fill("first", r, 2 * gran, 0x11);
    say("unmap first %d", unmap(r, 2 * gran));
    say("release first %d", memRelease(h1));
    CUmemGenericAllocationHandle h2 = map_fill("again", r, 2 * gran, 0x22);
    /* a sub-range of what was unmapped: the second half of the first mapping, mapped anew */
    say("unmap again %d", unmap(r, 2 * gran));
    say("release again %d", memRelease(h2));
    CUmemGenericAllocationHandle h3 = map_fill("half", r + gran, gran, 0x33);
    say("unmap half %d", unmap(r + gran, gran));
    say("release half %d", memRelease(h3));

    /* 2. Unmap, release, free the reservation, reserve the same address again, map there. */
    CUmemGenericAllocationHandle h4 = map_fill("before free", r, 4 * gran, 0x44);
    say("unmap before free %d", unmap(r, 4 * gran));
    say("release before free %d", memRelease(h4));
    say("address free %d", addressFree(r, 4 * gran));
    CUdeviceptr r2 = 0;
    rc = reserve(&r2, 4 * gran, 0, r, 0);
    say("reserve again %d same address %d", rc, r2 == r);
    CUmemGenericAllocationHandle h5 = map_fill("after free", r2, 4 * gran, 0x55);
    say("unmap after free %d", unmap(r2, 4 * gran));
    say("release after free %d", memRelease(h5));
    say("address free again %d", addressFree(r2, 4 * gran));

    /* 3. NCCL's free: retain, release, unmap, release, address free. */
    typedef CUresult (*PFN_retain)(CUmemGenericAllocationHandle *, void *);
    PFN_retain retain = (PFN_retain)rt_entry("cuMemRetainAllocationHandle", cudaEnableDefault);
    CUdeviceptr r3 = 0;
    rc = reserve(&r3, 2 * gran, 0, 0, 0);
    say("nccl reserve %d", rc);
    CUmemGenericAllocationHandle h6 = map_fill("nccl", r3, 2 * gran, 0x66);
    CUmemGenericAllocationHandle got = 0;
    rc = retain(&got, (void *)(uintptr_t)(r3 + gran));
    say("nccl retain %d same handle %d", rc, got == h6);
    say("nccl release retained %d", memRelease(got));
    say("nccl unmap %d", unmap(r3, 2 * gran));
    say("nccl release %d", memRelease(h6));
    say("nccl release once more %d", memRelease(h6));
    say("nccl address free %d", addressFree(r3, 2 * gran));
    say("done");
    return 0;
}
