//! The analyzer on every file of `tests/corpus/` (truncated, bit-flipped, spliced and foreign
//! traces; see its README): `isolate summary --json` ends with 0, 2 or 3 (never a signal, never
//! a panic) within 10 s, an error is ONE stderr line naming the file and `at byte N`, and the
//! exit status and N are what `isolate_trace::Reader` says about the file. Every other
//! subcommand gets the same treatment.

use isolate_trace::Reader;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const TIMEOUT: Duration = Duration::from_secs(10);

fn corpus() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/corpus");
    let mut v: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "bin"))
        .collect();
    v.sort();
    assert!(
        v.len() >= 20,
        "only {} corpus files in {}",
        v.len(),
        dir.display()
    );
    v
}

struct Ran {
    code: i32,
    stdout: String,
    stderr: String,
    took: Duration,
}

/// Runs `isolate ARGS` in `dir` with stdout and stderr into files, killed after [`TIMEOUT`].
fn isolate(dir: &Path, args: &[&std::ffi::OsStr], what: &str) -> Ran {
    let out = dir.join("stdout");
    let err = dir.join("stderr");
    let mut child = Command::new(env!("CARGO_BIN_EXE_isolate"))
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(&err).unwrap())
        .env("RUST_BACKTRACE", "1")
        .spawn()
        .expect("run isolate");
    let start = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if start.elapsed() > TIMEOUT {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what}: still running after {TIMEOUT:?}, killed");
        }
        std::thread::sleep(Duration::from_millis(2));
    };
    let took = start.elapsed();
    let stdout = String::from_utf8_lossy(&std::fs::read(&out).unwrap()).into_owned();
    let stderr = String::from_utf8_lossy(&std::fs::read(&err).unwrap()).into_owned();
    let Some(code) = status.code() else {
        panic!("{what}: killed by a signal ({status})\nstderr: {stderr}");
    };
    assert!(
        !stderr.contains("panicked") && !stderr.contains("RUST_BACKTRACE"),
        "{what}: a panic\n{stderr}"
    );
    Ran {
        code,
        stdout,
        stderr,
        took,
    }
}

/// What the reader makes of a file: the exit status the analyzer owes and the offset it names.
fn expected(path: &Path) -> (i32, Option<u64>) {
    let mut r = match Reader::open(path) {
        Ok(r) => r,
        Err(e) => return (2, Some(e.offset)),
    };
    loop {
        match r.next_record() {
            Ok(Some(_)) => {}
            Ok(None) => break,
            Err(e) => return (2, Some(e.offset)),
        }
    }
    match r.truncated_at() {
        Some(at) => (3, Some(at)),
        None => (0, None),
    }
}

/// Holds the stderr rules for an outcome: nothing on success, else one `isolate:` line that
/// names the file and the byte.
fn check_stderr(what: &str, r: &Ran, name: &str, at: Option<u64>) {
    let lines: Vec<&str> = r.stderr.lines().collect();
    match at {
        None => assert!(
            r.stderr.is_empty(),
            "{what}: stderr on success: {}",
            r.stderr
        ),
        Some(at) => {
            assert_eq!(
                lines.len(),
                1,
                "{what}: not one stderr line: {:?}",
                r.stderr
            );
            let l = lines[0];
            assert!(l.starts_with("isolate: "), "{what}: {l}");
            assert!(
                l.contains(name),
                "{what}: the line does not name the file: {l}"
            );
            assert!(
                l.contains(&format!("at byte {at}")),
                "{what}: the line does not say `at byte {at}`: {l}"
            );
            // In words: never a Rust value (`UnexpectedEnd { additional: 635 }`).
            assert!(
                !l.contains('{') && !l.contains("LimitExceeded"),
                "{what}: the line prints a Rust value: {l}"
            );
        }
    }
}

#[test]
fn summary_json_on_every_corpus_file() {
    let tmp = tempfile::tempdir().unwrap();
    let mut slowest = Duration::ZERO;
    let mut codes = [0usize; 4];
    let files = corpus();
    for path in &files {
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let what = format!("isolate summary --json {name}");
        let r = isolate(
            tmp.path(),
            &["summary".as_ref(), "--json".as_ref(), path.as_os_str()],
            &what,
        );
        slowest = slowest.max(r.took);
        assert!(
            matches!(r.code, 0 | 2 | 3),
            "{what}: exit status {}\n{}",
            r.code,
            r.stderr
        );
        let (code, at) = expected(path);
        assert_eq!(
            r.code, code,
            "{what}: exit status {} where the reader says {code} (at {at:?})\nstderr: {}",
            r.code, r.stderr
        );
        check_stderr(&what, &r, &name, at);
        if r.code != 2 {
            let v: serde_json::Value = serde_json::from_str(&r.stdout)
                .unwrap_or_else(|e| panic!("{what}: stdout is not JSON ({e}): {}", r.stdout));
            assert!(v["traces"].is_array(), "{what}: {v}");
        } else {
            assert!(
                r.stdout.is_empty(),
                "{what}: output with an error: {}",
                r.stdout
            );
        }
        codes[r.code as usize] += 1;
    }
    eprintln!(
        "{} corpus files: {} exit 0, {} exit 2, {} exit 3; slowest {slowest:?}",
        files.len(),
        codes[0],
        codes[2],
        codes[3]
    );
    // The corpus keeps covering all three outcomes.
    assert!(codes[0] > 0 && codes[2] > 0 && codes[3] > 0, "{codes:?}");
}

/// Every other subcommand on every corpus file: the same rules (0, 1 for `check`, 2 or 3; one
/// stderr line naming the file and the byte; no signal, no panic, no hang).
#[test]
fn every_subcommand_on_every_corpus_file() {
    let tmp = tempfile::tempdir().unwrap();
    for path in corpus() {
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let p = path.as_os_str();
        let (code, at) = expected(&path);
        let runs: Vec<(&str, Vec<&std::ffi::OsStr>)> = vec![
            ("summary", vec!["summary".as_ref(), p]),
            ("graph", vec!["graph".as_ref(), p]),
            (
                "graph dot",
                vec!["graph".as_ref(), "--format".as_ref(), "dot".as_ref(), p],
            ),
            ("who", vec!["who".as_ref(), "0x7f0000000000".as_ref(), p]),
            ("diff", vec!["diff".as_ref(), p, p]),
            (
                "report",
                vec!["report".as_ref(), p, "-o".as_ref(), "r.html".as_ref()],
            ),
            (
                "export",
                vec![
                    "export".as_ref(),
                    "--format".as_ref(),
                    "chrome-trace".as_ref(),
                    p,
                    "-o".as_ref(),
                    "t.json".as_ref(),
                ],
            ),
            ("check", vec!["check".as_ref(), p, "--baseline".as_ref(), p]),
        ];
        for (sub, args) in runs {
            let what = format!("isolate {sub} {name}");
            let mut r = isolate(tmp.path(), &args, &what);
            // A report that was written says so first, in one line of its own.
            if sub == "report" && code != 2 {
                let written = "isolate: report written: r.html\n";
                assert!(r.stderr.starts_with(written), "{what}: {}", r.stderr);
                r.stderr.drain(..written.len());
            }
            if sub == "check" {
                // A check needs whole traces: a truncated one is an error (2), not a warning.
                let want = if code == 3 { 2 } else { code };
                assert_eq!(r.code, want, "{what}: {}", r.stderr);
                if want == 2 {
                    let lines: Vec<&str> = r.stderr.lines().collect();
                    assert_eq!(lines.len(), 1, "{what}: {:?}", r.stderr);
                    assert!(lines[0].contains(&name), "{what}: {}", lines[0]);
                    assert!(lines[0].contains(&format!("at byte {}", at.unwrap())));
                }
                continue;
            }
            assert_eq!(r.code, code, "{what}: {}", r.stderr);
            // `diff` reads the file twice and may say so twice.
            if sub == "diff" && code == 3 {
                assert!(r.stderr.lines().all(|l| l.contains(&name)), "{what}");
                continue;
            }
            check_stderr(&what, &r, &name, at);
            if code != 2 && sub == "export" {
                let t = std::fs::read_to_string(tmp.path().join("t.json")).unwrap();
                serde_json::from_str::<serde_json::Value>(&t)
                    .unwrap_or_else(|e| panic!("{what}: not JSON ({e})"));
            }
        }
    }
}

/// The error line for a file that is not a trace says what was wrong once: exit status 2 and
/// `at byte 0` a single time on stderr. (Regression test, commit 9867ea3: `main` prints the
/// error with `{:#}`, which appends every `source()`, and the analyzer's `Error` both displayed
/// its `TraceError` and returned it as its source, so the line said everything twice, an I/O
/// error three times.)
#[test]
fn error_line_says_it_once() {
    let tmp = tempfile::tempdir().unwrap();
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/corpus/elf.bin");
    let r = isolate(
        tmp.path(),
        &["summary".as_ref(), path.as_os_str()],
        "isolate summary elf.bin",
    );
    assert_eq!(r.code, 2);
    assert_eq!(r.stderr.matches("at byte 0").count(), 1, "{}", r.stderr);
}
