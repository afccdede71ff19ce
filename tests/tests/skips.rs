//! [`isolate_tests::skip`], which every test that needs a tool the machine may lack (python3,
//! pytest, a CPython 3.10-3.13, a tmpfs mount) calls when it is missing: without `CI` the
//! skip is one `SKIPPED <test>: <why>` line on the terminal's stderr, past the test harness's
//! capture (an `eprintln!` of a passing test is never shown), and the test passes; with `CI`
//! set the test fails with the same words. This test runs its own test binary on itself, as the
//! child that skips.

use std::process::{Command, Output};

const NAME: &str = "a_skip_says_so_on_stderr_and_fails_with_ci_set";
const WHY: &str = "frobnicator 3 is not installed (apt-get install frobnicator)";

fn child(ci: bool) -> Output {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([NAME, "--exact", "--test-threads=1"])
        .env("ISOLATE_TEST_SKIP_CHILD", "1")
        .env_remove("CI");
    if ci {
        cmd.env("CI", "1");
    }
    cmd.output().unwrap()
}

#[test]
fn a_skip_says_so_on_stderr_and_fails_with_ci_set() {
    if std::env::var_os("ISOLATE_TEST_SKIP_CHILD").is_some() {
        isolate_tests::skip(WHY);
        return;
    }
    let out = child(false);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}{stderr}");
    assert!(stdout.contains("1 passed"), "{stdout}");
    let line = format!("SKIPPED {NAME}: {WHY}");
    assert!(
        stderr.lines().any(|l| l.starts_with(&line)),
        "no {line:?} on stderr:\n{stderr}"
    );

    let out = child(true);
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!out.status.success(), "{all}");
    assert!(all.contains("1 failed"), "{all}");
    assert!(all.contains(&format!("{NAME}: {WHY}; CI is set")), "{all}");
}
