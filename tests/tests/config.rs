//! Settings and the trace file: malformed settings stop the program before `main`; the file
//! is created exclusively, mode 0600, never through a symlink, never over another file.

use isolate_tests::{Run, Trace};
use isolate_trace::EndReason;
use std::os::unix::fs::PermissionsExt;

fn refused(run: Run, variable: &str) {
    let out = run.run();
    assert_eq!(
        out.code(),
        Some(2),
        "{variable}: exit status 2 expected\nstdout:\n{}\nstderr:\n{}",
        out.stdout,
        out.stderr
    );
    assert_eq!(out.stdout, "", "{variable}: stopped before main");
    let lines: Vec<&str> = out.stderr.lines().collect();
    assert_eq!(
        lines.len(),
        1,
        "{variable}: one stderr line: {:?}",
        out.stderr
    );
    assert!(
        lines[0].contains(variable),
        "the line names {variable}: {:?}",
        lines[0]
    );
    assert!(out.traces.is_empty());
}

#[test]
fn malformed_mode() {
    refused(
        Run::program("rt_basic").env("ISOLATE_MODE", "bogus"),
        "ISOLATE_MODE",
    );
}

#[test]
fn malformed_poison() {
    refused(
        Run::program("rt_basic").env("ISOLATE_POISON", "0x1FF"),
        "ISOLATE_POISON",
    );
}

#[test]
fn malformed_quarantine() {
    refused(
        Run::program("rt_basic").env("ISOLATE_QUARANTINE", "lots"),
        "ISOLATE_QUARANTINE",
    );
}

#[test]
fn malformed_trace_pattern() {
    refused(Run::program("rt_basic").trace("%q"), "ISOLATE_TRACE");
}

#[test]
fn unknown_setting() {
    refused(
        Run::program("rt_basic").env("ISOLATE_FOO", "1"),
        "ISOLATE_FOO",
    );
    // Also in a program that never touches CUDA: the settings are read before main.
    refused(
        Run::program("nocuda").env("ISOLATE_FOO", "1"),
        "ISOLATE_FOO",
    );
}

/// The free and release settings that exist only to measure are test-only (issue 29): their
/// old names are refused like any unknown setting, and the settings the refusal lists name
/// `ISOLATE_REUSE` (the user's choice) but no `ISOLATE_TEST_*` name.
#[test]
fn measurement_settings_are_test_only() {
    // Each with its default value, which the old name accepted.
    for (old, value) in [
        ("ISOLATE_RELEASE", "async"),
        ("ISOLATE_POISON_BY", "memset"),
        ("ISOLATE_POISON_BATCH", "on"),
    ] {
        refused(Run::program("rt_basic").env(old, value), old);
    }
    let out = Run::program("rt_basic")
        .env("ISOLATE_RELEASE", "sync")
        .run();
    assert!(out.stderr.contains("ISOLATE_REUSE"), "{}", out.stderr);
    assert!(!out.stderr.contains("ISOLATE_TEST_"), "{}", out.stderr);
    // The test-only names are read.
    let out = Run::program("rt_basic")
        .env("ISOLATE_MODE", "isolate")
        .env("ISOLATE_TEST_RELEASE", "sync")
        .env("ISOLATE_TEST_POISON_BY", "kernel")
        .env("ISOLATE_TEST_POISON_BATCH", "off")
        .run();
    out.assert_success();
    let t = out.only_trace();
    for (k, v) in [
        ("ISOLATE_TEST_RELEASE", "sync"),
        ("ISOLATE_TEST_POISON_BY", "kernel"),
    ] {
        assert!(
            t.header.config.iter().any(|(a, b)| a == k && b == v),
            "{k}={v} in {:?}",
            t.header.config
        );
    }
}

#[test]
fn mode_off_records_nothing() {
    let both = Run::program("rt_basic")
        .env("ISOLATE_MODE", "off")
        .run_both();
    both.traced.assert_success();
    assert!(both.traced.traces.is_empty(), "{:?}", both.traced.traces);
    assert_eq!(both.traced.stderr, "");
    let both = Run::program("drv_static")
        .env("ISOLATE_MODE", "off")
        .run_both();
    assert!(both.traced.traces.is_empty());
}

#[test]
fn trace_file_is_private() {
    let out = Run::program("rt_basic").run();
    out.assert_success();
    let t = out.only_trace();
    let mode = std::fs::metadata(&t.path).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode, 0o600, "{}", t.path.display());
    assert_eq!(
        t.path.file_name().unwrap().to_string_lossy(),
        format!("isolate-{}.trace", out.pid)
    );
    assert_eq!(t.header.pid, out.pid);
    assert_eq!(t.header.ppid, std::process::id());
    assert_eq!(t.header.mode, "log");
    let exe = isolate_tests::program_path("rt_basic");
    assert_eq!(std::path::Path::new(&t.header.exe), exe.as_path());
    assert_eq!(t.header.argv, vec![exe.to_string_lossy().into_owned()]);
    assert!(
        t.header
            .config
            .iter()
            .any(|(k, v)| k == "ISOLATE_MODE" && v == "log"),
        "{:?}",
        t.header.config
    );
}

#[test]
fn pattern_expansion() {
    let out = Run::program("rt_basic")
        .trace("{dir}/t-%p-r%r-%h-%%.trace")
        .env("RANK", "3")
        .env("WORLD_SIZE", "4")
        .run();
    out.assert_success();
    let t = out.only_trace();
    let host = t.header.hostname.clone();
    assert_eq!(
        t.path.file_name().unwrap().to_string_lossy(),
        format!("t-{}-r3-{host}-%.trace", out.pid)
    );
    assert_eq!((t.header.rank, t.header.world_size), (Some(3), Some(4)));
}

#[test]
fn existing_file_is_not_overwritten() {
    let out = Run::program("rt_basic")
        .setup(|dir| std::fs::write(dir.join("fixed.trace"), b"keep me").unwrap())
        .trace("{dir}/fixed.trace")
        .run();
    out.assert_success();
    let dir = out.dir.path();
    assert_eq!(std::fs::read(dir.join("fixed.trace")).unwrap(), b"keep me");
    let t = Trace::read(&dir.join("fixed.trace.1"));
    t.assert_complete(EndReason::Exit);
    out.assert_trace_matches(&t, None);
}

#[test]
fn symlink_at_the_trace_path_is_not_followed() {
    let out = Run::program("rt_basic")
        .setup(|dir| {
            std::os::unix::fs::symlink(dir.join("victim"), dir.join("dangling.trace")).unwrap();
        })
        .trace("{dir}/dangling.trace")
        .run();
    out.assert_success();
    let dir = out.dir.path();
    assert!(!dir.join("victim").exists(), "the symlink was followed");
    assert!(
        dir.join("dangling.trace")
            .symlink_metadata()
            .unwrap()
            .file_type()
            .is_symlink()
    );
    Trace::read(&dir.join("dangling.trace.1")).assert_complete(EndReason::Exit);

    let out = Run::program("rt_basic")
        .setup(|dir| {
            std::fs::write(dir.join("victim"), b"precious").unwrap();
            std::os::unix::fs::symlink(dir.join("victim"), dir.join("link.trace")).unwrap();
        })
        .trace("{dir}/link.trace")
        .run();
    out.assert_success();
    let dir = out.dir.path();
    assert_eq!(std::fs::read(dir.join("victim")).unwrap(), b"precious");
    Trace::read(&dir.join("link.trace.1")).assert_complete(EndReason::Exit);
}

fn unwritable(pattern: &str, setup: impl Fn(&std::path::Path) + Send + Sync + 'static) {
    let plain = Run::program("rt_basic").preload(false).run();
    let out = Run::program("rt_basic").setup(setup).trace(pattern).run();
    out.assert_same_as(&plain);
    // Unchanged includes its time: no wait at exit for a writer that never started.
    assert!(
        out.elapsed < plain.elapsed + std::time::Duration::from_secs(1),
        "{pattern}: {:?} with the preload, {:?} without",
        out.elapsed,
        plain.elapsed
    );
    let lines: Vec<&str> = out.stderr.lines().collect();
    assert_eq!(lines.len(), 1, "one stderr line: {:?}", out.stderr);
    assert!(lines[0].starts_with("isolate: "), "{:?}", lines[0]);
    let shown = pattern
        .replace("{dir}", &out.dir.path().to_string_lossy())
        .replace("%p", &out.pid.to_string());
    assert!(
        lines[0].contains(&shown),
        "the line names the path {shown}: {:?}",
        lines[0]
    );
}

#[test]
fn unwritable_trace_directory() {
    unwritable("{dir}/no/such/dir/isolate-%p.trace", |_| {});
    unwritable("{dir}/a-file/isolate-%p.trace", |dir| {
        std::fs::write(dir.join("a-file"), b"").unwrap()
    });
    if unsafe { libc::geteuid() } != 0 {
        unwritable("{dir}/ro/isolate-%p.trace", |dir| {
            std::fs::create_dir(dir.join("ro")).unwrap();
            std::fs::set_permissions(dir.join("ro"), std::fs::Permissions::from_mode(0o500))
                .unwrap();
        });
    }
}
