//! `common::skip`, the analyzer's tests' copy of `isolate_tests::skip`, which every test here
//! that needs a tool the machine may lack (Chromium, node and `npm ci`, Graphviz, python3)
//! calls when it is missing: without `CI` the skip is one `SKIPPED <test>: <why>` line on the
//! terminal's stderr, past the test harness's capture (an `eprintln!` of a passing test is never
//! shown), and the test passes; with `CI` set the test fails with the same words. The check is
//! `isolate_tests`' own, shared by file (`tests/src/skip_check.rs`); this test runs its own test
//! binary on itself, as the child that skips.

mod common;

#[path = "../../tests/src/skip_check.rs"]
mod skip_check;

#[test]
fn a_skip_says_so_on_stderr_and_fails_with_ci_set() {
    skip_check::skip_says_so_on_stderr_and_fails_with_ci_set(
        "a_skip_says_so_on_stderr_and_fails_with_ci_set",
        common::skip,
    );
}
