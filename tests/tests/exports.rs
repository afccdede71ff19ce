//! The symbols libisolate.so exports are exactly the ones we mean to: every other name stays
//! mangled and local (a stray export would bind the program's own calls to us).

use std::process::Command;

#[test]
fn exports_are_exactly_the_intended_list() {
    let lib = isolate_tests::preload_path();
    let out = Command::new("nm")
        .args(["-D", "--defined-only"])
        .arg(&lib)
        .output()
        .expect("nm (binutils) must be installed");
    assert!(
        out.status.success(),
        "nm failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut got: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().nth(2).map(str::to_string))
        .collect();
    got.sort();
    got.dedup();
    let path = isolate_tests::workspace_root().join("tests/expected-exports.txt");
    let text = std::fs::read_to_string(&path).unwrap();
    let want: Vec<String> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(String::from)
        .collect();
    let mut sorted = want.clone();
    sorted.sort();
    assert_eq!(want, sorted, "{} is kept sorted", path.display());
    let extra: Vec<_> = got.iter().filter(|n| !want.contains(n)).collect();
    let missing: Vec<_> = want.iter().filter(|n| !got.contains(n)).collect();
    assert!(
        extra.is_empty() && missing.is_empty(),
        "{} exports differ from {}:\n  not in the list: {extra:?}\n  listed but not exported: {missing:?}",
        lib.display(),
        path.display()
    );
}
