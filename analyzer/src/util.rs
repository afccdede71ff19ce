//! Small helpers shared by the analyses and the binary: addresses, sizes, escaping.

use crate::Error;

/// An address as the JSON outputs write it: `0x` and lowercase hex.
pub fn hex(v: u64) -> String {
    format!("{v:#x}")
}

/// Serializes a `u64` as a `"0x…"` string (for `#[serde(serialize_with)]`).
pub fn ser_hex<S: serde::Serializer>(v: &u64, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&hex(*v))
}

/// Parses an address or a size: `0x…` hex, or decimal; `_` separators allowed.
///
/// ```
/// assert_eq!(isolate_analyzer::util::parse_u64("0x7f00_0000").unwrap(), 0x7f00_0000);
/// assert_eq!(isolate_analyzer::util::parse_u64("4096").unwrap(), 4096);
/// assert!(isolate_analyzer::util::parse_u64("zz").is_err());
/// ```
pub fn parse_u64(s: &str) -> Result<u64, Error> {
    let t: String = s.trim().chars().filter(|&c| c != '_').collect();
    let r = if let Some(h) = t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        u64::from_str_radix(h, 16)
    } else {
        t.parse()
    };
    r.map_err(|_| Error::invalid(format!("{s:?} is not a number (use decimal or 0x… hex)")))
}

/// Parses a size in the project's one grammar ([`isolate_trace::parse_size`]: `4096`, `64K`,
/// `2MiB`, `1.5G`, `2MB` = 2,000,000, `0x1000`).
pub fn parse_size(s: &str) -> Result<u64, Error> {
    isolate_trace::parse_size(s).map_err(Error::invalid)
}

/// The size class of an allocation: the next power of two at or above its size (0 for 0).
/// Sizes in `(2^(k-1), 2^k]` share the class `2^k`.
///
/// ```
/// use isolate_analyzer::util::size_class;
/// assert_eq!(size_class(4096), 4096);
/// assert_eq!(size_class(4097), 8192);
/// assert_eq!(size_class(1), 1);
/// ```
pub fn size_class(size: u64) -> u64 {
    if size == 0 {
        0
    } else {
        size.checked_next_power_of_two().unwrap_or(1 << 63)
    }
}

/// Bytes for people: `512 B`, `1.5 KiB`, `2.0 GiB`.
pub fn human_bytes(b: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    if b < 1024 {
        return format!("{b} B");
    }
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    format!("{v:.1} {}", UNITS[u])
}

/// Nanoseconds for people: `850 ns`, `12.5 µs`, `3.20 ms`, `1.50 s`.
pub fn human_ns(ns: u64) -> String {
    match ns {
        0..1_000 => format!("{ns} ns"),
        1_000..1_000_000 => format!("{:.1} µs", ns as f64 / 1e3),
        1_000_000..1_000_000_000 => format!("{:.2} ms", ns as f64 / 1e6),
        _ => format!("{:.2} s", ns as f64 / 1e9),
    }
}

/// Escapes text for HTML element content and attribute values.
pub fn escape_html(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&#39;"),
            c => o.push(c),
        }
    }
    o
}

/// Escapes text for the inside of a double-quoted DOT string.
///
/// Backslash and quote are escaped, control characters become spaces (a raw newline would end
/// the statement in some tools), and `<`, `>`, `&` become HTML entities: Graphviz resolves
/// entities in ordinary labels, so the picture shows the original text while the DOT source
/// (and any SVG made from it) never holds a raw `<script>`.
///
/// ```
/// let s = isolate_analyzer::util::escape_dot("a\"b<script>\\");
/// assert_eq!(s, "a\\\"b&lt;script&gt;\\\\");
/// ```
pub fn escape_dot(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\\' => o.push_str("\\\\"),
            '"' => o.push_str("\\\""),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '&' => o.push_str("&amp;"),
            c if c.is_control() => o.push(' '),
            c => o.push(c),
        }
    }
    o
}

/// Makes JSON text safe to embed inside an HTML `<script>` element: `<`, `>` and `&` (so that
/// no `</script>` or `<!--` can appear) and U+2028/U+2029 (line terminators in older JavaScript)
/// become `\u` escapes, which JSON and JavaScript read back as the same characters. Only valid
/// inside JSON strings, which is the only place they can occur in serde_json output.
///
/// ```
/// let s = isolate_analyzer::util::json_for_script("\"</script>&\u{2028}\"");
/// assert_eq!(s, "\"\\u003c/script\\u003e\\u0026\\u2028\"");
/// ```
pub fn json_for_script(json: &str) -> String {
    let mut o = String::with_capacity(json.len() + 16);
    for c in json.chars() {
        match c {
            '<' => o.push_str("\\u003c"),
            '>' => o.push_str("\\u003e"),
            '&' => o.push_str("\\u0026"),
            '\u{2028}' => o.push_str("\\u2028"),
            '\u{2029}' => o.push_str("\\u2029"),
            c => o.push(c),
        }
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("64K").unwrap(), 65536);
        assert_eq!(parse_size("2MiB").unwrap(), 2 << 20);
        assert_eq!(parse_size("0x100").unwrap(), 256);
        assert_eq!(parse_size("100").unwrap(), 100);
        // The grammar of the library and the Python package (it was 2 MiB here, and "1.5M"
        // was refused).
        assert_eq!(parse_size("2MB").unwrap(), 2_000_000);
        assert_eq!(parse_size("1.5M").unwrap(), 3 << 19);
        assert_eq!(size_class(0), 0);
        assert_eq!(size_class(u64::MAX), 1 << 63);
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_ns(1500), "1.5 µs");
    }
}
