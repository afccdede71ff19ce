//! Call stacks (trace format version 2): the table of a trace's stacks, modules and Python code
//! objects ([`StackTable`]), their offline symbolisation ([`Symbolizer`], in `symbolize.rs`)
//! and how they are shown ([`ShownStack`]).
//!
//! The library writes each distinct stack once and names it by id from the events (`stack`),
//! and from stale launches and stale values through `StackOf` records. Nothing is symbolised
//! while a trace is read: an analysis keeps the ids it will show and symbolises those at the
//! end ([`shown`], [`Symbolizer::stack`]), each module opened once per process.
//!
//! **What is shown.** A stack runs from the innermost frame (the call into CUDA) outwards.
//! Frames in the CUDA runtime and driver (`libcudart`, `libcuda`, `libnvidia-*`), in
//! `libisolate` itself, in PyTorch's caching allocator (`c10::cuda::…CachingAllocator…`,
//! `libc10_cuda`), in the C library's start-up (`_start`, `__libc_start_main`) and, in a stack
//! that has Python frames, the interpreter's own C frames (`libpython*`, `_Py*`/`Py*`
//! functions, `ctypes`/`libffi` call machinery) are **hidden** in text: they say how CUDA was
//! reached, not where in the program. JSON keeps every frame, with `hidden` set on those.
//! When every frame would be hidden, none is.
//!
//! **Allocation site.** The site of an allocation is its whole stack (one stack id of the
//! trace), named by its **first shown frame** (the innermost frame that is not hidden):
//! `make_buffer (prog.c:14)`, `train.py:42 in step`. Rankings (`isolate sites`, the summary's
//! memory by site) count per stack; across traces (`diff`, `check`, several traces at once),
//! where ids and addresses differ, sites with the same shown frames are the same site.

mod symbolize;

pub use symbolize::{Symbolizer, export_frames, with_symbolizer};

use isolate_trace::{Frame, Module, PyCode, Record};
use rustc_hash::FxHashMap;
use serde::Serialize;

/// The stacks, modules and Python code objects of one trace, as its records define them.
///
/// Memory grows with the number of *distinct* stacks (call sites), not with the number of
/// events; `StackOf` entries (one per stale launch or stale value) are capped at
/// [`STACK_OF_CAP`].
#[derive(Default, Debug, Clone)]
pub struct StackTable {
    /// Sorted by start address.
    modules: Vec<Module>,
    /// For each of `modules` (same index): how many modules were defined before it.
    module_order: Vec<u32>,
    /// True once a module was defined over another's range (a library loaded where an unloaded
    /// one was): a frame's module then depends on when its stack was defined.
    overlaps: bool,
    stacks: FxHashMap<u32, (Box<[Frame]>, bool)>,
    /// For each stack: how many modules were defined before it (the library writes a stack
    /// after every module it names).
    stack_modules: FxHashMap<u32, u32>,
    codes: FxHashMap<u32, PyCode>,
    stack_of: FxHashMap<u64, u32>,
    /// True once any version-2 stack record was seen.
    seen: bool,
}

/// `StackOf` entries kept (stale launches and values are rare; a hostile trace cannot make
/// the table grow past this).
pub const STACK_OF_CAP: usize = 1 << 20;

impl StackTable {
    pub fn new() -> Self {
        Self::default()
    }

    /// Takes the record when it is a stack record (`Module`, `Stack`, `PyCode`, `StackOf`) and
    /// returns true; returns false for every other record.
    pub fn record(&mut self, rec: &Record) -> bool {
        match rec {
            Record::Module(m) => {
                self.seen = true;
                if self
                    .modules
                    .iter()
                    .any(|x| x.start < m.end && m.start < x.end)
                {
                    self.overlaps = true;
                }
                let at = self.modules.partition_point(|x| x.start < m.start);
                self.module_order.insert(at, self.modules.len() as u32);
                self.modules.insert(at, m.clone());
            }
            Record::Stack(s) => {
                self.seen = true;
                self.stacks
                    .insert(s.id, (s.frames.clone().into_boxed_slice(), s.truncated));
                self.stack_modules.insert(s.id, self.modules.len() as u32);
            }
            Record::PyCode(c) => {
                self.seen = true;
                self.codes.insert(c.id, c.clone());
            }
            Record::StackOf(s) => {
                self.seen = true;
                if self.stack_of.len() < STACK_OF_CAP || self.stack_of.contains_key(&s.seq) {
                    self.stack_of.insert(s.seq, s.stack);
                }
            }
            _ => return false,
        }
        true
    }

    /// True when the trace defined any stack, module or code object.
    pub fn has_stacks(&self) -> bool {
        self.seen
    }

    /// The stack of the non-event record with sequence number `seq` (0: none).
    pub fn stack_of(&self, seq: u64) -> u32 {
        self.stack_of.get(&seq).copied().unwrap_or(0)
    }

    /// The frames of stack `id`, innermost first, and whether the depth limit cut it.
    pub fn stack(&self, id: u32) -> Option<(&[Frame], bool)> {
        self.stacks.get(&id).map(|(f, t)| (&f[..], *t))
    }

    /// Every stack id defined, in no particular order.
    pub fn stack_ids(&self) -> impl Iterator<Item = u32> + '_ {
        self.stacks.keys().copied()
    }

    /// The module whose loaded range holds `addr`.
    pub fn module_at(&self, addr: u64) -> Option<&Module> {
        let i = self.modules.partition_point(|m| m.start <= addr);
        let m = self.modules.get(i.checked_sub(1)?)?;
        (addr < m.end).then_some(m)
    }

    /// The module that held `addr` when stack `stack` was defined: the last one defined before
    /// it whose range holds `addr` (where no two modules overlap, [`StackTable::module_at`]).
    pub fn module_of_stack(&self, addr: u64, stack: u32) -> Option<&Module> {
        if !self.overlaps {
            return self.module_at(addr);
        }
        let before = self.stack_modules.get(&stack).copied().unwrap_or(u32::MAX);
        let end = self.modules.partition_point(|m| m.start <= addr);
        (0..end)
            .filter(|&i| addr < self.modules[i].end && self.module_order[i] < before)
            .max_by_key(|&i| self.module_order[i])
            .map(|i| &self.modules[i])
    }

    pub fn modules(&self) -> &[Module] {
        &self.modules
    }

    pub fn code(&self, id: u32) -> Option<&PyCode> {
        self.codes.get(&id)
    }

    /// Reads only the stack records of the trace at `path` (no model, no reordering).
    pub fn read(path: &std::path::Path) -> Result<StackTable, crate::Error> {
        let mut t = StackTable::new();
        let mut r = isolate_trace::Reader::open(path)?;
        while let Some(rec) = r.next_record()? {
            t.record(&rec);
        }
        Ok(t)
    }
}

/// A table is an observer too: it takes the stack records of the trace it is driven over.
impl crate::track::Observer for StackTable {
    fn other(&mut self, rec: &Record, _live: &crate::track::Live) {
        self.record(rec);
    }
}

/// One frame, symbolised. A native frame inlined into its caller gives several of these, the
/// inlined ones first (`inlined: true`), all with the same `addr`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SymFrame {
    /// `native`, `python`, or `gap`: native frames the library left out between the native
    /// frames it kept and the Python frames (`ISOLATE_NATIVE_FRAMES`; recorded as `Native(0)`).
    pub kind: &'static str,
    /// Native frames: the return address as recorded (`0x…`); null for Python frames.
    pub addr: Option<String>,
    /// Native frames: the file of the module it is in (null when no module holds it).
    pub module: Option<String>,
    /// Native frames: the address's offset in that module's file (`0x…`, after subtracting the
    /// load bias).
    pub offset: Option<String>,
    /// Function name (demangled), null when unknown.
    pub function: Option<String>,
    /// Source file (DWARF, or the Python code object's file), null when unknown.
    pub file: Option<String>,
    pub line: Option<u32>,
    /// True for a frame the compiler inlined into the next one.
    pub inlined: bool,
    /// True for frames the text leaves out (CUDA, the interpreter, libisolate: see the module
    /// documentation).
    pub hidden: bool,
}

/// The recorded frame that stands for native frames left out (`ISOLATE_NATIVE_FRAMES`): no
/// return address is 0.
pub const GAP: u64 = 0;

impl SymFrame {
    /// The frame that stands for the native frames left out between the native frames kept and
    /// the Python frames.
    pub fn gap() -> SymFrame {
        SymFrame {
            kind: "gap",
            addr: None,
            module: None,
            offset: None,
            function: Some(
                "... native frames left out (ISOLATE_NATIVE_FRAMES=all keeps them) ...".into(),
            ),
            file: None,
            line: None,
            inlined: false,
            hidden: false,
        }
    }

    /// The frame in one line: `file:line in function` for Python, `function (file:line)`,
    /// `function (module+0xoff)` or `module+0xoff` for native frames.
    pub fn label(&self) -> String {
        if self.kind == "gap" {
            return self.function.clone().unwrap_or_default();
        }
        if self.kind == "python" {
            return format!(
                "{}:{} in {}",
                self.file.as_deref().unwrap_or("?"),
                self.line.unwrap_or(0),
                self.function.as_deref().unwrap_or("?")
            );
        }
        let place = match (&self.file, self.line) {
            (Some(f), Some(l)) if l > 0 => Some(format!("{f}:{l}")),
            (Some(f), _) => Some(f.clone()),
            _ => None,
        };
        let in_module = || match (&self.module, &self.offset) {
            (Some(m), Some(o)) => format!("{}+{o}", base_name(m)),
            _ => format!(
                "{} (in no module of the trace)",
                self.addr.as_deref().unwrap_or("?")
            ),
        };
        match (&self.function, place) {
            (Some(f), Some(p)) => format!("{f} ({p})"),
            (Some(f), None) => format!("{f} ({})", in_module()),
            (None, Some(p)) => format!("{} ({p})", in_module()),
            (None, None) => in_module(),
        }
    }
}

/// The autograd node a stack runs in, from its innermost frame of
/// `torch::autograd::generated::<Node>::apply(…)` (PyTorch's generated backward functions):
/// `MmBackward0`. `None` when no frame is one.
pub fn autograd_node(frames: &[SymFrame]) -> Option<String> {
    const NS: &str = "torch::autograd::generated::";
    frames.iter().find_map(|f| {
        let name = f.function.as_deref()?;
        let rest = &name[name.find(NS)? + NS.len()..];
        let (node, tail) = rest.split_once("::")?;
        let ident = !node.is_empty() && node.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        (ident && tail.starts_with("apply(")).then(|| node.to_owned())
    })
}

/// `label` of a stack without Python frames, with the autograd node it runs in when it runs
/// in one (`NllLossBackward0 (the backward pass): at::detail::empty_generic(…)`): PyTorch's
/// backward pass allocates from autograd's threads, where every tensor's first frames are the
/// same allocation functions.
pub fn in_backward(frames: &[SymFrame], label: String) -> String {
    match autograd_node(frames) {
        Some(node) => format!("{node} (the backward pass): {label}"),
        None => label,
    }
}

/// Whether a Python frame's file is installed code, not the program's: a package under
/// `site-packages` or `dist-packages`, the standard library (`…/lib/python3.N/…`), a frozen
/// module (`<frozen runpy>`).
fn installed_python(file: Option<&str>) -> bool {
    let Some(f) = file else {
        return false;
    };
    f.contains("/site-packages/")
        || f.contains("/dist-packages/")
        || f.contains("/lib/python3.")
        || f.starts_with("<frozen ")
}

/// A stack as outputs show it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ShownStack {
    /// The stack's id in its trace.
    pub id: u32,
    /// The allocation site's name: the first frame that is not hidden.
    pub site: String,
    /// Where in the code the call was ([`ShownStack::place_of`]: the innermost Python frame,
    /// else the first shown one): what every output names a finding's code with. Null when
    /// no frame says.
    pub place: Option<String>,
    /// Every frame, innermost first (inlined frames expanded).
    pub frames: Vec<SymFrame>,
    /// How many of `frames` are hidden.
    pub hidden: usize,
    /// True when the library's depth limit cut the stack (outermost frames missing).
    pub truncated: bool,
    /// What got in the way of symbolising it (a module file missing or of another build),
    /// one sentence each; empty when nothing did.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub problems: Vec<String>,
}

impl ShownStack {
    /// Where in the code a call with these frames was: the innermost shown Python frame when
    /// there is one (`train.py:39 in main`), else the first shown frame (`make_buffer
    /// (prog.c:14)`). **The one rule** that names a finding's code; [`ShownStack::place`]
    /// holds it, [`crate::finding::place`] reads it.
    ///
    /// Of the Python frames, the program's own come first: the innermost one whose file is not
    /// installed code (a package under `site-packages` or `dist-packages`, the standard
    /// library, a frozen module), so that a tensor made inside `torch/nn/functional.py` for the
    /// script's `loss = F.cross_entropy(...)` is placed at the script's line; only when every
    /// Python frame is installed code is the innermost of them the place.
    pub fn place_of(frames: &[SymFrame]) -> Option<String> {
        let shown = || frames.iter().filter(|f| !f.hidden);
        let python = || shown().filter(|f| f.kind == "python");
        python()
            .find(|f| !installed_python(f.file.as_deref()))
            .or_else(|| python().next())
            .map(|f| f.label())
            .or_else(|| {
                let first = shown().find(|f| f.kind != "gap")?.label();
                Some(in_backward(frames, first))
            })
    }

    /// The frames the text shows.
    pub fn visible(&self) -> impl Iterator<Item = &SymFrame> {
        self.frames.iter().filter(|f| !f.hidden)
    }

    /// What tells sites apart: the shown frames, one a line (two stacks that differ only in
    /// hidden frames, or in addresses between runs, are the same site).
    pub fn key(&self) -> String {
        let v: Vec<String> = self.visible().map(|f| f.label()).collect();
        if v.is_empty() {
            self.site.clone()
        } else {
            v.join("\n")
        }
    }

    /// The shown frame after the site's own (its caller), for telling apart sites of one name.
    pub fn caller(&self) -> Option<String> {
        self.visible().nth(1).map(|f| f.label())
    }

    /// Lines of text for this stack: the first `max` visible frames, one a line, and a last
    /// line counting what was left out (`… 3 more frames, 12 hidden (CUDA, interpreter)`).
    ///
    /// Where the stack has Python frames, they lead: the native frames inside the innermost
    /// one (the framework's C++ between the program's line and the CUDA call) become one last
    /// `via …` line naming the outermost of them (the operator, e.g. `at::native::empty_cuda`)
    /// and how many there are. `--json` keeps every frame in order.
    pub fn text_lines(&self, max: usize) -> Vec<String> {
        let visible: Vec<&SymFrame> = self.visible().collect();
        let first_python = visible.iter().position(|f| f.kind == "python");
        let (lead, inner): (Vec<&SymFrame>, &[&SymFrame]) = match first_python {
            Some(i) if i > 0 => (visible[i..].to_vec(), &visible[..i]),
            _ => (visible.clone(), &[]),
        };
        let mut out: Vec<String> = lead.iter().take(max).map(|f| f.label()).collect();
        // The native frames left out (`ISOLATE_NATIVE_FRAMES`) lie between those kept and the
        // Python frames: the outermost kept one is named, and the gap said.
        let gap = inner.iter().any(|f| f.kind == "gap");
        let inner: Vec<&SymFrame> = inner.iter().copied().filter(|f| f.kind != "gap").collect();
        if let Some(op) = inner.last() {
            out.push(format!(
                "via {}{}{}",
                op.label(),
                match inner.len() {
                    1 => String::new(),
                    n => format!(" and {} native frames inside it", n - 1),
                },
                if gap {
                    " (the frames between it and Python left out: ISOLATE_NATIVE_FRAMES)"
                } else {
                    ""
                }
            ));
        }
        let more = lead.len().saturating_sub(max);
        let mut tail = Vec::new();
        if more > 0 {
            tail.push(format!(
                "{more} more frame{}",
                if more == 1 { "" } else { "s" }
            ));
        }
        if self.hidden > 0 {
            tail.push(format!(
                "{} hidden frame{} (CUDA, runtime, interpreter)",
                self.hidden,
                if self.hidden == 1 { "" } else { "s" }
            ));
        }
        if self.truncated {
            tail.push("cut short (ISOLATE_STACK_DEPTH, ISOLATE_NATIVE_FRAMES)".into());
        }
        if !tail.is_empty() {
            out.push(format!("… {}", tail.join(", ")));
        }
        out
    }
}

/// The last path component.
pub(crate) fn base_name(s: &str) -> &str {
    s.rsplit('/').next().unwrap_or(s)
}

/// Symbolises stack `id` of `table` with this thread's [`Symbolizer`]; `None` for id 0.
pub fn shown(table: &StackTable, id: u32) -> Option<ShownStack> {
    if id == 0 {
        return None;
    }
    Some(with_symbolizer(|s| s.stack(table, id)))
}

/// Why a trace has no stacks, for the one line that says so: `None` when it has some.
pub fn why_none(
    format_version: u32,
    table: &StackTable,
    config: &[(String, String)],
) -> Option<String> {
    if table.has_stacks() {
        return None;
    }
    if format_version < 2 {
        return Some(format!(
            "no call stacks: the trace is format version {format_version}, recorded before stacks"
        ));
    }
    let set = config
        .iter()
        .find(|(k, _)| k == "ISOLATE_STACKS")
        .map(|(_, v)| v.as_str());
    Some(match set {
        Some(v) => format!("no call stacks: recorded with ISOLATE_STACKS={v}"),
        None => "no call stacks in the trace".into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A backward allocation's frames, as symbolised on the H100 (GPT-2's nll_loss backward):
    /// the node is the innermost `generated::<Node>::apply(`; `_apply_functional` and other
    /// frames are passed over; a stack without one has none.
    #[test]
    fn the_autograd_node_is_read_from_its_apply_frame() {
        let native = |f: &str| native(f, false);
        let frames = [
            native("at::detail::empty_generic(c10::ArrayRef<long>, c10::Allocator*)"),
            native("at::_ops::nll_loss_backward::call(at::Tensor const&, at::Tensor const&)"),
            native(
                "torch::autograd::generated::NllLossBackward0_apply_functional(std::vector<at::\
                 Tensor, std::allocator<at::Tensor> >&&, std::array<bool, (unsigned long)2>)",
            ),
            native(
                "torch::autograd::generated::NllLossBackward0::apply(std::vector<at::Tensor, \
                 std::allocator<at::Tensor> >&&)",
            ),
            native("torch::autograd::Node::operator()(std::vector<at::Tensor>&&)"),
        ];
        assert_eq!(autograd_node(&frames).as_deref(), Some("NllLossBackward0"));
        assert_eq!(autograd_node(&frames[..3]), None);
        assert_eq!(autograd_node(&[]), None);
        // The place a finding names: the node first, where there is no Python frame.
        let place = ShownStack::place_of(&frames).unwrap();
        assert!(
            place.starts_with("NllLossBackward0 (the backward pass): at::detail::empty_generic("),
            "{place}"
        );
        assert!(
            !ShownStack::place_of(&frames[..3])
                .unwrap()
                .contains("backward pass")
        );
        let mut with_python = frames.to_vec();
        with_python.push(python("main", 12));
        assert_eq!(
            ShownStack::place_of(&with_python).as_deref(),
            Some("train.py:12 in main")
        );
    }

    /// A library loaded where an unloaded one was (the same range): each stack's frames are in
    /// the module defined last before the stack, not in whichever sorts last.
    #[test]
    fn a_frame_is_in_the_module_that_held_its_address_when_its_stack_was_defined() {
        let module = |id: u32, path: &str| {
            Record::Module(Module {
                id,
                path: path.into(),
                base: 0x1000,
                start: 0x1000,
                end: 0x2000,
                build_id: vec![],
            })
        };
        let stack = |id: u32| {
            Record::Stack(isolate_trace::Stack {
                id,
                frames: vec![Frame::Native(0x1100)],
                truncated: false,
            })
        };
        let mut t = StackTable::new();
        for r in [
            module(1, "/lib/liba.so"),
            stack(1),
            module(2, "/lib/libb.so"),
            stack(2),
        ] {
            t.record(&r);
        }
        let path = |s: u32| t.module_of_stack(0x1100, s).map(|m| m.path.as_str());
        assert_eq!(path(1), Some("/lib/liba.so"));
        assert_eq!(path(2), Some("/lib/libb.so"));
        assert_eq!(t.module_of_stack(0x2100, 2).map(|m| m.id), None);
    }

    fn native(f: &str, hidden: bool) -> SymFrame {
        SymFrame {
            kind: "native",
            addr: Some("0x1".into()),
            module: Some("/lib/libtorch_cuda.so".into()),
            offset: Some("0x1".into()),
            function: Some(f.into()),
            file: None,
            line: None,
            inlined: false,
            hidden,
        }
    }

    fn python(f: &str, line: u32) -> SymFrame {
        SymFrame {
            kind: "python",
            addr: None,
            module: None,
            offset: None,
            function: Some(f.into()),
            file: Some("train.py".into()),
            line: Some(line),
            inlined: false,
            hidden: false,
        }
    }

    fn python_in(file: &str, f: &str, line: u32) -> SymFrame {
        SymFrame {
            file: Some(file.into()),
            ..python(f, line)
        }
    }

    /// The program's own Python line is the place, not the installed package's that made the
    /// tensor for it; a stack of installed code only is placed at its innermost frame.
    #[test]
    fn the_place_is_the_programs_own_python_line() {
        let torch = "/usr/lib/python3/dist-packages/torch/nn/functional.py";
        let venv = "/home/u/.venv/lib/python3.12/site-packages/torch/nn/modules/module.py";
        let frames = vec![
            native("at::native::empty_cuda", false),
            python_in(torch, "cross_entropy", 3462),
            python_in(venv, "Module._call_impl", 1784),
            python_in("/home/u/leak.py", "<module>", 15),
            python_in("/usr/lib/python3.12/runpy.py", "_run_code", 88),
        ];
        assert_eq!(
            ShownStack::place_of(&frames).as_deref(),
            Some("/home/u/leak.py:15 in <module>")
        );
        let installed = vec![
            native("at::native::empty_cuda", false),
            python_in(torch, "cross_entropy", 3462),
            python_in("<frozen runpy>", "_run_module_as_main", 198),
        ];
        assert_eq!(
            ShownStack::place_of(&installed).as_deref(),
            Some(format!("{torch}:3462 in cross_entropy").as_str())
        );
        assert!(installed_python(Some("/usr/lib/python3.12/threading.py")));
        assert!(!installed_python(Some("/home/u/train.py")));
        assert!(!installed_python(None));
    }

    /// Stack 1 of `frames`, its hidden ones counted as the symboliser counts them.
    fn stack(frames: Vec<SymFrame>) -> ShownStack {
        ShownStack {
            place: None,
            id: 1,
            site: String::new(),
            hidden: frames.iter().filter(|f| f.hidden).count(),
            frames,
            truncated: false,
            problems: vec![],
        }
    }

    /// A PyTorch allocation: CUDA (hidden), three libtorch frames, two Python frames, the
    /// interpreter (hidden). The text leads with the program's lines and names the outermost
    /// libtorch frame once; JSON order is untouched.
    #[test]
    fn python_frames_lead_and_the_framework_collapses_into_one_via_line() {
        let s = stack(vec![
            native("cudaMallocAsync", true),
            native("at::detail::empty_generic", false),
            native("at::native::empty_cuda", false),
            native("THPVariable_zeros", false),
            python("step", 12),
            python("main", 40),
            native("_PyEval_EvalFrameDefault", true),
        ]);
        assert_eq!(
            s.text_lines(8),
            vec![
                "train.py:12 in step",
                "train.py:40 in main",
                "via THPVariable_zeros (libtorch_cuda.so+0x1) and 2 native frames inside it",
                "… 2 hidden frames (CUDA, runtime, interpreter)",
            ]
        );
        // Without Python frames: native frames as they are.
        let c = ShownStack {
            frames: vec![native("make_buffer", false), native("main", false)],
            hidden: 0,
            ..s.clone()
        };
        assert_eq!(
            c.text_lines(8),
            vec![
                "make_buffer (libtorch_cuda.so+0x1)",
                "main (libtorch_cuda.so+0x1)"
            ]
        );
    }

    /// Native frames left out by the library (`ISOLATE_NATIVE_FRAMES`): the `via` line names the
    /// outermost frame kept and says that the rest was left out.
    #[test]
    fn a_gap_of_left_out_native_frames_is_said_on_the_via_line() {
        let s = stack(vec![
            native("cudaMallocAsync", true),
            native("at::detail::empty_generic", false),
            native("at::native::empty_cuda", false),
            SymFrame::gap(),
            python("step", 12),
        ]);
        let lines = s.text_lines(10);
        assert_eq!(lines[0], "train.py:12 in step");
        assert_eq!(
            lines[1],
            "via at::native::empty_cuda (libtorch_cuda.so+0x1) and 1 native frames inside it \
             (the frames between it and Python left out: ISOLATE_NATIVE_FRAMES)"
        );
        assert_eq!(
            SymFrame::gap().label(),
            "... native frames left out (ISOLATE_NATIVE_FRAMES=all keeps them) ..."
        );
    }
}
