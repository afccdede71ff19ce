//! Call stacks in the trace (issue 13, format version 2), on the stand-in CUDA:
//!
//! - `tests/programs/stacks.c`, built `-O2`, no `-g`, no frame pointers: the allocation's and
//!   the free's native frames fall into the program and, symbolised with its ELF symbol table
//!   (`nm`), name the two functions they were made in; the stale write is found as before;
//! - 10^6 allocations from three call sites give exactly three allocation stacks;
//! - `ISOLATE_STACK_DEPTH` cuts a deep stack short and says so; `ISOLATE_STACKS=none` records
//!   none; `native` has no Python frames;
//! - `tests/programs/stacks.py` allocates and frees through ctypes (`CDLL`: GIL released;
//!   `PyDLL`: GIL held; and from a second thread) from named Python functions: the Python frames
//!   give the functions, the file and the lines, under every CPython 3.10 – 3.13 found
//!   (`python3`, `python3.1x`, pyenv's versions), merged with the native frames;
//! - in every trace, each Module and PyCode a Stack names, and each Stack an event or a
//!   `StackOf` names, comes before the record that names it.

use isolate_tests::{Run, Trace, preload_path, program_path, skip, standin_dir, workspace_root};
use isolate_trace::{Api, EndReason, Event, Frame, Module, PyCode, Record, Stack};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The stack records of a trace, by id.
struct Stacks {
    stacks: HashMap<u32, Stack>,
    modules: Vec<Module>,
    codes: HashMap<u32, PyCode>,
}

impl Stacks {
    /// Reads them, checking that every definition comes before its first use.
    fn of(t: &Trace) -> Stacks {
        let mut s = Stacks {
            stacks: HashMap::new(),
            modules: Vec::new(),
            codes: HashMap::new(),
        };
        for r in &t.records {
            match r {
                Record::Module(m) => {
                    assert!(
                        s.modules.iter().all(|o| o.id != m.id),
                        "module {} twice",
                        m.id
                    );
                    s.modules.push(m.clone());
                }
                Record::PyCode(c) => {
                    assert!(
                        s.codes.insert(c.id, c.clone()).is_none(),
                        "code {} twice",
                        c.id
                    );
                }
                Record::Stack(st) => {
                    for f in &st.frames {
                        match f {
                            Frame::Native(pc) => {
                                // A frame outside every module is possible (JIT code), never
                                // one in a module written later.
                                let _ = pc;
                            }
                            Frame::Python { code, .. } => assert!(
                                s.codes.contains_key(code),
                                "stack {} names code {code} before its PyCode record",
                                st.id
                            ),
                        }
                    }
                    assert!(
                        s.stacks.insert(st.id, st.clone()).is_none(),
                        "stack {} written twice",
                        st.id
                    );
                }
                Record::Event(e) if e.stack != 0 => assert!(
                    s.stacks.contains_key(&e.stack),
                    "event {} names stack {} before its Stack record",
                    e.seq,
                    e.stack
                ),
                Record::StackOf(so) => assert!(
                    s.stacks.contains_key(&so.stack),
                    "StackOf {} names stack {} before its Stack record",
                    so.seq,
                    so.stack
                ),
                _ => {}
            }
        }
        // Every native frame inside a loaded object has that object's Module before the stack.
        let mut seen_modules: Vec<&Module> = Vec::new();
        for r in &t.records {
            match r {
                Record::Module(m) => seen_modules.push(m),
                Record::Stack(st) => {
                    for f in &st.frames {
                        if let Frame::Native(pc) = f
                            && let Some(m) = s.module(*pc)
                        {
                            assert!(
                                seen_modules.iter().any(|o| o.id == m.id),
                                "stack {} has a frame in {} before its Module record",
                                st.id,
                                m.path
                            );
                        }
                    }
                }
                _ => {}
            }
        }
        s
    }

    fn module(&self, pc: u64) -> Option<&Module> {
        self.modules.iter().find(|m| m.start <= pc && pc < m.end)
    }

    fn get(&self, id: u32) -> &Stack {
        self.stacks
            .get(&id)
            .unwrap_or_else(|| panic!("no stack {id}"))
    }

    /// A stack in words: `name (file:line)` for Python frames, `symbol` (or `module+0x..`) for
    /// native ones, innermost first.
    fn render(&self, id: u32, syms: &mut Symbols) -> Vec<String> {
        self.get(id)
            .frames
            .iter()
            .map(|f| match f {
                Frame::Python { code, line } => {
                    let c = &self.codes[code];
                    format!("py {} ({}:{line})", c.name, c.file)
                }
                Frame::Native(pc) => match self.module(*pc) {
                    Some(m) => match syms.name(&m.path, pc - m.base - 1) {
                        Some(n) => n,
                        None => format!("{}+0x{:x}", m.path, pc - m.base),
                    },
                    None => format!("0x{pc:x}"),
                },
            })
            .collect()
    }
}

/// Function symbols of ELF files, from `nm` (the symbol table; no debug information needed).
#[derive(Default)]
struct Symbols {
    files: HashMap<String, Vec<(u64, String)>>,
}

impl Symbols {
    fn name(&mut self, path: &str, addr: u64) -> Option<String> {
        let syms = self.files.entry(path.to_string()).or_insert_with(|| {
            let mut v = Vec::new();
            for args in [&["--defined-only"][..], &["-D", "--defined-only"][..]] {
                let Ok(out) = Command::new("nm").args(args).arg(path).output() else {
                    continue;
                };
                for l in String::from_utf8_lossy(&out.stdout).lines() {
                    let mut w = l.split_whitespace();
                    if let (Some(a), Some(k), Some(n)) = (w.next(), w.next(), w.next())
                        && matches!(k, "T" | "t" | "W" | "w")
                        && let Ok(a) = u64::from_str_radix(a, 16)
                    {
                        v.push((a, n.to_string()));
                    }
                }
            }
            v.sort();
            v
        });
        let i = syms.partition_point(|(a, _)| *a <= addr);
        i.checked_sub(1).map(|i| syms[i].1.clone())
    }
}

fn events_of(t: &Trace, api: Api) -> Vec<Event> {
    let mut v: Vec<Event> = t.events().into_iter().filter(|e| e.api == api).collect();
    v.sort_by_key(|e| e.seq);
    v
}

#[test]
fn c_stale_write_stacks_name_the_allocating_and_freeing_functions() {
    let out = Run::program("stacks")
        .arg("stale")
        .env("ISOLATE_MODE", "isolate")
        .run();
    out.assert_success();
    let t = out.only_trace();
    t.assert_complete(EndReason::Exit);
    out.assert_trace_matches(t, None);
    assert_eq!(t.violations().len(), 1, "the stale write is found");
    let s = Stacks::of(t);
    let mut syms = Symbols::default();
    let exe = program_path("stacks");
    let exe = std::fs::canonicalize(&exe).unwrap();
    let mallocs = events_of(t, Api::CudaMalloc);
    let frees = events_of(t, Api::CudaFree);
    for (e, func) in [
        (&mallocs[0], "stacks_make_buffer"),
        (&frees[0], "stacks_release_buffer"),
    ] {
        assert_ne!(e.stack, 0, "event {} has no stack", e.seq);
        let words = s.render(e.stack, &mut syms);
        let st = s.get(e.stack);
        // The innermost frame is the program's own, in the function that made the call.
        let Frame::Native(pc) = st.frames[0] else {
            panic!("{words:?}")
        };
        let m = s.module(pc).expect("innermost frame in a module");
        assert_eq!(Path::new(&m.path), exe, "{words:?}");
        assert!(!m.build_id.is_empty(), "the program has a GNU build id");
        assert_eq!(words[0], func, "{words:?}");
        assert!(words.iter().any(|w| w == "main"), "{words:?}");
        assert!(!st.truncated);
    }
    // The second allocation comes from main itself (stale() inlined), a stack of its own.
    assert_ne!(mallocs[1].stack, mallocs[0].stack);
    assert_eq!(s.render(mallocs[1].stack, &mut syms)[0], "main");
    // The header records the settings.
    let cfg: BTreeMap<_, _> = t.header.config.iter().cloned().collect();
    assert_eq!(cfg.get("ISOLATE_STACKS").map(String::as_str), Some("all"));
    assert_eq!(
        cfg.get("ISOLATE_STACK_DEPTH").map(String::as_str),
        Some("64")
    );
}

#[test]
fn a_million_allocations_from_three_call_sites_are_three_stacks() {
    let n = 1_000_000;
    let out = Run::program("stacks")
        .args(["sites", &n.to_string()])
        .timeout(std::time::Duration::from_secs(300))
        .run();
    out.assert_success();
    let t = out.only_trace();
    t.assert_complete(EndReason::Exit);
    let s = Stacks::of(t);
    let mut syms = Symbols::default();
    let mallocs = events_of(t, Api::CudaMalloc);
    assert_eq!(mallocs.len(), n);
    let alloc_stacks: BTreeSet<u32> = mallocs.iter().map(|e| e.stack).collect();
    let named: BTreeSet<String> = alloc_stacks
        .iter()
        .map(|id| s.render(*id, &mut syms)[0].clone())
        .collect();
    assert_eq!(alloc_stacks.len(), 3, "{named:?}");
    assert_eq!(
        named,
        ["stacks_site_a", "stacks_site_b", "stacks_site_c"]
            .map(String::from)
            .into()
    );
    // Every allocation names its own site. The three call cudaMalloc from the same depth
    // (the same start of the walk): a walk replayed from another site's would name that one.
    let mut top = BTreeMap::new();
    for e in &mallocs {
        let site = top
            .entry(e.stack)
            .or_insert_with(|| s.render(e.stack, &mut syms)[0].clone());
        let want = match e.size {
            256 => "stacks_site_a",
            512 => "stacks_site_b",
            _ => "stacks_site_c",
        };
        assert_eq!(site, want, "allocation {} of {} bytes", e.seq, e.size);
    }
    let free_stacks: BTreeSet<u32> = events_of(t, Api::CudaFree)
        .iter()
        .map(|e| e.stack)
        .collect();
    assert_eq!(
        free_stacks.len(),
        3,
        "one free site called from three functions"
    );
    // And the table holds nothing else: 6 stacks in all.
    assert_eq!(s.stacks.len(), 6);
    // The exit note counts the captures and where the native frames' unwind rules came from:
    // after the first walk through each site, from the thread's rule cache.
    // Told by its kind and topic, not its text.
    let note = stacks_note(t);
    assert!(note.starts_with("call stacks: "), "{note}");
    let num = |after: &str| note_number(&note, after);
    assert_eq!(num("call stacks: "), 2 * n as u64, "{note}");
    // Every native walk was replayed or walked; the walked ones' rules came from the rule
    // cache after the first walk through each site.
    let (replayed, walked) = (num("native frames: "), num("remembered walks, "));
    assert_eq!(replayed + walked, 2 * n as u64, "{note}");
    let (hits, misses) = (num("keep changing), with "), num("rule cache, "));
    assert!(hits + misses >= walked, "{note}");
    assert!(misses > 0 && misses < 1000, "{note}");
    // A thread without Python: after each site's first walk, the walk replayed gave the stack
    // it made at once.
    let with_stack = num("looked up; ");
    assert!(with_stack + 12 >= 2 * n as u64, "{note}");
    // The stacks themselves: each of the 6 looked up in the process's table once, then served
    // by the thread's cache.
    let table = num("on threads without Python; ");
    assert!((6..12).contains(&table), "{note}");
}

/// 64 call sites at one depth, in turn, as PyTorch's autograd thread allocates for many
/// backward nodes from one place in its engine (`step_bench STEPS TENSORS 64`): the walks of
/// one start are told apart at the word where their callers part (native.rs, `Start::split`),
/// and every allocation still names its own site (a walk replayed from another site's would
/// name that one), every walk after each site's first replayed.
#[test]
fn sixty_four_sites_at_one_depth_are_told_apart_and_replayed() {
    let (steps, tensors) = (3usize, 128usize);
    let out = Run::program("step_bench")
        .env("ISOLATE_MODE", "isolate")
        .env("ISOLATE_CHECK", "fast")
        .args([&steps.to_string(), &tensors.to_string(), "64"])
        .run();
    out.assert_success();
    let t = out.only_trace();
    let s = Stacks::of(t);
    let mut syms = Symbols::default();
    let mallocs = events_of(t, Api::CudaMallocAsync);
    assert_eq!(mallocs.len(), (steps + 5) * tensors);
    let mut named = BTreeMap::new();
    for (m, e) in mallocs.iter().enumerate() {
        let site = named.entry(e.stack).or_insert_with(|| {
            s.render(e.stack, &mut syms)
                .into_iter()
                .find(|w| w.starts_with("site"))
                .unwrap_or_default()
        });
        let j = m % tensors % 64;
        assert_eq!(
            *site,
            format!("site{}{}", j / 8 + 1, j % 8),
            "allocation {m}"
        );
    }
    assert_eq!(named.len(), 64);
    let note = stacks_note(t);
    let walked = note_number(&note, "remembered walks, ");
    assert!(walked <= 64 + 10, "{note}");
}

/// A walk from where one was walked before, over the same stack words, is replayed: in a loop
/// that allocates and frees from one place, every walk after the first of each is, and the
/// replayed stacks are the walked ones (10 frames of `stacks_bench`, then the C start-up's).
#[test]
fn a_repeated_walk_is_replayed_and_names_the_same_frames() {
    let n = 20_000u64;
    let out = Run::program("stacks")
        .args(["bench", &n.to_string(), "10"])
        .run();
    out.assert_success();
    let t = out.only_trace();
    let s = Stacks::of(t);
    let mut syms = Symbols::default();
    let mallocs = events_of(t, Api::CudaMalloc);
    let frees = events_of(t, Api::CudaFree);
    assert_eq!((mallocs.len(), frees.len()), (n as usize, n as usize));
    for events in [&mallocs, &frees] {
        let ids: BTreeSet<u32> = events.iter().map(|e| e.stack).collect();
        assert_eq!(
            ids.len(),
            1,
            "one stack for every allocation, one for every free"
        );
        let words = s.render(events[0].stack, &mut syms);
        assert_eq!(
            words.iter().filter(|w| *w == "stacks_bench").count(),
            10,
            "{words:?}"
        );
        assert!(!s.get(events[0].stack).truncated, "{words:?}");
    }
    // The first allocation's and free's walks, and a few from the program's set-up.
    assert_replayed_after_the_first(&stacks_note(t), 2 * n);
}

/// A walk is replayed when the stack words that differ from the walk it was remembered with
/// are ones no frame's rule unwinds through: a site whose caller keeps data in rbp (another
/// value each call, as code built without frame pointers does) starts every walk with another
/// rbp, and the frames save it; the walks are replayed all the same, and name the site.
#[test]
fn walks_whose_saved_rbp_differs_are_replayed() {
    let (words, _) = one_site_replayed("rbp", 20_000);
    assert_eq!(words[0], "stacks_rbp_site", "{words:?}");
}

/// Where a frame built with frame pointers unwinds through its saved rbp (a stack address, the
/// same each call) and a frame below it saves data (another value each call), the replay
/// checks the one and not the other: each word is tested alone when one is used.
#[test]
fn walks_that_use_one_saved_rbp_and_not_another_are_replayed() {
    let (words, note) = one_site_replayed("fprbp", 20_000);
    assert_eq!(
        words[..2],
        ["stacks_rbp_site", "stacks_fp_caller"],
        "{words:?}"
    );
    // The walks used a saved frame pointer.
    assert!(note_number(&note, "to remember; ") >= 1, "{note}");
}

/// Runs `stacks SCENARIO n` (one site that allocates and frees `n` times): its allocations
/// share one stack and its walks were replayed after the first few. That stack's words and the
/// call stacks note.
fn one_site_replayed(scenario: &str, n: u64) -> (Vec<String>, String) {
    let out = Run::program("stacks")
        .args([scenario, &n.to_string()])
        .run();
    out.assert_success();
    let t = out.only_trace();
    let s = Stacks::of(t);
    let mut syms = Symbols::default();
    let mallocs = events_of(t, Api::CudaMalloc);
    assert_eq!(mallocs.len(), n as usize);
    let ids: BTreeSet<u32> = mallocs.iter().map(|e| e.stack).collect();
    assert_eq!(ids.len(), 1);
    let note = stacks_note(t);
    assert_replayed_after_the_first(&note, 2 * n);
    (s.render(mallocs[0].stack, &mut syms), note)
}

/// The note counts `walks` native walks, all but at most 10 of them replayed.
fn assert_replayed_after_the_first(note: &str, walks: u64) {
    let num = |after: &str| note_number(note, after);
    let (replayed, walked) = (num("native frames: "), num("remembered walks, "));
    assert_eq!(replayed + walked, walks, "{note}");
    assert!(walked <= 10, "{note}");
}

/// The exit note on call stacks.
fn stacks_note(t: &Trace) -> String {
    t.cost_note(isolate_trace::CostTopic::Stacks)
        .expect("a call stacks note")
        .text
        .clone()
}

/// The number that follows `after` in `note`.
fn note_number(note: &str, after: &str) -> u64 {
    let rest = &note[note.find(after).unwrap_or_else(|| panic!("{note}")) + after.len()..];
    rest.split(|c: char| !c.is_ascii_digit())
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

#[test]
fn the_depth_limit_cuts_the_outermost_frames() {
    let out = Run::program("stacks")
        .args(["deep", "100"])
        .env("ISOLATE_STACK_DEPTH", "30")
        .run();
    out.assert_success();
    let t = out.only_trace();
    let s = Stacks::of(t);
    let mut syms = Symbols::default();
    let e = &events_of(t, Api::CudaMalloc)[0];
    let st = s.get(e.stack);
    assert_eq!(st.frames.len(), 30);
    assert!(st.truncated);
    let words = s.render(e.stack, &mut syms);
    assert!(words.iter().all(|w| w == "stacks_recurse"), "{words:?}");
    // Without the limit: every level and main.
    let out = Run::program("stacks")
        .args(["deep", "100"])
        .env("ISOLATE_STACK_DEPTH", "256")
        .run();
    let t = out.only_trace();
    let s = Stacks::of(t);
    let e = &events_of(t, Api::CudaMalloc)[0];
    let words = s.render(e.stack, &mut syms);
    assert_eq!(
        words.iter().filter(|w| *w == "stacks_recurse").count(),
        100,
        "{words:?}"
    );
    assert!(words.iter().any(|w| w == "main"), "{words:?}");
    assert!(!s.get(e.stack).truncated);
}

#[test]
fn stacks_none_records_no_stack() {
    let out = Run::program("stacks")
        .arg("stale")
        .env("ISOLATE_STACKS", "none")
        .run();
    out.assert_success();
    let t = out.only_trace();
    assert!(t.events().iter().all(|e| e.stack == 0));
    assert!(!t.records.iter().any(|r| matches!(
        r,
        Record::Stack(_) | Record::Module(_) | Record::PyCode(_) | Record::StackOf(_)
    )));
}

#[test]
fn a_malformed_stack_setting_is_refused_by_name() {
    for (k, v) in [
        ("ISOLATE_STACKS", "everything"),
        ("ISOLATE_STACK_DEPTH", "0"),
    ] {
        let out = Run::program("stacks").arg("stale").env(k, v).run();
        assert_eq!(out.code(), Some(2), "{k}={v}");
        assert!(out.stderr.contains(k), "{k}={v}: {}", out.stderr);
    }
}

// ------------------------------------------------------------------------------------ Python

/// Every CPython 3.10 – 3.13 this machine has: `python3`, `python3.1x` on the PATH, and
/// pyenv's versions. One per minor version.
fn pythons() -> Vec<(String, PathBuf)> {
    let mut found: BTreeMap<String, PathBuf> = BTreeMap::new();
    let mut candidates: Vec<PathBuf> = [
        "python3",
        "python3.10",
        "python3.11",
        "python3.12",
        "python3.13",
    ]
    .iter()
    .map(PathBuf::from)
    .collect();
    if let Some(home) = std::env::var_os("HOME") {
        let root = Path::new(&home).join(".pyenv/versions");
        if let Ok(rd) = std::fs::read_dir(root) {
            let mut v: Vec<PathBuf> = rd
                .filter_map(|e| e.ok())
                .map(|e| e.path().join("bin/python3"))
                .collect();
            v.sort();
            candidates.extend(v);
        }
    }
    for p in candidates {
        let Ok(out) = Command::new(&p)
            .args(["-c", "import sys; print('%d.%d' % sys.version_info[:2])"])
            .output()
        else {
            continue;
        };
        let v = String::from_utf8_lossy(&out.stdout).trim().to_string();
        if out.status.success() && ["3.10", "3.11", "3.12", "3.13"].contains(&v.as_str()) {
            found.entry(v).or_insert(p);
        }
    }
    found.into_iter().collect()
}

/// Runs `tests/programs/stacks.py` under the preload; the output and the one trace.
fn run_python(python: &Path, args: &[&str], env: &[(&str, &str)]) -> (String, Trace) {
    run_script(python, "stacks.py", args, env)
}

/// Runs `tests/programs/<script>` under the preload; the output and the one trace.
fn run_script(python: &Path, script: &str, args: &[&str], env: &[(&str, &str)]) -> (String, Trace) {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(python);
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy();
        if k.starts_with("ISOLATE_") || k.starts_with("LD_") || k.starts_with("PYTHON") {
            cmd.env_remove(k.as_ref());
        }
    }
    cmd.current_dir(dir.path())
        .env("LD_LIBRARY_PATH", standin_dir())
        .env("LD_PRELOAD", preload_path())
        .env("ISOLATE_TRACE", dir.path().join("isolate-%p.trace"))
        .arg(workspace_root().join("tests/programs").join(script))
        .args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success(),
        "{}: {stdout}\n{stderr}",
        python.display()
    );
    assert!(
        !stderr.contains("Python frames"),
        "{}: Python frames were turned off: {stderr}",
        python.display()
    );
    let traces: Vec<PathBuf> = std::fs::read_dir(dir.path())
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "trace"))
        .collect();
    assert_eq!(traces.len(), 1, "{traces:?}");
    (stdout, Trace::read(&traces[0]))
}

/// `tests/programs/pystep.py`, the hot path's benchmark from Python (docs/performance.md),
/// runs in isolate mode's two tiers with every call succeeding and its trace clean: each of
/// its 10 steps' (5 of warm-up) 32 tensors allocated and freed, no stale write or launch.
#[test]
fn the_python_step_benchmark_runs_clean_in_both_tiers() {
    let Some((_, python)) = pythons().into_iter().next() else {
        skip("no CPython 3.10 - 3.13 found: pystep.py is not run");
        return;
    };
    // pystep.py with `args` in isolate mode's `tier`.
    let pystep = |tier: &str, args: &[&str]| {
        let env = [
            ("ISOLATE_MODE", "isolate"),
            ("ISOLATE_CHECK", tier),
            ("STANDIN_SYNC", "1"),
        ];
        run_script(&python, "pystep.py", args, &env)
    };
    for tier in ["full", "fast"] {
        let (stdout, t) = pystep(tier, &["5", "32", "3", "256"]);
        assert!(
            stdout.starts_with("steps 5 tensors 32 us_per_step ")
                && stdout.trim_end().ends_with(" failed 0"),
            "{tier}: {stdout}"
        );
        assert!(t.violations().is_empty(), "{tier}: {:?}", t.violations());
        assert!(t.stale_launches().is_empty(), "{tier}");
        let allocs = events_of(&t, Api::CudaMallocAsync);
        let frees = events_of(&t, Api::CudaFreeAsync);
        assert_eq!((allocs.len(), frees.len()), (10 * 32, 10 * 32), "{tier}");
        assert!(allocs.iter().chain(&frees).all(|e| e.result == 0), "{tier}");
        // The native walks from Python (through ctypes and libffi, whose frames unwind through
        // a saved frame pointer) are replayed after the first of each: 3 walked here. A free
        // walks none (its stack is its Python frames), and an allocation's stack is looked up
        // by a key read in one pass, whose walk is the one replayed: one walk an allocation.
        let note = stacks_note(&t);
        let num = |after: &str| note_number(&note, after);
        let (replayed, walked) = (num("native frames: "), num("remembered walks, "));
        assert!(replayed >= 300 && walked <= 20, "{tier}: {note}");
        let s = Stacks::of(&t);
        let native = |e: &Event| {
            s.get(e.stack)
                .frames
                .iter()
                .filter(|f| matches!(f, Frame::Native(_)))
                .count()
        };
        assert!(allocs.iter().all(|e| native(e) > 0), "{tier}");
        assert!(
            frees.iter().all(|e| native(e) == 0 && e.stack != 0),
            "{tier}"
        );
    }
    // 30 Python calls deep, in both tiers: every allocation's native frames (ctypes and
    // libffi: `ffi_call_unix64` unwinds only on framehop's slow path, its CFA being rbp + 32)
    // lie in loaded objects, and there are more than two of them. Until the twenty-fifth
    // session a walk whose reader refused a word there left framehop's frame-pointer fallback
    // cached for the address, and every later stack of the thread read a stack address as the
    // return address after libffi's frame: two native frames, the second in no module.
    for tier in ["full", "fast"] {
        let (_, t) = pystep(tier, &["2", "40", "30", "256"]);
        let s = Stacks::of(&t);
        let allocs = events_of(&t, Api::CudaMallocAsync);
        assert_eq!(allocs.len(), 7 * 40, "{tier}");
        for e in &allocs {
            let st = s.get(e.stack);
            let native: Vec<u64> = st
                .frames
                .iter()
                .take_while(|f| matches!(f, Frame::Native(_)))
                .filter_map(|f| match f {
                    Frame::Native(pc) if *pc != 0 => Some(*pc),
                    _ => None,
                })
                .collect();
            assert!(
                native.len() >= 4 && native.iter().all(|&pc| s.module(pc).is_some()),
                "{tier}: {:x?}",
                st.frames
            );
        }
    }
    // Every native frame asked for: a free keeps its native frames too.
    let env = [
        ("ISOLATE_MODE", "isolate"),
        ("ISOLATE_NATIVE_FRAMES", "all"),
        ("STANDIN_SYNC", "1"),
    ];
    let (_, t) = run_script(&python, "pystep.py", &["2", "8", "3", "256"], &env);
    let s = Stacks::of(&t);
    let frees = events_of(&t, Api::CudaFreeAsync);
    assert_eq!(frees.len(), 7 * 8);
    for e in &frees {
        let st = s.get(e.stack);
        assert!(
            st.frames
                .iter()
                .any(|f| matches!(f, Frame::Native(pc) if *pc != 0))
                && st.frames.iter().any(|f| matches!(f, Frame::Python { .. })),
            "{:?}",
            st.frames
        );
    }
}

/// A thread's walk takes from its last walk what it read of the frames the two have in
/// common (the same frame, code object and instruction: python.rs `Memo`). Stacks that differ
/// from the one before in one frame each — the innermost function, the line of an outer
/// frame, the depth, deeper and shallower — must each still name their own frames, in both
/// tiers and in log mode.
#[test]
fn each_python_stack_names_its_own_frames_when_the_walk_before_shares_most_of_them() {
    let pythons = pythons();
    if pythons.is_empty() {
        skip("no CPython 3.10 - 3.13 found: Python frames are not tested");
        return;
    }
    let script = workspace_root().join("tests/programs/stacks.py");
    let script = script.to_string_lossy().into_owned();
    let text = std::fs::read_to_string(&script).unwrap();
    let line_of = |marker: &str| {
        1 + text
            .lines()
            .position(|l| l.trim_end().ends_with(&format!("# {marker}")))
            .unwrap() as u32
    };
    for (version, python) in &pythons {
        // The fast tier too: it looks a stack it has seen up by a key read in one pass over
        // the frames (stacks/mod.rs `quick`), which must tell each of these apart as well.
        for mode in ["isolate", "fast", "log"] {
            let env: &[(&str, &str)] = match mode {
                "fast" => &[("ISOLATE_MODE", "isolate"), ("ISOLATE_CHECK", "fast")],
                _ => &[("ISOLATE_MODE", mode)],
            };
            let (stdout, t) = run_python(python, &["walks"], env);
            let s = Stacks::of(&t);
            let mut syms = Symbols::default();
            let mallocs = events_of(&t, Api::CudaMalloc);
            let want: Vec<&str> = stdout.lines().filter(|l| l.starts_with("walk ")).collect();
            assert_eq!(mallocs.len(), want.len(), "{stdout}");
            assert_eq!(want.len(), 24);
            let mut distinct = std::collections::HashSet::new();
            for (e, w) in mallocs.iter().zip(&want) {
                let f: Vec<&str> = w.split_whitespace().collect();
                let (site, nests, caller): (&str, usize, u32) =
                    (f[1], f[2].parse().unwrap(), f[3].parse().unwrap());
                let words = s.render(e.stack, &mut syms);
                let py: Vec<&String> = words.iter().filter(|w| w.starts_with("py ")).collect();
                let ctx = format!("Python {version}, {mode}, {w}: {py:#?}");
                let site_line = line_of(if site == "site_a" { "SITE_A" } else { "SITE_B" });
                assert_eq!(*py[0], format!("py {site} ({script}:{site_line})"), "{ctx}");
                // The innermost nest calls the site; the others call nest.
                let at = |m: &str| format!("py nest ({script}:{})", line_of(m));
                assert_eq!(*py[1], at("CALL_SITE"), "{ctx}");
                for w in &py[2..=nests] {
                    assert_eq!(**w, at("NEST"), "{ctx}");
                }
                assert_eq!(
                    *py[nests + 1],
                    format!("py walks ({script}:{caller})"),
                    "{ctx}"
                );
                assert!(py[nests + 2].starts_with("py main ("), "{ctx}");
                assert_eq!(py.len(), nests + 4, "{ctx}");
                distinct.insert(py.iter().map(|w| w.to_string()).collect::<Vec<_>>());
            }
            // Two callers' lines × the seven (site, depth) pairs of each round, in Python frames
            // (the native frames may differ too: ctypes' first calls take other paths).
            assert_eq!(distinct.len(), 14, "Python {version}, {mode}");
        }
    }
}

#[test]
fn python_frames_name_function_file_and_line_with_and_without_the_gil() {
    let pythons = pythons();
    if pythons.is_empty() {
        skip(
            "no CPython 3.10 - 3.13 found (python3, python3.1x on PATH, ~/.pyenv): Python frames are not tested",
        );
        return;
    }
    let script = workspace_root().join("tests/programs/stacks.py");
    let script = script.to_string_lossy().into_owned();
    for (version, python) in &pythons {
        eprintln!("Python {version}: {}", python.display());
        let (stdout, t) = run_python(python, &["both"], &[]);
        let s = Stacks::of(&t);
        let mut syms = Symbols::default();
        let lines: Vec<&str> = stdout.lines().collect();
        assert_eq!(lines.len(), 6, "{stdout}");
        let mallocs = events_of(&t, Api::CudaMalloc);
        let frees = events_of(&t, Api::CudaFree);
        assert_eq!((mallocs.len(), frees.len()), (3, 3));
        // cdll, pydll, thread: in that order in the output and the trace.
        for (i, how) in ["cdll", "pydll", "thread"].iter().enumerate() {
            for (e, func) in [
                (&mallocs[i], "allocate_tensor"),
                (&frees[i], "release_tensor"),
            ] {
                let want = lines
                    .iter()
                    .find(|l| l.starts_with(&format!("{how} {func} line ")))
                    .unwrap();
                let line: u32 = want.split_whitespace().nth(3).unwrap().parse().unwrap();
                let words = s.render(e.stack, &mut syms);
                let py: Vec<&String> = words.iter().filter(|w| w.starts_with("py ")).collect();
                let ctx = format!("Python {version}, {how}: {words:#?}");
                assert_eq!(*py[0], format!("py {func} ({script}:{line})"), "{ctx}");
                assert!(py[1].starts_with("py training_step ("), "{ctx}");
                if *how == "thread" {
                    assert!(py.iter().any(|w| w.contains("run (")), "{ctx}");
                } else {
                    assert!(py[2].starts_with("py main ("), "{ctx}");
                    assert!(py[3].starts_with("py <module> ("), "{ctx}");
                }
                // Merged: native frames below the innermost Python frame (ctypes, libffi),
                // and none of the evaluation loop left where Python frames replaced it. A
                // free's stack is its Python frames alone.
                let first_py = words.iter().position(|w| w.starts_with("py ")).unwrap();
                if func == "release_tensor" {
                    assert_eq!(first_py, 0, "{ctx}");
                } else {
                    assert!(first_py > 0, "{ctx}");
                }
                assert!(
                    !words.iter().any(|w| w == "_PyEval_EvalFrameDefault"),
                    "{ctx}"
                );
                assert!(!s.get(e.stack).truncated, "{ctx}");
            }
        }
        // Python only: the Python frames and nothing else.
        let (_, t) = run_python(python, &["cdll"], &[("ISOLATE_STACKS", "python")]);
        let s = Stacks::of(&t);
        let e = &events_of(&t, Api::CudaMalloc)[0];
        let st = s.get(e.stack);
        assert!(st.frames.iter().all(|f| matches!(f, Frame::Python { .. })));
        assert_eq!(
            st.frames.len(),
            4,
            "{version}: {:?}",
            s.render(e.stack, &mut syms)
        );
        // Native only: no Python frames, no code objects.
        let (_, t) = run_python(python, &["cdll"], &[("ISOLATE_STACKS", "native")]);
        assert!(!t.records.iter().any(|r| matches!(r, Record::PyCode(_))));
        let s = Stacks::of(&t);
        let e = &events_of(&t, Api::CudaMalloc)[0];
        let words = s.render(e.stack, &mut syms);
        assert!(
            words.iter().any(|w| w == "_PyEval_EvalFrameDefault"),
            "{version}: {words:#?}"
        );
        // The fast tier walks at most 4 native frames before a thread's Python frames (then
        // the frame that says the rest were left out); the Python frames are all there. The
        // full tier walks more of them here (ctypes, libffi).
        let native_before_python = |env: &[(&str, &str)]| {
            let (_, t) = run_python(python, &["cdll"], env);
            let s = Stacks::of(&t);
            let e = &events_of(&t, Api::CudaMalloc)[0];
            let st = s.get(e.stack);
            let n = st
                .frames
                .iter()
                .position(|f| matches!(f, Frame::Python { .. }))
                .expect("Python frames");
            let py = st.frames[n..]
                .iter()
                .filter(|f| matches!(f, Frame::Python { .. }))
                .count();
            (n, py)
        };
        let full = native_before_python(&[("ISOLATE_MODE", "isolate")]);
        let fast = native_before_python(&[("ISOLATE_MODE", "isolate"), ("ISOLATE_CHECK", "fast")]);
        assert!(full.0 > 5, "{version}: full tier {full:?}");
        assert_eq!(
            fast,
            (5, full.1),
            "{version}: fast tier {fast:?}, full {full:?}"
        );
    }
}

/// A stale launch gets the launching thread's stack (`StackOf`), captured only then.
#[test]
fn a_stale_launch_has_the_launching_threads_stack() {
    let out = Run::program("guard")
        .arg("stale")
        .env("ISOLATE_MODE", "isolate")
        .run();
    out.assert_success();
    let t = out.only_trace();
    let s = Stacks::of(t);
    let mut syms = Symbols::default();
    let launches = t.stale_launches();
    // k_use's own parameter is exactly the freed A: a stale launch; k_ignore's A inside its
    // struct is a suspect (the evidence rule), which gets its stack too.
    assert_eq!(launches.len(), 1, "{}", out.stderr);
    let of: HashMap<u64, u32> = t
        .records
        .iter()
        .filter_map(|r| match r {
            Record::StackOf(so) => Some((so.seq, so.stack)),
            _ => None,
        })
        .collect();
    assert_eq!(
        of.len(),
        2,
        "one StackOf per stale launch or suspect, none for clean launches"
    );
    let by_seq = events_by_seq(t);
    for l in &launches {
        let id = of[&l.seq];
        let words = s.render(id, &mut syms);
        // guard.c's `stale` is static and may be inlined into main; either names the launch.
        assert!(
            words.iter().take(3).any(|w| w == "stale" || w == "main"),
            "{words:?}"
        );
        // Format 3: the record carries the allocation's and the free's own stack ids.
        let (a, f) = (&by_seq[&l.alloc_seq], &by_seq[&l.free_seq]);
        assert_ne!((a.stack, f.stack), (0, 0), "{l:?}");
        assert_eq!((l.alloc_stack, l.free_stack), (a.stack, f.stack), "{l:?}");
    }
}

/// The events by sequence number.
fn events_by_seq(t: &Trace) -> HashMap<u64, Event> {
    t.events().into_iter().map(|e| (e.seq, e)).collect()
}

/// Trace format 3: a stale write's `Violation` carries the stack ids of the allocation and of
/// the free, the ids of those two events' own stacks. Here it is found at exit after 70,000
/// later allocations and frees, when the analyzer's slots of recent frees (65,536, by
/// allocation number) no longer hold the freed allocation: the summary still names both call
/// sites, from the ids alone. With the ids 0 (what the library wrote before), it named neither.
#[test]
fn a_stale_write_found_after_65536_later_allocations_still_names_both_sites() {
    let n = 70_000;
    let out = Run::program("stacks")
        .args(["late", &n.to_string()])
        .env("ISOLATE_MODE", "isolate")
        .timeout(std::time::Duration::from_secs(300))
        .run();
    out.assert_success();
    let t = out.only_trace();
    t.assert_complete(EndReason::Exit);
    let vs = t.violations();
    assert_eq!(vs.len(), 1, "the stale write is found: {}", out.stderr);
    let v = &vs[0];
    let by_seq = events_by_seq(t);
    let (a, f) = (&by_seq[&v.alloc_seq], &by_seq[&v.free_seq]);
    assert_eq!((a.api, f.api), (Api::CudaMalloc, Api::CudaFree));
    assert!(a.stack != 0 && f.stack != 0, "{a:?} {f:?}");
    assert_ne!(a.stack, f.stack);
    assert_eq!((v.alloc_stack, v.free_stack), (a.stack, f.stack), "{v:?}");
    // Found long after: more than 65,536 allocations were made and freed between the free and
    // the record, so the analyzer's slot for this allocation was taken by a later one.
    let at = t
        .records
        .iter()
        .position(|r| matches!(r, Record::Violation(_)))
        .unwrap();
    let freed_since = t.records[..at]
        .iter()
        .filter(|r| matches!(r, Record::Event(e) if e.api == Api::CudaFree && e.seq > v.free_seq))
        .count();
    assert!(
        freed_since > 65_536,
        "{freed_since} frees before the finding"
    );
    // The analyzer names where the memory was allocated and freed (the program's functions,
    // through its symbol table).
    let s = t.analyzer_summary();
    let pv = &s["poison_violations"][0];
    for (field, id, func) in [
        ("alloc_stack", a.stack, "stacks_make_buffer"),
        ("free_stack", f.stack, "stacks_release_buffer"),
    ] {
        assert_eq!(pv[field]["id"].as_u64(), Some(id as u64), "{field}: {pv:#}");
        let site = pv[field]["site"]
            .as_str()
            .unwrap_or_else(|| panic!("no {field}: {pv:#}"));
        assert!(site.contains(func), "{field}: {site}");
    }
}

/// `ISOLATE_STACKS=none`: the `Violation` carries no stack ids (0, "no stack").
#[test]
fn stacks_none_leaves_the_violations_stack_ids_0() {
    let out = Run::program("stacks")
        .arg("stale")
        .env("ISOLATE_MODE", "isolate")
        .env("ISOLATE_STACKS", "none")
        .run();
    out.assert_success();
    let t = out.only_trace();
    let vs = t.violations();
    assert_eq!(vs.len(), 1, "the stale write is found: {}", out.stderr);
    assert_eq!((vs[0].alloc_stack, vs[0].free_stack), (0, 0));
}
