//! Offline symbolisation of native frames.
//!
//! A native frame is a return address. Its module is the trace's `Module` whose loaded range
//! holds it; the address in the module's file is `addr - 1 - base` (`- 1`: the call
//! instruction, not the one after it). The file at the module's path is opened once per
//! process (cached by path and build id) with the gimli project's `addr2line::Loader` (over
//! `object` and a memory map of the file):
//!
//! - **file:line and inlined frames** from DWARF when the file has it (or a separate debug
//!   file does: `/usr/lib/debug/.build-id/xx/yyyy.debug`, `PATH.debug`, `/usr/lib/debug/PATH`);
//! - otherwise the **function name** from the symbol table (`.symtab`, else `.dynsym`);
//! - names demangled with `cpp_demangle` (C++, the Itanium ABI: PyTorch, CUDA libraries) and
//!   `rustc-demangle` (Rust), the crates the Rust toolchain itself and `addr2line` use.
//!
//! Why these crates: they read ELF and DWARF without running a tool per address (`addr2line`
//! the program forks once a module and is often not installed next to a trace), parse lazily
//! (a compilation unit is read when an address in it is first asked for, so a 1 GiB
//! `libtorch_cuda.so` costs what is asked of it, and its pages are mapped, not read), handle
//! compressed debug sections, split DWARF and DWARF 5, and are maintained by the gimli project
//! and used by the Rust standard library's backtraces.
//!
//! The file must be the one that was loaded: when the recorded build id is not empty and the
//! file's differs, its frames are not symbolised (the names would be wrong) and the stack says
//! so; likewise a module whose file is missing. `ISOLATE_SYSROOT` (directories separated by
//! `:`) is searched first for the module's path below each directory and for its file name,
//! for traces analysed on another machine.

use super::{GAP, ShownStack, StackTable, SymFrame, base_name};
use isolate_trace::{Frame, Module};
use rustc_hash::FxHashMap;
use std::cell::RefCell;
use std::path::{Path, PathBuf};

/// One module file, opened (or not).
struct ModuleSyms {
    /// The symbol table and, when there is one, the DWARF of the file.
    loader: Option<addr2line::Loader>,
    /// A separate debug file's DWARF, when the module's own file has none.
    debug: Option<addr2line::Loader>,
    /// Why its frames are not symbolised, when they are not.
    problem: Option<String>,
}

/// Opens module files on demand and keeps them for the life of the process (one per path and
/// build id).
#[derive(Default)]
pub struct Symbolizer {
    modules: FxHashMap<(String, Vec<u8>), ModuleSyms>,
    search: Vec<PathBuf>,
}

thread_local! {
    static SYMBOLIZER: RefCell<Symbolizer> = RefCell::new(Symbolizer::from_env());
}

/// Runs `f` with this thread's symbolizer (so every analysis of a process shares its cache).
pub fn with_symbolizer<R>(f: impl FnOnce(&mut Symbolizer) -> R) -> R {
    SYMBOLIZER.with(|s| f(&mut s.borrow_mut()))
}

/// The frames of stack `id` of `table` as `(filename, line, name)`, innermost first, every
/// frame included (the hidden ones too; inlined frames expanded), for outputs that want
/// frames in that shape (PyTorch's memory snapshot, `_memory_viz`). Python frames give their
/// file, line and function; native frames their source file and line when the module has
/// DWARF, else the module's path and line 0, and their function name (or `0x…` address when
/// no symbol covers it). An unknown id or id 0 gives an empty list.
pub fn export_frames(table: &StackTable, id: u32) -> Vec<(String, u32, String)> {
    let Some(s) = super::shown(table, id) else {
        return Vec::new();
    };
    s.frames
        .into_iter()
        .map(|f| {
            let file = f.file.or(f.module).unwrap_or_else(|| "??".into());
            let name = f.function.or(f.addr).unwrap_or_else(|| "??".into());
            (file, f.line.unwrap_or(0), name)
        })
        .collect()
}

impl Symbolizer {
    /// A symbolizer that looks for module files at their recorded paths only.
    pub fn new() -> Self {
        Self::default()
    }

    /// A symbolizer that searches the directories of `ISOLATE_SYSROOT` (separated by `:`)
    /// first.
    pub fn from_env() -> Self {
        let mut s = Self::new();
        if let Some(v) = std::env::var_os("ISOLATE_SYSROOT") {
            s.search = std::env::split_paths(&v)
                .filter(|p| !p.as_os_str().is_empty())
                .collect();
        }
        s
    }

    /// Looks for module files below these directories first (their recorded path below each,
    /// then their file name in each).
    pub fn with_search_path(mut self, dirs: Vec<PathBuf>) -> Self {
        self.search = dirs;
        self
    }

    /// Symbolises stack `id` of `table`.
    pub fn stack(&mut self, table: &StackTable, id: u32) -> ShownStack {
        let Some((frames, truncated)) = table.stack(id) else {
            return ShownStack {
                id,
                site: format!("stack {id} (not defined in the trace)"),
                place: None,
                frames: Vec::new(),
                hidden: 0,
                truncated: false,
                problems: vec![format!("stack {id} is not defined in the trace")],
            };
        };
        let mut out = Vec::with_capacity(frames.len());
        let mut problems: Vec<String> = Vec::new();
        for f in frames {
            match *f {
                Frame::Python { code, line } => {
                    let c = table.code(code);
                    out.push(SymFrame {
                        kind: "python",
                        addr: None,
                        module: None,
                        offset: None,
                        function: Some(c.map_or_else(
                            || format!("<code {code} not defined in the trace>"),
                            |c| c.name.clone(),
                        )),
                        file: Some(c.map_or_else(|| "?".into(), |c| c.file.clone())),
                        line: Some(line),
                        inlined: false,
                        hidden: false,
                    });
                }
                Frame::Native(GAP) => out.push(SymFrame::gap()),
                Frame::Native(addr) => {
                    let m = table.module_of_stack(addr, id);
                    if let Some(p) = m.and_then(|m| self.problem(m))
                        && !problems.contains(&p)
                    {
                        problems.push(p);
                    }
                    self.native(m, addr, &mut out);
                }
            }
        }
        let has_python = out.iter().any(|f| f.kind == "python");
        for f in &mut out {
            f.hidden = f.kind == "native" && hide(f, has_python);
        }
        if !out.is_empty() && out.iter().all(|f| f.hidden) {
            for f in &mut out {
                f.hidden = false;
            }
        }
        let hidden = out.iter().filter(|f| f.hidden).count();
        // The site is the program's own line: the innermost Python frame where the stack has
        // one (a PyTorch allocation's innermost native frame is the same few functions of
        // libtorch for every tensor), else the first frame shown.
        let site = out
            .iter()
            .find(|f| !f.hidden && f.kind == "python")
            .or_else(|| out.iter().find(|f| !f.hidden))
            .map(|f| f.label())
            .unwrap_or_else(|| "(empty stack)".into());
        // Without Python frames (PyTorch's backward pass runs on autograd's own threads), the
        // first frame is the same allocation function for every tensor: the autograd node the
        // stack runs in tells the sites apart.
        let site = if has_python {
            site
        } else {
            super::in_backward(&out, site)
        };
        ShownStack {
            id,
            site,
            place: ShownStack::place_of(&out),
            frames: out,
            hidden,
            truncated,
            problems,
        }
    }

    /// Why module `m`'s frames are not symbolised, when they are not.
    fn problem(&mut self, m: &Module) -> Option<String> {
        self.module(m).problem.clone()
    }

    fn module(&mut self, m: &Module) -> &ModuleSyms {
        let key = (m.path.clone(), m.build_id.clone());
        if !self.modules.contains_key(&key) {
            let syms = self.open(m);
            self.modules.insert(key.clone(), syms);
        }
        &self.modules[&key]
    }

    fn candidates(&self, path: &str) -> Vec<PathBuf> {
        let mut v = Vec::new();
        for d in &self.search {
            v.push(d.join(path.trim_start_matches('/')));
            v.push(d.join(base_name(path)));
        }
        v.push(PathBuf::from(path));
        v
    }

    fn open(&self, m: &Module) -> ModuleSyms {
        let none = |problem: String| ModuleSyms {
            loader: None,
            debug: None,
            problem: Some(problem),
        };
        let Some(found) = self.candidates(&m.path).into_iter().find(|p| p.is_file()) else {
            let also = if self.search.is_empty() {
                " (set ISOLATE_SYSROOT to where a copy is)".to_owned()
            } else {
                " or below ISOLATE_SYSROOT".to_owned()
            };
            return none(format!(
                "{}: no such file here{also}: its frames are shown as offsets",
                m.path
            ));
        };
        let (file_id, has_dwarf) = match file_facts(&found) {
            Ok(x) => x,
            Err(e) => {
                return none(format!(
                    "{}: cannot be read as an ELF file ({e}): its frames are shown as offsets",
                    found.display()
                ));
            }
        };
        if !m.build_id.is_empty() && file_id.as_deref() != Some(&m.build_id[..]) {
            return none(format!(
                "{}: build id {} differs from the recorded {}: not the file that was loaded, \
                 its frames are shown as offsets",
                found.display(),
                file_id
                    .as_deref()
                    .map_or_else(|| "(none)".into(), hex_bytes),
                hex_bytes(&m.build_id)
            ));
        }
        let loader = match addr2line::Loader::new(&found) {
            Ok(l) => l,
            Err(e) => {
                return none(format!(
                    "{}: cannot be read ({e}): its frames are shown as offsets",
                    found.display()
                ));
            }
        };
        let debug = if has_dwarf {
            None
        } else {
            debug_file(&found, file_id.as_deref()).and_then(|p| addr2line::Loader::new(p).ok())
        };
        ModuleSyms {
            loader: Some(loader),
            debug,
            problem: None,
        }
    }

    /// Symbolises one native return address, pushing one frame per function it is in
    /// (inlined ones first).
    fn native(&mut self, m: Option<&Module>, addr: u64, out: &mut Vec<SymFrame>) {
        let base = SymFrame {
            kind: "native",
            addr: Some(crate::util::hex(addr)),
            module: m.map(|m| m.path.clone()),
            offset: m.map(|m| crate::util::hex(addr.wrapping_sub(m.base))),
            function: None,
            file: None,
            line: None,
            inlined: false,
            hidden: false,
        };
        let Some(m) = m else {
            out.push(base);
            return;
        };
        let probe = addr.wrapping_sub(1).wrapping_sub(m.base);
        let syms = self.module(m);
        let Some(loader) = &syms.loader else {
            out.push(base);
            return;
        };
        let symbol = loader
            .find_symbol(probe)
            .map(|s| addr2line::demangle_auto(s.into(), None).into_owned());
        let mut found: Vec<SymFrame> = Vec::new();
        for l in [syms.debug.as_ref(), Some(loader)].into_iter().flatten() {
            if let Ok(mut frames) = l.find_frames(probe) {
                while let Ok(Some(f)) = frames.next() {
                    let function = f
                        .function
                        .as_ref()
                        .and_then(|n| n.demangle().ok().map(|c| c.into_owned()));
                    let (file, line) = match &f.location {
                        Some(loc) => (loc.file.map(str::to_owned), loc.line),
                        None => (None, None),
                    };
                    if function.is_none() && file.is_none() {
                        continue;
                    }
                    found.push(SymFrame {
                        function,
                        file,
                        line,
                        inlined: true,
                        ..base.clone()
                    });
                }
            }
            if !found.is_empty() {
                break;
            }
        }
        if found.is_empty() {
            out.push(SymFrame {
                function: symbol,
                ..base
            });
            return;
        }
        // The last (outermost) function of an address is the one it is really in; the
        // others were inlined into it.
        if let Some(last) = found.last_mut() {
            last.inlined = false;
            if last.function.is_none() {
                last.function = symbol;
            }
        }
        out.extend(found);
    }
}

/// The build id of the ELF file at `p` and whether it has DWARF line information.
fn file_facts(p: &Path) -> Result<(Option<Vec<u8>>, bool), String> {
    use object::{Object, ObjectSection};
    let f = std::fs::File::open(p).map_err(|e| e.to_string())?;
    // SAFETY: the map is read only and dropped before return; a file changed under it can
    // give wrong bytes, never undefined behaviour beyond that (the same as addr2line's own).
    let map = unsafe { memmap2::Mmap::map(&f) }.map_err(|e| e.to_string())?;
    let o = object::File::parse(&*map).map_err(|e| e.to_string())?;
    let id = o.build_id().map_err(|e| e.to_string())?.map(<[u8]>::to_vec);
    let dwarf = o
        .section_by_name(".debug_line")
        .is_some_and(|s| s.size() > 0)
        || o.section_by_name(".zdebug_line").is_some();
    Ok((id, dwarf))
}

/// A separate debug file for `p`: by build id under `/usr/lib/debug/.build-id`, `P.debug`
/// next to it, or `/usr/lib/debug/P`.
fn debug_file(p: &Path, build_id: Option<&[u8]>) -> Option<PathBuf> {
    let mut c = Vec::new();
    if let Some(id) = build_id.filter(|id| id.len() > 1) {
        let h = hex_bytes(id);
        c.push(PathBuf::from(format!(
            "/usr/lib/debug/.build-id/{}/{}.debug",
            &h[..2],
            &h[2..]
        )));
    }
    let mut dot = p.as_os_str().to_owned();
    dot.push(".debug");
    c.push(PathBuf::from(dot));
    if let Ok(abs) = p.canonicalize() {
        c.push(Path::new("/usr/lib/debug").join(abs.strip_prefix("/").unwrap_or(&abs)));
    }
    c.into_iter().find(|x| x.is_file())
}

fn hex_bytes(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// True for a native frame that says how CUDA was reached rather than where in the program
/// (see the module documentation of `stacks`).
fn hide(f: &SymFrame, has_python: bool) -> bool {
    let module = f.module.as_deref().map(base_name).unwrap_or("");
    let func = f.function.as_deref().unwrap_or("");
    let starts = |prefixes: &[&str]| prefixes.iter().any(|p| module.starts_with(p));
    if starts(&[
        "libisolate",
        "libcuda.so",
        "libcudart",
        "libnvidia-",
        "libc10_cuda",
        "libc.so",
        "ld-linux",
        "libpthread",
    ]) {
        return true;
    }
    // nvcc links the runtime statically (its default): the runtime's frames are the program's
    // own module's, its internal functions named `libcudart_static_<hash>`, its API functions
    // `cudaLaunchKernel`, `cudaMalloc`, …, and the kernel's host stub `__device_stub__…` that
    // `kernel<<<…>>>` calls. They say how CUDA was reached, not where in the program (issue 30:
    // the textbook use-after-free's launch was "at libcudart_static_4d8b… (uaf+0xded4)").
    if func.starts_with("libcudart_static_")
        || func.starts_with("__device_stub__")
        || func.starts_with("__cudart")
        || is_runtime_api(func)
    {
        return true;
    }
    if func.contains("CachingAllocator")
        || func.contains("c10::cuda::")
        || matches!(
            func,
            "_start" | "__libc_start_main" | "__libc_start_call_main"
        )
    {
        return true;
    }
    if has_python {
        let interp_module = starts(&["libpython", "python", "_ctypes", "libffi"]);
        let interp_func = func.starts_with("_Py")
            || func.starts_with("Py")
            || func.starts_with("ffi_")
            || func.starts_with("cfunction_")
            || func.starts_with("method_vectorcall")
            || func.starts_with("_ctypes_")
            || func.starts_with("PyCFuncPtr");
        return interp_module || interp_func;
    }
    false
}

/// A CUDA runtime API function's name (`cudaMalloc`, `cudaLaunchKernel`, `__cudaPushCallConfiguration`):
/// `cuda` and a capital letter, alone (a C++ function in a namespace or with parameters in its
/// demangled name is the program's).
fn is_runtime_api(func: &str) -> bool {
    let f = func.strip_prefix("__").unwrap_or(func);
    f.strip_prefix("cuda").is_some_and(|r| {
        r.starts_with(|c: char| c.is_ascii_uppercase())
            && r.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn native(module: &str, function: &str) -> SymFrame {
        SymFrame {
            kind: "native",
            addr: Some("0x1".into()),
            module: Some(module.into()),
            offset: Some("0x1".into()),
            function: Some(function.into()),
            file: None,
            line: None,
            inlined: false,
            hidden: false,
        }
    }

    #[test]
    fn runtime_and_interpreter_frames_are_hidden() {
        assert!(hide(
            &native("/usr/lib/libcudart.so.13", "cudaMalloc"),
            false
        ));
        assert!(hide(&native("/x/libisolate.so", "hook"), false));
        assert!(hide(
            &native(
                "/t/libc10_cuda.so",
                "c10::cuda::CUDACachingAllocator::malloc"
            ),
            false
        ));
        assert!(!hide(&native("/app/prog", "make_buffer"), false));
        assert!(!hide(
            &native("/usr/lib/libpython3.12.so", "_PyEval_EvalFrameDefault"),
            false
        ));
        assert!(hide(
            &native("/usr/lib/libpython3.12.so", "_PyEval_EvalFrameDefault"),
            true
        ));
        assert!(hide(&native("/usr/bin/python3.12", "PyObject_Call"), true));
    }

    /// nvcc's static runtime lives in the program's own module: its frames are hidden by name,
    /// the program's are not (the H200's textbook_uaf stack, issue 30).
    #[test]
    fn the_static_runtimes_frames_are_hidden() {
        let uaf = "/tmp/w/uaf";
        for f in [
            "libcudart_static_4d8b33a106dceb3c07a56e26de61f2d53bb62a68",
            "cudaLaunchKernel",
            "cudaMalloc",
            "__cudaPushCallConfiguration",
            "__device_stub__Z7write42Pi(int*)",
        ] {
            assert!(hide(&native(uaf, f), false), "{f}");
        }
        for f in [
            "main",
            "cudaify(int)",
            "cuda",
            "cudamalloc_wrapper",
            "ns::cudaMalloc",
        ] {
            assert!(!hide(&native(uaf, f), false), "{f}");
        }
    }
}
