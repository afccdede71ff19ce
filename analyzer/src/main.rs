//! `isolate`: run a program under `libisolate.so` and analyse the traces it leaves.
//!
//! A thin layer over the `isolate_analyzer` library: argument parsing (every argument with its
//! help, errors that name the argument), output files, exit codes and the progress bar live
//! here; every analysis lives in the library.

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand, ValueEnum};
use isolate_analyzer::{
    self as ia, Progress, check, diff, export, finding, graph, report, sites, summary, util, who,
};
use isolate_run as run;
use std::ffi::OsString;
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Exit status when an analysis finished but a trace was cut short (it was analysed up to the
/// cut).
const EXIT_TRUNCATED: u8 = 3;
/// Exit status for errors (unreadable, foreign or corrupt traces; bad arguments).
const EXIT_ERROR: u8 = 2;

#[derive(Parser)]
#[command(
    name = "isolate",
    version,
    about = "Find use-after-free and aliasing bugs in CUDA programs",
    long_about = None,
    after_help = "Exit status: 0 done; 1 `check` over budget; 2 an error (one line on stderr); \
                  3 a trace was cut short (analysed up to the cut); `run`: the command's own, or \
                  --error-exitcode N when a finding was made."
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

/// `--error-exitcode`'s help, shared by `run` and `summary`.
const ERROR_EXITCODE: &str = "Exit with status N when the traces hold a finding that counts: a \
                              stale write, stale launch, invalid or double free, or device fault; \
                              not a possible leak (for CI; like compute-sanitizer's \
                              --error-exitcode)";

#[derive(Subcommand)]
enum Cmd {
    /// Run a command with libisolate.so preloaded (it must lie beside this executable), then say
    /// which traces it wrote and how to read them. Also sets NVTX_INJECTION64_PATH to the library
    /// (unless set), so that NVTX ranges become regions in the trace.
    Run {
        /// What the library does [default: log, or ISOLATE_MODE from the environment].
        #[arg(long, value_name = "MODE", value_parser = mode_values())]
        mode: Option<String>,
        /// Where each process's trace goes (sets ISOLATE_TRACE): %p pid, %r rank, %h host name,
        /// %% a % [default: isolate-%p.trace, or ISOLATE_TRACE from the environment].
        #[arg(long, value_name = "PATTERN")]
        trace: Option<String>,
        /// Run the command even when its traces cannot be created (the directory is missing or
        /// not writable); it then runs unrecorded.
        #[arg(long)]
        keep_going: bool,
        #[arg(long, value_name = "N", help = ERROR_EXITCODE)]
        error_exitcode: Option<u8>,
        /// The command and its arguments (put `--` before it when it has options of its own).
        #[arg(
            required = true,
            trailing_var_arg = true,
            allow_hyphen_values = true,
            value_name = "CMD"
        )]
        command: Vec<OsString>,
    },
    /// What the traces called, allocated, leaked and broke.
    Summary {
        /// Print one JSON object (deterministic, for scripts and golden files) instead of text.
        #[arg(long)]
        json: bool,
        #[arg(long, value_name = "N", help = ERROR_EXITCODE)]
        error_exitcode: Option<u8>,
        /// Trace files; several are summed and listed one by one.
        #[arg(required = true, value_name = "TRACE")]
        traces: Vec<PathBuf>,
    },
    /// The aliasing graph: which allocation reused whose memory, the victims of stale writes,
    /// VMM mappings, anomalies. A short text by default.
    Graph {
        /// Output format: text (a screenful: findings and their victims, the largest reuse
        /// chains), json (every node, edge and anomaly), dot (Graphviz; large graphs collapsed
        /// into their chains unless --full) [default: text, or from -o's extension: .json, .dot,
        /// .gv].
        #[arg(long, value_enum)]
        format: Option<GraphFormat>,
        /// Trace files; the nodes of several are numbered one after the other.
        #[arg(required = true, value_name = "TRACE")]
        traces: Vec<PathBuf>,
        /// Write here instead of standard output.
        #[arg(short, long, value_name = "FILE")]
        output: Option<PathBuf>,
        /// Print JSON or DOT to a terminal however large (without it, more than 8 MiB is
        /// refused there).
        #[arg(long)]
        force: bool,
        /// DOT: draw every node and edge, however large the graph (without it, graphs of more
        /// than 100 allocations, or with a reuse chain of more than 25, are collapsed into their
        /// largest reuse chains).
        #[arg(long)]
        full: bool,
        /// Keep only the nodes that covered this address (0x… or decimal).
        #[arg(long, value_name = "ADDR")]
        address: Option<String>,
        /// Keep only the nodes of this size class (sizes rounded up to a power of two: 4096, 2M).
        #[arg(long, value_name = "BYTES")]
        size_class: Option<String>,
        /// Keep only the nodes live at or after this time (trace clock, ns).
        #[arg(long, value_name = "NS")]
        from: Option<String>,
        /// Keep only the nodes live at or before this time (trace clock, ns).
        #[arg(long, value_name = "NS")]
        to: Option<String>,
    },
    /// Everything that ever covered an address, in order.
    Who {
        /// The address (0x… or decimal); it comes before the traces.
        #[arg(value_name = "ADDR", allow_negative_numbers = true)]
        addr: String,
        /// Trace files, each answered in turn.
        #[arg(required = true, value_name = "TRACE")]
        traces: Vec<PathBuf>,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Allocation sites (call stacks) ranked by the device memory they allocated or by how many
    /// allocations they made, as memray stats and heaptrack_print do.
    Sites {
        /// Rank by bytes allocated or by allocations made.
        #[arg(long, value_enum, default_value = "bytes")]
        by: SitesBy,
        /// Show the first N sites (0: all).
        #[arg(long, value_name = "N", default_value_t = 20)]
        top: usize,
        /// Print JSON instead of text (every frame of every site's stack).
        #[arg(long)]
        json: bool,
        /// Trace files; sites of the same name in several are added up.
        #[arg(required = true, value_name = "TRACE")]
        traces: Vec<PathBuf>,
    },
    /// Compare two runs, addresses aside.
    Diff {
        /// The trace of the earlier run.
        #[arg(value_name = "BASE")]
        base: PathBuf,
        /// The trace of the later run.
        #[arg(value_name = "NEW")]
        new: PathBuf,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Exit 0 when NEW stays within BASE's budget, 1 (with one reason a line) when it does not.
    Check {
        /// The trace to check.
        #[arg(value_name = "NEW")]
        new: PathBuf,
        /// The trace whose budget NEW must keep.
        #[arg(long, value_name = "BASE")]
        baseline: PathBuf,
        /// Allowed growth of peak device memory (e.g. 5%).
        #[arg(long, default_value = "5%", value_name = "PCT")]
        max_peak_growth: String,
        /// Allowed growth of the number of allocations (e.g. 10%).
        #[arg(long, default_value = "10%", value_name = "PCT")]
        max_alloc_growth: String,
        /// Fail on any leak the baseline does not have.
        #[arg(long)]
        no_new_leaks: bool,
        /// Fail on any stale write, stale launch, invalid free or true alias.
        #[arg(long)]
        no_violations: bool,
        /// Fail when any API fails more often than in the baseline.
        #[arg(long)]
        no_failures: bool,
    },
    /// One self-contained HTML report.
    Report {
        /// Trace files, one section each.
        #[arg(required = true, value_name = "TRACE")]
        traces: Vec<PathBuf>,
        /// The HTML file to write.
        #[arg(short, long, value_name = "FILE")]
        output: PathBuf,
    },
    /// The timeline for Perfetto / chrome://tracing, PyTorch's memory snapshot, or Parquet
    /// tables of many traces for DuckDB, Polars or Spark.
    Export {
        /// The output format: the Trace Event JSON that ui.perfetto.dev opens, the pickle that
        /// pytorch.org/memory_viz and torch.cuda._memory_viz open, or Parquet tables.
        #[arg(long, value_enum)]
        format: ExportFormat,
        /// Trace files; processes line up on one clock (memory-viz: one trace, one process).
        #[arg(required = true, value_name = "TRACE")]
        traces: Vec<PathBuf>,
        /// The file to write (JSON, or the snapshot pickle for memory-viz); for parquet, the
        /// directory: DIR/<table>/<trace>.parquet, made if missing (docs/fleet.md).
        #[arg(short, long, value_name = "FILE")]
        output: PathBuf,
        /// memory-viz: keep the most recent N entries of the allocation history (as PyTorch's
        /// max_entries does); older ones are dropped, and the command says so.
        #[arg(long, value_name = "N", default_value_t = export::DEFAULT_MAX_EVENTS)]
        max_events: usize,
    },
}

/// `--mode`'s values, each with what it does (shown by `isolate run --help`).
fn mode_values() -> clap::builder::PossibleValuesParser {
    use clap::builder::PossibleValue;
    clap::builder::PossibleValuesParser::new([
        PossibleValue::new("log").help(
            "the default: record every allocation; finds invalid and double frees, not stale writes",
        ),
        PossibleValue::new("isolate").help(
            "also hold freed memory back, poisoned, and check it: finds stale writes and stale launches",
        ),
        PossibleValue::new("off").help("preloaded but passing every call through: no trace"),
    ])
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum SitesBy {
    /// Bytes allocated over the run.
    Bytes,
    /// Allocations made over the run.
    Calls,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum GraphFormat {
    /// A screenful for a person.
    Text,
    /// Every node, edge and anomaly.
    Json,
    /// Graphviz.
    Dot,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum ExportFormat {
    /// Trace Event format JSON (Perfetto, chrome://tracing).
    ChromeTrace,
    /// PyTorch's memory snapshot pickle (pytorch.org/memory_viz, torch.cuda._memory_viz).
    MemoryViz,
    /// Parquet tables (traces, allocations, frees, findings, regions, stacks), one file per
    /// table per trace, for DuckDB, Polars or Spark (docs/fleet.md).
    Parquet,
}

/// A progress bar on standard error, for big files, only when it is a terminal.
struct Bar {
    enabled: bool,
    bar: Option<indicatif::ProgressBar>,
}

impl Bar {
    fn new() -> Self {
        Bar {
            enabled: std::io::stderr().is_terminal(),
            bar: None,
        }
    }
}

/// Files smaller than this read too fast to need a bar.
const BAR_MIN_BYTES: u64 = 64 << 20;

impl Progress for Bar {
    fn begin(&mut self, path: &Path, total: u64) {
        if !self.enabled || total < BAR_MIN_BYTES {
            return;
        }
        let b = indicatif::ProgressBar::new(total);
        b.set_style(
            indicatif::ProgressStyle::with_template(
                "{msg} [{bar:40}] {bytes}/{total_bytes} ({bytes_per_sec}, {eta})",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
            .progress_chars("=> "),
        );
        b.set_message(ia::file_label(path));
        self.bar = Some(b);
    }
    fn advance(&mut self, bytes: u64) {
        if let Some(b) = &self.bar {
            b.set_position(bytes);
        }
    }
    fn end(&mut self) {
        if let Some(b) = self.bar.take() {
            b.finish_and_clear();
        }
    }
}

/// Text for a terminal: control characters from the trace (other than newlines) are escaped,
/// so a hostile program name cannot move the cursor or change the terminal's title.
fn printable(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        if c.is_control() && c != '\n' && c != '\t' {
            o.extend(c.escape_default());
        } else {
            o.push(c);
        }
    }
    o
}

fn print_json<T: serde::Serialize>(v: &T) -> Result<()> {
    let mut s = serde_json::to_string_pretty(v)?;
    s.push('\n');
    to_stdout(s.as_bytes())
}

fn print_text(s: &str) -> Result<()> {
    to_stdout(printable(s).as_bytes())
}

/// Writes a finished analysis's output. A closed pipe (`isolate summary … | head -1`) is no
/// error: the reader has what it wanted, and the exit status stays the analysis's own (3 for a
/// truncated trace, N for `--error-exitcode`, 1 for `check`).
fn to_stdout(bytes: &[u8]) -> Result<()> {
    let mut out = std::io::stdout().lock();
    match out.write_all(bytes).and_then(|()| out.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        r => Ok(r?),
    }
}

/// Says on standard error which traces were cut short; true when any was.
fn warn_truncated(list: &[(String, Option<u64>)]) -> bool {
    let mut any = false;
    for (file, at) in list {
        if let Some(at) = at {
            any = true;
            eprintln!(
                "isolate: {file}: at byte {at}: the file ends inside a record (truncated); analysed up to there"
            );
        }
    }
    any
}

fn exit_for(truncated: bool) -> ExitCode {
    if truncated {
        ExitCode::from(EXIT_TRUNCATED)
    } else {
        ExitCode::SUCCESS
    }
}

/// How this `isolate` was started, for the commands it prints: the path it was run by when that
/// holds a slash (so that the command works from the same directory), else `isolate`.
fn self_command() -> String {
    match std::env::args_os().next() {
        Some(a) if a.as_encoded_bytes().contains(&b'/') => run::shell_quote(&a.to_string_lossy()),
        _ => "isolate".to_owned(),
    }
}

/// A number argument, its name in the error when it is not one.
fn number_arg(name: &str, v: &str) -> Result<u64> {
    util::parse_u64(v).map_err(|e| anyhow::anyhow!("{name}: {e}"))
}

/// Does an argument look like a file rather than an address?
fn looks_like_file(a: &str) -> bool {
    a.contains('/') || a.contains(".trace") || Path::new(a).exists()
}

/// `who`'s address. When it is not a number, the error says which argument it was and what was
/// expected, and when it looks like a file, the order the arguments go in.
fn who_address(addr: &str, traces: &[PathBuf]) -> Result<u64> {
    if let Ok(a) = util::parse_u64(addr) {
        return Ok(a);
    }
    let mut msg = format!(
        "who: ADDR, the first argument, is {addr:?}: not an address (expected 0x… hex or decimal)"
    );
    if looks_like_file(addr) {
        let (numbers, files): (Vec<&PathBuf>, Vec<&PathBuf>) = traces
            .iter()
            .partition(|t| util::parse_u64(&t.to_string_lossy()).is_ok());
        let a = numbers
            .first()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "ADDR".to_owned());
        let mut rest = vec![run::shell_quote(addr)];
        rest.extend(files.iter().map(|f| run::shell_quote(&f.to_string_lossy())));
        msg.push_str(&format!(
            "; it looks like a trace file: the address comes first: {} who {a} {}",
            self_command(),
            rest.join(" ")
        ));
    }
    bail!(msg)
}

/// JSON or DOT larger than this is not printed to a terminal without `--force`.
const TERMINAL_MAX_BYTES: u64 = 8 << 20;

/// Which graph format: `--format`, else `-o`'s extension, else text.
fn graph_format(format: Option<GraphFormat>, output: Option<&Path>) -> GraphFormat {
    if let Some(f) = format {
        return f;
    }
    let ext = output
        .and_then(|p| p.extension())
        .map(|e| e.to_string_lossy().to_ascii_lowercase());
    match ext.as_deref() {
        Some("json") => GraphFormat::Json,
        Some("dot" | "gv") => GraphFormat::Dot,
        _ => GraphFormat::Text,
    }
}

/// Says on standard error what `--error-exitcode` found; the status to exit with when any.
/// What counts is [`finding::Tally::counted`]: the rule of [`finding`].
fn error_exit(found: &finding::Tally, code: Option<u8>, hint: &str) -> Option<u8> {
    let n = code?;
    if found.counted() > 0 {
        eprintln!(
            "isolate: found {}: exit status {n} (--error-exitcode)",
            found.describe_counted()
        );
        Some(n)
    } else {
        eprintln!("isolate: found {}{hint}", found.describe_counted());
        None
    }
}

fn real_main() -> Result<ExitCode> {
    let cli = Cli::parse();
    let mut bar = Bar::new();
    match cli.cmd {
        Cmd::Run {
            mode,
            trace,
            keep_going,
            error_exitcode,
            command,
        } => {
            let exe = std::env::current_exe().context("cannot find the isolate executable")?;
            let library = run::library_beside(&exe)?;
            let opts = run::RunOptions {
                library,
                mode,
                trace,
                command,
            };
            // Before anything is said or run: a setting the library would refuse stops here.
            run::check_settings(&opts)?;
            let mode = opts.effective_mode();
            let (pattern, source) = opts.effective_trace();
            eprintln!("{}", printable(&run::mode_line(&mode, &pattern)));
            if mode != "off"
                && let Err(e) = run::check_trace_dir(&pattern, source, &run::host_name())
            {
                if !keep_going {
                    bail!(
                        "{e}. The command was not run: create the directory, or pass --keep-going to run it unrecorded"
                    );
                }
                eprintln!(
                    "isolate: {}; running it anyway (--keep-going): it runs unrecorded",
                    printable(&e.to_string())
                );
            }
            let fin = run::run(&opts)?;
            if mode != "off" {
                for l in run::traces_report(&fin, &self_command(), &pattern) {
                    eprintln!("{l}");
                }
            }
            let mut code = None;
            if error_exitcode.is_some() {
                let mut found = finding::Tally::default();
                for t in &fin.traces {
                    match summary::summarize_one(&t.path, 0, &mut bar) {
                        Ok(s) => found.add(&finding::Tally::of(&s.totals)),
                        Err(e) => eprintln!(
                            "isolate: {}; its findings are not counted",
                            printable(&e.to_string())
                        ),
                    }
                }
                let hint = if mode == "log" {
                    " (log mode cannot see stale writes: --mode isolate finds them)"
                } else {
                    ""
                };
                code = error_exit(&found, error_exitcode, hint);
            }
            // Ends here, killed by the command's signal, when one killed it.
            let status = run::end_like(fin.status);
            Ok(ExitCode::from(code.unwrap_or(status.clamp(0, 255) as u8)))
        }
        Cmd::Summary {
            json,
            error_exitcode,
            traces,
        } => {
            let s = summary::summarize(&traces, &mut bar)?;
            if json {
                print_json(&s)?;
            } else {
                print_text(&summary::render_text(&s))?;
            }
            let t: Vec<_> = s
                .traces
                .iter()
                .map(|t| (t.file.clone(), t.totals.truncated))
                .collect();
            let truncated = warn_truncated(&t);
            match error_exit(&finding::Tally::of(&s.totals), error_exitcode, "") {
                Some(n) => Ok(ExitCode::from(n)),
                None => Ok(exit_for(truncated)),
            }
        }
        Cmd::Sites {
            by,
            top,
            json,
            traces,
        } => {
            let by = match by {
                SitesBy::Bytes => sites::By::Bytes,
                SitesBy::Calls => sites::By::Calls,
            };
            let s = sites::sites(&traces, by, top, &mut bar)?;
            if json {
                print_json(&s)?;
            } else {
                print_text(&sites::render_text(&s))?;
            }
            let t: Vec<_> = s
                .traces
                .iter()
                .map(|t| (t.file.clone(), t.truncated))
                .collect();
            Ok(exit_for(warn_truncated(&t)))
        }
        Cmd::Graph {
            format,
            traces,
            output,
            force,
            full,
            address,
            size_class,
            from,
            to,
        } => {
            let filter = graph::Filter {
                address: address
                    .as_deref()
                    .map(|a| number_arg("--address", a))
                    .transpose()?,
                size_class: size_class
                    .as_deref()
                    .map(|s| util::parse_size(s).map_err(|e| anyhow::anyhow!("--size-class: {e}")))
                    .transpose()?,
                from_ns: from
                    .as_deref()
                    .map(|f| number_arg("--from", f))
                    .transpose()?,
                to_ns: to.as_deref().map(|t| number_arg("--to", t)).transpose()?,
            };
            if let (Some(f), Some(t)) = (filter.from_ns, filter.to_ns)
                && f > t
            {
                bail!("--from {f} is after --to {t}");
            }
            let format = graph_format(format, output.as_deref());
            if full && format != GraphFormat::Dot {
                bail!("--full: draws every node of --format dot; it does nothing for text or JSON");
            }
            if output.is_none() && !force && std::io::stdout().is_terminal() {
                let bytes: u64 = traces
                    .iter()
                    .filter_map(|t| std::fs::metadata(t).ok())
                    .map(|m| m.len())
                    .sum();
                // Measured on the H200 traces: JSON is about 10 bytes, DOT 4, per trace byte.
                let (estimate, name) = match format {
                    GraphFormat::Json => (bytes.saturating_mul(10), "JSON"),
                    GraphFormat::Dot if full => (bytes.saturating_mul(4), "DOT"),
                    _ => (0, ""),
                };
                if estimate > TERMINAL_MAX_BYTES {
                    bail!(
                        "graph: the {name} of {} would be about {}, too much for a terminal: write it to a file \
                         (-o graph.{}), pipe it, or pass --force; without --format, graph prints a short text",
                        if traces.len() == 1 {
                            "this trace"
                        } else {
                            "these traces"
                        },
                        util::human_bytes(estimate),
                        if name == "JSON" { "json" } else { "dot" }
                    );
                }
            }
            let filtering = !filter.is_empty();
            let mut emit = |mut sink_out: &mut dyn Write| -> Result<Vec<graph::GraphTrace>> {
                Ok(match format {
                    GraphFormat::Json => {
                        let mut s = graph::JsonSink::new(&mut sink_out);
                        graph::build(&traces, filter, &mut s, &mut bar)?
                    }
                    GraphFormat::Dot if full => {
                        let mut s = graph::DotSink::new(&mut sink_out);
                        graph::build(&traces, filter, &mut s, &mut bar)?
                    }
                    GraphFormat::Dot => {
                        let mut s = graph::AutoDotSink::new(&mut sink_out, filtering);
                        graph::build(&traces, filter, &mut s, &mut bar)?
                    }
                    GraphFormat::Text => {
                        let mut d = graph::Digest::new(filtering);
                        let infos = graph::build(&traces, filter, &mut d, &mut bar)?;
                        let ctx = graph::TextContext {
                            command: self_command(),
                            traces: traces
                                .iter()
                                .map(|t| run::shell_quote(&t.to_string_lossy()))
                                .collect(),
                        };
                        sink_out.write_all(printable(&graph::render_text(&d, &ctx)).as_bytes())?;
                        infos
                    }
                })
            };
            let infos = match &output {
                Some(p) => ia::output::write_atomically(p, |w| emit(w))?,
                None => {
                    let mut w = std::io::BufWriter::new(std::io::stdout().lock());
                    let infos = emit(&mut w)?;
                    w.flush()?;
                    infos
                }
            };
            let t: Vec<_> = infos
                .iter()
                .map(|t| (t.file.clone(), t.truncated))
                .collect();
            Ok(exit_for(warn_truncated(&t)))
        }
        Cmd::Who { addr, traces, json } => {
            let a = who_address(&addr, &traces)?;
            let w = who::who(a, &traces, &mut bar)?;
            if json {
                print_json(&w)?;
            } else {
                print_text(&who::render_text(&w))?;
            }
            let t: Vec<_> = w
                .traces
                .iter()
                .map(|t| (t.file.clone(), t.truncated))
                .collect();
            Ok(exit_for(warn_truncated(&t)))
        }
        Cmd::Diff { base, new, json } => {
            let d = diff::diff(&base, &new, &mut bar)?;
            if json {
                print_json(&d)?;
            } else {
                print_text(&diff::render_text(&d))?;
            }
            let t = [
                (d.base.file.clone(), d.base.truncated),
                (d.new.file.clone(), d.new.truncated),
            ];
            Ok(exit_for(warn_truncated(&t)))
        }
        Cmd::Check {
            new,
            baseline,
            max_peak_growth,
            max_alloc_growth,
            no_new_leaks,
            no_violations,
            no_failures,
        } => {
            let pct = |name: &str, v: &str| {
                check::parse_percent(v).map_err(|e| anyhow::anyhow!("{name}: {e}"))
            };
            let t = check::Thresholds {
                max_peak_growth: Some(pct("--max-peak-growth", &max_peak_growth)?),
                max_alloc_growth: Some(pct("--max-alloc-growth", &max_alloc_growth)?),
                no_new_leaks,
                no_violations,
                no_failures,
            };
            let base = diff::profile(&baseline, &mut bar)?;
            let newp = diff::profile(&new, &mut bar)?;
            for (p, path) in [(&base, &baseline), (&newp, &new)] {
                if let Some(at) = p.truncated {
                    bail!(
                        "{}: at byte {at}: the file ends inside a record (truncated); a check needs whole traces",
                        path.display()
                    );
                }
            }
            let reasons = check::check(&base, &newp, &t);
            // Written, not `println!` (which panics on a closed pipe).
            if reasons.is_empty() {
                print_text(&format!(
                    "ok: {} is within the budget of {}\n",
                    newp.file, base.file
                ))?;
                Ok(ExitCode::SUCCESS)
            } else {
                let mut text = String::new();
                for r in &reasons {
                    text.push_str(r);
                    text.push('\n');
                }
                print_text(&text)?;
                Ok(ExitCode::from(1))
            }
        }
        Cmd::Report { traces, output } => {
            let r = report::render(&traces, &mut bar)?;
            ia::output::write_atomically(&output, |f| -> Result<()> {
                Ok(f.write_all(r.html.as_bytes())?)
            })?;
            // One line on success: where it went.
            eprintln!(
                "isolate: report written: {}",
                printable(&run::shell_quote(&output.to_string_lossy()))
            );
            let t: Vec<_> = r
                .traces
                .iter()
                .map(|t| (t.file.clone(), t.truncated_at))
                .collect();
            Ok(exit_for(warn_truncated(&t)))
        }
        Cmd::Export {
            format,
            traces,
            output,
            max_events,
        } => {
            if format == ExportFormat::MemoryViz && traces.len() != 1 {
                anyhow::bail!(
                    "export: --format memory-viz takes one trace (a snapshot is one process's), not {}: export each to its own file",
                    traces.len()
                );
            }
            if format == ExportFormat::Parquet {
                let (infos, stats) = export::parquet(&traces, &output, &mut bar)?;
                eprintln!("isolate: {}", printable(&stats.describe(&output)));
                let t: Vec<_> = infos
                    .iter()
                    .map(|t| (t.file.clone(), t.truncated_at))
                    .collect();
                return Ok(exit_for(warn_truncated(&t)));
            }
            // The Parquet tables are files of a directory, each written to a temporary file and
            // moved into place by `export::parquet` itself; every other format is one file.
            let infos = ia::output::write_atomically(&output, |f| -> Result<_> {
                Ok(match format {
                    ExportFormat::ChromeTrace => export::chrome_trace(&traces, f, &mut bar)?,
                    ExportFormat::MemoryViz => {
                        let (info, stats) =
                            export::memory_viz(&traces[0], f, max_events, &mut bar)?;
                        for l in stats.describe() {
                            eprintln!("isolate: {l}");
                        }
                        vec![info]
                    }
                    ExportFormat::Parquet => unreachable!("written above"),
                })
            })?;
            let t: Vec<_> = infos
                .iter()
                .map(|t| (t.file.clone(), t.truncated_at))
                .collect();
            Ok(exit_for(warn_truncated(&t)))
        }
    }
}

/// True when the error is standard output's reader having gone (`EPIPE`), however wrapped: an
/// `io::Error`, or the analyzer's or `isolate run`'s error holding one (they do not give it as
/// their `source()`, so anyhow's chain does not show it).
fn closed_pipe(e: &anyhow::Error) -> bool {
    let pipe = |io: &std::io::Error| io.kind() == std::io::ErrorKind::BrokenPipe;
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>().is_some_and(pipe)
            || c.downcast_ref::<ia::Error>()
                .is_some_and(|a| match &a.kind {
                    ia::ErrorKind::Io { source, .. } => pipe(source),
                    _ => false,
                })
            || c.downcast_ref::<run::Error>()
                .is_some_and(|r| matches!(r, run::Error::Io(io) if pipe(io)))
    })
}

fn main() -> ExitCode {
    match real_main() {
        Ok(c) => c,
        Err(e) => {
            // A closed pipe while `graph` streams its output (`isolate graph … | head -1`): the
            // reader has what it wanted, and the rest is not worked out. No message, exit
            // status 0 (docs/analyzer.md, exit codes).
            if closed_pipe(&e) {
                return ExitCode::SUCCESS;
            }
            eprintln!("isolate: {}", printable(&format!("{e:#}")));
            ExitCode::from(EXIT_ERROR)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    /// Every argument of every subcommand says what it is for in `--help`.
    #[test]
    fn every_argument_has_help() {
        fn walk(cmd: &clap::Command, path: &str, missing: &mut Vec<String>) {
            for a in cmd.get_arguments() {
                let id = a.get_id().as_str();
                if matches!(id, "help" | "version") {
                    continue;
                }
                let has = a
                    .get_help()
                    .or(a.get_long_help())
                    .is_some_and(|h| !h.to_string().trim().is_empty());
                if !has {
                    missing.push(format!("{path} {id}"));
                }
            }
            for sub in cmd.get_subcommands() {
                if sub.get_name() == "help" {
                    continue;
                }
                if sub.get_about().is_none() {
                    missing.push(format!("{path} {} (the subcommand)", sub.get_name()));
                }
                walk(sub, &format!("{path} {}", sub.get_name()), missing);
            }
        }
        let cmd = Cli::command();
        cmd.clone().debug_assert();
        let mut missing = Vec::new();
        walk(&cmd, "isolate", &mut missing);
        assert!(missing.is_empty(), "no help text: {missing:?}");
        // Every subcommand is there (a new one is walked too, but this says the walk saw them).
        let names: Vec<&str> = cmd.get_subcommands().map(|s| s.get_name()).collect();
        for n in [
            "run", "summary", "graph", "who", "diff", "check", "report", "export",
        ] {
            assert!(names.contains(&n), "{n} missing from {names:?}");
        }
    }

    /// `run --help` says what the default mode is, and what each mode does.
    #[test]
    fn run_help_shows_the_default_mode() {
        let mut cmd = Cli::command();
        let run = cmd.find_subcommand_mut("run").unwrap();
        let help = run.render_long_help().to_string();
        assert!(help.contains("[default: log"), "{help}");
        assert!(
            help.contains("isolate: also hold freed memory back"),
            "{help}"
        );
        assert!(help.contains("--error-exitcode <N>"), "{help}");
    }

    #[test]
    fn graph_format_from_the_output_name() {
        let f = |o: Option<&str>| graph_format(None, o.map(Path::new));
        assert!(f(None) == GraphFormat::Text);
        assert!(f(Some("g.json")) == GraphFormat::Json);
        assert!(f(Some("g.DOT")) == GraphFormat::Dot);
        assert!(f(Some("g.gv")) == GraphFormat::Dot);
        assert!(f(Some("g.txt")) == GraphFormat::Text);
        assert!(
            graph_format(Some(GraphFormat::Json), Some(Path::new("g.dot"))) == GraphFormat::Json
        );
    }
}
