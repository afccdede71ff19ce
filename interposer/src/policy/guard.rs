//! Guard mode (`ISOLATE_GUARD=on`, with isolate mode): every device allocation is made through
//! the virtual-memory API, placed so that its end meets an unmapped guard region (or, with
//! `ISOLATE_GUARD_SIDE=start`, its start follows one). On free the physical memory is unmapped
//! and released but the address range stays reserved and is never handed out again, so a later
//! access through a stale pointer faults instead of corrupting another allocation.
//!
//! Layer: policies. Uses the base, recording and [`super::sync`].

use crate::base::config;
use crate::base::cuda::*;
use crate::base::real::{self, *};
use crate::base::sys::ForkLock;
use crate::record::event;
use isolate_trace::{Api, NoteKind};
use std::collections::{HashMap, VecDeque};

/// One guarded allocation.
#[derive(Clone, Copy)]
struct Guarded {
    va: u64,
    va_size: u64,
    map_at: u64,
    phys: u64,
    handle: CUmemGenericAllocationHandle,
}

#[derive(Default)]
struct State {
    live: HashMap<u64, Guarded>,
    /// Reservations of freed allocations, oldest first: never handed out again, unless the
    /// address space runs short.
    retired: VecDeque<(u64, u64)>,
    granularity: HashMap<i32, u64>,
}

static STATE: ForkLock<Option<State>> = ForkLock::new(None);

/// Unmapped address space kept on each side of a guarded allocation (rounded up to the
/// granularity: one 2 MiB granule on an H200). 32 MiB was tried, to keep pointers a kernel
/// derives past its operands out of freed neighbours; measured on the H200 it did not remove the
/// launch check's reports (their real cause: pairs of 32-bit integers in CUTLASS's `Params`, such
/// as (4096, 32), that read as addresses in the low range where the driver placed those 66 MiB
/// reservations; now reported as stale *values*, see `launch.rs`) and it made guard-mode training
/// slower, so one granule it is.
const GAP: u64 = 2 << 20;

fn with<R>(f: impl FnOnce(&mut State) -> R) -> R {
    let mut g = STATE.lock();
    f(g.get_or_insert_with(State::default))
}

/// Device allocations guard mode takes over: [`Api::guardable`] (managed, host, graph and
/// shared memory keep their own contracts, pitched allocations their pitch), at least
/// `ISOLATE_GUARD_MIN_SIZE` bytes.
pub fn guardable(api: Api, size: u64) -> bool {
    let c = config::get();
    c.guard && size > 0 && size >= c.guard_min_size && api.guardable()
}

fn prop(device: i32) -> CUmemAllocationProp {
    CUmemAllocationProp {
        type_: 1, // CU_MEM_ALLOCATION_TYPE_PINNED
        requested_handle_types: 0,
        location: CUmemLocation {
            type_: 1,
            id: device,
        }, // CU_MEM_LOCATION_TYPE_DEVICE
        win32_handle_meta_data: std::ptr::null_mut(),
        compression_type: 0,
        gpu_direct_rdma_capable: 0,
        usage: 0,
        reserved: [0; 4],
    }
}

fn granularity(device: i32) -> Option<u64> {
    if let Some(g) = with(|s| s.granularity.get(&device).copied()) {
        return Some(g);
    }
    let f = MEM_GET_ALLOCATION_GRANULARITY.get()?;
    let p = prop(device);
    let mut g = 0usize;
    // CU_MEM_ALLOC_GRANULARITY_MINIMUM = 0
    if unsafe { f(&mut g, &p, 0) } != CUDA_SUCCESS || g == 0 {
        return None;
    }
    with(|s| s.granularity.insert(device, g as u64));
    Some(g as u64)
}

/// Makes a guarded allocation of `size` bytes for `api`. `Err(code)`: the driver's answer when
/// it failed for lack of memory; `Ok(None)`: guard mode cannot be used here (fall back to the
/// real call).
/// `recycled` is told of each old reservation handed back to the driver (its addresses may be
/// handed out again).
pub fn alloc(
    api: Api,
    size: u64,
    mut recycled: impl FnMut(u64, u64),
) -> Result<Option<u64>, CUresult> {
    let mut device = event::current_device();
    if device < 0 && api.is_runtime() {
        // The program's first CUDA call: the runtime makes its context current on it. Have it
        // do so now (cudaFree(NULL), its usual way), or this allocation would not be guarded.
        if let Some(f) = real::FREE.get() {
            unsafe { f(std::ptr::null_mut()) };
        }
        device = event::current_device();
    }
    if device < 0 {
        return Ok(None);
    }
    let Some(gran) = granularity(device) else {
        return Ok(None);
    };
    let (
        Some(reserve),
        Some(create),
        Some(map),
        Some(access),
        Some(release),
        Some(unmap),
        Some(free_va),
    ) = (
        real::MEM_ADDRESS_RESERVE.get(),
        real::MEM_CREATE.get(),
        real::MEM_MAP.get(),
        real::MEM_SET_ACCESS.get(),
        real::MEM_RELEASE.get(),
        real::MEM_UNMAP.get(),
        real::MEM_ADDRESS_FREE.get(),
    )
    else {
        return Ok(None);
    };
    // Unmapped address space on both sides: an access just past the end (or, left-aligned,
    // just before the start) faults instead of reaching a neighbour.
    let gap = GAP.div_ceil(gran) * gran;
    // A size near u64::MAX has no such layout: the driver answers it (no overflow here).
    let Some((phys, va_size)) = size
        .checked_next_multiple_of(gran)
        .and_then(|phys| Some((phys, phys.checked_add(2 * gap)?)))
    else {
        return Ok(None);
    };
    let mut va: CUdeviceptr = 0;
    let mut r = unsafe { reserve(&mut va, va_size as usize, gran as usize, 0, 0) };
    while r != CUDA_SUCCESS {
        // Address space short: hand the oldest retired reservations back, say so, try again.
        let Some((old, old_size)) = with(|s| s.retired.pop_front()) else {
            return Ok(None);
        };
        unsafe { free_va(old, old_size as usize) };
        // Its addresses may be handed out again now: no longer "freed memory" to the launch check.
        recycled(old, old_size);
        event::note(
            NoteKind::GuardRecycle,
            old,
            old_size,
            0,
            "guard mode recycled an old address reservation: address space ran short".into(),
        );
        r = unsafe { reserve(&mut va, va_size as usize, gran as usize, 0, 0) };
    }
    let p = prop(device);
    let mut handle: CUmemGenericAllocationHandle = 0;
    let r = unsafe { create(&mut handle, phys as usize, &p, 0) };
    if r != CUDA_SUCCESS {
        unsafe { free_va(va, va_size as usize) };
        return if r == CUDA_ERROR_OUT_OF_MEMORY {
            Err(r)
        } else {
            Ok(None)
        };
    }
    let under = config::get().guard_underflow;
    let map_at = va + gap;
    let ok = unsafe { map(map_at, phys as usize, 0, handle, 0) } == CUDA_SUCCESS && {
        let desc = CUmemAccessDesc {
            location: CUmemLocation {
                type_: 1,
                id: device,
            },
            flags: 3,
        };
        let r = unsafe { access(map_at, phys as usize, &desc, 1) };
        if r != CUDA_SUCCESS {
            unsafe { unmap(map_at, phys as usize) };
        }
        r == CUDA_SUCCESS
    };
    if !ok {
        unsafe {
            release(handle);
            free_va(va, va_size as usize);
        }
        return Ok(None);
    }
    // Right-aligned (cudaMalloc's 256-byte alignment kept), so one byte past the end faults.
    let ptr = if under {
        map_at
    } else {
        map_at + phys - size.div_ceil(256) * 256
    };
    with(|s| {
        s.live.insert(
            ptr,
            Guarded {
                va,
                va_size,
                map_at,
                phys,
                handle,
            },
        )
    });
    Ok(Some(ptr))
}

pub fn owns(ptr: u64) -> bool {
    with(|s| s.live.contains_key(&ptr))
}

/// Unmaps and releases the memory; the reservation stays, retired.
pub fn free(ptr: u64, stream: Option<CUstream>) -> CUresult {
    let Some(g) = with(|s| s.live.remove(&ptr)) else {
        return CUDA_ERROR_INVALID_VALUE;
    };
    // Work still queued must finish before the memory goes (as cudaFree waits).
    let r = match stream {
        Some(st) => STREAM_SYNCHRONIZE
            .get()
            .map_or(CUDA_SUCCESS, |f| unsafe { f(st) }),
        None => CTX_SYNCHRONIZE.get().map_or(CUDA_SUCCESS, |f| {
            let token = super::sync::begins();
            let r = unsafe { f() };
            if r == CUDA_SUCCESS {
                // Every launch before it ran without a fault: their stale values went unused.
                super::sync::clean(token);
            }
            r
        }),
    };
    if let (Some(unmap), Some(release)) = (real::MEM_UNMAP.get(), real::MEM_RELEASE.get()) {
        unsafe {
            unmap(g.map_at, g.phys as usize);
            release(g.handle);
        }
    }
    with(|s| s.retired.push_back((g.va, g.va_size)));
    r
}

/// In a fork child: the parent's guarded memory is not the child's, and another thread of the
/// parent may have held the lock at the fork.
pub fn after_fork_child() {
    STATE.reset_in_child(None);
}
