//! Call stacks (trace format version 2): offline symbolisation of a real ELF built here (`cc
//! -O2` without and with `-g`), build-id mismatches, Python frames, and the places stacks show:
//! `summary` (stale writes, stale launches, invalid and double frees, memory by site), `sites`,
//! `who`, `graph --format json`, `diff`/`check` by site; version-1 traces say they have none.

mod common;

use common::{A, MIB, TraceBuilder, header, isolate};
use isolate_analyzer::stacks::{self, StackTable, Symbolizer};
use isolate_trace::{
    Api, Event, Frame, Module, PyCode, Record, Stack, StackOf, StaleLaunch, Violation,
};
use object::{Object, ObjectSymbol};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The program: two named functions that allocate and free, on lines the tests check.
const PROG: &str = r#"#include <stdlib.h>
#include <stdio.h>
__attribute__((noinline)) void *make_buffer(size_t n) {
    void *p = malloc(n);
    if (p) ((volatile char *)p)[0] = 1;
    return p;
}
__attribute__((noinline)) void drop_buffer(void *p) {
    free(p);
    printf("freed\n");
}
int main(int argc, char **argv) {
    (void)argv;
    void *p = make_buffer((size_t)argc * 100);
    drop_buffer(p);
    return 0;
}
"#;

/// The load bias the tests pretend the program was loaded at.
const BASE: u64 = 0x5555_0000_0000;

/// A program built from [`PROG`] with `flags`, and what the tests need of it.
struct Built {
    path: PathBuf,
    build_id: Vec<u8>,
    /// Function name → (file address, size).
    funcs: Vec<(String, u64, u64)>,
    /// Lowest and highest file address of the loaded segments.
    span: (u64, u64),
}

impl Built {
    fn new(dir: &Path, name: &str, flags: &[&str]) -> Built {
        Built::from_source(dir, name, flags, PROG, "prog.c")
    }

    fn from_source(dir: &Path, name: &str, flags: &[&str], source: &str, file: &str) -> Built {
        let src = dir.join(file);
        std::fs::write(&src, source).unwrap();
        let path = dir.join(name);
        let st = Command::new("cc")
            .args(flags)
            .arg("-Wl,--build-id")
            .arg("-o")
            .arg(&path)
            .arg(&src)
            .status()
            .expect("cc runs");
        assert!(st.success(), "cc {flags:?} failed");
        let data = std::fs::read(&path).unwrap();
        let o = object::File::parse(&*data).unwrap();
        let build_id = o.build_id().unwrap().unwrap_or_default().to_vec();
        let funcs = o
            .symbols()
            .filter(|s| s.kind() == object::SymbolKind::Text && s.size() > 0)
            .filter_map(|s| Some((s.name().ok()?.to_owned(), s.address(), s.size())))
            .collect();
        use object::ObjectSegment;
        let lo = o.segments().map(|s| s.address()).min().unwrap();
        let hi = o.segments().map(|s| s.address() + s.size()).max().unwrap();
        Built {
            path,
            build_id,
            funcs,
            span: (lo, hi),
        }
    }

    /// A return address inside `name` (as the unwinder would record it: symbolised at -1).
    fn ret_in(&self, name: &str) -> u64 {
        let (_, a, size) = self
            .funcs
            .iter()
            .find(|f| f.0 == name)
            .unwrap_or_else(|| panic!("no {name} in {:?}", self.funcs));
        BASE + a + size / 2 + 1
    }

    fn module(&self, id: u32) -> Module {
        Module {
            id,
            path: self.path.display().to_string(),
            base: BASE,
            start: BASE + self.span.0,
            end: BASE + self.span.1,
            build_id: self.build_id.clone(),
        }
    }
}

/// A module that is not on this machine, the way the CUDA runtime's would be.
fn cudart() -> Module {
    Module {
        id: 9,
        path: "/nonexistent/lib/libcudart.so.13".into(),
        base: 0x7f00_1000_0000,
        start: 0x7f00_1000_0000,
        end: 0x7f00_1100_0000,
        build_id: vec![1, 2, 3, 4],
    }
}

const CUDART_FRAME: u64 = 0x7f00_1000_1234;

fn table_of(recs: &[Record]) -> StackTable {
    let mut t = StackTable::new();
    for r in recs {
        assert!(t.record(r));
    }
    t
}

fn stack(id: u32, frames: Vec<Frame>) -> Record {
    Record::Stack(Stack {
        id,
        frames,
        truncated: false,
    })
}

#[test]
fn o2_without_debug_info_gives_function_names() {
    let dir = tempfile::tempdir().unwrap();
    let b = Built::new(dir.path(), "prog_o2", &["-O2", "-fomit-frame-pointer"]);
    let t = table_of(&[
        Record::Module(b.module(1)),
        Record::Module(cudart()),
        stack(
            1,
            vec![
                Frame::Native(CUDART_FRAME),
                Frame::Native(b.ret_in("make_buffer")),
                Frame::Native(b.ret_in("main")),
            ],
        ),
    ]);
    let s = Symbolizer::new().stack(&t, 1);
    let names: Vec<_> = s.frames.iter().map(|f| f.function.clone()).collect();
    assert_eq!(
        names,
        [None, Some("make_buffer".into()), Some("main".into())],
        "{s:#?}"
    );
    // No DWARF: no file:line, the module and offset instead.
    assert_eq!(s.frames[1].file, None);
    assert!(
        s.frames[1].label().starts_with("make_buffer (prog_o2+0x"),
        "{}",
        s.frames[1].label()
    );
    // The runtime frame is hidden and its missing file said once.
    assert!(s.frames[0].hidden);
    assert_eq!(s.hidden, 1);
    assert_eq!(s.site, s.frames[1].label());
    assert_eq!(s.problems.len(), 1, "{:?}", s.problems);
    assert!(
        s.problems[0].contains("libcudart.so.13: no such file"),
        "{:?}",
        s.problems
    );
}

#[test]
fn with_debug_info_gives_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let b = Built::new(dir.path(), "prog_g", &["-O2", "-g"]);
    let t = table_of(&[
        Record::Module(b.module(1)),
        stack(
            1,
            vec![
                Frame::Native(b.ret_in("make_buffer")),
                Frame::Native(b.ret_in("drop_buffer")),
            ],
        ),
    ]);
    let s = Symbolizer::new().stack(&t, 1);
    let make = s
        .frames
        .iter()
        .find(|f| f.function.as_deref() == Some("make_buffer"))
        .unwrap_or_else(|| panic!("{s:#?}"));
    assert!(
        make.file.as_deref().unwrap().ends_with("prog.c"),
        "{make:?}"
    );
    let line = make.line.unwrap();
    assert!(
        (3..=6).contains(&line),
        "make_buffer is on lines 3-6, got {line}"
    );
    assert!(make.label().contains("prog.c:"), "{}", make.label());
    let drop = s
        .frames
        .iter()
        .find(|f| f.function.as_deref() == Some("drop_buffer"));
    let dl = drop
        .and_then(|f| f.line)
        .unwrap_or_else(|| panic!("{s:#?}"));
    assert!(
        (7..=10).contains(&dl),
        "drop_buffer is on lines 7-10, got {dl}"
    );
}

#[test]
fn a_build_id_mismatch_is_said_and_not_symbolised() {
    let dir = tempfile::tempdir().unwrap();
    let b = Built::new(dir.path(), "prog", &["-O2"]);
    let mut m = b.module(1);
    m.build_id = vec![0xde, 0xad, 0xbe, 0xef];
    let t = table_of(&[
        Record::Module(m),
        stack(1, vec![Frame::Native(b.ret_in("make_buffer"))]),
    ]);
    let s = Symbolizer::new().stack(&t, 1);
    assert_eq!(
        s.frames[0].function, None,
        "a wrong file gives wrong names: none"
    );
    assert!(
        s.problems
            .iter()
            .any(|p| p.contains("build id") && p.contains("deadbeef")),
        "{:?}",
        s.problems
    );
    assert!(
        s.frames[0].label().starts_with("prog+0x"),
        "{}",
        s.frames[0].label()
    );
}

#[test]
fn the_search_path_finds_a_moved_file() {
    let dir = tempfile::tempdir().unwrap();
    let b = Built::new(dir.path(), "prog", &["-O2"]);
    let mut m = b.module(1);
    m.path = "/opt/elsewhere/bin/prog".into();
    let t = table_of(&[
        Record::Module(m),
        stack(1, vec![Frame::Native(b.ret_in("drop_buffer"))]),
    ]);
    let missing = Symbolizer::new().stack(&t, 1);
    assert!(missing.problems[0].contains("no such file"), "{missing:?}");
    let s = Symbolizer::new()
        .with_search_path(vec![dir.path().to_owned()])
        .stack(&t, 1);
    assert_eq!(
        s.frames[0].function.as_deref(),
        Some("drop_buffer"),
        "{s:#?}"
    );
}

fn py_records() -> Vec<Record> {
    vec![
        Record::PyCode(PyCode {
            id: 1,
            file: "/work/train.py".into(),
            name: "Model.step".into(),
            first_line: 10,
        }),
        Record::PyCode(PyCode {
            id: 2,
            file: "/work/train.py".into(),
            name: "<module>".into(),
            first_line: 1,
        }),
        Record::Module(cudart()),
        stack(
            1,
            vec![
                Frame::Native(CUDART_FRAME),
                Frame::Python { code: 1, line: 14 },
                Frame::Python { code: 2, line: 40 },
            ],
        ),
    ]
}

#[test]
fn python_frames_read_file_line_in_function() {
    let t = table_of(&py_records());
    let s = Symbolizer::new().stack(&t, 1);
    assert_eq!(s.site, "/work/train.py:14 in Model.step");
    let labels: Vec<String> = s.visible().map(|f| f.label()).collect();
    assert_eq!(
        labels,
        [
            "/work/train.py:14 in Model.step",
            "/work/train.py:40 in <module>"
        ]
    );
    let exported = stacks::export_frames(&t, 1);
    assert_eq!(exported.len(), 3);
    assert_eq!(
        exported[1],
        ("/work/train.py".to_owned(), 14, "Model.step".to_owned())
    );
    assert_eq!(exported[0].0, "/nonexistent/lib/libcudart.so.13");
    assert!(stacks::export_frames(&t, 0).is_empty());
}

/// A v2 trace in isolate mode: allocation and free from the program's two functions, a stale
/// write found on it, a kernel launched into it (with its own stack), and a double free.
fn stale_trace(dir: &Path, b: &Built) -> PathBuf {
    let mut h = header(4242, &["./prog"]);
    h.mode = "isolate".into();
    let mut t = TraceBuilder::with_header(h);
    t.record(Record::Module(b.module(1)));
    t.record(Record::Module(cudart()));
    let frames = |f: &str| {
        vec![
            Frame::Native(CUDART_FRAME),
            Frame::Native(b.ret_in(f)),
            Frame::Native(b.ret_in("main")),
        ]
    };
    t.record(stack(1, frames("make_buffer")));
    t.record(stack(2, frames("drop_buffer")));
    t.record(stack(3, vec![Frame::Native(b.ret_in("main"))]));
    let alloc = t.call_from(Api::CudaMalloc, A, 4 * MIB, 1);
    let free = t.call_from(Api::CudaFree, A, 0, 2);
    t.record(Record::StackOf(StackOf {
        seq: t.seq,
        stack: 3,
    }));
    let launch_seq = t.seq;
    t.record(Record::StaleLaunch(StaleLaunch {
        seq: launch_seq,
        ts_ns: t.ts,
        tid: 1000,
        api: Api::CuLaunchKernel,
        kernel: "stale_fill".into(),
        ptr: A,
        alloc_ptr: A,
        alloc_size: 4 * MIB,
        alloc_seq: alloc,
        free_seq: free,
        ..StaleLaunch::default()
    }));
    t.seq += 1;
    // The double free, from main.
    t.event(Event {
        api: Api::CudaFree,
        ptr: A,
        result: 1,
        stack: 3,
        ..Event::default()
    });
    t.record(Record::Violation(Violation {
        seq: t.seq,
        ts_ns: t.ts,
        ptr: A,
        size: 4 * MIB,
        first_offset: 4096,
        changed_bytes: 4096,
        alloc_seq: alloc,
        free_seq: free,
        free_api: Api::CudaFree,
        ..Violation::default()
    }));
    t.seq += 1;
    t.end(Default::default());
    t.write(dir, "stale.trace")
}

#[test]
fn summary_names_the_stacks_of_a_stale_write_launch_and_double_free() {
    let dir = tempfile::tempdir().unwrap();
    let b = Built::new(dir.path(), "prog", &["-O2"]);
    let p = stale_trace(dir.path(), &b);
    let out = isolate(dir.path(), &["summary", p.to_str().unwrap()]);
    if let Some(keep) = std::env::var_os("ISOLATE_KEEP_STACKS_EXAMPLE") {
        // For the documentation: the same trace with a program built with -g.
        let g = Built::new(dir.path(), "prog_g", &["-O2", "-g"]);
        let t = stale_trace(dir.path(), &g);
        std::fs::copy(&t, Path::new(&keep).join("stale.trace")).unwrap();
        std::fs::copy(&g.path, Path::new(&keep).join("prog_g")).unwrap();
    }
    assert_eq!(out.code, 0, "{}{}", out.stdout, out.stderr);
    let text = &out.stdout;
    let after = |what: &str| -> &str {
        let i = text
            .find(what)
            .unwrap_or_else(|| panic!("no {what:?} in\n{text}"));
        &text[i..]
    };
    let sw = after("STALE WRITE");
    let alloc_at = sw.find("allocated at    make_buffer (prog+0x").expect(text);
    let free_at = sw.find("freed at        drop_buffer (prog+0x").expect(text);
    assert!(alloc_at < free_at);
    assert!(
        after("STALE LAUNCH").contains("launched at     main (prog+0x"),
        "{text}"
    );
    let df = after("DOUBLE FREE");
    assert!(df.contains("freed again at  main (prog+0x"), "{text}");
    assert!(df.contains("first freed at  drop_buffer"), "{text}");
    assert!(df.contains("allocated at    make_buffer"), "{text}");
    assert!(text.contains("1 hidden frame (CUDA"), "{text}");
    assert!(text.contains("libcudart.so.13: no such file"), "{text}");
    assert!(!text.contains("no call stacks"), "{text}");

    let j = isolate(dir.path(), &["summary", "--json", p.to_str().unwrap()]).json();
    let v = &j["poison_violations"][0];
    assert_eq!(
        v["alloc_stack"]["site"].as_str().unwrap().split(' ').next(),
        Some("make_buffer")
    );
    assert_eq!(
        v["free_stack"]["site"].as_str().unwrap().split(' ').next(),
        Some("drop_buffer")
    );
    // JSON has every frame, the hidden one too.
    assert_eq!(v["alloc_stack"]["frames"].as_array().unwrap().len(), 3);
    assert_eq!(v["alloc_stack"]["frames"][0]["hidden"], true);
    let s = &j["stale_launches"][0];
    assert!(
        s["launch_stack"]["site"]
            .as_str()
            .unwrap()
            .starts_with("main")
    );
    assert!(
        s["free_stack"]["site"]
            .as_str()
            .unwrap()
            .starts_with("drop_buffer")
    );
    let f = &j["invalid_frees"][0];
    assert_eq!(f["double_free"], true);
    assert!(f["stack"]["site"].as_str().unwrap().starts_with("main"));
    assert!(
        f["first_free_stack"]["site"]
            .as_str()
            .unwrap()
            .starts_with("drop_buffer")
    );
}

#[test]
fn an_invalid_free_names_its_stack() {
    let dir = tempfile::tempdir().unwrap();
    let mut t = TraceBuilder::new();
    t.record(Record::PyCode(PyCode {
        id: 1,
        file: "bug.py".into(),
        name: "release".into(),
        first_line: 3,
    }));
    t.record(stack(5, vec![Frame::Python { code: 1, line: 7 }]));
    t.event(Event {
        api: Api::CudaFree,
        ptr: A,
        result: 1,
        stack: 5,
        ..Event::default()
    });
    let p = t.write(dir.path(), "inv.trace");
    let out = isolate(dir.path(), &["summary", p.to_str().unwrap()]);
    assert!(out.stdout.contains("INVALID FREE"), "{}", out.stdout);
    assert!(
        out.stdout.contains("freed at        bug.py:7 in release"),
        "{}",
        out.stdout
    );
}

/// Three sites: A makes 1 allocation of 64 MiB, B 100 of 1 MiB, C 10 of 1 KiB; A's is freed
/// before the end; B's and C's are held.
fn sites_trace(dir: &Path, name: &str, b_calls: u64) -> PathBuf {
    let mut t = TraceBuilder::new();
    for (id, line) in [(1, 10), (2, 20), (3, 30)] {
        t.record(Record::PyCode(PyCode {
            id,
            file: "model.py".into(),
            name: format!("site_{id}"),
            first_line: line,
        }));
        t.record(stack(id, vec![Frame::Python { code: id, line }]));
    }
    t.call_from(Api::CudaMalloc, A, 64 * MIB, 1);
    for i in 0..b_calls {
        t.call_from(Api::CudaMalloc, A + (1 + i) * 2 * MIB + 0x1000_0000, MIB, 2);
    }
    t.call_from(Api::CudaFree, A, 0, 1);
    for i in 0..10 {
        t.call_from(Api::CudaMalloc, A + 0x4000_0000 + i * 4096, 1024, 3);
    }
    t.end(Default::default());
    t.write(dir, name)
}

#[test]
fn sites_rank_by_bytes_and_by_calls() {
    let dir = tempfile::tempdir().unwrap();
    let p = sites_trace(dir.path(), "sites.trace", 100);
    if let Some(keep) = std::env::var_os("ISOLATE_KEEP_STACKS_EXAMPLE") {
        std::fs::copy(&p, Path::new(&keep).join("sites.trace")).unwrap();
    }
    let by_bytes = isolate(dir.path(), &["sites", "--json", p.to_str().unwrap()]).json();
    let names: Vec<&str> = by_bytes["sites"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["site"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "model.py:20 in site_2",
            "model.py:10 in site_1",
            "model.py:30 in site_3"
        ]
    );
    let first = &by_bytes["sites"][0];
    assert_eq!(first["allocations"], 100);
    assert_eq!(first["bytes"], 100 * MIB);
    assert_eq!(first["held_at_end"]["count"], 100);
    assert_eq!(by_bytes["sites"][1]["held_at_end"]["count"], 0);
    assert_eq!(by_bytes["sites"][1]["peak_live_bytes"], 64 * MIB);
    let by_calls = isolate(
        dir.path(),
        &[
            "sites",
            "--by",
            "calls",
            "--top",
            "2",
            "--json",
            p.to_str().unwrap(),
        ],
    )
    .json();
    let names: Vec<&str> = by_calls["sites"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["site"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["model.py:20 in site_2", "model.py:30 in site_3"]);
    let text = isolate(dir.path(), &["sites", p.to_str().unwrap()]);
    assert_eq!(text.code, 0, "{}", text.stderr);
    let l = text
        .stdout
        .lines()
        .position(|l| l.contains("site_2"))
        .unwrap();
    let m = text
        .stdout
        .lines()
        .position(|l| l.contains("site_1"))
        .unwrap();
    assert!(l < m, "{}", text.stdout);

    // The summary ranks what is held at the end and at the peak by site.
    let s = isolate(dir.path(), &["summary", "--json", p.to_str().unwrap()]).json();
    assert_eq!(s["sites_at_end"][0]["site"], "model.py:20 in site_2");
    assert_eq!(s["sites_at_end"][0]["bytes"], 100 * MIB);
    assert_eq!(s["sites_at_peak"][0]["site"], "model.py:20 in site_2");
    assert_eq!(s["sites_at_peak"][1]["site"], "model.py:10 in site_1");
    assert_eq!(s["sites_at_peak"][1]["bytes"], 64 * MIB);
    let st = isolate(dir.path(), &["summary", p.to_str().unwrap()]).stdout;
    assert!(st.contains("held at exit by allocation site"), "{st}");
}

#[test]
fn diff_and_check_compare_by_site() {
    let dir = tempfile::tempdir().unwrap();
    let base = sites_trace(dir.path(), "base.trace", 100);
    let new = sites_trace(dir.path(), "new.trace", 150);
    let d = isolate(
        dir.path(),
        &["diff", base.to_str().unwrap(), new.to_str().unwrap()],
    );
    assert!(
        d.stdout
            .contains("site model.py:20 in site_2: +50 allocations, +50.0 MiB"),
        "{}",
        d.stdout
    );
    let j = isolate(
        dir.path(),
        &[
            "diff",
            "--json",
            base.to_str().unwrap(),
            new.to_str().unwrap(),
        ],
    )
    .json();
    let sites = j["sites"].as_array().unwrap();
    assert_eq!(sites.len(), 1, "{sites:?}");
    assert_eq!(sites[0]["allocations"]["delta"], 50);
    let c = isolate(
        dir.path(),
        &[
            "check",
            new.to_str().unwrap(),
            "--baseline",
            base.to_str().unwrap(),
        ],
    );
    assert_eq!(c.code, 1, "{}", c.stdout);
    assert!(
        c.stdout.contains("model.py:20 in site_2: +50 allocations"),
        "{}",
        c.stdout
    );
}

#[test]
fn who_and_graph_show_allocation_stacks() {
    let dir = tempfile::tempdir().unwrap();
    let p = sites_trace(dir.path(), "sites.trace", 2);
    let w = isolate(
        dir.path(),
        &["who", "--json", &format!("{A:#x}"), p.to_str().unwrap()],
    )
    .json();
    let n = &w["traces"][0]["history"][0];
    assert_eq!(n["alloc_stack"]["site"], "model.py:10 in site_1", "{w:#}");
    assert_eq!(n["free_stack"]["site"], "model.py:10 in site_1");
    let wt = isolate(
        dir.path(),
        &["who", &format!("{A:#x}"), p.to_str().unwrap()],
    )
    .stdout;
    assert!(wt.contains("model.py:10 in site_1"), "{wt}");
    let g = isolate(
        dir.path(),
        &["graph", "--format", "json", p.to_str().unwrap()],
    )
    .json();
    let node = &g["nodes"][0];
    assert_eq!(node["stack"], 1, "{node:#}");
    let st = &g["traces"][0]["stacks"];
    assert_eq!(st["1"]["site"], "model.py:10 in site_1", "{g:#}");
    assert_eq!(st["2"]["site"], "model.py:20 in site_2", "{st:#}");
}

#[test]
fn version_1_traces_say_once_that_they_have_no_stacks() {
    let dir = tempfile::tempdir().unwrap();
    let mut t = TraceBuilder::new();
    t.free_refused(A, 1);
    let mut bytes = t.bytes();
    bytes[8..12].copy_from_slice(&1u32.to_le_bytes());
    let p = dir.path().join("v1.trace");
    std::fs::write(&p, bytes).unwrap();
    let out = isolate(dir.path(), &["summary", p.to_str().unwrap()]);
    assert_eq!(
        out.stdout
            .matches("no call stacks: the trace is format version 1")
            .count(),
        1,
        "{}",
        out.stdout
    );
    let j = isolate(dir.path(), &["summary", "--json", p.to_str().unwrap()]).json();
    assert!(j["invalid_frees"][0].get("stack").is_none());
    let s = isolate(dir.path(), &["sites", p.to_str().unwrap()]);
    assert_eq!(s.code, 0);
    assert!(s.stdout.contains("no call stacks"), "{}", s.stdout);
}

/// The example frames of docs/trace-format.md (version 2), byte for byte.
#[test]
fn the_documented_bytes_of_version_2_records() {
    let enc = |r: Record| {
        let mut out = Vec::new();
        isolate_trace::Encoder::new().encode(&r, &mut out);
        out
    };
    assert_eq!(
        enc(Record::Stack(Stack {
            id: 1,
            frames: vec![
                Frame::Native(0x40_1234),
                Frame::Python { code: 2, line: 14 }
            ],
            truncated: false,
        })),
        [
            0x0d, 0x0a, 0x01, 0x02, 0x00, 0xfc, 0x34, 0x12, 0x40, 0x00, 0x01, 0x02, 0x0e, 0x00
        ]
    );
    assert_eq!(
        enc(Record::PyCode(PyCode {
            id: 2,
            file: "t.py".into(),
            name: "f".into(),
            first_line: 12,
        })),
        [
            0x0a, 0x0b, 0x02, 0x04, b't', b'.', b'p', b'y', 0x01, b'f', 0x0c
        ]
    );
    assert_eq!(
        enc(Record::StackOf(StackOf { seq: 300, stack: 1 })),
        [0x05, 0x0c, 0xfb, 0x2c, 0x01, 0x01]
    );
    assert_eq!(
        enc(Record::Module(Module {
            id: 1,
            path: "/a".into(),
            base: 0,
            start: 0x1000,
            end: 0x2000,
            build_id: vec![0xab, 0xcd],
        })),
        [
            0x0f, 0x09, 0x01, 0x02, b'/', b'a', 0x00, 0xfb, 0x00, 0x10, 0xfb, 0x00, 0x20, 0x02,
            0xab, 0xcd
        ]
    );
    // An event with a stack: variant 8, the event's fields, then the stack id.
    let ev = enc(Record::Event(Event {
        api: Api::CudaMalloc,
        ptr: 0x100,
        size: 256,
        stack: 7,
        tid: 5,
        ..Event::default()
    }));
    // A Thread frame first (index 0 = tid 5), then the event.
    assert_eq!(&ev[..4], [0x03, 0x01, 0x00, 0x05]);
    assert_eq!(
        &ev[4..],
        [
            0x10, 0x08, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0xfb, 0x00, 0x02, 0xfb, 0x00,
            0x01, 0x00, 0x07
        ]
    );
}

/// A function named as PyTorch's `at::cuda::setWorkspaceForHandle` (its mangled name, given
/// with an asm label) and another one, each allocating memory held at exit by a Python
/// process in isolate mode (the cache off): the first is PyTorch's cuBLAS workspace, held for
/// the whole run (normal), the other a possible leak. Seen on the H200: every GPT-2 run's
/// summary listed three "possible leaks" that were these workspaces.
#[test]
fn pytorch_workspaces_held_at_exit_are_not_possible_leaks() {
    const SRC: &str = r#"
#include <stdlib.h>
void *ws(size_t n) __asm__("_ZN2at4cuda21setWorkspaceForHandleEv");
__attribute__((noinline)) void *ws(size_t n) {
    void *p = malloc(n);
    if (p) ((volatile char *)p)[0] = 1;
    return p;
}
__attribute__((noinline)) void *other(size_t n) {
    void *p = malloc(n + 1);
    if (p) ((volatile char *)p)[0] = 2;
    return p;
}
int main(int argc, char **argv) {
    (void)argv;
    return ws((size_t)argc) == other((size_t)argc);
}
"#;
    let dir = tempfile::tempdir().unwrap();
    let b = Built::from_source(dir.path(), "ws", &["-O2"], SRC, "ws.c");
    let mut h = header(100, &["python3", "train.py"]);
    h.exe = "/usr/bin/python3.12".into();
    h.mode = "isolate".into();
    let mut t = TraceBuilder::with_header(h);
    t.record(Record::Module(b.module(1)));
    t.record(stack(
        1,
        vec![Frame::Native(
            b.ret_in("_ZN2at4cuda21setWorkspaceForHandleEv"),
        )],
    ));
    t.record(stack(2, vec![Frame::Native(b.ret_in("other"))]));
    for (i, st) in [(0u64, 1u32), (1, 2)] {
        t.call_from(Api::CudaMallocAsync, A + i * 64 * MIB, 32 * MIB, st);
    }
    t.end(isolate_trace::Stats::default());
    let p = t.write(dir.path(), "ws.trace");
    let out = isolate(dir.path(), &["summary", "--json", p.to_str().unwrap()]);
    let j: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    let held = &j["held_at_exit"];
    assert_eq!(held["framework_workspaces"]["count"], 1, "{held:#}");
    assert_eq!(held["possible_leak"]["count"], 1, "{held:#}");
    let text = isolate(dir.path(), &["summary", p.to_str().unwrap()]).stdout;
    assert!(
        text.contains("by PyTorch for the whole run (normal): its cuBLAS and cuBLASLt workspaces"),
        "{text}"
    );
    assert!(
        text.contains("1 allocation (32.0 MiB): held by the program (information, not a finding), allocated at other ("),
        "{text}"
    );
}

/// Format version 3: a stale write carries the stacks of its allocation and free. The summary
/// takes them from the record; it used to find them only through its ring of the last 65,536
/// frees, which a busy program overwrites before the quarantine is checked (here 33,000
/// allocations later: without the ids in the record, the stacks are lost).
#[test]
fn a_stale_write_carries_its_stacks_past_the_ring() {
    let dir = tempfile::tempdir().unwrap();
    let b = Built::new(dir.path(), "prog", &["-O2"]);
    let trace = |ids: (u32, u32)| {
        let mut h = header(4242, &["./prog"]);
        h.mode = "isolate".into();
        let mut t = TraceBuilder::with_header(h);
        t.record(Record::Module(b.module(1)));
        let frames = |f: &str| vec![Frame::Native(b.ret_in(f)), Frame::Native(b.ret_in("main"))];
        t.record(stack(1, frames("make_buffer")));
        t.record(stack(2, frames("drop_buffer")));
        let alloc = t.call_from(Api::CudaMalloc, A, 4 * MIB, 1);
        let free = t.call_from(Api::CudaFree, A, 0, 2);
        for _ in 0..33_000 {
            t.malloc(A + 64 * MIB, 4096);
            t.free(A + 64 * MIB);
        }
        t.record(Record::Violation(Violation {
            seq: t.seq,
            ts_ns: t.ts,
            ptr: A,
            size: 4 * MIB,
            first_offset: 0,
            changed_bytes: 8,
            alloc_seq: alloc,
            free_seq: free,
            free_api: Api::CudaFree,
            alloc_stack: ids.0,
            free_stack: ids.1,
            ..Violation::default()
        }));
        t.seq += 1;
        t.end(Default::default());
        t.write(dir.path(), &format!("ring-{}.trace", ids.0))
    };
    let with = trace((1, 2));
    let j = isolate(dir.path(), &["summary", "--json", with.to_str().unwrap()]).json();
    let v = &j["poison_violations"][0];
    let site = |k: &str| {
        v[k]["site"]
            .as_str()
            .unwrap()
            .split(' ')
            .next()
            .unwrap()
            .to_owned()
    };
    assert_eq!(site("alloc_stack"), "make_buffer", "{v}");
    assert_eq!(site("free_stack"), "drop_buffer", "{v}");
    // The same trace without the ids (as versions 1 and 2 wrote it): the ring lost them.
    let without = trace((0, 0));
    let j = isolate(
        dir.path(),
        &["summary", "--json", without.to_str().unwrap()],
    )
    .json();
    let v = &j["poison_violations"][0];
    assert!(v.get("alloc_stack").is_none(), "{v}");
}
