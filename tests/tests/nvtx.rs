//! libisolate.so as an NVTX injection library (interposer/src/hooks/nvtx.rs):
//! tests/programs/nvtx.c loads it exactly as NVTX v3's header-only loader does
//! (`NVTX_INJECTION64_PATH`, `InitializeInjectionNvtx2`, the callbacks export table) and calls
//! push/pop/mark/start/end and a domain's push/pop through the filled slots around stand-in
//! allocations. The summary shows the ranges as regions, each with the most device memory live
//! inside, and the marks.

use isolate_tests::{Run, preload_path};
use isolate_trace::{NoteKind, Record};

fn nvtx(mode: &str) -> Run {
    Run::program("nvtx")
        .env("ISOLATE_MODE", mode)
        .env("NVTX_INJECTION64_PATH", preload_path().to_string_lossy())
}

#[test]
fn nvtx_ranges_become_regions_with_their_peaks_and_marks() {
    for mode in ["log", "isolate"] {
        let out = nvtx(mode).run();
        out.assert_success();
        for want in [
            "nvtx: InitializeInjectionNvtx2 returned 1",
            "nvtx: core slots filled: 1 2 3 4 5 6 7 8 9 10 11",
            "nvtx: core2 slots filled: 1 2 3 4 5 10 11 12 13 14",
            // nvtxRangePush returns the 0-based level, nvtxRangePop the level it ended.
            "push outer -> 0",
            "push inner -> 1",
            "pop inner -> 1",
            "pop outer -> 0",
            "pop nothing open -> negative",
            "start async -> id nonzero",
            "registered twice -> same handle 1",
            "domain push -> 0",
            "domain pop -> 0",
            "done",
        ] {
            assert!(
                out.stdout.lines().any(|l| l == want),
                "{mode}: no line {want:?}:\n{}",
                out.stdout
            );
        }
        let t = out.only_trace();
        out.assert_trace_matches(t, None);
        let s = t.assert_no_false_findings();
        let regions: Vec<(String, u64, u64)> = s["regions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                (
                    r["name"].as_str().unwrap().to_owned(),
                    r["count"].as_u64().unwrap(),
                    r["peak_live_bytes"].as_u64().unwrap(),
                )
            })
            .collect();
        const MIB: u64 = 1 << 20;
        for want in [
            ("outer", 1, 3 * MIB),
            ("inner", 1, 3 * MIB),
            ("wide \u{e9}", 1, 0),
            ("async", 1, 4 * MIB),
            ("dom: registered", 1, MIB),
        ] {
            assert!(
                regions.iter().any(|(n, c, p)| (n.as_str(), *c, *p) == want),
                "{mode}: no region {want:?} in {regions:?}"
            );
        }
        assert_eq!(regions.len(), 5, "{mode}: {regions:?}");
        let marks: Vec<&str> = s["marks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["text"].as_str().unwrap())
            .collect();
        assert_eq!(marks, ["after inner", "marked"], "{mode}");

        // The keys: a thread's own stack (its id), a start/end range (2^63 + id), a domain's
        // stack (thread id + domain number << 32).
        let pid = t.header.pid as u64;
        let mut keys = Vec::new();
        for r in &t.records {
            if let Record::Note(n) = r
                && n.kind == NoteKind::RegionPush
            {
                keys.push((n.text.clone(), n.ptr, n.value));
            }
        }
        for (name, key, depth) in &keys {
            match name.as_str() {
                "outer" | "wide \u{e9}" => assert_eq!((*key, *depth), (pid, 1), "{name}"),
                "inner" => assert_eq!((*key, *depth), (pid, 2), "{name}"),
                "async" => assert!(*key >> 63 == 1 && *depth == 1, "{name}: {key:#x}"),
                "dom: registered" => {
                    assert_eq!(*key & 0xffff_ffff, pid, "{name}: {key:#x}");
                    assert!(*key >> 32 >= 1 && *key >> 63 == 0, "{name}: {key:#x}");
                }
                other => panic!("unexpected region {other}"),
            }
        }
        // The summary's text lists them too.
        let text = std::process::Command::new(isolate_tests::analyzer_path())
            .arg("summary")
            .arg(&t.path)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&text.stdout);
        assert!(text.contains("regions  5 regions"), "{text}");
        assert!(text.contains("peak    3.0 MiB  outer"), "{text}");
        assert!(text.contains("marks    2 marks"), "{text}");
    }
}

#[test]
fn without_the_variable_nvtx_loads_nothing_and_in_mode_off_the_injection_declines() {
    let out = Run::program("nvtx")
        .env_remove("NVTX_INJECTION64_PATH")
        .run();
    out.assert_success();
    assert!(
        out.stdout.contains("nvtx: no injection library"),
        "{}",
        out.stdout
    );
    // ISOLATE_MODE=off: InitializeInjectionNvtx2 returns 0 and fills nothing (NVTX then makes
    // every call a no-op and unloads the library).
    let off = nvtx("off").run();
    off.assert_success();
    for want in [
        "nvtx: InitializeInjectionNvtx2 returned 0",
        "nvtx: core slots filled:",
    ] {
        assert!(off.stdout.lines().any(|l| l == want), "{}", off.stdout);
    }
}
