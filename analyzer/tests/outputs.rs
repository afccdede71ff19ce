//! Outputs a person understands in 30 seconds (issue 16): `isolate graph` prints a short text by
//! default, naming the victim of a stale write; DOT draws a small graph whole with the victim
//! filled red and collapses a large one into its reuse chains; JSON or DOT too large for a
//! terminal is refused there; errors name the argument; `summary --error-exitcode`.

mod common;

use common::*;
use isolate_analyzer::NoProgress;
use isolate_analyzer::graph::{self, Digest, EdgeKind, Filter};
use isolate_trace::{Record, Stats, Violation};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

fn h200(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .join("tests/traces/h200")
        .join(format!("{name}.trace"))
}

fn here() -> PathBuf {
    std::env::current_dir().unwrap()
}

/// The default output of `graph` on the H200 stale-write trace: a few lines of text that name the
/// allocation the stale write hit, with its address, size and life.
#[test]
fn graph_text_names_the_victim_of_a_stale_write() {
    let t = h200("stale_isolate");
    let o = isolate(&here(), &["graph".as_ref(), t.as_os_str()]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let text = &o.stdout;
    assert!(
        !text.trim_start().starts_with('{'),
        "the default is not JSON:\n{text}"
    );
    assert!(text.lines().count() <= 20, "short:\n{text}");
    assert!(
        text.contains("8 allocations (7 device, 1 host); 1 stale write, 1 stale launch"),
        "{text}"
    );
    assert!(
        text.contains(
            "STALE WRITE (found at event 16): 4.0 KiB written from offset 4096 (0x7fbd70801000) after the free\n  victim:      #0 cudaMalloc 4.0 MiB at 0x7fbd70800000, events 0..1, freed by cudaFree"
        ),
        "{text}"
    );
    assert!(
        text.contains("kernel stale_fill got 0x7fbd70800000"),
        "{text}"
    );
    // Where to look next: `who` at the victim's address, with the trace as given.
    assert!(
        text.contains(&format!(" who 0x7fbd70800000 {}", t.display())),
        "{text}"
    );
    // The guard-mode trace: a stale launch, its victim named the same way.
    let o = isolate(
        &here(),
        &["graph".as_ref(), h200("stale_guard").as_os_str()],
    );
    assert!(
        o.stdout
            .contains("victim:      #0 cudaMalloc 4.0 MiB at 0x7f6f78800000"),
        "{}",
        o.stdout
    );
}

/// A graph of a thousand allocations stays a screenful: the largest chains and "N more".
#[test]
fn graph_text_of_a_large_graph_is_summarised() {
    let t = h200("mlp-log_no-caching");
    let o = isolate(&here(), &["graph".as_ref(), t.as_os_str()]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let text = &o.stdout;
    assert!(text.lines().count() <= 25, "{text}");
    assert!(
        text.contains("974 allocations (973 device, 1 host); no findings"),
        "{text}"
    );
    assert!(
        text.contains("what reused whose memory: 1,032 reuse edges in 17 chains"),
        "{text}"
    );
    assert!(
        text.contains("and 11 more chains (455 allocations)"),
        "{text}"
    );
    assert!(
        text.contains("held at exit: 10 allocations, 193.3 MiB (9 device, 1 host)"),
        "{text}"
    );
    assert!(text.contains("and 5 more allocations"), "{text}");
    // The same text with -o, and with --format text.
    let d = tempfile::tempdir().unwrap();
    let o2 = isolate(
        d.path(),
        &[
            "graph".as_ref(),
            t.as_os_str(),
            "-o".as_ref(),
            "g.txt".as_ref(),
        ],
    );
    assert_eq!(o2.code, 0, "{}", o2.stderr);
    let o3 = isolate(
        &here(),
        &[
            "graph".as_ref(),
            "--format".as_ref(),
            "text".as_ref(),
            t.as_os_str(),
        ],
    );
    assert_eq!(o3.stdout, o.stdout);
    assert_eq!(
        std::fs::read_to_string(d.path().join("g.txt")).unwrap(),
        o.stdout
    );
}

/// The chains of the digest, found while the graph streams by and let go as they close, are
/// those of the whole graph: every allocation in the chain of its first predecessor.
#[test]
fn digest_chains_are_the_whole_graphs() {
    for name in [
        "mlp-log_no-caching",
        "mlp-log_cudaMallocAsync",
        "static_log",
        "stale_isolate",
    ] {
        let p = h200(name);
        let g = graph::graph(&[&p], Filter::default(), &mut NoProgress).unwrap();
        let mut chain_of: BTreeMap<u64, u64> = BTreeMap::new();
        for e in g.edges_of_kind(EdgeKind::Reuse) {
            let root = *chain_of.entry(e.from).or_insert(e.from);
            chain_of.entry(e.to).or_insert(root);
        }
        let mut sizes: BTreeMap<u64, u64> = BTreeMap::new();
        for root in chain_of.values() {
            *sizes.entry(*root).or_default() += 1;
        }
        let mut want: Vec<(u64, u64)> = sizes.iter().map(|(r, n)| (*n, *r)).collect();
        want.sort_by_key(|&(n, r)| (std::cmp::Reverse(n), r));
        let mut d = Digest::new(false);
        graph::build(&[&p], Filter::default(), &mut d, &mut NoProgress).unwrap();
        assert_eq!(d.chain_count, sizes.len() as u64, "{name}");
        assert_eq!(d.chained, chain_of.len() as u64, "{name}");
        let got: Vec<(u64, u64)> = d
            .chains
            .iter()
            .map(|c| (c.allocations, c.sample[0].0))
            .collect();
        want.truncate(graph::CHAINS_KEPT);
        assert_eq!(got, want, "{name}");
        // Every chain shown knows its members' sizes and extent.
        for c in &d.chains {
            assert!(c.sample.iter().all(|s| s.1.is_some()), "{name}: {c:?}");
            assert!(c.last.1.is_some() && c.lo < c.hi, "{name}: {c:?}");
        }
        // The same with a filter that keeps everything (edges then come last).
        let all = Filter {
            from_ns: Some(0),
            ..Filter::default()
        };
        let mut f = Digest::new(true);
        graph::build(&[&p], all, &mut f, &mut NoProgress).unwrap();
        assert_eq!(
            (f.chain_count, f.chained),
            (d.chain_count, d.chained),
            "{name}"
        );
        assert_eq!(f.chains, d.chains, "{name}");
    }
}

/// A DOT node statement's attributes, by node id (one statement a line, as the sinks write).
fn dot_nodes(dot: &str) -> BTreeMap<String, Vec<String>> {
    let mut m: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for l in dot.lines() {
        let l = l.trim();
        if let Some((lhs, attrs)) = l.split_once(" [")
            && !lhs.contains(" -> ")
            && !matches!(lhs, "graph" | "node" | "edge")
        {
            m.entry(lhs.to_owned()).or_default().push(attrs.to_owned());
        }
    }
    m
}

/// DOT: the victim filled red and named, in the whole drawing (declared once) and in `--full`
/// (declared again among the notes, which Graphviz merges).
#[test]
fn dot_highlights_the_victim() {
    let t = h200("stale_isolate");
    let o = isolate(
        &here(),
        &[
            "graph".as_ref(),
            "--format".as_ref(),
            "dot".as_ref(),
            t.as_os_str(),
        ],
    );
    assert_eq!(o.code, 0, "{}", o.stderr);
    let nodes = dot_nodes(&o.stdout);
    let n0 = &nodes["n0"];
    assert_eq!(n0.len(), 1, "declared once: {n0:?}");
    assert!(
        n0[0].contains("fillcolor=\"#ff8c8c\"")
            && n0[0].contains("xlabel=\"VICTIM of a stale launch and a stale write\""),
        "{n0:?}"
    );
    assert!(
        !nodes["n1"][0].contains("VICTIM"),
        "only the victim: {nodes:?}"
    );
    assert_eq!(nodes.len(), 8 + 2, "8 allocations and 2 notes: {nodes:?}");
    let o = isolate(
        &here(),
        &[
            "graph".as_ref(),
            "--format".as_ref(),
            "dot".as_ref(),
            "--full".as_ref(),
            t.as_os_str(),
        ],
    );
    assert_eq!(o.code, 0, "{}", o.stderr);
    let nodes = dot_nodes(&o.stdout);
    assert_eq!(nodes["n0"].len(), 3, "{:?}", nodes["n0"]);
    assert!(
        nodes["n0"][1..]
            .iter()
            .all(|a| a.contains("VICTIM of a stale")),
        "{:?}",
        nodes["n0"]
    );
}

/// A large graph's DOT is collapsed into its largest chains: a picture of a few boxes, not one
/// of 974 allocations; `--full` still draws every one.
#[test]
fn dot_of_a_large_graph_is_collapsed() {
    let t = h200("mlp-log_no-caching");
    let dot = |extra: &[&str]| {
        let mut a: Vec<&std::ffi::OsStr> =
            vec!["graph".as_ref(), "--format".as_ref(), "dot".as_ref()];
        a.extend(extra.iter().map(|s| std::ffi::OsStr::new(*s)));
        a.push(t.as_os_str());
        let o = isolate(&here(), &a);
        assert_eq!(o.code, 0, "{}", o.stderr);
        o.stdout
    };
    let small = dot(&[]);
    let nodes = dot_nodes(&small);
    assert!(nodes.len() <= 20, "{small}");
    assert_eq!(
        nodes.keys().filter(|k| k.starts_with('c')).count(),
        graph::CHAINS_KEPT,
        "{small}"
    );
    assert!(
        small.contains("chain of 100 allocations (trace 0)")
            && small.contains("974 allocations, 1032 reuse edges: collapsed")
            && small.contains("and 5 more chains (155 allocations)"),
        "{small}"
    );
    let full = dot(&["--full"]);
    assert_eq!(
        dot_nodes(&full)
            .keys()
            .filter(|k| k.starts_with('n'))
            .count(),
        974
    );
    // The H200 trace with a chain of 100 (drawn whole, an image 32,767 pixels wide) is collapsed
    // too, although it has only 152 allocations; the small ones are drawn whole.
    let o = isolate(
        &here(),
        &[
            "graph".as_ref(),
            "--format".as_ref(),
            "dot".as_ref(),
            h200("static_log").as_os_str(),
        ],
    );
    assert!(o.stdout.contains(": collapsed"), "{}", o.stdout);
    let o = isolate(
        &here(),
        &[
            "graph".as_ref(),
            "--format".as_ref(),
            "dot".as_ref(),
            h200("mlp-log_default").as_os_str(),
        ],
    );
    assert!(!o.stdout.contains("collapsed"), "{}", o.stdout);
    let j = isolate(
        &here(),
        &[
            "graph".as_ref(),
            "--format".as_ref(),
            "json".as_ref(),
            h200("mlp-log_default").as_os_str(),
        ],
    )
    .json();
    assert_eq!(
        dot_nodes(&o.stdout)
            .keys()
            .filter(|k| k.starts_with('n'))
            .count(),
        j["nodes"].as_array().unwrap().len()
    );
}

/// Runs `isolate ARGS` in `dir` with standard output on a pseudo-terminal; returns the exit code,
/// what reached the terminal and stderr.
fn isolate_on_a_terminal(dir: &Path, args: &[&str]) -> (i32, String, String) {
    use std::io::Read;
    use std::os::fd::FromRawFd;
    let (mut master, mut slave) = (0, 0);
    // SAFETY: openpty writes two descriptors; the name, termios and winsize are not asked for.
    let rc = unsafe {
        libc::openpty(
            &mut master,
            &mut slave,
            std::ptr::null_mut(),
            std::ptr::null(),
            std::ptr::null(),
        )
    };
    assert_eq!(rc, 0, "openpty: {}", std::io::Error::last_os_error());
    // SAFETY: both descriptors are ours, open, and owned once each.
    let (master, slave) = unsafe {
        (
            std::fs::File::from_raw_fd(master),
            std::os::fd::OwnedFd::from_raw_fd(slave),
        )
    };
    let reader = std::thread::spawn(move || {
        let mut m = master;
        let mut out = Vec::new();
        let mut buf = [0u8; 65536];
        // EIO once every slave is closed.
        while let Ok(n) = m.read(&mut buf) {
            if n == 0 {
                break;
            }
            out.extend_from_slice(&buf[..n]);
        }
        String::from_utf8_lossy(&out).into_owned()
    });
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_isolate"))
        .args(args)
        .current_dir(dir)
        .stdout(std::process::Stdio::from(slave))
        .stderr(std::process::Stdio::piped())
        .output()
        .unwrap();
    let shown = reader.join().unwrap();
    (
        o.status.code().unwrap_or(-1),
        shown,
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// JSON of a graph too large for a terminal is refused there (with what to do instead), not
/// poured out; `--force`, `-o` and a pipe write it.
#[test]
fn json_too_large_for_a_terminal_is_refused() {
    let d = tempfile::tempdir().unwrap();
    let mut t = TraceBuilder::new();
    for i in 0..50_000u64 {
        t.malloc(A + (i % 64) * MIB, 4096);
        t.free(A + (i % 64) * MIB);
    }
    t.end(Stats::default());
    let p = t.write(d.path(), "big.trace");
    // Its JSON is estimated at 10 bytes a trace byte: over the 8 MiB a terminal is given.
    let len = std::fs::metadata(&p).unwrap().len();
    assert!(len * 10 > 8 << 20, "{len}");
    let (code, shown, err) =
        isolate_on_a_terminal(d.path(), &["graph", "--format", "json", "big.trace"]);
    assert_eq!(code, 2, "{err}");
    assert!(
        shown.is_empty(),
        "nothing reached the terminal: {shown:.200}"
    );
    assert!(
        err.starts_with("isolate: graph: the JSON of this trace would be about ")
            && err.contains("too much for a terminal")
            && err.contains("-o graph.json")
            && err.contains("--force"),
        "{err}"
    );
    // The text view is for terminals; --force prints the JSON all the same.
    let (code, shown, err) = isolate_on_a_terminal(d.path(), &["graph", "big.trace"]);
    assert_eq!(code, 0, "{err}");
    assert!(shown.contains("50,000 allocations"), "{shown}");
    let (code, shown, err) = isolate_on_a_terminal(
        d.path(),
        &["graph", "--format", "json", "--force", "big.trace"],
    );
    assert_eq!(code, 0, "{err}");
    assert!(shown.len() > 8 << 20, "{}", shown.len());
    // Not a terminal: written as asked.
    let o = isolate(d.path(), &["graph", "--format", "json", "big.trace"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(o.stdout.len() > 1 << 20);
}

/// `who TRACE ADDR`, the wrong way round: the error says which argument was wrong, what it
/// should be, and the order that works.
#[test]
fn who_in_the_wrong_order_says_so() {
    let d = tempfile::tempdir().unwrap();
    let mut t = TraceBuilder::new();
    t.malloc(A, 4096);
    t.end(Stats::default());
    t.write(d.path(), "run.trace");
    let o = isolate(d.path(), &["who", "run.trace", "0x7f0000000010"]);
    assert_eq!(o.code, 2);
    assert!(
        o.stderr.starts_with(
            "isolate: who: ADDR, the first argument, is \"run.trace\": not an address (expected 0x… hex or decimal); it looks like a trace file: the address comes first: "
        ) && o.stderr.trim_end().ends_with(" who 0x7f0000000010 run.trace"),
        "{}",
        o.stderr
    );
    assert_eq!(o.stderr.lines().count(), 1, "{}", o.stderr);
    // The order it suggests works.
    let o = isolate(d.path(), &["who", "0x7f0000000010", "run.trace"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    // Not a file and not a number: said plainly, with no guess.
    let o = isolate(d.path(), &["who", "zz", "run.trace"]);
    assert_eq!(o.code, 2);
    assert_eq!(
        o.stderr,
        "isolate: who: ADDR, the first argument, is \"zz\": not an address (expected 0x… hex or decimal)\n"
    );
    // Other number arguments name themselves.
    for (args, name) in [
        (&["graph", "--from", "soon", "run.trace"][..], "--from"),
        (&["graph", "--to", "x", "run.trace"], "--to"),
        (
            &["graph", "--size-class", "big", "run.trace"],
            "--size-class",
        ),
        (
            &[
                "check",
                "run.trace",
                "--baseline",
                "run.trace",
                "--max-alloc-growth",
                "lots",
            ],
            "--max-alloc-growth",
        ),
    ] {
        let o = isolate(d.path(), args);
        assert_eq!(o.code, 2, "{args:?}");
        assert!(
            o.stderr.starts_with(&format!("isolate: {name}: ")),
            "{args:?}: {}",
            o.stderr
        );
    }
}

/// `summary --error-exitcode N`: N when a trace has a finding, else as without it.
#[test]
fn summary_error_exitcode() {
    let d = tempfile::tempdir().unwrap();
    let mut t = TraceBuilder::new();
    t.malloc(A, 4096);
    t.free(A);
    t.record(Record::Violation(Violation {
        seq: 2,
        ts_ns: t.ts,
        ptr: A,
        size: 4096,
        first_offset: 64,
        changed_bytes: 8,
        ..Violation::default()
    }));
    t.end(Stats::default());
    t.write(d.path(), "bad.trace");
    let mut c = TraceBuilder::new();
    c.malloc(A, 4096);
    c.free(A);
    c.end(Stats::default());
    c.write(d.path(), "clean.trace");
    let mut df = TraceBuilder::new();
    df.malloc(A, 4096);
    df.free(A);
    df.free_refused(A, 1);
    df.end(Stats::default());
    df.write(d.path(), "double.trace");

    let o = isolate(d.path(), &["summary", "--error-exitcode", "7", "bad.trace"]);
    assert_eq!(o.code, 7, "{}", o.stderr);
    assert_eq!(
        o.stderr,
        "isolate: found 1 stale write: exit status 7 (--error-exitcode)\n"
    );
    assert!(o.stdout.contains("STALE WRITE"), "{}", o.stdout);
    let o = isolate(
        d.path(),
        &["summary", "--error-exitcode", "7", "double.trace"],
    );
    assert_eq!(o.code, 7, "{}", o.stderr);
    assert!(o.stderr.contains("found 1 double free"), "{}", o.stderr);
    let o = isolate(
        d.path(),
        &[
            "summary",
            "--json",
            "--error-exitcode",
            "9",
            "clean.trace",
            "bad.trace",
        ],
    );
    assert_eq!(o.code, 9, "{}", o.stderr);
    assert_eq!(o.json()["poison_violation_count"], 1);
    let o = isolate(
        d.path(),
        &["summary", "--error-exitcode", "7", "clean.trace"],
    );
    assert_eq!(o.code, 0, "{}", o.stderr);
    // Without the option a finding is not an error.
    let o = isolate(d.path(), &["summary", "bad.trace"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    // A truncated trace without a finding keeps its 3.
    let b = std::fs::read(d.path().join("clean.trace")).unwrap();
    std::fs::write(d.path().join("cut.trace"), &b[..b.len() - 5]).unwrap();
    let o = isolate(d.path(), &["summary", "--error-exitcode", "7", "cut.trace"]);
    assert_eq!(o.code, 3, "{}", o.stderr);
}

/// Every subcommand's `--help` shows help for each of its options, and `run --help` the default
/// mode.
#[test]
fn help_describes_every_option() {
    for sub in [
        "run", "summary", "graph", "who", "diff", "check", "report", "export",
    ] {
        let o = isolate(&here(), &[sub, "--help"]);
        assert_eq!(o.code, 0, "{sub}: {}", o.stderr);
        // clap writes an option's help after it on its line, two spaces or more away, or (when
        // some help is long) on the line after it.
        let lines: Vec<&str> = o.stdout.lines().collect();
        let mut options = 0;
        for (i, l) in lines.iter().enumerate() {
            let t = l.trim_start();
            let b = t.as_bytes();
            let option = t.starts_with("--") || (b.len() > 2 && b[0] == b'-' && b[2] == b',');
            if l.starts_with("  ") && (option || t.starts_with('<')) {
                options += 1;
                let inline = t
                    .split_once("  ")
                    .is_some_and(|(_, h)| !h.trim().is_empty());
                let next = lines.get(i + 1).map(|n| n.trim()).unwrap_or("");
                assert!(
                    inline
                        || (!next.is_empty() && !next.starts_with('-') && !next.starts_with('<')),
                    "isolate {sub} --help: {t:?} has no help:\n{}",
                    o.stdout
                );
            }
        }
        assert!(options >= 2, "isolate {sub} --help:\n{}", o.stdout);
    }
    let o = isolate(&here(), &["run", "--help"]);
    assert!(
        o.stdout.contains("[default: log, or ISOLATE_MODE"),
        "{}",
        o.stdout
    );
    let o = isolate(&here(), &["graph", "--help"]);
    assert!(o.stdout.contains("[default: text"), "{}", o.stdout);
}

/// Every subcommand that writes to standard output, its reader gone before it writes (as
/// `isolate graph … | head -1` is once head has its line): no message, and the exit status
/// the analysis owes (0; N for `--error-exitcode N` with a finding; 1 for `check` over budget;
/// `graph`, which streams, stops at once with 0). Before: `isolate: Broken pipe (os error 32)`
/// and exit 2 from `graph --format json` and `--format dot`.
#[test]
fn quiet_on_a_closed_pipe() {
    use std::os::fd::{FromRawFd, OwnedFd};
    let t = h200("stale_isolate");
    let big = h200("mlp-log_no-caching");
    let t = t.to_str().unwrap();
    let big = big.to_str().unwrap();
    let cases: &[(&[&str], i32)] = &[
        (&["summary", t], 0),
        (&["summary", "--json", t], 0),
        (&["summary", "--error-exitcode", "5", t], 5),
        (&["graph", t], 0),
        (&["graph", "--format", "json", big], 0),
        (&["graph", "--format", "dot", big], 0),
        (&["graph", "--format", "dot", "--full", big], 0),
        (&["who", "0x0", t], 0),
        (&["who", "--json", "0x0", t], 0),
        (&["sites", big], 0),
        (&["sites", "--json", big], 0),
        (&["diff", t, big], 0),
        (&["diff", "--json", t, big], 0),
        (&["check", big, "--baseline", big], 0),
        (&["check", big, "--baseline", t], 1),
    ];
    for (args, code) in cases {
        let mut fds = [0; 2];
        // SAFETY: `fds` has room for the two descriptors pipe(2) writes.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        // SAFETY: both are fresh descriptors this test owns; the read end is closed at once.
        let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        drop(read);
        let o = std::process::Command::new(env!("CARGO_BIN_EXE_isolate"))
            .args(*args)
            .stdout(write)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(*code), "{args:?}: {stderr}");
        assert!(
            !stderr.contains("Broken pipe") && !stderr.contains("panicked"),
            "{args:?}: {stderr}"
        );
        if *code != 5 {
            assert!(stderr.is_empty(), "{args:?}: {stderr}");
        }
    }
}
