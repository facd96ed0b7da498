//! Reading back what of the daemon's memory is locked and resident (the locking itself is
//! `vla_control::lock_memory_on_fault`, with the rest of the real-time set-up).

use crate::Failure;

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
