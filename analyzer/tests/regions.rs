//! Marks and regions (`isolate_mark`, `isolate_region_push`/`_pop`): in the summary (text and
//! JSON) and in the report's timeline data, in both the note kinds of their own and the older
//! `Info`-note form.

mod common;

use common::*;
use isolate_analyzer::{NoProgress, report, summary};
use isolate_trace::{NoteKind, Stats};

const MAIN: u64 = 100;
const OTHER: u64 = 200;

/// Two "step" regions on the main thread (the second holding a nested "forward"), a region on
/// another thread, two marks, and a region left open at the end. Times (from the builder's
/// start, 1 ms): every event is 1 µs after the one before; notes take the time of the last
/// event.
fn trace(old_form: bool) -> TraceBuilder {
    let mut t = TraceBuilder::new();
    let note = |t: &mut TraceBuilder, kind: NoteKind, tid: u64, depth: u64, text: &str| {
        if old_form {
            let prefix = match kind {
                NoteKind::Mark => "mark: ",
                NoteKind::RegionPush => "region push: ",
                _ => "region pop: ",
            };
            t.text_note(NoteKind::Info, tid, depth, &format!("{prefix}{text}"));
        } else {
            t.text_note(kind, tid, depth, text);
        }
    };
    t.malloc(A, MIB); // t = 1 µs, 1 MiB live
    note(&mut t, NoteKind::Mark, MAIN, 0, "loaded");
    note(&mut t, NoteKind::RegionPush, MAIN, 1, "step");
    t.malloc(A + MIB, 2 * MIB); // 2 µs, 3 MiB
    t.free(A + MIB); // 3 µs, 1 MiB
    note(&mut t, NoteKind::RegionPop, MAIN, 1, "step"); // step #1: 1 µs → 3 µs, peak 3 MiB
    t.malloc(A + 4 * MIB, 4 * MIB); // 4 µs, 5 MiB
    note(&mut t, NoteKind::RegionPush, MAIN, 1, "step");
    note(&mut t, NoteKind::RegionPush, OTHER, 1, "loader");
    t.free(A + 4 * MIB); // 5 µs, 1 MiB
    note(&mut t, NoteKind::RegionPush, MAIN, 2, "forward");
    t.malloc(A + 8 * MIB, 8 * MIB); // 6 µs, 9 MiB
    note(&mut t, NoteKind::Mark, MAIN, 2, "half way");
    t.free(A + 8 * MIB); // 7 µs, 1 MiB
    note(&mut t, NoteKind::RegionPop, MAIN, 2, "forward"); // 5 µs → 7 µs, peak 9 MiB
    note(&mut t, NoteKind::RegionPop, OTHER, 1, "loader"); // 4 µs → 7 µs, peak 9 MiB
    t.malloc(A + 16 * MIB, MIB); // 8 µs, 2 MiB
    note(&mut t, NoteKind::RegionPop, MAIN, 1, "step"); // step #2: 4 µs → 8 µs, peak 9 MiB
    note(&mut t, NoteKind::RegionPop, OTHER, 0, "nothing open"); // ignored
    note(&mut t, NoteKind::RegionPush, MAIN, 1, "teardown"); // open to the end (8 µs → 10 µs)
    t.free(A); // 9 µs
    t.end(Stats::default()); // 10 µs
    t
}

#[test]
fn summary_lists_regions_and_marks() {
    for old_form in [false, true] {
        let d = tempfile::tempdir().unwrap();
        let p = trace(old_form).write(d.path(), "r.trace");
        let s = summary::summarize(&[&p], &mut NoProgress).unwrap();
        let j = serde_json::to_value(&s).unwrap();
        assert_eq!(
            j["regions"],
            serde_json::json!([
                {"name": "step", "count": 2, "total_ns": 2000 + 4000, "peak_live_bytes": 9 * MIB},
                {"name": "forward", "count": 1, "total_ns": 2000, "peak_live_bytes": 9 * MIB},
                {"name": "loader", "count": 1, "total_ns": 3000, "peak_live_bytes": 9 * MIB},
                {"name": "teardown", "count": 1, "total_ns": 2000, "peak_live_bytes": 2 * MIB},
            ]),
            "old form: {old_form}"
        );
        assert_eq!(j["region_count"], 5);
        assert_eq!(j["mark_count"], 2);
        assert_eq!(
            j["marks"],
            serde_json::json!([
                {"trace": 0, "seq": 1, "ts_ns": 1_001_000, "text": "loaded"},
                {"trace": 0, "seq": 6, "ts_ns": 1_006_000, "text": "half way"},
            ])
        );
        assert_eq!(j["notes"]["mark"], 2);
        assert_eq!(j["notes"]["region_push"], 5);
        assert_eq!(j["notes"]["region_pop"], 5);
        assert!(j["notes"].get("info").is_none(), "{}", j["notes"]);
        // each trace has them too
        assert_eq!(j["traces"][0]["regions"], j["regions"]);

        let text = summary::render_text(&s);
        assert!(
            text.contains("regions  5 regions (4 names), total time and peak device memory inside"),
            "{text}"
        );
        assert!(
            text.contains("         2 x     6.0 µs  peak    9.0 MiB  step"),
            "{text}"
        );
        assert!(
            text.contains("         1 x     2.0 µs  peak    2.0 MiB  teardown"),
            "{text}"
        );
        assert!(text.contains("marks    2 marks"), "{text}");
        assert!(text.contains("  at     5.0 µs  half way"), "{text}");
    }
}

#[test]
fn several_traces_add_regions_up() {
    let d = tempfile::tempdir().unwrap();
    let a = trace(false).write(d.path(), "a.trace");
    let b = trace(true).write(d.path(), "b.trace");
    let s = summary::summarize(&[&a, &b], &mut NoProgress).unwrap();
    assert_eq!(s.region_count, 10);
    assert_eq!(s.regions[0].name, "step");
    assert_eq!((s.regions[0].count, s.regions[0].total_ns), (4, 12_000));
    assert_eq!(s.mark_count, 4);
    assert_eq!(s.marks.len(), 4);
    assert_eq!(s.marks[2].trace, 1);
}

#[test]
fn report_timeline_has_the_regions_and_marks() {
    let d = tempfile::tempdir().unwrap();
    let p = trace(false).write(d.path(), "r.trace");
    let html = report::render(&[&p], &mut NoProgress).unwrap().html;
    let start = html.find("id=\"isolate-data\">").unwrap() + "id=\"isolate-data\">".len();
    let end = start + html[start..].find("</script>").unwrap();
    let v: serde_json::Value = serde_json::from_str(&html[start..end]).unwrap();
    let tl = &v["traces"][0]["timeline"];
    // times from the first event (1 µs); outer regions first
    let regions: Vec<(u64, u64, &str, u64)> = tl["regions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["from_ns"].as_u64().unwrap(),
                r["to_ns"].as_u64().unwrap(),
                r["label"].as_str().unwrap(),
                r["depth"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        regions,
        [
            (0, 2000, "step", 1),
            (3000, 6000, "loader", 1),
            (3000, 7000, "step", 1),
            (7000, 9000, "teardown", 1),
            (4000, 6000, "forward", 2),
        ]
    );
    assert_eq!(tl["region_count"], 5);
    let marks: Vec<(u64, &str)> = tl["markers"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["kind"] == "mark")
        .map(|m| (m["t_ns"].as_u64().unwrap(), m["short"].as_str().unwrap()))
        .collect();
    assert_eq!(marks, [(0, "loaded"), (5000, "half way")]);
}
