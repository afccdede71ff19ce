//! NVTX: libisolate.so is an NVTX injection library. NVTX v3 (header-only, compiled into
//! PyTorch, NCCL, cuDNN and users' programs) loads the library `NVTX_INJECTION64_PATH` names on
//! its first call (`dlopen`, then `dlsym(…, "InitializeInjectionNvtx2")`) and calls
//! [`InitializeInjectionNvtx2`] with its `nvtxGetExportTable`; from the `NVTX_ETID_CALLBACKS`
//! table's `GetModuleFunctionTable` we take the CORE and CORE2 modules' tables of function-pointer
//! slots and fill the slots we implement. NVTX makes the others no-ops. (ABI: NVIDIA/NVTX
//! c/include/nvtx3/nvtxDetail/nvtxTypes.h, nvtxImpl.h, nvtxInit.h.) `isolate run` sets
//! `NVTX_INJECTION64_PATH` to the library when it is not set, and so does the Python package's
//! start-up hook in a process the library was preloaded into.
//!
//! What becomes what in the trace (the C API's notes, api.rs):
//! - `nvtxRangePush{A,W,Ex}` / `nvtxRangePop`: a region on the calling thread's stack, the one
//!   `isolate_region_push` uses (`ptr` = the thread id), so they nest with `cuda_isolate.region`;
//!   they return the 0-based level NVTX documents (-2, NVTX's "no tool", when not recording).
//! - `nvtxMark{A,W,Ex}`: a mark.
//! - `nvtxRangeStart{A,W,Ex}` / `nvtxRangeEnd`: ranges that need not nest and may end on another
//!   thread. Each is a region of its own, keyed by `ptr` = 2^63 + its range id instead of a
//!   thread id (depth 1); the id is what `nvtxRangeStart` returns (ranges never ended are closed
//!   at the end of the trace).
//! - Domains (`nvtxDomainCreate`, CORE2, as NCCL uses): a domain's pushes and pops are its own
//!   stack per thread (NVTX's rule), keyed by `ptr` = thread id + (domain number << 32); its
//!   regions and marks are named `DOMAIN: message`. `nvtxDomainRegisterString` strings are
//!   kept (once per distinct string) so that registered messages read as text.
//!
//! Payloads, colours and categories are ignored. Nothing here calls CUDA; every callback catches
//! its own panics.
//!
//! Layer: hooks, the top. Uses the C API (api.rs: the shared region stack and marks), recording
//! (notes) and the base (thread id, resolving).

use super::api::{self, safe, text as ascii};
use crate::base::resolve;
use crate::base::sys::{ForkLock, gettid};
use crate::policy;
use crate::record::event;
use isolate_trace::NoteKind;
use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_uint, c_void};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};

/// `NVTX_ETID_CALLBACKS`.
const ETID_CALLBACKS: u32 = 1;
/// `NvtxCallbackModule`: `NVTX_CB_MODULE_CORE`, `NVTX_CB_MODULE_CORE2`.
const MODULE_CORE: c_int = 1;
const MODULE_CORE2: c_int = 5;
/// `NvtxCallbackIdCore`.
const CORE_MARK_EX: usize = 1;
const CORE_MARK_A: usize = 2;
const CORE_MARK_W: usize = 3;
const CORE_RANGE_START_EX: usize = 4;
const CORE_RANGE_START_A: usize = 5;
const CORE_RANGE_START_W: usize = 6;
const CORE_RANGE_END: usize = 7;
const CORE_RANGE_PUSH_EX: usize = 8;
const CORE_RANGE_PUSH_A: usize = 9;
const CORE_RANGE_PUSH_W: usize = 10;
const CORE_RANGE_POP: usize = 11;
/// `NvtxCallbackIdCore2`.
const CORE2_DOMAIN_MARK_EX: usize = 1;
const CORE2_DOMAIN_RANGE_START_EX: usize = 2;
const CORE2_DOMAIN_RANGE_END: usize = 3;
const CORE2_DOMAIN_RANGE_PUSH_EX: usize = 4;
const CORE2_DOMAIN_RANGE_POP: usize = 5;
const CORE2_DOMAIN_REGISTER_STRING_A: usize = 10;
const CORE2_DOMAIN_REGISTER_STRING_W: usize = 11;
const CORE2_DOMAIN_CREATE_A: usize = 12;
const CORE2_DOMAIN_CREATE_W: usize = 13;
const CORE2_DOMAIN_DESTROY: usize = 14;
/// `nvtxMessageType_t`.
const MESSAGE_ASCII: i32 = 1;
const MESSAGE_UNICODE: i32 = 2;
const MESSAGE_REGISTERED: i32 = 3;
/// What NVTX's own no-op push and pop return (`NVTX_NO_PUSH_POP_TRACKING`).
const NO_PUSH_POP_TRACKING: c_int = -2;
/// The `ptr` of a start/end range's notes: this bit and its id.
const RANGE_KEY: u64 = 1 << 63;
/// Start/end ranges open at once that are followed (one never ended is kept until exit).
const OPEN_RANGES_CAP: usize = 65536;
/// Distinct registered strings kept.
const STRINGS_CAP: usize = 65536;

type GetExportTable = unsafe extern "C" fn(u32) -> *const c_void;
type Slot = *mut *const c_void;
type GetModuleFunctionTable =
    unsafe extern "C" fn(module: c_int, out_table: *mut *mut Slot, out_size: *mut c_uint) -> c_int;

/// `NvtxExportTableCallbacks`.
#[repr(C)]
struct Callbacks {
    struct_size: usize,
    get_module_function_table: Option<GetModuleFunctionTable>,
}

/// `nvtxEventAttributes_t` (v2 and v3 share it; 48 bytes).
#[repr(C)]
#[allow(dead_code)] // the layout is NVTX's; only the size and message are read
struct EventAttributes {
    version: u16,
    size: u16,
    category: u32,
    color_type: i32,
    color: u32,
    payload_type: i32,
    reserved0: i32,
    payload: u64,
    message_type: i32,
    message: *const c_void,
}

/// What `nvtxDomainCreate` hands out: its name and number.
struct Domain {
    magic: u64,
    name: String,
    number: u32,
}

const DOMAIN_MAGIC: u64 = 0x6973_6f6c_6174_6564; // "isolated"
static DOMAINS: AtomicU32 = AtomicU32::new(0);
static RANGE_IDS: AtomicU64 = AtomicU64::new(0);
/// Start/end ranges open now: id → name.
static OPEN_RANGES: ForkLock<Option<HashMap<u64, String>>> = ForkLock::new(None);
/// Registered strings: text → its handle (a leaked C string), so each is kept once.
static STRINGS: ForkLock<Option<HashMap<String, usize>>> = ForkLock::new(None);

thread_local! {
    /// This thread's domain stacks: domain number → names, innermost last.
    static DOMAIN_STACKS: RefCell<HashMap<u32, Vec<String>>> = RefCell::new(HashMap::new());
}

/// A `wchar_t` string (UTF-32 on Linux).
fn wide(p: *const i32) -> Option<String> {
    if p.is_null() {
        return None;
    }
    let mut s = String::new();
    for i in 0.. {
        // SAFETY: NVTX's contract: a NUL-terminated wide string.
        let c = unsafe { *p.add(i) };
        if c == 0 || i >= 1 << 20 {
            break;
        }
        s.push(char::from_u32(c as u32).unwrap_or(char::REPLACEMENT_CHARACTER));
    }
    Some(s)
}

/// The message of an event's attributes.
fn message(a: *const EventAttributes) -> String {
    if a.is_null() {
        return String::new();
    }
    // SAFETY: NVTX's contract: attributes of at least `size` bytes; read only what `size` covers.
    let a = unsafe { &*a };
    if (a.size as usize) < std::mem::size_of::<EventAttributes>() {
        return String::new();
    }
    let text = match a.message_type {
        MESSAGE_ASCII => ascii(a.message.cast()),
        MESSAGE_UNICODE => wide(a.message.cast()),
        // Our own handles (domain_register_string): leaked C strings.
        MESSAGE_REGISTERED => ascii(a.message.cast()),
        _ => None,
    };
    text.unwrap_or_default()
}

/// The domain behind a handle: `None` for the default domain (null) or a handle not ours.
fn domain(h: *const c_void) -> Option<&'static Domain> {
    if h.is_null() {
        return None;
    }
    // SAFETY: a non-null domain handle comes from our domain_create (NVTX hands every domain
    // call to the one tool); the magic word guards against anything else.
    let d = unsafe { &*(h as *const Domain) };
    (d.magic == DOMAIN_MAGIC).then_some(d)
}

fn named(d: Option<&Domain>, msg: String) -> String {
    match d {
        Some(d) => format!("{}: {msg}", d.name),
        None => msg,
    }
}

// ---- marks ----

fn mark(text: String) {
    let _ = api::mark(text);
}

unsafe extern "C" fn mark_ex(a: *const EventAttributes) {
    safe((), || mark(message(a)))
}

unsafe extern "C" fn mark_a(m: *const c_char) {
    safe((), || mark(ascii(m).unwrap_or_default()))
}

unsafe extern "C" fn mark_w(m: *const i32) {
    safe((), || mark(wide(m).unwrap_or_default()))
}

unsafe extern "C" fn domain_mark_ex(d: *const c_void, a: *const EventAttributes) {
    safe((), || mark(named(domain(d), message(a))))
}

// ---- push and pop ----

fn push(d: Option<&Domain>, msg: String) -> c_int {
    let Some(d) = d else {
        return match api::region_push(msg) {
            Ok(depth) => depth as c_int - 1,
            Err(_) => NO_PUSH_POP_TRACKING,
        };
    };
    if !api::recording() {
        return NO_PUSH_POP_TRACKING;
    }
    let name = named(Some(d), msg);
    let depth = DOMAIN_STACKS.with(|s| {
        api::push_onto(
            s.borrow_mut().entry(d.number).or_default(),
            domain_key(d),
            name,
        )
    });
    depth as c_int - 1
}

fn pop(d: Option<&Domain>) -> c_int {
    let Some(d) = d else {
        return match api::region_pop() {
            Ok(depth) => depth as c_int - 1,
            Err(e) if e == api::NO_REGION => -1,
            Err(_) => NO_PUSH_POP_TRACKING,
        };
    };
    if !api::recording() {
        return NO_PUSH_POP_TRACKING;
    }
    let popped =
        DOMAIN_STACKS.with(|s| api::pop_from(s.borrow_mut().get_mut(&d.number)?, domain_key(d)));
    popped.map_or(-1, |depth| depth as c_int - 1)
}

fn domain_key(d: &Domain) -> u64 {
    gettid() as u64 | (u64::from(d.number) << 32)
}

unsafe extern "C" fn range_push_ex(a: *const EventAttributes) -> c_int {
    safe(NO_PUSH_POP_TRACKING, || push(None, message(a)))
}

unsafe extern "C" fn range_push_a(m: *const c_char) -> c_int {
    safe(NO_PUSH_POP_TRACKING, || {
        push(None, ascii(m).unwrap_or_default())
    })
}

unsafe extern "C" fn range_push_w(m: *const i32) -> c_int {
    safe(NO_PUSH_POP_TRACKING, || {
        push(None, wide(m).unwrap_or_default())
    })
}

unsafe extern "C" fn range_pop() -> c_int {
    safe(NO_PUSH_POP_TRACKING, || pop(None))
}

unsafe extern "C" fn domain_range_push_ex(d: *const c_void, a: *const EventAttributes) -> c_int {
    safe(NO_PUSH_POP_TRACKING, || push(domain(d), message(a)))
}

unsafe extern "C" fn domain_range_pop(d: *const c_void) -> c_int {
    safe(NO_PUSH_POP_TRACKING, || pop(domain(d)))
}

// ---- start and end ----

/// Starts a range that need not nest: its id (0, NVTX's "no tool" value, when not recording).
fn start(name: String) -> u64 {
    if !api::recording() {
        return 0;
    }
    let id = RANGE_IDS.fetch_add(1, Relaxed) + 1;
    {
        let mut open = OPEN_RANGES.lock();
        let open = open.get_or_insert_with(HashMap::new);
        if open.len() >= OPEN_RANGES_CAP {
            return id;
        }
        open.insert(id, name.clone());
    }
    event::note(NoteKind::RegionPush, RANGE_KEY | id, 0, 1, name);
    id
}

fn end(id: u64) {
    let name = OPEN_RANGES.lock().as_mut().and_then(|o| o.remove(&id));
    if let Some(name) = name
        && api::recording()
    {
        event::note(NoteKind::RegionPop, RANGE_KEY | id, 0, 1, name);
    }
}

unsafe extern "C" fn range_start_ex(a: *const EventAttributes) -> u64 {
    safe(0, || start(message(a)))
}

unsafe extern "C" fn range_start_a(m: *const c_char) -> u64 {
    safe(0, || start(ascii(m).unwrap_or_default()))
}

unsafe extern "C" fn range_start_w(m: *const i32) -> u64 {
    safe(0, || start(wide(m).unwrap_or_default()))
}

unsafe extern "C" fn range_end(id: u64) {
    safe((), || end(id))
}

unsafe extern "C" fn domain_range_start_ex(d: *const c_void, a: *const EventAttributes) -> u64 {
    safe(0, || start(named(domain(d), message(a))))
}

unsafe extern "C" fn domain_range_end(_d: *const c_void, id: u64) {
    safe((), || end(id))
}

// ---- domains and registered strings ----

fn domain_create(name: Option<String>) -> *const c_void {
    let number = DOMAINS.fetch_add(1, Relaxed) + 1;
    let d = Box::new(Domain {
        magic: DOMAIN_MAGIC,
        name: name.unwrap_or_default(),
        number,
    });
    // Kept for the life of the process: NVTX may use a handle after its destroy.
    Box::into_raw(d) as *const c_void
}

unsafe extern "C" fn domain_create_a(name: *const c_char) -> *const c_void {
    safe(std::ptr::null(), || domain_create(ascii(name)))
}

unsafe extern "C" fn domain_create_w(name: *const i32) -> *const c_void {
    safe(std::ptr::null(), || domain_create(wide(name)))
}

unsafe extern "C" fn domain_destroy(_d: *const c_void) {}

fn register_string(s: Option<String>) -> *const c_void {
    let Some(s) = s else {
        return std::ptr::null();
    };
    let mut strings = STRINGS.lock();
    let strings = strings.get_or_insert_with(HashMap::new);
    if let Some(&h) = strings.get(&s) {
        return h as *const c_void;
    }
    if strings.len() >= STRINGS_CAP {
        return std::ptr::null();
    }
    let c = std::ffi::CString::new(s.replace('\0', " ")).unwrap_or_default();
    let h = c.into_raw() as usize;
    strings.insert(s, h);
    h as *const c_void
}

unsafe extern "C" fn domain_register_string_a(
    _d: *const c_void,
    s: *const c_char,
) -> *const c_void {
    safe(std::ptr::null(), || register_string(ascii(s)))
}

unsafe extern "C" fn domain_register_string_w(_d: *const c_void, s: *const i32) -> *const c_void {
    safe(std::ptr::null(), || register_string(wide(s)))
}

// ---- the injection entry point ----

/// Fills `module`'s slots with `fns`; false when the module has no table.
///
/// # Safety
/// `get` is NVTX's `GetModuleFunctionTable`.
unsafe fn fill(get: GetModuleFunctionTable, module: c_int, fns: &[(usize, *const c_void)]) -> bool {
    let mut table: *mut Slot = std::ptr::null_mut();
    let mut size: c_uint = 0;
    // SAFETY: NVTX's GetModuleFunctionTable writes the table and its size.
    if unsafe { get(module, &mut table, &mut size) } == 0 || table.is_null() {
        return false;
    }
    for &(id, f) in fns {
        if id >= size as usize {
            continue;
        }
        // SAFETY: `table` has `size` entries, each null or the address of one slot.
        let slot = unsafe { *table.add(id) };
        if !slot.is_null() {
            // SAFETY: a non-null slot of NVTX's table, which it hands over to be filled.
            unsafe { *slot = f };
        }
    }
    true
}

/// The NVTX injection entry point (NVTX v3's `NvtxInitializeInjectionNvtxFunc_t`): fills the
/// CORE and CORE2 tables and returns 1, or returns 0 (NVTX then makes every call a no-op and
/// closes the library) when recording is off. A copy of the library that stands down for
/// another one loaded first hands the call on to that one.
///
/// # Safety
/// `get` is NVTX's `nvtxGetExportTable` (or null).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn InitializeInjectionNvtx2(get: Option<GetExportTable>) -> c_int {
    safe(0, || {
        let Some(get) = get else { return 0 };
        if !policy::intercepting() {
            // Standing down (LD_PRELOAD named another copy first), or ISOLATE_MODE=off: the
            // process-wide first definition decides.
            let first = resolve::dlsym_in(libc::RTLD_DEFAULT, c"InitializeInjectionNvtx2");
            if first.is_null() || resolve::is_ours(first) {
                return 0;
            }
            // SAFETY: the other copy's entry point, of the same signature.
            let first: unsafe extern "C" fn(Option<GetExportTable>) -> c_int =
                unsafe { std::mem::transmute(first) };
            // SAFETY: the other copy's InitializeInjectionNvtx2, given NVTX's own argument.
            return unsafe { first(Some(get)) };
        }
        // SAFETY: a child handler of this library, which is never unloaded.
        ATFORK.call_once(|| unsafe {
            libc::pthread_atfork(None, None, Some(after_fork_child));
        });
        // SAFETY: NVTX's nvtxGetExportTable.
        let cb = unsafe { get(ETID_CALLBACKS) } as *const Callbacks;
        if cb.is_null() {
            return 0;
        }
        // SAFETY: the callbacks table, at least `struct_size` bytes.
        let cb = unsafe { &*cb };
        if cb.struct_size < std::mem::size_of::<Callbacks>() {
            return 0;
        }
        let Some(gmft) = cb.get_module_function_table else {
            return 0;
        };
        let f = |p: *const c_void| p;
        let core = [
            (CORE_MARK_EX, f(mark_ex as *const c_void)),
            (CORE_MARK_A, f(mark_a as *const c_void)),
            (CORE_MARK_W, f(mark_w as *const c_void)),
            (CORE_RANGE_START_EX, f(range_start_ex as *const c_void)),
            (CORE_RANGE_START_A, f(range_start_a as *const c_void)),
            (CORE_RANGE_START_W, f(range_start_w as *const c_void)),
            (CORE_RANGE_END, f(range_end as *const c_void)),
            (CORE_RANGE_PUSH_EX, f(range_push_ex as *const c_void)),
            (CORE_RANGE_PUSH_A, f(range_push_a as *const c_void)),
            (CORE_RANGE_PUSH_W, f(range_push_w as *const c_void)),
            (CORE_RANGE_POP, f(range_pop as *const c_void)),
        ];
        let core2 = [
            (CORE2_DOMAIN_MARK_EX, f(domain_mark_ex as *const c_void)),
            (
                CORE2_DOMAIN_RANGE_START_EX,
                f(domain_range_start_ex as *const c_void),
            ),
            (CORE2_DOMAIN_RANGE_END, f(domain_range_end as *const c_void)),
            (
                CORE2_DOMAIN_RANGE_PUSH_EX,
                f(domain_range_push_ex as *const c_void),
            ),
            (CORE2_DOMAIN_RANGE_POP, f(domain_range_pop as *const c_void)),
            (
                CORE2_DOMAIN_REGISTER_STRING_A,
                f(domain_register_string_a as *const c_void),
            ),
            (
                CORE2_DOMAIN_REGISTER_STRING_W,
                f(domain_register_string_w as *const c_void),
            ),
            (CORE2_DOMAIN_CREATE_A, f(domain_create_a as *const c_void)),
            (CORE2_DOMAIN_CREATE_W, f(domain_create_w as *const c_void)),
            (CORE2_DOMAIN_DESTROY, f(domain_destroy as *const c_void)),
        ];
        // SAFETY: NVTX's GetModuleFunctionTable.
        let ok = unsafe { fill(gmft, MODULE_CORE, &core) };
        if ok {
            // SAFETY: NVTX's GetModuleFunctionTable, given a table of our functions.
            unsafe { fill(gmft, MODULE_CORE2, &core2) };
        }
        ok as c_int
    })
}

/// In a fork child (registered once, at the first injection): the locks are free again; the
/// parent's open start/end ranges are not the child's, and registered strings (still valid
/// there) are simply registered again.
extern "C" fn after_fork_child() {
    OPEN_RANGES.reset_in_child(None);
    STRINGS.reset_in_child(None);
}

static ATFORK: std::sync::Once = std::sync::Once::new();
