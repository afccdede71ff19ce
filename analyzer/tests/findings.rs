//! The finding model (`analyzer/src/finding.rs`), checked from the source and on the recorded
//! traces:
//!
//! - a finding is defined once: no other file of `analyzer/src` defines a type named
//!   `Finding` or `Findings` (the four definitions there were before the model);
//! - the outputs render it without a wildcard: no `match` arm of `finding.rs`, and none of a
//!   `match` on a `Kind` or `Finding` anywhere, is `_ =>`, so a new kind makes the compiler list
//!   every output that does not show it yet;
//! - `isolate summary --error-exitcode` fails exactly when the summary's headline says
//!   `FINDINGS:` (the one rule), on every trace of `tests/traces/`.

use std::path::{Path, PathBuf};
use std::process::Command;

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).expect("read analyzer/src") {
        let p = e.expect("a directory entry").path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The code of a file without its comments.
fn code(src: &str) -> String {
    src.lines()
        .map(|l| match l.find("//") {
            Some(i) if !l[..i].contains('"') => &l[..i],
            _ => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// `(file, line)` of every `struct`, `enum` or `type` named `name`.
fn definitions(name: &str) -> Vec<(String, String)> {
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    files.sort();
    let mut found = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).expect("read a source file");
        for l in code(&text).lines() {
            let words: Vec<&str> = l
                .split(|c: char| !(c.is_alphanumeric() || c == '_'))
                .filter(|w| !w.is_empty())
                .collect();
            if words
                .windows(2)
                .any(|w| matches!(w[0], "struct" | "enum" | "type") && w[1] == name)
            {
                let rel = f.strip_prefix(src()).unwrap().display().to_string();
                found.push((rel, l.trim().to_owned()));
            }
        }
    }
    found
}

#[test]
fn a_finding_is_defined_once() {
    let finding = definitions("Finding");
    assert_eq!(
        finding,
        vec![("finding.rs".to_owned(), "pub enum Finding<'a> {".to_owned())],
        "one definition of a finding: `enum Finding` in analyzer/src/finding.rs"
    );
    let findings = definitions("Findings");
    assert!(
        findings.is_empty(),
        "a second finding type (use finding::Tally for counts): {findings:?}"
    );
}

#[test]
fn no_wildcard_over_kinds() {
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    let mut bad = Vec::new();
    for f in &files {
        let text = code(&std::fs::read_to_string(f).expect("read a source file"));
        if !text.contains("finding::") {
            // `Kind` there is not the finding's (`isolate_trace::Kind`, an API's kind).
            continue;
        }
        let lines: Vec<&str> = text.lines().collect();
        for (i, l) in lines.iter().enumerate() {
            // A wildcard arm within a few lines after an arm naming a `Kind::` or `Finding::`
            // variant is a wildcard over kinds.
            if !l.trim_start().starts_with("_ =>") {
                continue;
            }
            let above = &lines[i.saturating_sub(12)..i];
            if above.iter().any(|a| {
                let a = a.trim_start();
                (a.starts_with("Kind::")
                    || a.starts_with("Finding::")
                    || a.starts_with("Some(Kind::"))
                    && a.contains("=>")
            }) {
                let rel = f.strip_prefix(src()).unwrap().display().to_string();
                bad.push(format!("{rel}:{}", i + 1));
            }
        }
    }
    let model = code(&std::fs::read_to_string(src().join("finding.rs")).unwrap());
    if model.lines().any(|l| l.trim_start().starts_with("_ =>")) {
        bad.push("finding.rs".into());
    }
    assert!(bad.is_empty(), "a `_ =>` arm over finding kinds: {bad:?}");
}

/// Each recorded trace: `isolate summary --error-exitcode 9` exits 9 exactly when its text
/// headline is `FINDINGS: …`, and says on stderr the same counted kinds.
#[test]
fn exit_status_agrees_with_the_summary() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/traces/h200");
    let mut traces: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("tests/traces/h200")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "trace"))
        .collect();
    traces.sort();
    assert!(traces.len() >= 10, "{traces:?}");
    let (mut failing, mut passing) = (0, 0);
    for t in &traces {
        let out = Command::new(env!("CARGO_BIN_EXE_isolate"))
            .args(["summary", "--error-exitcode", "9"])
            .arg(t)
            .output()
            .expect("run isolate");
        let text = String::from_utf8(out.stdout).unwrap();
        let err = String::from_utf8(out.stderr).unwrap();
        let headline = text
            .lines()
            .find(|l| l.starts_with("FINDINGS:") || l.starts_with("findings:"))
            .unwrap_or_else(|| panic!("{}: no findings line in\n{text}", t.display()));
        if headline.starts_with("FINDINGS:") {
            failing += 1;
            assert_eq!(out.status.code(), Some(9), "{}: {headline}", t.display());
            // The stderr line names what the headline counts.
            let counted = headline
                .trim_start_matches("FINDINGS: ")
                .split("; also")
                .next()
                .unwrap();
            assert!(
                err.contains(&format!("isolate: found {counted}: exit status 9")),
                "{}: {err}",
                t.display()
            );
        } else {
            passing += 1;
            assert_eq!(
                out.status.code(),
                Some(0),
                "{}: {headline}: {err}",
                t.display()
            );
        }
    }
    // The traces have both: stale writes and launches, device faults; and none.
    assert!(
        failing >= 4 && passing >= 4,
        "{failing} failing, {passing} passing"
    );
}

mod common;
use common::*;
use isolate_trace::{NoteKind, Stats};

/// One rule for `summary --error-exitcode` and `check --no-violations`: a device fault counts
/// for both (`check` left it out before), memory held at exit for neither (it is no finding:
/// information); and the headline says which is which.
#[test]
fn a_device_fault_counts_and_held_memory_is_no_finding() {
    let d = tempfile::tempdir().unwrap();
    let mut leak = TraceBuilder::new();
    leak.malloc(0x7f00_0000_0000, 4096); // never freed: held at exit, no finding
    leak.end(Stats::default());
    leak.write(d.path(), "leak.trace");
    let mut fault = TraceBuilder::new();
    fault.malloc(0x7f00_0000_0000, 4096);
    fault.free(0x7f00_0000_0000);
    fault.note(NoteKind::DeviceFault, 700);
    fault.end(Stats::default());
    fault.write(d.path(), "fault.trace");

    let o = isolate(
        d.path(),
        &["summary", "--error-exitcode", "9", "leak.trace"],
    );
    assert_eq!(o.code, 0, "{}{}", o.stdout, o.stderr);
    assert!(
        o.stdout.contains(
            "findings: none of those log mode can see (no invalid free, double free, device \
             fault or leak); log mode cannot see stale writes or stale launches"
        ) && o
            .stdout
            .contains("1 allocation (4.0 KiB): held by the program (information, not a finding)\n"),
        "{}",
        o.stdout
    );
    assert!(
        o.stderr.contains(
            "isolate: found no stale writes, stale launches, unordered, invalid or double frees \
             or device faults"
        ),
        "{}",
        o.stderr
    );
    let o = isolate(
        d.path(),
        &[
            "check",
            "leak.trace",
            "--baseline",
            "leak.trace",
            "--no-violations",
        ],
    );
    assert_eq!(o.code, 0, "{}{}", o.stdout, o.stderr);
    assert!(o.stdout.starts_with("ok: "), "{}", o.stdout);

    let o = isolate(
        d.path(),
        &["summary", "--error-exitcode", "9", "fault.trace"],
    );
    assert_eq!(o.code, 9, "{}{}", o.stdout, o.stderr);
    assert!(
        o.stdout.contains("FINDINGS: 1 device fault\n"),
        "{}",
        o.stdout
    );
    assert!(
        o.stderr
            .contains("isolate: found 1 device fault: exit status 9 (--error-exitcode)"),
        "{}",
        o.stderr
    );
    let o = isolate(
        d.path(),
        &[
            "check",
            "fault.trace",
            "--baseline",
            "fault.trace",
            "--no-violations",
        ],
    );
    assert_eq!(o.code, 1, "{}{}", o.stdout, o.stderr);
    assert_eq!(o.stdout.trim(), "violations found: 1 device fault");
}

/// A finding carries the calls it is about and their stack ids: a double free names itself, the
/// first free and the allocation, each with the stack id its event had.
#[test]
fn a_finding_names_its_calls_and_their_stacks() {
    use isolate_analyzer::finding::{self, Finding, Kind, Role, Site, Tally};
    let d = tempfile::tempdir().unwrap();
    let mut t = TraceBuilder::new();
    let a = t.call_from(isolate_trace::Api::CudaMalloc, 0x7f00_0000_0000, 4096, 5);
    let f = t.call_from(isolate_trace::Api::CudaFree, 0x7f00_0000_0000, 0, 6);
    let again = t.call_from(isolate_trace::Api::CudaFree, 0x7f00_0000_0000, 0, 0);
    t.end(Stats::default());
    let p = t.write(d.path(), "t.trace");
    let s = isolate_analyzer::summary::summarize(&[&p], &mut isolate_analyzer::NoProgress).unwrap();
    let found = finding::findings(&s.traces[0]);
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].kind(), Kind::DoubleFree);
    assert!(matches!(found[0], Finding::DoubleFree(_)));
    let site = |role, seq, api: &'static str, stack| Site {
        role,
        seq,
        api: Some(api),
        stack,
    };
    assert_eq!(
        found[0].sites(),
        vec![
            site(Role::Call, again, "cudaFree", None),
            site(Role::FirstFreed, f, "cudaFree", Some(6)),
            site(Role::Allocated, a, "cudaMalloc", Some(5)),
        ]
    );
    let tally = Tally::of(&s.totals);
    assert_eq!(
        (tally.get(Kind::DoubleFree), tally.get(Kind::InvalidFree)),
        (1, 0)
    );
    assert_eq!((tally.counted(), tally.total()), (1, 1));
}

/// The report renders the model: a clean run's all-clear names every kind (device faults
/// included, which it left out before), and a double free is an entry of kind `double_free`.
#[test]
fn the_report_names_every_kind() {
    let d = tempfile::tempdir().unwrap();
    let mut clean = TraceBuilder::new();
    clean.malloc(0x7f00_0000_0000, 4096);
    clean.free(0x7f00_0000_0000);
    clean.end(Stats::default());
    let p = clean.write(d.path(), "clean.trace");
    let html = isolate_analyzer::report::render(&[&p], &mut isolate_analyzer::NoProgress)
        .unwrap()
        .html;
    assert!(
        html.contains(
            "No stale writes, stale launches, unordered frees, invalid frees, double frees, device \
             faults or leaks found."
        ),
        "no all-clear naming every kind"
    );
    let mut twice = TraceBuilder::new();
    twice.malloc(0x7f00_0000_0000, 4096);
    twice.free(0x7f00_0000_0000);
    twice.free(0x7f00_0000_0000);
    twice.end(Stats::default());
    let p = twice.write(d.path(), "twice.trace");
    let html = isolate_analyzer::report::render(&[&p], &mut isolate_analyzer::NoProgress)
        .unwrap()
        .html;
    assert!(
        html.contains("\"kind\":\"double_free\""),
        "no double_free entry"
    );
    assert!(
        !html.contains("No stale writes"),
        "an all-clear with a double free"
    );
}
