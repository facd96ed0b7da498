//! The Fast-WAM instruction packs of the bundle vlad runs: at every load (start, SIGHUP
//! reload, and so after `vlad ota install` of a pack for the current bundle, which
//! signals the reload), the OTA store's packs naming the bundle are verified again and
//! attached to the policy (rows mapped, never copied onto the heap). A pack that fails is
//! skipped with one warning line; the bundle runs with its fixed instructions and the
//! other packs.

use vla_ota::Store;
use vla_policy::{Bundle, Policy, PolicyKind};

/// `(name, version, policy)` of `bundle`: what a pack names it by.
pub fn names(bundle: &Bundle) -> (&str, &str, &'static str) {
    let m = &bundle.manifest;
    let kind = match m.policy {
        PolicyKind::Fastwam => "fastwam",
        PolicyKind::Molmoact2 => "molmoact2",
    };
    (&m.name, &m.version, kind)
}

/// Attaches the store's packs of `bundle` to `policy` (before any text renderer is
/// handed out); returns how many instructions they add.
pub fn attach_installed(store: &Store, bundle: &Bundle, policy: &mut Policy) -> usize {
    let (name, version, kind) = names(bundle);
    let scan = match store.packs_for((name, version, kind)) {
        Ok(scan) => scan,
        Err(e) => {
            log::warn!("instruction packs: {}", crate::error_line(&e));
            return 0;
        }
    };
    for e in &scan.refused {
        log::warn!("instruction pack refused: {}", crate::error_line(e));
    }
    let mut added = 0;
    for pack in &scan.packs {
        match policy.attach_pack(&pack.dir) {
            Ok((label, n)) => {
                log::info!(
                    "instruction pack {} ({label}): {n} instructions of {name} {version}",
                    &pack.content_hash[..12]
                );
                added += n;
            }
            Err(e) => log::warn!("{}; not attached", crate::error_line(&e)),
        }
    }
    added
}
