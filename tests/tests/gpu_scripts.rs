//! The GPU suite's scripts (tests/gpu/), as far as they run without a GPU: what each of the
//! tier benchmark's configurations runs with. A configuration meant to measure the library that
//! runs without it gives ratios of 1 and no findings, which read as a result (the seventeenth
//! session's calls did, for every row but the pluggable ones).

use std::path::Path;
use std::process::Command;

fn env_of(config: &str) -> Vec<(String, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = Command::new("python3")
        .arg(root.join("tests/gpu/tier_bench.py"))
        .args(["--lib", "/lib/libisolate.so", "--env", config])
        .output()
        .expect("python3 runs");
    assert!(
        out.status.success(),
        "{config}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            let (k, v) = l.split_once('=').unwrap();
            (k.to_string(), v.to_string())
        })
        .collect()
}

fn get<'a>(env: &'a [(String, String)], key: &str) -> Option<&'a str> {
    env.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
}

#[test]
fn every_tier_configuration_with_the_library_preloads_it_and_writes_its_traces() {
    for config in [
        "log",
        "isolate",
        "fast",
        "fast-nostacks",
        "isolate-bare",
        "fast-pluggable",
        "isolate-ab",
    ] {
        let env = env_of(config);
        assert_eq!(
            get(&env, "LD_PRELOAD"),
            Some("/lib/libisolate.so"),
            "{config}: {env:?}"
        );
        assert_eq!(
            get(&env, "ISOLATE_TRACE"),
            Some("TRACES/t-%p.trace"),
            "{config}: {env:?}"
        );
        assert!(get(&env, "ISOLATE_MODE").is_some(), "{config}: {env:?}");
    }
    assert_eq!(get(&env_of("fast"), "ISOLATE_CHECK"), Some("fast"));
    assert_eq!(
        get(&env_of("fast-pluggable"), "TIER_PLUGGABLE"),
        Some("PLUGGABLE.so")
    );
}

#[test]
fn the_baselines_run_without_the_library() {
    assert!(env_of("default").is_empty());
    let backend = env_of("backend");
    assert_eq!(
        backend,
        vec![(
            "PYTORCH_CUDA_ALLOC_CONF".to_string(),
            "backend:cudaMallocAsync".to_string()
        )]
    );
    let pluggable = env_of("pluggable");
    assert_eq!(get(&pluggable, "LD_PRELOAD"), None);
    assert_eq!(get(&pluggable, "TIER_PLUGGABLE"), Some("PLUGGABLE.so"));
}
