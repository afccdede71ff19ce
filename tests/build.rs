//! Builds, with the system `cc`, the stand-in CUDA driver and runtime (`standin/`) and every
//! test program (`programs/*.c`) into `OUT_DIR`:
//!
//! - `OUT_DIR/standin/libcuda.so.1` (+ `libcuda.so`), from every `standin/driver_*.c` (one file
//!   per API area, sharing `standin/driver_internal.h`), and `libcudart.so.13` (+ `libcudart.so`),
//!   from `standin/runtime.c`;
//! - `OUT_DIR/standin/selfcheck`, the stand-ins' own check (`standin/selfcheck.c`: exit status
//!   0 when every check passed; identical stdout with and without the interposer preloaded);
//! - `OUT_DIR/bin/<stem>` for each `programs/<stem>.c`, linked as its first-line directive says:
//!   `// link: cudart`, `// link: cuda`, `// link: cudart cuda`, `// link: none` (the default),
//!   always with `-I standin -ldl -pthread -O1 -g -Wall` and no rpath;
//! - `OUT_DIR/bin/libNAME.so` for each `programs/*.c` whose first line is `// shared: libNAME.so`
//!   (a `// link:` line may follow it);
//! - a `// cflags: ...` line adds flags after those, so they win (`stacks.c`: `-O2 -g0
//!   -fomit-frame-pointer`, built as the libraries users run are).
//!
//! The crate gets `STANDIN_DIR` and `STANDIN_BIN` (compile-time env) naming the two folders.
//! A compile error fails the build with the compiler's message; compiler warnings show as
//! cargo warnings.

use std::env;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

const CC: &str = "cc";

/// Flags of the two stand-in libraries. `-Bsymbolic` binds the driver's references to its own
/// functions (the cuGetProcAddress table must hold the driver's functions even when a preloaded
/// library exports the same names); `-fno-ipa-icf` keeps every export a distinct function, so
/// that `dladdr` names the export a pointer came from.
const LIB_FLAGS: &[&str] = &[
    "-fPIC",
    "-shared",
    "-O2",
    "-Wall",
    "-Werror",
    "-pthread",
    "-fno-ipa-icf",
    "-Wl,-Bsymbolic",
];

const PROGRAM_FLAGS: &[&str] = &["-O1", "-g", "-Wall", "-pthread"];

struct Program {
    src: PathBuf,
    /// `Some(file name)` for a shared library.
    shared: Option<String>,
    cudart: bool,
    cuda: bool,
    /// Extra compiler flags (`// cflags:`), after the default ones.
    cflags: Vec<String>,
}

fn main() {
    let manifest = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("OUT_DIR"));
    let standin_src = manifest.join("standin");
    let programs_src = manifest.join("programs");
    let standin = out.join("standin");
    let bin = out.join("bin");
    for dir in [&standin, &bin] {
        fs::create_dir_all(dir).unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
    }

    println!("cargo:rerun-if-changed=build.rs");
    // A folder: cargo checks every file in it (the driver's files, the header, runtime.c, ...).
    println!("cargo:rerun-if-changed={}", standin_src.display());
    println!("cargo:rerun-if-changed={}", programs_src.display());
    println!("cargo:rustc-env=STANDIN_DIR={}", standin.display());
    println!("cargo:rustc-env=STANDIN_BIN={}", bin.display());

    let include = format!("-I{}", standin_src.display());
    build_lib(
        &driver_sources(&standin_src),
        &standin,
        "libcuda.so.1",
        "libcuda.so",
        &[&include],
    );
    build_lib(
        &[standin_src.join("runtime.c")],
        &standin,
        "libcudart.so.13",
        "libcudart.so",
        &[&include, "-ldl"],
    );

    let lib_dir = format!("-L{}", standin.display());
    let selfcheck = Program {
        src: standin_src.join("selfcheck.c"),
        shared: None,
        cudart: true,
        cuda: true,
        cflags: Vec::new(),
    };
    let (src, args) = program_command(&selfcheck, &standin, &include, &lib_dir);
    compile(&src, &args);

    let programs = find_programs(&programs_src);
    // Shared libraries first, then the programs, each group compiled in parallel.
    let (shared, exes): (Vec<_>, Vec<_>) = programs.iter().partition(|p| p.shared.is_some());
    for group in [shared, exes] {
        let jobs: Vec<(PathBuf, Vec<String>)> = group
            .iter()
            .map(|p| program_command(p, &bin, &include, &lib_dir))
            .collect();
        run_parallel(&jobs);
    }
    build_deepbind(&programs_src, &bin, &include, &lib_dir);
}

/// The stand-in driver's sources: `standin/driver_*.c`, in name order.
fn driver_sources(standin_src: &Path) -> Vec<PathBuf> {
    let entries = fs::read_dir(standin_src)
        .unwrap_or_else(|e| panic!("reading {}: {e}", standin_src.display()));
    let mut srcs: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.extension().is_some_and(|x| x == "c")
                && p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("driver_"))
        })
        .collect();
    srcs.sort();
    assert!(
        !srcs.is_empty(),
        "no driver_*.c in {}",
        standin_src.display()
    );
    srcs
}

/// Compiles `srcs` into the shared library `dir/file`, with the symlink `dir/link` to it.
fn build_lib(srcs: &[PathBuf], dir: &Path, file: &str, link: &str, extra: &[&str]) {
    let target = dir.join(file);
    let mut args: Vec<String> = LIB_FLAGS.iter().map(|s| s.to_string()).collect();
    args.push(format!("-Wl,-soname,{file}"));
    args.extend(
        extra
            .iter()
            .filter(|a| a.starts_with("-I"))
            .map(|s| s.to_string()),
    );
    args.push("-o".into());
    args.push(target.display().to_string());
    args.extend(srcs.iter().map(|src| src.display().to_string()));
    args.extend(
        extra
            .iter()
            .filter(|a| !a.starts_with("-I"))
            .map(|s| s.to_string()),
    );
    compile(&target, &args);
    let link_path = dir.join(link);
    let _ = fs::remove_file(&link_path);
    std::os::unix::fs::symlink(file, &link_path)
        .unwrap_or_else(|e| panic!("symlink {}: {e}", link_path.display()));
}

fn find_programs(dir: &Path) -> Vec<Program> {
    let Ok(entries) = fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut srcs: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "c"))
        .collect();
    srcs.sort();
    srcs.into_iter().map(|src| parse_program(&src)).collect()
}

/// Reads the directives from the `//` comment lines at the top of the file.
fn parse_program(src: &Path) -> Program {
    let text = fs::read_to_string(src).unwrap_or_else(|e| panic!("reading {}: {e}", src.display()));
    let mut p = Program {
        src: src.to_path_buf(),
        shared: None,
        cudart: false,
        cuda: false,
        cflags: Vec::new(),
    };
    for line in text.lines() {
        let Some(comment) = line.trim_start().strip_prefix("//") else {
            break;
        };
        let comment = comment.trim();
        if let Some(v) = comment.strip_prefix("link:") {
            for word in v.split([' ', ',', '\t']).filter(|w| !w.is_empty()) {
                match word {
                    "cudart" => p.cudart = true,
                    "cuda" => p.cuda = true,
                    "none" => {}
                    other => panic!(
                        "{}: unknown `// link:` word {other:?} (accepted: cudart, cuda, none)",
                        src.display()
                    ),
                }
            }
        } else if let Some(v) = comment.strip_prefix("cflags:") {
            p.cflags.extend(v.split_whitespace().map(|w| w.to_string()));
        } else if let Some(v) = comment.strip_prefix("shared:") {
            let name = v.trim();
            if !(name.starts_with("lib") && name.ends_with(".so")) || name.contains('/') {
                panic!(
                    "{}: `// shared:` wants a file name libNAME.so, got {name:?}",
                    src.display()
                );
            }
            p.shared = Some(name.to_string());
        }
    }
    p
}

fn program_command(
    p: &Program,
    bin: &Path,
    include: &str,
    lib_dir: &str,
) -> (PathBuf, Vec<String>) {
    let target = match &p.shared {
        Some(name) => bin.join(name),
        None => bin.join(p.src.file_stem().expect("file stem")),
    };
    let mut args: Vec<String> = Vec::new();
    if p.shared.is_some() {
        args.extend(["-shared".to_string(), "-fPIC".to_string()]);
    }
    args.extend(PROGRAM_FLAGS.iter().map(|s| s.to_string()));
    args.extend(p.cflags.iter().cloned());
    args.push(include.to_string());
    args.push("-o".into());
    args.push(target.display().to_string());
    args.push(p.src.display().to_string());
    if p.cudart || p.cuda {
        args.push(lib_dir.to_string());
    }
    if p.cudart {
        args.push("-l:libcudart.so.13".into());
    }
    if p.cuda {
        args.push("-l:libcuda.so.1".into());
    }
    args.push("-ldl".into());
    (p.src.clone(), args)
}

fn run_parallel(jobs: &[(PathBuf, Vec<String>)]) {
    let threads = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(4)
        .min(jobs.len().max(1));
    let next = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some((src, args)) = jobs.get(i) else {
                            break;
                        };
                        compile(src, args);
                    }
                })
            })
            .collect();
        for w in workers {
            if let Err(e) = w.join() {
                std::panic::resume_unwind(e);
            }
        }
    });
}

/// Runs `cc args`; a failure panics with the compiler's output.
fn compile(src: &Path, args: &[String]) {
    let out = Command::new(CC)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running `{CC}` for {}: {e}", src.display()));
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        eprintln!("{CC} {}", args.join(" "));
        eprintln!("{stderr}");
        panic!("compiling {} failed:\n{stderr}", src.display());
    }
    for line in stderr.lines().filter(|l| !l.trim().is_empty()) {
        println!("cargo:warning={line}");
    }
}

// --------------------------------------------------------------- RTLD_DEEPBIND (deepbind.rs)

/// `programs/deepbind/`: a host that opens a plugin with `RTLD_DEEPBIND` (`main.c`, built as
/// `bin/deepbind` with `DT_RUNPATH` = `$ORIGIN`, so that a bare name finds the plugin only
/// through it), the plugin (`plugin.c`: `bin/libdeepbind_plugin.so`, and again linked `-z now`
/// as `bin/libdeepbind_plugin_now.so`, every GOT slot bound at load and read-only), and
/// `other.c` (`bin/libdeepbind_other.so`). Each file's own `// shared:` and `// link:` lines
/// apply, plus these link flags, which the directives do not give.
fn build_deepbind(programs_src: &Path, bin: &Path, include: &str, lib_dir: &str) {
    let dir = programs_src.join("deepbind");
    let builds: [(&str, Option<&str>, &[&str]); 4] = [
        ("other.c", None, &[]),
        ("plugin.c", None, &[]),
        (
            "plugin.c",
            Some("libdeepbind_plugin_now.so"),
            &["-Wl,-z,now"],
        ),
        (
            "main.c",
            None,
            &["-Wl,--enable-new-dtags", "-Wl,-rpath,$ORIGIN"],
        ),
    ];
    let jobs: Vec<(PathBuf, Vec<String>)> = builds
        .iter()
        .map(|(file, shared, flags)| {
            let mut p = parse_program(&dir.join(file));
            if let Some(name) = shared {
                p.shared = Some(name.to_string());
            }
            let exe = p.shared.is_none();
            let (src, mut args) = program_command(&p, bin, include, lib_dir);
            if exe {
                // Named after the folder, not the file: bin/deepbind.
                let o = args.iter().position(|a| a == "-o").expect("-o") + 1;
                args[o] = bin.join("deepbind").display().to_string();
            }
            args.extend(flags.iter().map(|f| f.to_string()));
            (src, args)
        })
        .collect();
    run_parallel(&jobs);
}
