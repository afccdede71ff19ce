//! Frameworks' pools off in isolate mode (interposer/src/policy/frameworks.rs; PyTorch's in
//! isolate/pytorch.rs), and `isolate run` naming the library as the NVTX injection: what a program
//! sees of its environment (tests/programs/getenv.c prints the variables it is given).

use isolate_tests::{Run, analyzer_path};
use std::process::Command;

/// PyTorch's setting is isolate/pytorch.rs's (how it switches the caching allocator off is its own
/// business); only that log mode leaves it alone is checked here.
const VARS: [&str; 2] = [
    "XLA_PYTHON_CLIENT_ALLOCATOR",
    "PYTORCH_NO_CUDA_MEMORY_CACHING",
];

fn getenv(mode: &str) -> Run {
    Run::program("getenv")
        .args(VARS)
        .env("ISOLATE_MODE", mode)
        .env_remove("XLA_PYTHON_CLIENT_ALLOCATOR")
        .env_remove("PYTORCH_NO_CUDA_MEMORY_CACHING")
}

fn said(stderr: &str) -> Vec<&str> {
    stderr
        .lines()
        .filter(|l| l.starts_with("isolate: isolate mode: set "))
        .collect()
}

/// Isolate mode sets JAX's variable before `main` in every program, and tells a C program,
/// which loads no framework, nothing about it (issue 32: it was told about PyTorch's and JAX's
/// settings).
#[test]
fn isolate_mode_turns_jax_pool_off_before_main_and_tells_a_c_program_nothing() {
    let out = getenv("isolate").run();
    out.assert_success();
    assert!(
        out.stdout
            .lines()
            .any(|l| l == "XLA_PYTHON_CLIENT_ALLOCATOR=platform"),
        "{}",
        out.stdout
    );
    assert!(said(&out.stderr).is_empty(), "{}", out.stderr);
    // A C program that allocates (its trace starts) is told nothing either.
    let out = Run::program("loads").env("ISOLATE_MODE", "isolate").run();
    out.assert_success();
    assert!(said(&out.stderr).is_empty(), "{}", out.stderr);
}

/// Once a framework is loaded (here an empty library named as PyTorch's, or as jaxlib's, is),
/// what isolate mode set for it is said, once, and only for it.
#[test]
fn what_was_set_for_a_framework_is_said_once_it_is_loaded() {
    let torch = isolate_tests::program_path("libc10_cuda.so");
    let jax = isolate_tests::program_path("libxla_extension.so");
    let run = |libs: &[&std::path::Path]| {
        let out = Run::program("loads")
            .args(libs.iter().map(|p| p.to_str().unwrap()))
            .env("ISOLATE_MODE", "isolate")
            .env_remove("XLA_PYTHON_CLIENT_ALLOCATOR")
            .env_remove("PYTORCH_CUDA_ALLOC_CONF")
            .env_remove("PYTORCH_ALLOC_CONF")
            .env_remove("PYTORCH_NO_CUDA_MEMORY_CACHING")
            .run();
        out.assert_success();
        assert!(
            !out.stdout.contains("dlopen") || out.stdout.contains(" ok"),
            "{}",
            out.stdout
        );
        said(&out.stderr)
            .into_iter()
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    let pytorch = "isolate: isolate mode: set PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync \
                   (PyTorch's caching allocator off; each tensor from the driver's stream-ordered pool)";
    let jax_line = "isolate: isolate mode: set XLA_PYTHON_CLIENT_ALLOCATOR=platform (JAX/XLA's memory pool off)";
    assert_eq!(run(&[&torch]), [pytorch]);
    assert_eq!(run(&[&jax]), [jax_line]);
    let both = run(&[&torch, &jax]);
    assert_eq!(both.len(), 2, "{both:?}");
    assert!(both.contains(&pytorch.to_owned()) && both.contains(&jax_line.to_owned()));
}

#[test]
fn a_value_the_user_set_is_kept_and_log_mode_sets_nothing() {
    let out = getenv("isolate")
        .env("XLA_PYTHON_CLIENT_ALLOCATOR", "bfc")
        .run();
    out.assert_success();
    assert!(
        out.stdout
            .lines()
            .any(|l| l == "XLA_PYTHON_CLIENT_ALLOCATOR=bfc"),
        "{}",
        out.stdout
    );
    assert!(
        !out.stderr.contains("XLA_PYTHON_CLIENT_ALLOCATOR"),
        "{}",
        out.stderr
    );
    let log = getenv("log").run();
    log.assert_success();
    for v in VARS {
        assert!(
            log.stdout.lines().any(|l| l == format!("{v} unset")),
            "{}",
            log.stdout
        );
    }
    assert!(said(&log.stderr).is_empty(), "{}", log.stderr);
}

/// `isolate run` sets NVTX_INJECTION64_PATH to the library beside it, unless the user set it
/// (another NVTX tool, such as Nsight Systems) or the mode is off.
#[test]
fn isolate_run_names_the_library_as_the_nvtx_injection_unless_set() {
    let prog = isolate_tests::program_path("getenv");
    let lib = analyzer_path().with_file_name("libisolate.so");
    let run = |mode: &str, nvtx: Option<&str>| {
        let d = tempfile::tempdir().unwrap();
        let mut cmd = Command::new(analyzer_path());
        cmd.current_dir(d.path())
            .env_remove("LD_PRELOAD")
            .env_remove("ISOLATE_MODE")
            .env_remove("ISOLATE_TRACE")
            .env_remove("NVTX_INJECTION64_PATH");
        if let Some(v) = nvtx {
            cmd.env("NVTX_INJECTION64_PATH", v);
        }
        cmd.args(["run", "--mode", mode, "--"])
            .arg(&prog)
            .arg("NVTX_INJECTION64_PATH");
        let o = cmd.output().unwrap();
        assert!(o.status.success(), "{o:?}");
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    assert_eq!(
        run("log", None).trim(),
        format!("NVTX_INJECTION64_PATH={}", lib.display())
    );
    assert_eq!(
        run("isolate", Some("/opt/nsight/libToolsInjection64.so")).trim(),
        "NVTX_INJECTION64_PATH=/opt/nsight/libToolsInjection64.so"
    );
    assert_eq!(run("off", None).trim(), "NVTX_INJECTION64_PATH unset");
}
