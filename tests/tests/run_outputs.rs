//! What `isolate run -- CMD` says and how it ends (issue 16): the mode first, then, after the
//! command, each trace the run wrote and the one command that reads them; `--error-exitcode N`
//! ends with N when a trace has a finding; a trace that cannot be created stops the run before
//! the command starts (unless `--keep-going`); a signal ends it as the command ended.
//!
//! The commands are the stand-in programs (`stale_write.c` plants a stale write, found in
//! isolate mode when the freed allocation leaves quarantine at exit; `rt_basic.c` has no bug),
//! run through `isolate run` as a user would, in a fresh directory.

use isolate_tests::{analyzer_path, program_path, standin_dir};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::Path;
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

const TIMEOUT: Duration = Duration::from_secs(60);

struct Out {
    status: ExitStatus,
    stdout: String,
    stderr: String,
}

impl Out {
    fn code(&self) -> Option<i32> {
        self.status.code()
    }

    /// The lines `isolate` wrote on stderr (the program's own are not prefixed).
    fn ours(&self) -> Vec<&str> {
        self.stderr
            .lines()
            .filter(|l| l.starts_with("isolate: "))
            .collect()
    }

    fn describe(&self) -> String {
        format!(
            "{:?}\nstdout:\n{}\nstderr:\n{}",
            self.status, self.stdout, self.stderr
        )
    }

    /// The value of the line `isolate: PREFIX…`.
    fn line(&self, prefix: &str) -> &str {
        let p = format!("isolate: {prefix}");
        self.stderr
            .lines()
            .find_map(|l| l.strip_prefix(&p))
            .unwrap_or_else(|| panic!("no line {p:?}: {}", self.describe()))
    }
}

/// Runs `prog ARGS` in `dir` with a clean environment (no `ISOLATE_*`, no `LD_*` but the
/// stand-in libraries' path), under a watchdog.
fn run_in(dir: &Path, prog: &Path, args: &[&str]) -> Out {
    run_in_with(dir, Command::new(prog), args)
}

/// [`run_in`] with a command already made (its own variables set).
fn run_in_with(dir: &Path, mut cmd: Command, args: &[&str]) -> Out {
    cmd.args(args).current_dir(dir);
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy();
        if k.starts_with("ISOLATE_") || k.starts_with("LD_") || k.starts_with("STANDIN_") {
            cmd.env_remove(k.as_ref());
        }
    }
    cmd.env("LD_LIBRARY_PATH", standin_dir());
    let (o, e) = (dir.join(".stdout"), dir.join(".stderr"));
    cmd.stdin(Stdio::null())
        .stdout(std::fs::File::create(&o).unwrap())
        .stderr(std::fs::File::create(&e).unwrap())
        .process_group(0);
    let mut child = cmd.spawn().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if start.elapsed() > TIMEOUT {
            // SAFETY: no preconditions; the group is the child's own.
            unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
            let _ = child.wait();
            panic!("watchdog: {cmd:?} still running after {TIMEOUT:?}");
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let read = |p: &Path| {
        let s = std::fs::read_to_string(p).unwrap_or_default();
        let _ = std::fs::remove_file(p);
        s
    };
    Out {
        status,
        stdout: read(&o),
        stderr: read(&e),
    }
}

/// `isolate ARGS` in `dir`.
fn isolate(dir: &Path, args: &[&str]) -> Out {
    run_in(dir, &analyzer_path(), args)
}

fn prog(name: &str) -> String {
    program_path(name).to_string_lossy().into_owned()
}

/// Runs the command `isolate run` printed (`read it with: CMD`), split at spaces (the test's
/// paths have none), in `dir`.
fn run_printed(dir: &Path, cmd: &str) -> Out {
    let words: Vec<&str> = cmd.split(' ').collect();
    let (p, args) = words.split_first().expect("a command");
    run_in(dir, Path::new(p), args)
}

fn tempdir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("isolate-run-out-")
        .tempdir()
        .unwrap()
}

/// A stale write in isolate mode with `--error-exitcode 7`: exit 7; the trace's path is printed
/// and exists, and the printed command reads it and shows the stale write.
#[test]
fn a_finding_exits_with_the_error_exitcode() {
    let d = tempdir();
    let o = isolate(
        d.path(),
        &[
            "run",
            "--mode",
            "isolate",
            "--error-exitcode",
            "7",
            "--trace",
            "sw-%p.trace",
            "--",
            &prog("stale_write"),
        ],
    );
    assert_eq!(o.code(), Some(7), "{}", o.describe());
    assert_eq!(
        o.ours()[0],
        "isolate: mode isolate (freed memory is held back and checked: finds stale writes and stale launches) — trace: sw-%p.trace",
        "the mode comes first: {}",
        o.describe()
    );
    assert!(o.stdout.contains("b changed 0 bytes"), "{}", o.describe());
    let written = o.line("trace written: ");
    let (path, pid) = written.split_once(" (pid ").expect("path (pid N)");
    assert!(
        path.starts_with("sw-") && path.ends_with(".trace"),
        "{written}"
    );
    assert_eq!(
        pid.trim_end_matches(')'),
        &path[3..path.len() - 6],
        "{written}"
    );
    assert!(d.path().join(path).is_file(), "{path} exists");
    let cmd = o.line("read it with: ");
    assert!(cmd.ends_with(&format!(" summary {path}")), "{cmd}");
    let s = run_printed(d.path(), cmd);
    assert_eq!(s.code(), Some(0), "{cmd}: {}", s.describe());
    assert!(s.stdout.contains("STALE WRITE"), "{cmd}: {}", s.describe());
    assert_eq!(
        o.line("found "),
        "1 stale write: exit status 7 (--error-exitcode)"
    );
    // The lines come after the command's own output: the last of stderr are ours.
    let ours = o.ours();
    assert!(
        ours[ours.len() - 1].starts_with("isolate: found "),
        "{ours:?}"
    );
}

/// No finding: the command's own status, with or without `--error-exitcode`. Traces of the
/// command's children are found (a shell that forks twice), each listed with its parent, and
/// the printed command reads them all.
#[test]
fn no_finding_gives_the_commands_status() {
    let d = tempdir();
    let script = format!(
        "{p} > /dev/null && {p} > /dev/null; exit 5",
        p = prog("rt_basic")
    );
    // A trace already there is not the run's.
    std::fs::write(d.path().join("isolate-1.trace"), b"old").unwrap();
    let o = isolate(
        d.path(),
        &["run", "--error-exitcode", "7", "--", "sh", "-c", &script],
    );
    assert_eq!(o.code(), Some(5), "{}", o.describe());
    assert_eq!(
        o.ours()[0],
        "isolate: mode log (records only; --mode isolate finds stale writes) — trace: isolate-%p.trace"
    );
    assert_eq!(o.line("2 traces written:"), "");
    let listed: Vec<&str> = o
        .ours()
        .into_iter()
        .filter_map(|l| l.strip_prefix("isolate:   "))
        .collect();
    assert_eq!(listed.len(), 2, "{}", o.describe());
    for l in &listed {
        assert!(
            l.contains("(a child of the command)  rt_basic"),
            "{l}: {}",
            o.describe()
        );
        let path = l.split(' ').next().unwrap();
        assert!(d.path().join(path).is_file(), "{path}");
        assert_ne!(path, "isolate-1.trace");
    }
    let cmd = o.line("read them with: ");
    let s = run_printed(d.path(), cmd);
    assert_eq!(s.code(), Some(0), "{cmd}: {}", s.describe());
    assert_eq!(s.stdout.matches("== isolate-").count(), 2, "{}", s.stdout);
    assert!(
        o.line("found ").starts_with(
            "no stale writes, stale launches, unordered, invalid or double frees or device faults"
        ),
        "{}",
        o.describe()
    );
    // Without the option, and a command that succeeds.
    let o = isolate(d.path(), &["run", &prog("rt_basic")]);
    assert_eq!(o.code(), Some(0), "{}", o.describe());
    assert!(!o.stderr.contains("isolate: found"), "{}", o.describe());
    // Log mode cannot see the stale write: no finding, and the line says why.
    let o = isolate(
        d.path(),
        &["run", "--error-exitcode", "7", "--", &prog("stale_write")],
    );
    assert_eq!(o.code(), Some(0), "{}", o.describe());
    assert!(
        o.line("found ").contains("--mode isolate finds them"),
        "{}",
        o.describe()
    );
}

/// A trace directory that does not exist: exit 2 with the path named, and the command never
/// ran; `--keep-going` runs it unrecorded.
#[test]
fn a_trace_that_cannot_be_created_stops_the_run() {
    let d = tempdir();
    let o = isolate(
        d.path(),
        &[
            "run",
            "--trace",
            "/nonexistent/dir/x.trace",
            "--",
            "sh",
            "-c",
            "touch ran",
        ],
    );
    assert_eq!(o.code(), Some(2), "{}", o.describe());
    assert!(!d.path().join("ran").exists(), "the command did not run");
    let err = o.ours();
    assert_eq!(err.len(), 2, "the mode, then the error: {err:?}");
    assert!(
        err[1].starts_with("isolate: cannot create traces in /nonexistent/dir: no such directory")
            && err[1].contains("--trace /nonexistent/dir/x.trace")
            && err[1].contains("--keep-going"),
        "{err:?}"
    );
    // A directory that cannot be written to.
    let ro = d.path().join("ro");
    std::fs::create_dir(&ro).unwrap();
    let mut perm = std::fs::metadata(&ro).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perm, 0o500);
    std::fs::set_permissions(&ro, perm).unwrap();
    // SAFETY: no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        let o = isolate(
            d.path(),
            &[
                "run",
                "--trace",
                "ro/x-%p.trace",
                "--",
                "sh",
                "-c",
                "touch ran",
            ],
        );
        assert_eq!(o.code(), Some(2), "{}", o.describe());
        assert!(
            o.stderr
                .contains("cannot create traces in ro: no permission"),
            "{}",
            o.describe()
        );
        assert!(!d.path().join("ran").exists());
    }
    // Through ISOLATE_TRACE too (the environment the command would inherit).
    let mut cmd = Command::new(analyzer_path());
    cmd.args(["run", "sh", "-c", "touch ran"])
        .current_dir(d.path())
        .env("ISOLATE_TRACE", "/nonexistent/y-%p.trace");
    let out = cmd.output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("(ISOLATE_TRACE=/nonexistent/y-%p.trace)"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!d.path().join("ran").exists());
    // --keep-going: it runs, unrecorded, and ends as it ended.
    let o = isolate(
        d.path(),
        &[
            "run",
            "--keep-going",
            "--trace",
            "/nonexistent/dir/x.trace",
            "--",
            "sh",
            "-c",
            "touch ran; exit 3",
        ],
    );
    assert_eq!(o.code(), Some(3), "{}", o.describe());
    assert!(d.path().join("ran").exists());
    assert!(
        o.line("no trace was written")
            .contains("/nonexistent/dir/x.trace")
    );
}

/// A command killed by a signal: `isolate` is killed by the same signal, as before, after
/// saying which traces were written and what `--error-exitcode` found.
#[test]
fn a_signal_ends_the_run_as_before() {
    let d = tempdir();
    let script = format!("{}; kill -TERM $$", prog("stale_write"));
    let o = isolate(
        d.path(),
        &[
            "run",
            "--mode",
            "isolate",
            "--error-exitcode",
            "7",
            "--",
            "sh",
            "-c",
            &script,
        ],
    );
    assert_eq!(o.status.signal(), Some(libc::SIGTERM), "{}", o.describe());
    assert!(o.line("trace written: ").starts_with("isolate-"));
    assert_eq!(
        o.line("found "),
        "1 stale write: exit status 7 (--error-exitcode)"
    );
    let o = isolate(d.path(), &["run", "--", "sh", "-c", "kill -KILL $$"]);
    assert_eq!(o.status.signal(), Some(libc::SIGKILL), "{}", o.describe());
}

/// `--mode off` writes no trace and says so first.
#[test]
fn mode_off_says_so() {
    let d = tempdir();
    let o = isolate(d.path(), &["run", "--mode", "off", &prog("rt_basic")]);
    assert_eq!(o.code(), Some(0), "{}", o.describe());
    assert_eq!(
        o.ours()[0],
        "isolate: mode off (the library passes every call through and writes no trace)"
    );
    assert!(
        std::fs::read_dir(d.path())
            .unwrap()
            .flatten()
            .all(|e| !e.file_name().to_string_lossy().ends_with(".trace")),
        "no trace"
    );
}

/// `isolate` and `libisolate.so` installed in a directory whose path has a space, a colon or a
/// tab, which `LD_PRELOAD` splits on (issue 33, item 6): the run still preloads the library
/// (through a link in a private temporary directory, removed afterwards), finds the stale write
/// and exits with `--error-exitcode`. Without the library the program sees the stale write land
/// (`b changed 1 bytes 16`); the library that named its own path in `LD_PRELOAD` preloaded
/// nothing, and the run exited 0.
#[test]
fn installed_under_a_path_with_a_space_or_a_colon() {
    let plain = run_in(tempdir().path(), &program_path("stale_write"), &[]);
    assert_eq!(plain.code(), Some(0), "{}", plain.describe());
    assert!(
        plain.stdout.contains("b changed 1 bytes 16 first 4096"),
        "{}",
        plain.describe()
    );
    for name in ["my tools", "tools:v2", "tab\there"] {
        let d = tempdir();
        let bin = d.path().join(name);
        std::fs::create_dir(&bin).unwrap();
        let place = |from: &Path, to: &Path| {
            if std::fs::hard_link(from, to).is_err() {
                std::fs::copy(from, to).unwrap();
            }
        };
        let isolate_bin = bin.join("isolate");
        place(&analyzer_path(), &isolate_bin);
        place(
            &analyzer_path().with_file_name("libisolate.so"),
            &bin.join("libisolate.so"),
        );
        let tmp = d.path().join("tmp");
        std::fs::create_dir(&tmp).unwrap();
        let mut cmd = Command::new(&isolate_bin);
        cmd.env("TMPDIR", &tmp);
        let o = run_in_with(
            d.path(),
            cmd,
            &[
                "run",
                "--mode",
                "isolate",
                "--error-exitcode",
                "9",
                "--",
                &prog("stale_write"),
            ],
        );
        assert_eq!(o.code(), Some(9), "{name:?}: {}", o.describe());
        assert!(
            o.stdout.contains("b changed 0 bytes 0 first 0"),
            "{name:?}: isolation kept the freed memory: {}",
            o.describe()
        );
        assert_eq!(
            std::fs::read_dir(&tmp).unwrap().count(),
            0,
            "{name:?}: the link's directory is removed after the run"
        );
    }
}

/// `python -m cuda_isolate --lib` for a library under a path with a space or a colon (issue 33,
/// item 6): it prints a path that `LD_PRELOAD` keeps whole (a link in a private directory), so
/// `LD_PRELOAD=$(python -m cuda_isolate --lib) prog` preloads the library: isolate mode holds
/// the freed memory back (`b changed 0 bytes`). It printed the path itself, which the loader
/// split: nothing preloaded, the stale write landed (`b changed 1 bytes 16`).
#[test]
fn python_lib_prints_a_path_that_ld_preload_keeps_whole() {
    let has_python = Command::new("python3")
        .arg("-c")
        .arg("pass")
        .status()
        .is_ok_and(|s| s.success());
    if !has_python {
        assert!(std::env::var_os("CI").is_none(), "python3 not found");
        eprintln!("python3 not found: skipped");
        return;
    }
    for name in ["my env", "env:v2"] {
        let d = tempdir();
        let dir = d.path().join(name);
        std::fs::create_dir(&dir).unwrap();
        let lib = dir.join("libisolate.so");
        if std::fs::hard_link(analyzer_path().with_file_name("libisolate.so"), &lib).is_err() {
            std::fs::copy(analyzer_path().with_file_name("libisolate.so"), &lib).unwrap();
        }
        let runtime = d.path().join("run");
        std::fs::create_dir(&runtime).unwrap();
        let out = Command::new("python3")
            .args(["-m", "cuda_isolate", "--lib"])
            .env(
                "PYTHONPATH",
                isolate_tests::workspace_root().join("python/src"),
            )
            .env("CUDA_ISOLATE_LIB", &lib)
            .env("XDG_RUNTIME_DIR", &runtime)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        let printed = String::from_utf8(out.stdout).unwrap();
        let printed = printed.trim_end_matches('\n');
        // run_in_with clears LD_*: the preload goes in through env(1).
        let mut env = Command::new("env");
        env.env("ISOLATE_MODE", "isolate")
            .env("ISOLATE_TRACE", d.path().join("t-%p.trace"));
        let preload = format!("LD_PRELOAD={printed}");
        let o = run_in_with(d.path(), env, &[&preload, &prog("stale_write")]);
        assert_eq!(o.code(), Some(0), "{name:?}: {}", o.describe());
        assert!(
            o.stdout.contains("b changed 0 bytes 0 first 0"),
            "{name:?}: printed {printed:?}: the library was not preloaded: {}",
            o.describe()
        );
    }
}

/// What the analyzer writes from a trace (`report`, `graph -o`, `export -o`: the program's argv,
/// paths and addresses) is private, as the trace is (issue 33, item 11): mode 0600 whatever the
/// umask. They were 0644, readable by every user, while the trace they came from was 0600.
#[test]
fn outputs_derived_from_a_trace_are_private() {
    use std::os::unix::fs::PermissionsExt;
    let d = tempdir();
    let o = isolate(
        d.path(),
        &["run", "--trace", "t-%p.trace", "--", &prog("rt_basic")],
    );
    assert_eq!(o.code(), Some(0), "{}", o.describe());
    let written = o.line("trace written: ");
    let trace = written.split_once(" (pid ").expect("path (pid N)").0;
    let mode = |name: &str| {
        std::fs::metadata(d.path().join(name))
            .unwrap_or_else(|e| panic!("{name}: {e}"))
            .permissions()
            .mode()
            & 0o777
    };
    assert_eq!(mode(trace), 0o600, "the trace itself");
    for (args, out) in [
        (vec!["report", "-o", "r.html", trace], "r.html"),
        (vec!["graph", "-o", "g.json", trace], "g.json"),
        (vec!["graph", "-o", "g.dot", trace], "g.dot"),
        (
            vec!["export", "--format", "chrome-trace", "-o", "c.json", trace],
            "c.json",
        ),
    ] {
        let r = isolate(d.path(), &args);
        assert_eq!(r.code(), Some(0), "{args:?}: {}", r.describe());
        assert_eq!(mode(out), 0o600, "{args:?}: {out} is mode {:o}", mode(out));
    }
}

/// `isolate run --trace` with 12 `%p` in a directory holding a long numeric file name (issue 33,
/// item 11): the command starts and the run names its trace. Matching the existing names against
/// the pattern took time exponential in the count of `%p` (every split of the digits tried):
/// `isolate` never got to start the command (killed by this test's watchdog after 60 s).
#[test]
fn many_numbers_in_the_pattern_and_a_long_numeric_name_still_run() {
    let plain = run_in(tempdir().path(), &program_path("rt_basic"), &[]);
    assert_eq!(plain.code(), Some(0), "{}", plain.describe());
    let d = tempdir();
    std::fs::write(d.path().join("1".repeat(40) + "x"), b"").unwrap();
    let pattern = "%p".repeat(12);
    let o = isolate(
        d.path(),
        &["run", "--trace", &pattern, "--", &prog("rt_basic")],
    );
    assert_eq!(o.code(), Some(0), "{}", o.describe());
    assert_eq!(o.stdout, plain.stdout, "{}", o.describe());
    let written = o.line("trace written: ");
    let (path, pid) = written.split_once(" (pid ").expect("path (pid N)");
    assert_eq!(path, pid.trim_end_matches(')').repeat(12), "{written}");
}

/// A host name like `../../x` (issue 33, item 11; set in a UTS namespace of the test's own) does
/// not take the trace out of its directory: `%h` is one path component (`.._.._x`), for the
/// library that writes the trace and for `isolate run` that names it. The library wrote
/// `a/b/../../x-PID.trace`, outside `a/b`, and the run named no trace. Skipped where no UTS
/// namespace can be made (not root), unless `CI` is set.
#[test]
fn a_host_name_with_slashes_stays_in_the_trace_directory() {
    const SET_HOST: &str = "import os, socket, sys; socket.sethostname(sys.argv[1]); \
                            os.execv(sys.argv[2], sys.argv[2:])";
    let in_namespace = |dir: &Path, cmd: &[&str]| {
        let mut args = vec!["-u", "python3", "-c", SET_HOST, "../../x"];
        args.extend_from_slice(cmd);
        run_in_with(dir, Command::new("unshare"), &args)
    };
    let plain = in_namespace(tempdir().path(), &[&prog("rt_basic")]);
    if plain.code() != Some(0) {
        assert!(
            std::env::var_os("CI").is_none(),
            "no UTS namespace: {}",
            plain.describe()
        );
        eprintln!(
            "no UTS namespace (not root?): skipped\n{}",
            plain.describe()
        );
        return;
    }
    let d = tempdir();
    std::fs::create_dir_all(d.path().join("a/b")).unwrap();
    let isolate_bin = analyzer_path().to_string_lossy().into_owned();
    let o = in_namespace(
        d.path(),
        &[
            &isolate_bin,
            "run",
            "--trace",
            "a/b/%h-%p.trace",
            "--",
            &prog("rt_basic"),
        ],
    );
    assert_eq!(o.code(), Some(0), "{}", o.describe());
    assert_eq!(o.stdout, plain.stdout);
    let outside: Vec<_> = std::fs::read_dir(d.path())
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n != "a")
        .collect();
    assert!(outside.is_empty(), "written outside a/b: {outside:?}");
    let written = o.line("trace written: ");
    let path = written.split_once(" (pid ").expect("path (pid N)").0;
    assert!(path.starts_with("a/b/.._.._x-"), "{written}");
    assert!(d.path().join(path).is_file(), "{path}");
}

/// A setting the library would refuse stops `isolate run` before the command starts (issue 32):
/// one line naming the variable (and the flag that set it) and what is accepted, the command
/// not run, exit 2. Checked by the library's own parser (`isolate_trace::config`), so the words
/// are the library's. Before, the command ran, the library refused the value, and `isolate`
/// announced "mode LOG" and blamed the program for writing no trace.
#[test]
fn a_bad_setting_stops_the_run_before_the_command_starts() {
    let d = tempdir();
    // (the environment, the flags, the line that starts stderr)
    type Case<'a> = (&'a [(&'a str, &'a str)], &'a [&'a str], &'a str);
    let cases: [Case; 5] = [
        (
            &[("ISOLATE_MODE", "LOG")],
            &[],
            "isolate: ISOLATE_MODE=\"LOG\" is not valid; accepted: log, isolate, off",
        ),
        (
            &[],
            &["--trace", "x-%q.trace"],
            "isolate: --trace x-%q.trace: ISOLATE_TRACE=\"x-%q.trace\" is not valid; accepted: a file path; %p = pid",
        ),
        (
            &[],
            &["--trace", ""],
            "isolate: --trace '': ISOLATE_TRACE=\"\" is not valid; accepted: a file path",
        ),
        (
            &[("ISOLATE_GUARD", "on")],
            &["--mode", "log"],
            "isolate: --mode log: ISOLATE_GUARD=on needs ISOLATE_MODE=isolate",
        ),
        (
            &[("ISOLATE_STACK_DEPTH", "deep")],
            &[],
            "isolate: ISOLATE_STACK_DEPTH=\"deep\" is not valid; accepted: a number of frames from 1 to 256",
        ),
    ];
    for (env, flags, want) in cases {
        let mut cmd = Command::new(analyzer_path());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut args = vec!["run"];
        args.extend_from_slice(flags);
        args.extend(["--", "sh", "-c", "touch ran"]);
        let o = run_in_with(d.path(), cmd, &args);
        assert_eq!(o.code(), Some(2), "{env:?} {flags:?}: {}", o.describe());
        assert!(
            !d.path().join("ran").exists(),
            "{env:?} {flags:?}: the command ran"
        );
        assert_eq!(
            o.stderr.lines().count(),
            1,
            "{env:?} {flags:?}: one line: {}",
            o.describe()
        );
        assert!(
            o.stderr.starts_with(want)
                && o.stderr.trim_end().ends_with("; the command was not run"),
            "{env:?} {flags:?}: {}",
            o.describe()
        );
    }
}

/// A command that changes directory before its first CUDA call (here a shell that `cd`s, then
/// runs the program): its trace still goes where the relative pattern names it from the
/// directory `isolate run` started in, and is found and named there.
#[test]
fn a_command_that_changes_directory_still_has_its_trace_found() {
    let d = tempdir();
    std::fs::create_dir(d.path().join("sub")).unwrap();
    for flags in [&[][..], &["--trace", "t-%p.trace"][..]] {
        let script = format!("cd sub && exec {} > /dev/null", prog("rt_basic"));
        let mut args = vec!["run"];
        args.extend_from_slice(flags);
        args.extend(["--", "sh", "-c", &script]);
        let o = isolate(d.path(), &args);
        assert_eq!(o.code(), Some(0), "{}", o.describe());
        let written = o.line("trace written: ");
        let name = written.split(' ').next().unwrap();
        assert!(
            !name.contains('/'),
            "named relative, as the pattern is: {written}"
        );
        assert!(d.path().join(name).is_file(), "{}", o.describe());
        assert_eq!(
            std::fs::read_dir(d.path().join("sub")).unwrap().count(),
            0,
            "nothing written in the directory the command moved to"
        );
        let r = run_printed(d.path(), o.line("read it with: "));
        assert_eq!(r.code(), Some(0), "{}", r.describe());
        std::fs::remove_file(d.path().join(name)).unwrap();
    }
}
