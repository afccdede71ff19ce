//! The shared vocabulary of settings: every `ISOLATE_*` environment variable of the project in
//! one list, each marked with who reads it, and the one grammar of sizes that the library, the
//! analyzer and the Python package accept (`python/src/cuda_isolate/__init__.py` ports
//! [`parse_size`]; both are tested on the same cases).
//!
//! The library refuses an `ISOLATE_*` variable that is not in [`SETTINGS`] (a typo) and leaves
//! alone every one that is not its own ([`Owner::Analyzer`], [`Owner::Tooling`]): a variable
//! meant for the analyzer (`ISOLATE_SYSROOT`) must not stop a program run under the library.

/// Who reads a setting.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Owner {
    /// `libisolate.so`, from the environment of the program it is loaded into.
    Library,
    /// `libisolate.so`, internal test hooks (`ISOLATE_TEST_*`): not for users.
    LibraryTest,
    /// The `isolate` analyzer (and CLI).
    Analyzer,
    /// The project's own test harnesses and scripts (never the library or the analyzer).
    Tooling,
}

/// One environment variable.
#[derive(Clone, Copy, Debug)]
pub struct Setting {
    pub name: &'static str,
    pub owner: Owner,
    /// What is accepted, as error messages quote it.
    pub accepted: &'static str,
}

impl Setting {
    /// True for the settings the library reads (its own and its test hooks).
    pub fn library(&self) -> bool {
        matches!(self.owner, Owner::Library | Owner::LibraryTest)
    }
}

const fn s(name: &'static str, owner: Owner, accepted: &'static str) -> Setting {
    Setting {
        name,
        owner,
        accepted,
    }
}

use Owner::*;

/// Every `ISOLATE_*` variable of the project. Adding one: see "Adding a setting" in
/// `docs/design.md`.
pub const SETTINGS: &[Setting] = &[
    s("ISOLATE_MODE", Library, "log, isolate, off"),
    s(
        "ISOLATE_TRACE",
        Library,
        "a file path; %p = pid, %r = rank, %h = host name, %% = %",
    ),
    s("ISOLATE_POISON", Library, "a byte (0xFF, 255) or off"),
    s(
        "ISOLATE_QUARANTINE",
        Library,
        "a size (8GiB, 512MiB, 1.5G, 1000000) or a share of device memory (25%)",
    ),
    s(
        "ISOLATE_RESERVE",
        Library,
        "auto, a size (1GiB, 0) or a share of device memory (5%)",
    ),
    s("ISOLATE_GUARD", Library, "on, off"),
    s("ISOLATE_GUARD_MIN_SIZE", Library, "a size (0, 64KiB, 2MiB)"),
    s(
        "ISOLATE_GUARD_SIDE",
        Library,
        "end (catch overflows), start (catch underflows)",
    ),
    s("ISOLATE_CHECK_LAUNCH", Library, "on, off"),
    s("ISOLATE_STACKS", Library, "all, native, python, none"),
    s(
        "ISOLATE_STACK_DEPTH",
        Library,
        "a number of frames from 1 to 256",
    ),
    s(
        "ISOLATE_NATIVE_FRAMES",
        Library,
        "a number of frames from 1 to 256, or all",
    ),
    s("ISOLATE_REUSE", Library, "on, off"),
    s(
        "ISOLATE_TENANTS",
        Library,
        "share (isolate-mode processes on one device split a percentage budget), alone",
    ),
    s("ISOLATE_CHECK", Library, "full, fast"),
    s("ISOLATE_PROFILE", Library, "on, off"),
    s("ISOLATE_TEST_PANIC", LibraryTest, "1 (internal test hook)"),
    s("ISOLATE_TEST_RELEASE", LibraryTest, "async, sync"),
    s("ISOLATE_TEST_POISON_BY", LibraryTest, "memset, kernel"),
    s("ISOLATE_TEST_POISON_BATCH", LibraryTest, "on, off"),
    s("ISOLATE_TEST_ORDER", LibraryTest, "on, off"),
    s(
        "ISOLATE_TEST_WRITER_STALL_MS",
        LibraryTest,
        "milliseconds (internal test hook)",
    ),
    s(
        "ISOLATE_TEST_EXIT_CHECK_MS",
        LibraryTest,
        "milliseconds (internal test hook)",
    ),
    s(
        "ISOLATE_TEST_SECURE",
        LibraryTest,
        "1: behave as in a set-user-ID program (internal test hook)",
    ),
    s(
        "ISOLATE_SYSROOT",
        Analyzer,
        "directories separated by : where copies of the traced program's libraries are",
    ),
    s(
        "ISOLATE_FUZZ_SECS",
        Tooling,
        "seconds (trace/tests/fuzz.rs)",
    ),
    s(
        "ISOLATE_FUZZ_SEED",
        Tooling,
        "a number (trace/tests/fuzz.rs)",
    ),
    s(
        "ISOLATE_CHROMIUM",
        Tooling,
        "a browser (analyzer/tests/browser.rs)",
    ),
    s(
        "ISOLATE_REPORT_SHOTS",
        Tooling,
        "a directory (analyzer/tests/browser.rs)",
    ),
    s(
        "ISOLATE_MEMORY_BIN",
        Tooling,
        "an isolate binary (analyzer/tests/memory.rs)",
    ),
    s("ISOLATE_LIB", Tooling, "libisolate.so (tests/gpu)"),
    s("ISOLATE_CLI", Tooling, "the isolate binary (tests/gpu)"),
    s("ISOLATE_LIB_PATH", Tooling, "libisolate.so (tests/gpu)"),
    s(
        "ISOLATE_CLI_PATH",
        Tooling,
        "the isolate binary (tests/gpu)",
    ),
];

/// The setting called `name`, if there is one.
pub fn setting(name: &str) -> Option<&'static Setting> {
    SETTINGS.iter().find(|s| s.name == name)
}

/// Bytes in a size, in the one grammar every part of the project accepts:
///
/// - a whole number (`4096`), a decimal (`1.5`: digits on both sides of the point), or `0x`
///   hex (`0x1000`, no unit);
/// - then, after optional spaces, an optional unit, any case: `B`; `K`, `Ki`, `KiB` (1024),
///   `M`/`Mi`/`MiB`, `G`/`Gi`/`GiB`, `T`/`Ti`/`TiB` (powers of 1024); `KB`, `MB`, `GB`, `TB`
///   (powers of 1000, as a disk is sold);
/// - a fraction of a byte is dropped (`0.1K` = 102); more than `u64::MAX` bytes is refused.
///
/// Computed in whole numbers (no floating point), so every reader gets the same bytes.
///
/// ```
/// use isolate_trace::parse_size;
/// assert_eq!(parse_size("2MB"), Ok(2_000_000));
/// assert_eq!(parse_size("2M"), Ok(2 << 20));
/// assert_eq!(parse_size("1.5 GiB"), Ok(3 << 29));
/// assert!(parse_size("12 parsecs").is_err());
/// ```
pub fn parse_size(text: &str) -> Result<u64, String> {
    let bad = |why: &str| format!("{text:?} is not a size ({why}; e.g. 4096, 64KiB, 1.5G, 2MB)");
    let t = text.trim();
    if let Some(hex) = t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        if hex.is_empty() || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(bad("bad hex number"));
        }
        return u64::from_str_radix(hex, 16).map_err(|_| bad("too large"));
    }
    let num_end = t
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(num_end);
    let (whole, frac) = match num.split_once('.') {
        Some((w, f)) => (w, f),
        None => (num, ""),
    };
    if whole.is_empty() || (num.contains('.') && frac.is_empty()) || frac.contains('.') {
        return Err(bad("no number"));
    }
    let mult: u64 = match unit.trim_start().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "ki" | "kib" => 1 << 10,
        "m" | "mi" | "mib" => 1 << 20,
        "g" | "gi" | "gib" => 1 << 30,
        "t" | "ti" | "tib" => 1 << 40,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        _ => return Err(bad("unknown unit")),
    };
    let too_large = || bad("too large");
    let w: u128 = whole.parse().map_err(|_| too_large())?;
    let mut bytes = w.checked_mul(u128::from(mult)).ok_or_else(too_large)?;
    // The fraction times the unit, rounded down, exactly: Horner's rule from the last digit
    // (flooring at each step rounds the same as flooring once).
    let mut carry: u128 = 0;
    for d in frac.bytes().rev() {
        carry = (u128::from(d - b'0') * u128::from(mult) + carry) / 10;
    }
    bytes += carry;
    u64::try_from(bytes).map_err(|_| too_large())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `size-cases.txt`: the cases the Python port is checked on too
    /// (`tests/tests/sizes.rs`).
    fn size_cases() -> impl Iterator<Item = (&'static str, Option<u64>)> {
        include_str!("size-cases.txt")
            .lines()
            .filter(|l| !l.starts_with('#'))
            .map(|l| {
                let (want, text) = l.split_once('\t').expect("want<TAB>text");
                (text, want.parse().ok())
            })
    }

    #[test]
    fn size_grammar() {
        for (text, want) in size_cases() {
            assert_eq!(parse_size(text).ok(), want, "{text:?}");
        }
        assert_eq!(
            parse_size("lots").unwrap_err(),
            "\"lots\" is not a size (no number; e.g. 4096, 64KiB, 1.5G, 2MB)"
        );
    }

    #[test]
    fn every_name_once_and_prefixed() {
        for (i, a) in SETTINGS.iter().enumerate() {
            assert!(a.name.starts_with("ISOLATE_"), "{}", a.name);
            assert_eq!(
                a.name.starts_with("ISOLATE_TEST_"),
                a.owner == Owner::LibraryTest,
                "{}: ISOLATE_TEST_* are the library's test hooks and nothing else",
                a.name
            );
            assert!(
                SETTINGS[i + 1..].iter().all(|b| b.name != a.name),
                "{} twice",
                a.name
            );
        }
        assert_eq!(setting("ISOLATE_SYSROOT").unwrap().owner, Owner::Analyzer);
        assert!(setting("ISOLATE_MODE").unwrap().library());
        assert!(setting("ISOLATE_FOO").is_none());
    }
}
