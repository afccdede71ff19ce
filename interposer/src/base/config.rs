//! Settings, read once from the environment before `main`.
//!
//! A malformed value stops the program with one line naming the variable, the value and what is
//! accepted, and exit status 2: a debugging tool that silently records nothing is worse than one
//! that refuses to start.
//!
//! Layer: base. Uses nothing of this crate.

use std::sync::OnceLock;

// The parser is shared with `isolate run` (which checks the settings before it starts a
// command): it lives in the trace crate, pure, and is used here on the environment's snapshot.
pub use isolate_trace::config::*;

static CONFIG: OnceLock<Config> = OnceLock::new();
/// The settings of a copy of the library that stands down: mode `off`.
static OFF: OnceLock<Config> = OnceLock::new();
static STOOD_DOWN: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// From now on this copy of the library is `ISOLATE_MODE=off`: another copy, first in the
/// process's symbol order, records this process.
pub fn stand_down() {
    STOOD_DOWN.store(true, std::sync::atomic::Ordering::Relaxed);
    // Read the environment now, from the constructor, as the copy that records does.
    get();
}

/// The settings; parsed on first use (normally from the constructor, before `main`, before
/// the program has threads: the environment is read then, once, and never again, since a
/// `getenv` racing another thread's `setenv` can crash).
pub fn get() -> &'static Config {
    if STOOD_DOWN.load(std::sync::atomic::Ordering::Relaxed) {
        return OFF.get_or_init(|| {
            let env = snapshot();
            if env.secure {
                return secure_config();
            }
            let var = |k: &str| match k {
                "ISOLATE_MODE" => Some("off".to_string()),
                _ => env.var(k),
            };
            env.check()
                .and_then(|()| from_env(var, env.names()))
                .unwrap_or_else(|msg| die(&msg))
        });
    }
    CONFIG.get_or_init(|| {
        let env = snapshot();
        if env.secure {
            return secure_config();
        }
        match env
            .check()
            .and_then(|()| from_env(|k| env.var(k), env.names()))
        {
            Ok(c) => c,
            Err(msg) => die(&msg),
        }
    })
}

/// The part of the environment the library reads, copied once as bytes (never
/// `std::env::vars`, which panics on a variable that is not UTF-8, and a panic in the
/// constructor aborts the process).
struct Env {
    vars: Vec<(std::ffi::OsString, std::ffi::OsString)>,
    /// The process runs with `AT_SECURE` (set-user-ID, set-group-ID, file capabilities), or the
    /// test hook `ISOLATE_TEST_SECURE=1` says to behave as if.
    secure: bool,
}

/// Variables other than `ISOLATE_*` that the library reads (recorded in the header).
const OTHERS: [&str; 6] = [
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "PYTORCH_NO_CUDA_MEMORY_CACHING",
    "PYTORCH_CUDA_ALLOC_CONF",
    "PYTORCH_ALLOC_CONF",
];

fn snapshot() -> Env {
    use std::os::unix::ffi::OsStrExt;
    let vars: Vec<_> = std::env::vars_os()
        .filter(|(k, _)| {
            k.as_bytes().starts_with(b"ISOLATE_")
                || OTHERS.iter().any(|o| k.as_bytes() == o.as_bytes())
        })
        .collect();
    let test_secure = vars
        .iter()
        .any(|(k, v)| k == "ISOLATE_TEST_SECURE" && v == "1");
    // SAFETY: getauxval only reads the auxiliary vector the kernel gave the process.
    let at_secure = unsafe { libc::getauxval(libc::AT_SECURE) } != 0;
    Env {
        vars,
        secure: at_secure || test_secure,
    }
}

impl Env {
    /// A variable's value, when it is set and UTF-8.
    fn var(&self, name: &str) -> Option<String> {
        let (_, v) = self.vars.iter().find(|(k, _)| k == name)?;
        v.to_str().map(str::to_owned)
    }

    /// Every name, as text (a name that is not UTF-8 lossily: it is only ever refused).
    fn names(&self) -> impl Iterator<Item = String> + '_ {
        self.vars
            .iter()
            .map(|(k, _)| k.to_string_lossy().into_owned())
    }

    /// A setting of the library's whose value is not UTF-8 is refused, by name.
    fn check(&self) -> Result<(), String> {
        isolate_trace::config::check_utf8(
            self.vars
                .iter()
                .map(|(k, v)| (k.as_os_str(), v.as_os_str())),
        )
    }
}

/// Under `AT_SECURE` the environment belongs to whoever started the program, who is not whom
/// it runs as: the library stands down (mode `off`, no trace, no message, no exit on a bad
/// value) without reading a single setting. Not "ignore the settings and use the defaults":
/// the default trace path is relative to the caller's working directory, so the caller would
/// still choose where a privileged process creates a file holding its command line.
fn secure_config() -> Config {
    let mut c = from_env(
        |k| (k == "ISOLATE_MODE").then(|| "off".to_string()),
        std::iter::empty(),
    )
    .expect("the defaults are valid");
    c.secure = true;
    c
}

fn die(msg: &str) -> ! {
    let line = format!("isolate: {msg}\n");
    // SAFETY: `line` is a live String: the pointer and length describe its bytes for the whole
    // call, and `write` only reads them (fd 2 closed or full just makes it fail, ignored here).
    unsafe {
        libc::write(2, line.as_ptr().cast(), line.len());
    }
    // Not `_exit` nor `syscall()`: those names are our own hooks, which would close a trace
    // first (and read these settings again, from inside their own initialisation: a hang).
    crate::base::sys::exit_group_now(2)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secure_reads_nothing() {
        let c = secure_config();
        assert!(c.secure);
        assert_eq!(c.mode, Mode::Off);
        assert_eq!(c.trace, "isolate-%p.trace");
    }
}
