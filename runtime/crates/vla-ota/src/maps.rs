//! Which installed bundles a running process still uses: a file of the bundle mapped
//! (`/proc/*/maps`) or held open (`/proc/*/fd`).
//!
//! The daemon unmaps each context binary once its context exists, but keeps the running
//! bundle's `bundle.json` open for as long as the policy runs; deleting the bundle would
//! keep the inodes alive but hide what is running and defer the space, so garbage
//! collection keeps any bundle with a file in some process's maps or open files.

use std::collections::BTreeSet;
use std::path::Path;

/// Result of one scan.
#[derive(Clone, Debug, Default)]
pub struct MapsScan {
    /// Content hashes of bundles with at least one mapped or open file.
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
        let mut found = |path: &str| {
            if let Some(at) = path.find(&prefix) {
                let rest = &path[at + prefix.len()..];
                let name = rest.split('/').next().unwrap_or("");
                if crate::hex::is_content_hash(name) {
                    scan.mapped.insert(name.to_owned());
                }
            }
        };
        text.lines().for_each(&mut found);
        // Open files: a process without permission for maps has none for fd either.
        if let Ok(fds) = std::fs::read_dir(entry.path().join("fd")) {
            for fd in fds.flatten() {
                if let Ok(target) = std::fs::read_link(fd.path()) {
                    found(&target.to_string_lossy());
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

    #[test]
    fn an_open_file_counts_as_in_use() {
        let dir = std::env::temp_dir().join(format!("vla-ota-fds-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let hash = "cd".repeat(32);
        std::fs::create_dir_all(dir.join("7/fd")).unwrap();
        std::fs::write(dir.join("7/maps"), "").unwrap();
        std::os::unix::fs::symlink(
            format!("/var/lib/vla/bundles/{hash}/bundle.json"),
            dir.join("7/fd/3"),
        )
        .unwrap();
        let scan = scan(&dir, Path::new("/var/lib/vla/bundles"));
        assert_eq!(scan.mapped.into_iter().collect::<Vec<_>>(), vec![hash]);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
