//! `isolate run -- CMD` and signals (issue 18): the command gets the signals `isolate` gets, once,
//! and `isolate` ends as the command ended (its exit status, or killed by its signal).
//!
//! Every test runs `tests/programs/sigchild.c` twice: directly, which says what a command does on
//! its own, then under `isolate run`, which must look the same from outside. No sleeps: the test
//! waits for files the program writes (`ready`, its `log` of the signals it got, each with the
//! sender's pid and `si_code`). To see that a signal was passed on exactly once, the test then
//! sends SIGUSR1, which ends the program: SIGUSR1 is passed on after any signal `isolate` got
//! before it, and the program takes two pending signals lowest number first, so anything sent
//! twice is in the log before SIGUSR1's line.

use isolate_tests::{Pty, pty};
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

const TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Clone, Copy, Debug, PartialEq)]
enum Via {
    /// `sigchild DIR …`
    Direct,
    /// `isolate run -- sigchild DIR …`
    Isolate,
}

const BOTH: [Via; 2] = [Via::Direct, Via::Isolate];

/// A line of the program's log: the signal, `si_pid`, `si_code`.
type Line = (i32, i32, i32);

/// What to set up in the started process (`isolate` or the program) before it runs.
#[derive(Clone, Copy, Default)]
struct Setup {
    /// A new session with this terminal (the slave of a pty) as stdin and controlling terminal.
    tty: Option<libc::c_int>,
    /// SIGCHLD and SIGINT ignored, SIGUSR2 blocked (a background job of a shell script, say).
    odd_signals: bool,
    /// The core file limit raised to the hard limit.
    cores: bool,
}

/// A started run.
struct Proc {
    via: Via,
    child: Child,
    dir: tempfile::TempDir,
    started: Instant,
}

fn start(via: Via, args: &[&str], setup: Setup) -> Proc {
    let dir = tempfile::Builder::new()
        .prefix("isolate-run-")
        .tempdir()
        .expect("temporary directory");
    let prog = isolate_tests::program_path("sigchild");
    let mut cmd = match via {
        Via::Direct => Command::new(&prog),
        Via::Isolate => {
            let mut c = Command::new(isolate_tests::analyzer_path());
            c.arg("run").arg("--").arg(&prog);
            c
        }
    };
    cmd.arg(dir.path()).args(args).current_dir(dir.path());
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy();
        if k.starts_with("ISOLATE_") || k.starts_with("LD_") {
            cmd.env_remove(k.as_ref());
        }
    }
    let stderr = File::create(dir.path().join("stderr")).unwrap();
    cmd.stdout(Stdio::null()).stderr(stderr);
    match setup.tty {
        Some(fd) => {
            // SAFETY: the caller keeps fd open; Stdio gets a copy (close-on-exec here).
            let copy = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) }
                .try_clone_to_owned()
                .expect("dup");
            cmd.stdin(Stdio::from(copy));
        }
        None => {
            cmd.stdin(Stdio::null());
            // Its own group: the watchdog takes the command too, and the command's signals to its
            // group stay in it.
            cmd.process_group(0);
        }
    }
    let tty = setup.tty.is_some();
    // SAFETY: async-signal-safe calls only, between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            if tty {
                // stdin is the terminal by now.
                isolate_tests::take_stdin_as_controlling_terminal()?;
            }
            let mut core: libc::rlimit = std::mem::zeroed();
            libc::getrlimit(libc::RLIMIT_CORE, &mut core);
            core.rlim_cur = if setup.cores { core.rlim_max } else { 0 };
            libc::setrlimit(libc::RLIMIT_CORE, &core);
            if setup.odd_signals {
                libc::signal(libc::SIGCHLD, libc::SIG_IGN);
                libc::signal(libc::SIGINT, libc::SIG_IGN);
                let mut set: libc::sigset_t = std::mem::zeroed();
                libc::sigemptyset(&mut set);
                libc::sigaddset(&mut set, libc::SIGUSR2);
                libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
            }
            Ok(())
        });
    }
    let child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"));
    Proc {
        via,
        child,
        dir,
        started: Instant::now(),
    }
}

impl Proc {
    fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    fn path(&self, name: &str) -> std::path::PathBuf {
        self.dir.path().join(name)
    }

    fn describe(&self) -> String {
        format!(
            "{:?} (pid {}), stderr: {:?}, log: {:?}",
            self.via,
            self.pid(),
            std::fs::read_to_string(self.path("stderr")).unwrap_or_default(),
            std::fs::read_to_string(self.path("log")).unwrap_or_default()
        )
    }

    fn watchdog(&mut self, what: &str) {
        if self.started.elapsed() > TIMEOUT {
            // SAFETY: no preconditions. The group (or session) leader is the started process.
            unsafe { libc::kill(-self.pid(), libc::SIGKILL) };
            let _ = self.child.kill();
            let _ = self.child.wait();
            panic!("{}: watchdog: no {what} after {TIMEOUT:?}", self.describe());
        }
    }

    /// Waits until `pred` holds of the file `name` (which may not exist yet).
    fn wait_file(&mut self, name: &str, pred: impl Fn(&str) -> bool) -> String {
        loop {
            if let Ok(text) = std::fs::read_to_string(self.path(name))
                && pred(&text)
            {
                return text;
            }
            if let Ok(Some(st)) = self.child.try_wait() {
                panic!("{}: ended ({st}) before {name} was there", self.describe());
            }
            self.watchdog(name);
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// Waits for the program to be ready for signals; returns its pid.
    fn ready(&mut self) -> i32 {
        let text = self.wait_file("ready", |_| true);
        text.trim().parse().expect("pid in ready")
    }

    /// Waits until the log has a line for `sig`.
    fn wait_logged(&mut self, sig: i32) {
        self.wait_file("log", |t| parse_log(t).iter().any(|l| l.0 == sig));
    }

    fn log(&self) -> Vec<Line> {
        parse_log(&std::fs::read_to_string(self.path("log")).unwrap_or_default())
    }

    /// Sends `sig` to the started process (`isolate`, or the program itself).
    fn signal(&self, sig: i32) {
        // SAFETY: no preconditions; the process is not reaped before `wait`.
        assert_eq!(unsafe { libc::kill(self.pid(), sig) }, 0);
    }

    /// The pid that signals sent with [`Proc::signal`] reach the program from.
    fn sender(&self) -> i32 {
        match self.via {
            Via::Direct => std::process::id() as i32,
            Via::Isolate => self.pid(),
        }
    }

    fn wait(&mut self) -> ExitStatus {
        loop {
            if let Some(st) = self.child.try_wait().expect("wait") {
                return st;
            }
            self.watchdog("end");
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

fn parse_log(text: &str) -> Vec<Line> {
    text.lines()
        .map(|l| {
            let v: Vec<i32> = l
                .split(' ')
                .map(|w| w.parse().expect("log number"))
                .collect();
            (v[0], v[1], v[2])
        })
        .collect()
}

fn is_gone(pid: i32) -> bool {
    // SAFETY: signal 0 only checks.
    unsafe { libc::kill(pid, 0) == -1 && *libc::__errno_location() == libc::ESRCH }
}

/// `sig` sent to the started process: the program at its default action dies of it (and under
/// `isolate`, `isolate` dies of it too, after the program: nothing is left running); the program
/// that logs it gets it once, from the process that sent it (or from `isolate`).
fn check_sent(sig: i32) {
    for via in BOTH {
        let mut p = start(via, &["wait"], Setup::default());
        let pid = p.ready();
        p.signal(sig);
        let st = p.wait();
        assert_eq!(st.signal(), Some(sig), "{}: {st}", p.describe());
        assert!(!st.core_dumped(), "{}: {st}", p.describe());
        assert!(
            is_gone(pid),
            "{via:?}: the program (pid {pid}) is still there"
        );

        let mut p = start(via, &["log"], Setup::default());
        p.ready();
        p.signal(sig);
        p.wait_logged(sig);
        p.signal(libc::SIGUSR1);
        let st = p.wait();
        assert_eq!(st.code(), Some(7), "{}: {st}", p.describe());
        let from = p.sender();
        assert_eq!(
            p.log(),
            [
                (sig, from, libc::SI_USER),
                (libc::SIGUSR1, from, libc::SI_USER)
            ],
            "{}",
            p.describe()
        );
    }
}

#[test]
fn sigterm_is_passed_on_and_isolate_dies_of_it() {
    check_sent(libc::SIGTERM);
}

#[test]
fn sigint_is_passed_on_and_isolate_dies_of_it() {
    check_sent(libc::SIGINT);
}

#[test]
fn sighup_is_passed_on_and_isolate_dies_of_it() {
    check_sent(libc::SIGHUP);
}

#[test]
fn sigquit_and_sigusr2_are_passed_on() {
    check_sent(libc::SIGQUIT);
    check_sent(libc::SIGUSR2);
}

#[test]
fn exit_status_is_the_commands() {
    for code in ["0", "3", "255"] {
        for via in BOTH {
            let mut p = start(via, &["exit", code], Setup::default());
            let st = p.wait();
            assert_eq!(st.code(), Some(code.parse().unwrap()), "{}", p.describe());
        }
    }
}

#[test]
fn killed_by_the_same_signal_and_no_core_file() {
    let cases: [(&[&str], i32); 4] = [
        (&["raise", "9"], libc::SIGKILL),
        (&["segv"], libc::SIGSEGV),
        (&["raise", "6"], libc::SIGABRT),
        (&["raise", "15"], libc::SIGTERM),
    ];
    for (args, sig) in cases {
        for via in BOTH {
            // The program turns its own core file off; isolate must not write one either.
            let setup = Setup {
                cores: true,
                ..Setup::default()
            };
            let mut p = start(via, args, setup);
            let st = p.wait();
            assert_eq!(st.signal(), Some(sig), "{args:?}: {}: {st}", p.describe());
            assert!(!st.core_dumped(), "{args:?}: {}: {st}", p.describe());
        }
    }
}

#[test]
fn a_signal_the_command_sends_its_own_group_is_not_sent_back() {
    for via in BOTH {
        let mut p = start(via, &["group"], Setup::default());
        let pid = p.ready();
        p.signal(libc::SIGUSR1);
        assert_eq!(p.wait().code(), Some(7), "{}", p.describe());
        assert_eq!(
            p.log(),
            [
                (libc::SIGHUP, pid, libc::SI_USER),
                (libc::SIGUSR1, p.sender(), libc::SI_USER)
            ],
            "{}",
            p.describe()
        );
    }
}

#[test]
fn the_command_starts_with_the_signal_state_isolate_was_given() {
    let mut seen = Vec::new();
    for via in BOTH {
        let setup = Setup {
            odd_signals: true,
            ..Setup::default()
        };
        let mut p = start(via, &["status"], setup);
        assert_eq!(p.wait().code(), Some(0), "{}", p.describe());
        seen.push(std::fs::read_to_string(p.path("status")).unwrap());
        // With SIGCHLD ignored, isolate still sees how the command ended.
        let mut p = start(via, &["exit", "3"], setup);
        assert_eq!(p.wait().code(), Some(3), "{}", p.describe());
    }
    assert_eq!(
        seen[0], seen[1],
        "SigBlk and SigIgn: directly, then under isolate"
    );
    let mask = |name: &str| {
        let line = seen[0].lines().find(|l| l.starts_with(name)).unwrap();
        u64::from_str_radix(line.split_whitespace().nth(1).unwrap(), 16).unwrap()
    };
    let bit = |sig: i32| 1u64 << (sig - 1);
    assert_eq!(mask("SigBlk:"), bit(libc::SIGUSR2), "{seen:?}");
    assert_eq!(
        mask("SigIgn:") & (bit(libc::SIGCHLD) | bit(libc::SIGINT)),
        bit(libc::SIGCHLD) | bit(libc::SIGINT),
        "{seen:?}"
    );
}

/// Starts the program (or isolate) as the leader of a new session whose controlling terminal is
/// a pty, as a terminal's shell would run it in the foreground.
fn start_on_a_terminal(via: Via, args: &[&str]) -> (Proc, Pty) {
    let pty = pty();
    let setup = Setup {
        tty: Some(pty.slave.as_raw_fd()),
        ..Setup::default()
    };
    let p = start(via, args, setup);
    (p, pty)
}

#[test]
fn terminal_ctrl_c_and_ctrl_backslash_reach_the_command_once() {
    use std::io::Write;
    for via in BOTH {
        let (mut p, mut pty) = start_on_a_terminal(via, &["log"]);
        p.ready();
        // The terminal sends SIGINT, then SIGQUIT, to its foreground process group, which holds
        // isolate and the command: the command must not get it a second time from isolate.
        pty.master.write_all(b"\x03").unwrap();
        p.wait_logged(libc::SIGINT);
        pty.master.write_all(b"\x1c").unwrap();
        p.wait_logged(libc::SIGQUIT);
        p.signal(libc::SIGUSR1);
        assert_eq!(p.wait().code(), Some(7), "{}", p.describe());
        assert_eq!(
            p.log(),
            [
                (libc::SIGINT, 0, libc::SI_KERNEL),
                (libc::SIGQUIT, 0, libc::SI_KERNEL),
                (libc::SIGUSR1, p.sender(), libc::SI_USER)
            ],
            "{}",
            p.describe()
        );
    }
}

#[test]
fn terminal_ctrl_c_ends_both() {
    use std::io::Write;
    for via in BOTH {
        let (mut p, mut pty) = start_on_a_terminal(via, &["wait"]);
        let pid = p.ready();
        pty.master.write_all(b"\x03").unwrap();
        let st = p.wait();
        assert_eq!(st.signal(), Some(libc::SIGINT), "{}: {st}", p.describe());
        assert!(
            is_gone(pid),
            "{via:?}: the program (pid {pid}) is still there"
        );
    }
}

#[test]
fn terminal_hangup_reaches_the_command_once() {
    for via in BOTH {
        let (mut p, pty) = start_on_a_terminal(via, &["log"]);
        p.ready();
        // Closing the master hangs the terminal up: the kernel sends SIGHUP to the session
        // leader alone (the program, or isolate, which passes it on).
        drop(pty);
        p.wait_logged(libc::SIGHUP);
        p.signal(libc::SIGUSR1);
        assert_eq!(p.wait().code(), Some(7), "{}", p.describe());
        let hup = match via {
            Via::Direct => (libc::SIGHUP, 0, libc::SI_KERNEL),
            Via::Isolate => (libc::SIGHUP, p.pid(), libc::SI_USER),
        };
        assert_eq!(
            p.log(),
            [hup, (libc::SIGUSR1, p.sender(), libc::SI_USER)],
            "{}",
            p.describe()
        );
    }
}
