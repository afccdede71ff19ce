//! The device side of isolation, made once per context and shared by everything that needs it:
//! the PTX module (`verify.ptx`, JIT-compiled by the driver and loaded once per context), its
//! kernels, the result buffers (module globals, so the library allocates no device memory
//! through the API it hooks; pinned host memory for the release stream's copies) and the
//! release stream. Each part is made on its first use in a context; a part the driver cannot
//! make stays `None` there for good, and its user goes another way (the host check, the
//! synchronous release, the driver's memset).
//!
//! Layer: policies. Uses the base only.

use crate::base::cu::{self, CuError};
use crate::base::cuda::*;
use crate::base::real::*;
use crate::base::sys::ForkLock;
use std::ffi::{CStr, c_void};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

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
}

// SAFETY: CUDA handles and pinned memory are usable from any thread; access is under a lock.
unsafe impl Send for Parts {}

static CACHE: ForkLock<Vec<(usize, Parts)>> = ForkLock::new(Vec::new());

/// In a fork child: the parent's handles are not the child's.
pub fn after_fork_child() {
    CACHE.reset_in_child(Vec::new());
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

/// The module of the current context, loaded on first use.
fn module(p: &mut Parts) -> Option<cu::CUmodule> {
    let m = *p.module.get_or_insert_with(|| {
        // `PTX` ends in its only NUL.
        let image = CStr::from_bytes_with_nul(PTX.as_bytes()).ok()?;
        cu::module_load_data(image).ok().map(|m| m as usize)
    });
    m.map(|m| m as cu::CUmodule)
}

fn function(module: cu::CUmodule, name: &CStr) -> Option<CUfunction> {
    // SAFETY: `module` was loaded into the current context by `module` above and is never
    // unloaded.
    unsafe { cu::module_get_function(module, name) }.ok()
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
        p.verify = Some(v);
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
        *p.sparse.get_or_insert_with(|| {
            let made = (|| {
                MODULE_GET_FUNCTION.get()?;
                let image = CStr::from_bytes_with_nul(SPARSE_PTX.as_bytes()).ok()?;
                let module = cu::module_load_data(image).ok()? as cu::CUmodule;
                let fill = function(module, c"isolate_poison_sparse").filter(|f| !f.is_null())?;
                let verify = function(module, c"isolate_verify_sparse").filter(|f| !f.is_null())?;
                Some(Sparse { fill, verify })
            })();
            if made.is_none() && !SPARSE_FAILED.swap(true, Relaxed) {
                crate::base::sys::warn(
                    "ISOLATE_CHECK=fast: the fast tier's kernels could not be loaded; freed \
                     blocks are poisoned and checked whole, as with ISOLATE_CHECK=full",
                );
            }
            made
        })
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
        p.release = Some(r);
        r
    })
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
