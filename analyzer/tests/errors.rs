mod common;

use common::*;
use isolate_trace::Stats;

fn trace() -> Vec<u8> {
    let mut t = TraceBuilder::new();
    for i in 0..50 {
        t.malloc(A + i * 4096, 4096);
    }
    t.end(Stats::default());
    t.bytes()
}

const SUBCOMMANDS: &[&[&str]] = &[
    &["summary"],
    &["summary", "--json"],
    &["graph"],
    &["graph", "--format", "dot"],
    &["who", "0x7f0000000000"],
    &["report", "-o", "r.html"],
    &["export", "--format", "chrome-trace", "-o", "t.json"],
];

fn run_all(dir: &std::path::Path, file: &str) -> Vec<Out> {
    SUBCOMMANDS
        .iter()
        .map(|args| {
            let mut a: Vec<&str> = args.to_vec();
            // `who` and the others take the trace last, after their options.
            a.push(file);
            isolate(dir, &a)
        })
        .collect()
}

#[test]
fn truncated_trace_is_analysed_up_to_the_cut() {
    let d = tempfile::tempdir().unwrap();
    let b = trace();
    let cut = b.len() - 7;
    std::fs::write(d.path().join("cut.trace"), &b[..cut]).unwrap();
    let o = isolate(d.path(), &["summary", "--json", "cut.trace"]);
    assert_eq!(o.code, 3, "{}", o.stderr);
    let v = o.json();
    let at = v["truncated"].as_u64().expect("truncated offset");
    assert!(at > 0 && at < cut as u64);
    assert_eq!(v["complete"], false);
    assert_eq!(
        v["allocations"], 50,
        "every whole record before the cut is counted"
    );
    assert!(
        o.stderr.contains(&format!(
            "cut.trace: at byte {at}: the file ends inside a record"
        )),
        "{}",
        o.stderr
    );
    let o = isolate(d.path(), &["summary", "cut.trace"]);
    assert!(
        o.stdout.contains(&format!(
            "TRUNCATED: the file ends inside a record at byte {at}"
        )),
        "{}",
        o.stdout
    );
    // Cut inside a record (as a full disk cuts a trace): how the process ended is not known,
    // and the summary does not claim it did not exit cleanly.
    assert!(
        o.stdout.contains(&format!(
            "ended    not recorded: the trace was cut inside a record at byte {at}, while being \
             written (a full disk, or a write cut short)"
        )),
        "{}",
        o.stdout
    );
    assert!(!o.stdout.contains("did not exit cleanly"), "{}", o.stdout);
    // Whole records and no End record: a crash or a kill, or a full disk at a record's end.
    let mut t = TraceBuilder::new();
    t.malloc(A, 4096);
    t.write(d.path(), "noend.trace");
    let o = isolate(d.path(), &["summary", "noend.trace"]);
    assert!(
        o.stdout.contains(
            "ended    no End record: the process did not exit cleanly (crash, kill, or still \
             running), or its trace could not be written to the end (a full disk)"
        ),
        "{}",
        o.stdout
    );
    for o in run_all(d.path(), "cut.trace") {
        assert_ne!(o.code, 0);
        assert!(!o.stderr.contains("panicked"), "{}", o.stderr);
    }
}

#[test]
fn corrupt_trace_names_file_and_offset() {
    let d = tempfile::tempdir().unwrap();
    let mut b = trace();
    let mut hdr = Vec::new();
    isolate_trace::Encoder::preamble(&header(100, &["prog"]), &mut hdr);
    // A frame length far beyond the limit, right after the header.
    let at = hdr.len();
    b.splice(at..at, [0xff, 0xff, 0xff, 0xff, 0x0f]);
    std::fs::write(d.path().join("bad.trace"), &b).unwrap();
    for o in run_all(d.path(), "bad.trace") {
        assert_eq!(o.code, 2, "{}", o.stderr);
        assert!(
            o.stderr
                .contains(&format!("bad.trace: at byte {at}: corrupt frame")),
            "{}",
            o.stderr
        );
        assert_eq!(
            o.stderr.lines().count(),
            1,
            "one clear message: {}",
            o.stderr
        );
    }
    // A payload that does not decode.
    let mut b = trace();
    b[at + 1] = 0x55;
    std::fs::write(d.path().join("bad2.trace"), &b).unwrap();
    let o = isolate(d.path(), &["summary", "bad2.trace"]);
    assert_eq!(o.code, 2);
    assert!(
        o.stderr.contains(&format!("bad2.trace: at byte {at}:")),
        "{}",
        o.stderr
    );
}

/// A record whose bytes are wrong is named in words (what was wrong), with the file and the
/// offset: never bincode's Debug value (`Utf8 { inner: Utf8Error { … } }`,
/// `UnexpectedVariant { type_name: "WireRecord", … }`).
#[test]
fn corrupt_records_are_told_in_words() {
    let d = tempfile::tempdir().unwrap();
    let mut t = TraceBuilder::new();
    t.malloc(A, 4096);
    let before = t.bytes().len();
    t.text_note(isolate_trace::NoteKind::Mark, 1, 0, "abcdefgh");
    let at = t.bytes().len();
    t.malloc(A + 4096, 4096);
    t.end(Stats::default());
    let good = t.bytes();
    // The mark's text made not UTF-8.
    let mut utf8 = good.clone();
    let i = before
        + good[before..at]
            .windows(8)
            .position(|w| w == b"abcdefgh")
            .unwrap();
    utf8[i + 4] = 0xff;
    // The next record's kind (the payload's first byte, after a 1-byte length) made unknown.
    let mut variant = good.clone();
    variant[at + 1] = 200;
    for (name, bytes, off, words) in [
        (
            "utf8.trace",
            &utf8,
            before,
            "a text in it is not UTF-8 (a bad byte after 4 good ones)",
        ),
        ("variant.trace", &variant, at, "unknown record kind 200"),
    ] {
        std::fs::write(d.path().join(name), bytes).unwrap();
        for o in run_all(d.path(), name) {
            assert_eq!(o.code, 2, "{}", o.stderr);
            assert!(
                o.stderr.contains(&format!(
                    "{name}: at byte {off}: corrupt frame: the record does not decode: {words}"
                )),
                "{}",
                o.stderr
            );
            for debug in ["{", "Utf8", "Variant", "type_name"] {
                assert!(!o.stderr.contains(debug), "{}", o.stderr);
            }
        }
    }
}

#[test]
fn foreign_and_missing_files() {
    let d = tempfile::tempdir().unwrap();
    std::fs::write(
        d.path().join("elf"),
        b"\x7fELF\x02\x01\x01\x00more bytes here",
    )
    .unwrap();
    std::fs::write(d.path().join("empty"), b"").unwrap();
    std::fs::write(d.path().join("short"), &trace()[..20]).unwrap();
    for o in run_all(d.path(), "elf") {
        assert_eq!(o.code, 2);
        assert!(
            o.stderr.contains("elf: at byte 0: not an isolate trace"),
            "{}",
            o.stderr
        );
    }
    // Empty, or the magic's first byte only (a disk full as the trace began): truncated, not
    // foreign.
    std::fs::write(d.path().join("one"), b"I").unwrap();
    for (file, at) in [("empty", 0), ("one", 1)] {
        for o in run_all(d.path(), file) {
            assert_eq!(o.code, 2);
            assert!(
                o.stderr
                    .contains(&format!("{file}: at byte {at}: the file "))
                    && o.stderr.contains("(truncated"),
                "{}",
                o.stderr
            );
            assert!(!o.stderr.contains("not an isolate trace"), "{}", o.stderr);
        }
    }
    let o = isolate(d.path(), &["summary", "short"]);
    assert_eq!(o.code, 2);
    assert!(
        o.stderr
            .contains("short: at byte 12: the file ends inside the trace header (truncated"),
        "{}",
        o.stderr
    );
    // A file that cannot be opened has no byte offset to name: `isolate: FILE: no such file`.
    for o in run_all(d.path(), "nope.trace") {
        assert_eq!(o.code, 2);
        assert_eq!(o.stderr, "isolate: nope.trace: no such file\n");
    }
    std::fs::create_dir(d.path().join("dir.trace")).unwrap();
    let o = isolate(d.path(), &["summary", "dir.trace"]);
    assert_eq!(o.code, 2);
    assert_eq!(
        o.stderr,
        "isolate: dir.trace: is a directory, not a trace\n"
    );
    let o = isolate(d.path(), &["diff", "nope.trace", "elf"]);
    assert_eq!(o.code, 2);
}

#[test]
fn every_cut_and_flip_ends_cleanly() {
    let d = tempfile::tempdir().unwrap();
    let b = trace();
    // A sample of cuts and flips through the library (the binary is the same code).
    for cut in (0..b.len()).step_by(7) {
        let p = d.path().join("c.trace");
        std::fs::write(&p, &b[..cut]).unwrap();
        let _ = isolate_analyzer::summary::summarize(&[&p], &mut isolate_analyzer::NoProgress);
        let _ = isolate_analyzer::graph::graph(
            &[&p],
            Default::default(),
            &mut isolate_analyzer::NoProgress,
        );
    }
    for i in (0..b.len()).step_by(5) {
        let mut x = b.clone();
        x[i] ^= 0x40;
        let p = d.path().join("f.trace");
        std::fs::write(&p, &x).unwrap();
        let _ = isolate_analyzer::summary::summarize(&[&p], &mut isolate_analyzer::NoProgress);
        let _ = isolate_analyzer::who::who(A, &[&p], &mut isolate_analyzer::NoProgress);
        let _ = isolate_analyzer::report::render(&[&p], &mut isolate_analyzer::NoProgress);
    }
}

/// Every output file is written whole or not at all (issue 32): a trace that turns out corrupt
/// halfway leaves no file (before: a 0-byte or partial one), or the file that was there before,
/// untouched, and no temporary file; on success the file is there, mode 0600, and nothing else.
#[test]
fn outputs_are_written_atomically() {
    use std::os::unix::fs::PermissionsExt;
    let d = tempfile::tempdir().unwrap();
    std::fs::write(d.path().join("good.trace"), trace()).unwrap();
    // Whole records, then a frame length beyond the limit: the error comes after output began.
    let mut bad = trace();
    let cut = bad.len() - 40;
    bad.truncate(cut);
    bad.extend([0xff, 0xff, 0xff, 0xff, 0x0f, 0, 0, 0]);
    std::fs::write(d.path().join("bad.trace"), &bad).unwrap();
    let outputs: &[&[&str]] = &[
        &[
            "export",
            "--format",
            "chrome-trace",
            "-o",
            "OUT",
            "good.trace",
            "bad.trace",
        ],
        &["export", "--format", "memory-viz", "-o", "OUT", "bad.trace"],
        &[
            "graph",
            "--format",
            "json",
            "-o",
            "OUT",
            "good.trace",
            "bad.trace",
        ],
        &[
            "graph",
            "--format",
            "dot",
            "--full",
            "-o",
            "OUT",
            "good.trace",
            "bad.trace",
        ],
        &["graph", "-o", "OUT", "good.trace", "bad.trace"],
        &["report", "-o", "OUT", "good.trace", "bad.trace"],
    ];
    let listing = || {
        let mut v: Vec<String> = std::fs::read_dir(d.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    };
    for args in outputs {
        for before in [None, Some("the old output")] {
            let out = d.path().join("out");
            let _ = std::fs::remove_file(&out);
            if let Some(b) = before {
                std::fs::write(&out, b).unwrap();
            }
            let a: Vec<&str> = args
                .iter()
                .map(|a| if *a == "OUT" { "out" } else { a })
                .collect();
            let o = isolate(d.path(), &a);
            assert_eq!(o.code, 2, "{args:?}: {}", o.stderr);
            assert!(
                o.stderr.contains("bad.trace: at byte"),
                "{args:?}: {}",
                o.stderr
            );
            match before {
                None => assert!(!out.exists(), "{args:?}: a file was left on error"),
                Some(b) => assert_eq!(std::fs::read_to_string(&out).unwrap(), b, "{args:?}"),
            }
            let mut want = vec!["bad.trace", "good.trace"];
            if before.is_some() {
                want.push("out");
            }
            assert_eq!(listing(), want, "{args:?}: a temporary file was left");
        }
        let _ = std::fs::remove_file(d.path().join("out"));
        let a: Vec<&str> = args
            .iter()
            .map(|a| match *a {
                "OUT" => "out",
                "bad.trace" => "good.trace",
                a => a,
            })
            .collect();
        let o = isolate(d.path(), &a);
        assert_eq!(o.code, 0, "{a:?}: {}", o.stderr);
        let m = std::fs::metadata(d.path().join("out")).unwrap();
        assert!(m.len() > 0, "{a:?}");
        assert_eq!(m.permissions().mode() & 0o777, 0o600, "{a:?}");
        assert_eq!(listing(), ["bad.trace", "good.trace", "out"], "{a:?}");
    }
}

/// `report` says where it wrote, in one line (before: nothing).
#[test]
fn report_says_where_it_wrote() {
    let d = tempfile::tempdir().unwrap();
    std::fs::write(d.path().join("good.trace"), trace()).unwrap();
    let o = isolate(d.path(), &["report", "-o", "my report.html", "good.trace"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert_eq!(o.stdout, "");
    assert_eq!(o.stderr, "isolate: report written: 'my report.html'\n");
}
