//! How large a pool is: a size fixed in the configuration, or a share of the memory free when
//! the pool is reserved (what an appliance wants on a Jetson, whose one DRAM the CPU and GPU
//! share, when the same image runs on boards of 4 to 16 GB).

use crate::error::{Error, Result};

/// The size a pool reserves at start-up.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum PoolSize {
    /// Exactly this many bytes.
    Bytes(usize),
    /// This fraction, in (0, 1], of the memory free when the pool is reserved.
    FractionOfFree(f64),
}

impl PoolSize {
    /// A fraction of free memory, refused unless it is a number in (0, 1].
    pub fn fraction(f: f64) -> Result<PoolSize> {
        if f.is_finite() && f > 0.0 && f <= 1.0 {
            Ok(PoolSize::FractionOfFree(f))
        } else {
            Err(Error::BadInput(format!(
                "a pool's fraction of free memory must be in (0, 1], not {f}"
            )))
        }
    }

    /// `mib` MiB, refused when zero or beyond the address space.
    pub fn mib(mib: usize) -> Result<PoolSize> {
        match mib.checked_mul(1 << 20) {
            Some(0) => Err(Error::BadInput("a pool needs at least 1 MiB".into())),
            Some(b) => Ok(PoolSize::Bytes(b)),
            None => Err(Error::BadInput(format!("a pool of {mib} MiB is too large"))),
        }
    }

    /// Bytes to reserve when `free` bytes are free; a share that rounds to nothing (less than
    /// one [`DEFAULT_ALIGN`](super::DEFAULT_ALIGN) unit) is an out-of-memory error naming both.
    pub fn resolve(&self, free: usize) -> Result<usize> {
        match *self {
            PoolSize::Bytes(b) => Ok(b),
            PoolSize::FractionOfFree(f) => {
                // Whole MiB, so the size a log line states is the size reserved.
                let bytes = ((free as f64 * f) as usize) & !((1 << 20) - 1);
                if bytes == 0 {
                    return Err(Error::OutOfMemory(format!(
                        "a pool of {f} of the free memory is empty: {free} B free"
                    )));
                }
                Ok(bytes)
            }
        }
    }

    /// Whether the size depends on the memory free at reservation.
    pub fn needs_free(&self) -> bool {
        matches!(self, PoolSize::FractionOfFree(_))
    }
}

impl std::fmt::Display for PoolSize {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PoolSize::Bytes(b) => write!(f, "{} MiB", b >> 20),
            PoolSize::FractionOfFree(x) => write!(f, "{x} of the free memory"),
        }
    }
}

/// Host memory a new reservation can have without swapping: `MemAvailable` of
/// `/proc/meminfo` (Linux), the figure `free` reports as available.
pub fn host_available_bytes() -> Result<usize> {
    let text = std::fs::read_to_string("/proc/meminfo")
        .map_err(|e| Error::Unsupported(format!("cannot read /proc/meminfo: {e}")))?;
    meminfo_available(&text).ok_or_else(|| {
        Error::Unsupported("/proc/meminfo has no MemAvailable line (Linux 3.14 or later)".into())
    })
}

/// The `MemAvailable` line of a `/proc/meminfo` text, in bytes.
pub fn meminfo_available(meminfo: &str) -> Option<usize> {
    let line = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))?;
    let mut words = line.split_whitespace();
    let kib: usize = words.next()?.parse().ok()?;
    match words.next() {
        Some("kB") | None => kib.checked_mul(1024),
        Some(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fractions_outside_zero_to_one_are_refused() {
        for bad in [0.0, -0.5, 1.5, f64::NAN, f64::INFINITY] {
            let err = PoolSize::fraction(bad).unwrap_err();
            assert!(matches!(err, Error::BadInput(_)), "{bad}: {err:?}");
        }
        assert_eq!(
            PoolSize::fraction(1.0).unwrap(),
            PoolSize::FractionOfFree(1.0)
        );
    }

    #[test]
    fn sizes_resolve_against_free_memory() {
        assert_eq!(PoolSize::mib(3).unwrap().resolve(0).unwrap(), 3 << 20);
        assert!(PoolSize::mib(0).is_err());
        assert!(PoolSize::mib(usize::MAX).is_err());
        let quarter = PoolSize::fraction(0.25).unwrap();
        // Rounded down to whole MiB.
        assert_eq!(quarter.resolve((8 << 30) + 5).unwrap(), 2 << 30);
        assert_eq!(quarter.resolve(10 << 20).unwrap(), 2 << 20);
        match quarter.resolve(1 << 20) {
            Err(Error::OutOfMemory(m)) => assert!(m.contains("1048576 B free"), "{m}"),
            other => panic!("expected an empty-pool error, got {other:?}"),
        }
    }

    #[test]
    fn meminfo_available_is_read_in_bytes() {
        let text = "MemTotal:       24570112 kB\nMemFree:        23000000 kB\n\
                    MemAvailable:   23456789 kB\nBuffers:            1234 kB\n";
        assert_eq!(meminfo_available(text), Some(23_456_789 * 1024));
        assert_eq!(meminfo_available("MemTotal: 5 kB\n"), None);
        assert_eq!(meminfo_available("MemAvailable: lots kB\n"), None);
        // This machine's own figure: present and below its total.
        let avail = host_available_bytes().expect("MemAvailable on Linux");
        let total = std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|t| {
                t.lines()
                    .find_map(|l| l.strip_prefix("MemTotal:"))
                    .and_then(|v| v.split_whitespace().next()?.parse::<usize>().ok())
            })
            .expect("MemTotal")
            * 1024;
        assert!(avail > 0 && avail <= total, "{avail} of {total}");
    }
}
