//! The GPU suite's scripts (tests/gpu/), as far as they run without a GPU: what each of the
//! tier benchmark's configurations runs with. A configuration meant to measure the library that
//! runs without it gives ratios of 1 and no findings, which read as a result (the seventeenth
//! session's calls did, for every row but the pluggable ones).

use std::path::Path;
use std::process::Command;

/// The variables `script --env config` prints (its configuration's runs, as set by it), or
/// its stderr when it refuses.
fn script_env(script: &str, config: &str) -> Result<Vec<(String, String)>, String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = Command::new("python3")
        .arg(root.join("tests/gpu").join(script))
        .args(["--lib", "/lib/libisolate.so", "--env", config])
        .output()
        .expect("python3 runs");
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    Ok(String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            let (k, v) = l.split_once('=').unwrap();
            (k.to_string(), v.to_string())
        })
        .collect())
}

/// The tier benchmark's configuration `config`'s variables.
fn env_of(config: &str) -> Vec<(String, String)> {
    script_env("tier_bench.py", config).unwrap_or_else(|e| panic!("{config}: {e}"))
}

/// Asserts that a configuration's variables preload the library (`--lib /lib/libisolate.so`)
/// and name its trace `trace`.
fn assert_library_run(env: &[(String, String)], trace: &str, config: &str) {
    assert_eq!(
        get(env, "LD_PRELOAD"),
        Some("/lib/libisolate.so"),
        "{config}: {env:?}"
    );
    assert_eq!(get(env, "ISOLATE_TRACE"), Some(trace), "{config}: {env:?}");
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
        assert_library_run(&env, "TRACES/t-%p.trace", config);
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
    // The backend's floor: the backend, its allocations answered by backend_pool.c (built
    // beside the pluggable allocator's library), and no library.
    let pool = env_of("backend-pool");
    assert_eq!(
        get(&pool, "PYTORCH_CUDA_ALLOC_CONF"),
        Some("backend:cudaMallocAsync")
    );
    assert_eq!(get(&pool, "LD_PRELOAD"), Some("backend_pool.so"));
    assert_eq!(get(&pool, "ISOLATE_TRACE"), None);
    assert_eq!(get(&pool, "ISOLATE_MODE"), None);
}

/// backend_pool.c, the backend's floor in the tier benchmark, on the stand-in: a freed block is
/// handed out again for the same size on the stream that freed it, never while it is live and
/// never on another stream (where the driver's pool, as the stand-in's, may hand it out).
#[test]
fn the_backends_floor_reuses_a_block_on_its_own_stream_only() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let dir = tempfile::tempdir().unwrap();
    let so = dir.path().join("backend_pool.so");
    let cc = |args: &[&std::ffi::OsStr]| {
        let out = Command::new("cc").args(args).output().expect("cc runs");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    cc(&[
        "-O2".as_ref(),
        "-shared".as_ref(),
        "-fPIC".as_ref(),
        "-o".as_ref(),
        so.as_os_str(),
        root.join("tests/gpu/backend_pool.c").as_os_str(),
        "-ldl".as_ref(),
        "-lpthread".as_ref(),
    ]);
    let prog = dir.path().join("prog.c");
    std::fs::write(
        &prog,
        r#"#include <stdio.h>
#include <stddef.h>
int cudaMallocAsync(void **, size_t, void *);
int cudaFreeAsync(void *, void *);
int cudaStreamCreate(void **);
int main(void) {
    void *a = 0, *b = 0, *c = 0, *d = 0, *e = 0, *s1, *s2;
    int r = cudaStreamCreate(&s1) | cudaStreamCreate(&s2);
    r |= cudaMallocAsync(&a, 4096, s1);
    r |= cudaFreeAsync(a, s1);
    r |= cudaMallocAsync(&b, 4096, s1);
    r |= cudaMallocAsync(&c, 4096, s1);
    r |= cudaFreeAsync(c, s1);
    r |= cudaMallocAsync(&d, 4096, s2);
    r |= cudaMallocAsync(&e, 8192, s1);
    printf("rc=%d same-stream-again=%d live-not-again=%d other-stream=%d other-size=%d\n",
           r, a == b, c != b, d != c, e != c);
    return 0;
}
"#,
    )
    .unwrap();
    let exe = dir.path().join("prog");
    let standin = isolate_tests::standin_dir();
    cc(&[
        "-o".as_ref(),
        exe.as_os_str(),
        prog.as_os_str(),
        format!("-L{}", standin.display()).as_ref(),
        "-lcudart".as_ref(),
        format!("-Wl,-rpath,{}", standin.display()).as_ref(),
    ]);
    let run = |preload: bool| {
        let mut c = Command::new(&exe);
        c.env("LD_LIBRARY_PATH", &standin).env("STANDIN_SYNC", "1");
        if preload {
            c.env("LD_PRELOAD", &so);
        }
        let out = c.output().unwrap();
        assert!(out.status.success());
        (
            String::from_utf8(out.stdout).unwrap(),
            String::from_utf8(out.stderr).unwrap(),
        )
    };
    let (with, report) = run(true);
    assert_eq!(
        with.trim(),
        "rc=0 same-stream-again=1 live-not-again=1 other-stream=1 other-size=1"
    );
    assert!(
        report.contains("backend-pool: 1 of 5 allocations served from 4 kept blocks"),
        "{report}"
    );
    // Without it the stand-in's pool hands the block freed on one stream to the other: the
    // program tells the two apart.
    let (without, _) = run(false);
    assert!(without.contains("other-stream=0"), "{without}");
}

/// Runs tier_bench.py with the stand-in worker (tier_bench_fake.py: no torch, no GPU; each
/// step a 1 MiB allocation and free through the stand-in) and `lib` as the library; returns
/// (the steps as they ran, stdout).
fn fake_bench(lib: &str, extra: &[&str]) -> (String, String) {
    fake_bench_with(lib, extra, &[])
}

/// [`fake_bench`] with more variables for the worker.
fn fake_bench_with(lib: &str, extra: &[&str], vars: &[(&str, &str)]) -> (String, String) {
    let dir = tempfile::tempdir().unwrap();
    fake_bench_in(dir.path(), lib, extra, vars)
}

/// [`fake_bench_with`] with its results (`OUT`) in `dir`, kept.
fn fake_bench_in(dir: &Path, lib: &str, extra: &[&str], vars: &[(&str, &str)]) -> (String, String) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let log = dir.join("steps");
    let out = Command::new("python3")
        .arg(root.join("tests/gpu/tier_bench.py"))
        .args(["--warmup", "1", "--rounds", "1", "--lib", lib, "--isolate"])
        .arg(isolate_tests::analyzer_path())
        .args(extra)
        .env("TIER_WORKER", root.join("tests/gpu/tier_bench_fake.py"))
        .env(
            "FAKE_CUDART",
            isolate_tests::standin_dir().join("libcudart.so"),
        )
        .env("LD_LIBRARY_PATH", isolate_tests::standin_dir())
        .env("FAKE_LOG", &log)
        .env("OUT", dir)
        .envs(vars.iter().copied())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    (std::fs::read_to_string(&log).unwrap(), stdout)
}

/// The table's row of `model` under `config`.
fn row<'a>(stdout: &'a str, model: &str, config: &str) -> &'a str {
    stdout
        .lines()
        .find(|l| l.starts_with(&format!("| {model} | {config} |")))
        .unwrap_or_else(|| panic!("no row {model} {config}: {stdout}"))
}

/// `--lockstep`: every configuration's process alive at once, their timed steps taken in turns
/// of exactly the given number, one process at a time, each round of turns giving each one a
/// turn; the results of all of them collected, with the library runs' traces summarised.
#[test]
fn lockstep_runs_take_turns_of_whole_bursts_one_configuration_at_a_time() {
    let lib = isolate_tests::preload_path();
    let (steps, stdout) = fake_bench(
        lib.to_str().unwrap(),
        &[
            "--lockstep",
            "2",
            "--steps",
            "6",
            "--models",
            "a,b",
            "--configs",
            "default,log,isolate",
        ],
    );
    for model in ["a", "b"] {
        // (config, step) in the order they ran, the warm-up steps (0) left out: those run side
        // by side, untimed.
        let timed: Vec<(String, u32)> = steps
            .lines()
            .filter_map(|l| {
                let f: Vec<&str> = l.split(' ').collect();
                let step: u32 = f[2].parse().unwrap();
                (f[1] == model && step > 0).then(|| (f[0].to_string(), step))
            })
            .collect();
        assert_eq!(timed.len(), 18, "{model}: {timed:?}");
        let turns: Vec<&[(String, u32)]> = timed.chunks(2).collect();
        for t in &turns {
            assert_eq!(
                t[0].0, t[1].0,
                "{model}: a turn is one configuration's: {timed:?}"
            );
            assert_eq!(t[0].1 + 1, t[1].1, "{model}: {timed:?}");
        }
        for round in turns.chunks(3) {
            let mut who: Vec<&str> = round.iter().map(|t| t[0].0.as_str()).collect();
            who.sort_unstable();
            assert_eq!(who, ["default", "isolate", "log"], "{model}: {timed:?}");
        }
        for config in ["log", "isolate"] {
            let r = row(&stdout, model, config);
            assert!(r.ends_with("| 0 |"), "{r}");
            // The library's calls during the timed steps, from its C API: a step is one
            // cudaMalloc and one cudaFree; and the allocations the driver made, the one
            // cudaMalloc (kept memory serves stream-ordered allocations only).
            assert!(r.contains("| 2.0 | 1.0 | equal |"), "{r}");
        }
        let r = row(&stdout, model, "default");
        assert!(r.contains("| – | – | equal |"), "{r}");
    }
    assert!(
        stdout.contains("side by side in turns of 2 steps"),
        "{stdout}"
    );
}

/// Side by side, more than three isolate-mode configurations (each with its whole quarantine,
/// a quarter of the device) overcommit the device: the benchmark says so on stderr and in its
/// data; three, or log mode besides, do not.
#[test]
fn four_quarantines_side_by_side_are_said_to_overcommit_the_device() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let lib = isolate_tests::preload_path();
    for (configs, over) in [
        ("default,log,isolate,fast,isolate-prof", None),
        (
            "default,isolate,fast,isolate-prof,fast-prof",
            Some("isolate,fast,isolate-prof,fast-prof"),
        ),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let out = Command::new("python3")
            .arg(root.join("tests/gpu/tier_bench.py"))
            .args([
                "--warmup",
                "1",
                "--rounds",
                "1",
                "--steps",
                "2",
                "--lockstep",
                "1",
            ])
            .args(["--models", "a", "--configs", configs, "--lib"])
            .arg(&lib)
            .arg("--isolate")
            .arg(isolate_tests::analyzer_path())
            .env("TIER_WORKER", root.join("tests/gpu/tier_bench_fake.py"))
            .env(
                "FAKE_CUDART",
                isolate_tests::standin_dir().join("libcudart.so"),
            )
            .env("LD_LIBRARY_PATH", isolate_tests::standin_dir())
            .env("FAKE_LOG", dir.path().join("steps"))
            .env("OUT", dir.path())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{configs}: {stderr}");
        let data: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(dir.path().join("tier_bench.json")).unwrap(),
        )
        .unwrap();
        let said = data["overcommitted"].as_array().map(|a| {
            a.iter()
                .map(|c| c.as_str().unwrap())
                .collect::<Vec<_>>()
                .join(",")
        });
        assert_eq!(said.as_deref(), over, "{configs}: {stderr}");
        assert_eq!(
            stderr.contains("side by side (") && stderr.contains("Run at most three"),
            over.is_some(),
            "{configs}: {stderr}"
        );
    }
}

/// A configuration with the library whose runs left no trace (here: the library does not
/// exist) reads NO TRACE, one after another as side by side; never 0 findings.
#[test]
fn a_library_run_without_a_trace_says_so() {
    for extra in [&["--lockstep", "1"][..], &[][..]] {
        let mut args = vec!["--steps", "2", "--models", "a", "--configs", "default,fast"];
        args.extend_from_slice(extra);
        let (_, stdout) = fake_bench("/nonexistent/libisolate.so", &args);
        assert!(
            row(&stdout, "a", "fast").ends_with("| NO TRACE |"),
            "{stdout}"
        );
        assert!(row(&stdout, "a", "default").ends_with("| – |"), "{stdout}");
    }
}

/// A configuration's process that dies in the middle of a side-by-side run costs that
/// configuration's row ("no run"), not the call: the others take their turns to the end and
/// are measured.
#[test]
fn a_process_dying_side_by_side_leaves_the_others_measured() {
    let (steps, stdout) = fake_bench_with(
        "/nonexistent/libisolate.so",
        &[
            "--lockstep",
            "2",
            "--steps",
            "6",
            "--models",
            "a",
            "--configs",
            "default,log,isolate",
        ],
        &[("FAKE_CRASH", "log")],
    );
    assert!(row(&stdout, "a", "log").contains("no run"), "{stdout}");
    for config in ["default", "isolate"] {
        let timed = steps
            .lines()
            .filter(|l| l.starts_with(&format!("{config} a ")) && !l.ends_with(" 0"))
            .count();
        assert_eq!(timed, 6, "{config}: {steps}");
        assert!(!row(&stdout, "a", config).contains("no run"), "{stdout}");
    }
}

/// With the default run again as configurations of their own (`default-again`,
/// `default-third`), the table ends with the method's noise: per model, every A/A ratio (two a
/// round) and the SD of their logarithm.
#[test]
fn the_table_states_the_methods_own_noise_from_the_default_run_again() {
    let (_, stdout) = fake_bench(
        "/nonexistent/libisolate.so",
        &[
            "--rounds",
            "2",
            "--steps",
            "2",
            "--models",
            "a",
            "--configs",
            "default,default-again,default-third",
        ],
    );
    assert!(stdout.contains("The method's own noise"), "{stdout}");
    let line = stdout
        .lines()
        .find(|l| l.starts_with("| a | ") && l.matches(',').count() == 3)
        .unwrap_or_else(|| panic!("no noise row: {stdout}"));
    let cells: Vec<&str> = line.split('|').map(str::trim).collect();
    let ratios: Vec<f64> = cells[2].split(", ").map(|x| x.parse().unwrap()).collect();
    assert_eq!(ratios.len(), 4, "{line}");
    assert!(ratios.iter().all(|x| (0.2..5.0).contains(x)), "{line}");
    let sd: f64 = cells[3].parse().unwrap_or_else(|_| panic!("{line}"));
    assert!(sd >= 0.0, "{line}");
    // Without them, no such section.
    let (_, plain) = fake_bench(
        "/nonexistent/libisolate.so",
        &["--steps", "2", "--models", "a", "--configs", "default"],
    );
    assert!(!plain.contains("The method's own noise"), "{plain}");
}

/// The steadier view: each process's lower-decile step against the geometric mean of the
/// round's two default processes, computed from the steps themselves (a run's one slow
/// process, or slow steps within one, move the median table but not this one), and the A/A
/// row as `default-again` against `default` alone.
#[test]
fn the_steady_view_takes_each_processs_lower_decile_against_both_defaults() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let dir = tempfile::tempdir().unwrap();
    // Ten steps a process: the lower decile is the first of them sorted. Round 0: the
    // defaults' floors 10 and 12.1 (geometric mean 11), `fast` 13.2 with slow steps around
    // it; round 1: 20 and 20, `fast` 24. So `fast` is 1.2 in both rounds.
    let steps = |low: f64, slow: f64| -> Vec<f64> {
        let mut v = vec![slow; 9];
        v.push(low);
        v
    };
    let run = |config: &str, round: u32, low: f64, slow: f64| {
        serde_json::json!({
            "config": config, "round": round, "model": "m", "rc": 0,
            "ms_per_step": slow, "ms_steps": steps(low, slow),
        })
    };
    let data = serde_json::json!({
        "models": ["m"], "configs": ["default", "default-again", "fast"],
        "rounds": 2, "steps": 10, "warmup": 1,
        "runs": [
            run("default", 0, 10.0, 30.0), run("default-again", 0, 12.1, 12.1),
            run("fast", 0, 13.2, 50.0),
            run("default", 1, 20.0, 20.0), run("default-again", 1, 20.0, 25.0),
            run("fast", 1, 24.0, 24.0),
        ],
    });
    let path = dir.path().join("tier_bench.json");
    std::fs::write(&path, data.to_string()).unwrap();
    let out = Command::new("python3")
        .arg(root.join("tests/gpu/tier_bench_table.py"))
        .arg(&path)
        .output()
        .expect("python3 runs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let steady = stdout
        .split("A steadier view")
        .nth(1)
        .unwrap_or_else(|| panic!("no steady view: {stdout}"));
    let fast = row(steady, "m", "fast");
    assert!(fast.contains("**1.200×** (1.20, 1.20)"), "{fast}");
    // The A/A row: 12.1 / 10 and 20 / 20, and the SD of their logarithms.
    let aa = row(steady, "m", "default-again");
    let sd = (1.21f64.ln() / 2f64.sqrt()).abs();
    assert!(aa.contains("(1.21, 1.00; SD of log"), "{aa}");
    assert!(aa.contains(&format!("{sd:.3}")), "{aa} (want {sd:.3})");
    // The median table (the issue's measure) still divides by the one default: fast's 50 ms
    // median against the default's 30 in round 0.
    assert!(
        row(&stdout, "m", "fast").contains("(1.67, 1.20)"),
        "{stdout}"
    );
    // Without default-again, no steady view.
    let plain = serde_json::json!({
        "models": ["m"], "configs": ["default", "fast"], "rounds": 1, "steps": 10,
        "warmup": 1, "runs": [run("default", 0, 10.0, 10.0), run("fast", 0, 12.0, 12.0)],
    });
    std::fs::write(&path, plain.to_string()).unwrap();
    let out = Command::new("python3")
        .arg(root.join("tests/gpu/tier_bench_table.py"))
        .arg(&path)
        .output()
        .unwrap();
    assert!(!String::from_utf8_lossy(&out.stdout).contains("A steadier view"));
}

/// free_cost.py's configurations (`--env`): the lines under the tiers run without the library
/// (the caching allocator with no variable at all, the backend alone, the backend with its
/// floor's shim), every tier with it and its trace; a name it does not know is refused.
#[test]
fn the_free_cost_pairs_run_each_configuration_as_named() {
    let env_of = |config: &str| script_env("free_cost.py", config);
    let backend = (
        "PYTORCH_CUDA_ALLOC_CONF".to_string(),
        "backend:cudaMallocAsync".to_string(),
    );
    assert_eq!(env_of("native").unwrap(), vec![]);
    assert_eq!(env_of("none").unwrap(), vec![backend.clone()]);
    assert_eq!(
        env_of("backend-pool").unwrap(),
        vec![
            ("LD_PRELOAD".to_string(), "TMP/backend_pool.so".to_string()),
            backend.clone()
        ]
    );
    for (config, stacks) in [
        ("fast", None),
        ("fast-nostacks", Some("none")),
        ("fast-python", Some("python")),
    ] {
        let env = env_of(config).unwrap();
        assert_library_run(&env, "TMP/traces/free-cost-%p.trace", config);
        assert_eq!(get(&env, "ISOLATE_MODE"), Some("isolate"), "{config}");
        assert_eq!(get(&env, "ISOLATE_CHECK"), Some("fast"), "{config}");
        assert_eq!(get(&env, "ISOLATE_STACKS"), stacks, "{config}");
        assert_eq!(
            get(&env, "PYTORCH_CUDA_ALLOC_CONF"),
            Some("backend:cudaMallocAsync")
        );
    }
    // The decomposition: the fast tier without stacks, one part more off each; log mode with
    // the default stacks and no policy.
    for (config, var, value) in [
        ("fast-noorder", "ISOLATE_TEST_ORDER", "off"),
        ("fast-nolaunch", "ISOLATE_CHECK_LAUNCH", "off"),
        ("fast-noprobe", "ISOLATE_RESERVE", "0"),
    ] {
        let env = env_of(config).unwrap();
        assert_eq!(get(&env, "ISOLATE_MODE"), Some("isolate"), "{config}");
        assert_eq!(get(&env, "ISOLATE_CHECK"), Some("fast"), "{config}");
        assert_eq!(get(&env, "ISOLATE_STACKS"), Some("none"), "{config}");
        assert_eq!(get(&env, var), Some(value), "{config}");
        let others = [
            "ISOLATE_TEST_ORDER",
            "ISOLATE_CHECK_LAUNCH",
            "ISOLATE_RESERVE",
        ];
        for other in others.iter().filter(|&&o| o != var) {
            assert_eq!(get(&env, other), None, "{config}: {other}");
        }
    }
    let log = env_of("log-stacks").unwrap();
    assert_eq!(get(&log, "ISOLATE_MODE"), Some("log"));
    assert_eq!(get(&log, "ISOLATE_STACKS"), None);
    assert_library_run(&log, "TMP/traces/free-cost-%p.trace", "log-stacks");
    let refused = env_of("fastest").unwrap_err();
    assert!(
        refused.contains("no configuration fastest") && refused.contains("backend-pool"),
        "{refused}"
    );
}

/// free_cost.py's lower-decile view: a chunk that another tenant's work slowed (here one of
/// fifty, five times as long) does not move it, where the whole loop's mean moves by 8%; the
/// last chunk (its end waits for the device) is not one, and a run of one chunk has none.
#[test]
fn the_free_cost_lower_decile_leaves_out_the_hosts_interruptions() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let code = r#"
import sys
sys.path.insert(0, sys.argv[1])
import free_cost as f
marks = [i * 200_000 for i in range(51)]      # 50 whole chunks of 200 tensors, 1 us each
marks[26:] = [m + 800_000 for m in marks[26:]]  # chunk 25 took 5 us a tensor
print(f.lower_decile_of_chunks(marks, 200))
print(f.lower_decile_of_chunks([0, 1000, 3000, 4000, 4500], 1))
print(f.lower_decile_of_chunks([0, 5], 1))
"#;
    let out = Command::new("python3")
        .args(["-c", code])
        .arg(root.join("tests/gpu"))
        .output()
        .expect("python3 runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let got: Vec<String> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    // 1 us (not the 1.08 of the mean); five marks are four whole chunks (1, 2, 1, 0.5 us a
    // tensor: the last chunk, after the fifth mark, is not one), whose lower decile is the
    // least; two marks are one chunk: none.
    assert_eq!(got, ["1.0", "0.5", "None"]);
}

/// profile_parts.py reads the profile's exit note as the library writes it: a tier benchmark's
/// `fast-prof` run through the stand-in, its logs' archive read back, and the table's first row
/// (the library's part of the hooks a tensor) the one the run's own note gives, worked out here
/// from the note's words; a run without the profile gives no column.
#[test]
fn the_profile_parts_table_reads_the_exit_note_of_a_profiled_run() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let dir = tempfile::tempdir().unwrap();
    let lib = isolate_tests::preload_path();
    fake_bench_in(
        dir.path(),
        lib.to_str().unwrap(),
        &[
            "--steps",
            "3",
            "--lockstep",
            "1",
            "--models",
            "a",
            "--configs",
            "default,fast-prof",
        ],
        &[],
    );
    let tgz = dir.path().join("tier_bench-logs.tgz");
    let out = Command::new("python3")
        .arg(root.join("tests/gpu/profile_parts.py"))
        .arg(&tgz)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let table = String::from_utf8(out.stdout).unwrap();
    let header = table.lines().next().unwrap();
    assert_eq!(header, "| µs a tensor | fast-prof r0 a |", "{table}");
    // The note's own figures: calls and the library's µs each of every class of hook.
    let x = dir.path().join("x");
    std::fs::create_dir(&x).unwrap();
    assert!(
        Command::new("tar")
            .arg("xzf")
            .arg(&tgz)
            .arg("-C")
            .arg(&x)
            .status()
            .unwrap()
            .success()
    );
    let log = std::fs::read_to_string(x.join("logs/fast-prof-r0-a.log")).unwrap();
    let note = log
        .lines()
        .find(|l| l.contains("hooks' time on the calling threads"))
        .expect("the profile's note in the run's log");
    let body = note.split_once("): ").unwrap().1;
    let (mut allocations, mut library) = (0.0, 0.0);
    for class in body.split("; ") {
        let words: Vec<&str> = class.split_whitespace().collect();
        if !class.contains("the library's") {
            continue;
        }
        let calls: f64 = words[1].trim_end_matches(',').parse().unwrap();
        let lib_each: f64 = words[words.len() - 3].parse().unwrap();
        library += calls * lib_each;
        if words[0] == "allocations" {
            allocations = calls;
        }
    }
    assert!(allocations > 0.0, "{note}");
    let row = table
        .lines()
        .find(|l| l.starts_with("| **the library's part of the hooks** |"))
        .unwrap();
    let got: f64 = row.split('|').nth(2).unwrap().trim().parse().unwrap();
    assert!(
        (got - library / allocations).abs() < 0.006,
        "{got} against {}: {note}",
        library / allocations
    );
    assert!(table.contains("| submitting records |"), "{table}");
}
