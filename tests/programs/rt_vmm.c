// link: cudart
/* PyTorch's expandable segments: the driver's virtual memory calls, fetched through
 * cudaGetDriverEntryPointByVersion(..., 12000, ...). */
#include "common.h"

static void *entry(const char *name) {
    void *p = NULL;
    enum cudaDriverEntryPointQueryResult st = 99;
    int rc = cudaGetDriverEntryPointByVersion(name, &p, 12000, cudaEnableDefault, &st);
    say("cudaGetDriverEntryPointByVersion(%s) %d status=%d found=%d", name, rc, st, p != NULL);
    if (!p)
        exit(1);
    return p;
}

static PFN_map map;
static PFN_setAccess setAccess;

static void map_rw(CUdeviceptr at, const char *at_label, size_t at_off, size_t size, size_t off,
                   CUmemGenericAllocationHandle h, const char *h_label) {
    int rc = map(at + at_off, size, off, h, 0);
    ev("cuMemMap", rc, "ptr=@%s+%zu size=%zu offset=%zu handle=@%s flags=0", at_label, at_off, size,
       off, h_label);
    CUmemAccessDesc acc;
    acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    acc.location.id = 0;
    acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    rc = setAccess(at + at_off, size, &acc, 1);
    ev("cuMemSetAccess", rc, "ptr=@%s+%zu size=%zu handle=1 flags=3 offset=1", at_label, at_off,
       size);
}

int main(void) {
    setup();
    int rc = cudaFree(NULL); /* initialises the runtime, as PyTorch's lazy init does */
    ev("cudaFree", rc, "ptr=0");

    PFN_granularity granularity = (PFN_granularity)entry("cuMemGetAllocationGranularity");
    PFN_reserve reserve = (PFN_reserve)entry("cuMemAddressReserve");
    PFN_addressFree addressFree = (PFN_addressFree)entry("cuMemAddressFree");
    PFN_create create = (PFN_create)entry("cuMemCreate");
    PFN_memRelease memRelease = (PFN_memRelease)entry("cuMemRelease");
    map = (PFN_map)entry("cuMemMap");
    PFN_unmap unmap = (PFN_unmap)entry("cuMemUnmap");
    setAccess = (PFN_setAccess)entry("cuMemSetAccess");
    /* asked twice, as PyTorch does for every segment: the second answer is the first */
    say("same entry twice %d", (void *)map == entry("cuMemMap"));

    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    size_t g = 0;
    rc = granularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED);
    say("granularity %d %zu", rc, g);
    if (g == 0)
        g = 2 << 20;

    /* a large reserved range, two physical chunks mapped side by side */
    CUdeviceptr seg = 0;
    rc = reserve(&seg, 8 * g, 0, 0, 0);
    ev("cuMemAddressReserve", rc, "size=%zu offset=0 ptr=%s", 8 * g, AP(rc, seg, "seg"));
    CUmemGenericAllocationHandle h1 = 0, h2 = 0, h3 = 0;
    rc = create(&h1, g, &prop, 0);
    ev("cuMemCreate", rc, "size=%zu handle=%s device=0", g, AP(rc, h1, "h1"));
    rc = create(&h2, g, &prop, 0);
    ev("cuMemCreate", rc, "size=%zu handle=%s device=0", g, AP(rc, h2, "h2"));
    say("h1!=h2 %d", h1 != h2);
    map_rw(seg, "seg", 0, g, 0, h1, "h1");
    map_rw(seg, "seg", g, g, 0, h2, "h2");
    rc = cudaMemset((void *)(uintptr_t)seg, 0x21, 2 * g);
    say("cudaMemset over both chunks %d", rc);
    unsigned char edge[2] = {0, 0};
    rc = cudaMemcpy(edge, (void *)(uintptr_t)(seg + g - 1), 2, cudaMemcpyDeviceToHost);
    say("read across the seam %d %#x %#x", rc, edge[0], edge[1]);

    /* one handle at two addresses: a write through one shows through the other */
    CUdeviceptr alias = 0;
    rc = reserve(&alias, g, 0, 0, 0);
    ev("cuMemAddressReserve", rc, "size=%zu offset=0 ptr=%s", g, AP(rc, alias, "alias"));
    map_rw(alias, "alias", 0, g, 0, h1, "h1");
    const char msg[] = "written through seg";
    rc = cudaMemcpy((void *)(uintptr_t)(seg + 4096), msg, sizeof msg, cudaMemcpyHostToDevice);
    char got[sizeof msg];
    memset(got, 0, sizeof got);
    int rc2 = cudaMemcpy(got, (void *)(uintptr_t)(alias + 4096), sizeof msg, cudaMemcpyDeviceToHost);
    say("alias write %d read %d same %d", rc, rc2, memcmp(msg, got, sizeof msg) == 0);
    say("alias!=seg %d", alias != seg);

    /* a map at an offset into a larger handle */
    rc = create(&h3, 2 * g, &prop, 0);
    ev("cuMemCreate", rc, "size=%zu handle=%s device=0", 2 * g, AP(rc, h3, "h3"));
    map_rw(seg, "seg", 2 * g, 2 * g, 0, h3, "h3");
    CUdeviceptr tail = 0;
    rc = reserve(&tail, g, g, 0, 0);
    ev("cuMemAddressReserve", rc, "size=%zu offset=%zu ptr=%s", g, g, AP(rc, tail, "tail"));
    map_rw(tail, "tail", 0, g, g, h3, "h3");
    const char msg2[] = "second half of h3";
    rc = cudaMemcpy((void *)(uintptr_t)(seg + 3 * g + 100), msg2, sizeof msg2, cudaMemcpyHostToDevice);
    char got2[sizeof msg2];
    memset(got2, 0, sizeof got2);
    rc2 = cudaMemcpy(got2, (void *)(uintptr_t)(tail + 100), sizeof msg2, cudaMemcpyDeviceToHost);
    say("offset map write %d read %d same %d", rc, rc2, memcmp(msg2, got2, sizeof msg2) == 0);

    /* tear down in PyTorch's order: unmap, release, free the range */
    rc = unmap(tail, g);
    ev("cuMemUnmap", rc, "ptr=@tail size=%zu", g);
    rc = unmap(alias, g);
    ev("cuMemUnmap", rc, "ptr=@alias size=%zu", g);
    rc = unmap(seg, g);
    ev("cuMemUnmap", rc, "ptr=@seg size=%zu", g);
    rc = unmap(seg + g, g);
    ev("cuMemUnmap", rc, "ptr=@seg+%zu size=%zu", g, g);
    rc = unmap(seg + 2 * g, 2 * g);
    ev("cuMemUnmap", rc, "ptr=@seg+%zu size=%zu", 2 * g, 2 * g);
    rc = memRelease(h1);
    ev("cuMemRelease", rc, "handle=@h1");
    rc = memRelease(h2);
    ev("cuMemRelease", rc, "handle=@h2");
    rc = memRelease(h3);
    ev("cuMemRelease", rc, "handle=@h3");
    rc = addressFree(tail, g);
    ev("cuMemAddressFree", rc, "ptr=@tail size=%zu", g);
    rc = addressFree(alias, g);
    ev("cuMemAddressFree", rc, "ptr=@alias size=%zu", g);
    rc = addressFree(seg, 8 * g);
    ev("cuMemAddressFree", rc, "ptr=@seg size=%zu", 8 * g);
    /* the unversioned entry-point lookup, for a plain allocation */
    typedef CUresult (*PFN_alloc)(CUdeviceptr *, size_t);
    typedef CUresult (*PFN_free)(CUdeviceptr);
    void *pa = NULL, *pf = NULL;
    enum cudaDriverEntryPointQueryResult st = 99, st2 = 99;
    rc = cudaGetDriverEntryPoint("cuMemAlloc", &pa, cudaEnableDefault, &st);
    rc2 = cudaGetDriverEntryPoint("cuMemFree", &pf, cudaEnableDefault, &st2);
    say("cudaGetDriverEntryPoint %d %d status %d %d", rc, rc2, st, st2);
    if (pa && pf) {
        CUdeviceptr d = 0;
        rc = ((PFN_alloc)pa)(&d, 3333);
        ev("cuMemAlloc_v2", rc, "size=3333 ptr=%s", AP(rc, d, "d"));
        rc = ((PFN_free)pf)(d);
        ev("cuMemFree_v2", rc, "ptr=%s", L(d, "d"));
    }
    say("cudaGetLastError %d", cudaGetLastError());
    say("done");
    return 0;
}
