//! Which traces a run wrote.
//!
//! # Traces
//!
//! Before the command starts, `isolate` checks that traces can be created where the pattern
//! puts them ([`check_trace_dir`]: the directory exists and can be written to), and lists the
//! files the pattern already matches ([`trace_files`]: `%p` and `%r` stand for any number, `%h`
//! for this host, and the `.1`, `.2` the library adds to a name that exists are matched too).
//! While the command runs, its descendants are read from `/proc/PID/task/TID/children` every
//! `POLL_MS` ms and whenever a child ends. Afterwards, the files the pattern matches that were
//! not there before are the run's when their header's pid is the command's or a descendant's,
//! or their header's parent pid is that of a process of the run (followed from trace to trace,
//! so that a grandchild whose parent lived too briefly to be seen is still found through the
//! parent's trace). Other new files (another job writing to the same directory) are counted,
//! not listed ([`traces_report`]).

use crate::{Error, printable, shell_quote};
use std::collections::BTreeSet;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;

/// This machine's host name, as the library puts it in trace names (`%h`).
pub fn host_name() -> String {
    let mut host = [0u8; 256];
    // SAFETY: the buffer is valid for its length minus the byte kept for the terminator.
    unsafe { libc::gethostname(host.as_mut_ptr().cast(), host.len() - 1) };
    let end = host.iter().position(|&b| b == 0).unwrap_or(0);
    String::from_utf8_lossy(&host[..end]).into_owned()
}

/// One part of a trace pattern's path component: text, or a number (`%p`, `%r`).
#[derive(Clone, Debug, PartialEq, Eq)]
enum Piece {
    Text(String),
    Number,
}

/// A path component of a pattern, `%h` and `%%` expanded.
fn pieces(component: &str, host: &str) -> Vec<Piece> {
    let mut out = Vec::new();
    let mut text = String::new();
    let mut it = component.chars();
    while let Some(c) = it.next() {
        if c != '%' {
            text.push(c);
            continue;
        }
        match it.next() {
            Some('p' | 'r') => {
                if !text.is_empty() {
                    out.push(Piece::Text(std::mem::take(&mut text)));
                }
                out.push(Piece::Number);
            }
            // As the library expands it: one path component, never `..`.
            Some('h') => text.push_str(&isolate_trace::host_in_path(host)),
            Some('%') => text.push('%'),
            Some(o) => {
                text.push('%');
                text.push(o);
            }
            None => text.push('%'),
        }
    }
    if !text.is_empty() {
        out.push(Piece::Text(text));
    }
    out
}

fn literal(p: &[Piece]) -> Option<String> {
    match p {
        [] => Some(String::new()),
        [Piece::Text(t)] => Some(t.clone()),
        _ => None,
    }
}

/// Does the whole of `s` match the pieces? In time linear in `s` for each piece: the set of
/// offsets of `s` the pieces so far can end at is carried from piece to piece (a number extends
/// every offset over the digits that follow it). Trying each split of a run of digits between
/// the numbers in turn, as this did, took time exponential in their count: a pattern of 12 `%p`
/// and one long numeric file name in the directory kept `isolate run` from ever starting the
/// command.
fn matches(p: &[Piece], s: &str) -> bool {
    let b = s.as_bytes();
    let n = b.len();
    let mut at = vec![false; n + 1];
    at[0] = true;
    for piece in p {
        let mut next = vec![false; n + 1];
        match piece {
            Piece::Text(t) => {
                let t = t.as_bytes();
                for i in (0..=n).filter(|&i| at[i]) {
                    if b[i..].starts_with(t) {
                        next[i + t.len()] = true;
                    }
                }
            }
            Piece::Number => {
                // next[j]: s[j-1] is a digit, and a number may start at j-1 or go on through it.
                for j in 1..=n {
                    next[j] = b[j - 1].is_ascii_digit() && (at[j - 1] || next[j - 1]);
                }
            }
        }
        at = next;
        if !at.contains(&true) {
            return false;
        }
    }
    at[n]
}

/// A trace file name made by the pattern component `p`: the name itself, or with the `.N`
/// the library adds when the name exists.
fn file_matches(p: &[Piece], name: &str) -> bool {
    matches(p, name)
        || name.rsplit_once('.').is_some_and(|(stem, n)| {
            !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) && matches(p, stem)
        })
}

fn list_dir(d: &Path) -> Vec<(String, std::fs::FileType)> {
    let dir = if d.as_os_str().is_empty() {
        Path::new(".")
    } else {
        d
    };
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    rd.flatten()
        .filter_map(|e| Some((e.file_name().into_string().ok()?, e.file_type().ok()?)))
        .collect()
}

/// Every file that the trace pattern can have made (with `%p` and `%r` standing for any number,
/// `.N` suffixes included), relative when the pattern is.
pub fn trace_files(pattern: &str, host: &str) -> BTreeSet<PathBuf> {
    let comps: Vec<&str> = pattern.split('/').collect();
    let Some((last, dirs_part)) = comps.split_last() else {
        return BTreeSet::new();
    };
    let mut dirs = vec![if pattern.starts_with('/') {
        PathBuf::from("/")
    } else {
        PathBuf::new()
    }];
    for c in dirs_part.iter().filter(|c| !c.is_empty()) {
        let p = pieces(c, host);
        dirs = match literal(&p) {
            Some(t) => dirs.into_iter().map(|d| d.join(&t)).collect(),
            None => dirs
                .iter()
                .flat_map(|d| {
                    list_dir(d)
                        .into_iter()
                        .filter(|(n, t)| t.is_dir() && matches(&p, n))
                        .map(move |(n, _)| d.join(n))
                })
                .collect(),
        };
    }
    let p = pieces(last, host);
    let mut out = BTreeSet::new();
    for d in &dirs {
        for (n, t) in list_dir(d) {
            if t.is_file() && file_matches(&p, &n) {
                out.insert(d.join(n));
            }
        }
    }
    out
}

/// Checks that traces can be created where the pattern puts them: its directory exists and
/// can be written to (the library creates no directories). A directory with `%p` or `%r` in
/// it is made per process: then only the part before them is checked. `source` says where the
/// pattern came from (`--trace`, `ISOLATE_TRACE`).
pub fn check_trace_dir(pattern: &str, source: &str, host: &str) -> Result<(), Error> {
    let dir_part = match pattern.rfind('/') {
        Some(0) => "/",
        Some(i) => &pattern[..i],
        None => ".",
    };
    let mut dir = if dir_part.starts_with('/') {
        PathBuf::from("/")
    } else {
        PathBuf::new()
    };
    let mut whole = true;
    for c in dir_part.split('/').filter(|c| !c.is_empty()) {
        match literal(&pieces(c, host)) {
            Some(t) => dir.push(t),
            None => {
                whole = false;
                break;
            }
        }
    }
    if dir.as_os_str().is_empty() {
        dir.push(".");
    }
    let said = if source.starts_with("--") {
        format!("{source} {pattern}")
    } else if source == "ISOLATE_TRACE" {
        format!("ISOLATE_TRACE={pattern}")
    } else {
        format!("{source} {pattern}")
    };
    let fail = |what: &str| {
        Err(Error::invalid(format!(
            "cannot create traces in {}: {what} ({said})",
            dir.display()
        )))
    };
    match std::fs::metadata(&dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return fail("no such directory; isolate does not create directories");
        }
        Err(e) => return fail(&isolate_trace::io_short(&e)),
        Ok(m) if !m.is_dir() => return fail("not a directory"),
        Ok(_) => {}
    }
    if whole {
        let c = std::ffi::CString::new(dir.as_os_str().as_bytes())
            .map_err(|_| Error::invalid(format!("{} holds a NUL byte", dir.display())))?;
        // SAFETY: a valid C string.
        if unsafe { libc::access(c.as_ptr(), libc::W_OK | libc::X_OK) } != 0 {
            let e = std::io::Error::last_os_error();
            return fail(&match e.raw_os_error() {
                Some(libc::EROFS) => "read-only file system".to_owned(),
                Some(libc::EACCES) | Some(libc::EPERM) => "no permission to write there".to_owned(),
                _ => e.to_string(),
            });
        }
    }
    Ok(())
}

/// A trace the run wrote.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceFile {
    pub path: PathBuf,
    pub pid: u32,
    pub ppid: u32,
    pub argv: Vec<String>,
}

/// What a run did.
#[derive(Debug)]
pub struct Finished {
    /// How the command ended.
    pub status: ExitStatus,
    /// The command's pid.
    pub pid: u32,
    /// The traces it and its descendants wrote, in path order.
    pub traces: Vec<TraceFile>,
    /// New files the pattern matches that processes outside the run wrote (or whose header
    /// could not be read).
    pub others: usize,
}

/// Of the new files the pattern matches, those the run wrote: a trace whose header's pid is the
/// command's or one of its descendants', or whose parent's is (followed to the end, so a child
/// of a child that lived too briefly to be seen is found through its parent's trace). Returns
/// them and how many others there were.
pub(crate) fn the_runs(new: BTreeSet<PathBuf>, family: &BTreeSet<u32>) -> (Vec<TraceFile>, usize) {
    let mut candidates: Vec<Option<TraceFile>> = new
        .into_iter()
        .map(|path| {
            let r = isolate_trace::Reader::open(&path).ok()?;
            let h = r.header();
            Some(TraceFile {
                pid: h.pid,
                ppid: h.ppid,
                argv: h.argv.clone(),
                path,
            })
        })
        .collect();
    let mut family = family.clone();
    let mut found = Vec::new();
    loop {
        let before = found.len();
        for c in candidates.iter_mut() {
            if c.as_ref()
                .is_some_and(|t| family.contains(&t.pid) || family.contains(&t.ppid))
                && let Some(t) = c.take()
            {
                family.insert(t.pid);
                found.push(t);
            }
        }
        if found.len() == before {
            break;
        }
    }
    found.sort_by(|a, b| a.path.cmp(&b.path));
    let others = candidates.len() - found.len();
    (found, others)
}

/// Traces listed one a line at most.
const LISTED: usize = 10;

/// What `isolate run` says at the end (each line starting `isolate: `): the traces the run
/// wrote and the one command that reads them, `isolate` being called `command`.
pub fn traces_report(f: &Finished, command: &str, pattern: &str) -> Vec<String> {
    let mut out = Vec::new();
    let path = |t: &TraceFile| shell_quote(&t.path.to_string_lossy());
    match f.traces.as_slice() {
        [] => out.push(format!(
            "isolate: no trace was written: a process writes one at its first CUDA allocation call \
             (if the library could not create one, it said so above); traces go to {pattern}"
        )),
        [t] => {
            out.push(format!(
                "isolate: trace written: {} (pid {})",
                printable(&path(t)),
                t.pid
            ));
            out.push(format!(
                "isolate: read it with: {command} summary {}",
                printable(&path(t))
            ));
        }
        ts => {
            out.push(format!("isolate: {} traces written:", ts.len()));
            for t in ts.iter().take(LISTED) {
                // The program by its file name: the whole path would crowd the line.
                let mut words: Vec<String> = t.argv.clone();
                if let Some(first) = words.first_mut()
                    && let Some(name) = Path::new(first.as_str()).file_name()
                {
                    *first = name.to_string_lossy().into_owned();
                }
                let mut argv = words.join(" ");
                if argv.chars().count() > 60 {
                    argv = argv.chars().take(59).collect::<String>() + "…";
                }
                let parent = if t.pid == f.pid {
                    " (the command)".to_owned()
                } else if t.ppid == f.pid {
                    " (a child of the command)".to_owned()
                } else {
                    format!(" (parent {})", t.ppid)
                };
                out.push(format!(
                    "isolate:   {}  pid {}{parent}  {}",
                    printable(&path(t)),
                    t.pid,
                    printable(&argv)
                ));
            }
            if ts.len() > LISTED {
                out.push(format!("isolate:   and {} more", ts.len() - LISTED));
            }
            let all: Vec<String> = ts.iter().map(path).collect();
            out.push(format!(
                "isolate: read them with: {command} summary {}",
                printable(&all.join(" "))
            ));
        }
    }
    if f.others > 0 {
        out.push(format!(
            "isolate: ({} other new {} matching {pattern} came from processes outside this run: not listed)",
            f.others,
            if f.others == 1 { "file" } else { "files" }
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::ExitStatusExt;

    #[test]
    fn twelve_numbers_against_a_long_run_of_digits_take_no_time() {
        // Exponential before: C(79, 11) splits tried for a name that can never match.
        let p = pieces(&"%p".repeat(12), "h");
        let name = "1".repeat(80) + "x";
        let t = std::time::Instant::now();
        assert!(!file_matches(&p, &name));
        assert!(file_matches(&p, &"1".repeat(80)));
        assert!(
            !file_matches(&p, &"1".repeat(11)),
            "each number is one digit at least"
        );
        assert!(
            t.elapsed() < std::time::Duration::from_secs(1),
            "{:?}",
            t.elapsed()
        );
    }

    #[test]
    fn trace_names_match_their_pattern() {
        let p = pieces("rank%r-%h-%p.trace", "gpu7");
        assert!(file_matches(&p, "rank0-gpu7-4312.trace"));
        // The names the library gives when one exists (an exec, a reused pattern).
        assert!(file_matches(&p, "rank3-gpu7-4312.trace.1"));
        assert!(file_matches(&p, "rank3-gpu7-4312.trace.27"));
        assert!(!file_matches(&p, "rank3-gpu7-4312.trace.x"));
        assert!(!file_matches(&p, "rank3-gpu8-4312.trace"), "another host");
        assert!(!file_matches(&p, "rank-gpu7-4312.trace"), "%r is a number");
        assert!(!file_matches(&p, "rank3-gpu7-43a2.trace"));
        let p = pieces("%p%p.t", "h");
        assert!(file_matches(&p, "12.t"));
        assert!(!file_matches(&p, "1.t"));
        // A host name that would leave the directory is the library's one component.
        assert!(file_matches(&pieces("%h-%p", "../x"), ".._x-5"));
        let p = pieces("a%pb%p", "h");
        assert!(file_matches(&p, "a1b2") && file_matches(&p, "a12b345"));
        assert!(!file_matches(&p, "a1b") && !file_matches(&p, "ab2") && !file_matches(&p, "a1c2"));
        let p = pieces("100%%-%p", "h");
        assert!(file_matches(&p, "100%-7") && !file_matches(&p, "100%%-7"));
        assert_eq!(
            literal(&pieces("traces-%h", "h1")),
            Some("traces-h1".to_owned())
        );
        assert_eq!(literal(&pieces("r%r", "h1")), None);
    }

    #[test]
    fn trace_files_walks_the_directories_of_the_pattern() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path();
        for f in [
            "a/r0/t-1.trace",
            "a/r0/t-2.trace.1",
            "a/r1/t-3.trace",
            "a/rx/t-4.trace",
            "a/r1/u-5.trace",
        ] {
            let p = root.join(f);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(&p, b"").unwrap();
        }
        std::fs::create_dir_all(root.join("a/r1/t-6.trace")).unwrap();
        let pattern = format!("{}/a/r%r/t-%p.trace", root.display());
        let got: Vec<String> = trace_files(&pattern, "h")
            .iter()
            .map(|p| p.strip_prefix(root).unwrap().display().to_string())
            .collect();
        assert_eq!(
            got,
            ["a/r0/t-1.trace", "a/r0/t-2.trace.1", "a/r1/t-3.trace"]
        );
    }

    #[test]
    fn the_trace_directory_is_checked() {
        let d = tempfile::tempdir().unwrap();
        let here = format!("{}/x-%p.trace", d.path().display());
        assert!(check_trace_dir(&here, "--trace", "h").is_ok());
        let missing = format!("{}/no/x-%p.trace", d.path().display());
        let e = check_trace_dir(&missing, "--trace", "h")
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with(&format!(
                "cannot create traces in {}/no: no such directory",
                d.path().display()
            )) && e.ends_with(&format!("(--trace {missing})")),
            "{e}"
        );
        let e = check_trace_dir("/nonexistent/%h/x.trace", "ISOLATE_TRACE", "h")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("in /nonexistent/h: no such directory")
                && e.contains("(ISOLATE_TRACE=/nonexistent/%h/x.trace)"),
            "{e}"
        );
        // A directory made per process is checked up to its first %p or %r.
        let per = format!("{}/r%r/x.trace", d.path().display());
        assert!(check_trace_dir(&per, "--trace", "h").is_ok());
        let e = check_trace_dir("/nonexistent/r%r/x.trace", "--trace", "h").unwrap_err();
        assert!(
            e.to_string().contains("in /nonexistent: no such directory"),
            "{e}"
        );
        // A file where the directory should be.
        std::fs::write(d.path().join("f"), b"").unwrap();
        let e = check_trace_dir(&format!("{}/f/x.trace", d.path().display()), "--trace", "h")
            .unwrap_err();
        assert!(e.to_string().contains(": not a directory"), "{e}");
        // A bare name: the working directory.
        assert!(check_trace_dir("x-%p.trace", "the default trace pattern", "h").is_ok());
    }

    #[test]
    fn the_runs_traces_are_its_family() {
        let d = tempfile::tempdir().unwrap();
        let write = |name: &str, pid: u32, ppid: u32| {
            let mut b = Vec::new();
            isolate_trace::Encoder::preamble(
                &isolate_trace::Header {
                    pid,
                    ppid,
                    argv: vec!["prog".into()],
                    ..isolate_trace::Header::default()
                },
                &mut b,
            );
            let p = d.path().join(name);
            std::fs::write(&p, b).unwrap();
            p
        };
        let new: BTreeSet<PathBuf> = [
            write("cmd.trace", 100, 1),
            write("child.trace", 101, 100),
            // A grandchild whose parent (102) was never seen, and its own child.
            write("grandchild.trace", 103, 102),
            write("great.trace", 104, 103),
            // Through a trace of the run only: 105's parent 101 wrote one.
            write("via-trace.trace", 105, 101),
            write("other.trace", 200, 1),
        ]
        .into_iter()
        .chain([d.path().join("missing.trace")])
        .collect();
        let family = BTreeSet::from([100, 102]);
        let (found, others) = the_runs(new, &family);
        let pids: Vec<u32> = found.iter().map(|t| t.pid).collect();
        assert_eq!(pids, [101, 100, 103, 104, 105], "in path order");
        assert_eq!(
            others, 2,
            "the other process's trace and the unreadable one"
        );
    }

    #[test]
    fn what_the_run_says_at_the_end() {
        let t = |p: &str, pid, ppid| TraceFile {
            path: PathBuf::from(p),
            pid,
            ppid,
            argv: vec!["/usr/bin/python3".into(), "train.py".into()],
        };
        let status = ExitStatus::from_raw(0);
        let one = Finished {
            status,
            pid: 7,
            traces: vec![t("out dir/7.trace", 7, 1)],
            others: 0,
        };
        assert_eq!(
            traces_report(&one, "isolate", "out dir/%p.trace"),
            [
                "isolate: trace written: 'out dir/7.trace' (pid 7)",
                "isolate: read it with: isolate summary 'out dir/7.trace'",
            ]
        );
        let two = Finished {
            status,
            pid: 7,
            traces: vec![t("7.trace", 7, 1), t("8.trace", 8, 7)],
            others: 1,
        };
        assert_eq!(
            traces_report(&two, "./isolate", "%p.trace"),
            [
                "isolate: 2 traces written:",
                "isolate:   7.trace  pid 7 (the command)  python3 train.py",
                "isolate:   8.trace  pid 8 (a child of the command)  python3 train.py",
                "isolate: read them with: ./isolate summary 7.trace 8.trace",
                "isolate: (1 other new file matching %p.trace came from processes outside this run: not listed)",
            ]
        );
        let none = Finished {
            status,
            pid: 7,
            traces: vec![],
            others: 0,
        };
        assert!(
            traces_report(&none, "isolate", "x.trace")[0]
                .starts_with("isolate: no trace was written")
        );
    }
}
