//! Faults around the program: the trace's file system fills up, and the library is loaded late
//! (dlopen after CUDA memory was already handed out).

use isolate_tests::{Output, Run, Trace, preload_path, skip};
use isolate_trace::{NoteKind, Record};
use std::ffi::CString;
use std::path::{Path, PathBuf};

// ------------------------------------------------------------------------------------ disk full

/// A tmpfs mounted for the test; unmounted when dropped, also when the test fails.
struct TmpfsMount {
    path: PathBuf,
    // Dropped after `drop` below has unmounted it.
    _dir: tempfile::TempDir,
}

impl TmpfsMount {
    /// Mounts a tmpfs of `size` (as `mount -o size=…` takes it) on a fresh directory; `Err` says
    /// why not (not root, not permitted here).
    fn new(size: &str) -> Result<TmpfsMount, String> {
        if unsafe { libc::geteuid() } != 0 {
            return Err("not running as root".into());
        }
        let dir = tempfile::Builder::new()
            .prefix("isolate-full-")
            .tempdir()
            .map_err(|e| format!("temporary directory: {e}"))?;
        let path = dir.path().to_path_buf();
        let target = CString::new(path.to_string_lossy().as_bytes()).unwrap();
        let opts = CString::new(format!("size={size},mode=0755")).unwrap();
        let rc = unsafe {
            libc::mount(
                c"tmpfs".as_ptr(),
                target.as_ptr(),
                c"tmpfs".as_ptr(),
                libc::MS_NOSUID | libc::MS_NODEV,
                opts.as_ptr().cast(),
            )
        };
        if rc != 0 {
            return Err(format!(
                "mount -t tmpfs -o size={size} tmpfs {}: {}",
                path.display(),
                std::io::Error::last_os_error()
            ));
        }
        Ok(TmpfsMount { path, _dir: dir })
    }
}

impl Drop for TmpfsMount {
    fn drop(&mut self) {
        let target = CString::new(self.path.to_string_lossy().as_bytes()).unwrap();
        if unsafe { libc::umount2(target.as_ptr(), 0) } != 0 {
            let err = std::io::Error::last_os_error();
            // Busy (a straggler still has a file open): detach it instead.
            if unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) } != 0 {
                eprintln!("warning: cannot unmount {}: {err}", self.path.display());
            }
        }
    }
}

fn isolate_lines(out: &Output) -> Vec<&str> {
    out.stderr
        .lines()
        .filter(|l| l.starts_with("isolate:"))
        .collect()
}

/// `threads 2 20000` writes about 1.6 MB of trace into a 64 KiB tmpfs: the program runs on
/// unchanged, one `isolate:` line says the trace is incomplete, and the trace reads cleanly up
/// to the cut.
#[test]
fn disk_full_leaves_the_program_alone_and_the_trace_readable() {
    let mnt = match TmpfsMount::new("64k") {
        Ok(m) => m,
        Err(why) => {
            skip(&format!(
                "a 64 KiB tmpfs cannot be mounted ({why}): run the tests as root, where mount(2) is permitted, for the full-disk test"
            ));
            return;
        }
    };
    let run = Run::program("threads")
        .args(["2", "20000"])
        .trace(format!("{}/isolate-%p.trace", mnt.path.display()));
    let plain = run.clone().preload(false).run();
    let out = run.run();
    out.assert_same_as(&plain);
    out.assert_success();
    assert!(out.stdout.contains("failures 0"), "{}", out.stdout);

    let lines = isolate_lines(&out);
    assert_eq!(
        lines.len(),
        1,
        "exactly one isolate: line on stderr:\n{}",
        out.stderr
    );
    let path = mnt.path.join(format!("isolate-{}.trace", out.pid));
    assert!(
        lines[0].contains(&path.to_string_lossy().into_owned()) && lines[0].contains("incomplete"),
        "the line names the trace and says it is incomplete: {}",
        lines[0]
    );
    let size = std::fs::metadata(&path).unwrap().len();
    assert!(
        (1..=64 * 1024).contains(&size),
        "the trace filled the file system: {size} bytes"
    );

    let t = Trace::read(&path);
    assert!(
        t.error.is_none(),
        "the trace does not read up to the cut: {}",
        t.summary()
    );
    assert!(
        t.truncated_at.is_some() || t.end().is_none(),
        "a trace cut by a full disk cannot be complete: {}",
        t.summary()
    );
    assert!(!t.is_complete());
    assert_eq!(t.header.pid, out.pid);
    // What it holds is a prefix of the run: events in sequence order, from the start.
    let ev = t.events();
    assert!(ev.len() > 1000, "only {} events before the cut", ev.len());
    let mut seqs: Vec<u64> = ev.iter().map(|e| e.seq).collect();
    seqs.sort_unstable();
    seqs.dedup();
    assert_eq!(seqs.len(), ev.len(), "duplicate sequence numbers");
    // The summary does not blame the process for the trace the disk cut: cut inside a record,
    // how it ended is not known; cut at a record's end, a full disk is named as one cause.
    let o = std::process::Command::new(isolate_tests::analyzer_path())
        .arg("summary")
        .arg(&path)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    let ended = text.lines().find(|l| l.starts_with("ended ")).unwrap_or("");
    match t.truncated_at {
        Some(at) => assert!(
            ended.contains(&format!("the trace was cut inside a record at byte {at}"))
                && ended.contains("a full disk")
                && !ended.contains("did not exit cleanly"),
            "{ended}"
        ),
        None => assert!(ended.contains("(a full disk)"), "{ended}"),
    }
    eprintln!(
        "disk full: trace cut at {size} bytes, {} events readable, truncated at {:?}; stderr: {}",
        ev.len(),
        t.truncated_at,
        lines[0]
    );
}

// ------------------------------------------------------------------------------------ late load

/// The LateLoad notes of a trace, and where the first one is among its records.
fn late_notes(t: &Trace) -> (usize, Option<usize>) {
    let is_late = |r: &Record| matches!(r, Record::Note(n) if n.kind == NoteKind::LateLoad);
    (
        t.records.iter().filter(|r| is_late(r)).count(),
        t.records.iter().position(is_late),
    )
}

fn late(mode: Option<&str>, lib: &Path) -> (Output, Output) {
    let mut run = Run::program("late_dlopen").preload(false);
    if let Some(m) = mode {
        run = run.env("ISOLATE_MODE", m);
    }
    let plain = run.clone().arg("-").run();
    let loaded = run.arg(lib.to_string_lossy().into_owned()).run();
    (plain, loaded)
}

/// The interposer dlopen()ed after CUDA memory was handed out, RTLD_NOW | RTLD_GLOBAL: nothing
/// crashes, every return code is that of a run that never loads it, and the memory allocated
/// before the load is really freed (the stand-in hands the freed address straight back).
#[test]
fn late_dlopen_changes_no_result() {
    let lib = preload_path();
    for mode in [None, Some("isolate")] {
        let (plain, loaded) = late(mode, &lib);
        loaded.assert_same_as(&plain);
        loaded.assert_success();
        assert!(
            loaded.stderr.contains("late_dlopen: loaded "),
            "{mode:?}: the library did not load: {}",
            loaded.stderr
        );
        assert!(
            !plain.stderr.contains("loaded"),
            "{mode:?}: {}",
            plain.stderr
        );
        for want in [
            "after: found cudaMalloc 1 cudaFree 1 cuGetProcAddress_v2 1",
            "after: hook cudaFree a 0",
            "after: hook cudaMalloc a2 0 reuses a 1",
            "after: cudaFree b 0",
            "after: cudaMalloc b2 0 reuses b 1",
            "after: hook cudaFree b2 0",
            "after: hook cudaFree c 0",
            "after: cuGetProcAddress(cuMemAlloc) 0 status 0 found 1",
            "after: late cuMemFree d 0",
            "after: late cuMemAlloc d2 0 reuses d 1",
            "after: early cuMemFree e 0",
            "after: early cuMemAlloc e2 0 reuses e 1",
            "after: late cuMemFree e2 0",
        ] {
            assert!(
                loaded.stdout.lines().any(|l| l == want),
                "{mode:?}: no line {want:?}:\n{}",
                loaded.stdout
            );
        }
        // No stray `isolate:` complaint in log mode (isolate mode says on start which
        // frameworks' pools it switched off: `isolate mode: set …`).
        let extra: Vec<&str> = isolate_lines(&loaded)
            .into_iter()
            .filter(|l| !l.starts_with("isolate: isolate mode: set "))
            .collect();
        assert!(extra.is_empty(), "{mode:?}: {extra:?}");
        // The late library writes one complete trace of the calls that reached its hooks.
        let t = loaded.only_trace();
        assert!(t.is_complete(), "{mode:?}: {}", t.summary());
        let c = t.counts();
        assert_eq!(c.get("cudaMalloc"), Some(&2), "{mode:?}: {c:?}");
        assert_eq!(c.get("cudaFree"), Some(&4), "{mode:?}: {c:?}");
        assert_eq!(c.get("cuMemAlloc_v2"), Some(&1), "{mode:?}: {c:?}");
        assert_eq!(c.get("cuMemFree_v2"), Some(&3), "{mode:?}: {c:?}");
        assert!(plain.traces.is_empty());

        // It says it was loaded late, once, as its first record.
        assert_eq!(late_notes(t), (1, Some(0)), "{mode:?}: {:?}", t.records);
        // So the frees of memory it never saw allocated are not invalid frees. The trace sees
        // four successful frees of such memory: `a` and `d` (allocated before the load), `b2`
        // (allocated through the program's PLT entry, bound before the load) and `e2` (through
        // the driver pointer fetched before the load). The program's two second frees, which
        // the driver refused, are its bugs all the same: `c` again is a double free of what the
        // trace saw (named with its first free), `e2` again a refused free of memory that is
        // not live.
        let s = t.analyzer_summary();
        assert_eq!(
            s["invalid_free_count"], 2,
            "{mode:?}: {}",
            s["invalid_frees"]
        );
        let f = &s["invalid_frees"];
        assert_eq!(f[0]["double_free"], true, "{mode:?}: {f}");
        assert_eq!(f[0]["first_free"]["api"], "cudaFree", "{mode:?}: {f}");
        assert_eq!(f[1]["api"], "cuMemFree_v2", "{mode:?}: {f}");
        assert_ne!(f[1]["result"], 0, "{mode:?}: {f}");
        assert_eq!(s["frees_of_earlier_allocations"], 4, "{mode:?}");
        assert_eq!(s["notes"]["late_load"], 1, "{mode:?}");
        // What it saw allocated: a2, c (hooks), d2 (late resolver); c was freed through it.
        assert_eq!((&s["allocations"], &s["frees"]), (&3.into(), &1.into()));
    }
}

/// With LD_PRELOAD there is no LateLoad note, also for programs that have the driver or the
/// runtime loaded (linked) before the library's constructor runs: they are loaded, not in use.
/// And the same calls as in the late run are all seen, so nothing is a free of an earlier
/// allocation (but for one of an entry point that is not recorded).
#[test]
fn preloaded_is_not_a_late_load() {
    for (prog, args) in [
        ("late_dlopen", &["-"][..]),
        ("drv_linked", &[][..]),
        ("rt_basic", &[][..]),
    ] {
        let out = Run::program(prog).args(args.iter().copied()).run();
        out.assert_success();
        let t = out.only_trace();
        assert_eq!(late_notes(t), (0, None), "{prog}");
        let s = t.analyzer_summary();
        // drv_linked frees an allocation of the CUDA 3.1 ABI, which is not recorded: a free the
        // driver accepted of memory the trace never saw (not invalid), late load or not.
        let unseen = if prog == "drv_linked" { 1 } else { 0 };
        assert_eq!(s["frees_of_earlier_allocations"], unseen, "{prog}");
        assert!(
            s["notes"].get("late_load").is_none(),
            "{prog}: {}",
            s["notes"]
        );
        if prog == "late_dlopen" {
            // Its two deliberate double frees, both seen whole here, both named as such.
            assert_eq!(s["invalid_free_count"], 2, "{}", s["invalid_frees"]);
            assert_eq!(s["double_free_count"], 2, "{}", s["invalid_frees"]);
        }
    }
}

// ------------------------------------------------------------------------------------ big header

/// A program started with more than 1 MiB of arguments (9 of 120,000 bytes; Linux allows
/// 2 MiB) still gets a complete, readable trace: the library cuts the command line it puts in
/// the header so the header fits in one frame (record/header.rs). (Regression test, commit
/// 9867ea3: the whole command line went into the header, and no reader opened the trace: `at
/// byte 12: corrupt frame: length 1080430 exceeds the limit of 1048576 bytes`.)
#[test]
fn huge_command_line_still_gives_a_readable_trace() {
    let arg = "a".repeat(120_000);
    let out = Run::program("rt_basic")
        .args(std::iter::repeat_n(arg, 9))
        .run();
    out.assert_success();
    let t = out.only_trace();
    assert!(t.is_complete(), "{}", t.summary());
}
