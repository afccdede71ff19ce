//! The stale-pointer check at kernel launch: every 8-byte-aligned word of the parameters is
//! looked up in the index of freed ranges held in quarantine. Layouts come from
//! `cuFuncGetParamInfo`, read once per kernel and cached.

use super::isolate;
use crate::cuda::*;
use crate::record;
use crate::resolve::{Lib, Real};
use isolate_trace::{Api, Record, StaleLaunch};
use std::collections::{HashMap, HashSet};
use std::ffi::{CStr, c_void};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

static FUNC_GET_PARAM_INFO: Real<FnFuncGetParamInfo> =
    Real::new(c"cuFuncGetParamInfo", Lib::Driver);
static FUNC_GET_NAME: Real<FnFuncGetName> = Real::new(c"cuFuncGetName", Lib::Driver);

/// A kernel's parameters: (offset, size) of each, and its name.
struct Layout {
    params: Vec<(u32, u32)>,
    name: String,
}

static LAYOUTS: Mutex<Option<HashMap<usize, &'static Layout>>> = Mutex::new(None);
static WARNED: Mutex<Option<HashSet<(usize, u64)>>> = Mutex::new(None);

fn layout(f: CUfunction) -> Option<&'static Layout> {
    let mut g = LAYOUTS.lock().unwrap_or_else(|e| e.into_inner());
    let map = g.get_or_insert_with(HashMap::new);
    if let Some(l) = map.get(&(f as usize)) {
        return Some(*l);
    }
    let info = FUNC_GET_PARAM_INFO.get()?;
    let mut params = Vec::new();
    for i in 0..4096 {
        let (mut off, mut size) = (0usize, 0usize);
        if unsafe { info(f, i, &mut off, &mut size) } != CUDA_SUCCESS {
            break;
        }
        params.push((off as u32, size as u32));
    }
    let mut name = String::from("?");
    if let Some(get) = FUNC_GET_NAME.get() {
        let mut p: *const std::ffi::c_char = std::ptr::null();
        if unsafe { get(&mut p, f) } == CUDA_SUCCESS && !p.is_null() {
            name = unsafe { CStr::from_ptr(p) }
                .to_string_lossy()
                .chars()
                .take(4096)
                .collect();
        }
    }
    // Leaked on purpose: kernels live as long as their module, layouts are small.
    let l: &'static Layout = Box::leak(Box::new(Layout { params, name }));
    map.insert(f as usize, l);
    Some(l)
}

const CU_LAUNCH_PARAM_END: usize = 0;
const CU_LAUNCH_PARAM_BUFFER_POINTER: usize = 1;
const CU_LAUNCH_PARAM_BUFFER_SIZE: usize = 2;

/// Launches checked, and stale pointers found: written as a note at exit, so a clean run shows
/// that its launches were checked at all.
pub static CHECKED: AtomicU64 = AtomicU64::new(0);
pub static HITS: AtomicU64 = AtomicU64::new(0);

/// # Safety
/// `params` and `extra` are a launch's arguments, as the driver reads them.
pub unsafe fn check(api: Api, f: CUfunction, params: *mut *mut c_void, extra: *mut *mut c_void) {
    CHECKED.fetch_add(1, Relaxed);
    if isolate::HIGH.load(Relaxed) == 0 {
        return; // nothing freed yet
    }
    if !params.is_null() {
        let Some(l) = layout(f) else { return };
        for (i, &(_off, size)) in l.params.iter().enumerate() {
            let value = unsafe { *params.add(i) } as *const u8;
            if value.is_null() {
                continue;
            }
            let mut at = 0u32;
            while at + 8 <= size {
                let word =
                    unsafe { std::ptr::read_unaligned(value.add(at as usize) as *const u64) };
                if let Some(e) = isolate::lookup(word) {
                    hit(api, f, l, i as u32, _off + at, word, e);
                }
                at += 8;
            }
        }
    } else if !extra.is_null() {
        // CU_LAUNCH_PARAM_BUFFER_POINTER, buf, CU_LAUNCH_PARAM_BUFFER_SIZE, &size, END
        let (mut buf, mut size) = (std::ptr::null::<u8>(), 0usize);
        let mut i = 0;
        loop {
            let key = unsafe { *extra.add(i) } as usize;
            match key {
                CU_LAUNCH_PARAM_END => break,
                CU_LAUNCH_PARAM_BUFFER_POINTER => buf = unsafe { *extra.add(i + 1) } as *const u8,
                CU_LAUNCH_PARAM_BUFFER_SIZE => {
                    size = unsafe { *(*extra.add(i + 1) as *const usize) }
                }
                _ => {}
            }
            i += 2;
            if i > 64 {
                break;
            }
        }
        if buf.is_null() {
            return;
        }
        let Some(l) = layout(f) else { return };
        let mut at = 0usize;
        while at + 8 <= size {
            let word = unsafe { std::ptr::read_unaligned(buf.add(at) as *const u64) };
            if let Some(e) = isolate::lookup(word) {
                let index = l
                    .params
                    .iter()
                    .rposition(|&(o, _)| o as usize <= at)
                    .unwrap_or(0);
                hit(api, f, l, index as u32, at as u32, word, e);
            }
            at += 8;
        }
    }
}

fn hit(api: Api, f: CUfunction, l: &Layout, index: u32, offset: u32, ptr: u64, e: isolate::Entry) {
    HITS.fetch_add(1, Relaxed);
    let first = {
        let mut g = WARNED.lock().unwrap_or_else(|e| e.into_inner());
        g.get_or_insert_with(HashSet::new)
            .insert((f as usize, e.alloc_seq ^ e.ptr))
    };
    if !first {
        return; // recorded and said once per kernel and allocation
    }
    {
        record::warn(&format!(
            "STALE POINTER: kernel {} got 0x{ptr:x} (parameter {index}, byte {offset}), inside allocation 0x{:x} \
             ({} bytes) freed at event {}",
            l.name, e.ptr, e.size, e.free_seq
        ));
    }
    crate::writer::submit(Record::StaleLaunch(StaleLaunch {
        seq: record::next_seq(),
        ts_ns: record::now_ns(),
        tid: record::gettid(),
        device: record::current_device(),
        api,
        kernel: l.name.clone(),
        param_index: index,
        param_offset: offset,
        ptr,
        alloc_ptr: e.ptr,
        alloc_size: e.size,
        alloc_seq: e.alloc_seq,
        free_seq: e.free_seq,
        free_ts_ns: e.free_ts,
    }));
}

/// The note written at exit with the launch-check counters.
pub fn note_at_exit() {
    let checked = CHECKED.load(Relaxed);
    let kernels = LAYOUTS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .as_ref()
        .map_or(0, |m| m.len());
    crate::writer::note(
        isolate_trace::NoteKind::Info,
        0,
        HITS.load(Relaxed),
        checked,
        format!(
            "launch check: {checked} launches of {kernels} kernels checked, {} stale pointers",
            HITS.load(Relaxed)
        ),
    );
}
