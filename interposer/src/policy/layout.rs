//! Kernels' parameter layouts for the launch check ([`super::launch`]): what the driver says
//! of each kernel's parameters (offset and size of each) and its name, read at its first
//! checked launch and cached by handle, and looked at again after anything that can end a
//! kernel's life (a handle may then belong to another kernel).
//!
//! Layer: policies. Uses the base and recording (its profile spans).

use crate::base::cu;
use crate::base::cuda::*;
use crate::base::sys::ForkLock;
use crate::record::profile;
use std::collections::HashMap;
use std::ffi::CStr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::*};

/// A kernel's parameters: (offset, size) of each, and its name.
pub(super) struct Layout {
    pub(super) params: Vec<(u32, u32)>,
    /// Whether a query gave the parameters: `cuFuncGetParamInfo`, or `cuKernelGetParamInfo` for
    /// a CUkernel (`as_kernel`). When neither answers (a driver before 12.4, a handle of another
    /// kind) the kernel's parameters are unknown: a `kernelParams` array cannot be read at all
    /// (its length is the parameter count), and a word of a packed buffer is never evidence.
    pub(super) known: bool,
    as_kernel: bool,
    pub(super) name: String,
    /// The [`UNLOADS`] count at which the layout was last seen to fit its handle.
    fitted: AtomicU64,
}

pub(super) static LAYOUTS: ForkLock<Option<HashMap<usize, &'static Layout>>> = ForkLock::new(None);
/// Calls that may have ended kernels' lives (module and library unloads, context
/// destruction), counted after each returned.
static UNLOADS: AtomicU64 = AtomicU64::new(0);
/// Cached layouts asked of the driver again because a module unload came since (noted at exit).
pub(super) static REFITS: AtomicU64 = AtomicU64::new(0);
/// Whether a new kernel's layout is asked of the CUkernel queries first: the kind that answered
/// last, since a program launches mostly one kind (PyTorch's own kernels are CUkernels, JAX's
/// and Triton's module functions). The query of the other kind fails for the handle (a line in
/// the driver's error log, CUDA_LOG_FILE), so asking the likely kind first saves a line a new
/// kernel: on ResNet-50 under PyTorch, 64 of 82 kernels were CUkernels asked as functions
/// first (docs/gpu-results.md, twenty-ninth session).
static KERNEL_FIRST: AtomicBool = AtomicBool::new(true);

/// A module or library was unloaded or a context destroyed: every cached layout is checked
/// again at its kernel's next launch.
pub fn kernels_unloaded() {
    UNLOADS.fetch_add(1, AcqRel);
}

/// Parameter `i` of `f`, by the query of its kind of handle.
///
/// # Safety
/// `f` is the kernel the program is launching now: its module (or library) is loaded.
unsafe fn param_info(f: CUfunction, i: usize, as_kernel: bool) -> cu::Result<(usize, usize)> {
    if as_kernel {
        // SAFETY: the caller's contract.
        unsafe { cu::kernel_get_param_info(f, i) }
    } else {
        // SAFETY: the caller's contract.
        unsafe { cu::func_get_param_info(f, i) }
    }
}

/// What one query says of a kernel's parameters.
enum Answer {
    /// Its parameters (at least one; none only where the count of this kind said so).
    Params(Vec<(u32, u32)>),
    /// "No parameter 0" (`CUDA_ERROR_INVALID_VALUE`): no parameters, or (a driver that answers
    /// so for a handle of the other kind) not this query's handle.
    Empty,
    /// Any other failure of parameter 0 (`CUDA_ERROR_INVALID_HANDLE`, a driver without the
    /// function): the query does not answer for this handle.
    Silent,
}

/// `f`'s parameter count by the count query of its kind: `Some(Ok(n))`, `Some(Err(()))` where
/// the query says the handle is not of that kind (`CUDA_ERROR_INVALID_HANDLE`), `None` where
/// there is no answer (a driver without the query, another failure): then the layout is read
/// up to the first index that fails.
///
/// # Safety
/// As [`param_info`].
unsafe fn param_count(f: CUfunction, as_kernel: bool) -> Option<Result<usize, ()>> {
    // SAFETY: the caller's contract.
    match unsafe { cu::get_param_count(f, as_kernel) } {
        Ok(n) => Some(Ok(n)),
        Err(cu::CuError::Code(CUDA_ERROR_INVALID_HANDLE)) => Some(Err(())),
        Err(_) => None,
    }
}

/// Reads `f`'s parameters by one query: as many as its count says (no failing call, nothing in
/// the driver's error log), or without a count up to the first index that fails.
///
/// # Safety
/// As [`param_info`].
unsafe fn read_params(f: CUfunction, as_kernel: bool) -> Answer {
    // SAFETY: the caller's contract.
    let count = match unsafe { param_count(f, as_kernel) } {
        // The count of this kind answered: a kernel of this kind, without parameters.
        Some(Ok(0)) => return Answer::Params(Vec::new()),
        Some(Ok(n)) => Some(n.min(4096)),
        Some(Err(())) => return Answer::Silent,
        None => None,
    };
    let mut params = Vec::new();
    if let Some(n) = count {
        for i in 0..n {
            // SAFETY: the caller's contract.
            match unsafe { param_info(f, i, as_kernel) } {
                Ok((off, size)) => params.push((off as u32, size as u32)),
                // The count and the parameters disagree: no layout to trust.
                Err(_) => return Answer::Silent,
            }
        }
        return Answer::Params(params);
    }
    for i in 0..4096 {
        // SAFETY: the caller's contract.
        match unsafe { param_info(f, i, as_kernel) } {
            Ok((off, size)) => params.push((off as u32, size as u32)),
            Err(cu::CuError::Code(CUDA_ERROR_INVALID_VALUE)) if i == 0 => return Answer::Empty,
            Err(_) if i == 0 => return Answer::Silent,
            Err(_) => break, // past the last one
        }
    }
    Answer::Params(params)
}

/// `f`'s layout: (parameters, known, as a CUkernel). The query of the kind that answered last
/// first ([`KERNEL_FIRST`]): `cuKernelGetParamInfo` (a CUkernel, which the CUDA 12+ runtime
/// launches in place of a CUfunction) or `cuFuncGetParamInfo` (a module's function: cuBLAS,
/// cuDNN, every kernel of JAX and Triton); when it gives no parameters, the other. No
/// parameters from either with one saying "no parameter 0" is a kernel without parameters; no
/// answer from either, an unknown layout.
///
/// # Safety
/// As [`param_info`].
unsafe fn read_layout(f: CUfunction) -> (Vec<(u32, u32)>, bool, bool) {
    let kernel_first = KERNEL_FIRST.load(Relaxed);
    // SAFETY: the caller's contract.
    let first = unsafe { read_params(f, kernel_first) };
    if let Answer::Params(p) = first {
        return (p, true, kernel_first);
    }
    // SAFETY: the caller's contract.
    match unsafe { read_params(f, !kernel_first) } {
        Answer::Params(p) => {
            KERNEL_FIRST.store(!kernel_first, Relaxed);
            (p, true, !kernel_first)
        }
        Answer::Empty => (Vec::new(), true, false),
        Answer::Silent => (Vec::new(), matches!(first, Answer::Empty), false),
    }
}

/// The kernel's name: `cuFuncGetName` or `cuKernelGetName` (the CUDA 12+ runtime launches a
/// library's CUkernel, for which only the second answers), the one of its kind first (as the
/// layout found it: `as_kernel`), so that the other fails only where the kind is unknown (a
/// failing call is a line in the driver's error log, CUDA_LOG_FILE); else its handle.
///
/// # Safety
/// As [`param_info`].
unsafe fn kernel_name(f: CUfunction, as_kernel: bool) -> String {
    let by_func = |f| {
        // SAFETY: the caller's contract.
        match unsafe { cu::func_get_name(f) } {
            Ok(p) if !p.is_null() => Some(p),
            _ => None,
        }
    };
    let by_kernel = |f| {
        // SAFETY: the caller's contract.
        match unsafe { cu::kernel_get_name(f) } {
            Ok(p) if !p.is_null() => Some(p),
            _ => None,
        }
    };
    let p = if as_kernel {
        by_kernel(f).or_else(|| by_func(f))
    } else {
        by_func(f).or_else(|| by_kernel(f))
    };
    let Some(p) = p else {
        return format!("(unnamed kernel {f:p})");
    };
    // SAFETY: the driver's NUL-terminated name, alive as long as the module.
    unsafe { CStr::from_ptr(p) }
        .to_string_lossy()
        .chars()
        .take(4096)
        .collect()
}

/// Slots of a thread's cache of layouts ([`layout`]).
const NEAR_LAYOUTS: usize = 1024;

/// [`NEAR_LAYOUTS`] slots, made on the heap in place (`vec!`): a 24 KiB array built on the
/// stack first would not fit a thread with a small stack.
type NearLayouts = Box<[(usize, usize, u64)]>;

thread_local! {
    /// The thread's last layouts: (kernel handle, layout, the [`UNLOADS`] count it was fitted
    /// at), by the handle's hash. A hit costs no lock and no hash map: a training step's
    /// launches are a few hundred kernels over and over (0.10 µs a launch on an H100 host,
    /// performance.md, fourteenth session). On the heap, made at the thread's first launch: a
    /// thread's static TLS comes out of its stack, which may be small.
    static NEAR: std::cell::RefCell<Option<NearLayouts>> = const { std::cell::RefCell::new(None) };
}

fn near_slot(f: usize) -> usize {
    (f.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 54) % NEAR_LAYOUTS
}

/// The layout of kernel `f`, cached by handle. A handle can be reused: a module unloaded and
/// another loaded (XLA's autotuning does this all the time) may give a new kernel the address
/// of an old `CUfunction`. Reading parameters with the old kernel's layout walks past the new
/// kernel's parameter array (a crash in the host process, seen with JAX), so after any call
/// that can end a kernel's life ([`kernels_unloaded`]) a cached layout is used again only once
/// it is seen to still fit: the parameter count (one past the last fails) and the last
/// parameter's place and size. That look costs two driver calls (~3 us on the H200, as much as
/// the rest of the check); without unloads a launch makes none.
pub(super) fn layout(f: CUfunction) -> &'static Layout {
    let _t = profile::PartSpan::start(profile::Part::LaunchLayout);
    // Read before looking: an unload counted after this makes the next launch look again.
    let unloads = UNLOADS.load(Acquire);
    let key = f as usize;
    let near = NEAR
        .try_with(|c| {
            let (k, l, at) = c.try_borrow().ok()?.as_ref()?[near_slot(key)];
            // SAFETY: `l` was made from a `&'static Layout` by this function (leaked, never
            // freed).
            (k == key && at == unloads).then(|| unsafe { &*(l as *const Layout) })
        })
        .ok()
        .flatten();
    if let Some(l) = near {
        return l;
    }
    let l = shared_layout(f, unloads);
    let _ = NEAR.try_with(|c| {
        if let Ok(mut c) = c.try_borrow_mut() {
            c.get_or_insert_with(|| vec![(0, 0, u64::MAX); NEAR_LAYOUTS].into_boxed_slice())
                [near_slot(key)] = (key, l as *const Layout as usize, unloads);
        }
    });
    l
}

/// [`layout`] from the process's map (asked of the driver for a kernel not seen yet, or seen
/// before an unload and no longer fitting).
fn shared_layout(f: CUfunction, unloads: u64) -> &'static Layout {
    let _t = profile::PartSpan::start(profile::Part::LaunchShared);
    let mut g = LAYOUTS.lock();
    let map = g.get_or_insert_with(HashMap::new);
    if let Some(l) = map.get(&(f as usize)) {
        if l.fitted.load(Relaxed) == unloads {
            return l;
        }
        REFITS.fetch_add(1, Relaxed);
        let _t = profile::PartSpan::start(profile::Part::LaunchRefit);
        if still_fits(f, l) {
            l.fitted.store(unloads, Relaxed);
            return l;
        }
    }
    // SAFETY: `f` is the kernel the program is launching now: its module is loaded.
    let (params, known, as_kernel) = unsafe { read_layout(f) };
    // SAFETY: as above.
    let name = unsafe { kernel_name(f, as_kernel) };
    // Leaked on purpose: kernels live as long as their module, layouts are small, and a hit
    // may still name a replaced one.
    let l: &'static Layout = Box::leak(Box::new(Layout {
        params,
        known,
        as_kernel,
        name,
        fitted: AtomicU64::new(unloads),
    }));
    map.insert(f as usize, l);
    l
}

/// True when kernel `f` still has layout `l`'s parameter count and last parameter.
fn still_fits(f: CUfunction, l: &Layout) -> bool {
    if !l.known {
        // SAFETY: `f` is the kernel the program is launching now: its module is loaded.
        return !unsafe { read_layout(f) }.1;
    }
    let n = l.params.len();
    // SAFETY: `f` is the kernel the program is launching now: its module is loaded.
    match unsafe { param_count(f, l.as_kernel) } {
        Some(Ok(count)) if count != n => return false,
        Some(Ok(_)) => {}
        Some(Err(())) => return false, // no longer a handle of this kind
        // SAFETY: as above.
        None if unsafe { param_info(f, n, l.as_kernel) }.is_ok() => {
            return false; // more parameters than the layout has
        }
        None => {}
    }
    match l.params.last() {
        None => true,
        Some(&(o, sz)) => {
            // SAFETY: as above.
            let r = unsafe { param_info(f, n - 1, l.as_kernel) };
            r == Ok((o as usize, sz as usize))
        }
    }
}
