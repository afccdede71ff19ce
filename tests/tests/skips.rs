//! [`isolate_tests::skip`], which every test that needs a tool the machine may lack (python3,
//! pytest, a CPython 3.10-3.13, a tmpfs mount) calls when it is missing: without `CI` the
//! skip is one `SKIPPED <test>: <why>` line on the terminal's stderr, past the test harness's
//! capture (an `eprintln!` of a passing test is never shown), and the test passes; with `CI`
//! set the test fails with the same words. The check is shared with the analyzer's tests by
//! file (`tests/src/skip_check.rs`); this test runs its own test binary on itself, as the child
//! that skips.

#[path = "../src/skip_check.rs"]
mod skip_check;

#[test]
fn a_skip_says_so_on_stderr_and_fails_with_ci_set() {
    skip_check::skip_says_so_on_stderr_and_fails_with_ci_set(
        "a_skip_says_so_on_stderr_and_fails_with_ci_set",
        isolate_tests::skip,
    );
}
