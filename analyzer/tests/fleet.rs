//! `isolate export --format parquet`: traces of several processes (three ranks on two hosts, a
//! fourth process without a rank), exported into one directory and read back with DuckDB's
//! Python package, running the queries of docs/fleet.md exactly as written there; their answers
//! are checked against what the traces were built with. Also: a second export into the same
//! directory adds files and a repeated one replaces them (the row counts say so), nothing is
//! left under a temporary name, and a failed export leaves no file of its own.
//!
//! Without python3 with duckdb (`pip install duckdb`) the DuckDB half says so and passes,
//! unless `CI` is set (.ci/run installs it into its venv).

mod common;

use common::*;
use isolate_trace::{Api, Event, Frame, NoteKind, PyCode, Record, Stack, Stats};
use serde_json::{Value, json};
use std::path::Path;
use std::process::Command;

const TRAIN: &str = "/src/train.py";

/// The site names the stacks below get (their first shown frame).
fn site(line: u32, func: &str) -> String {
    format!("{TRAIN}:{line} in {func}")
}

/// One process of the job: `steps` steps, each a `step` region with one big allocation from
/// `forward` ((rank+1)(step+1) MiB) and four small ones from `backward` (4, 8, 12, 16 KiB),
/// all freed before the region ends; rank 1 then frees a `cleanup` allocation twice (a double
/// free), rank 2 frees an address never allocated (an invalid free). Stack ids differ per
/// process, as they do between real processes.
fn rank_trace(pid: u32, host: &str, rank: Option<u32>, steps: u64) -> TraceBuilder {
    let mut h = header(pid, &["python", "train.py"]);
    h.hostname = host.into();
    h.rank = rank;
    h.world_size = rank.map(|_| 3);
    let mut t = TraceBuilder::with_header(h);
    let r = u64::from(rank.unwrap_or(7));
    let base = 100 + rank.unwrap_or(7) * 10;
    for (k, (line, func)) in [(10, "forward"), (20, "backward"), (30, "cleanup")]
        .into_iter()
        .enumerate()
    {
        let code = base + k as u32;
        t.record(Record::PyCode(PyCode {
            id: code,
            file: TRAIN.into(),
            name: func.into(),
            first_line: line - 1,
        }));
        t.record(Record::Stack(Stack {
            id: code,
            frames: vec![Frame::Python { code, line }],
            truncated: false,
        }));
    }
    let (fwd, bwd, cleanup) = (base, base + 1, base + 2);
    let mult = rank.map_or(1, |x| u64::from(x) + 1);
    for s in 0..steps {
        t.text_note(NoteKind::RegionPush, 1000, 1, "step");
        let big = A + (r << 32);
        t.call_from(Api::CudaMalloc, big, mult * (s + 1) * MIB, fwd);
        for k in 0..4u64 {
            t.call_from(
                Api::CudaMalloc,
                big + 64 * MIB + k * MIB,
                4096 * (k + 1),
                bwd,
            );
        }
        for k in 0..4u64 {
            t.call_from(Api::CudaFree, big + 64 * MIB + k * MIB, 0, bwd);
        }
        t.call_from(Api::CudaFree, big, 0, fwd);
        t.text_note(NoteKind::RegionPop, 1000, 1, "step");
    }
    t.text_note(NoteKind::Mark, 1000, 0, "done");
    match rank {
        Some(1) => {
            let p = A + (r << 32) + 200 * MIB;
            t.call_from(Api::CudaMalloc, p, MIB, cleanup);
            t.call_from(Api::CudaFree, p, 0, cleanup);
            // The double free, from the same line: the driver refuses it too.
            t.event(Event {
                api: Api::CudaFree,
                ptr: p,
                result: 1,
                stack: cleanup,
                ..Event::default()
            });
        }
        Some(2) => {
            t.free_refused(A + (r << 32) + 300 * MIB, 1); // never allocated
        }
        _ => {}
    }
    t.end(Stats::default());
    t
}

/// The SQL blocks of docs/fleet.md, by the comment on their first line (`-- findings per
/// rank` → "findings per rank").
fn doc_queries() -> Vec<(String, String)> {
    let doc =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/fleet.md"))
            .expect("docs/fleet.md");
    let mut out = Vec::new();
    let mut lines = doc.lines();
    while let Some(l) = lines.next() {
        if l.trim() != "```sql" {
            continue;
        }
        let body: Vec<&str> = lines.by_ref().take_while(|l| l.trim() != "```").collect();
        let name = body
            .first()
            .and_then(|l| l.strip_prefix("-- "))
            .expect("a query block starts with `-- its name`")
            .to_owned();
        out.push((name, body.join("\n")));
    }
    out
}

/// Runs `queries` with DuckDB in `dir` (the queries name `fleet/...`); each answer's rows as
/// lists. `None` when python3 with duckdb is not there (and `CI` is not set).
fn duckdb(dir: &Path, queries: &[(String, String)]) -> Option<Value> {
    const PY: &str = r#"
import json, sys
import duckdb
queries = json.loads(sys.stdin.read())
con = duckdb.connect()
out = {}
for name, sql in queries:
    out[name] = [list(r) for r in con.sql(sql).fetchall()]
print(json.dumps(out, default=str))
"#;
    let probe = Command::new("python3")
        .args(["-c", "import duckdb"])
        .output();
    match probe {
        Ok(o) if o.status.success() => {}
        Ok(o) => {
            skip(&format!(
                "python3 has no duckdb (pip install duckdb): the Parquet export is not read by DuckDB here ({})",
                String::from_utf8_lossy(&o.stderr)
                    .lines()
                    .last()
                    .unwrap_or("")
                    .trim()
            ));
            return None;
        }
        Err(e) => {
            skip(&format!(
                "python3 cannot be run ({e}): the Parquet export is not read by DuckDB here"
            ));
            return None;
        }
    }
    use std::io::Write as _;
    let mut child = Command::new("python3")
        .arg("-c")
        .arg(PY)
        .current_dir(dir)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(serde_json::to_string(queries).unwrap().as_bytes())
        .unwrap();
    let o = child.wait_with_output().unwrap();
    assert!(
        o.status.success(),
        "duckdb failed:\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    Some(serde_json::from_slice(&o.stdout).unwrap())
}

/// Files under `dir` whose names start with a dot (temporary ones).
fn hidden_files(dir: &Path) -> Vec<String> {
    let mut v = Vec::new();
    for t in std::fs::read_dir(dir).unwrap() {
        let t = t.unwrap().path();
        if t.is_dir() {
            for f in std::fs::read_dir(&t).unwrap() {
                let n = f.unwrap().file_name().to_string_lossy().into_owned();
                if n.starts_with('.') {
                    v.push(format!("{}/{n}", t.display()));
                }
            }
        }
    }
    v
}

fn files(dir: &Path, table: &str) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir.join(table))
        .unwrap()
        .map(|f| f.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

#[test]
fn the_docs_queries_answer_what_the_traces_hold() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    let steps = 3u64;
    rank_trace(100, "node-a", Some(0), steps).write(dir, "r0.trace");
    rank_trace(101, "node-a", Some(1), steps).write(dir, "r1.trace");
    rank_trace(102, "node b", Some(2), steps).write(dir, "r2.trace");
    let o = export(
        dir,
        "parquet",
        &["r0.trace", "r1.trace", "r2.trace"],
        "fleet",
    );
    assert_eq!(o.code, 0, "{}", o.stderr);
    // 3 steps of 5 allocations, and rank 1's cleanup allocation.
    assert!(
        o.stderr.contains(
            "parquet: 3 traces written to fleet (rows: traces 3, allocations 46, frees 46, findings 2, regions 12, stacks 9)"
        ),
        "{}",
        o.stderr
    );
    let fleet = dir.join("fleet");
    let ids = [
        "node-a-100-1700000000000000000.parquet",
        "node-a-101-1700000000000000000.parquet",
        "node_b-102-1700000000000000000.parquet",
    ];
    for t in isolate_analyzer::export::fleet::TABLES {
        assert_eq!(files(&fleet, t), ids, "{t}");
    }
    assert_eq!(hidden_files(&fleet), Vec::<String>::new());

    let queries = doc_queries();
    let names: Vec<&str> = queries.iter().map(|q| q.0.as_str()).collect();
    assert_eq!(
        names,
        [
            "findings per rank",
            "peak per step across ranks",
            "top sites by bytes",
            "top sites by count"
        ]
    );
    let Some(a) = duckdb(dir, &queries) else {
        return;
    };

    // Findings per rank: rank 0 none, rank 1 a double free, rank 2 an invalid free.
    assert_eq!(
        a["findings per rank"],
        json!([
            [0, "node-a", 100, 0, 0, ""],
            [1, "node-a", 101, 1, 1, "double_free"],
            [2, "node b", 102, 1, 1, "invalid_free"],
        ])
    );

    // Peak per step: rank r's step s holds (r+1)(s+1) MiB and 40 KiB at once; rank 2 is
    // the highest of every step.
    let small = 4096 * (1 + 2 + 3 + 4);
    let want: Vec<Value> = (0..steps)
        .map(|s| json!([s, 3 * (s + 1) * MIB + small, 2, 3]))
        .collect();
    assert_eq!(a["peak per step across ranks"], Value::Array(want));

    // Sites across the three runs (stack ids differ per process; the names do not).
    let fwd_bytes: u64 = (1..=3)
        .map(|m| (1..=steps).map(|s| m * s * MIB).sum::<u64>())
        .sum();
    let (fwd, bwd, cleanup) = (
        site(10, "forward"),
        site(20, "backward"),
        site(30, "cleanup"),
    );
    assert_eq!(
        a["top sites by bytes"],
        json!([
            [fwd, fwd_bytes, 3 * steps, 3],
            [cleanup, MIB, 1, 1],
            [bwd, 3 * steps * small, 3 * steps * 4, 3],
        ])
    );
    assert_eq!(
        a["top sites by count"],
        json!([
            [bwd, 3 * steps * 4, 3 * steps * small, 3],
            [fwd, 3 * steps, fwd_bytes, 3],
            [cleanup, 1, MIB, 1],
        ])
    );

    // The rest of the schema, against the summary of the same traces.
    let check = vec![
        (
            "traces".to_owned(),
            "SELECT file, rank, world_size, allocations, frees, peak_live_bytes, findings, end_reason, stacks FROM 'fleet/traces/*.parquet' ORDER BY rank".to_owned(),
        ),
        (
            "frees".to_owned(),
            "SELECT f.how, count(*), count(DISTINCT (f.trace, f.alloc_seq)), sum(a.size) FROM 'fleet/frees/*.parquet' f JOIN 'fleet/allocations/*.parquet' a ON a.trace = f.trace AND a.seq = f.alloc_seq GROUP BY f.how".to_owned(),
        ),
        (
            "findings".to_owned(),
            "SELECT rank, kind, api, ptr, call_at, allocated_at, first_freed_at FROM 'fleet/findings/*.parquet' ORDER BY rank".to_owned(),
        ),
        (
            "marks".to_owned(),
            "SELECT rank, name, ordinal, depth, peak_live_bytes FROM 'fleet/regions/*.parquet' WHERE kind = 'mark' ORDER BY rank".to_owned(),
        ),
        (
            "stacks".to_owned(),
            "SELECT rank, stack, depth, kind, function, file, line, site FROM 'fleet/stacks/*.parquet' WHERE function = 'cleanup' ORDER BY rank".to_owned(),
        ),
    ];
    let b = duckdb(dir, &check).unwrap();
    for (i, tr) in ["r0.trace", "r1.trace", "r2.trace"].iter().enumerate() {
        let s = isolate(dir, &["summary", "--json", tr]).json();
        let row = &b["traces"][i];
        assert_eq!(row[0], *tr);
        assert_eq!(row[1], i);
        assert_eq!(row[2], 3);
        assert_eq!(row[3], s["allocations"], "{tr}");
        assert_eq!(row[4], s["frees"], "{tr}");
        assert_eq!(row[5], s["peak_live_bytes"], "{tr}");
        assert_eq!(row[6], s["findings"], "{tr}");
        assert_eq!(row[7], "exit");
        assert_eq!(row[8], 3);
    }
    // Every allocation freed once (rank 1's second free of it is the double free, not a free).
    let all_bytes = fwd_bytes + 3 * steps * small + MIB;
    assert_eq!(b["frees"], json!([["freed", 46, 46, all_bytes]]));
    let p = |r: u64, off: u64| (A + (r << 32) + off * MIB) as i64;
    assert_eq!(
        b["findings"],
        json!([
            [
                1,
                "double_free",
                "cudaFree",
                p(1, 200),
                site(30, "cleanup"),
                site(30, "cleanup"),
                site(30, "cleanup")
            ],
            [2, "invalid_free", "cudaFree", p(2, 300), null, null, null],
        ])
    );
    assert_eq!(
        b["marks"],
        json!([
            [0, "done", 0, null, 0],
            [1, "done", 0, null, 0],
            [2, "done", 0, null, 0]
        ])
    );
    // Each process's own id for the same line.
    let rows: Vec<Value> = [(0, 102), (1, 112), (2, 122)]
        .iter()
        .map(|(r, id)| {
            json!([
                r,
                id,
                0,
                "python",
                "cleanup",
                TRAIN,
                30,
                site(30, "cleanup")
            ])
        })
        .collect();
    assert_eq!(b["stacks"], Value::Array(rows));

    // A fourth process, without a rank, exported into the same directory: added beside the
    // others; rank 0's trace exported again: replaced, not added twice.
    rank_trace(200, "node-c", None, 1).write(dir, "solo.trace");
    let o = export(dir, "parquet", &["solo.trace", "r0.trace"], "fleet");
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert_eq!(files(&fleet, "allocations").len(), 4);
    assert_eq!(hidden_files(&fleet), Vec::<String>::new());
    let c = duckdb(
        dir,
        &[(
            "n".to_owned(),
            "SELECT rank, count(*) FROM 'fleet/allocations/*.parquet' GROUP BY rank ORDER BY rank NULLS LAST".to_owned(),
        )],
    )
    .unwrap();
    assert_eq!(c["n"], json!([[0, 15], [1, 16], [2, 15], [null, 5]]));
}

#[test]
fn a_failed_export_leaves_no_file_of_its_own() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    rank_trace(100, "node-a", Some(0), 2).write(dir, "good.trace");
    // The same trace under two names: refused before anything is written.
    rank_trace(100, "node-a", Some(0), 2).write(dir, "copy.trace");
    let o = export(dir, "parquet", &["good.trace", "copy.trace"], "fleet");
    assert_eq!(o.code, 2, "{}", o.stderr);
    assert!(
        o.stderr.contains(
            "good.trace and copy.trace are the same trace (node-a-100-1700000000000000000"
        ),
        "{}",
        o.stderr
    );
    assert!(!dir.join("fleet").exists());

    // A trace whose records turn into garbage halfway: an error naming it (the reader finds
    // it mid-analysis, with its tables' files being written), and no file, not even a
    // temporary one, for it; the good trace before it is complete.
    let mut bad = rank_trace(300, "node-z", Some(5), 2).bytes();
    let cut = bad.len() / 2;
    for b in &mut bad[cut..] {
        *b = 0xff;
    }
    std::fs::write(dir.join("bad.trace"), &bad).unwrap();
    let o = export(dir, "parquet", &["good.trace", "bad.trace"], "fleet");
    assert_eq!(o.code, 2, "{}", o.stderr);
    assert!(o.stderr.contains("bad.trace: at byte "), "{}", o.stderr);
    let fleet = dir.join("fleet");
    assert_eq!(hidden_files(&fleet), Vec::<String>::new());
    for t in isolate_analyzer::export::fleet::TABLES {
        assert_eq!(
            files(&fleet, t),
            ["node-a-100-1700000000000000000.parquet"],
            "{t}"
        );
    }
}

/// More rows than a row group holds: the file has two row groups, and every value, null or
/// not, is where it was written.
#[test]
fn a_table_longer_than_a_row_group() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    let n = isolate_analyzer::export::fleet::ROW_GROUP as u64 + 1000;
    let mut t = TraceBuilder::with_header(header(7, &["prog"]));
    t.record(Record::PyCode(PyCode {
        id: 1,
        file: TRAIN.into(),
        name: "loop".into(),
        first_line: 1,
    }));
    t.record(Record::Stack(Stack {
        id: 1,
        frames: vec![Frame::Python { code: 1, line: 5 }],
        truncated: false,
    }));
    for i in 0..n {
        // Every third allocation without a stack (a null site); all live to the end.
        let stack = if i % 3 == 0 { 0 } else { 1 };
        t.call_from(Api::CudaMalloc, A + i * 512, 256 + i, stack);
    }
    t.end(Stats::default());
    t.write(dir, "big.trace");
    let o = export(dir, "parquet", &["big.trace"], "fleet");
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(
        o.stderr.contains(&format!("allocations {n}, frees 0")),
        "{}",
        o.stderr
    );
    let q = |name: &str, sql: &str| (name.to_owned(), sql.to_owned());
    let Some(a) = duckdb(
        dir,
        &[
            q(
                "groups",
                "SELECT count(DISTINCT row_group_id), sum(DISTINCT row_group_num_rows) FROM parquet_metadata('fleet/allocations/*.parquet')",
            ),
            q(
                "rows",
                "SELECT count(*), count(site), sum(size), max(live_bytes), min(seq), max(seq) FROM 'fleet/allocations/*.parquet'",
            ),
            q(
                "nulls",
                "SELECT count(*) FROM 'fleet/allocations/*.parquet' WHERE (seq % 3 = 0) <> (site IS NULL) OR size <> 256 + seq OR ptr <> 139637976727552 + seq * 512",
            ),
        ],
    ) else {
        return;
    };
    assert_eq!(a["groups"], json!([[2, n]]));
    let sizes: u64 = (0..n).map(|i| 256 + i).sum();
    let with_site = n - n.div_ceil(3);
    assert_eq!(a["rows"], json!([[n, with_site, sizes, sizes, 0, n - 1]]));
    assert_eq!(a["nulls"], json!([[0]]));
}
