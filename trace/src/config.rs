//! The library's settings parsed: the one parser of `ISOLATE_*` values, used by `libisolate.so`
//! (from its constructor, `interposer/src/base/config.rs`) and by `isolate run` before it starts
//! a command (so that a value the library would refuse is refused, in the library's words,
//! before the command runs). Pure: it reads a variable lookup, never the process environment.
//! The vocabulary (names, owners, accepted values) is [`crate::SETTINGS`].

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Log,
    Isolate,
    Off,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Log => "log",
            Mode::Isolate => "isolate",
            Mode::Off => "off",
        }
    }
}

/// How much freed memory isolation may hold before it really frees the oldest.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Budget {
    Bytes(u64),
    /// A share of the device's total memory, in percent.
    Percent(f64),
}

/// Which call stacks are captured (`ISOLATE_STACKS`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stacks {
    None,
    Native,
    Python,
    All,
}

impl Stacks {
    pub fn name(self) -> &'static str {
        match self {
            Stacks::None => "none",
            Stacks::Native => "native",
            Stacks::Python => "python",
            Stacks::All => "all",
        }
    }
}

/// `ISOLATE_STACK_DEPTH`'s default and bounds.
pub const STACK_DEPTH_DEFAULT: u32 = 64;
pub const STACK_DEPTH_MAX: u32 = 256;
/// `ISOLATE_NATIVE_FRAMES`'s default: the native frames a stack keeps nearest the call (0
/// stands for `all`).
pub const NATIVE_FRAMES_DEFAULT: u32 = 16;

#[derive(Clone, Debug)]
pub struct Config {
    pub mode: Mode,
    pub trace: String,
    /// Poison byte, `None` for `off`.
    pub poison: Option<u8>,
    pub quarantine: Budget,
    /// Device memory the library leaves free for everyone else: below it, the quarantine gives
    /// way (`None`: a sixteenth of the device, at least 1 GiB, at most a quarter).
    pub reserve: Option<Budget>,
    pub guard: bool,
    pub guard_min_size: u64,
    /// Guard on the low side (left-aligned) instead of past the end.
    pub guard_underflow: bool,
    pub check_launch: bool,
    /// Call stacks captured at each event, and the most frames each may have.
    pub stacks: Stacks,
    pub stack_depth: u32,
    /// The native frames kept nearest the call before the walk stops (then, in a thread
    /// running Python, the Python frames follow; elsewhere the stack is cut); 0 = all (walk to
    /// the depth).
    pub native_frames: u32,
    /// Stream-ordered frees leave quarantine on the library's own stream, without a host wait
    /// (`ISOLATE_TEST_RELEASE=async`, the default); `sync` is the older way, kept for comparison.
    pub async_release: bool,
    /// A stream-ordered free is poisoned by one launch of the library's own fill kernel
    /// (`ISOLATE_TEST_POISON_BY=kernel`) instead of `cuMemsetD8Async` (`memset`, the default).
    pub poison_kernel: bool,
    /// A stream-ordered free's poison waits for the stream's next work, so that one launch
    /// poisons a run of frees (`ISOLATE_TEST_POISON_BATCH=on`, the default; `off`: a memset each).
    pub poison_batch: bool,
    /// Checked allocations of the default pool are kept for the next stream-ordered
    /// allocation of the same size instead of freed (`ISOLATE_REUSE=on`, the default).
    pub reuse: bool,
    /// A budget given as a share of the device (`ISOLATE_QUARANTINE=25%`) is split among the
    /// isolate-mode processes using the device (`ISOLATE_TENANTS=share`, the default); `alone`:
    /// each takes the whole share.
    pub tenants_share: bool,
    /// The fast tier (`ISOLATE_CHECK=fast`): a stream-ordered free's block of more than 64 KiB
    /// is poisoned and checked only at 16-byte canaries every 4 KiB and at its last 16 bytes
    /// (the interposer's `policy/tier.rs`); `full` (the default): every byte.
    pub check_fast: bool,
    /// The hooks time themselves and note where the calling threads' time went at exit
    /// (`ISOLATE_PROFILE=on`; off by default).
    pub profile: bool,
    /// The stream-order check (the library's policy/order/: a free while a use on another
    /// stream may still run is a finding), in isolate mode with the launch check on.
    /// `ISOLATE_TEST_ORDER=off` exists only to measure its cost (on by default).
    pub order: bool,
    /// Test hook: make recording panic, to prove panics never cross into C.
    pub test_panic: bool,
    /// Internal test hook: the writer sleeps this long after writing the header.
    pub test_writer_stall_ms: u64,
    /// Internal test hook: the exit check's time limit, in place of 30 s (0: the default).
    pub test_exit_check_ms: u64,
    /// The process runs with `AT_SECURE` (or `ISOLATE_TEST_SECURE=1`): the library stood
    /// down without reading the environment's settings.
    pub secure: bool,
    /// `RANK`, `LOCAL_RANK`, `WORLD_SIZE` as the launcher set them (read with the settings,
    /// for the header and `%r`: never `getenv` from the writer thread).
    pub rank: Option<u32>,
    pub local_rank: Option<u32>,
    pub world_size: Option<u32>,
    /// Every setting as the trace header records it.
    pub pairs: Vec<(String, String)>,
}

impl Config {
    /// Isolate mode in the fast tier (`ISOLATE_CHECK=fast` means nothing in log mode): its
    /// lighter host work (shorter native stacks, deferred poisons that wait for a launch that
    /// may reach them) applies.
    pub fn fast_isolation(&self) -> bool {
        self.check_fast && self.mode == Mode::Isolate
    }

    /// `ISOLATE_RESERVE=0` (`0`, `0%`): the device's free memory is never asked, and the
    /// quarantine gives way only to an allocation that ran out of memory.
    pub fn reserve_off(&self) -> bool {
        matches!(
            self.reserve,
            Some(Budget::Bytes(0)) | Some(Budget::Percent(0.0))
        )
    }
}

/// A setting with exactly two values, spelled once: read by [`TwoWay::read`], written into the
/// trace header by [`TwoWay::pair`].
struct TwoWay {
    name: &'static str,
    /// The value that means true, and the one that means false.
    yes: &'static str,
    no: &'static str,
    /// When unset.
    default: bool,
}

impl TwoWay {
    const fn new(name: &'static str, yes: &'static str, no: &'static str, default: bool) -> Self {
        TwoWay {
            name,
            yes,
            no,
            default,
        }
    }

    fn read(&self, var: &impl Fn(&str) -> Option<String>) -> Result<bool, String> {
        match var(self.name) {
            None => Ok(self.default),
            Some(v) if v == self.yes => Ok(true),
            Some(v) if v == self.no => Ok(false),
            Some(v) => Err(bad(self.name, &v)),
        }
    }

    /// (name, value) as the header records it.
    fn pair(&self, v: bool) -> (String, String) {
        let value = if v { self.yes } else { self.no };
        (self.name.to_string(), value.to_string())
    }
}

// (name, the value that means true, the one that means false, whether it is true when unset)
const GUARD_SIDE: TwoWay = TwoWay::new("ISOLATE_GUARD_SIDE", "start", "end", false);
const RELEASE: TwoWay = TwoWay::new("ISOLATE_TEST_RELEASE", "async", "sync", true);
const POISON_BY: TwoWay = TwoWay::new("ISOLATE_TEST_POISON_BY", "kernel", "memset", false);
const POISON_BATCH: TwoWay = TwoWay::new("ISOLATE_TEST_POISON_BATCH", "on", "off", true);
const REUSE: TwoWay = TwoWay::new("ISOLATE_REUSE", "on", "off", true);
const CHECK: TwoWay = TwoWay::new("ISOLATE_CHECK", "fast", "full", false);
const ORDER: TwoWay = TwoWay::new("ISOLATE_TEST_ORDER", "on", "off", true);
const PROFILE: TwoWay = TwoWay::new("ISOLATE_PROFILE", "on", "off", false);
const TENANTS: TwoWay = TwoWay::new("ISOLATE_TENANTS", "share", "alone", true);

/// An on/off setting (`on`, `1`, `yes`, `true` or their opposites, in any case), `unset` when
/// it is not set.
fn on_off(var: &impl Fn(&str) -> Option<String>, name: &str, unset: bool) -> Result<bool, String> {
    let Some(v) = var(name) else {
        return Ok(unset);
    };
    match v.to_ascii_lowercase().as_str() {
        "on" | "1" | "yes" | "true" => Ok(true),
        "off" | "0" | "no" | "false" => Ok(false),
        _ => Err(bad(name, &v)),
    }
}

fn bad(name: &str, v: &str) -> String {
    let accepted = crate::setting(name).map_or("", |s| s.accepted);
    format!("{name}={v:?} is not valid; accepted: {accepted}")
}

/// A size in the project's one grammar ([`crate::parse_size`]).
pub fn parse_size(s: &str) -> Option<u64> {
    crate::parse_size(s).ok()
}

fn parse_pattern(v: &str) -> Result<(), String> {
    if v.is_empty() {
        return Err(bad("ISOLATE_TRACE", v));
    }
    let mut it = v.chars();
    while let Some(c) = it.next() {
        if c == '%' && !matches!(it.next(), Some('p' | 'r' | 'h' | '%')) {
            return Err(bad("ISOLATE_TRACE", v));
        }
    }
    Ok(())
}

/// Builds the configuration from a variable lookup (a function, so tests need no real env).
pub fn from_env(
    var: impl Fn(&str) -> Option<String>,
    names: impl Iterator<Item = String>,
) -> Result<Config, String> {
    for name in names {
        // The analyzer's and the tools' variables are theirs: left alone.
        if name.starts_with("ISOLATE_") && crate::setting(&name).is_none() {
            let known: Vec<&str> = crate::SETTINGS
                .iter()
                .filter(|s| s.owner == crate::Owner::Library)
                .map(|s| s.name)
                .collect();
            return Err(format!(
                "{name} is not a setting; the settings are {}",
                known.join(", ")
            ));
        }
    }
    let mode = match var("ISOLATE_MODE").as_deref() {
        None | Some("log") => Mode::Log,
        Some("isolate") => Mode::Isolate,
        Some("off") => Mode::Off,
        Some(v) => return Err(bad("ISOLATE_MODE", v)),
    };
    let trace = var("ISOLATE_TRACE").unwrap_or_else(|| "isolate-%p.trace".to_string());
    parse_pattern(&trace)?;
    let poison = match var("ISOLATE_POISON") {
        None => Some(0xFF),
        Some(v) if v.eq_ignore_ascii_case("off") => None,
        Some(v) => {
            let parsed = match v.strip_prefix("0x").or_else(|| v.strip_prefix("0X")) {
                Some(hex) => u8::from_str_radix(hex, 16).ok(),
                None => v.parse::<u8>().ok(),
            };
            Some(parsed.ok_or_else(|| bad("ISOLATE_POISON", &v))?)
        }
    };
    let budget = |name: &str, v: String| match v.strip_suffix('%') {
        Some(p) => match p.trim().parse::<f64>() {
            Ok(f) if (0.0..=100.0).contains(&f) => Ok(Budget::Percent(f)),
            _ => Err(bad(name, &v)),
        },
        None => Ok(Budget::Bytes(parse_size(&v).ok_or_else(|| bad(name, &v))?)),
    };
    let quarantine = match var("ISOLATE_QUARANTINE") {
        None => Budget::Percent(25.0),
        Some(v) => budget("ISOLATE_QUARANTINE", v)?,
    };
    let reserve = match var("ISOLATE_RESERVE") {
        None => None,
        Some(v) if v.trim().eq_ignore_ascii_case("auto") => None,
        Some(v) => Some(budget("ISOLATE_RESERVE", v)?),
    };
    let guard = on_off(&var, "ISOLATE_GUARD", false)?;
    let guard_min_size = match var("ISOLATE_GUARD_MIN_SIZE") {
        None => 0,
        Some(v) => parse_size(&v).ok_or_else(|| bad("ISOLATE_GUARD_MIN_SIZE", &v))?,
    };
    let guard_underflow = GUARD_SIDE.read(&var)?;
    let check_launch = on_off(&var, "ISOLATE_CHECK_LAUNCH", mode == Mode::Isolate)?;
    let async_release = RELEASE.read(&var)?;
    let poison_kernel = POISON_BY.read(&var)?;
    let poison_batch = POISON_BATCH.read(&var)?;
    let reuse = REUSE.read(&var)?;
    let tenants_share = TENANTS.read(&var)?;
    let check_fast = CHECK.read(&var)?;
    let profile = PROFILE.read(&var)?;
    let order = ORDER.read(&var)?;
    let stacks = match var("ISOLATE_STACKS")
        .map(|v| v.to_ascii_lowercase())
        .as_deref()
    {
        None | Some("all") => Stacks::All,
        Some("native") => Stacks::Native,
        Some("python") => Stacks::Python,
        Some("none") => Stacks::None,
        Some(_) => {
            return Err(bad(
                "ISOLATE_STACKS",
                &var("ISOLATE_STACKS").unwrap_or_default(),
            ));
        }
    };
    let stack_depth = match var("ISOLATE_STACK_DEPTH") {
        None => STACK_DEPTH_DEFAULT,
        Some(v) => match v.trim().parse::<u32>() {
            Ok(d) if (1..=STACK_DEPTH_MAX).contains(&d) => d,
            _ => return Err(bad("ISOLATE_STACK_DEPTH", &v)),
        },
    };
    let native_frames = match var("ISOLATE_NATIVE_FRAMES") {
        None => NATIVE_FRAMES_DEFAULT,
        Some(v) if v.trim().eq_ignore_ascii_case("all") => 0,
        Some(v) => match v.trim().parse::<u32>() {
            Ok(d) if (1..=STACK_DEPTH_MAX).contains(&d) => d,
            _ => return Err(bad("ISOLATE_NATIVE_FRAMES", &v)),
        },
    };
    if guard && mode != Mode::Isolate {
        return Err("ISOLATE_GUARD=on needs ISOLATE_MODE=isolate".to_string());
    }
    let test_panic = var("ISOLATE_TEST_PANIC").is_some_and(|v| v == "1");
    let test_writer_stall_ms = var("ISOLATE_TEST_WRITER_STALL_MS")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let test_exit_check_ms = var("ISOLATE_TEST_EXIT_CHECK_MS")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let rank_var = |k: &str| var(k).and_then(|v| v.trim().parse::<u32>().ok());
    let (rank, local_rank, world_size) = (
        rank_var("RANK"),
        rank_var("LOCAL_RANK"),
        rank_var("WORLD_SIZE"),
    );
    let mut pairs = vec![
        ("ISOLATE_MODE".to_string(), mode.name().to_string()),
        ("ISOLATE_TRACE".to_string(), trace.clone()),
        (
            "ISOLATE_POISON".to_string(),
            poison.map_or("off".into(), |b| format!("0x{b:02X}")),
        ),
        (
            "ISOLATE_QUARANTINE".to_string(),
            match quarantine {
                Budget::Bytes(b) => b.to_string(),
                Budget::Percent(p) => format!("{p}%"),
            },
        ),
        (
            "ISOLATE_RESERVE".to_string(),
            match reserve {
                None => "auto".to_string(),
                Some(Budget::Bytes(b)) => b.to_string(),
                Some(Budget::Percent(p)) => format!("{p}%"),
            },
        ),
        (
            "ISOLATE_GUARD".to_string(),
            if guard { "on" } else { "off" }.to_string(),
        ),
        (
            "ISOLATE_GUARD_MIN_SIZE".to_string(),
            guard_min_size.to_string(),
        ),
        GUARD_SIDE.pair(guard_underflow),
        (
            "ISOLATE_CHECK_LAUNCH".to_string(),
            if check_launch { "on" } else { "off" }.to_string(),
        ),
        RELEASE.pair(async_release),
        POISON_BY.pair(poison_kernel),
        POISON_BATCH.pair(poison_batch),
        REUSE.pair(reuse),
        TENANTS.pair(tenants_share),
        CHECK.pair(check_fast),
        PROFILE.pair(profile),
        ORDER.pair(order),
        ("ISOLATE_STACKS".to_string(), stacks.name().to_string()),
        ("ISOLATE_STACK_DEPTH".to_string(), stack_depth.to_string()),
        (
            "ISOLATE_NATIVE_FRAMES".to_string(),
            match native_frames {
                0 => "all".to_string(),
                n => n.to_string(),
            },
        ),
    ];
    // PyTorch's allocator settings, when set: the analyzer tells a caching allocator's held
    // memory from a leak by them (recorded, never read by the library).
    for k in [
        "PYTORCH_NO_CUDA_MEMORY_CACHING",
        "PYTORCH_CUDA_ALLOC_CONF",
        "PYTORCH_ALLOC_CONF",
    ] {
        if let Some(v) = var(k) {
            pairs.push((k.to_string(), v));
        }
    }
    Ok(Config {
        mode,
        trace,
        poison,
        quarantine,
        reserve,
        guard,
        guard_min_size,
        guard_underflow,
        check_launch,
        stacks,
        stack_depth,
        native_frames,
        async_release,
        poison_kernel,
        poison_batch,
        reuse,
        tenants_share,
        check_fast,
        profile,
        order,
        test_panic,
        test_writer_stall_ms,
        test_exit_check_ms,
        secure: false,
        rank,
        local_rank,
        world_size,
        pairs,
    })
}

/// Expands `%p`, `%r`, `%h` and `%%` in a trace path pattern.
pub fn expand(pattern: &str, pid: u32, rank: Option<u32>, host: &str) -> String {
    let mut out = String::with_capacity(pattern.len() + 16);
    let mut it = pattern.chars();
    while let Some(c) = it.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match it.next() {
            Some('p') => out.push_str(&pid.to_string()),
            Some('r') => out.push_str(&rank.map_or("0".to_string(), |r| r.to_string())),
            // One path component, never `..` (a host name is whatever root set it to).
            Some('h') => out.push_str(&crate::host_in_path(host)),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

/// A library setting whose value is not UTF-8, refused by name (`names_values`: every variable
/// the library sees, as bytes).
pub fn check_utf8<'a>(
    names_values: impl Iterator<Item = (&'a std::ffi::OsStr, &'a std::ffi::OsStr)>,
) -> Result<(), String> {
    for (k, v) in names_values {
        let Some(s) = k.to_str().and_then(crate::setting) else {
            continue;
        };
        if s.library() && v.to_str().is_none() {
            return Err(format!(
                "{}={:?} is not valid (not UTF-8); accepted: {}",
                s.name, v, s.accepted
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn cfg(pairs: &[(&str, &str)]) -> Result<Config, String> {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let names: Vec<String> = m.keys().cloned().collect();
        from_env(|k| m.get(k).cloned(), names.into_iter())
    }

    /// `ISOLATE_CHECK`: `full` unless set, `fast` the one other value, recorded in the header.
    #[test]
    fn the_check_tier_is_full_unless_fast() {
        assert!(!cfg(&[]).unwrap().check_fast);
        let fast = cfg(&[("ISOLATE_CHECK", "fast")]).unwrap();
        assert!(fast.check_fast);
        assert!(
            fast.pairs
                .iter()
                .any(|(k, v)| k == "ISOLATE_CHECK" && v == "fast")
        );
        assert!(!cfg(&[("ISOLATE_CHECK", "full")]).unwrap().check_fast);
        assert_eq!(
            cfg(&[("ISOLATE_CHECK", "Fast")]).unwrap_err(),
            "ISOLATE_CHECK=\"Fast\" is not valid; accepted: full, fast"
        );
    }

    /// `ISOLATE_TENANTS`: `share` unless set, `alone` the one other value, in the header.
    #[test]
    fn tenants_share_a_percentage_unless_alone() {
        assert!(cfg(&[]).unwrap().tenants_share);
        assert!(
            cfg(&[])
                .unwrap()
                .pairs
                .contains(&("ISOLATE_TENANTS".to_string(), "share".to_string()))
        );
        let alone = cfg(&[("ISOLATE_TENANTS", "alone")]).unwrap();
        assert!(!alone.tenants_share);
        assert!(
            alone
                .pairs
                .contains(&("ISOLATE_TENANTS".to_string(), "alone".to_string()))
        );
        assert_eq!(
            cfg(&[("ISOLATE_TENANTS", "off")]).unwrap_err(),
            "ISOLATE_TENANTS=\"off\" is not valid; accepted: share (isolate-mode processes on \
             one device split a percentage budget), alone"
        );
    }

    #[test]
    fn defaults() {
        let c = cfg(&[]).unwrap();
        assert_eq!(c.mode, Mode::Log);
        assert_eq!(c.trace, "isolate-%p.trace");
        assert_eq!(c.poison, Some(0xFF));
        assert!(!c.check_launch);
        assert!(cfg(&[("ISOLATE_MODE", "isolate")]).unwrap().check_launch);
    }

    /// The stream-order check's test switch: on by default, `off` turns it off, anything else
    /// is refused naming the variable; the header records it.
    #[test]
    fn the_order_check_switch() {
        assert!(cfg(&[]).unwrap().order);
        assert!(cfg(&[("ISOLATE_TEST_ORDER", "on")]).unwrap().order);
        let off = cfg(&[("ISOLATE_TEST_ORDER", "off")]).unwrap();
        assert!(!off.order);
        assert!(
            off.pairs
                .contains(&("ISOLATE_TEST_ORDER".to_string(), "off".to_string()))
        );
        assert_eq!(
            cfg(&[("ISOLATE_TEST_ORDER", "maybe")]).unwrap_err(),
            "ISOLATE_TEST_ORDER=\"maybe\" is not valid; accepted: on, off"
        );
    }

    #[test]
    fn malformed_values_name_variable_and_accepted_values() {
        let e = cfg(&[("ISOLATE_MODE", "lgo")]).unwrap_err();
        assert_eq!(
            e,
            "ISOLATE_MODE=\"lgo\" is not valid; accepted: log, isolate, off"
        );
        assert!(
            cfg(&[("ISOLATE_POISON", "0x1FF")])
                .unwrap_err()
                .contains("ISOLATE_POISON")
        );
        assert!(
            cfg(&[("ISOLATE_QUARANTINE", "12 parsecs")])
                .unwrap_err()
                .contains("ISOLATE_QUARANTINE")
        );
        assert!(cfg(&[("ISOLATE_QUARANTINE", "150%")]).is_err());
        assert!(
            cfg(&[("ISOLATE_TRACE", "x-%q")])
                .unwrap_err()
                .contains("ISOLATE_TRACE")
        );
        assert!(cfg(&[("ISOLATE_TRACE", "")]).is_err());
        assert!(
            cfg(&[("ISOLATE_GUARD", "maybe"), ("ISOLATE_MODE", "isolate")])
                .unwrap_err()
                .contains("on, off")
        );
        assert!(
            cfg(&[("ISOLATE_MOD", "log")])
                .unwrap_err()
                .contains("ISOLATE_MOD is not a setting")
        );
    }

    #[test]
    fn stacks_settings() {
        let c = cfg(&[]).unwrap();
        assert_eq!(
            (c.stacks, c.stack_depth),
            (Stacks::All, STACK_DEPTH_DEFAULT)
        );
        let c = cfg(&[("ISOLATE_STACKS", "native"), ("ISOLATE_STACK_DEPTH", "30")]).unwrap();
        assert_eq!((c.stacks, c.stack_depth), (Stacks::Native, 30));
        assert!(
            c.pairs
                .contains(&("ISOLATE_STACKS".into(), "native".into()))
        );
        assert!(
            c.pairs
                .contains(&("ISOLATE_STACK_DEPTH".into(), "30".into()))
        );
        assert_eq!(
            cfg(&[("ISOLATE_STACKS", "none")]).unwrap().stacks,
            Stacks::None
        );
        assert_eq!(
            cfg(&[("ISOLATE_STACKS", "python")]).unwrap().stacks,
            Stacks::Python
        );
        assert_eq!(
            cfg(&[("ISOLATE_STACKS", "some")]).unwrap_err(),
            "ISOLATE_STACKS=\"some\" is not valid; accepted: all, native, python, none"
        );
        for bad in ["0", "257", "-1", "deep", ""] {
            assert!(
                cfg(&[("ISOLATE_STACK_DEPTH", bad)])
                    .unwrap_err()
                    .contains("ISOLATE_STACK_DEPTH"),
                "{bad}"
            );
        }
        assert_eq!(
            cfg(&[("ISOLATE_STACK_DEPTH", "256")]).unwrap().stack_depth,
            256
        );
        assert_eq!(cfg(&[]).unwrap().native_frames, NATIVE_FRAMES_DEFAULT);
        let c = cfg(&[("ISOLATE_NATIVE_FRAMES", "All")]).unwrap();
        assert_eq!(c.native_frames, 0);
        assert!(
            c.pairs
                .contains(&("ISOLATE_NATIVE_FRAMES".into(), "all".into()))
        );
        assert_eq!(
            cfg(&[("ISOLATE_NATIVE_FRAMES", "5")])
                .unwrap()
                .native_frames,
            5
        );
        for bad in ["0", "257", "some", ""] {
            assert_eq!(
                cfg(&[("ISOLATE_NATIVE_FRAMES", bad)]).unwrap_err(),
                format!(
                    "ISOLATE_NATIVE_FRAMES={bad:?} is not valid; accepted: a number of frames \
                     from 1 to 256, or all"
                )
            );
        }
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("8GiB"), Some(8 << 30));
        assert_eq!(parse_size("1.5 MiB"), Some(3 << 19));
        assert_eq!(parse_size("100"), Some(100));
        assert_eq!(parse_size("2MB"), Some(2_000_000));
        assert_eq!(parse_size("GiB"), None);
        assert_eq!(parse_size("99999999999999999999"), None);
        assert_eq!(
            cfg(&[("ISOLATE_QUARANTINE", "25%")]).unwrap().quarantine,
            Budget::Percent(25.0)
        );
        assert_eq!(
            cfg(&[("ISOLATE_POISON", "0xA5")]).unwrap().poison,
            Some(0xA5)
        );
        assert_eq!(cfg(&[("ISOLATE_POISON", "off")]).unwrap().poison, None);
    }

    #[test]
    fn names_of_others_are_left_alone() {
        for name in ["ISOLATE_SYSROOT", "ISOLATE_FUZZ_SECS", "ISOLATE_LIB_PATH"] {
            assert!(cfg(&[(name, "/")]).is_ok(), "{name}");
        }
        assert!(
            cfg(&[("ISOLATE_SYSROT", "/")])
                .unwrap_err()
                .starts_with("ISOLATE_SYSROT is not a setting; the settings are ISOLATE_MODE, ")
        );
        let c = cfg(&[("RANK", " 3"), ("WORLD_SIZE", "8"), ("LOCAL_RANK", "x")]).unwrap();
        assert_eq!(
            (c.rank, c.local_rank, c.world_size),
            (Some(3), None, Some(8))
        );
    }

    #[test]
    fn pattern_expansion() {
        assert_eq!(
            expand("t-%p-r%r-%h-%%.trace", 12, Some(3), "node"),
            "t-12-r3-node-%.trace"
        );
        assert_eq!(expand("t-%r", 1, None, "x"), "t-0");
        // A host name is one path component: never outside the pattern's directory.
        assert_eq!(expand("d/%h.trace", 1, None, "../../x"), "d/.._.._x.trace");
        assert_eq!(expand("d/%h/t", 1, None, ".."), "d/__/t");
    }
}
