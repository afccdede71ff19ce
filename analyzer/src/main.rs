//! `isolate`: run a program under `libisolate.so` and analyse the traces it leaves.
//!
//! A thin layer over the `isolate_analyzer` library: argument parsing, output files, exit codes
//! and the progress bar live here; every analysis lives in the library.

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand, ValueEnum};
use isolate_analyzer::{
    self as ia, Progress, check, diff, export, graph, report, run, summary, util, who,
};
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
#[command(name = "isolate", version, about = "Find use-after-free and aliasing bugs in CUDA programs", long_about = None)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run a command with libisolate.so preloaded (it must lie beside this executable).
    Run {
        /// ISOLATE_MODE: log, isolate or off.
        #[arg(long, value_parser = ["log", "isolate", "off"])]
        mode: Option<String>,
        /// ISOLATE_TRACE: where the trace goes (a pattern the library expands).
        #[arg(long, value_name = "PATTERN")]
        trace: Option<String>,
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
        #[arg(long)]
        json: bool,
        #[arg(required = true, value_name = "TRACE")]
        traces: Vec<PathBuf>,
    },
    /// The aliasing graph: allocations, reuse edges, VMM mappings, anomalies.
    Graph {
        #[arg(long, value_enum, default_value = "json")]
        format: GraphFormat,
        #[arg(required = true, value_name = "TRACE")]
        traces: Vec<PathBuf>,
        /// Write here instead of standard output.
        #[arg(short, long, value_name = "FILE")]
        output: Option<PathBuf>,
        /// Keep only the nodes that covered this address (0x… or decimal).
        #[arg(long, value_name = "ADDR")]
        address: Option<String>,
        /// Keep only the nodes of this size class (sizes rounded up to a power of two).
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
        /// The address (0x… or decimal).
        addr: String,
        #[arg(required = true, value_name = "TRACE")]
        traces: Vec<PathBuf>,
        #[arg(long)]
        json: bool,
    },
    /// Compare two runs, addresses aside.
    Diff {
        base: PathBuf,
        new: PathBuf,
        #[arg(long)]
        json: bool,
    },
    /// Exit 0 when NEW stays within BASE's budget, 1 (with one reason a line) when it does not.
    Check {
        new: PathBuf,
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
        #[arg(required = true, value_name = "TRACE")]
        traces: Vec<PathBuf>,
        #[arg(short, long, value_name = "FILE")]
        output: PathBuf,
    },
    /// The timeline for Perfetto / chrome://tracing.
    Export {
        #[arg(long, value_enum)]
        format: ExportFormat,
        #[arg(required = true, value_name = "TRACE")]
        traces: Vec<PathBuf>,
        #[arg(short, long, value_name = "FILE")]
        output: PathBuf,
    },
}

#[derive(Clone, Copy, ValueEnum)]
enum GraphFormat {
    Json,
    Dot,
}

#[derive(Clone, Copy, ValueEnum)]
enum ExportFormat {
    ChromeTrace,
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

fn out_file(path: &Path) -> Result<std::io::BufWriter<std::fs::File>> {
    let f =
        std::fs::File::create(path).with_context(|| format!("cannot create {}", path.display()))?;
    Ok(std::io::BufWriter::with_capacity(1 << 16, f))
}

fn print_json<T: serde::Serialize>(v: &T) -> Result<()> {
    let mut s = serde_json::to_string_pretty(v)?;
    s.push('\n');
    std::io::stdout().lock().write_all(s.as_bytes())?;
    Ok(())
}

fn print_text(s: &str) -> Result<()> {
    std::io::stdout()
        .lock()
        .write_all(printable(s).as_bytes())?;
    Ok(())
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

fn real_main() -> Result<ExitCode> {
    let cli = Cli::parse();
    let mut bar = Bar::new();
    match cli.cmd {
        Cmd::Run {
            mode,
            trace,
            command,
        } => {
            let exe = std::env::current_exe().context("cannot find the isolate executable")?;
            let library = run::library_beside(&exe)?;
            let code = run::run(&run::RunOptions {
                library,
                mode,
                trace,
                command,
            })?;
            Ok(ExitCode::from(code.clamp(0, 255) as u8))
        }
        Cmd::Summary { json, traces } => {
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
            Ok(exit_for(warn_truncated(&t)))
        }
        Cmd::Graph {
            format,
            traces,
            output,
            address,
            size_class,
            from,
            to,
        } => {
            let filter = graph::Filter {
                address: address.as_deref().map(util::parse_u64).transpose()?,
                size_class: size_class.as_deref().map(util::parse_size).transpose()?,
                from_ns: from.as_deref().map(util::parse_u64).transpose()?,
                to_ns: to.as_deref().map(util::parse_u64).transpose()?,
            };
            if let (Some(f), Some(t)) = (filter.from_ns, filter.to_ns)
                && f > t
            {
                bail!("--from {f} is after --to {t}");
            }
            let mut sink_out: Box<dyn Write> = match &output {
                Some(p) => Box::new(out_file(p)?),
                None => Box::new(std::io::BufWriter::new(std::io::stdout().lock())),
            };
            let infos = match format {
                GraphFormat::Json => {
                    let mut s = graph::JsonSink::new(&mut sink_out);
                    graph::build(&traces, filter, &mut s, &mut bar)?
                }
                GraphFormat::Dot => {
                    let mut s = graph::DotSink::new(&mut sink_out);
                    graph::build(&traces, filter, &mut s, &mut bar)?
                }
            };
            sink_out.flush()?;
            let t: Vec<_> = infos
                .iter()
                .map(|t| (t.file.clone(), t.truncated))
                .collect();
            Ok(exit_for(warn_truncated(&t)))
        }
        Cmd::Who { addr, traces, json } => {
            let a = util::parse_u64(&addr)?;
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
            let t = check::Thresholds {
                max_peak_growth: Some(check::parse_percent(&max_peak_growth)?),
                max_alloc_growth: Some(check::parse_percent(&max_alloc_growth)?),
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
            if reasons.is_empty() {
                println!("ok: {} is within the budget of {}", newp.file, base.file);
                Ok(ExitCode::SUCCESS)
            } else {
                for r in &reasons {
                    println!("{}", printable(r));
                }
                Ok(ExitCode::from(1))
            }
        }
        Cmd::Report { traces, output } => {
            let r = report::render(&traces, &mut bar)?;
            let mut f = out_file(&output)?;
            f.write_all(r.html.as_bytes())
                .and_then(|_| f.flush())
                .with_context(|| format!("cannot write {}", output.display()))?;
            let t: Vec<_> = r
                .traces
                .iter()
                .map(|t| (t.file.clone(), t.truncated_at))
                .collect();
            Ok(exit_for(warn_truncated(&t)))
        }
        Cmd::Export {
            format: ExportFormat::ChromeTrace,
            traces,
            output,
        } => {
            let mut f = out_file(&output)?;
            let infos = export::chrome_trace(&traces, &mut f, &mut bar)?;
            let t: Vec<_> = infos
                .iter()
                .map(|t| (t.file.clone(), t.truncated_at))
                .collect();
            Ok(exit_for(warn_truncated(&t)))
        }
    }
}

fn main() -> ExitCode {
    match real_main() {
        Ok(c) => c,
        Err(e) => {
            // A closed pipe (`isolate summary … | head`) is not an error worth a message.
            if e.chain().any(|c| {
                c.downcast_ref::<std::io::Error>()
                    .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
            }) {
                return ExitCode::SUCCESS;
            }
            eprintln!("isolate: {}", printable(&format!("{e:#}")));
            ExitCode::from(EXIT_ERROR)
        }
    }
}
