//! The dynamic loader, for a `dlopen` this library makes on a caller's behalf: the real `dlopen`,
//! and the file the caller's own call would have opened. glibc's `dlopen` reads its caller from
//! its return address, and uses the caller's directories in two places: `$ORIGIN` in a name with
//! a slash, and the search for a bare name (the caller's `DT_RPATH`, and those of the objects that
//! loaded it, before `LD_LIBRARY_PATH`; its `DT_RUNPATH` after it). [`as_caller_would`] gives the
//! file so that a call made from here opens the same one.
//!
//! Layer: base. Uses nothing of this crate.

use super::resolve::libc_versioned;
use std::ffi::{CStr, CString, c_char, c_int, c_uint, c_void};
use std::sync::atomic::AtomicUsize;

pub type DlopenFn = unsafe extern "C" fn(*const c_char, c_int) -> *mut c_void;

/// The real `dlopen` (glibc's), found with `dlvsym` so that our own export is never in the way.
pub static REAL_DLOPEN: AtomicUsize = AtomicUsize::new(0);

pub fn real_dlopen() -> Option<DlopenFn> {
    let p = libc_versioned(&REAL_DLOPEN, c"dlopen")?;
    // SAFETY: `p` is non-zero and was returned by dlvsym for libc's `dlopen`, whose C signature is
    // `DlopenFn`'s; a usize and a function pointer have the same size.
    Some(unsafe { std::mem::transmute::<usize, DlopenFn>(p) })
}

const RTLD_DL_LINKMAP: c_int = 2;
const RTLD_DI_SERINFOSIZE: c_int = 5;

/// `Dl_serpath`.
#[repr(C)]
struct Serpath {
    name: *const c_char,
    flags: c_uint,
}

/// `Dl_serinfo`'s head; the paths follow it.
#[repr(C)]
struct Serinfo {
    size: usize,
    cnt: c_uint,
}

/// The loaded object `addr` lies in (its `link_map`, which glibc takes as a handle), or the
/// executable's when it lies in none: glibc's `dlopen` does the same with its caller.
fn object_of(addr: *const c_void, real: DlopenFn) -> *mut c_void {
    // SAFETY: Dl_info is a C struct of pointers, for which all-zero (null) is a valid value.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    let mut map: *mut c_void = std::ptr::null_mut();
    // SAFETY: dladdr1 only reads `addr` as a number (any value is allowed: it answers 0 when no
    // object holds it) and writes `info` and, with RTLD_DL_LINKMAP, one pointer into `map`; both
    // are live locals of the right types.
    let found = unsafe {
        libc::dladdr1(
            addr,
            &mut info,
            &mut map as *mut *mut c_void,
            RTLD_DL_LINKMAP,
        )
    };
    if found != 0 && !map.is_null() {
        return map;
    }
    // The executable's handle; opening it again only takes a reference.
    // SAFETY: `real` is glibc's dlopen; a null file name means the main program, and RTLD_NOLOAD
    // only takes a reference to what is loaded already.
    let main = unsafe { real(std::ptr::null(), libc::RTLD_LAZY | libc::RTLD_NOLOAD) };
    if main.is_null() {
        // SAFETY: as above: dlopen(NULL) returns the main program's handle, which always exists.
        unsafe { real(std::ptr::null(), libc::RTLD_LAZY) }
    } else {
        main
    }
}

/// The directories glibc searches for a bare name opened by `object`, in order
/// (`RTLD_DI_SERINFO`; the `ld.so.cache` look-up between `DT_RUNPATH` and the default
/// directories is not among them).
fn search_dirs(object: *mut c_void) -> Vec<Vec<u8>> {
    let mut head = Serinfo { size: 0, cnt: 0 };
    // SAFETY: `object` is a link_map from dladdr1 or a handle from dlopen (object_of), both valid
    // dlinfo handles while the object stays loaded; RTLD_DI_SERINFOSIZE writes a Dl_serinfo head
    // (size and count), which is what `head` is (#[repr(C)], same layout).
    if unsafe {
        libc::dlinfo(
            object,
            RTLD_DI_SERINFOSIZE,
            &mut head as *mut Serinfo as *mut c_void,
        )
    } != 0
        || head.size < std::mem::size_of::<Serinfo>()
    {
        return Vec::new();
    }
    // Room for `size` bytes, aligned for the pointers in it.
    let mut buf = vec![0u64; head.size.div_ceil(8)];
    let info = buf.as_mut_ptr() as *mut Serinfo;
    // SAFETY: `buf` holds at least `head.size` >= size_of::<Serinfo>() bytes, aligned to 8, so
    // `info` is valid and aligned for one Serinfo write.
    unsafe {
        info.write(Serinfo {
            size: head.size,
            cnt: head.cnt,
        })
    };
    // SAFETY: glibc's contract for RTLD_DI_SERINFO: the buffer is the `size` bytes that
    // RTLD_DI_SERINFOSIZE asked for, with `dls_size` and `dls_cnt` filled in, which `buf` and the
    // write above are; the handle is valid as in the call above.
    if unsafe { libc::dlinfo(object, libc::RTLD_DI_SERINFO, info as *mut c_void) } != 0 {
        return Vec::new();
    }
    // SAFETY: `info` points into `buf`, initialised by the write and the dlinfo call above.
    let cnt = unsafe { (*info).cnt } as usize;
    // `dls_serpath` follows `dls_cnt`, aligned as a pointer.
    let paths =
        // SAFETY: the head's size is within `buf` (head.size >= size_of::<Serinfo>()), so the
        // offset stays inside the same allocation.
        unsafe { (info as *const u8).add(std::mem::size_of::<Serinfo>()) } as *const Serpath;
    (0..cnt)
        .filter_map(|i| {
            // SAFETY: glibc wrote `cnt` Dl_serpath entries right after the head, inside the `size`
            // bytes of `buf` it asked for, so entry `i` < `cnt` is inside `buf`, initialised and
            // aligned.
            let name = unsafe { (*paths.add(i)).name };
            // SAFETY: a non-null `dls_name` points to a NUL-terminated string that glibc wrote into
            // the same buffer (after the entries), alive while `buf` is; it is copied out before
            // `buf` goes.
            (!name.is_null()).then(|| unsafe { CStr::from_ptr(name) }.to_bytes().to_vec())
        })
        .collect()
}

/// The directory `$ORIGIN` stands for in `object`'s names.
fn origin(object: *mut c_void) -> Option<Vec<u8>> {
    let mut buf = vec![0u8; libc::PATH_MAX as usize + 1];
    // SAFETY: RTLD_DI_ORIGIN copies the object's origin directory, NUL-terminated, into the buffer,
    // which must hold PATH_MAX bytes: `buf` holds PATH_MAX + 1; `object` is valid as above.
    if unsafe {
        libc::dlinfo(
            object,
            libc::RTLD_DI_ORIGIN,
            buf.as_mut_ptr() as *mut c_void,
        )
    } != 0
    {
        return None;
    }
    let n = buf.iter().position(|&b| b == 0)?;
    buf.truncate(n);
    (!buf.is_empty()).then_some(buf)
}

/// `name` with each `$ORIGIN` / `${ORIGIN}` replaced by `origin`, as glibc's `_dl_dst_substitute`
/// does (`$ORIGIN` must not run on into a name character).
fn expand_origin(name: &[u8], origin: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(name.len() + origin.len());
    let mut i = 0;
    while i < name.len() {
        let rest = &name[i..];
        let braced = rest.starts_with(b"${ORIGIN}");
        let plain = rest.starts_with(b"$ORIGIN")
            && !rest
                .get(7)
                .is_some_and(|&c| c.is_ascii_alphanumeric() || c == b'_');
        if braced || plain {
            out.extend_from_slice(origin);
            i += if braced { 9 } else { 7 };
        } else {
            out.push(name[i]);
            i += 1;
        }
    }
    out
}

fn is_file(path: &[u8]) -> bool {
    let Ok(c) = CString::new(path) else {
        return false;
    };
    // SAFETY: `stat` is a C struct of integers, for which all-zero is a valid value.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a live NUL-terminated CString and `st` a live stat for the call to fill.
    unsafe { libc::stat(c.as_ptr(), &mut st) == 0 && st.st_mode & libc::S_IFMT == libc::S_IFREG }
}

/// The file a `dlopen(file)` made by the code at `caller` would open, where a `dlopen(file)`
/// made from this library would open another one; `None` when both open the same (most names).
///
/// - A name with a slash: `$ORIGIN` expanded to the caller's directory.
/// - A bare name already loaded: the same object either way.
/// - A bare name: the first of the caller's search directories that has it, when the first of
///   ours that has it is another (the caller's own `DT_RPATH`/`DT_RUNPATH` and its loaders'
///   `DT_RPATH` are not ours; the executable's `DT_RPATH` is ours but not a caller's with a
///   `DT_RUNPATH`). Where both find it first in the same directory, or the caller finds it in
///   none of its directories (the cache), the name is opened as it is.
///
/// Not followed: a `glibc-hwcaps` subdirectory of such a directory, which glibc tries first; a
/// file there that is not a loadable object, which glibc skips (the caller then opens `file` as
/// it is).
pub fn as_caller_would(file: &CStr, caller: *const c_void) -> Option<CString> {
    let real = real_dlopen()?;
    let name = file.to_bytes();
    if name.is_empty() {
        return None;
    }
    if name.contains(&b'/') {
        if !name.contains(&b'$') {
            return None;
        }
        let origin = origin(object_of(caller, real))?;
        let expanded = expand_origin(name, &origin);
        return (expanded != name).then(|| CString::new(expanded).ok())?;
    }
    // SAFETY: `real` is glibc's dlopen and `file` the caller's NUL-terminated name (a &CStr);
    // RTLD_NOLOAD loads nothing, it only takes a reference to an object already loaded.
    let loaded = unsafe { real(file.as_ptr(), libc::RTLD_LAZY | libc::RTLD_NOLOAD) };
    if !loaded.is_null() {
        // SAFETY: `loaded` is the non-null handle just returned: this gives back the reference that
        // RTLD_NOLOAD took, so the object stays loaded as before.
        unsafe { libc::dlclose(loaded) };
        return None;
    }
    let first = |dirs: Vec<Vec<u8>>| {
        dirs.into_iter().find_map(|dir| {
            let mut path = dir;
            path.push(b'/');
            path.extend_from_slice(name);
            is_file(&path).then_some(path)
        })
    };
    let theirs = first(search_dirs(object_of(caller, real)))?;
    let ours = first(search_dirs(object_of(
        as_caller_would as *const c_void,
        real,
    )));
    if ours.as_ref() == Some(&theirs) {
        return None;
    }
    CString::new(theirs).ok()
}

#[cfg(test)]
mod tests {
    use super::expand_origin;

    #[test]
    fn origin_is_expanded_as_glibc_does() {
        let e = |n: &str| String::from_utf8(expand_origin(n.as_bytes(), b"/o")).unwrap();
        assert_eq!(e("$ORIGIN/lib.so"), "/o/lib.so");
        assert_eq!(e("${ORIGIN}/../x/$ORIGIN/y"), "/o/../x//o/y");
        assert_eq!(e("$ORIGINAL/lib.so"), "$ORIGINAL/lib.so");
        assert_eq!(e("/a/$LIB/lib.so"), "/a/$LIB/lib.so");
    }
}
