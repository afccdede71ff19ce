//! One size grammar (issue 29.2): the library and the analyzer call `isolate_trace::parse_size`;
//! the Python package has a port (`cuda_isolate.parse_size`). Both are run on every case of
//! `trace/src/size-cases.txt` (which the trace crate's own test also checks) and must agree,
//! byte count for byte count, refusal for refusal.

use isolate_tests::workspace_root;
use std::process::Command;

#[test]
fn python_port_agrees_with_the_trace_crate() {
    let root = workspace_root();
    let cases = std::fs::read_to_string(root.join("trace/src/size-cases.txt")).unwrap();
    let script = r##"
import sys, cuda_isolate
for line in sys.stdin.read().split("\n"):
    if not line or line.startswith("#"):
        continue
    want, text = line.split("\t", 1)
    try:
        got = str(cuda_isolate.parse_size(text))
    except ValueError:
        got = "-"
    print(got)
"##;
    let mut child = match Command::new("python3")
        .args(["-c", script])
        .env("PYTHONPATH", root.join("python/src"))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
    {
        Ok(c) => c,
        Err(e) => {
            isolate_tests::skip(&format!(
                "python3 not found ({e}): the Python port is not checked"
            ));
            return;
        }
    };
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(cases.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "python3 failed");
    let python: Vec<String> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect();
    let rows: Vec<(&str, &str)> = cases
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| l.split_once('\t').unwrap())
        .collect();
    assert_eq!(python.len(), rows.len());
    assert!(rows.len() > 40, "the cases file is there");
    for ((want, text), py) in rows.iter().zip(&python) {
        let rust = isolate_trace::parse_size(text).map_or("-".to_string(), |v| v.to_string());
        assert_eq!(
            (&rust, py),
            (&want.to_string(), &want.to_string()),
            "{text:?}: Rust {rust}, Python {py}, the cases file {want}"
        );
    }
}
