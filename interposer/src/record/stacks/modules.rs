//! The loaded objects native frames point into: a snapshot of every object the dynamic loader
//! has (`dl_iterate_phdr`), with what the unwinder needs of each (its `.eh_frame_hdr` and
//! `.eh_frame`, read where they are mapped; its executable segment) and what a `Module` record
//! says of it (path, load bias, address range, GNU build id from `PT_NOTE`).
//!
//! A snapshot is immutable and published through one atomic pointer; it is rebuilt when the
//! loader's count of objects added and removed (`dlpi_adds` + `dlpi_subs`: one
//! `dl_iterate_phdr` call that stops at the first object) has changed. That count is read at
//! most every 10 ms (`dl_iterate_phdr` takes the loader's lock, which many threads capturing at
//! once would fight over), and at once when a stack ends in an address no known object holds
//! (code `dlopen`ed since). Old snapshots are leaked (a thread may still be unwinding with one;
//! a process loads objects a bounded number of times).
//!
//! Layer: recording. Uses the base.

use crate::base::sys::ForkLock;
use framehop::x86_64::UnwinderX86_64;
use framehop::{ExplicitModuleSectionInfo, Module, Unwinder};
use std::ffi::{CStr, c_int, c_void};
use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering::*};

/// One loaded object.
pub struct Obj {
    pub path: String,
    /// Load bias (`dlpi_addr`).
    pub bias: u64,
    /// Lowest and one-past-highest address of its `PT_LOAD` segments.
    pub start: u64,
    pub end: u64,
    pub build_id: Vec<u8>,
    /// Which loaded object this is, over the process's life: the same for the same object in
    /// every snapshot (path, range, bias and build id alike), another for an object loaded
    /// where an unloaded one was. The `Module` records are keyed by it.
    pub serial: u64,
}

/// Every loaded object, sorted by start address, and an unwinder that knows them.
pub struct Snapshot {
    pub objs: Vec<Obj>,
    pub unwinder: UnwinderX86_64<&'static [u8]>,
    /// `dlpi_adds + dlpi_subs` when it was taken.
    pub generation: u64,
    /// libisolate.so's own range: its frames are not part of a stack.
    pub own: (u64, u64),
    /// How many times an address range has held another object than before (a library
    /// loaded where an unloaded one was): the same return addresses mean other code in
    /// another epoch, so the stacks are interned per epoch.
    pub epoch: u64,
    /// [`DLOPENS`] when it was taken.
    pub dlopens: u64,
}

impl Snapshot {
    /// The object `addr` lies in.
    pub fn find(&self, addr: u64) -> Option<(usize, &Obj)> {
        let i = self.objs.partition_point(|o| o.start <= addr);
        let i = i.checked_sub(1)?;
        let o = &self.objs[i];
        (addr < o.end).then_some((i, o))
    }

    pub fn is_own(&self, addr: u64) -> bool {
        addr >= self.own.0 && addr < self.own.1
    }
}

/// Every object any snapshot held, by identity (range, bias, path, build id), with its serial;
/// the one that last held an address range stays, the ones it replaced go.
type Seen = Vec<((u64, u64, u64, String, Vec<u8>), u64)>;
static SEEN: ForkLock<Seen> = ForkLock::new(Vec::new());
/// The last serial handed out, and the epoch ([`Snapshot::epoch`]): only ever go up, also
/// across `fork`.
static SERIAL: AtomicU64 = AtomicU64::new(0);
static EPOCH: AtomicU64 = AtomicU64::new(0);

std::thread_local! {
    /// Set when this thread called `dlopen` (before the load): its next capture looks at the
    /// loader's count at once, so that code it just loaded is known (even when loaded where
    /// an unloaded object was, which a stack ending in known code would not reveal).
    static LOADED_HERE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Calls of `dlopen` so far, any thread's (counted before the real one runs).
static DLOPENS: AtomicU64 = AtomicU64::new(0);

/// Called by the `dlopen` hook on the calling thread, before the real `dlopen` runs.
pub fn dlopen_called() {
    DLOPENS.fetch_add(1, Release);
    let _ = LOADED_HERE.try_with(|c| c.set(true));
}

/// For a walk that ended in code no object of `snap` holds: the loader is asked at once
/// where any thread called `dlopen` since `snap` was taken, else at the usual 10 ms. Code no
/// loaded object holds (a JIT's, a trampoline's) ends walks all the time: asking the loader
/// at each (`dl_iterate_phdr` takes its lock) cost every such capture a lock and a walk of the
/// object list.
pub fn after_unknown(snap: &Snapshot) -> Option<&'static Snapshot> {
    current_at(
        DLOPENS.load(Acquire) != snap.dlopens,
        crate::base::sys::coarse_ns(),
    )
}

static CURRENT: AtomicPtr<Snapshot> = AtomicPtr::new(std::ptr::null_mut());
static REFRESH: ForkLock<()> = ForkLock::new(());
/// When the loader's count was last read (`CLOCK_MONOTONIC`, ns).
static CHECKED_AT: AtomicU64 = AtomicU64::new(0);
const CHECK_EVERY_NS: u64 = 10_000_000;

/// The loader's generation now: `dlpi_adds + dlpi_subs` of the first object (0 if unknown).
fn generation_now() -> u64 {
    unsafe extern "C" fn first(
        info: *mut libc::dl_phdr_info,
        size: usize,
        data: *mut c_void,
    ) -> c_int {
        let out = data as *mut u64;
        // dlpi_adds and dlpi_subs follow dlpi_phnum; `size` says whether this glibc has them.
        let need = std::mem::offset_of!(libc::dl_phdr_info, dlpi_subs) + 8;
        if size >= need {
            // SAFETY: `info` is glibc's dl_phdr_info for this callback, valid while it runs, and
            // `size` (checked just above) says it has the dlpi_adds and dlpi_subs fields; `out` is
            // the `&mut g` that generation_now passed, a live u64.
            unsafe { *out = (*info).dlpi_adds.wrapping_add((*info).dlpi_subs) };
        }
        1
    }
    let mut g = 0u64;
    // SAFETY: `first` has the callback's C signature and `data` is `&mut g`, a live u64,
    // which is what `first` casts it back to; the iteration is synchronous.
    unsafe { libc::dl_iterate_phdr(Some(first), (&mut g as *mut u64).cast()) };
    g
}

/// The current snapshot, rebuilt first when objects were loaded or unloaded since it was taken
/// (looked at most every 10 ms, or now when `now` is set). `None` when none could be built.
pub fn current(now: bool) -> Option<&'static Snapshot> {
    current_at(now, crate::base::sys::coarse_ns())
}

/// [`current`] at time `t` ([`crate::base::sys::coarse_ns`]).
fn current_at(now: bool, t: u64) -> Option<&'static Snapshot> {
    let p = CURRENT.load(Acquire);
    let now = now || LOADED_HERE.try_with(|c| c.replace(false)).unwrap_or(false);
    if !p.is_null() && !now && t.saturating_sub(CHECKED_AT.load(Relaxed)) < CHECK_EVERY_NS {
        // SAFETY: a non-null CURRENT is a Box leaked by `current` below (Release, read here with
        // Acquire) and never freed, so it is initialised and lives for 'static.
        return Some(unsafe { &*p });
    }
    CHECKED_AT.store(t, Relaxed);
    // Before the loader's count: a `dlopen` after this is seen by `after_unknown` again.
    let dlopens = DLOPENS.load(Acquire);
    let g = generation_now();
    if !p.is_null() {
        // SAFETY: as above: a leaked, never freed Snapshot.
        let s = unsafe { &*p };
        if s.generation == g {
            return Some(s);
        }
    }
    let _lock = REFRESH.lock();
    let p = CURRENT.load(Acquire);
    if !p.is_null() {
        // SAFETY: as above: a leaked, never freed Snapshot.
        let s = unsafe { &*p };
        if s.generation == g {
            return Some(s);
        }
    }
    let fresh = Box::leak(Box::new(build(g, dlopens)));
    CURRENT.store(fresh, Release);
    Some(fresh)
}

/// In a fork child: the lock may have been held by another thread of the parent.
pub fn after_fork_child() {
    REFRESH.reset_in_child(());
    // The list may have been in the middle of a change: started again, with a new epoch (and
    // new serials) for everything the child captures from its next snapshot on.
    SEEN.reset_in_child(Vec::new());
    EPOCH.fetch_add(1, AcqRel);
}

struct Found {
    path: String,
    bias: u64,
    start: u64,
    end: u64,
    build_id: Vec<u8>,
    text: Option<(u64, u64)>,
    eh_hdr: Option<(u64, u64)>,
    eh_frame: Option<(u64, u64)>,
}

fn build(generation: u64, dlopens: u64) -> Snapshot {
    unsafe extern "C" fn each(
        info: *mut libc::dl_phdr_info,
        _size: usize,
        data: *mut c_void,
    ) -> c_int {
        // SAFETY: `data` is the `&mut found` that `build` passed to dl_iterate_phdr, which calls
        // this synchronously while `found` is alive and not otherwise borrowed.
        let out = unsafe { &mut *(data as *mut Vec<Found>) };
        // SAFETY: glibc's `info` is valid for the duration of the callback, and `read_object`'s
        // precondition is exactly that: an object the loader describes now, whose program headers
        // and mapped segments it reads before returning.
        if let Some(f) = unsafe { read_object(&*info) } {
            out.push(f);
        }
        0
    }
    let mut found: Vec<Found> = Vec::new();
    // SAFETY: `each` has the callback's C signature and `data` is `&mut found`, a live
    // Vec<Found>, which is what `each` casts it back to; the iteration is synchronous.
    unsafe { libc::dl_iterate_phdr(Some(each), (&mut found as *mut Vec<Found>).cast()) };
    found.sort_by_key(|f| f.start);
    // Overlapping ranges cannot be told apart: keep the first.
    found.dedup_by(|b, a| b.start < a.end);
    let here = build as *const () as u64;
    let own = found
        .iter()
        .find(|f| f.start <= here && here < f.end)
        .map_or((0, 0), |f| (f.start, f.end));
    let mut unwinder = UnwinderX86_64::new();
    let mut objs = Vec::with_capacity(found.len());
    let mut known = SEEN.lock();
    for f in found {
        let id = (f.start, f.end, f.bias, f.path.clone(), f.build_id.clone());
        let serial = match known.iter().find(|(k, _)| *k == id) {
            Some((_, serial)) => *serial,
            None => {
                // Another object where one was before: the same addresses are other code now.
                let before = known.len();
                known.retain(|((start, end, ..), _)| !(*start < f.end && f.start < *end));
                if known.len() != before {
                    EPOCH.fetch_add(1, AcqRel);
                }
                let serial = SERIAL.fetch_add(1, AcqRel) + 1;
                known.push((id, serial));
                serial
            }
        };
        if let (Some(hdr), Some(eh)) = (f.eh_hdr, f.eh_frame) {
            let mem = |(a, b): (u64, u64)| -> &'static [u8] {
                // SAFETY: each range is inside a PT_LOAD segment's file-backed part or the
                // PT_GNU_EH_FRAME segment of an object that dl_iterate_phdr reported (read_object),
                // so it is mapped and readable, and the loader never writes it after relocation
                // (text and .eh_frame are read-only). It is valid for as long as that object stays
                // loaded, not for 'static: a snapshot outlives an object that is dlclose'd after it
                // was built until the next rebuild (the generation is checked every 10 ms, and at
                // once for an address no object holds), and a walk that uses the old snapshot
                // meanwhile could read unmapped memory. Programs rarely unload code they are
                // running; the limit is stated here, not removed.
                unsafe { std::slice::from_raw_parts(a as *const u8, (b - a) as usize) }
            };
            let svma = |(a, b): (u64, u64)| (a - f.bias)..(b - f.bias);
            let info = ExplicitModuleSectionInfo {
                base_svma: 0,
                text_svma: f.text.map(svma),
                text: f.text.map(mem),
                eh_frame_hdr_svma: Some(svma(hdr)),
                eh_frame_hdr: Some(mem(hdr)),
                eh_frame_svma: Some(svma(eh)),
                eh_frame: Some(mem(eh)),
                ..Default::default()
            };
            unwinder.add_module(Module::new(f.path.clone(), f.start..f.end, f.bias, info));
        }
        objs.push(Obj {
            path: f.path,
            bias: f.bias,
            start: f.start,
            end: f.end,
            build_id: f.build_id,
            serial,
        });
    }
    Snapshot {
        objs,
        unwinder,
        generation,
        own,
        epoch: EPOCH.load(Acquire),
        dlopens,
    }
}

/// What the program headers of one loaded object say.
unsafe fn read_object(info: &libc::dl_phdr_info) -> Option<Found> {
    let bias = info.dlpi_addr;
    // SAFETY: the caller's precondition: `info` describes an object loaded now, and
    // glibc's `dlpi_phdr` points to its `dlpi_phnum` program headers, mapped with it.
    let phdrs = unsafe { std::slice::from_raw_parts(info.dlpi_phdr, info.dlpi_phnum as usize) };
    let (mut start, mut end) = (u64::MAX, 0u64);
    let mut text = None;
    let mut eh_hdr = None;
    let mut loads: Vec<(u64, u64)> = Vec::new();
    let mut build_id = Vec::new();
    for ph in phdrs {
        let a = bias.wrapping_add(ph.p_vaddr);
        match ph.p_type {
            libc::PT_LOAD => {
                start = start.min(a);
                end = end.max(a + ph.p_memsz);
                loads.push((a, a + ph.p_filesz.min(ph.p_memsz)));
                if ph.p_flags & libc::PF_X != 0 && text.is_none() {
                    text = Some((a, a + ph.p_filesz.min(ph.p_memsz)));
                }
            }
            libc::PT_GNU_EH_FRAME => eh_hdr = Some((a, a + ph.p_memsz)),
            libc::PT_NOTE if build_id.is_empty() => {
                // SAFETY: the PT_NOTE segment starts at `a` in this loaded object and its first
                // min(p_filesz, p_memsz) bytes are mapped from the file, which is `gnu_build_id`'s
                // precondition.
                build_id = unsafe { gnu_build_id(a, ph.p_filesz.min(ph.p_memsz)) };
            }
            _ => {}
        }
    }
    if start >= end {
        return None;
    }
    // .eh_frame: where .eh_frame_hdr points, to the end of the segment that holds it.
    let eh_frame = eh_hdr.and_then(|(h, he)| {
        // SAFETY: `h`..`he` is the PT_GNU_EH_FRAME segment of this loaded object, mapped with
        // it, which is `eh_frame_ptr`'s precondition.
        let p = unsafe { eh_frame_ptr(h, he)? };
        let (_, seg_end) = loads.iter().find(|(s, e)| *s <= p && p < *e)?;
        Some((p, *seg_end))
    });
    // SAFETY: glibc's `dlpi_name` is a NUL-terminated string (empty for the main
    // program), valid while the object is loaded; it is copied before returning.
    let name = unsafe { CStr::from_ptr(info.dlpi_name) }.to_string_lossy();
    let path = if name.is_empty() {
        std::fs::read_link("/proc/self/exe")
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_default()
    } else {
        name.into_owned()
    };
    Some(Found {
        path,
        bias,
        start,
        end,
        build_id,
        text,
        eh_hdr: eh_frame.and(eh_hdr),
        eh_frame,
    })
}

/// The `.eh_frame` address `.eh_frame_hdr` (at `h`, ending at `end`) names.
unsafe fn eh_frame_ptr(h: u64, end: u64) -> Option<u64> {
    if end < h + 8 {
        return None;
    }
    // SAFETY: the precondition: `h`..`end` is mapped, and `end >= h + 8` was
    // checked above, so these 4 bytes are inside it.
    let b = unsafe { std::slice::from_raw_parts(h as *const u8, 4) };
    if b[0] != 1 {
        return None;
    }
    let enc = b[1];
    let at = h + 4;
    let raw: i64 = match enc & 0x0f {
        // SAFETY: `at` = h + 4 and `end >= h + 8`: 4 bytes inside the mapped segment; unaligned
        // reads are allowed by `read_unaligned`.
        0x03 => i64::from(unsafe { (at as *const u32).read_unaligned() }),
        // SAFETY: as for 0x03: 4 bytes at h + 4, inside the segment.
        0x0b => i64::from(unsafe { (at as *const i32).read_unaligned() }),
        // SAFETY: 8 bytes at h + 4, up to h + 12: inside the segment only when it is that long. A
        // valid .eh_frame_hdr with an 8-byte eh_frame_ptr is (its table follows), and the segment
        // lies inside a mapped PT_LOAD page in practice; `end >= h + 8` alone does not prove it.
        0x04 | 0x0c | 0x00 => unsafe { (at as *const i64).read_unaligned() },
        _ => return None,
    };
    match enc & 0x70 {
        0x00 => Some(raw as u64),
        0x10 => Some(at.wrapping_add(raw as u64)),
        0x30 => Some(h.wrapping_add(raw as u64)),
        _ => None,
    }
}

/// The `NT_GNU_BUILD_ID` note's bytes in the note segment at `a`, `len` bytes.
unsafe fn gnu_build_id(a: u64, len: u64) -> Vec<u8> {
    let mut p = a;
    let end = a + len;
    let align = |x: u64| (x + 3) & !3;
    while p + 12 <= end {
        // SAFETY: the loop condition keeps `p + 12 <= end`, and `a`..`end` is the note
        // segment's mapped part (the precondition): 12 bytes inside it, read unaligned.
        let (namesz, descsz, ty) = unsafe {
            (
                (p as *const u32).read_unaligned() as u64,
                ((p + 4) as *const u32).read_unaligned() as u64,
                ((p + 8) as *const u32).read_unaligned(),
            )
        };
        let name = p + 12;
        let desc = name + align(namesz);
        let next = desc + align(descsz);
        if next > end {
            break;
        }
        if ty == 3
            && namesz == 4
            // SAFETY: `next <= end` was checked above and `name + 4 <= desc <= next` (namesz is 4),
            // so these bytes are inside the segment.
            && unsafe { std::slice::from_raw_parts(name as *const u8, 4) } == b"GNU\0"
        {
            // SAFETY: `desc + descsz <= next <= end`, checked above: inside the segment.
            return unsafe { std::slice::from_raw_parts(desc as *const u8, descsz as usize) }
                .to_vec();
        }
        p = next;
    }
    Vec::new()
}
