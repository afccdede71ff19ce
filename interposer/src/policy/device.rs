//! The device side of isolation, made once per context and shared by everything that needs it:
//! the PTX module (`verify.ptx`, JIT-compiled by the driver and loaded once per context), its
//! kernels, the result buffers (module globals, so the library allocates no device memory
//! through the API it hooks; pinned host memory for the release stream's copies) and the
//! release stream. Each part is made on its first use in a context, or at the context's first
//! allocation ([`prepare`]), while the device still has room for a module; a part the driver
//! cannot make stays `None` there for good, and its user goes another way (the host check, the
//! synchronous release, the driver's memset) — except where a module could not be loaded for
//! want of device memory: that is tried again on a use at least a second later (on the H100
//! a process that first freed on a full device checked every block on the host for good, 0.2 s
//! for each 256 MiB block).
//!
//! Layer: policies. Uses the base only.

use crate::base::cu::{self, CuError};
use crate::base::cuda::*;
use crate::base::real::*;
use crate::base::sys::ForkLock;
use std::ffi::{CStr, c_void};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
use std::time::{Duration, Instant};

/// How long a module that could not be loaded for want of device memory waits before it is
/// tried again.
const RETRY_AFTER: Duration = Duration::from_secs(1);

/// Allocations checked by one launch, and by one copy of results back: the synchronous check's
/// batch and the release stream's (a slot of [`Release::ring`]).
pub const BATCH: usize = 256;
/// Batches that can be in flight at once per context on the release stream.
pub const SLOTS: usize = 8;
/// Bytes of one slot: [`BATCH`] descriptors (ptr, len), then [`BATCH`] results (changed, first).
pub const SLOT_BYTES: usize = BATCH * 32;

/// The module's kernels (`isolate_verify` for the synchronous check, `isolate_verify_many`
/// and `isolate_verify_many16` for the release stream's, `isolate_poison` and
/// `isolate_poison_many` for the poisons) and its globals.
static PTX: &str = concat!(include_str!("verify.ptx"), "\0");

/// The fast tier's kernels (`isolate_poison_sparse`, `isolate_verify_sparse`): a module of their
/// own, loaded only with `ISOLATE_CHECK=fast`, so the default tier's module never depends on it.
static SPARSE_PTX: &str = concat!(include_str!("sparse.ptx"), "\0");

/// The fast tier's fill and check ([`crate::policy::tier`]): the same parameters as
/// `isolate_poison_many` and `isolate_verify_many16`, each descriptor's length carrying its
/// pattern's shift.
#[derive(Clone, Copy)]
pub struct Sparse {
    pub fill: CUfunction,
    pub verify: CUfunction,
}

/// The synchronous check's kernel and its results (the module global `isolate_result`,
/// [`BATCH`] pairs).
#[derive(Clone, Copy)]
pub struct Verify {
    pub func: CUfunction,
    pub result: CUdeviceptr,
}

/// What the release stream needs: the stream, its kernels, the slots on both sides.
#[derive(Clone, Copy)]
pub struct Release {
    pub stream: CUstream,
    /// `isolate_verify_many`.
    pub func: CUfunction,
    /// `isolate_verify_many16` (128-bit loads), for batches whose allocations all start
    /// 16-byte aligned, where the module has it.
    pub func16: Option<CUfunction>,
    /// `isolate_poison`, where the module has it (`ISOLATE_TEST_POISON_BY=kernel`).
    pub fill: Option<CUfunction>,
    /// `isolate_poison_many`, where the module has it: the deferred poisons.
    pub fill_many: Option<CUfunction>,
    /// [`SLOTS`] slots of [`SLOT_BYTES`] on the device (the module global `isolate_ring`).
    pub ring: CUdeviceptr,
    /// The same on the host, pinned.
    pub host: *mut u8,
}

/// One context's parts; `None` inside: tried, and not to be had.
#[derive(Default)]
struct Parts {
    module: Option<Option<usize>>,
    verify: Option<Option<Verify>>,
    release: Option<Option<Release>>,
    sparse: Option<Option<Sparse>>,
    /// When the module, or the fast tier's, last could not be loaded for want of device
    /// memory: not tried again before [`RETRY_AFTER`] from then.
    short: Option<Instant>,
}

/// A module's load that failed for want of device memory (or waits, after such a failure, for
/// [`RETRY_AFTER`]): tried again on a later use.
struct Short;

/// Loads `ptx` (ending in its only NUL) into the current context for `p`: the module, or
/// `None` where it is not to be had (never tried again), or [`Short`] (tried again later,
/// and `p` remembers when).
fn load(p: &mut Parts, ptx: &str) -> Result<Option<cu::CUmodule>, Short> {
    if p.short.is_some_and(|t| t.elapsed() < RETRY_AFTER) {
        return Err(Short);
    }
    let Ok(image) = CStr::from_bytes_with_nul(ptx.as_bytes()) else {
        return Ok(None);
    };
    match cu::module_load_data(image) {
        Ok(m) => Ok(Some(m)),
        Err(CuError::Code(CUDA_ERROR_OUT_OF_MEMORY)) => {
            p.short = Some(Instant::now());
            Err(Short)
        }
        Err(_) => Ok(None),
    }
}

// SAFETY: CUDA handles and pinned memory are usable from any thread; access is under a lock.
unsafe impl Send for Parts {}

static CACHE: ForkLock<Vec<(usize, Parts)>> = ForkLock::new(Vec::new());

/// In a fork child: the parent's handles are not the child's.
pub fn after_fork_child() {
    CACHE.reset_in_child(Vec::new());
    for slot in &PREPARED {
        slot.store(0, Relaxed);
    }
}

/// `f` with context `ctx`'s parts (made empty on its first use).
fn with<R>(ctx: usize, f: impl FnOnce(&mut Parts) -> R) -> R {
    let mut g = CACHE.lock();
    let i = match g.iter().position(|(c, _)| *c == ctx) {
        Some(i) => i,
        None => {
            g.push((ctx, Parts::default()));
            g.len() - 1
        }
    };
    f(&mut g[i].1)
}

/// The module of the current context, loaded on first use; `p.module` stays undecided while
/// the device has no room for it (tried again later).
fn module(p: &mut Parts) -> Option<cu::CUmodule> {
    if let Some(m) = p.module {
        return m.map(|m| m as cu::CUmodule);
    }
    let m = load(p, PTX).ok()?;
    p.module = Some(m.map(|m| m as usize));
    m
}

/// The kernel `name` of `module`, its code loaded onto the device now where the driver can
/// (`cuFuncLoad`): with lazy loading it would be loaded at its first launch, which may come on
/// a full device. Where that fails, the first launch tries again.
fn function(module: cu::CUmodule, name: &CStr) -> Option<CUfunction> {
    // SAFETY: `module` was loaded into the current context by `module` above and is never
    // unloaded.
    let f = unsafe { cu::module_get_function(module, name) }.ok()?;
    if !f.is_null() {
        // SAFETY: a function of that module, just looked up.
        let _ = unsafe { cu::func_load(f) };
    }
    Some(f)
}

/// A module global of at least `bytes`.
fn global(module: cu::CUmodule, name: &CStr, bytes: usize) -> Option<CUdeviceptr> {
    // SAFETY: as in `function`.
    let (ptr, size) = unsafe { cu::module_get_global(module, name) }.ok()?;
    (size >= bytes).then_some(ptr)
}

/// The synchronous check's kernel of context `ctx` (current), made on first use; `None` where
/// the driver cannot load it (e.g. the CI stand-in: then the host check is used).
pub fn verify(ctx: usize) -> Option<Verify> {
    with(ctx, |p| {
        if let Some(v) = p.verify {
            return v;
        }
        let v = (|| {
            MODULE_GET_FUNCTION.get()?;
            MODULE_GET_GLOBAL.get()?;
            let module = module(p)?;
            let func = function(module, c"isolate_verify")?;
            // The result buffer is the module's own global: no allocation call of ours in a hook.
            let result = global(module, c"isolate_result", BATCH * 16)?;
            Some(Verify { func, result })
        })();
        if v.is_some() || p.module.is_some() {
            p.verify = Some(v); // else the module waits for room: tried again later
        }
        v
    })
}

/// The fast tier's kernels in context `ctx` (current), loaded on first use; `None` outside the
/// fast tier and where the driver cannot load them (the blocks are then poisoned and checked
/// whole, as in the full tier: a tier never checks a byte its poison did not write).
pub fn sparse(ctx: usize) -> Option<Sparse> {
    if !crate::base::config::get().check_fast {
        return None;
    }
    with(ctx, |p| {
        if let Some(s) = p.sparse {
            return s;
        }
        let module = match MODULE_GET_FUNCTION.get().map(|_| load(p, SPARSE_PTX)) {
            Some(Ok(m)) => m,
            // Whole blocks meanwhile; the fast tier's module is tried again later.
            Some(Err(Short)) => return None,
            None => None,
        };
        let made = module.and_then(|module| {
            let fill = function(module, c"isolate_poison_sparse").filter(|f| !f.is_null())?;
            let verify = function(module, c"isolate_verify_sparse").filter(|f| !f.is_null())?;
            Some(Sparse { fill, verify })
        });
        if made.is_none() && !SPARSE_FAILED.swap(true, Relaxed) {
            crate::base::sys::warn(
                "ISOLATE_CHECK=fast: the fast tier's kernels could not be loaded; freed \
                 blocks are poisoned and checked whole, as with ISOLATE_CHECK=full",
            );
        }
        p.sparse = Some(made);
        made
    })
}

/// The fast tier's kernels could not be loaded in some context (said once on stderr, and in
/// the exit note of the device's bytes).
static SPARSE_FAILED: AtomicBool = AtomicBool::new(false);

pub fn sparse_failed() -> bool {
    SPARSE_FAILED.load(Relaxed)
}

/// The release stream's side of context `ctx` (current), made on first use; `None` where the
/// driver cannot load the kernel (e.g. the CI stand-in without its emulation) or any piece
/// fails (then the caller releases the synchronous way).
pub fn release(ctx: usize) -> Option<Release> {
    with(ctx, |p| {
        if let Some(r) = p.release {
            return r;
        }
        let r = make_release(p);
        if r.is_some() || p.module.is_some() {
            p.release = Some(r); // else the module waits for room: tried again later
        }
        r
    })
}

/// The contexts [`prepare`] has made parts in (a slot a context; the first [`PREPARED_SLOTS`]
/// contexts of the process), so that an allocation's check is a few relaxed loads, with no
/// lock, in a process of several devices too.
const PREPARED_SLOTS: usize = 16;
static PREPARED: [AtomicUsize; PREPARED_SLOTS] = [const { AtomicUsize::new(0) }; PREPARED_SLOTS];

/// At an allocation in context `ctx` (current, not capturing): makes the parts the first
/// frees will need, once per context, while the device still has room for the modules (a
/// program that fills the device before its first free would otherwise find none). Past
/// [`PREPARED_SLOTS`] contexts, parts are made at first use only, as before.
pub fn prepare(ctx: usize) {
    let mut free_slot = None;
    for slot in &PREPARED {
        match slot.load(Relaxed) {
            c if c == ctx => return,
            0 if free_slot.is_none() => free_slot = Some(slot),
            _ => {}
        }
    }
    let Some(slot) = free_slot else { return };
    if slot.compare_exchange(0, ctx, Relaxed, Relaxed).is_err() {
        return; // another thread took the slot: a later allocation tries again
    }
    // Each is made once and kept (or waits for room): nothing is made twice here.
    release(ctx);
    verify(ctx);
    sparse(ctx);
}

/// Context `ctx` ends: its parts are forgotten (the driver frees them with it); a context made
/// again under the same handle makes its own.
pub fn forget(ctx: usize) {
    CACHE.lock().retain(|(c, _)| *c != ctx);
    for slot in &PREPARED {
        let _ = slot.compare_exchange(ctx, 0, Relaxed, Relaxed);
    }
}

/// The release stream's side of context `ctx` where it was made already; nothing is made here.
pub fn release_if_made(ctx: usize) -> Option<Release> {
    let g = CACHE.lock();
    g.iter()
        .find(|(c, _)| *c == ctx)
        .and_then(|(_, p)| p.release.flatten())
}

fn make_release(p: &mut Parts) -> Option<Release> {
    STREAM_CREATE.get()?;
    MEM_ALLOC_HOST.get()?;
    MODULE_GET_FUNCTION.get()?;
    MODULE_GET_GLOBAL.get()?;
    // Every function the release calls must exist before anything is queued.
    STREAM_WAIT_EVENT.get()?;
    EVENT_QUERY.get()?;
    MEMCPY_HTOD_ASYNC.get()?;
    MEMCPY_DTOH_ASYNC.get()?;
    MEM_FREE_ASYNC.get()?;
    LAUNCH_KERNEL.get()?;
    let module = module(p)?;
    let func = function(module, c"isolate_verify_many")?;
    // The module's other kernels, each optional.
    let optional = |name: &CStr| function(module, name).filter(|f| !f.is_null());
    let func16 = optional(c"isolate_verify_many16");
    let fill = optional(c"isolate_poison");
    let fill_many = optional(c"isolate_poison_many");
    let ring = global(module, c"isolate_ring", SLOTS * SLOT_BYTES)?;
    let host = cu::mem_alloc_host(SLOTS * SLOT_BYTES).ok()?;
    if host.is_null() {
        return None;
    }
    // CU_STREAM_NON_BLOCKING = 1: never ordered behind the legacy default stream.
    let stream = cu::stream_create(1).ok()?;
    Some(Release {
        stream,
        func,
        func16,
        fill,
        fill_many,
        ring,
        host: host.cast(),
    })
}

/// Launches `func` on `stream` with `gx` x `gy` blocks of 256 threads and `params` (the real
/// `cuLaunchKernel`: the library's own kernels are never checked); `None` where the driver has
/// no launch, else the launch's code.
///
/// # Safety
/// As [`cu::launch_kernel`].
pub unsafe fn launch_kernel(
    func: CUfunction,
    grid: (u32, u32),
    stream: CUstream,
    params: &mut [*mut c_void],
) -> Option<CUresult> {
    // SAFETY: the caller's contract is the wrapper's.
    match unsafe { cu::launch_kernel(func, grid, stream, params) } {
        Ok(()) => Some(CUDA_SUCCESS),
        Err(CuError::Code(c)) => Some(c),
        Err(CuError::Missing) => None,
    }
}
