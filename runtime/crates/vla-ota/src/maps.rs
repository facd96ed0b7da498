//! Which installed bundles are still mapped by a running process (`/proc/*/maps`).
//!
//! A context binary stays mapped by the daemon (and by QNN) while it runs; deleting the
//! bundle would keep the inode alive but hide what is running and defer the space, so
//! garbage collection keeps any bundle whose files appear in some process's maps.

use std::collections::BTreeSet;
use std::path::Path;

/// Result of one scan.
#[derive(Clone, Debug, Default)]
pub struct MapsScan {
    /// Content hashes of bundles with at least one mapped file.
    pub mapped: BTreeSet<String>,
    /// Processes whose maps could not be read for lack of permission.
    pub unreadable: usize,
}

/// Scans every process's maps for paths under `bundles_dir` (give the canonical path: the
/// kernel shows resolved paths) and returns the bundle directory names found.
pub fn scan(proc_root: &Path, bundles_dir: &Path) -> MapsScan {
    let mut scan = MapsScan::default();
    let prefix = format!("{}/", bundles_dir.display());
    let Ok(entries) = std::fs::read_dir(proc_root) else {
        return scan;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str() else { continue };
        if pid.is_empty() || !pid.bytes().all(|c| c.is_ascii_digit()) {
            continue;
        }
        let text = match std::fs::read_to_string(entry.path().join("maps")) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
                scan.unreadable += 1;
                continue;
            }
            // The process ended between listing and reading.
            Err(_) => continue,
        };
        for line in text.lines() {
            if let Some(at) = line.find(&prefix) {
                let rest = &line[at + prefix.len()..];
                let name = rest.split('/').next().unwrap_or("");
                if crate::hex::is_content_hash(name) {
                    scan.mapped.insert(name.to_owned());
                }
            }
        }
    }
    scan
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_bundle_paths_in_a_fake_proc() {
        let dir = std::env::temp_dir().join(format!("vla-ota-maps-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let hash = "ab".repeat(32);
        std::fs::create_dir_all(dir.join("42")).unwrap();
        std::fs::create_dir_all(dir.join("self-ish")).unwrap();
        std::fs::write(
            dir.join("42/maps"),
            format!(
                "7f00-7f10 r--s 00000000 08:01 123 /var/lib/vla/bundles/{hash}/ctx/a.bin (deleted)\n\
                 7f10-7f20 r-xp 00000000 08:01 124 /usr/lib/libc.so.6\n\
                 7f20-7f30 r--s 00000000 08:01 125 /var/lib/vla/bundles/.staging-x/ctx/b.bin\n"
            ),
        )
        .unwrap();
        let scan = scan(&dir, Path::new("/var/lib/vla/bundles"));
        assert_eq!(scan.mapped.into_iter().collect::<Vec<_>>(), vec![hash]);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
