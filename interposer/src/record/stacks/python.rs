//! Python frames of the calling thread, read straight from CPython's own structures, for
//! CPython 3.10 – 3.13, whether or not the thread holds the GIL: the GIL is never taken (a
//! thread that released it to call into CUDA may be waited on by the one that holds it) and no
//! Python API that allocates or needs the GIL is called.
//!
//! - The thread's state: `PyGILState_GetThisThreadState()` (a thread-local read, no GIL).
//! - Its innermost frame: 3.10 `PyThreadState.frame` (a `PyFrameObject`); 3.11
//!   `cframe->current_frame`, 3.12 `cframe->current_frame` (`_PyInterpreterFrame`); 3.13
//!   `current_frame`, with every offset taken from `_Py_DebugOffsets` at the start of
//!   `_PyRuntime` (the table CPython keeps for out-of-process debuggers).
//! - Each frame's code object and instruction (3.10 `f_lasti`; 3.11/3.12 `prev_instr`; 3.13
//!   `instr_ptr`), and which activation of `_PyEval_EvalFrameDefault` runs it: 3.10 one frame
//!   per activation; 3.11 the frame with `is_entry` set is the outermost of its activation;
//!   3.12/3.13 each activation starts with a shim frame owned by the C stack
//!   (`FRAME_OWNED_BY_CSTACK`), which is not a Python frame and is left out.
//! - The line: `PyCode_Addr2Line(code, byte offset)`, a pure function of the code object's
//!   line table (called only for a stack not seen before). Strings (`co_filename`,
//!   `co_qualname` / `co_name`) read from the `PyUnicode` object's data (compact strings of any
//!   kind; layout per version), never through `PyUnicode_AsUTF8`.
//!
//! Fail-safe: the first walk of the process reads every word with `process_vm_readv` on our own
//! pid (a bad address is an error, not a fault) and checks that each code object's type is
//! `PyCode_Type`; later walks read directly and still check the type of each code object they
//! describe (a frame taken from the thread's last walk, [`Memo`], was checked when described). Any
//! mismatch turns Python frames off for the process, with one line on stderr. A process without
//! Python pays nothing; an unsupported version is said once and gets native frames only.
//!
//! Offsets were checked against the CPython sources and measured on 3.10.13, 3.11.7, 3.12.1 and
//! 3.13.0 builds (`tests/tests/stacks.rs` runs every one it finds).
//!
//! Layer: recording. Uses the base.

mod quick;
use crate::base::resolve::dlsym_in;
use crate::base::sys::warn;
pub use quick::{Quick, quick};
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicPtr, AtomicU8, AtomicU64, Ordering::*};

/// One Python frame as read: enough to tell it apart and, later, to describe it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Raw {
    pub code: u64,
    pub file: u64,
    pub name: u64,
    pub first_line: i32,
    /// Byte offset of the instruction in the code, -1 before the first.
    pub offset: i32,
    /// Which activation of the evaluation loop runs it, 0 = the innermost.
    pub act: u32,
    /// The frame's word in its stack's hash: `code`, `file`, `name`, `first_line` and
    /// `offset` mixed ([`Raw::digest`]), made once when the frame is described.
    pub dig: u64,
}

impl Raw {
    /// A frame as described, with its [`Raw::dig`].
    pub fn new(code: u64, file: u64, name: u64, first_line: i32, offset: i32, act: u32) -> Raw {
        let mut r = Raw {
            code,
            file,
            name,
            first_line,
            offset,
            act,
            dig: 0,
        };
        r.dig = r.digest();
        r
    }

    /// The identity fields mixed into one word (fixed keys: the same on every thread).
    pub fn digest(&self) -> u64 {
        const K: u64 = 0x9e37_79b9_7f4a_7c15;
        const M: u64 = 0xff51_afd7_ed55_8ccd;
        let mut h = (self.code ^ 0x5059_0000_0000_0000).wrapping_mul(K);
        for w in [
            self.file,
            self.name,
            ((self.first_line as u32 as u64) << 32) | self.offset as u32 as u64,
        ] {
            h = (h.rotate_left(27) ^ w).wrapping_mul(M);
        }
        h ^ (h >> 33)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Layout {
    minor: u8,
    /// 3.10: `frame`; 3.11/3.12: `cframe`; 3.13: `current_frame`.
    ts_frame: u64,
    /// 3.11/3.12: `current_frame` inside the `_PyCFrame`.
    cframe_current: Option<u64>,
    prev: u64,
    code: u64,
    /// 3.10: `f_lasti` (an int, in code units); later: the instruction pointer.
    instr: u64,
    owner: Option<u64>,
    is_entry: Option<u64>,
    co_file: u64,
    co_name: u64,
    co_first: u64,
    co_code: u64,
    /// Size of `PyASCIIObject` and `PyCompactUnicodeObject`.
    str_ascii: u64,
    str_compact: u64,
}

/// CPython 3.11's frame and code object (`_PyInterpreterFrame`, `PyCodeObject`).
const L311: Layout = Layout {
    minor: 11,
    ts_frame: 56,
    cframe_current: Some(8),
    prev: 48,
    code: 32,
    instr: 56,
    owner: None,
    is_entry: Some(68),
    co_file: 112,
    co_name: 128,
    co_first: 72,
    co_code: 184,
    str_ascii: 48,
    str_compact: 72,
};

/// CPython 3.12's.
const L312: Layout = Layout {
    minor: 12,
    ts_frame: 56,
    cframe_current: Some(0),
    prev: 8,
    code: 0,
    instr: 56,
    owner: Some(70),
    is_entry: None,
    co_file: 112,
    co_name: 128,
    co_first: 68,
    co_code: 192,
    str_ascii: 40,
    str_compact: 56,
};

const FRAME_OWNED_BY_CSTACK: u8 = 3;

struct Py {
    layout: Layout,
    /// Which of the layouts known when the library is built `layout` is ([`L311`]: 11,
    /// [`L312`]: 12, else 0): the quick key's loop for it, chosen once.
    fixed: u8,
    this_ts: unsafe extern "C" fn() -> *mut c_void,
    addr2line: unsafe extern "C" fn(*mut c_void, c_int) -> c_int,
    code_type: u64,
    str_type: u64,
    /// `_PyEval_EvalFrameDefault`'s address range.
    eval: (u64, u64),
}

const UNKNOWN: u8 = 0;
/// No Python in the process (looked again when objects are loaded).
const ABSENT: u8 = 1;
/// Found, first walk not yet checked.
const CHECKING: u8 = 2;
const ON: u8 = 3;
/// Unsupported or failed a check: never again.
const OFF: u8 = 4;

static STATE: AtomicU8 = AtomicU8::new(UNKNOWN);
static PY: AtomicPtr<Py> = AtomicPtr::new(std::ptr::null_mut());
/// The loader generation at which Python was last looked for.
static LOOKED_AT: AtomicU64 = AtomicU64::new(u64::MAX);

fn get(generation: u64) -> Option<&'static Py> {
    let s = STATE.load(Acquire);
    match s {
        // SAFETY: STATE becomes CHECKING or ON only after PY holds a Box (the compare_exchange
        // below, AcqRel, before the state's), and PY is never freed or changed once set, so it is
        // non-null, initialised and lives for 'static.
        CHECKING | ON => return Some(unsafe { &*PY.load(Acquire) }),
        OFF => return None,
        ABSENT if LOOKED_AT.load(Relaxed) == generation => return None,
        _ => {}
    }
    LOOKED_AT.store(generation, Relaxed);
    match find() {
        Found::Absent => {
            let _ = STATE.compare_exchange(s, ABSENT, AcqRel, Relaxed);
            None
        }
        Found::Unsupported(why) => {
            if STATE.swap(OFF, AcqRel) != OFF {
                warn(&why);
            }
            None
        }
        Found::Yes(py) => {
            let p = Box::into_raw(Box::new(py));
            match PY.compare_exchange(std::ptr::null_mut(), p, AcqRel, Acquire) {
                Ok(_) => {}
                // SAFETY: `p` came from Box::into_raw just above and was not published (the
                // compare_exchange failed), so this is its only owner.
                Err(_) => drop(unsafe { Box::from_raw(p) }),
            }
            let _ = STATE.compare_exchange(s, CHECKING, AcqRel, Relaxed);
            let s = STATE.load(Acquire);
            // SAFETY: as at the top of `get`: PY was set (by us or the winner) before this
            // state, and is never freed.
            (s == CHECKING || s == ON).then(|| unsafe { &*PY.load(Acquire) })
        }
    }
}

enum Found {
    Absent,
    Unsupported(String),
    Yes(Py),
}

fn sym(name: &std::ffi::CStr) -> u64 {
    dlsym_in(libc::RTLD_DEFAULT, name) as u64
}

fn find() -> Found {
    let ts = sym(c"PyGILState_GetThisThreadState");
    if ts == 0 {
        return Found::Absent;
    }
    let (a2l, code_type, str_type, eval) = (
        sym(c"PyCode_Addr2Line"),
        sym(c"PyCode_Type"),
        sym(c"PyUnicode_Type"),
        sym(c"_PyEval_EvalFrameDefault"),
    );
    if a2l == 0 || code_type == 0 || str_type == 0 {
        return Found::Unsupported(
            "Python is loaded but lacks PyCode_Addr2Line/PyCode_Type: stacks are native only"
                .into(),
        );
    }
    let (major, minor) = version();
    let layout = match (major, minor) {
        (3, 10) => Layout {
            minor: 10,
            ts_frame: 24,
            cframe_current: None,
            prev: 24,
            code: 32,
            instr: 96,
            owner: None,
            is_entry: None,
            co_file: 104,
            co_name: 112,
            co_first: 40,
            co_code: 0,
            str_ascii: 48,
            str_compact: 72,
        },
        (3, 11) => L311,
        (3, 12) => L312,
        (3, 13) => match debug_offsets() {
            Some(l) => l,
            None => {
                return Found::Unsupported(
                    "Python 3.13's _Py_DebugOffsets not as expected: Python frames off, stacks \
                     are native only"
                        .into(),
                );
            }
        },
        _ => {
            return Found::Unsupported(format!(
                "Python {major}.{minor}: Python frames are read for 3.10 to 3.13 only; stacks \
                 are native only"
            ));
        }
    };
    Found::Yes(Py {
        fixed: if layout == L311 {
            11
        } else if layout == L312 {
            12
        } else {
            0
        },
        layout,
        // SAFETY: `ts` is the non-zero address dlsym gave for PyGILState_GetThisThreadState,
        // exported by every CPython 3.10 to 3.13 (the versions that reach here) as the C function
        // `PyThreadState *(void)`; a u64 and a function pointer have the same size.
        this_ts: unsafe { std::mem::transmute::<u64, unsafe extern "C" fn() -> *mut c_void>(ts) },
        // SAFETY: `a2l` (checked non-zero in `find`) is dlsym's address for PyCode_Addr2Line,
        // exported as `int (PyCodeObject *, int)` by the same versions.
        addr2line: unsafe {
            std::mem::transmute::<u64, unsafe extern "C" fn(*mut c_void, c_int) -> c_int>(a2l)
        },
        code_type,
        str_type,
        eval: symbol_range(eval),
    })
}

/// (major, minor): `Py_Version` (3.11+) or `Py_GetVersion()`'s leading "3.10".
fn version() -> (u32, u32) {
    let v = sym(c"Py_Version");
    if v != 0 {
        // SAFETY: `v` is the non-zero address dlsym gave for Py_Version, a `const unsigned long`
        // in the loaded libpython (read as its low 32 bits: x86-64 is little-endian), aligned and
        // mapped while Python is loaded.
        let hex = unsafe { *(v as *const u32) };
        return (hex >> 24, (hex >> 16) & 0xff);
    }
    let f = sym(c"Py_GetVersion");
    if f == 0 {
        return (0, 0);
    }
    // SAFETY: `f` is the non-zero address dlsym gave for Py_GetVersion, a C function
    // `const char *(void)`.
    let f = unsafe { std::mem::transmute::<u64, unsafe extern "C" fn() -> *const i8>(f) };
    // SAFETY: Py_GetVersion takes nothing, needs no GIL, and returns a pointer to a
    // static NUL-terminated string.
    let s = unsafe { std::ffi::CStr::from_ptr(f()) }.to_string_lossy();
    let mut it = s.split(|c: char| !c.is_ascii_digit());
    let major = it.next().and_then(|x| x.parse().ok()).unwrap_or(0);
    let minor = it.next().and_then(|x| x.parse().ok()).unwrap_or(0);
    (major, minor)
}

/// 3.13: the offsets from `_Py_DebugOffsets` (`_PyRuntime` starts with it), as 3.13.0 lays the
/// table out: cookie, version, free_threaded, then groups of u64 offsets, each group led by
/// its struct's size.
fn debug_offsets() -> Option<Layout> {
    let rt = sym(c"_PyRuntime");
    if rt == 0 {
        return None;
    }
    // SAFETY: `rt` is the address of the exported _PyRuntime, which in 3.13 starts with
    // _Py_DebugOffsets: u64 words, far more than the 44 read here (i < 44), aligned and mapped
    // while Python is loaded. The cookie is checked before any word but 0 is trusted.
    let w = |i: u64| unsafe { *((rt + 8 * i) as *const u64) };
    // SAFETY: the first 8 bytes of _PyRuntime, mapped as above.
    let cookie = unsafe { std::slice::from_raw_parts(rt as *const u8, 8) };
    if cookie != b"xdebugpy" || (w(1) >> 16) != 0x030d || w(2) != 0 {
        return None;
    }
    // Groups: runtime_state 3..6, interpreter_state 6..19, thread_state 19..28,
    // interpreter_frame 28..34, code_object 34..44.
    let (ts_size, frame_size, code_size) = (w(19), w(28), w(34));
    let l = Layout {
        minor: 13,
        ts_frame: w(23),
        cframe_current: None,
        prev: w(29),
        code: w(30),
        instr: w(31),
        owner: Some(w(33)),
        is_entry: None,
        co_file: w(35),
        co_name: w(37),
        co_first: w(39),
        co_code: w(43),
        str_ascii: 40,
        str_compact: 56,
    };
    let fits = |off: u64, size: u64, width: u64| off + width <= size && size < 1 << 20;
    (fits(l.ts_frame, ts_size, 8)
        && fits(l.prev, frame_size, 8)
        && fits(l.code, frame_size, 8)
        && fits(l.instr, frame_size, 8)
        && fits(w(33), frame_size, 1)
        && fits(l.co_file, code_size, 8)
        && fits(l.co_name, code_size, 8)
        && fits(l.co_first, code_size, 4)
        && l.co_code <= code_size)
        .then_some(l)
}

/// The address range of the function at `addr` (its symbol's size), `(0, 0)` when unknown.
fn symbol_range(addr: u64) -> (u64, u64) {
    unsafe extern "C" {
        fn dladdr1(
            addr: *const c_void,
            info: *mut libc::Dl_info,
            extra: *mut *mut c_void,
            flags: c_int,
        ) -> c_int;
    }
    const RTLD_DL_SYMENT: c_int = 1;
    if addr == 0 {
        return (0, 0);
    }
    // SAFETY: Dl_info is a C struct of pointers, for which all-zero (null) is a valid value.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    let mut sym: *mut c_void = std::ptr::null_mut();
    // SAFETY: glibc's dladdr1, declared as glibc does; it only compares `addr`
    // with the loaded objects and writes `info` and, with RTLD_DL_SYMENT, one pointer into `sym`,
    // both live locals.
    if unsafe { dladdr1(addr as *const c_void, &mut info, &mut sym, RTLD_DL_SYMENT) } == 0
        || sym.is_null()
    {
        return (0, 0);
    }
    // SAFETY: checked non-null: with RTLD_DL_SYMENT glibc points `sym` at the symbol's
    // Elf64_Sym in the object's mapped dynamic symbol table, valid while it is loaded; only
    // `st_size` is copied out.
    let sym = unsafe { &*(sym as *const libc::Elf64_Sym) };
    (addr, addr + sym.st_size.max(1))
}

/// Reads one word; `None` where it cannot be read.
trait Mem {
    fn word(&self, addr: u64) -> Option<u64>;
    fn u32_at(&self, addr: u64) -> Option<u32> {
        let w = self.word(addr & !7)?;
        let shift = (addr & 7) * 8;
        (shift <= 32).then(|| (w >> shift) as u32)
    }
    fn u8_at(&self, addr: u64) -> Option<u8> {
        let w = self.word(addr & !7)?;
        Some((w >> ((addr & 7) * 8)) as u8)
    }
}

/// Direct reads: after the first walk was checked.
struct Direct;
impl Mem for Direct {
    #[inline]
    fn word(&self, addr: u64) -> Option<u64> {
        if addr < 4096 || !addr.is_multiple_of(8) {
            return None;
        }
        // SAFETY: used only once STATE is ON, after a first walk read the same kinds of addresses
        // through `Checked` (which fails on unmapped memory instead of faulting) and checked the
        // layout. The addresses come from the calling thread's own live Python frame chain (its
        // thread state, frames, code objects and their strings), which cannot change or be freed
        // while this thread is inside the call being recorded; aligned (checked) and above the null
        // page. This is a trust in CPython's layout, checked once, not a proof per read.
        Some(unsafe { *(addr as *const u64) })
    }
}

/// Reads through `process_vm_readv` on our own pid: an unmapped address is an error.
struct Checked;
impl Mem for Checked {
    fn word(&self, addr: u64) -> Option<u64> {
        if addr < 4096 || !addr.is_multiple_of(8) {
            return None;
        }
        let mut v = 0u64;
        let local = libc::iovec {
            iov_base: (&mut v as *mut u64).cast(),
            iov_len: 8,
        };
        let remote = libc::iovec {
            iov_base: addr as *mut c_void,
            iov_len: 8,
        };
        // SAFETY: `local` describes `v`, a live u64 (8 bytes), as the only destination; `remote` is
        // only read by the kernel, which answers an error (EFAULT) rather than faulting for an
        // address that is not mapped, so any value of `addr` is sound here.
        let n = unsafe { libc::process_vm_readv(libc::getpid(), &local, 1, &remote, 1, 0) };
        (n == 8).then_some(v)
    }
}

/// What a walk gives: the frames, and whether there were more.
pub struct Walk {
    pub n: usize,
    pub truncated: bool,
}

/// `_PyEval_EvalFrameDefault`'s range, where Python is there.
pub fn eval_range(generation: u64) -> Option<(u64, u64)> {
    get(generation).map(|p| p.eval).filter(|r| r.1 > r.0)
}

/// Calls `with` with the calling thread's Python frames, innermost first (at most `depth`),
/// and whether there were more. None (an empty list) when the thread runs no Python, Python
/// frames are off, or a capture on this thread is already inside this function (a signal
/// handler's capture that interrupted one: it gets native frames only). The frames are the
/// thread's [`Memo`], lent for the call: no copy, and no buffer on the caller's stack.
pub fn with_frames<R>(generation: u64, depth: usize, with: impl FnOnce(&[Raw], bool) -> R) -> R {
    let Some(py) = get(generation) else {
        return with(&[], false);
    };
    let mut with = Some(with);
    let lent = MEMO.try_with(|c| {
        let mut c = c.try_borrow_mut().ok()?;
        let memo = c.get_or_insert_with(Memo::new);
        let cap = depth.min(memo.raw.len());
        let r = if STATE.load(Acquire) == ON {
            walk_known(py, memo, cap)
        } else {
            // The process's first walk: every read checked (see `Checked`); the memo keeps
            // nothing of it.
            memo.n = 0;
            let r = walk(py, &Checked, &mut memo.raw[..cap]);
            if matches!(r, Ok(ref w) if w.n > 0) {
                let _ = STATE.compare_exchange(CHECKING, ON, AcqRel, Relaxed);
            }
            r
        };
        let w = r.unwrap_or_else(|why| {
            turn_off(&why);
            memo.n = 0;
            Walk {
                n: 0,
                truncated: false,
            }
        });
        let f = with.take()?;
        Some(f(&memo.raw[..w.n], w.truncated))
    });
    match (lent, with) {
        (Ok(Some(r)), _) => r,
        // Lent already, or the thread's memo is gone (its teardown): no Python frames.
        (_, Some(f)) => f(&[], false),
        (_, None) => unreachable!("the frames' user is called once"),
    }
}

fn turn_off(why: &str) {
    if STATE.swap(OFF, AcqRel) != OFF {
        warn(&format!(
            "Python frames turned off for this process ({why}); stacks are native only"
        ));
    }
}

fn bad(what: &str, at: u64) -> String {
    format!("unreadable {what} at 0x{at:x}")
}

/// The calling thread's innermost frame, 0 when it runs no Python.
fn innermost(py: &Py, m: &impl Mem) -> Result<u64, String> {
    let l = &py.layout;
    // SAFETY: PyGILState_GetThisThreadState (see `find`) takes nothing, needs no GIL and
    // only reads this thread's thread-local state; null when this thread has none.
    let ts = unsafe { (py.this_ts)() } as u64;
    if ts == 0 {
        return Ok(0);
    }
    let at = m
        .word(ts + l.ts_frame)
        .ok_or_else(|| bad("thread state", ts))?;
    match l.cframe_current {
        Some(cur) if at != 0 => m.word(at + cur).ok_or_else(|| bad("C frame", at)),
        _ => Ok(at),
    }
}

/// The frame `k` described: its code object checked and read.
fn describe_key(py: &Py, m: &impl Mem, k: Key, act: u32) -> Result<Raw, String> {
    let l = &py.layout;
    let code = k.code;
    if m.word(code + 8) != Some(py.code_type) {
        return Err(format!(
            "frame 0x{:x}: 0x{code:x} is not a code object",
            k.frame
        ));
    }
    let offset = if l.minor == 10 {
        let lasti = k.instr as u32 as i32;
        if lasti < 0 {
            -1
        } else {
            lasti.saturating_mul(2)
        }
    } else {
        let start = code + l.co_code;
        if k.instr < start || k.instr - start > i32::MAX as u64 {
            -1
        } else {
            (k.instr - start) as i32
        }
    };
    Ok(Raw::new(
        code,
        m.word(code + l.co_file).ok_or_else(|| bad("code", code))?,
        m.word(code + l.co_name).ok_or_else(|| bad("code", code))?,
        m.u32_at(code + l.co_first)
            .ok_or_else(|| bad("code", code))? as i32,
        offset,
        act,
    ))
}

/// The calling thread's Python frames into `out`, each read and described through `m`: the
/// process's first walk (every read checked) and a thread without its memo.
fn walk(py: &Py, m: &impl Mem, out: &mut [Raw]) -> Result<Walk, String> {
    let l = &py.layout;
    let mut f = innermost(py, m)?;
    let (mut n, mut act, mut steps) = (0usize, 0u32, 0u32);
    while f != 0 {
        steps += 1;
        if steps > 100_000 {
            return Err("a frame chain that does not end".into());
        }
        let prev = m.word(f + l.prev).ok_or_else(|| bad("frame", f))?;
        if let Some(o) = l.owner
            && m.u8_at(f + o).ok_or_else(|| bad("frame", f))? == FRAME_OWNED_BY_CSTACK
        {
            act += 1;
            f = prev;
            continue;
        }
        if n == out.len() {
            return Ok(Walk { n, truncated: true });
        }
        let code = m.word(f + l.code).ok_or_else(|| bad("frame", f))?;
        let instr = if l.minor == 10 {
            m.u32_at(f + l.instr).ok_or_else(|| bad("frame", f))? as u64
        } else {
            m.word(f + l.instr).ok_or_else(|| bad("frame", f))?
        };
        out[n] = describe_key(
            py,
            m,
            Key {
                frame: f,
                code,
                instr,
            },
            act,
        )?;
        n += 1;
        let entry = match l.is_entry {
            Some(o) => m.u8_at(f + o).ok_or_else(|| bad("frame", f))? != 0,
            None => l.minor == 10,
        };
        act += entry as u32;
        f = prev;
    }
    Ok(Walk {
        n,
        truncated: false,
    })
}

/// A frame's identity: where it is, the code object it runs and its instruction (3.10: its
/// `f_lasti`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Key {
    frame: u64,
    code: u64,
    instr: u64,
}

/// A thread's last walk, innermost first. A frame met again — the same address, code object
/// and instruction, and the code object's file, name and first line the same ([`same_code`])
/// — is taken as it was then: not checked, described and digested again. In a training step
/// the outer frames (the loop, the model's modules) are the same from one allocation to the
/// next and only the innermost few change.
struct Memo {
    n: usize,
    key: Box<[Key]>,
    raw: Box<[Raw]>,
    /// This walk's frames as read, before they are matched with the last walk's (swapped
    /// with `key` after).
    now: Box<[Key]>,
    act: Box<[u32]>,
}

impl Memo {
    fn new() -> Memo {
        // Made on the heap in place (a 24 KiB array would pass through the caller's stack).
        Memo {
            n: 0,
            key: vec![Key::default(); super::MAX_DEPTH].into_boxed_slice(),
            raw: vec![Raw::default(); super::MAX_DEPTH].into_boxed_slice(),
            now: vec![Key::default(); super::MAX_DEPTH].into_boxed_slice(),
            act: vec![0; super::MAX_DEPTH].into_boxed_slice(),
        }
    }
}

std::thread_local! {
    static MEMO: std::cell::RefCell<Option<Memo>> = const { std::cell::RefCell::new(None) };
}

/// Whether the code object at `code` still has the file, name and first line `r` was
/// described with: a code object freed and another made at the same address, run by a new
/// frame at the same address and instruction, is told apart as the interning's key tells it
/// (the type was checked when `r` was described; the frame holds its code object alive).
#[inline(always)]
fn same_code(l: &Layout, code: u64, r: &Raw) -> bool {
    // SAFETY: `code` is the code object of a live frame of the calling thread (read from
    // the frame just now), at the offsets the process's first walk checked, as `Direct`.
    let word = |a: u64| unsafe { *(a as *const u64) };
    let first = (word((code + l.co_first) & !7) >> ((l.co_first & 7) * 8)) as u32 as i32;
    word(code + l.co_file) == r.file && word(code + l.co_name) == r.name && first == r.first_line
}

/// [`walk`] with the thread's last walk at hand ([`Memo`]), for walks after the first was
/// checked (as [`Direct`] reads): each frame is read as far as its identity in one tight
/// loop (its own, not [`walk`]'s: a check a frame instead of a checked `Option` a read, and no
/// code object read before the match; measured with callgrind, the shared loop cost ~50
/// instructions a frame more), matched with the last walk's frames aligned at the outermost, and only the frames
/// not matched are described. The frames are left in `memo.raw[..n]`, matched frames moved
/// in place.
fn walk_known(py: &Py, memo: &mut Memo, cap: usize) -> Result<Walk, String> {
    let m = &Direct;
    let l = &py.layout;
    let mut f = innermost(py, m)?;
    let cap = cap.min(memo.now.len());
    // SAFETY: as for `Direct`: after the process's first walk was checked, the frames of the
    // calling thread's own live chain, each checked aligned and above the null page before
    // its fields (at offsets the layout checked) are read.
    let word = |a: u64| unsafe { *(a as *const u64) };
    // SAFETY: as `word` just above, for the frame's one-byte fields (owner, is_entry).
    let byte = |a: u64| unsafe { *(a as *const u8) };
    let (mut n, mut act, mut steps, mut truncated) = (0usize, 0u32, 0u32, false);
    let (now, acts) = (&mut memo.now[..cap], &mut memo.act[..cap]);
    while f != 0 {
        steps += 1;
        if f < 4096 || !f.is_multiple_of(8) || steps > 100_000 {
            return Err(if steps > 100_000 {
                "a frame chain that does not end".into()
            } else {
                bad("frame", f)
            });
        }
        let prev = word(f + l.prev);
        if let Some(o) = l.owner
            && byte(f + o) == FRAME_OWNED_BY_CSTACK
        {
            act += 1;
            f = prev;
            continue;
        }
        if n == cap {
            truncated = true;
            break;
        }
        let instr = if l.minor == 10 {
            (word((f + l.instr) & !7) >> ((l.instr & 7) * 8)) as u32 as u64
        } else {
            word(f + l.instr)
        };
        now[n] = Key {
            frame: f,
            code: word(f + l.code),
            instr,
        };
        acts[n] = act;
        n += 1;
        let entry = match l.is_entry {
            Some(o) => byte(f + o) != 0,
            None => l.minor == 10,
        };
        act += entry as u32;
        f = prev;
    }
    // The last walk's frame j = i + shift stands where this walk's i does. Moved in place:
    // upwards when j >= i, downwards when j < i, so that no frame is overwritten before it
    // is read. One loop for each direction, over slices, and no copy of a frame that stays
    // where it was (counted with callgrind on `pystep.py` at 40 Python calls deep: one loop
    // over indices choosing the direction a frame cost ~15 instructions a frame more: 135 a
    // frame and capture against 120, docs/performance.md).
    let last = memo.n;
    let Memo {
        key, raw, now, act, ..
    } = memo;
    let (now, act) = (&now[..n], &act[..n]);
    let describe = |k: &Key, a: u32| describe_key(py, m, *k, a);
    let mut matched = || -> Result<(), String> {
        if last >= n {
            // As deep as the last walk or less: frame i against the last walk's i + shift.
            let shift = last - n;
            let raw = &mut raw[..last];
            for (i, ((k, &a), old)) in now.iter().zip(act).zip(&key[shift..last]).enumerate() {
                let j = i + shift;
                if old == k && same_code(l, k.code, &raw[j]) {
                    // The same frame as the last walk's j: only its activation may differ.
                    if shift != 0 {
                        raw[i] = raw[j];
                    }
                    raw[i].act = a;
                } else {
                    raw[i] = describe(k, a)?;
                }
            }
        } else {
            // Deeper: the innermost n - last frames are new; the rest move down, outermost
            // first.
            let shift = n - last;
            let raw = &mut raw[..n];
            for (i, (k, &a)) in now.iter().zip(act).enumerate().rev() {
                raw[i] = match i.checked_sub(shift) {
                    Some(j) if key[j] == *k && same_code(l, k.code, &raw[j]) => {
                        Raw { act: a, ..raw[j] }
                    }
                    _ => describe(k, a)?,
                };
            }
        }
        Ok(())
    };
    if let Err(why) = matched() {
        memo.n = 0;
        return Err(why);
    }
    std::mem::swap(&mut memo.key, &mut memo.now);
    memo.n = n;
    Ok(Walk { n, truncated })
}

/// The line a frame is at (`PyCode_Addr2Line`: pure, no GIL needed).
pub fn line(generation: u64, r: &Raw) -> u32 {
    match get(generation) {
        // SAFETY: PyCode_Addr2Line with a code object taken from one of this thread's
        // live frames in this same capture (mod.rs calls this before the capture returns), so it is
        // alive; the function only reads the code object's line table and needs no GIL.
        Some(py) => unsafe { (py.addr2line)(r.code as *mut c_void, r.offset) }.max(0) as u32,
        None => 0,
    }
}

/// A code object's file and name, read from the string objects.
pub fn describe(generation: u64, r: &Raw) -> (String, String) {
    match get(generation) {
        Some(py) => (string(py, r.file), string(py, r.name)),
        None => (String::new(), String::new()),
    }
}

fn string(py: &Py, obj: u64) -> String {
    let m = &Direct;
    let l = &py.layout;
    if m.word(obj + 8) != Some(py.str_type) {
        return "?".into();
    }
    let (Some(len), Some(state)) = (m.word(obj + 16), m.u32_at(obj + 32)) else {
        return "?".into();
    };
    let kind = (state >> 2) & 7;
    let compact = (state >> 5) & 1 == 1;
    let ascii = (state >> 6) & 1 == 1;
    if !compact || len > 1 << 16 {
        return "?".into();
    }
    let len = len as usize;
    let data = obj + if ascii { l.str_ascii } else { l.str_compact };
    // SAFETY: `data`..`data + len * width` is the character data of a compact unicode
    // object whose type (PyUnicode_Type), length (<= 65536) and kind were read at `obj` just
    // above, from a code object of a live frame of this thread (see `Direct`), so it is inside that
    // object's allocation; `len` elements of the kind's width, aligned as CPython stores them.
    unsafe {
        match kind {
            1 => std::slice::from_raw_parts(data as *const u8, len)
                .iter()
                .map(|&b| b as char)
                .collect(),
            2 => char::decode_utf16(
                std::slice::from_raw_parts(data as *const u16, len)
                    .iter()
                    .copied(),
            )
            .map(|c| c.unwrap_or('?'))
            .collect(),
            4 => std::slice::from_raw_parts(data as *const u32, len)
                .iter()
                .map(|&c| char::from_u32(c).unwrap_or('?'))
                .collect(),
            _ => "?".into(),
        }
    }
}

/// In a fork child nothing changes: Python's structures are the same memory.
pub fn status() -> &'static str {
    match STATE.load(Relaxed) {
        ON | CHECKING => "on",
        OFF => "off",
        _ => "absent",
    }
}
