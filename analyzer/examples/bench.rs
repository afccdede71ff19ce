//! Throughput and memory of the analyses on a synthetic trace of ten million events.
//!
//! ```text
//! cargo run --release -p isolate-analyzer --example bench [-- --events N] [-- --keep PATH]
//! ```
//!
//! Writes the trace (a caching-allocator-like mix: size classes reused from free lists, four
//! threads on their own streams, stream-ordered and plain allocations, some pinned host memory,
//! expandable-segment-like VMM, rare failures, stats and notes), then runs each analysis in a
//! child process of its own so that each peak RSS (`getrusage` `ru_maxrss`) is its own, and
//! prints a table. Not a test: the figures depend on the machine.
//!
//! ```text
//! cargo build --release -p isolate-analyzer
//! cargo run --release -p isolate-analyzer --example bench -- --one-live [--events N] [--isolate BIN]
//! ```
//!
//! `--one-live` writes instead a trace with one live allocation at a time (half allocations,
//! half frees, addresses moving on; `analyzer/tests/common/one_live.rs`) and runs the `isolate`
//! binary (by default the one built beside this example) on it: `summary`, `graph` in each
//! format, `who`, `report` and `export`, each in a child process whose peak RSS comes from
//! `wait4`. Memory that grows with the number of allocations rather than with what is live
//! shows plainly there (`docs/reliability.md`, "Analyzer memory").

use isolate_analyzer::{NoProgress, graph, summary};
use isolate_trace::{Api, Encoder, End, EndReason, Event, Header, Note, NoteKind, Record, Stats};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

#[path = "../tests/common/one_live.rs"]
mod one_live;
#[path = "../tests/common/rusage.rs"]
mod rusage;

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Size classes like a caching allocator's: mostly small, a few large.
const CLASSES: [u64; 12] = [
    512,
    2048,
    8192,
    65536,
    262_144,
    1 << 20,
    2 << 20,
    4 << 20,
    8 << 20,
    20 << 20,
    64 << 20,
    256 << 20,
];

fn class(r: &mut Rng) -> usize {
    // Weights fall off with size.
    let x = r.below(1000);
    match x {
        0..300 => 0,
        300..520 => 1,
        520..680 => 2,
        680..790 => 3,
        790..870 => 4,
        870..920 => 5,
        920..950 => 6,
        950..970 => 7,
        970..985 => 8,
        985..993 => 9,
        993..998 => 10,
        _ => 11,
    }
}

struct ThreadState {
    tid: u32,
    stream: u64,
    free: Vec<Vec<u64>>,
    live: Vec<(u64, u64, bool)>,
    next: u64,
}

fn write_trace(path: &Path, n: u64) -> std::io::Result<u64> {
    let f = std::fs::File::create(path)?;
    let mut w = std::io::BufWriter::with_capacity(1 << 20, f);
    let mut buf = Vec::with_capacity(2 << 20);
    Encoder::preamble(
        &Header {
            pid: 4242,
            ppid: 1,
            exe: "/usr/bin/python3".into(),
            argv: vec!["python3".into(), "train.py".into()],
            mode: "log".into(),
            rank: Some(0),
            world_size: Some(8),
            ..Header::default()
        },
        &mut buf,
    );
    let mut enc = Encoder::new();
    let mut r = Rng(0x9e37_79b9_7f4a_7c15);
    let mut threads: Vec<ThreadState> = (0..4)
        .map(|i| ThreadState {
            tid: 5000 + i,
            stream: 0x5555_0000_0000 + u64::from(i) * 0x1000,
            free: vec![Vec::new(); CLASSES.len()],
            live: Vec::new(),
            next: 0x7f00_0000_0000 + u64::from(i) * (1 << 40),
        })
        .collect();
    let mut seq = 0u64;
    let mut ts = 1_000_000_000u64;
    let mut vmm_next = 0x6000_0000_0000u64;
    let mut vmm_live: Vec<(u64, u64, u64)> = Vec::new();
    let mut handle = 1u64;
    let mut host_live: Vec<u64> = Vec::new();
    let mut host_free: Vec<u64> = Vec::new();
    let mut host_next = 0x2000_0000u64;
    let push = |enc: &mut Encoder,
                buf: &mut Vec<u8>,
                w: &mut std::io::BufWriter<std::fs::File>,
                rec: Record|
     -> std::io::Result<()> {
        enc.encode(&rec, buf);
        if buf.len() > (1 << 20) {
            w.write_all(buf)?;
            buf.clear();
        }
        Ok(())
    };
    while seq < n {
        ts += 200 + r.below(800);
        let t = r.below(4) as usize;
        let th = &mut threads[t];
        let roll = r.below(10_000);
        let mut ev = Event {
            seq,
            ts_ns: ts,
            tid: th.tid,
            device: 0,
            duration_ns: 300 + r.below(2000),
            ..Event::default()
        };
        if roll < 30 {
            // Expandable-segment-like VMM: reserve, create, map, set access; later tear down.
            if vmm_live.len() < 8 || r.below(2) == 0 {
                let size = 2 << 20;
                let base = vmm_next;
                vmm_next += 1 << 30;
                for (api, ptr, sz, h) in [
                    (Api::CuMemAddressReserve, base, 64 << 20, 0),
                    (Api::CuMemCreate, 0, size, handle),
                    (Api::CuMemMap, base, size, handle),
                    (Api::CuMemSetAccess, base, size, 0),
                ] {
                    let e = Event {
                        seq,
                        ts_ns: ts,
                        api,
                        ptr,
                        size: sz,
                        handle: h,
                        ..ev
                    };
                    push(&mut enc, &mut buf, &mut w, Record::Event(e))?;
                    seq += 1;
                    ts += 500;
                }
                vmm_live.push((base, size, handle));
                handle += 1;
            } else {
                let i = r.below(vmm_live.len() as u64) as usize;
                let (base, size, h) = vmm_live.swap_remove(i);
                for (api, ptr, sz, hh) in [
                    (Api::CuMemUnmap, base, size, 0),
                    (Api::CuMemRelease, 0, 0, h),
                    (Api::CuMemAddressFree, base, 64 << 20, 0),
                ] {
                    let e = Event {
                        seq,
                        ts_ns: ts,
                        api,
                        ptr,
                        size: sz,
                        handle: hh,
                        ..ev
                    };
                    push(&mut enc, &mut buf, &mut w, Record::Event(e))?;
                    seq += 1;
                    ts += 500;
                }
            }
            continue;
        }
        if roll < 40 {
            ev.api = Api::CudaMalloc;
            ev.size = 80 << 30;
            ev.result = 2;
        } else if roll < 140 {
            // Pinned host memory (staging buffers), alloc or free.
            if host_live.len() > 64 || (!host_live.is_empty() && r.below(2) == 0) {
                let i = r.below(host_live.len() as u64) as usize;
                ev.api = Api::CudaFreeHost;
                ev.ptr = host_live.swap_remove(i);
                host_free.push(ev.ptr);
            } else {
                ev.api = Api::CudaHostAlloc;
                ev.ptr = match host_free.pop() {
                    Some(p) => p,
                    None => {
                        host_next += 1 << 21;
                        host_next
                    }
                };
                ev.size = 1 << 21;
                host_live.push(ev.ptr);
            }
        } else {
            let want_free = !th.live.is_empty()
                && r.below(th.live.len() as u64 + 1500)
                    >= 1500 - th.live.len().min(1500) as u64 / 2;
            let stream_ordered = r.below(4) != 0;
            if want_free {
                let i = r.below(th.live.len() as u64) as usize;
                let (ptr, c, so) = th.live.swap_remove(i);
                th.free[c as usize].push(ptr);
                ev.api = if so {
                    Api::CudaFreeAsync
                } else {
                    Api::CudaFree
                };
                ev.ptr = ptr;
                if so {
                    ev.stream = th.stream;
                }
            } else {
                let c = class(&mut r);
                let ptr = match th.free[c].pop() {
                    Some(p) => p,
                    None => {
                        let p = th.next;
                        th.next += CLASSES[c];
                        p
                    }
                };
                th.live.push((ptr, c as u64, stream_ordered));
                ev.api = if stream_ordered {
                    Api::CudaMallocAsync
                } else {
                    Api::CudaMalloc
                };
                ev.ptr = ptr;
                ev.size = CLASSES[c] - r.below(CLASSES[c] / 8);
                if stream_ordered {
                    ev.stream = th.stream;
                }
            }
        }
        push(&mut enc, &mut buf, &mut w, Record::Event(ev))?;
        seq += 1;
        if seq.is_multiple_of(1_000_000) {
            push(
                &mut enc,
                &mut buf,
                &mut w,
                Record::Stats(Stats {
                    ts_ns: ts,
                    events: seq,
                    ..Stats::default()
                }),
            )?;
            push(
                &mut enc,
                &mut buf,
                &mut w,
                Record::Note(Note {
                    seq,
                    ts_ns: ts,
                    kind: NoteKind::QuarantineRelease,
                    ptr: 0,
                    size: 0,
                    value: 0,
                    text: String::new(),
                }),
            )?;
        }
    }
    push(
        &mut enc,
        &mut buf,
        &mut w,
        Record::End(End {
            ts_ns: ts + 1,
            reason: EndReason::Exit,
            stats: Stats {
                events: seq,
                ..Stats::default()
            },
        }),
    )?;
    w.write_all(&buf)?;
    w.flush()?;
    Ok(seq)
}

fn max_rss_kib() -> i64 {
    // SAFETY: getrusage fills the struct we hand it.
    unsafe {
        let mut u: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut u);
        u.ru_maxrss
    }
}

/// Runs one phase in this process and prints `seconds rss_kib`.
fn phase(name: &str, path: &Path) {
    let t = Instant::now();
    match name {
        "summary" => {
            let s = summary::summarize_one(path, 0, &mut NoProgress).expect("summary");
            std::hint::black_box(s);
        }
        "graph" => {
            let mut sink = graph::NullSink::default();
            graph::build(
                &[path],
                graph::Filter::default(),
                &mut sink,
                &mut NoProgress,
            )
            .expect("graph");
            std::hint::black_box(sink);
        }
        "graph-json" => {
            let mut sink = graph::JsonSink::new(std::io::BufWriter::new(std::io::sink()));
            graph::build(
                &[path],
                graph::Filter::default(),
                &mut sink,
                &mut NoProgress,
            )
            .expect("graph");
        }
        "read" => {
            let mut n = 0u64;
            isolate_analyzer::read_records(path, &mut NoProgress, |_| n += 1).expect("read");
            std::hint::black_box(n);
        }
        _ => panic!("unknown phase {name}"),
    }
    println!("{} {}", t.elapsed().as_secs_f64(), max_rss_kib());
}

/// `--one-live`: peak RSS of each subcommand of the `isolate` binary on a trace with one live
/// allocation at a time.
fn one_live_table(events: u64, keep: Option<PathBuf>, bin: Option<PathBuf>) {
    let bin = bin.unwrap_or_else(|| {
        let exe = std::env::current_exe().expect("own path");
        // target/<profile>/examples/bench -> target/<profile>/isolate
        exe.parent()
            .and_then(Path::parent)
            .map(|d| d.join("isolate"))
            .expect("target directory")
    });
    assert!(
        bin.is_file(),
        "{} not found: build it first (cargo build --release -p isolate-analyzer)",
        bin.display()
    );
    let dir = std::env::temp_dir().join(format!("isolate-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = keep.clone().unwrap_or_else(|| dir.join("one_live.trace"));
    let t = Instant::now();
    let n = one_live::write_one_live(&path, events).expect("write trace");
    let size = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
    println!(
        "wrote {n} events, one live allocation at a time, {:.1} MiB in {:.1} s to {}",
        size as f64 / (1 << 20) as f64,
        t.elapsed().as_secs_f64(),
        path.display()
    );
    println!("binary: {}", bin.display());
    println!();
    println!("| command | exit | time (s) | peak RSS (MiB) |");
    println!("|---|---:|---:|---:|");
    let p = path.to_string_lossy().into_owned();
    let o = |name: &str| dir.join(name).to_string_lossy().into_owned();
    // The address the first allocation, and every fourth one after, started at.
    let addr = "0x7f0000000000";
    let runs: Vec<Vec<String>> = vec![
        vec!["summary".into(), p.clone()],
        vec!["summary".into(), "--json".into(), p.clone()],
        vec!["graph".into(), p.clone(), "-o".into(), o("g.txt")],
        vec![
            "graph".into(),
            "--format".into(),
            "json".into(),
            p.clone(),
            "-o".into(),
            o("g.json"),
        ],
        vec![
            "graph".into(),
            "--format".into(),
            "dot".into(),
            p.clone(),
            "-o".into(),
            o("g.dot"),
        ],
        vec!["who".into(), addr.into(), p.clone()],
        vec!["who".into(), "--json".into(), addr.into(), p.clone()],
        vec!["report".into(), p.clone(), "-o".into(), o("r.html")],
        vec![
            "export".into(),
            "--format".into(),
            "chrome-trace".into(),
            p.clone(),
            "-o".into(),
            o("e.json"),
        ],
    ];
    for args in runs {
        let (code, secs, kib) = rusage::measured(
            Command::new(&bin)
                .args(&args)
                .stdout(std::process::Stdio::null()),
        );
        let shown: Vec<&str> = args
            .iter()
            .map(|a| {
                if *a == p {
                    "T"
                } else if a.starts_with(dir.to_str().unwrap_or("\0")) {
                    "OUT"
                } else {
                    a.as_str()
                }
            })
            .collect();
        println!(
            "| `isolate {}` | {code} | {secs:.2} | {:.1} |",
            shown.join(" "),
            kib as f64 / 1024.0
        );
        for f in ["g.json", "g.dot", "r.html", "e.json"] {
            let _ = std::fs::remove_file(dir.join(f));
        }
    }
    // The outputs went here, and the trace too unless it is kept elsewhere.
    let _ = std::fs::remove_dir_all(&dir);
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() == 4 && args[1] == "--phase" {
        phase(&args[2], Path::new(&args[3]));
        return;
    }
    if args.iter().any(|a| a == "--one-live") {
        let mut events = 10_000_000u64;
        let mut keep = None;
        let mut bin = None;
        let mut i = 1;
        while i + 1 < args.len() {
            match args[i].as_str() {
                "--events" => events = args[i + 1].replace('_', "").parse().expect("--events N"),
                "--keep" => keep = Some(PathBuf::from(&args[i + 1])),
                "--isolate" => bin = Some(PathBuf::from(&args[i + 1])),
                _ => {}
            }
            i += 1;
        }
        one_live_table(events, keep, bin);
        return;
    }
    let mut events = 10_000_000u64;
    let mut keep: Option<PathBuf> = None;
    let mut i = 1;
    while i < args.len() {
        match args[i].as_str() {
            "--events" => {
                events = args[i + 1].replace('_', "").parse().expect("--events N");
                i += 1;
            }
            "--keep" => {
                keep = Some(PathBuf::from(&args[i + 1]));
                i += 1;
            }
            _ => {}
        }
        i += 1;
    }
    let dir = std::env::temp_dir().join(format!("isolate-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = keep.clone().unwrap_or_else(|| dir.join("bench.trace"));
    let t = Instant::now();
    let n = write_trace(&path, events).expect("write trace");
    let size = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
    println!(
        "wrote {n} events, {:.1} MiB ({:.1} B/event) in {:.1} s to {}",
        size as f64 / (1 << 20) as f64,
        size as f64 / n as f64,
        t.elapsed().as_secs_f64(),
        path.display()
    );
    println!();
    println!("| analysis | time (s) | events/s | peak RSS (MiB) | goal | met |");
    println!("|---|---:|---:|---:|---|---|");
    let exe = std::env::current_exe().expect("own path");
    for (name, goal) in [
        ("read", None),
        ("summary", Some(10e6)),
        ("graph", Some(2e6)),
        ("graph-json", None),
    ] {
        // Best of three, each in a fresh process.
        let mut best = f64::MAX;
        let mut rss = 0i64;
        for _ in 0..3 {
            let out = Command::new(&exe)
                .args(["--phase", name])
                .arg(&path)
                .output()
                .expect("run phase");
            assert!(
                out.status.success(),
                "{name}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let s = String::from_utf8_lossy(&out.stdout);
            let mut it = s.split_whitespace();
            let secs: f64 = it.next().and_then(|x| x.parse().ok()).expect("seconds");
            let kib: i64 = it.next().and_then(|x| x.parse().ok()).expect("rss");
            best = best.min(secs);
            rss = rss.max(kib);
        }
        let rate = n as f64 / best;
        let mib = rss as f64 / 1024.0;
        let (goal_s, met) = match goal {
            Some(g) => (
                format!("≥ {:.0}M ev/s, < 256 MiB", g / 1e6),
                if rate >= g && mib < 256.0 {
                    "yes"
                } else {
                    "no"
                },
            ),
            None => ("-".to_owned(), "-"),
        };
        println!(
            "| {name} | {best:.2} | {:.2}M | {mib:.0} | {goal_s} | {met} |",
            rate / 1e6
        );
    }
    if keep.is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    }
}
