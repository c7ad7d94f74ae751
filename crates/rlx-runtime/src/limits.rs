//! Resource limits checked before anything big is allocated.
//!
//! [`memory_limit`] is `RLX_MAX_MEMORY` (bytes, optionally with a `K`, `M`,
//! `G` or `T` suffix, powers of 1024) when set, else the machine's RAM
//! (`MemTotal` of `/proc/meminfo`), else no limit. Backends call
//! [`check_memory`] with their estimate before allocating arenas, caches
//! or weights, so a request that cannot fit is an error naming the size
//! instead of an abort in the allocator.

use crate::RuntimeError;

/// The environment variable that overrides the memory limit.
pub const MAX_MEMORY_ENV: &str = "RLX_MAX_MEMORY";

/// Parse a byte count like `1073741824`, `512M` or `2G` (powers of 1024).
pub fn parse_bytes(s: &str) -> Option<u128> {
    let s = s.trim();
    let (num, mul) = match s.char_indices().last()? {
        (i, c) if c.is_ascii_alphabetic() => {
            let shift = match c.to_ascii_uppercase() {
                'K' => 10,
                'M' => 20,
                'G' => 30,
                'T' => 40,
                _ => return None,
            };
            (&s[..i], 1u128 << shift)
        }
        _ => (s, 1),
    };
    num.trim().parse::<u128>().ok()?.checked_mul(mul)
}

/// The machine's RAM in bytes (`MemTotal` of `/proc/meminfo`), if known.
pub fn total_ram() -> Option<u128> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u128 = line
        .trim_start_matches("MemTotal:")
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    kib.checked_mul(1024)
}

/// The memory limit: `RLX_MAX_MEMORY` if set and valid, else the machine's
/// RAM, else `None` (no limit). An unparsable `RLX_MAX_MEMORY` is an error.
pub fn memory_limit() -> Result<Option<u128>, RuntimeError> {
    match std::env::var(MAX_MEMORY_ENV) {
        Ok(v) => parse_bytes(&v).map(Some).ok_or_else(|| {
            RuntimeError::Unsupported(format!(
                "{MAX_MEMORY_ENV} = {v:?}: expected a byte count such as 1073741824, 512M or 8G"
            ))
        }),
        Err(_) => Ok(total_ram()),
    }
}

/// An error if `bytes` (what `what` would allocate) is above
/// [`memory_limit`].
pub fn check_memory(what: &str, bytes: u128) -> Result<(), RuntimeError> {
    match memory_limit()? {
        Some(limit) if bytes > limit => Err(RuntimeError::MemoryLimit {
            what: what.to_string(),
            bytes,
            limit,
        }),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_counts_parse_with_suffixes() {
        assert_eq!(parse_bytes("1024"), Some(1024));
        assert_eq!(parse_bytes("2K"), Some(2048));
        assert_eq!(parse_bytes("512m"), Some(512 << 20));
        assert_eq!(parse_bytes("8G"), Some(8 << 30));
        assert_eq!(parse_bytes("lots"), None);
        assert_eq!(parse_bytes("-5"), None);
        assert_eq!(parse_bytes(""), None);
    }

    #[test]
    fn this_machine_reports_its_ram() {
        if std::path::Path::new("/proc/meminfo").exists() {
            assert!(total_ram().unwrap() > 1 << 20);
        }
    }
}
