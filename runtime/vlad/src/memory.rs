//! Locking the daemon's memory without pinning its context binaries, and reading back
//! what is locked and resident.
//!
//! `mlockall(MCL_CURRENT | MCL_FUTURE)` populates and pins every mapping, including
//! gigabytes of mapped context binaries on a real bundle. With `MCL_ONFAULT` a page is
//! locked only once touched: the buffers the loop uses (all touched by the parity gate
//! before the loop starts) stay locked, while the binaries, which `vla-qnn` unlocks when
//! it maps them and unmaps once their contexts exist, are never pinned.

use crate::Failure;
use nix::sys::mman::{mlockall, MlockAllFlags};

/// `MCL_ONFAULT` (Linux 4.4+; the same value on x86_64 and aarch64), which nix 0.29 lacks.
const MCL_ONFAULT: i32 = 4;

/// Locks current and future pages as they are faulted in; one log line when refused.
pub fn lock_on_fault() -> bool {
    let flags = MlockAllFlags::MCL_CURRENT
        | MlockAllFlags::MCL_FUTURE
        | MlockAllFlags::from_bits_retain(MCL_ONFAULT);
    match mlockall(flags) {
        Ok(()) => true,
        Err(e) => {
            log::warn!("mlockall(MCL_CURRENT | MCL_FUTURE | MCL_ONFAULT) refused ({e}); pages may be swapped or faulted in on the hot path (raise LimitMEMLOCK)");
            false
        }
    }
}

/// Memory figures of this process, in bytes: `/proc/self/smaps_rollup` (RSS, PSS and its
/// anonymous and file-backed parts) and `VmLck` from `/proc/self/status`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Memory {
    pub rss: u64,
    pub pss: u64,
    pub pss_anon: u64,
    pub pss_file: u64,
    /// `VmLck`: the size of every locked mapping (under MCL_ONFAULT, also the pages
    /// not yet touched), so it reads larger than what is resident.
    pub locked: u64,
    /// `Locked` of `smaps_rollup`: locked pages actually resident.
    pub locked_resident: u64,
}

impl Memory {
    /// Parses `Key:  N kB` lines of `smaps_rollup` or `status`; absent keys stay 0.
    #[cfg(test)]
    pub fn parse(text: &str) -> Self {
        let mut m = Memory::default();
        m.add(text);
        m
    }

    fn add(&mut self, text: &str) {
        for line in text.lines() {
            let mut parts = line.split_whitespace();
            let (Some(key), Some(value)) = (parts.next(), parts.next()) else {
                continue;
            };
            let Ok(kb) = value.parse::<u64>() else {
                continue;
            };
            let slot = match key {
                "Rss:" => &mut self.rss,
                "Pss:" => &mut self.pss,
                "Pss_Anon:" => &mut self.pss_anon,
                "Pss_File:" => &mut self.pss_file,
                "VmLck:" => &mut self.locked,
                "Locked:" => &mut self.locked_resident,
                _ => continue,
            };
            *slot = kb * 1024;
        }
    }

    pub fn read() -> Result<Self, Failure> {
        let mut m = Memory::default();
        for path in ["/proc/self/smaps_rollup", "/proc/self/status"] {
            let text = std::fs::read_to_string(path)
                .map_err(|e| Failure::Error(format!("cannot read {path}: {e}")))?;
            m.add(&text);
        }
        Ok(m)
    }
}

/// How many of `paths` this process still maps (from `/proc/self/maps`).
pub fn mapped_count(paths: &[std::path::PathBuf]) -> usize {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
    paths
        .iter()
        .filter_map(|p| std::fs::canonicalize(p).ok())
        .filter(|p| p.to_str().is_some_and(|s| maps.contains(s)))
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn smaps_rollup_and_status_figures_are_read_in_bytes() {
        let text = "55d0-7ffd ---p 00000000 00:00 0 [rollup]\n\
                    Rss:                1200 kB\n\
                    Pss:                 900 kB\n\
                    Pss_Dirty:           100 kB\n\
                    Pss_Anon:            700 kB\n\
                    Pss_File:            200 kB\n\
                    Shared_Clean:        300 kB\n\
                    Locked:               32 kB\n\
                    VmLck:                64 kB\n";
        let m = Memory::parse(text);
        assert_eq!(
            m,
            Memory {
                rss: 1200 * 1024,
                pss: 900 * 1024,
                pss_anon: 700 * 1024,
                pss_file: 200 * 1024,
                locked: 64 * 1024,
                locked_resident: 32 * 1024,
            }
        );
        assert_eq!(Memory::parse("garbage\nRss: x kB\n"), Memory::default());
    }

    #[test]
    fn this_process_has_resident_memory() {
        if std::path::Path::new("/proc/self/smaps_rollup").exists() {
            let m = Memory::read().unwrap_or_default();
            assert!(m.rss > 0 && m.pss > 0 && m.pss <= m.rss);
        }
    }
}
