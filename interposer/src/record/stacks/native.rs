//! Native frames of the calling thread, by unwinding with the DWARF call-frame information
//! every object carries in `.eh_frame` (no frame pointers, no debug info needed), through
//! `framehop` with a per-thread rule cache: after the first stack through a piece of code, a
//! frame costs a cache look-up and one or two stack reads.
//!
//! Every stack read is checked against the thread's own stack bounds (`pthread_getattr_np`,
//! once per thread), so a wrong rule ends the walk instead of faulting.
//!
//! Layer: recording. Uses the base and [`super::modules`].

use super::modules::Snapshot;
use framehop::x86_64::{CacheX86_64, UnwindRegsX86_64};
use framehop::{FrameAddress, Unwinder};
use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

thread_local! {
    /// Where the hook running on this thread was entered ([`Entry::mark`]): (ip, sp, bp), or
    /// all 0. A walk starts there instead of in [`unwind`]'s own frame, so the library's
    /// frames between the hook and the walk (the policy, the record, the capture: 5–8 of
    /// them, ~30 ns each) are not walked only to be left out.
    static ENTRY: Cell<(u64, u64, u64)> = const { Cell::new((0, 0, 0)) };
    // Const-initialised, no destructor: usable during thread teardown.
    static BOUNDS: Cell<(u64, u64)> = const { Cell::new((0, 0)) };
    static CACHE: RefCell<Option<Box<CacheX86_64>>> = const { RefCell::new(None) };
    /// The thread's cache's (hits, misses) when last added to [`HITS`] and [`MISSES`].
    static SEEN: Cell<(u64, u64)> = const { Cell::new((0, 0)) };
}

/// Frames whose unwind rule came from a thread's rule cache, and frames that had to be looked
/// up in the unwind information (noted at exit: a cache too small for a program's code shows
/// as misses).
static HITS: AtomicU64 = AtomicU64::new(0);
static MISSES: AtomicU64 = AtomicU64::new(0);

/// (hits, misses) of the unwinders' rule caches so far, all threads.
pub fn cache_stats() -> (u64, u64) {
    (HITS.load(Relaxed), MISSES.load(Relaxed))
}

/// The instruction pointer, stack pointer and frame pointer of the caller (inlined into it), at
/// one instruction: the unwind rules for that `ip` apply to that `sp` and `bp`.
#[inline(always)]
fn registers() -> (u64, u64, u64) {
    let (ip, sp, bp): (u64, u64, u64);
    // SAFETY: the three instructions only copy rip, rsp and rbp into output registers; they read
    // and write no memory and no flags (`nomem, nostack, preserves_flags` are true of them).
    unsafe {
        std::arch::asm!(
            "lea {ip}, [rip]",
            "mov {sp}, rsp",
            "mov {bp}, rbp",
            ip = out(reg) ip,
            sp = out(reg) sp,
            bp = out(reg) bp,
            options(nomem, nostack, preserves_flags)
        );
    }
    (ip, sp, bp)
}

/// While it lives, stack walks on this thread start at the point where it was made (see
/// [`ENTRY`]); made by the hooks as they are entered.
pub struct Entry {
    set: bool,
}

impl Entry {
    /// Marks this point of the caller (inlined into it) as where walks start; a no-op when an
    /// outer mark is set already.
    #[inline(always)]
    pub fn mark() -> Entry {
        let (ip, sp, bp) = registers();
        let set = ENTRY
            .try_with(|e| {
                if e.get().1 != 0 {
                    return false;
                }
                e.set((ip, sp, bp));
                true
            })
            .unwrap_or(false);
        Entry { set }
    }
}

impl Drop for Entry {
    #[inline(always)]
    fn drop(&mut self) {
        if self.set {
            let _ = ENTRY.try_with(|e| e.set((0, 0, 0)));
        }
    }
}

/// The calling thread's stack: lowest and one-past-highest address.
fn stack_bounds() -> Option<(u64, u64)> {
    let b = BOUNDS.try_with(|b| b.get()).unwrap_or((0, 0));
    if b.1 != 0 {
        return Some(b);
    }
    // SAFETY: pthread_attr_t is an opaque C struct of bytes, for which all-zero is a valid
    // value; pthread_getattr_np initialises it before any other use.
    let mut attr: libc::pthread_attr_t = unsafe { std::mem::zeroed() };
    // SAFETY: the calling thread's own id, and a live attr for it to initialise (on
    // failure nothing else is done with it).
    if unsafe { libc::pthread_getattr_np(libc::pthread_self(), &mut attr) } != 0 {
        return None;
    }
    let mut addr: *mut libc::c_void = std::ptr::null_mut();
    let mut size = 0usize;
    // SAFETY: `attr` was initialised by pthread_getattr_np above; `addr` and `size` are
    // live locals for it to write.
    let rc = unsafe { libc::pthread_attr_getstack(&attr, &mut addr, &mut size) };
    // SAFETY: destroys the attr pthread_getattr_np initialised (it may hold an allocated
    // cpuset), once; it is not used afterwards.
    unsafe { libc::pthread_attr_destroy(&mut attr) };
    if rc != 0 || size == 0 {
        return None;
    }
    let b = (addr as u64, addr as u64 + size as u64);
    let _ = BOUNDS.try_with(|c| c.set(b));
    Some(b)
}

/// The calling thread's stack left below the caller (bytes), when its bounds are known. The
/// bounds are read once per thread (`pthread_getattr_np`; for the main thread glibc reads
/// `/proc/self/maps` then, on a stack that is never small).
#[inline(always)]
pub fn stack_room() -> Option<u64> {
    let (_, sp, _) = registers();
    let (lo, _) = stack_bounds()?;
    Some(sp.saturating_sub(lo))
}

/// Hands `visit` the return addresses of the calling thread, innermost first, leaving out the
/// frames of this library that lead up to here, until `visit` says no to one. Returns whether
/// it did (the stack went on past what `visit` took).
#[inline(never)]
pub fn unwind(snap: &Snapshot, visit: &mut dyn FnMut(u64) -> bool) -> bool {
    let (ip, sp, bp) = registers();
    let Some((_, hi)) = stack_bounds() else {
        return false;
    };
    // From the hook's entry where one is marked (its frame is an outer one of this walk's:
    // a higher stack address, still live); else from here.
    let (ip, sp, bp) = match ENTRY.try_with(|e| e.get()).unwrap_or((0, 0, 0)) {
        (eip, esp, ebp) if esp > sp && esp < hi => (eip, esp, ebp),
        _ => (ip, sp, bp),
    };
    let lo = sp;
    let mut read = |addr: u64| -> Result<u64, ()> {
        if addr >= lo && addr.checked_add(8).is_some_and(|e| e <= hi) && addr.is_multiple_of(8) {
            // SAFETY: the address was just checked to be 8-aligned and within [sp, hi): the calling
            // thread's own stack from this frame's stack pointer up to its top (pthread's bounds),
            // which is mapped and not freed while this function runs. Words above sp belong to live
            // frames of callers of this one; they are read, never written.
            Ok(unsafe { *(addr as *const u64) })
        } else {
            Err(())
        }
    };
    let mut walk = |cache: &mut CacheX86_64, read: &mut dyn FnMut(u64) -> Result<u64, ()>| {
        let mut read = |a: u64| read(a);
        let regs = UnwindRegsX86_64::new(ip, sp, bp);
        let mut it = snap.unwinder.iter_frames(ip, regs, cache, &mut read);
        let mut leading = true;
        // The first frame is this function's own instruction pointer.
        while let Ok(Some(f)) = it.next() {
            let FrameAddress::ReturnAddress(ra) = f else {
                continue;
            };
            let ra = ra.get();
            if leading && snap.is_own(ra) {
                continue;
            }
            leading = false;
            if !visit(ra) {
                return true;
            }
        }
        false
    };
    let from_cache = CACHE.try_with(|c| {
        let Ok(mut c) = c.try_borrow_mut() else {
            return None;
        };
        let cache = c.get_or_insert_with(|| Box::new(CacheX86_64::new()));
        let r = walk(cache, &mut read);
        let st = cache.stats();
        let (hits, misses) = (st.hits(), st.misses());
        let (h0, m0) = SEEN
            .try_with(|s| s.replace((hits, misses)))
            .unwrap_or((hits, misses));
        HITS.fetch_add(hits.saturating_sub(h0), Relaxed);
        MISSES.fetch_add(misses.saturating_sub(m0), Relaxed);
        Some(r)
    });
    match from_cache {
        Ok(Some(r)) => r,
        // Thread teardown (the cache is gone) or re-entered: a cache of its own this once.
        _ => walk(&mut CacheX86_64::new(), &mut read),
    }
}
