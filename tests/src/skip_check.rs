//! The check of the one test-skip helper (`skip.rs`), shared by file like the helper
//! itself: `tests/tests/skips.rs` runs it on `isolate_tests::skip` and `analyzer/tests/skips.rs`
//! on the analyzer's tests' `common::skip`. The test binary runs itself, as the child that skips.

use std::process::{Command, Output};

const WHY: &str = "frobnicator 3 is not installed (apt-get install frobnicator)";

/// The whole check, called by the test named `name` (at the root of its test binary, so that
/// `--exact` finds it): as the child (`ISOLATE_TEST_SKIP_CHILD` set), it skips with `skip`;
/// else it runs the child twice and checks both runs: without `CI`, one `SKIPPED <test>: <why>`
/// line on stderr and the test passes; with `CI` set, the test fails with the same words.
pub fn skip_says_so_on_stderr_and_fails_with_ci_set(name: &str, skip: fn(&str)) {
    if std::env::var_os("ISOLATE_TEST_SKIP_CHILD").is_some() {
        skip(WHY);
        return;
    }
    let out = child(name, false);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}{stderr}");
    assert!(stdout.contains("1 passed"), "{stdout}");
    let line = format!("SKIPPED {name}: {WHY}");
    assert!(
        stderr.lines().any(|l| l.starts_with(&line)),
        "no {line:?} on stderr:\n{stderr}"
    );

    let out = child(name, true);
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!out.status.success(), "{all}");
    assert!(all.contains("1 failed"), "{all}");
    assert!(all.contains(&format!("{name}: {WHY}; CI is set")), "{all}");
}

fn child(name: &str, ci: bool) -> Output {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([name, "--exact", "--test-threads=1"])
        .env("ISOLATE_TEST_SKIP_CHILD", "1")
        .env_remove("CI");
    if ci {
        cmd.env("CI", "1");
    }
    cmd.output().unwrap()
}
