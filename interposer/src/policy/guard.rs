//! Guard mode (`ISOLATE_GUARD=on`, with isolate mode): every device allocation is made through
//! the virtual-memory API, placed so that its end meets an unmapped guard region (or, with
//! `ISOLATE_GUARD_SIDE=start`, its start follows one). On free the physical memory is unmapped
//! and released but the address range stays reserved and is never handed out again, so a later
//! access through a stale pointer faults instead of corrupting another allocation.
//!
//! Layer: policies. Uses the base, recording and [`super::sync`].

use crate::base::config;
use crate::base::cu::{self, CuError};
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
    // CU_MEM_ALLOC_GRANULARITY_MINIMUM = 0
    let g = cu::mem_get_allocation_granularity(&prop(device), 0).ok()?;
    if g == 0 {
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
            // SAFETY: freeing null is defined (it does nothing but initialise the runtime).
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
    // Every call below exists, or guard mode is not used at all.
    if real::MEM_ADDRESS_RESERVE.get().is_none()
        || real::MEM_CREATE.get().is_none()
        || real::MEM_MAP.get().is_none()
        || real::MEM_SET_ACCESS.get().is_none()
        || real::MEM_RELEASE.get().is_none()
        || real::MEM_UNMAP.get().is_none()
        || real::MEM_ADDRESS_FREE.get().is_none()
    {
        return Ok(None);
    }
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
    let mut r = cu::mem_address_reserve(va_size as usize, gran as usize);
    while r.is_err() {
        // Address space short: hand the oldest retired reservations back, say so, try again.
        let Some((old, old_size)) = with(|s| s.retired.pop_front()) else {
            return Ok(None);
        };
        // SAFETY: a retired reservation of ours: its memory was unmapped at its free.
        let _ = unsafe { cu::mem_address_free(old, old_size as usize) };
        // Its addresses may be handed out again now: no longer "freed memory" to the launch check.
        recycled(old, old_size);
        event::note(
            NoteKind::GuardRecycle,
            old,
            old_size,
            0,
            "guard mode recycled an old address reservation: address space ran short".into(),
        );
        r = cu::mem_address_reserve(va_size as usize, gran as usize);
    }
    let Ok(va) = r else { return Ok(None) };
    let handle = match cu::mem_create(phys as usize, &prop(device)) {
        Ok(h) => h,
        Err(e) => {
            // SAFETY: reserved just now, nothing mapped in it.
            let _ = unsafe { cu::mem_address_free(va, va_size as usize) };
            return if e == CuError::Code(CUDA_ERROR_OUT_OF_MEMORY) {
                Err(CUDA_ERROR_OUT_OF_MEMORY)
            } else {
                Ok(None)
            };
        }
    };
    let under = config::get().guard_underflow;
    let map_at = va + gap;
    // SAFETY: [map_at, map_at+phys) lies inside the reservation just made (`gap` bytes in),
    // where nothing is mapped.
    let ok = unsafe { cu::mem_map(map_at, phys as usize, handle) }.is_ok() && {
        let desc = CUmemAccessDesc {
            location: CUmemLocation {
                type_: 1,
                id: device,
            },
            flags: 3,
        };
        // SAFETY: mapped just now.
        let r = unsafe { cu::mem_set_access(map_at, phys as usize, &[desc]) };
        if r.is_err() {
            // SAFETY: mapped just now, used by nobody.
            let _ = unsafe { cu::mem_unmap(map_at, phys as usize) };
        }
        r.is_ok()
    };
    if !ok {
        // SAFETY: made just now, mapped nowhere (any mapping was undone above), and the
        // reservation holds nothing.
        unsafe {
            let _ = cu::mem_release(handle);
            let _ = cu::mem_address_free(va, va_size as usize);
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
    // Nothing is guarded without guard mode: no lock on every free.
    config::get().guard && with(|s| s.live.contains_key(&ptr))
}

/// Unmaps and releases the memory; the reservation stays, retired.
pub fn free(ptr: u64, stream: Option<CUstream>) -> CUresult {
    let Some(g) = with(|s| s.live.remove(&ptr)) else {
        return CUDA_ERROR_INVALID_VALUE;
    };
    // Work still queued must finish before the memory goes (as cudaFree waits).
    let r = match stream {
        // SAFETY: the stream the program passed to its free: it exists.
        Some(st) => cu::code(unsafe { cu::stream_synchronize(st) }, CUDA_SUCCESS),
        None if CTX_SYNCHRONIZE.get().is_some() => {
            let token = super::sync::begins();
            let r = cu::ctx_synchronize();
            if r.is_ok() {
                // Every launch before it ran without a fault: their stale values went unused.
                super::sync::clean(token);
            }
            cu::code(r, CUDA_SUCCESS)
        }
        None => CUDA_SUCCESS,
    };
    if real::MEM_UNMAP.get().is_some() && real::MEM_RELEASE.get().is_some() {
        // SAFETY: the guarded allocation the program just freed (the work before the free
        // has run): its mapping and handle are ours and nobody uses them after.
        unsafe {
            let _ = cu::mem_unmap(g.map_at, g.phys as usize);
            let _ = cu::mem_release(g.handle);
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
