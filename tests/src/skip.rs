//! The one test-skip helper, shared by file: `isolate_tests::skip` (this crate's `lib.rs`) and
//! the analyzer's tests (`analyzer/tests/common/mod.rs`, `#[path]`), which cannot depend on
//! this crate (its build script compiles the stand-in CUDA).

/// Called by a test that cannot run here because something it needs is missing: `why` says
/// what is missing and how to get it. Without `CI` set, one `SKIPPED <test>: <why>` line goes
/// straight to the terminal's stderr (past the test harness's capture, which would hide an
/// `eprintln!` of a passing test) and the caller returns, its test reported "ok" though it did
/// not run; with `CI` set it fails the test instead, with the same words (.ci/run installs
/// everything the tests use).
pub fn skip(why: &str) {
    let test = std::thread::current()
        .name()
        .filter(|n| *n != "main")
        .unwrap_or("a test")
        .to_owned();
    if std::env::var_os("CI").is_some() {
        panic!("{test}: {why}; CI is set, so this fails instead of being skipped");
    }
    use std::io::Write as _;
    let _ = writeln!(
        std::io::stderr().lock(),
        "SKIPPED {test}: {why} (it passes without running; it fails with CI set)"
    );
}
